"""Evidence estimators side by side at realistic sizes: honest error and bias against seconds.

NMF(K), a = 1, fitted to I × J counts drawn from the BAM NMF prior with a large a (so that the
data have real structure), T tokens. For every estimator and key: the log-evidence, its stated
standard error, wall seconds; per estimator: the spread across keys (sd), the mean stated error,
and the gap to the best sure lower bound seen by any estimator (log p(X, S) of a visited
allocation: an estimate below it is wrong). The VB bound is printed as a (weaker) yardstick.

    .venv/bin/python benchmarks/evidence_accuracy.py --tokens 1000 4000 --keys 4
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import numpy as np

import bam_ppl as bam

ESTIMATORS = {
    "auto": dict(method="auto"),
    "auto-effort0.5": dict(method="auto", effort=0.5),
    "auto-effort2": dict(method="auto", effort=2.0),
    "smc": dict(method="smc"),
    "tempered": dict(method="tempered"),
    "tempered-rho0.95": dict(method="tempered", rho=0.95),
    "tempered-2sweeps": dict(method="tempered", num_sweeps=2),
    "tempered-high": dict(method="tempered", num_particles=512, rho=0.97, num_sweeps=3),
    "chib": dict(method="chib"),
    "vb": dict(method="vb", num_chains=4),
}


def data_for(tokens: int, rows: int, cols: int, rank: int, seed: int):
    _, X = bam.models.nmf(rank, a=200.0).sample(jax.random.key(seed), shape=(rows, cols), total=tokens)
    return np.asarray(X)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--keys", type=int, default=4, help="independent calls per estimator")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--shape", type=int, nargs=2, default=[50, 70])
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    args = parser.parse_args(argv)
    model = bam.models.nmf(args.rank)
    print(f"NMF({args.rank}), a = 1, data {args.shape[0]}x{args.shape[1]} from the a = 200 prior; "
          f"{args.keys} keys per estimator; wall seconds on {jax.device_count()} JAX device(s), "
          f"{__import__('os').cpu_count()} cores")
    for T in args.tokens:
        X = data_for(T, *args.shape, args.rank, seed=0)
        print(f"\nT = {T}, nonzero cells = {(X > 0).sum()}")
        rows, bound = {}, -np.inf
        for name in args.estimators:
            values, errors, seconds, cpu = [], [], [], []
            for key in range(args.keys):
                start, start_cpu = time.perf_counter(), time.process_time()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", bam.EvidenceWarning)
                    est = bam.log_evidence(model, X, rng_key=key, **ESTIMATORS[name])
                seconds.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
                print(f"  {name} key {key}: {est.value:.2f} ± {est.stderr:.2f}, bound "
                      f"{est.details.get('lower_bound', np.nan):.2f}, {seconds[-1]:.1f} s wall, {cpu[-1]:.1f} s CPU",
                      flush=True)
                values.append(est.value)
                errors.append(est.stderr)
                bound = max(bound, est.details.get("lower_bound", -np.inf))
            rows[name] = (np.array(values), np.array(errors), np.array(seconds), np.array(cpu))
        print(f"best sure lower bound (any estimator): {bound:.1f}")
        print("| estimator | mean | sd across keys | mean stated stderr | mean − bound | wall s per call (median) "
              "| CPU s per call (median) |")
        print("|---|---|---|---|---|---|---|")
        for name, (values, errors, seconds, cpu) in rows.items():
            stated = f"{np.mean(errors):.2f}" if np.isfinite(errors).all() else "– (bound)"
            print(f"| {name} | {values.mean():.2f} | {values.std(ddof=1):.2f} | {stated} | "
                  f"{values.mean() - bound:+.1f} | {np.median(seconds):.1f} | {np.median(cpu):.1f} |")


if __name__ == "__main__":
    main()
