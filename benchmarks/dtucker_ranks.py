"""Dirichlet Tucker rank selection over seeds: does ``bam.select_ranks`` find the planted ranks?

For each seed s: a tensor of shape (30, 8, 10, 12) with C = 500 counts per (m, n) face is drawn
from ``dirichlet_tucker(ranks=(3, 2, 2, 3), alpha=1.1).sample(s, ...)``, and

    select_ranks(dirichlet_tucker, X, grid={"K_M": [2, 3, 4], "K_S": [2, 3, 4]},
                 fixed={"K_N": 2, "K_P": 2}, rng_key=s)

runs with its defaults (five speckled folds, SQUAREM-accelerated MAP-EM from two starts, the
one-standard-error rule on paired per-face differences stepping back only to models nested below
the best). Prints one row per seed: the selected (K_M, K_S), the best-scoring grid point,
the seconds of the call, and the number of seeds whose selection (and best-scoring point) is the
planted (3, 3); with ``--folds 3 5`` one column per number of folds, on the same tensors.

The last column asks whether the seed's data can single out the planted ranks at all: the MAP fit
of every grid point nested below them, and of the planted ranks, on the whole tensor (the same fit
options), and the planted fit's gain in log-likelihood over each minus its extra free parameters,
the least of these. That is Akaike's estimate of how much better the planted ranks predict new
counts of the same faces than the best smaller model (Akaike 1974: the expected held-out
log-likelihood is the fitted one less the number of free parameters); near or below zero, the
smaller model predicts as well, and no held-out rule can be expected to prefer the planted ranks.

Usage: ``python benchmarks/dtucker_ranks.py --seeds 100 101 102 103 104 105 106 107 108 109 [--folds 3 5]``
"""

from __future__ import annotations

import argparse
import time
import warnings

PLANTED = (3, 2, 2, 3)
ALPHA = 1.1
SHAPE = (30, 8, 10, 12)
TOTAL = 500
GRID = {"K_M": [2, 3, 4], "K_S": [2, 3, 4]}
FIXED = {"K_N": 2, "K_P": 2}


def planted_margin(X, seed: int) -> float:
    """min over the grid points nested below the planted ranks of (planted fit's log-likelihood −
    theirs) − (planted free parameters − theirs), every fit on the whole tensor."""
    import bam_ppl as bam
    from bam_ppl.models.dirichlet_tucker import dirichlet_tucker
    from bam_ppl.selection import DIRICHLET_TUCKER_FIT_OPTIONS, num_parameters

    def fit(k_m, k_s):
        model = dirichlet_tucker(ranks=(k_m, FIXED["K_N"], FIXED["K_P"], k_s), alpha=ALPHA)
        idata = bam.infer(model, X, method="map", rng_key=seed, **DIRICHLET_TUCKER_FIT_OPTIONS)
        loglik = float(idata.sample_stats["final_log_likelihood"].values.ravel()[0])
        return loglik - num_parameters(model, model.as_data(X))

    planted = fit(PLANTED[0], PLANTED[3])
    return min(planted - fit(k_m, k_s) for k_m in GRID["K_M"] for k_s in GRID["K_S"]
               if k_m <= PLANTED[0] and k_s <= PLANTED[3] and (k_m, k_s) != (PLANTED[0], PLANTED[3]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(100, 110)),
                        help="data seeds; seed s draws the tensor and keys select_ranks (default 100..109)")
    parser.add_argument("--folds", type=int, nargs="+", default=[None],
                        help="numbers of speckled folds to compare on the same tensors (default: select_ranks's)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    from bam_ppl import select_ranks
    from bam_ppl.models.dirichlet_tucker import dirichlet_tucker

    planted = (PLANTED[0], PLANTED[3])
    labels = ["default" if f is None else f"{f} folds" for f in args.folds]
    print("| seed | " + " | ".join(f"{label}: selected, best-scoring, seconds" for label in labels)
          + " | planted margin (nats) |")
    print("|---|" + "---|" * (len(labels) + 1))
    hits = dict.fromkeys(labels, 0)
    top_hits = dict.fromkeys(labels, 0)
    for seed in args.seeds:
        _, X = dirichlet_tucker(ranks=PLANTED, alpha=ALPHA).sample(seed, shape=SHAPE, total=TOTAL)
        cells = []
        for folds, label in zip(args.folds, labels):
            start = time.perf_counter()
            table = select_ranks(dirichlet_tucker, X, grid=GRID, fixed=FIXED, rng_key=seed, folds=folds)
            seconds = time.perf_counter() - start
            chosen = tuple(int(v) for v in table.loc[table["selected"], ["K_M", "K_S"]].iloc[0])
            top = tuple(int(v) for v in table.loc[table["heldout_loglik"].idxmax(), ["K_M", "K_S"]])
            hits[label] += chosen == planted
            top_hits[label] += top == planted
            cells.append(f"{chosen}, {top}, {seconds:.0f}")
        print(f"| {seed} | " + " | ".join(cells) + f" | {planted_margin(X, seed):.1f} |", flush=True)
    for label in labels:
        print(f"\n{label}: planted {planted} selected on {hits[label]} of {len(args.seeds)} seeds, "
              f"best-scoring on {top_hits[label]}")


if __name__ == "__main__":
    main()
