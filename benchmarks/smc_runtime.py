"""SMC runtime against tensor size (Cemgil et al. 2019 Fig. 10b): CP data with T = 1000, R = 10, a = 50.

Prints one row per size I×I×I and version: compile+first run, the best of the following runs in
wall-clock and CPU time, and the CPU-time ratio to the smallest size. The SMC cost should depend
on T, not on the dense size. Versions as in ``smc_throughput.py`` (per kernel, evidence and full);
``--baseline REV`` also times ``smc.py`` at git revision REV, interleaved with the current code;
``--baseline-tree REV`` the whole package at REV in a worker process (any older layout). Pinned to
one core (``--cpu``, default 0) before JAX and numba start; figures are the best of ``--repeats``.

    python benchmarks/smc_runtime.py --sizes 4 8 16 32 64 --particles 500 --repeats 3
"""

from __future__ import annotations

import argparse

from smc_throughput import MODEL_SPECS, time_versions, timed_versions  # pins the process (--cpu)

import bam_ppl as bam


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--rank", type=int, default=10)
    parser.add_argument("--a", type=float, default=50.0)
    parser.add_argument("--particles", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="git revision of smc.py to compare against")
    parser.add_argument("--baseline-tree", default=None,
                        help="git revision of the whole package to compare against, run in a worker process")
    parser.add_argument("--kernels", nargs="+", default=["numba", "jax"], choices=["numba", "jax"])
    parser.add_argument("--cpu", type=int, default=0, help="core to pin to (-1: not pinned)")
    args = parser.parse_args()
    versions = timed_versions(args.baseline, args.kernels, args.baseline_tree)
    model = bam.models.cp(args.rank, a=args.a)
    MODEL_SPECS[id(model)] = dict(rank=args.rank, a=args.a)
    options = dict(num_particles=args.particles, num_chains=1, progress_bar=False)
    print(f"{'size':>6} {'nnz':>6} {'version':>10} {'compile s':>10} {'wall s':>7} {'cpu s':>7} {'ratio cpu':>9}")
    base = {}
    for size in args.sizes:
        _, X = model.sample(size, shape=(size,) * 3, total=args.tokens)
        X = bam.CountTensor.from_dense(X)
        rows = time_versions(versions, model, X, args.repeats, options)
        for name, (compile_s, wall, cpu, _) in rows.items():
            base.setdefault(name, cpu)
            print(f"{size:>4}^3 {X.nnz:>6} {name:>10} {compile_s:>10.2f} {wall:>7.3f} {cpu:>7.3f} "
                  f"{cpu / base[name]:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
