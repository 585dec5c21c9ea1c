"""Is the pooled error of independent runs honest from both sides? Simulated calls of R runs.

Each simulated call pools R runs' log estimates (``bam_ppl.estimate.pool_runs``: log-mean-exp, and
the larger of the jackknife error and sd(values) / √R), log Z = 0, in three regimes the engines meet:
log-normal runs, log Ẑ ~ N(−s²/2, s²), each exp unbiased (a run's noise); runs that miss the basin
holding the mass with probability p, log Ẑ ~ N(0, 0.7²) or 20 nats below (a search's miss, NMF(4) at
16 000 tokens, ``benchmarks/basin_census.py``; log Z there the pooled value of every call's runs
together); and runs that each fall short by an exponential amount of mean m, log Ẑ = −Exp(m) (every
search misses by a different margin: the runs spread over many nats, as at 64 000 tokens). Each row:
the root-mean-square error of the pooled value across calls and its mean (its bias), then for the
stated error and for each of its two terms alone the mean and the share of calls within 2 of them.

    .venv/bin/python benchmarks/pooled_error.py --runs 4 --calls 20000
"""

from __future__ import annotations

import argparse

import numpy as np

from bam_ppl.estimate import pool_runs, pooled_error_terms

#: A missed basin lies this many nats below (NMF(4) at 16 000 tokens: 20-60, basin_census.py).
MISS_GAP = 20.0


def regimes(rng, num_calls: int, num_runs: int) -> dict:
    """Simulated runs (calls, runs) of each regime, and its log Z."""
    out = {}
    for s in (0.3, 1.0, 2.0):
        out[f"log-normal, s = {s:g}"] = (rng.normal(-s * s / 2, s, (num_calls, num_runs)), 0.0)
    for p in (0.1, 0.3):
        runs = rng.normal(0.0, 0.7, (num_calls, num_runs)) - MISS_GAP * (rng.random((num_calls, num_runs)) < p)
        out[f"a miss with p = {p:g}"] = (runs, float(pool_runs(runs.reshape(-1))[0]))
    for mean in (5.0, 20.0):
        out[f"short by Exp(mean {mean:g})"] = (-rng.exponential(mean, (num_calls, num_runs)), 0.0)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"| runs (R = {args.runs}) | rms error of the pooled value | its mean | stated: mean, within 2 | "
          "jackknife alone | sd(values) / √R alone |")
    print("|---|---|---|---|---|---|")
    for name, (runs, log_z) in regimes(rng, args.calls, args.runs).items():
        pooled = np.array([pool_runs(call) for call in runs])
        error = pooled[:, 0] - log_z
        terms = [pooled[:, 1], *np.array([pooled_error_terms(call) for call in runs]).T]
        cells = [f"{term.mean():.2f}, {np.mean(np.abs(error) <= 2 * term):.2f}" for term in terms]
        print(f"| {name} | {np.sqrt(np.mean(error ** 2)):.2f} | {error.mean():+.2f} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
