"""VB time per iteration as the dense size of X doubles at a fixed number of nonzero cells.

The allocation model's VB (Cemgil et al. 2019 App. D) only touches the nonzero cells and the tables, so
its per-iteration cost should stay flat while I × J doubles at fixed nnz (the tables grow with
I + J only). For each shape the script draws ``--nnz`` distinct cells with counts 1 + Poisson(2),
fits KL-NMF ``k -> i; k -> j`` and times (t(2n) − t(n)) / n, which removes set-up and
compilation (each t the fastest of ``--repeats`` runs).

Times are process CPU seconds (all threads), not wall-clock: on a shared machine the
wall clock mostly measures the other processes.

Usage::

    python benchmarks/vb_scaling.py --nnz 100000 --rank 10 --start 1000 1000 --doublings 4
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import bam_ppl as bam
from bam_ppl.data import CountTensor
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.variational import vb as vb_core
from bam_ppl.parallel import chain_keys


def sparse_counts(shape, nnz, rng) -> CountTensor:
    flat = rng.choice(shape[0] * shape[1], size=nnz, replace=False)
    indices = np.stack(np.unravel_index(flat, shape), axis=1)
    return CountTensor(indices, 1 + rng.poisson(2.0, size=nnz), shape=shape)


def seconds_per_iteration(data: CountTensor, rank: int, iters: int, seed: int, repeats: int) -> float:
    data, bound, layout, _ = prepare(bam.models.nmf(rank, a=1.0), data)
    keys = chain_keys(seed, 1)  # one restart
    with jax.enable_x64(True):
        problem = vb_core.build_problem(bound, data, layout)

        def fit(n):
            start = time.process_time()
            vb_core.run(keys, problem, num_iters=n, tol=0.0)
            return time.process_time() - start

        fit(iters)  # compile
        # The fastest of several repeats: the machine is shared, slower runs measure the others.
        long = min(fit(2 * iters) for _ in range(repeats))
        short = min(fit(iters) for _ in range(repeats))
        return (long - short) / iters


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nnz", type=int, default=100_000)
    parser.add_argument("--rank", type=int, default=10)
    parser.add_argument("--start", type=int, nargs=2, default=[1000, 1000], metavar=("I", "J"))
    parser.add_argument("--doublings", type=int, default=4)
    parser.add_argument("--iters", type=int, default=50, help="n; timed as t(2n) − t(n) (multiple of 25)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    rows, cols = args.start
    print(f"nnz={args.nnz} K={args.rank} iterations={2 * args.iters}")
    print(f"{'I':>6} {'J':>6} {'dense cells':>12} {'CPU ms/it':>10} {'vs first':>9}")
    first = None
    for step in range(args.doublings + 1):
        data = sparse_counts((rows, cols), args.nnz, rng)
        per_iter = seconds_per_iteration(data, args.rank, args.iters, args.seed, args.repeats)
        first = first or per_iter
        print(f"{rows:>6} {cols:>6} {rows * cols:>12} {1e3 * per_iter:>10.2f} {per_iter / first:>9.2f}")
        if step % 2 == 0:
            cols *= 2
        else:
            rows *= 2


if __name__ == "__main__":
    main()
