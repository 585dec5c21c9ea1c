"""The BAM papers' real-data evidence comparisons at full size, one CSV row per estimate.

* ``abalone``: Abalone, complete graph (exact) against CP(R), a = 1 and 0.001 (Cemgil,
  Kurutmaz, Yıldırım, Barsbey & Şimşekli 2019, "Bayesian allocation model: inference by
  sequential Monte Carlo for nonnegative tensor factorizations and topic models using Pólya
  urns", §5.2), and p(age | r) of the best allocation of CP(3), a = 1 (its Fig. 13);
* ``letters``: NMF against symmetric NMF on 2000 sampled letter bigrams, a = 1 and 0.001 (same
  paper, §5.3);
* ``icews``: CP ranks against Tucker ranks (r, r, q) on the ICEWS 2017 threshold-0.9 tensor
  (Yıldırım, Kurutmaz, Barsbey, Şimşekli & Cemgil 2021, "Bayesian allocation model: marginal
  likelihood-based model selection for count tensors").

The data and models are those of the tutorials ``tutorials/abalone_structures.py``,
``letter_bigrams.py`` and ``icews_ranks.py``; the rank-confusion experiment has its own script
(``benchmarks/rank_confusion.py``). Every estimate is ``bam.log_evidence(model, X)`` with the
default ``method="auto"`` (options with ``--num-particles`` etc.), next to the VB bound of the
same model. Each row is appended to ``<output>/<experiment>.csv`` as soon as it is measured
(estimate, stderr, sure lower bound, per-run values, temperatures, wall and CPU seconds, load
average), so a run cut off early keeps its numbers, and a second call skips the rows already
there. The ranks/orders default to a grid (``--ranks`` to change it): the full 1..30 / 1..50
takes many hours on a 2-core machine.

Usage::

    python benchmarks/real_data_evidence.py abalone --a 1
    python benchmarks/real_data_evidence.py abalone --a 1 --binning quantile   # equal-frequency bins
    python benchmarks/real_data_evidence.py letters --ranks 1 2 3 4 5 6 8 10
    python benchmarks/real_data_evidence.py icews
    python benchmarks/real_data_evidence.py abalone --summary       # markdown tables of the rows
    python benchmarks/real_data_evidence.py icews --small           # tiny settings: checks the script
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import bam_ppl as bam

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "benchmarks" / "_output" / "real_data"
RANK_GRIDS = {
    "abalone": [1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30],
    "letters": [1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 40, 50],
    "icews": [1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 25],
}
A_VALUES = {"abalone": [1.0, 0.001], "letters": [1.0, 0.001], "icews": [1.0]}
ICEWS_TUCKER = [(r, r, q) for r in (2, 3, 4, 6) for q in (1, 2, 4)]
PROFILE_RANK = 3  # Fig. 13 of Cemgil et al. 2019


def cpu_seconds() -> float:
    """CPU time of this process, all threads (the numba kernel runs two)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------- data and models

def abalone_data(small: bool, binning: str = "kmeans"):
    """The 7 discretised measurements (CountTensor) and the 8-axis tensor with age, for p(age | r);
    ``binning`` as ``load_abalone``'s ("quantile": a cut of the same records no default was chosen on)."""
    from bam_ppl.data import CountTensor
    from bam_ppl.datasets import load_abalone

    X8 = load_abalone(bins=5, binning=binning, include_age=True, num_records=300 if small else None, rng_key=0)
    X = CountTensor(X8.indices[:, :7], X8.counts, X8.shape[:7], dims=X8.dims[:7],
                    coords={d: X8.coords[d] for d in X8.dims[:7]})
    return X, X8


def abalone_models(a: float, ranks):
    yield "CG", bam.models.complete_graph(7, a=a)
    for R in ranks:
        yield f"CP({R})", bam.models.independence(7, a=a) if R == 1 else bam.models.cp(R, order=7, a=a)


def letters_models(a: float, ranks):
    for K in ranks:
        yield f"NMF({K})", bam.models.nmf(K, a=a)
        yield f"sNMF({K})", bam.models.symmetric_nmf(K, a=a)


def icews_models(a: float, ranks, small: bool):
    for R in ranks:
        yield f"CP({R})", bam.models.cp(R, a=a)
    for shape in ([(2, 2, 1)] if small else ICEWS_TUCKER):
        yield f"Tucker{shape}", bam.models.tucker(shape, a=a)


