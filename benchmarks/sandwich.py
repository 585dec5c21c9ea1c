"""The sandwich of bidirectional Monte Carlo on NMF(4), 50 × 70, data simulated from the model.

X and its allocation S are drawn from NMF(4) with a = 200 (Dirichlet(1)-sized columns, as the
benchmark data of benchmarks/README.md, but evaluated under the model that drew them, so that S is
an exact draw of the posterior). For each T: the default forward estimate (``bam.log_evidence``,
a stochastic lower bound), the reverse-annealing upper bound from S
(``bam.evidence_upper_bound``, a stochastic upper bound) back to the reference built from the
forward estimate's best allocation (``--urn``: back to the latent urn instead), the width of the
sandwich (upper − forward; the error of either is at most about this), and the seconds of each.

    nice -n 5 .venv/bin/python benchmarks/sandwich.py --totals 1000 4000
"""

from __future__ import annotations

import argparse
import time

import jax

import bam_ppl as bam


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--totals", type=int, nargs="+", default=[1000, 4000], help="numbers of tokens T")
    parser.add_argument("--seed", type=int, default=0, help="key of the simulated data")
    parser.add_argument("--key", type=int, default=0, help="rng_key of both estimators")
    parser.add_argument("--runs", type=int, default=16, help="reverse runs")
    parser.add_argument("--temperatures", type=int, default=None, help="reverse temperatures (default: T)")
    parser.add_argument("--urn", action="store_true", help="anneal back to the latent urn, not to a reference")
    args = parser.parse_args(argv)
    model = bam.models.nmf(4, a=200.0)
    path = "latent urn" if args.urn else "reference from the forward estimate's best allocation"
    print(f"NMF(4), a = 200, 50 × 70, data key {args.seed}, rng_key {args.key}, {args.runs} reverse runs to the {path}")
    print("| T | forward (default) | s | upper bound (reverse) | temperatures | s | sandwich width |")
    print("|---|---|---|---|---|---|---|")
    for total in args.totals:
        S, X = model.sample(jax.random.key(args.seed), shape=(50, 70), total=total)
        start = time.perf_counter()
        forward = bam.log_evidence(model, X, rng_key=args.key)
        forward_seconds = time.perf_counter() - start
        start = time.perf_counter()
        reference = None if args.urn else (forward.details["best_cells"], forward.details["best_counts"])
        upper = bam.evidence_upper_bound(model, X, S, rng_key=args.key, num_chains=args.runs,
                                         num_temperatures=args.temperatures, reference=reference)
        upper_seconds = time.perf_counter() - start
        print(f"| {total} | {forward.value:.2f} ± {forward.stderr:.2f} | {forward_seconds:.0f} | "
              f"{upper.value:.2f} ± {upper.stderr:.2f} | {upper.details['num_temperatures']} | {upper_seconds:.0f} | "
              f"{upper.value - forward.value:.2f} |", flush=True)


if __name__ == "__main__":
    main()
