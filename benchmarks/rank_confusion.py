"""CP rank recovery by evidence at full size: the confusion experiment, one CSV row per estimate.

Cemgil, Kurutmaz, Yıldırım, Barsbey & Şimşekli (2019), "Bayesian allocation model: inference by
sequential Monte Carlo for nonnegative tensor factorizations and topic models using Pólya urns",
§5.1.2, as run in the authors' code: 20 × 25 × 30 count tensors of T = 1000 tokens drawn from the
CP model with a = 10 and a known rank, candidates R = 1..9; the authors report exact recovery in
92.5 % of their tensors with their Pólya-urn SMC and 52.5 % with the variational lower bound.

For every tensor and candidate rank the script appends one row to ``--output`` (the evidence of
``--method``, default ``"auto"``, with its stderr, sure lower bound, per-run values and CPU
seconds, and the VB bound of the same model), so that a run cut off early still yields numbers
and a second call resumes where the first stopped. Tensors are taken round-robin over the true
ranks (tensor 0 of every rank, then tensor 1, ...), with the tutorial's seeds
(``tutorials/rank_confusion.py``: seed = 1000 · true rank + tensor).

Usage::

    python benchmarks/rank_confusion.py --tensors 2                 # 12 tensors, default options
    python benchmarks/rank_confusion.py --tensors 2 --num-sweeps 3 --output more_sweeps.csv
    python benchmarks/rank_confusion.py --summary                   # confusion tables of the CSV
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import bam_ppl as bam

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "benchmarks" / "_output" / "rank_confusion" / "rows.csv"
SHAPE = (20, 25, 30)
DEFAULT_A = 10.0
PAPER = {"Pólya-urn SMC (authors)": 0.925, "VB lower bound (authors)": 0.525}
KEY_COLUMNS = ["true_rank", "tensor", "R"]


def cpu_seconds() -> float:
    """CPU time of this process, all threads (the numba kernel runs two)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def estimator_options(args) -> dict:
    """The tempered SMC options given on the command line (absent ones keep the package defaults)."""
    names = {"num_particles": args.num_particles, "num_chains": args.num_runs, "rho": args.rho,
             "num_sweeps": args.num_sweeps}
    return {k: v for k, v in names.items() if v is not None}


def one_row(X, true_rank, tensor, R, args) -> dict:
    """Evidence (``args.method``) and VB bound of CP(R) on one tensor, with timings."""
    model = bam.models.cp(R, a=args.a)
    key = 1000 * true_rank + tensor
    start, cpu = time.perf_counter(), cpu_seconds()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        est = bam.log_evidence(model, X, method=args.method, rng_key=key * 100 + R, **estimator_options(args))
    wall, used = time.perf_counter() - start, cpu_seconds() - cpu
    vb_start = cpu_seconds()
    vb = bam.log_evidence(model, X, method="vb", rng_key=key * 100 + R)
    runs = est.details.get("run_log_evidence", [])
    cross = est.details.get("cross_check", {})
    return dict(true_rank=true_rank, tensor=tensor, R=R, method=est.method, log_evidence=est.value,
                stderr=est.stderr, lower_bound=est.details.get("lower_bound", np.nan),
                runs=" ".join(f"{v:.2f}" for v in runs),
                temperatures=min(est.details.get("num_temperatures", [0])), seconds=wall, cpu_seconds=used,
                cross_method=cross.get("method", ""), cross_value=cross.get("value", np.nan),
                cross_stderr=cross.get("stderr", np.nan),
                vb_bound=vb.value, vb_cpu_seconds=cpu_seconds() - vb_start, load=os.getloadavg()[0])


def done_rows(output: Path) -> set:
    if not output.exists():
        return set()
    return set(map(tuple, pd.read_csv(output)[KEY_COLUMNS].to_numpy().tolist()))


