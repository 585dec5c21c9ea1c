"""Plots of evidence tables (Cemgil et al. 2019 Figs. 9–10: log evidence against model order)."""

from __future__ import annotations

import re
from typing import NamedTuple

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


def _order_name(names) -> str:
    """What a family's names count: the text before "=<number>" shared by all ("r=1", "r=2" -> "r"), else
    "model order"."""
    stems = {_TRAILING_NUMBER.sub("", str(name)).rstrip() for name in names}
    stem = stems.pop() if len(stems) == 1 else ""
    return stem[:-1].strip() if stem.endswith("=") and stem[:-1].strip() else "model order"


def _check_table(table, errorbars) -> None:
    """TypeError/ValueError unless ``table`` is a non-empty :func:`bam_ppl.compare` table and ``errorbars`` >= 0."""
    import pandas as pd

    if not isinstance(table, pd.DataFrame) or "log_evidence" not in table.columns:
        raise TypeError("table must be the DataFrame returned by bam_ppl.compare (a log_evidence column)")
    if table.empty:
        raise ValueError("table has no rows to plot")
    if errorbars < 0:
        raise ValueError(f"errorbars must be >= 0 standard errors, got {errorbars}")


def _standard_errors(table) -> np.ndarray:
    """The ``se`` column (``stderr`` in tables saved before it was named as in arviz.compare), nan as 0."""
    column = next((c for c in ("se", "stderr") if c in table.columns), None)
    return np.nan_to_num(table[column].to_numpy(dtype=float)) if column else np.zeros(len(table))


def plot_evidence(table, x=None, ax=None, label: str | None = None, errorbars: float = 2.0,
                  xlabel: str | None = None, **plot_kwargs):
    """Log evidence of each model, from a :func:`bam_ppl.compare` table.

    When every model name ends in a number ("R=3", "nmf 4") the models are a family ordered by
    that number: the horizontal axis is the order and one line joins them. Otherwise (names
    such as "independence", "CP(R=2)") the models are unrelated: the axis is labelled with the
    names, in table order, and no line joins the points.

    The kind of each number is drawn differently: an estimate (``kind="estimate"``) is a filled
    marker with ± ``errorbars`` standard errors; an exact value a filled square without error
    bar; a lower bound (``kind="lower_bound"``, e.g. a VB ELBO) an open triangle with an upward
    arrow, since the log evidence lies somewhere above it; an upper bound (``kind="upper_bound"``,
    :func:`bam_ppl.evidence_upper_bound`) an open triangle pointing down with a downward arrow.

    Parameters
    ----------
    table : pandas.DataFrame
        Output of :func:`bam_ppl.compare` (index: model names; columns ``log_evidence``,
        ``se``, ``kind``; a table saved with the older ``stderr`` column reads too).
    x : sequence or dict, optional
        Horizontal position of each model (a dict name -> value, or values in table order).
        Default: the number at the end of each model name ("R=3" -> 3) when every name has one,
        else categorical positions labelled with the names.
    ax : matplotlib Axes, optional
    label : str, optional
        Legend label of the line joining the models (default: the estimator, e.g. "smc").
    errorbars : float
        Half-width of the error bars in standard errors (0 hides them).
    xlabel : str, optional
        Default: the name before "=" where every model is named "<name>=<number>" ("r=3" -> "r"), else
        "model order" (or "model" for unrelated models).
    **plot_kwargs
        Passed to the line and markers (color, markersize, ...).

    Returns
    -------
    matplotlib Axes
    """
    import matplotlib.pyplot as plt

    _check_table(table, errorbars)
    names = [str(n) for n in table.index]
    positions, categorical = _positions(table, x, names)
    order = np.argsort(positions, kind="stable")
    points = _points(table, positions, order)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(names)) if categorical else 5.0, 3.5))
    color, markersize = _line_style(ax, plot_kwargs)
    if not categorical:
        ax.plot(points.pos, points.values, color=color, label=_methods(table) if label is None else label,
                **plot_kwargs)
    arrow = _arrow_length(points)
    for kind in dict.fromkeys(points.kinds):
        text = _kind_label(kind, errorbars)
        if categorical and label is not None:
            text = f"{label}: {text}"
        shown = categorical or len(set(points.kinds)) > 1 or kind != "estimate"
        _draw_kind(ax, points, kind, errorbars * points.stderr, arrow,
                   dict(color=color, linestyle="none", markersize=markersize, label=text if shown else None,
                        **_STYLE.get(kind, _STYLE["estimate"])))
    _label_axes(ax, points, names, order, categorical, xlabel)
    return ax


class _Points(NamedTuple):
    """The models in the order of their positions: position, log evidence, standard error and kind."""

    pos: np.ndarray
    values: np.ndarray
    stderr: np.ndarray
    kinds: np.ndarray


