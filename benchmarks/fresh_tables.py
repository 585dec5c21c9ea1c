"""The default evidence on tables no number of the engine was chosen on: is it honest there?

scikit-learn's bundled data sets (no download; ``make bench`` installs scikit-learn), each of a few
measurements cut into equal-frequency bins (``pandas.qcut``), give a records table with named columns; latent-class models
``AllocationModel("r -> <columns>", latent={"r": R}, a=--a)`` are fitted as a user would write them, the
DataFrame's columns in another order than the structure names them. For each model: the default
(``bam.log_evidence(model, df, rng_key=key)``) over ``--keys`` keys (mean, sd across keys, root-mean-square
stated stderr, mean wall seconds; at the end, how many have sd ≤ 2 × stated + 0.5), then two checks of
another cost or kind: the default at ``--check-effort`` (two keys: what more effort says) and Chib's
estimator (two keys), and, with ``--smc-particles``, the Pólya-urn SMC of 8 runs of that many particles.

    .venv/bin/python benchmarks/fresh_tables.py
    .venv/bin/python benchmarks/fresh_tables.py --data cancer --ranks 4 --keys 16 --smc-particles 1000000
    .venv/bin/python benchmarks/fresh_tables.py --a 0.01 --data iris cancer --ranks 3 4 --keys 8
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import NamedTuple

import numpy as np
import pandas as pd
from sklearn import datasets

import bam_ppl as bam

# Measurements of each data set, three bins each: four or five of them keep the tables at 81–243 cells.
TABLES = {
    "iris": (datasets.load_iris, ["sepal length (cm)", "petal width (cm)", "sepal width (cm)", "petal length (cm)"]),
    "wine": (datasets.load_wine, ["alcohol", "flavanoids", "color_intensity", "proline", "hue"]),
    "cancer": (datasets.load_breast_cancer, ["mean radius", "mean texture", "mean smoothness", "mean concavity",
                                             "worst symmetry"]),
}
BINS = 3


def records(name: str) -> pd.DataFrame:
    """The records of data set ``name``: its measurements cut into ``BINS`` equal-frequency bins, as strings."""
    loader, columns = TABLES[name]
    frame = loader(as_frame=True).frame
    return pd.DataFrame({c.split(" (")[0].replace(" ", "_"): pd.qcut(frame[c], BINS, labels=False).astype(str)
                         for c in columns})


def model_of(df: pd.DataFrame, rank: int, a: float = 1.0) -> bam.AllocationModel:
    """Latent classes r over ``df``'s columns, named in reverse order (the user's table need not follow), every
    Dirichlet of concentration ``a``."""
    return bam.AllocationModel(f"r -> {', '.join(reversed(df.columns))}", latent={"r": rank}, a=a)


def estimate(model, df, key, **options):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        est = bam.log_evidence(model, df, rng_key=key, **options)
    return est, time.perf_counter() - start


class Cells(NamedTuple):
    """One model's figures, as the row of its data set shows them, and whether its spread is honest."""

    default: str
    effort: str
    chib: str
    smc: str
    honest: bool


def cells(rank: int, df: pd.DataFrame, args) -> Cells:
    model = model_of(df, rank, args.a)
    calls = [estimate(model, df, key) for key in range(args.keys)]
    values = np.array([est.value for est, _ in calls])
    stated = float(np.sqrt(np.mean([est.stderr ** 2 for est, _ in calls])))
    sd = float(values.std(ddof=1))
    seconds = np.mean([s for _, s in calls])
    checks = [estimate(model, df, 1000 + key, effort=args.check_effort)[0] for key in range(2)]
    chib = [estimate(model, df, 2000 + key, method="chib")[0] for key in range(2)]
    smc = ""
    if args.smc_particles:
        smc = _pair([estimate(model, df, 3000, method="smc", num_particles=args.smc_particles, num_chains=8)[0]])
    return Cells(f"{rank}: {values.mean():.2f}, {sd:.2f}, {stated:.2f} ({seconds:.1f})", f"{rank}: {_pair(checks)}",
                 f"{rank}: {_pair(chib)}", f"{rank}: {smc}", sd <= 2 * stated + 0.5)


def _pair(estimates) -> str:
    return ", ".join(f"{e.value:.2f} ± {e.stderr:.2f}" for e in estimates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 3, 4, 5])
    parser.add_argument("--keys", type=int, default=16, help="keys of the default per model (≥ 2)")
    parser.add_argument("--a", type=float, default=1.0, help="the models' Dirichlet concentration")
    parser.add_argument("--check-effort", type=float, default=4.0, help="effort of the costlier default (two keys)")
    parser.add_argument("--smc-particles", type=int, default=0, help="particles of each Pólya-urn SMC run (0: none)")
    args = parser.parse_args()
    smc = " Pólya-urn SMC, by R |" if args.smc_particles else ""
    print(f"| data | default by R: mean, sd across keys, rms stated (mean s) | effort {args.check_effort:g}, two calls, "
          f"by R | Chib, two calls, by R |{smc}")
    print("|---" * (4 + bool(smc)) + "|")
    honest = []
    for name in args.data:
        df = records(name)
        row = [cells(rank, df, args) for rank in args.ranks]
        honest += [c.honest for c in row]
        columns = list(zip(*(c[:4] for c in row)))[:4 if smc else 3]
        print(f"| {name} ({len(df)} records, {df.shape[1]} measurements) | "
              + " | ".join("; ".join(column) for column in columns) + " |", flush=True)
    print(f"\nhonest (sd across keys ≤ 2 × rms stated + 0.5): {sum(honest)} of {len(honest)}")


if __name__ == "__main__":
    main()
