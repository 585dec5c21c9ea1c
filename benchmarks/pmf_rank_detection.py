"""Rank detection on synthetic PMF tensors, Chege et al. 2024 §V-A style.

N = 5 variables with I_n = 10 categories, true rank R, entries missing with probability p, T
samples; per trial a fresh sample of the fixed ground truth. Prints, per method, the mean
detected rank, the mean KL(true ‖ estimate) over the 10^5-cell tensor and the mean runtime for
VB-PMF, SVB-PMF, EM + BIC and EM + AIC (one EM run over the candidate ranks 1..R+5 serves both).

    python benchmarks/pmf_rank_detection.py --ranks 5 --missing 0 0.3 --sizes 1000 10000 --trials 3
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import bam_ppl as bam
from bam_ppl.convert import attrs_of
from bam_ppl.families.pmf.em import em_rank_selection
from bam_ppl.models.pmf import joint_pmf, kl_divergence, point_estimate, random_pmf, sample_pmf


def em_estimate(fit, index, sizes):
    rank = int(fit["ranks"][index])
    offsets = np.cumsum([0, *sizes])
    factors = fit["factors"][index][:, :rank]
    return fit["weights"][index][:rank], [factors[offsets[n]:offsets[n + 1]].T for n in range(len(sizes))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--missing", type=float, nargs="+", default=[0.0, 0.3])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--max-rank", type=int, default=23, help="R_init (Kruskal bound for N=5, I=10)")
    args = parser.parse_args()
    sizes = (10,) * 5
    print(f"{'R':>3} {'p':>4} {'T':>7} {'method':>8} {'rank':>6} {'KL':>8} {'seconds':>8}")
    for true_rank in args.ranks:
        weights, factors = random_pmf(true_rank, true_rank, 5, 10)
        truth = joint_pmf(weights, factors)
        for p in args.missing:
            for T in args.sizes:
                rows = {m: [] for m in ("VB-PMF", "SVB-PMF", "EM+BIC", "EM+AIC")}
                for trial in range(args.trials):
                    samples = sample_pmf(1000 * T + trial, weights, factors, T, missing_prob=p)
                    model = bam.models.pmf_tensor(args.max_rank)
                    for name, method in (("VB-PMF", "vb"), ("SVB-PMF", "svb")):
                        start = time.perf_counter()
                        idata = bam.infer(model, samples, method=method, rng_key=trial, num_categories=10,
                                          progress_bar=False)
                        seconds = time.perf_counter() - start
                        kl = kl_divergence(truth, joint_pmf(*point_estimate(idata)[:2]))
                        rows[name].append((attrs_of(idata)["detected_rank"], kl, seconds))
                    start = time.perf_counter()
                    fit = em_rank_selection(model, samples, rng_key=trial, ranks=range(1, true_rank + 6),
                                            num_categories=10)
                    seconds = time.perf_counter() - start
                    for name, key in (("EM+BIC", "bic"), ("EM+AIC", "aic")):
                        best = int(np.argmin(fit[key]))
                        kl = kl_divergence(truth, joint_pmf(*em_estimate(fit, best, sizes)))
                        rows[name].append((fit["ranks"][best], kl, seconds))
                for name, values in rows.items():
                    rank, kl, seconds = np.mean(np.asarray(values, dtype=float), axis=0)
                    print(f"{true_rank:>3} {p:>4.1f} {T:>7} {name:>8} {rank:>6.2f} {kl:>8.4f} {seconds:>8.1f}",
                          flush=True)


if __name__ == "__main__":
    main()