# The marker of each kind of value: filled where the value is the point, open where it bounds it.
_STYLE = {
    "estimate": dict(marker="o", fillstyle="full"),
    "exact": dict(marker="s", fillstyle="full"),
    "lower_bound": dict(marker="^", fillstyle="none"),
    "upper_bound": dict(marker="v", fillstyle="none"),
}


def _points(table, positions: np.ndarray, order: np.ndarray) -> _Points:
    """The table's models at ``positions``, in the order ``order``; a table without ``kind`` holds estimates."""
    kinds = table["kind"].astype(str).to_numpy() if "kind" in table.columns else np.full(len(table), "estimate")
    return _Points(positions[order], table["log_evidence"].to_numpy(dtype=float)[order],
                   _standard_errors(table)[order], kinds[order])


def _methods(table) -> str:
    """The line's default legend label: the estimators of the table ("auto", "smc/vb"), else "evidence"."""
    return "/".join(sorted(set(table["method"].astype(str)))) if "method" in table.columns else "evidence"


def _kind_label(kind: str, errorbars: float) -> str:
    """The legend's name of a kind of value."""
    labels = {"estimate": "estimate" + (f" ± {errorbars:g} se" if errorbars else ""), "exact": "exact",
              "lower_bound": "lower bound (value lies above)", "upper_bound": "upper bound (value lies below)"}
    return labels.get(kind, kind)


def _positions(table, x, names) -> tuple[np.ndarray, bool]:
    """Each model's horizontal position (``plot_evidence``'s ``x``) and whether the axis is categorical."""
    if x is None:
        positions = _orders(names)
        if positions is None or len(set(positions)) != len(positions):
            return np.arange(len(names), dtype=float), True
        return positions, False
    if isinstance(x, dict):
        missing = [n for n in table.index if n not in x]
        if missing:
            raise ValueError(f"x has no position for model(s) {missing}")
        return np.asarray([x[n] for n in table.index], dtype=float), False
    positions = np.asarray(x, dtype=float)
    if positions.shape != (len(names),):
        raise ValueError(f"x must give one position per model ({len(names)}), got shape {positions.shape}")
    return positions, False


def _line_style(ax, plot_kwargs: dict) -> tuple:
    """The colour given (``color`` or ``c``), else the next of the axes' cycle, and the marker size (``markersize``
    or ``ms``, default 7), taken out of ``plot_kwargs`` with the marker and capsize that each kind sets itself."""
    color = plot_kwargs.pop("color", None) or plot_kwargs.pop("c", None)
    if color is None:
        (probe,) = ax.plot([], [])
        color = probe.get_color()
        probe.remove()
    markersize = plot_kwargs.pop("markersize", plot_kwargs.pop("ms", 7))
    plot_kwargs.pop("marker", None)
    plot_kwargs.pop("capsize", None)
    return color, markersize


def _arrow_length(points: _Points) -> float:
    """A bound's arrow: at least a nat, and longer than the error bars and a twelfth of the span, so that it reads
    as an arrow."""
    finite = points.values[np.isfinite(points.values)]
    span = float(np.ptp(finite)) if finite.size > 1 else 0.0
    return max(span * 0.08, 2.0 * float(points.stderr.max()), 1.0)


def _draw_kind(ax, points: _Points, kind: str, halfwidth: np.ndarray, arrow: float, common: dict) -> None:
    """The models of one kind: a bound with an arrow towards the value, an estimate with error bars of
    ``halfwidth``."""
    rows = points.kinds == kind
    pos, values = points.pos[rows], points.values[rows]
    if kind == "lower_bound":
        ax.errorbar(pos, values, yerr=np.full(rows.sum(), arrow), lolims=True, capsize=0, **common)
    elif kind == "upper_bound":
        ax.errorbar(pos, values, yerr=np.full(rows.sum(), arrow), uplims=True, capsize=0, **common)
    elif kind == "estimate" and np.any(halfwidth[rows] > 0):
        ax.errorbar(pos, values, yerr=halfwidth[rows], capsize=3, **common)
    else:
        ax.plot(pos, values, **common)


def _label_axes(ax, points: _Points, names: list, order: np.ndarray, categorical: bool, xlabel) -> None:
    """The star at the largest value, the ticks (the names, or whole numbers for ranks), labels and legend."""
    from matplotlib.ticker import MaxNLocator

    pos, values = points.pos, points.values
    if np.isfinite(values).any():
        best = int(np.nanargmax(np.where(np.isfinite(values), values, -np.inf)))
        ax.plot(pos[best], values[best], marker="*", markersize=12, color="k", linestyle="none", label="largest")
    if categorical:
        long_names = max(map(len, names)) > 6
        ax.set_xticks(pos)
        ax.set_xticklabels([names[i] for i in order], rotation=30 if long_names else 0,
                           ha="right" if long_names else "center")
        ax.set_xlim(pos.min() - 0.5, pos.max() + 0.5)
    elif np.all(pos == np.round(pos)):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel or ("model" if categorical else _order_name(names)))
    ax.set_ylabel("log evidence (nats)")
    ax.legend(fontsize="small")


