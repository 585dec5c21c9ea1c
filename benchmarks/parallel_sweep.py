"""A rank × structure sweep, serial against a Dask LocalCluster (``executor=``, bam_ppl.parallel).

CP(R) and Tucker(R, R, 2) models (R = 1, 2, …) compared by their tempered-SMC evidence on a
planted CP(3) tensor. Prints, after a warm-up run of the same sweep on both sides (numba
compilation in every process):

* the serial sweep and the sweep on ``--workers`` single-threaded worker processes, wall
  seconds (best of ``--repeats``), their ratio, and whether the tables are identical;
* the per-task overhead of the executor path: ``--overhead-tasks`` trivial tasks (exact evidence
  of a model with no free node, well under a millisecond of work) through ``bam.compare`` on the
  cluster, wall seconds per task, against the same tasks run serially.

    python benchmarks/parallel_sweep.py --models 16 --workers 2
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings

import numpy as np
import pandas as pd

import bam_ppl as bam


def sweep_models(count: int) -> dict:
    """CP(1), Tucker(1, 1, 2), CP(2), Tucker(2, 2, 2), …: ``count`` models."""
    models = {}
    rank = 1
    while len(models) < count:
        models[f"cp{rank}"] = bam.models.cp(rank)
        if len(models) < count:
            models[f"tucker{rank}{rank}2"] = bam.models.tucker((rank, rank, 2))
        rank += 1
    return models


def best_of(repeats: int, fn):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--shape", type=int, nargs=3, default=[8, 8, 4])
    parser.add_argument("--particles", type=int, default=128)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--overhead-tasks", type=int, default=64)
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    # Timing settings, not accuracy settings: the rows' stderr says how rough the estimates are.
    warnings.simplefilter("ignore", bam.EvidenceWarning)

    _, X = bam.models.cp(3).sample(0, shape=tuple(args.shape), total=args.tokens)
    X = bam.CountTensor.from_dense(X)
    models = sweep_models(args.models)
    options = dict(method="tempered", rng_key=0, num_particles=args.particles, num_chains=args.runs,
                   progress_bar=False)
    trivial = {f"independence{i}": bam.models.independence(3) for i in range(args.overhead_tasks)}
    print(f"load average {os.getloadavg()[0]:.2f}; {len(models)} models, T = {X.total}, shape {X.shape}, "
          f"{args.workers} workers", flush=True)

    bam.compare(models, X, **options)  # warm-up: numba compiles in this process
    serial_s, serial = best_of(args.repeats, lambda: bam.compare(models, X, **options))
    trivial_serial_s, _ = best_of(args.repeats, lambda: bam.compare(trivial, X, method="exact"))
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        bam.compare(models, X, executor=client, **options)  # warm-up: every worker compiles
        bam.compare(trivial, X, method="exact", executor=client)
        dask_s, parallel = best_of(args.repeats, lambda: bam.compare(models, X, executor=client, **options))
        trivial_dask_s, _ = best_of(args.repeats, lambda: bam.compare(trivial, X, method="exact", executor=client))
    same = serial.equals(parallel)
    pd.testing.assert_frame_equal(parallel, serial, check_exact=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"| sweep | serial s | {args.workers} Dask workers s | ratio (Dask / serial) | identical tables |")
    print("|---|---|---|---|---|")
    print(f"| {len(models)} models | {serial_s:.2f} | {dask_s:.2f} | {dask_s / serial_s:.2f} | {same} |")
    per_task = 1e3 * trivial_dask_s / len(trivial)
    print(f"per-task overhead: {per_task:.1f} ms on Dask ({len(trivial)} trivial tasks, "
          f"{1e3 * trivial_serial_s / len(trivial):.1f} ms each serially)")
    print(serial[["log_evidence", "stderr", "rank"]].head(5).to_string(float_format=lambda v: f"{v:.2f}"))
    return np.asarray([serial_s, dask_s])


if __name__ == "__main__":
    main()
