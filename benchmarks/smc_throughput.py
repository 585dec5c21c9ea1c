"""SMC throughput in particle-token updates per second (CP on a 20×25×30 tensor, T tokens).

Compile time (first call) is reported separately from the steady-state rate.

    python benchmarks/smc_throughput.py --ranks 5 10 50 --particles 100 1000 10000 --tokens 1000
"""

from __future__ import annotations

import argparse
import time

import bam_ppl as bam
from bam_ppl.infer.smc import run_smc


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[5, 10, 50])
    parser.add_argument("--particles", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=1)
    parser.add_argument("--a", type=float, default=10.0)
    args = parser.parse_args()
    print(f"{'R':>3} {'P':>6} {'compile s':>10} {'run s':>8} {'updates/s':>10} {'resampled':>9}")
    for rank in args.ranks:
        model = bam.models.cp(rank, a=args.a)
        _, X = model.sample(0, shape=(20, 25, 30), total=args.tokens)
        for particles in args.particles:
            options = dict(num_particles=particles, num_chains=args.chains, progress_bar=False)
            t0 = time.perf_counter()
            run_smc(model, X, 0, **options)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            result = run_smc(model, X, 1, **options)
            run = time.perf_counter() - t0
            updates = args.tokens * particles * args.chains
            print(f"{rank:>3} {particles:>6} {first - run:>10.2f} {run:>8.2f} {updates / run:>10.3g} "
                  f"{result.resampled.mean():>9.3f}")


if __name__ == "__main__":
    main()