def plot_compare(table, ax=None, errorbars: float = 1.0):
    """A :func:`bam_ppl.compare` table drawn as ``az.plot_compare`` draws one: a row per model, best on top.

    Each model's log evidence is a filled circle with ± ``errorbars`` ``se`` (a square for an exact
    value, open triangles for bounds: ^ the value lies to the right, v to the left); below every
    model but the best, a grey triangle at the same value with ± ``errorbars`` ``dse``, the standard
    error of its difference to the best; a dashed vertical line marks the best value. A model whose
    grey bar reaches the line is not distinguishable from the best at that many standard errors.

    Returns
    -------
    matplotlib Axes
    """
    import matplotlib.pyplot as plt

    _check_table(table, errorbars)
    ordered = table.sort_values("log_evidence", ascending=False, kind="stable")
    values = ordered["log_evidence"].to_numpy(dtype=float)
    se = _standard_errors(ordered)
    dse = np.nan_to_num(ordered["dse"].to_numpy(dtype=float)) if "dse" in ordered.columns else np.zeros(len(values))
    kinds = ordered["kind"].astype(str).to_numpy() if "kind" in ordered.columns else np.full(len(values), "estimate")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.0, 0.6 * len(values) + 1.2))
    rows = -np.arange(len(values), dtype=float)  # the best on top, as in az.plot_compare
    markers = {"exact": "s", "lower_bound": ">", "upper_bound": "<"}
    for kind in dict.fromkeys(kinds):
        at = kinds == kind
        ax.errorbar(values[at], rows[at], xerr=errorbars * se[at], fmt=markers.get(kind, "o"), color="k",
                    capsize=3, fillstyle="full" if kind in ("estimate", "exact") else "none",
                    label={"estimate": "log evidence", "exact": "exact"}.get(kind, kind.replace("_", " ")))
    if len(values) > 1:
        ax.errorbar(values[1:], rows[1:] - 0.3, xerr=errorbars * dse[1:], fmt="^", color="grey", capsize=3,
                    label="difference to the best (dse)")
    ax.axvline(values[0], color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(rows)
    ax.set_yticklabels([str(n) for n in ordered.index])
    ax.set_xlabel("log evidence (nats)")
    ax.legend(fontsize="small")
    return ax


#: Dimensions of the draws, never counted as panels.
_SAMPLE_DIMS = ("chain", "draw")


def plot_var_names(idata, max_panels: int = 8, group: str = "posterior") -> list[str]:
    """A few variables of ``idata`` whose plots fit on one figure, smallest first.

    ArviZ 1.x draws one panel per element of every variable, and a fitted allocation model has
    tens of table entries, so a default ``az.plot_trace(idata)`` or ``az.plot_dist(idata)``
    raises "Requested N subplots, which exceeds rcParams['plot.max_subplots']". This picks the
    variables with the fewest elements (the total rate, then the smallest tables) while the
    elements add up to at most ``max_panels`` (always at least one variable). Pass the result
    as ``var_names=`` to any ArviZ plot, e.g. ``az.plot_dist(idata,
    var_names=bam.plot_var_names(idata))`` (``az.plot_posterior`` on ArviZ 0.x), or use
    :func:`plot_trace`.
    """
    from .convert import group as get_group

    if int(max_panels) < 1:
        raise ValueError(f"max_panels must be >= 1, got {max_panels}")
    data = get_group(idata, group)
    sizes = []
    for position, (name, values) in enumerate(data.data_vars.items()):
        elements = int(np.prod([n for d, n in values.sizes.items() if d not in _SAMPLE_DIMS], dtype=np.int64))
        sizes.append((elements, position, str(name)))
    if not sizes:
        raise ValueError(f"idata.{group} holds no variables to plot")
    chosen, used = [], 0
    for elements, _, name in sorted(sizes):
        if chosen and used + elements > max_panels:
            break
        chosen.append(name)
        used += elements
    return chosen


def plot_trace(idata, var_names=None, max_panels: int = 8, **kwargs):
    """``az.plot_trace`` of a few variables (default :func:`plot_var_names`), on ArviZ 0.x and 1.x.

    ``var_names`` given, they are plotted as they are; ``**kwargs`` go to ``az.plot_trace``.
    Returns what ArviZ returns (axes on 0.x, a PlotCollection on 1.x).
    """
    from .convert import import_arviz

    az = import_arviz()
    if var_names is None:
        var_names = plot_var_names(idata, max_panels=max_panels)
    import warnings

    with warnings.catch_warnings():
        # ArviZ 0.23 with matplotlib >= 3.11: a deprecation inside ArviZ, once per panel.
        warnings.filterwarnings("ignore", message="Passing a dict or None as alias_mapping",
                                category=DeprecationWarning)
        return az.plot_trace(idata, var_names=list(np.atleast_1d(var_names)), **kwargs)
