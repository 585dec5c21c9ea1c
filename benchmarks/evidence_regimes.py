"""Which evidence estimator to trust, by tokens per nonzero cell.

Small tables with many tokens per cell (HairEyeColor, dense NMF data) and sparse ones with about
one token per cell, each estimator with its default options over several keys: the mean, the
spread across keys, the mean stated standard error, the gap to the best sure lower bound any
estimator found (an estimate below it by more than its error is wrong) and CPU seconds per call.
One CSV row per call goes to ``--out`` (resumable: rows already there are skipped).

    nice -n 5 .venv/bin/python benchmarks/evidence_regimes.py --keys 3 --out benchmarks/_output/evidence_regimes.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import time
import warnings

import jax
import numpy as np

import bam_ppl as bam

ESTIMATORS = {
    "smc": dict(method="smc"),
    "tempered": dict(method="tempered"),
    "chib": dict(method="chib"),
    "auto": dict(method="auto"),
}
FIELDS = ("case", "tokens", "cells", "estimator", "key", "value", "stderr", "lower_bound", "method", "cpu_s", "wall_s")


def nmf_data(rank, rows, cols, tokens, seed=0):
    _, X = bam.models.nmf(rank, a=200.0).sample(jax.random.key(seed), shape=(rows, cols), total=tokens)
    return np.asarray(X)


def cases():
    """(name, model, data) from many tokens per nonzero cell to about one."""
    hec = bam.datasets.load_hair_eye_color()
    yield "HairEyeColor CP(2)", bam.models.cp(2), hec
    yield "HairEyeColor CP(3)", bam.models.cp(3), hec
    for tokens in (60, 600, 3000):
        yield f"NMF(2) 6x8 T={tokens}", bam.models.nmf(2), nmf_data(2, 6, 8, tokens)
    yield "NMF(3) 20x30 T=400", bam.models.nmf(3), nmf_data(3, 20, 30, 400)


def done_rows(path):
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {(r["case"], r["estimator"], r["key"]) for r in csv.DictReader(f)}


def measure(model, X, options, key):
    cpu, wall = time.process_time(), time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        est = bam.log_evidence(model, X, rng_key=key, **options)
    return est, time.process_time() - cpu, time.perf_counter() - wall


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    parser.add_argument("--out", default="benchmarks/_output/evidence_regimes.csv")
    args = parser.parse_args(argv)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    done = done_rows(args.out)
    new_file = not os.path.exists(args.out)
    with open(args.out, "a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if new_file:
            writer.writeheader()
        for name, model, X in cases():
            data = model.as_data(X)
            for estimator in args.estimators:
                for key in range(args.keys):
                    if (name, estimator, str(key)) in done:
                        continue
                    est, cpu, wall = measure(model, X, ESTIMATORS[estimator], key)
                    writer.writerow(dict(case=name, tokens=data.total, cells=data.nnz, estimator=estimator, key=key,
                                         value=est.value, stderr=est.stderr,
                                         lower_bound=est.details.get("lower_bound", np.nan), method=est.method,
                                         cpu_s=round(cpu, 2), wall_s=round(wall, 2)))
                    f.flush()
    summarise(args.out)


def summarise(path):
    """Per case and estimator: mean, sd across keys, mean stated stderr, mean − best bound, CPU s."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for name in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == name]
        bound = max(float(r["lower_bound"]) for r in mine)
        print(f"\n{name}: T = {mine[0]['tokens']}, {mine[0]['cells']} nonzero cells, best sure bound {bound:.2f}")
        print("| estimator | mean | sd across keys | mean stated stderr | mean − bound | CPU s per call |")
        print("|---|---|---|---|---|---|")
        for estimator in dict.fromkeys(r["estimator"] for r in mine):
            group = [r for r in mine if r["estimator"] == estimator]
            values = np.array([float(r["value"]) for r in group])
            print(f"| {estimator} | {values.mean():.2f} | {values.std(ddof=1) if values.size > 1 else np.nan:.2f} | "
                  f"{np.mean([float(r['stderr']) for r in group]):.2f} | {values.mean() - bound:+.2f} | "
                  f"{np.mean([float(r['cpu_s']) for r in group]):.1f} |")


if __name__ == "__main__":
    main()
