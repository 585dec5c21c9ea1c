"""High-effort reference values of the small dense tables that ``tests/test_auto_evidence.py`` holds
the default to: the Pólya-urn SMC with 16 runs of 20 000 particles, cross-checked by the Chib-style
estimator with 16 chains of 3000 sweeps.

HairEyeColor under CP(2) (592 people in 32 cells) and the dense 6 × 8 NMF(2) table of the test (600
tokens). Prints value ± stated stderr and seconds for each estimator.

Usage::

    python benchmarks/high_effort_references.py
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import bam_ppl as bam

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_auto_evidence import DENSE  # noqa: E402  (the table the test holds the default to)

CASES = {
    "hair_eye_color_cp2": (bam.models.cp(2), bam.datasets.load_hair_eye_color),
    "dense_nmf2": (bam.models.nmf(2), lambda: DENSE),
}
ESTIMATORS = {
    "smc": dict(method="smc", rng_key=123, num_particles=20_000, num_chains=16),
    "chib": dict(method="chib", rng_key=123, num_chains=16, num_samples=3000),
}


def main() -> None:
    warnings.simplefilter("ignore", bam.EvidenceWarning)
    print(f"{'case':>20} {'estimator':>9} {'value':>10} {'stderr':>7} {'s':>6}")
    for name, (model, load) in CASES.items():
        X = load()
        for label, options in ESTIMATORS.items():
            start = time.perf_counter()
            est = bam.log_evidence(model, X, **options)
            print(f"{name:>20} {label:>9} {est.value:>10.3f} {est.stderr:>7.3f} {time.perf_counter() - start:>6.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
