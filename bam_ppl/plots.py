"""Plots of evidence tables (papers/000 Figs. 9–10: log evidence against model order)."""

from __future__ import annotations

import re

import numpy as np

_TRAILING_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)\s*$")


def _orders(names) -> np.ndarray | None:
    """The trailing number of every model name ("R=3" -> 3), or None if some name has none."""
    values = []
    for name in names:
        match = _TRAILING_NUMBER.search(str(name))
        if match is None:
            return None
        values.append(float(match.group(1)))
    return np.asarray(values)


def plot_evidence(table, x=None, ax=None, label: str | None = None, errorbars: float = 2.0,
                  xlabel: str | None = None, **plot_kwargs):
    """Log evidence of each model against its order (rank), from a :func:`bam_ppl.compare` table.

    Parameters
    ----------
    table : pandas.DataFrame
        Output of :func:`bam_ppl.compare` (index: model names; columns ``log_evidence``,
        ``stderr``, ``kind``).
    x : sequence or dict, optional
        Horizontal position of each model (a dict name -> value, or values in table order).
        Default: the number at the end of each model name ("R=3" -> 3), else positions 0, 1, ...
    ax : matplotlib Axes, optional
    label : str, optional
        Legend label of the curve (default: the estimator, e.g. "smc (estimate)").
    errorbars : float
        Half-width of the error bars in standard errors (0 hides them).
    xlabel : str, optional
    **plot_kwargs
        Passed to ``Axes.errorbar`` (marker, color, ...).

    Returns
    -------
    matplotlib Axes
    """
    import matplotlib.pyplot as plt
    import pandas as pd

    if not isinstance(table, pd.DataFrame) or "log_evidence" not in table.columns:
        raise TypeError("table must be the DataFrame returned by bam_ppl.compare (a log_evidence column)")
    if table.empty:
        raise ValueError("table has no rows to plot")
    if errorbars < 0:
        raise ValueError(f"errorbars must be >= 0 standard errors, got {errorbars}")
    names = list(table.index)
    if x is None:
        positions = _orders(names)
        if positions is None:
            positions = np.arange(len(names), dtype=float)
    elif isinstance(x, dict):
        missing = [n for n in names if n not in x]
        if missing:
            raise ValueError(f"x has no position for model(s) {missing}")
        positions = np.asarray([x[n] for n in names], dtype=float)
    else:
        positions = np.asarray(x, dtype=float)
        if positions.shape != (len(names),):
            raise ValueError(f"x must give one position per model ({len(names)}), got shape {positions.shape}")
    order = np.argsort(positions, kind="stable")
    values = table["log_evidence"].to_numpy(dtype=float)[order]
    stderr = table["stderr"].to_numpy(dtype=float)[order] if "stderr" in table.columns else np.zeros(len(names))
    stderr = np.nan_to_num(stderr, nan=0.0)
    if label is None:
        methods = sorted(set(table.get("method", pd.Series(["evidence"])).astype(str)))
        kinds = sorted(set(table.get("kind", pd.Series([""])).astype(str)) - {""})
        label = "/".join(methods) + (f" ({', '.join(kinds)})" if kinds else "")
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    plot_kwargs.setdefault("marker", "o")
    plot_kwargs.setdefault("capsize", 3)
    ax.errorbar(positions[order], values, yerr=errorbars * stderr if errorbars else None, label=label,
                **plot_kwargs)
    best = int(np.argmax(values))
    ax.plot(positions[order][best], values[best], marker="*", markersize=12, color="k", linestyle="none")
    ax.set_xlabel(xlabel or "model order")
    ax.set_ylabel("log evidence (nats)")
    ax.legend()
    return ax