def measure(args) -> None:
    args.output.parent.mkdir(parents=True, exist_ok=True)
    done = done_rows(args.output)
    for tensor in range(args.first_tensor, args.first_tensor + args.tensors):
        for true_rank in args.true_ranks:
            _, X = bam.models.cp(true_rank, a=args.a).sample(1000 * true_rank + tensor, shape=SHAPE,
                                                             total=args.total)
            for R in args.candidates:
                if (true_rank, tensor, R) in done:
                    continue
                row = one_row(X, true_rank, tensor, R, args)
                pd.DataFrame([row]).to_csv(args.output, mode="a", header=not args.output.exists(), index=False)
                print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)


def selections(rows: pd.DataFrame) -> pd.DataFrame:
    """Per tensor: the rank chosen by the estimate, by the sure lower bound and by the VB bound."""
    chosen = []
    for (true_rank, tensor), group in rows.groupby(["true_rank", "tensor"]):
        best = group.sort_values("log_evidence", ascending=False)
        errors = np.sqrt(best["stderr"].fillna(0).iloc[0] ** 2 + best["stderr"].fillna(0).iloc[1] ** 2)
        chosen.append(dict(
            true_rank=true_rank, tensor=tensor, candidates=len(group), estimate=int(best["R"].iloc[0]),
            margin=float(best["log_evidence"].iloc[0] - best["log_evidence"].iloc[1]), margin_stderr=float(errors),
            sure_bound=int(group.loc[group["lower_bound"].fillna(group["log_evidence"]).idxmax(), "R"]),
            vb=int(group.loc[group["vb_bound"].idxmax(), "R"]),
            below_bound=int((group["log_evidence"] < group["lower_bound"] - 3 * group["stderr"].fillna(0)).sum())))
    return pd.DataFrame(chosen)


def summary(args) -> str:
    rows = pd.read_csv(args.output)
    complete = rows.groupby(["true_rank", "tensor"])["R"].transform("size") == len(args.candidates)
    chosen = selections(rows[complete])
    parts = [f"{len(chosen)} complete tensors (T = {args.total}, a = {args.a:g}, candidates "
             f"{min(args.candidates)}..{max(args.candidates)}); {len(rows)} estimates, "
             f"median {rows['cpu_seconds'].median():.1f} CPU s per estimate"]
    for column, name in (("estimate", "evidence estimate"), ("sure_bound", "sure lower bound"), ("vb", "VB bound")):
        exact = float((chosen[column] == chosen["true_rank"]).mean())
        within = float((abs(chosen[column] - chosen["true_rank"]) <= 1).mean())
        table = pd.crosstab(chosen["true_rank"], chosen[column]).reindex(columns=args.candidates, fill_value=0)
        parts.append(f"**{name}**: {exact:.1%} exact, {within:.1%} within ±1\n\n" + _markdown(table))
    parts.append("estimates below their sure lower bound by > 3 stated stderr: "
                 f"{int(chosen['below_bound'].sum())} of {len(rows[complete])}")
    parts.append("authors: " + ", ".join(f"{k} {v:.1%}" for k, v in PAPER.items()))
    return "\n\n".join(parts)


def _markdown(table: pd.DataFrame) -> str:
    header = "| true \\ selected | " + " | ".join(map(str, table.columns)) + " |"
    lines = [header, "|" + "---|" * (len(table.columns) + 1)]
    lines += [f"| {i} | " + " | ".join(map(str, row)) + " |" for i, row in zip(table.index, table.to_numpy())]
    return "\n".join(lines)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=2, help="tensors per true rank")
    parser.add_argument("--first-tensor", type=int, default=0)
    parser.add_argument("--true-ranks", type=int, nargs="+", default=list(range(2, 8)))
    parser.add_argument("--candidates", type=int, nargs="+", default=list(range(1, 10)))
    parser.add_argument("--total", type=int, default=1000)
    parser.add_argument("--a", type=float, default=DEFAULT_A)
    parser.add_argument("--method", default="auto")
    parser.add_argument("--num-particles", type=int)
    parser.add_argument("--num-runs", type=int)
    parser.add_argument("--rho", type=float)
    parser.add_argument("--num-sweeps", type=int)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--summary", action="store_true", help="only print the tables of the rows so far")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    if not arguments.summary:
        measure(arguments)
    print(summary(arguments))
