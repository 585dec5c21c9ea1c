"""The BAM papers' real-data comparisons at full size, as markdown tables.

Runs the four real-data tutorials with their full settings (``BAM_PPL_SMALL`` unset), each in
its own process writing its tables under ``--output``, and prints markdown tables of the results
with each tutorial's wall time — the numbers for benchmarks/README.md:

* ``abalone_structures``: Abalone, complete graph (exact) against CP(R), R = 1..30, a = 1 and
  0.001 (Cemgil et al. 2019, "Bayesian allocation model: inference by sequential Monte Carlo for
  nonnegative tensor factorizations and topic models using Pólya urns", §5.2);
* ``letter_bigrams``: NMF against symmetric NMF, orders 1..50, 2000 tokens, a = 1 and 0.001
  (same paper, §5.3);
* ``icews_ranks``: ICEWS 2017 (3519 events), CP ranks 1..25 against Tucker ranks (r, r, q),
  r ∈ {1..6, 8}, q ∈ {1..4}
  (Yıldırım et al. 2021, "Bayesian allocation model: marginal likelihood-based model selection
  for count tensors");
* ``rank_confusion``: CP rank recovery on 20 × 25 × 30 tensors, T = 1000, a = 10, true R = 2..7
  (5 tensors each), candidates 1..9; the authors report 92.5 % (SMC) and 52.5 % (VB).

Samplers run with the package defaults (``method="auto"``: the tempered SMC's default particles
and runs). The full runs take hours on a 2-core machine (hundreds of tempered-SMC evidence estimates at
T = 1000-4177). Usage::

    python benchmarks/real_data_evidence.py                    # all four, full size
    python benchmarks/real_data_evidence.py --only icews_ranks rank_confusion
    python benchmarks/real_data_evidence.py --small            # CI settings: checks the script
    python benchmarks/real_data_evidence.py --tables-only      # re-print tables of an earlier run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ("abalone_structures", "letter_bigrams", "icews_ranks", "rank_confusion")


def markdown(df: pd.DataFrame, index: bool = True) -> str:
    """A pandas DataFrame as a GitHub markdown table (no extra dependency)."""
    frame = df.reset_index() if index else df
    cells = [[str(c) for c in frame.columns]] + [[_fmt(v) for v in row] for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("---" for _ in frame.columns) + "|")
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, (float, np.floating)):
        return "" if np.isnan(value) else f"{value:.2f}"
    return str(value)


def _with_error(df: pd.DataFrame) -> pd.Series:
    err = df["stderr"].fillna(0.0)
    return [f"{v:.2f}" if e == 0 else f"{v:.2f} ± {e:.2f}" for v, e in zip(df["log_evidence"], err)]


def abalone_tables(out: Path) -> str:
    table = pd.read_csv(out / "abalone_compare.csv")
    parts = []
    for a, rows in table.groupby("a", sort=False):
        rows = rows.sort_values("R")
        shown = pd.DataFrame({
            "model": rows["model"], "log evidence": _with_error(rows), "sure lower bound": rows["lower_bound"],
            "method": rows["method"], "delta": rows["delta"], "distinguishable": rows["distinguishable"],
            "below bound": rows["below_bound"], "temperatures": rows["temperatures"],
            "CP surely above CG": rows["surely_above_CG"],
        })
        parts.append(f"**Abalone, a = {a:g}** (T = {_tokens(out, 'abalone')})\n\n" + markdown(shown, index=False))
    return "\n\n".join(parts)


def letter_tables(out: Path) -> str:
    table = pd.read_csv(out / "letter_bigrams_compare.csv")
    parts = []
    for a, rows in table.groupby("a", sort=False):
        rows = rows.assign(shown=_with_error(rows))
        wide = rows.pivot(index="K", columns="structure", values="shown")
        value = rows.pivot(index="K", columns="structure", values="log_evidence")
        bound = rows.pivot(index="K", columns="structure", values="lower_bound")
        temps = rows.pivot(index="K", columns="structure", values="temperatures")
        for name in ("NMF", "sNMF"):
            wide[f"{name} bound"] = bound[name]
        for name in ("NMF", "sNMF"):
            wide[f"{name} temperatures"] = temps[name]
        wide["ahead"] = np.where(value["NMF"] > value["sNMF"], "NMF", "sNMF")
        ahead = (wide["ahead"] == "NMF").sum()
        parts.append(f"**Letter bigrams, a = {a:g}**: NMF ahead at {ahead} of {len(wide)} orders\n\n"
                     + markdown(wide))
    return "\n\n".join(parts)


def icews_tables(out: Path) -> str:
    rows = pd.read_csv(out / "icews_compare.csv")
    shown = pd.DataFrame({
        "model": rows["model"], "log evidence": _with_error(rows), "sure lower bound": rows["lower_bound"],
        "delta": rows["delta"], "distinguishable": rows["distinguishable"], "below bound": rows["below_bound"],
        "temperatures": rows["temperatures"],
    })
    return "**ICEWS, CP against Tucker (best first)**\n\n" + markdown(shown, index=False)


def confusion_tables(out: Path) -> str:
    trials = pd.read_csv(out / "rank_confusion_trials.csv")
    summary = pd.read_csv(out / "rank_confusion_summary.csv")
    confusion = pd.crosstab(trials["true_rank"], trials["selected"])
    confusion.index.name = "true \\ selected"
    summary = summary.assign(**{c: [f"{v:.1%}" if np.isfinite(v) else "" for v in summary[c]]
                                for c in ("exact", "within_one") if c in summary})
    return ("**CP rank confusion** (rows: true rank, columns: selected rank)\n\n" + markdown(confusion)
            + "\n\n" + markdown(summary, index=False))


TABLES = {"abalone_structures": abalone_tables, "letter_bigrams": letter_tables, "icews_ranks": icews_tables,
          "rank_confusion": confusion_tables}


def _tokens(out: Path, name: str) -> str:
    log = out / f"{name}_structures.log" if name == "abalone" else out / f"{name}.log"
    if log.exists():
        for line in log.read_text().splitlines():
            if line.startswith("T = "):
                return line.split()[2]
    return "?"


def run(name: str, out: Path, small: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k != "BAM_PPL_SMALL"}
    env.update(MPLBACKEND="Agg", BAM_PPL_OUTPUT=str(out))
    if small:
        env["BAM_PPL_SMALL"] = "1"
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        result = subprocess.run([sys.executable, str(ROOT / "tutorials" / f"{name}.py")], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{name} failed (exit {result.returncode}); see {out / (name + '.log')}")
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=TUTORIALS, default=list(TUTORIALS))
    parser.add_argument("--small", action="store_true", help="the tutorials' small (CI) settings")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "_output" / "real_data")
    parser.add_argument("--tables-only", action="store_true", help="only print the tables of an earlier run")
    args = parser.parse_args(argv)
    out = args.output / ("small" if args.small else "full")
    out.mkdir(parents=True, exist_ok=True)
    import platform

    print(f"## Real-data evidence comparisons ({'small' if args.small else 'full'} settings)\n")
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"Python {platform.python_version()}.\n")
    for name in args.only:
        seconds = None if args.tables_only else run(name, out, args.small)
        print(f"### {name}" + ("" if seconds is None else f" ({seconds:.0f} s)") + "\n")
        print(TABLES[name](out) + "\n", flush=True)


if __name__ == "__main__":
    main()
