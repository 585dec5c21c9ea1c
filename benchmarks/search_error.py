"""Is the mixture engine's stated error honest from both sides? Simulated calls of R searches.

Each simulated call has R runs, each from a search of its own, pooled as ``bam.log_evidence`` pools them
(``bam_ppl.estimate.pool_searches``: the runs reweighted by the start of all R searches, so that a basin any
search found counts once, in full; the error is the bootstrap over the searches). A search finds the basin that
holds the mass (log mass 0) with probability p; otherwise it lands in a basin of its own, ``--gap`` nats lower
(NMF(4) at 16 000 tokens: 20–60, ``benchmarks/basin_census.py``). A run's particles share its basin's start with
every search that found that basin; its log estimate carries a log-normal noise of sd ``--noise`` (its
annealing), unbiased on the natural scale. log p(X) is log(1 + the missed basins' mass) ≈ 0. Each row: the
root-mean-square error of the pooled value and its mean (bias), then for the stated error and for the former
rule (the larger of the jackknife over the searches and the spread of what each search gives alone, over √R)
the mean and the share of calls within 2 of it.

    .venv/bin/python benchmarks/search_error.py --searches 4 --calls 4000
"""

from __future__ import annotations

import argparse

import numpy as np

from bam_ppl.estimate import _jackknife, _log_mean_exp, pool_searches


def simulated_call(rng, num_searches: int, p: float, gap: float, noise: float):
    """One call's (values, final log weights, search log shares), each run's particles all in its basin."""
    found = rng.random(num_searches) < p
    k = int(found.sum())
    values = rng.normal(-noise * noise / 2, noise, num_searches)
    shares = []
    for r in range(num_searches):
        if found[r]:  # basin A, shared by the k searches that found it: q̄ = (k / R) q_A there
            values[r] += np.log(num_searches / k)
            shares.append(np.where(found, -np.log(k), -np.inf)[:, None])
        else:  # a basin of its own, gap nats lower
            values[r] += np.log(num_searches) - gap
            shares.append(np.where(np.arange(num_searches) == r, 0.0, -np.inf)[:, None])
    return values, [np.zeros(1)] * num_searches, shares


def former_error(values, shares) -> float:
    """The rule before the bootstrap: max(jackknife over the searches, sd(each search alone) / √R)."""
    R = values.size
    alone = np.array([values[r] - shares[r][r, 0] - np.log(R) for r in range(R)])
    theta = []
    for s in range(R):
        rest = np.arange(R) != s
        left = [values[r] - np.logaddexp.reduce(shares[r][rest, 0]) - np.log(R / (R - 1)) for r in range(R) if r != s]
        theta.append(_log_mean_exp(np.array(left)))
    return max(_jackknife(np.array(theta)), float(alone.std(ddof=1) / np.sqrt(R)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--searches", type=int, default=4)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--gap", type=float, default=20.0)
    parser.add_argument("--noise", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"| p (R = {args.searches}, gap {args.gap:g}, noise {args.noise:g}) | rms error | its mean | "
          "stated (bootstrap): mean, within 2 | former rule: mean, within 2 |")
    print("|---|---|---|---|---|")
    for p in (1.0, 0.9, 0.75, 0.5, 0.25):
        rows = []
        for _ in range(args.calls):
            values, log_w, shares = simulated_call(rng, args.searches, p, args.gap, args.noise)
            value, stated = pool_searches(values, log_w, shares)
            rows.append((value, stated, former_error(values, shares)))
        value, stated, former = np.array(rows).T
        cells = [f"{term.mean():.2f}, {np.mean(np.abs(value) <= 2 * term):.2f}" for term in (stated, former)]
        print(f"| {p:g} | {np.sqrt(np.mean(value ** 2)):.2f} | {value.mean():+.2f} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
