"""Is the pooled error of independent runs honest from both sides? Simulated calls of R runs.

Each simulated call pools R runs' log estimates (``bam_ppl.estimate.pool_runs``: log-mean-exp, the
jackknife error), each run's exp an unbiased estimate of Z = 1 (log Z = 0), in two regimes the
engines meet: log-normal runs, log Ẑ ~ N(−s²/2, s²) (a run's noise); and runs that miss the basin
holding the mass with probability p, log Ẑ ~ N(0, 0.7²) or 20 nats below (a search's miss, the
regime of NMF(4) at 16 000 tokens, ``benchmarks/basin_census.py``). Each row: the spread (sd) of the
pooled value across calls and its mean (its bias; log Z = 0 for the log-normal rows, the pooled value
of every call's runs together for the others), the mean stated error, and the share of calls within
2 stated errors of log Z; beside it the error of the mean of the logs, sd(values) / √R, for comparison.

    .venv/bin/python benchmarks/pooled_error.py --runs 4 --calls 20000
"""

from __future__ import annotations

import argparse

import numpy as np

from bam_ppl.estimate import pool_runs

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
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"| runs (R = {args.runs}) | sd of the pooled value | its mean − log Z | mean stated | within 2 stated | "
          "mean sd(values) / √R |")
    print("|---|---|---|---|---|---|")
    for name, (runs, log_z) in regimes(rng, args.calls, args.runs).items():
        pooled = np.array([pool_runs(call) for call in runs])
        error = pooled[:, 0] - log_z
        within = np.mean(np.abs(error) <= 2 * pooled[:, 1])
        spread = runs.std(axis=1, ddof=1).mean() / np.sqrt(args.runs)
        print(f"| {name} | {error.std():.2f} | {error.mean():+.2f} | {pooled[:, 1].mean():.2f} | {within:.3f} | "
              f"{spread:.2f} |", flush=True)


if __name__ == "__main__":
    main()
