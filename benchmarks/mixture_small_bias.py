"""The mixture engine's log-scale bias on a small table against the exact value.

``bam.log_evidence(nmf(2), X, method="mixture", rng_key=key, num_chains=R, ...)`` on the 5 × 4 table of
``tests/test_auto_evidence.py`` (32 tokens, exact log p(X) by enumeration): the pooled error of R runs
with its standard error, the quantiles of the runs' errors and the temperatures of the first runs, for
each setting given (``--settings "rho=0.97" "rho=0.995"``; values read as numbers).

With ``--calls K``, K calls of the default (``method="auto"``, keys 0 to K − 1) instead: each call's
error and stated error, and Σ z² (z = (|error| − 0.03) / stated, the allowance of
``tests/test_auto_evidence.py``) against the chi-square's 0.999 quantile with K degrees of freedom,
the honesty test the suite makes on keys 0–5.

    .venv/bin/python benchmarks/mixture_small_bias.py --runs 24 --particles 272 --settings rho=0.97 rho=0.995
    .venv/bin/python benchmarks/mixture_small_bias.py --calls 12
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from scipy import stats

import bam_ppl as bam

TABLE = np.array([[3, 2, 0, 1], [2, 3, 1, 0], [0, 1, 3, 2], [1, 0, 2, 3], [1, 1, 0, 0]])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--particles", type=int, default=None)
    parser.add_argument("--key", type=int, default=0)
    parser.add_argument("--settings", nargs="+", default=["rho=0.97"], metavar="OPTION=VALUE")
    parser.add_argument("--calls", type=int, default=0, help="calls of the default, keys 0 to CALLS - 1")
    args = parser.parse_args(argv)
    model = bam.models.nmf(2, a=1.0)
    exact = bam.log_evidence(model, TABLE, method="exact", max_tensors=2_000_000).value
    if args.calls:
        honesty_across_calls(model, exact, args.calls, args.particles)
        return
    print(f"exact log p(X) = {exact:.4f}; {args.runs} runs, key {args.key}, particles {args.particles or 'default'}")
    for setting in args.settings:
        name, _, value = setting.partition("=")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bam.EvidenceWarning)
            est = bam.log_evidence(model, TABLE, method="mixture", rng_key=args.key, num_chains=args.runs,
                                   num_particles=args.particles, **{name: float(value)})
        errors = np.array(est.run_values) - exact
        print(f"{setting}: pooled error {est.value - exact:+.3f} ± {est.stderr:.3f}, runs' errors (min, quartiles, max) "
              f"{np.round(np.quantile(errors, [0, 0.25, 0.5, 0.75, 1]), 3).tolist()}, "
              f"temperatures {est.info.num_temperatures[:3]}", flush=True)


def honesty_across_calls(model, exact: float, num_calls: int, particles: int | None, allowance: float = 0.03) -> None:
    """One default call per key: error, stated error and z; then Σ z² against its chi-square bound."""
    options = {} if particles is None else {"num_particles": particles}
    z = []
    for key in range(num_calls):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bam.EvidenceWarning)
            est = bam.log_evidence(model, TABLE, rng_key=key, **options)
        error = est.value - exact
        z.append(max(abs(error) - allowance, 0.0) / est.stderr)
        print(f"key {key}: error {error:+.4f}, stated {est.stderr:.4f}, z {z[-1]:.2f}, runs' errors "
              f"{np.round(np.array(est.run_values) - exact, 3).tolist()}", flush=True)
    print(f"exact {exact:.4f}; particles {particles or 'default'}; sum z^2 {np.sum(np.square(z)):.1f} against "
          f"{stats.chi2.ppf(0.999, num_calls):.1f} (chi-square 0.999, {num_calls} calls)")


if __name__ == "__main__":
    main()
