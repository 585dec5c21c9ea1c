"""Wall seconds of one ``method="chib"`` call on a tensor of the CP rank-confusion experiment
(``benchmarks/rank_confusion.py``: 20 × 25 × 30, T = 1000, a = 10), with and without the average
over the label symmetries (R! relabellings for CP(R)), so that the cost of that average shows
beside the same call without it.

    .venv/bin/python benchmarks/chib_cost.py --ranks 6 7 8 --true-rank 7 --key 3

A warm-up call with few sweeps comes first (numba's compilation).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import rank_confusion as confusion

import bam_ppl as bam


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8])
    parser.add_argument("--true-rank", type=int, default=7, help="tensor 0 of this true rank")
    parser.add_argument("--key", type=int, default=3)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    _, X = bam.models.cp(args.true_rank, a=confusion.DEFAULT_A).sample(1000 * args.true_rank, shape=confusion.SHAPE,
                                                                       total=1000)
    bam.log_evidence(bam.models.cp(2, a=confusion.DEFAULT_A), X, method="chib", num_samples=10, num_search_sweeps=10)
    for R in args.ranks:
        model = bam.models.cp(R, a=confusion.DEFAULT_A)
        for symmetry in (False, True):
            start = time.perf_counter()
            est = bam.log_evidence(model, X, method="chib", rng_key=args.key, label_symmetry=symmetry)
            print(f"CP({R}), label_symmetry={symmetry}: {est.value:.2f} ± {est.stderr:.2f}, "
                  f"{est.details['num_relabellings']} relabellings, {time.perf_counter() - start:.1f} s, "
                  f"runs {np.round(est.details['run_log_evidence'], 2).tolist()}", flush=True)


if __name__ == "__main__":
    main()
