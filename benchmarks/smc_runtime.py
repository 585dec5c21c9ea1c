"""SMC runtime against tensor size (papers/000 Fig. 10b): CP data with T = 1000, R = 10, a = 50.

Prints one row per size I×I×I: compile time (first run) and the mean time of the following runs,
and the ratio to the smallest size. The SMC cost should depend on T, not on the dense size.

    python benchmarks/smc_runtime.py --sizes 4 8 16 32 64 --particles 500 --repeats 3
"""

from __future__ import annotations

import argparse
import time

import bam_ppl as bam
from bam_ppl.infer.smc import run_smc


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--rank", type=int, default=10)
    parser.add_argument("--a", type=float, default=50.0)
    parser.add_argument("--particles", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = bam.models.cp(args.rank, a=args.a)
    print(f"{'size':>6} {'nnz':>6} {'compile+run s':>14} {'run s':>8} {'ratio':>6} {'log L':>10}")
    base = None
    for size in args.sizes:
        _, X = model.sample(size, shape=(size,) * 3, total=args.tokens)
        X = bam.CountTensor.from_dense(X)
        t0 = time.perf_counter()
        run_smc(model, X, 0, num_particles=args.particles, num_chains=1, progress_bar=False)
        first = time.perf_counter() - t0
        times = []
        for rep in range(args.repeats):
            t0 = time.perf_counter()
            result = run_smc(model, X, rep + 1, num_particles=args.particles, num_chains=1, progress_bar=False)
            times.append(time.perf_counter() - t0)
        mean = sum(times) / len(times)
        base = base or mean
        print(f"{size:>4}^3 {X.nnz:>6} {first:>14.2f} {mean:>8.3f} {mean / base:>6.2f} "
              f"{result.chain_log_evidence[0]:>10.1f}")


if __name__ == "__main__":
    main()
