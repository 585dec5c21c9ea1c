"""The default evidence on simulated tables of shapes and models no number of the engine was chosen on.

Each case draws one table from a generating model (``model.sample``, concentrations high enough that every latent
label holds tokens) and fits it as a user would, with another prior (``bam.models`` defaults, or the ``a`` named):
Tucker(3, 2) on 12 × 10, CP(5) on 6 × 5 × 4, NMF(6) on 30 × 40, NMF(5) on 100 documents of 300 words (sparse, a =
0.2), Tucker(2, 2, 2) on 8 × 7 × 6. For each: the default (``bam.log_evidence(model, X, rng_key=key)``) over
``--keys`` (mean, sd across keys, mean stated stderr, honest: sd ≤ 2 × stated + 0.5; each key's distance to the
check below in its own stated errors), then a check of another cost: one call at ``--check-effort`` (key 99), or
a value given for each case (``--check-values``, e.g. an earlier check's: the keys' distances to it, no call).

    .venv/bin/python benchmarks/simulated_honesty.py
    .venv/bin/python benchmarks/simulated_honesty.py --cases tucker32 --keys 0 1 2 3 4 5 6 7 --check-effort 8
    .venv/bin/python benchmarks/simulated_honesty.py --check-values -396.03 -447.28 -2306.26 -5100.70 -819.37
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import numpy as np

import bam_ppl as bam

# name: (generating model, sample options, seed of the draw, fitted model)
CASES = {
    "tucker32": (bam.models.tucker((3, 2), a=20.0), dict(shape=(12, 10), total=2000), 11, bam.models.tucker((3, 2))),
    "cp5": (bam.models.cp(5, a=30.0), dict(shape=(6, 5, 4), total=1500), 12, bam.models.cp(5, a=0.5)),
    "nmf6": (bam.models.nmf(6, a=40.0), dict(shape=(30, 40), total=3000), 13, bam.models.nmf(6)),
    "docs_nmf5": (bam.models.nmf(5, a=60.0), dict(shape=(100, 300), total=2000), 14, bam.models.nmf(5, a=0.2)),
    "tucker222": (bam.models.tucker((2, 2, 2), a=20.0), dict(shape=(8, 7, 6), total=2500), 15,
                  bam.models.tucker((2, 2, 2))),
}


def table(name: str) -> tuple[bam.AllocationModel, np.ndarray]:
    """The fitted model of case ``name`` and its simulated table."""
    generating, options, seed, fitted = CASES[name]
    _, X = generating.sample(jax.random.key(seed), **options)
    return fitted, np.asarray(X)


def estimate(model, X, key, **options):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        est = bam.log_evidence(model, X, rng_key=key, **options)
    return est, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--keys", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--check-effort", type=float, default=4.0)
    parser.add_argument("--check-values", type=float, nargs="+", default=None,
                        help="a check value for each of --cases, in order, instead of the check calls")
    args = parser.parse_args()
    print("| case | table | mean | sd across keys | mean stated | honest | keys' distance to the check (stated errors) "
          "| check (effort) | mean s | check s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    if args.check_values is not None and len(args.check_values) != len(args.cases):
        parser.error(f"--check-values: one value for each of the {len(args.cases)} cases")
    for c, name in enumerate(args.cases):
        model, X = table(name)
        runs = [estimate(model, X, key) for key in args.keys]
        values = np.array([est.value for est, _ in runs])
        stated = np.array([est.stderr for est, _ in runs])
        if args.check_values is None:
            check, check_seconds = estimate(model, X, 99, effort=args.check_effort)
            check_value, check_text = check.value, f"{check.value:.2f} ± {check.stderr:.2f} ({args.check_effort:g})"
        else:
            check_value, check_seconds = args.check_values[c], float("nan")
            check_text = f"{check_value:.2f} (given)"
        sd = float(values.std(ddof=1))
        honest = "yes" if sd <= 2.0 * stated.mean() + 0.5 else "no"
        distance = ", ".join(f"{d:+.1f}" for d in (values - check_value) / stated)
        print(f"| {name} | {'×'.join(map(str, X.shape))}, {int(X.sum())} tokens, {int((X > 0).sum())} cells "
              f"| {values.mean():.2f} | {sd:.2f} | {stated.mean():.2f} | {honest} | {distance} "
              f"| {check_text} "
              f"| {np.mean([s for _, s in runs]):.1f} | {check_seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
