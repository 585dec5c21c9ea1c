"""The mixture engine's log-scale bias on a small table against the exact value.

``bam.log_evidence(nmf(2), X, method="mixture", rng_key=key, num_chains=R, ...)`` on the 5 × 4 table of
``tests/test_auto_evidence.py`` (32 tokens, exact log p(X) by enumeration): the pooled error of R runs
with its standard error, the quantiles of the runs' errors and the temperatures of the first runs, for
each setting given (``--settings "rho=0.97" "rho=0.995"``; values read as numbers).

    .venv/bin/python benchmarks/mixture_small_bias.py --runs 24 --particles 272 --settings rho=0.97 rho=0.995
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

import bam_ppl as bam

TABLE = np.array([[3, 2, 0, 1], [2, 3, 1, 0], [0, 1, 3, 2], [1, 0, 2, 3], [1, 1, 0, 0]])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--particles", type=int, default=None)
    parser.add_argument("--key", type=int, default=0)
    parser.add_argument("--settings", nargs="+", default=["rho=0.97"], metavar="OPTION=VALUE")
    args = parser.parse_args(argv)
    model = bam.models.nmf(2, a=1.0)
    exact = bam.log_evidence(model, TABLE, method="exact", max_tensors=2_000_000).value
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


if __name__ == "__main__":
    main()
