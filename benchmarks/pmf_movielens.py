"""MovieLens rating prediction (Chege et al. 2024 §V-B, Table I) on R's dslabs::movielens.

50 most-rated movies, ratings ×2 → 10 levels, users with ≥ 2 of them, users split 70/10/20
(train / validation / test) per trial; one rating per test user hidden and predicted by its
conditional mean (eq. 55). RMSE and MAE on the star scale, mean test NLL per user, detected rank,
runtime. EM + BIC / AIC fit the candidate ranks {5, 10, …, 30} of the paper; EM + ValErr picks the
rank with the lowest validation RMSE from the same fits.

    python benchmarks/pmf_movielens.py --trials 3
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import bam_ppl as bam
from bam_ppl.convert import attrs_of
from bam_ppl.datasets import load_movielens_ratings
from bam_ppl.families.pmf.em import em_candidate_idata, em_rank_selection
from bam_ppl.models.pmf import hide_one_entry, mae, rmse

PAPER_TABLE_I = {  # Chege et al. 2024 Table I (MovieLens 25M, T = 1.52e5 users, 20 trials)
    "VB-PMF": (0.726, 0.540, 20.543, 44, "3.17 h"),
    "SVB-PMF": (0.737, 0.551, 20.594, 31, "0.52 h"),
    "EM+ValErr": (0.731, 0.544, 20.552, 30, "21.27 h"),
    "EM+AIC": (0.732, 0.544, 20.553, 30, "59.53 h"),
    "EM+BIC": (0.790, 0.592, 20.727, 10, "59.53 h"),
}
STARS = (np.arange(10) + 1) / 2


def split(codes, trial):
    order = np.random.default_rng(trial).permutation(codes.shape[0])
    a, b = int(0.7 * len(order)), int(0.8 * len(order))
    return codes[order[:a]], codes[order[a:b]], codes[order[b:]]


def scores(model, idata, test, masked, target, truth):
    predicted = model.predict_mean(idata, masked, target, values=STARS)
    return rmse(predicted, STARS[truth]), mae(predicted, STARS[truth]), model.mean_nll(idata, test)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--max-rank", type=int, default=50)
    parser.add_argument("--em-ranks", type=int, nargs="+", default=[5, 10, 15, 20, 25, 30])
    args = parser.parse_args()
    table = load_movielens_ratings()
    codes = table.to_numpy(dtype=float, na_value=np.nan)
    codes = np.where(np.isnan(codes), -1, codes).astype(int)
    print(f"data: {codes.shape[0]} users x {codes.shape[1]} movies, {np.mean(codes < 0):.1%} missing")
    model = bam.models.pmf_tensor(args.max_rank).resolve(codes)
    results = {name: [] for name in PAPER_TABLE_I}
    for trial in range(args.trials):
        train, valid, test = split(codes, trial)
        test = test[(test >= 0).sum(1) >= 2]
        valid = valid[(valid >= 0).sum(1) >= 2]
        masked, target, truth = hide_one_entry(trial, test)
        v_masked, v_target, v_truth = hide_one_entry(trial + 100, valid)
        for name, options in (("VB-PMF", dict(method="vb")), ("SVB-PMF", dict(method="svb", validation=valid))):
            start = time.perf_counter()
            idata = bam.infer(model, train, rng_key=trial, num_categories=10, progress_bar=False, **options)
            seconds = time.perf_counter() - start
            results[name].append((*scores(model, idata, test, masked, target, truth),
                                  attrs_of(idata)["detected_rank"], seconds))
        start = time.perf_counter()
        fit = em_rank_selection(model, train, rng_key=trial, ranks=args.em_ranks, num_categories=10)
        seconds = time.perf_counter() - start  # one run fits every candidate rank for all criteria
        candidates = [em_candidate_idata(fit, k) for k in range(len(args.em_ranks))]
        validation_rmse = [rmse(model.predict_mean(c, v_masked, v_target, values=STARS), STARS[v_truth])
                           for c in candidates]
        choices = {"EM+BIC": int(np.argmin(fit["bic"])), "EM+AIC": int(np.argmin(fit["aic"])),
                   "EM+ValErr": int(np.argmin(validation_rmse))}
        for name, k in choices.items():
            results[name].append((*scores(model, candidates[k], test, masked, target, truth),
                                  args.em_ranks[k], seconds))
    print(f"{'method':>10} | {'RMSE':>13} {'MAE':>13} {'NLL':>13} {'rank':>5} {'sec':>6} | paper Table I "
          "(RMSE, MAE, NLL, rank, runtime)")
    for name, rows in results.items():
        arr = np.asarray(rows, dtype=float)
        mean, std = arr.mean(0), arr.std(0)
        ranks, counts = np.unique(arr[:, 3], return_counts=True)
        print(f"{name:>10} | {mean[0]:.3f}±{std[0]:.3f}   {mean[1]:.3f}±{std[1]:.3f}   {mean[2]:6.2f}±{std[2]:.2f} "
              f"{int(ranks[np.argmax(counts)]):>5} {mean[4]:>6.1f} | {PAPER_TABLE_I[name]}")


if __name__ == "__main__":
    main()