def experiment_data(name: str, small: bool, binning: str = "kmeans"):
    from bam_ppl.datasets import load_icews, load_letter_bigrams

    if name == "abalone":
        return abalone_data(small, binning)[0]
    if name == "letters":
        return load_letter_bigrams(total=400 if small else 2000, rng_key=0)
    return load_icews(threshold=0.99 if small else 0.9)


def experiment_models(name: str, a: float, ranks, small: bool):
    if name == "abalone":
        return abalone_models(a, ranks)
    if name == "letters":
        return letters_models(a, ranks)
    return icews_models(a, ranks, small)


def experiment_model(name: str, model_name: str, a: float = 1.0):
    """One model of an experiment at full size, named as in its rows ("NMF(4)", "Tucker(4, 4, 1)"),
    and the experiment's data: ``(model, X)``."""
    rank = int(re.findall(r"\d+", model_name)[0])
    models = dict(experiment_models(name, a, [rank], small=False))
    if model_name not in models:
        raise ValueError(f"model: one of {sorted(models)}, got {model_name!r}")
    return models[model_name], experiment_data(name, small=False)


# ---------------------------------------------------------------------------- measuring

def estimate_row(model, X, key: int, options: dict, with_vb: bool) -> dict:
    """The default evidence of ``model`` on ``X`` (and its VB bound), with timings."""
    start, cpu = time.perf_counter(), cpu_seconds()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        est = bam.log_evidence(model, X, rng_key=key, **options)
    row = dict(method=est.method, log_evidence=est.value, stderr=est.stderr,
               lower_bound=est.details.get("lower_bound", np.nan),
               runs=" ".join(f"{v:.2f}" for v in est.details.get("run_log_evidence", [])),
               temperatures=" ".join(map(str, est.details.get("num_temperatures", []))),
               seconds=time.perf_counter() - start, cpu_seconds=cpu_seconds() - cpu, load=os.getloadavg()[0],
               cross_method=est.details.get("cross_check", {}).get("method", ""),
               cross_value=est.details.get("cross_check", {}).get("value", np.nan),
               cross_stderr=est.details.get("cross_check", {}).get("stderr", np.nan),
               vb_bound=np.nan, vb_cpu_seconds=np.nan)  # every row has the same columns (one CSV)
    if with_vb and est.kind != "exact":
        vb_cpu = cpu_seconds()
        row.update(vb_bound=bam.log_evidence(model, X, method="vb", rng_key=key).value,
                   vb_cpu_seconds=cpu_seconds() - vb_cpu)
    return row


def output_name(name: str, args) -> str:
    """The name of an experiment's CSV: the data's variant (Abalone's binning, the small settings) included."""
    return name + ("_quantile" if args.binning == "quantile" else "") + ("_small" if args.small else "")


def measure(name: str, args) -> None:
    X = experiment_data(name, args.small, args.binning)
    output = args.output / f"{output_name(name, args)}.csv"
    output.parent.mkdir(parents=True, exist_ok=True)
    done = set(map(tuple, pd.read_csv(output)[["a", "model"]].astype(str).to_numpy().tolist())) \
        if output.exists() else set()
    print(f"{name}: T = {int(np.sum(X.counts))} tokens in {len(X.counts)} nonzero cells of {X.shape}", flush=True)
    for a in args.a or A_VALUES[name]:
        for key, (model_name, model) in enumerate(experiment_models(name, a, args.ranks, args.small)):
            if (str(a), model_name) in done:
                continue
            row = dict(a=a, model=model_name, tokens=int(np.sum(X.counts)), cells=len(X.counts),
                       **estimate_row(model, X, key + 1, tempered_options(args), not args.no_vb))
            pd.DataFrame([row]).to_csv(output, mode="a", header=not output.exists(), index=False)
            print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)


def tempered_options(args) -> dict:
    options = {"num_particles": args.num_particles, "num_chains": args.num_runs, "rho": args.rho,
               "num_sweeps": args.num_sweeps}
    if args.small:
        options = {"num_particles": 64, "num_chains": 2, **{k: v for k, v in options.items() if v is not None}}
    return {k: v for k, v in options.items() if v is not None}


def age_profile(args) -> pd.DataFrame:
    """p(age | r) in the best allocation that the tempered SMC visits for CP(3), a = 1 (Fig. 13).

    Each animal of an observed 7-cell is equally likely to be any of the cell's tokens, so
    p(age | r) ∝ Σ_cells n(cell, r) · (share of the cell's animals with that age).
    """
    from bam_ppl.infer.smc.tempered import run_tempered

    X, X8 = abalone_data(args.small, args.binning)
    model = bam.models.cp(PROFILE_RANK, order=7, a=1.0)
    result = run_tempered(model, X, rng_key=7, **tempered_options(args))
    nodes = model.bind(X).nodes
    cell_key = {tuple(c): u for u, c in enumerate(X.indices)}
    ages = np.zeros((len(X.counts), X8.shape[7]))
    for idx, count in zip(X8.indices, X8.counts):
        ages[cell_key[tuple(idx[:7])], idx[7]] += count
    ages /= ages.sum(axis=1, keepdims=True)
    joint = np.zeros((PROFILE_RANK, X8.shape[7]))
    visible = [nodes.index(f"i{n + 1}") for n in range(7)]
    for cell, count in zip(result.best_cells, result.best_counts):
        joint[cell[nodes.index("r")]] += count * ages[cell_key[tuple(cell[visible])]]
    rings = np.arange(1, X8.shape[7] + 1)
    profile = pd.DataFrame(joint / joint.sum(axis=1, keepdims=True), columns=rings)
    profile.insert(0, "animals", joint.sum(axis=1))
    profile.insert(1, "mean_rings", (joint @ rings) / joint.sum(axis=1))
    profile.attrs["lower_bound"] = result.lower_bound
    return profile.sort_values("mean_rings")


# ---------------------------------------------------------------------------- tables

def markdown(df: pd.DataFrame) -> str:
    """A DataFrame (its index dropped) as a GitHub markdown table."""
    cells = [[str(c) for c in df.columns]] + [[_fmt(v) for v in row] for row in df.itertuples(index=False)]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("---" for _ in df.columns) + "|")
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, (float, np.floating)):
        return "" if np.isnan(value) else f"{value:.2f}"
    return str(value)


def summary(name: str, args) -> str:
    rows = pd.read_csv(args.output / f"{output_name(name, args)}.csv")
    parts = []
    for a, group in rows.groupby("a", sort=False):
        group = group.assign(
            below=group["log_evidence"] < group["lower_bound"] - 3 * group["stderr"].fillna(0),
            below_vb=group["log_evidence"] < group.get("vb_bound", np.nan))
        best = group.loc[group["log_evidence"].idxmax(), "model"]
        shown = group[["model", "method", "log_evidence", "stderr", "lower_bound"]
                      + (["vb_bound"] if "vb_bound" in group else []) + ["below", "below_vb", "cpu_seconds"]]
        parts.append(f"**{name}, a = {a:g}** (T = {group['tokens'].iloc[0]}, {group['cells'].iloc[0]} nonzero "
                     f"cells; best estimate {best})\n\n" + markdown(shown))
    return "\n\n".join(parts)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=("abalone", "letters", "icews", "age"))
    parser.add_argument("--a", type=float, nargs="+", help="prior strengths (default: the paper's)")
    parser.add_argument("--ranks", type=int, nargs="+", help="ranks / orders (default: a grid)")
    parser.add_argument("--num-particles", type=int)
    parser.add_argument("--num-runs", type=int)
    parser.add_argument("--rho", type=float)
    parser.add_argument("--num-sweeps", type=int)
    parser.add_argument("--no-vb", action="store_true", help="skip the VB bound of each model")
    parser.add_argument("--small", action="store_true", help="tiny data and ranks: checks the script")
    parser.add_argument("--binning", choices=("kmeans", "quantile"), default="kmeans",
                        help="abalone: the measurements cut by the paper's k-means or at their quantiles")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--summary", action="store_true", help="only print the tables of the rows so far")
    args = parser.parse_args(argv)
    if args.ranks is None:
        args.ranks = [1, 2, 3] if args.small else RANK_GRIDS.get(args.experiment)
    return args


def main(argv=None) -> None:
    args = parse(argv)
    if args.experiment == "age":
        profile = age_profile(args)
        print(f"CP({PROFILE_RANK}), a = 1, best allocation log p(X, S) = {profile.attrs['lower_bound']:.2f}")
        print(markdown(profile.round(3)))
        return
    if not args.summary:
        measure(args.experiment, args)
    print(summary(args.experiment, args))


if __name__ == "__main__":
    main()
