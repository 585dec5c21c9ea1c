"""Model-size selection by speckled held-out likelihood (papers/003 §3), for any model family.

A random "speckled" set of slices of the data (for the Dirichlet Tucker decomposition, whole
(m, n) faces) is held out once; every model of a grid of sizes is fitted to the rest and scored
on the held-out part. Holding out scattered slices rather than whole rows keeps every row and
column in the fit, so their loadings can still be estimated (§3).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .data import as_count_tensor
from .types import KeyLike, as_key, numpy_generator
from .validation import check_positive

SCORE_COLUMN = "heldout_loglik"


def speckled_mask(shape: Sequence[int], fraction: float, rng_key: KeyLike = 0) -> np.ndarray:
    """A boolean mask of ``shape`` (True = held out) holding out about ``fraction`` of the entries.

    ``round(fraction × size)`` entries (at least one) are drawn uniformly without replacement;
    then every index along every axis that lost all its entries gets one of them back, so no row
    or column is left without data. The same key gives the same mask.
    """
    shape = tuple(int(s) for s in shape)
    check_positive(fraction, "heldout_fraction", upper=1.0)
    if fraction >= 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {fraction}")
    size = int(np.prod(shape))
    if size < 2:
        raise ValueError(f"cannot hold out part of {size} slice(s); the held-out axes need at least 2 entries")
    rng = numpy_generator(rng_key)
    count = min(max(1, int(round(fraction * size))), size - 1)
    mask = np.zeros(size, dtype=bool)
    mask[rng.choice(size, count, replace=False)] = True
    mask = mask.reshape(shape)
    for axis in range(len(shape)):
        moved = np.moveaxis(mask, axis, 0).reshape(shape[axis], -1)
        for index in np.flatnonzero(moved.all(axis=1)):
            restore = rng.integers(moved.shape[1])
            moved[index, restore] = False
        mask = np.moveaxis(moved.reshape(np.moveaxis(mask, axis, 0).shape), 0, axis)
    return mask


def heldout_log_likelihood(model, X, heldout: np.ndarray, *, rng_key: KeyLike = 0, method: str | None = None,
                           **fit_options) -> np.ndarray | float:
    """Fit ``model`` without the ``heldout`` slices and return their log-likelihood.

    Works with any backend that accepts ``heldout=`` and reports
    ``sample_stats["heldout_log_likelihood"]`` per chain, such as the Dirichlet Tucker ``"map"``
    and ``"sem"`` backends. Where the backend also reports
    ``pointwise_heldout_log_likelihood`` (chain, slice), the per-slice values (averaged over
    chains) are returned, which lets :func:`select_ranks` compare models slice by slice.
    """
    from .convert import group
    from .infer.registry import infer

    idata = infer(model, X, method=method, rng_key=rng_key, heldout=heldout, **fit_options)
    stats = group(idata, "sample_stats")
    if "pointwise_heldout_log_likelihood" in stats:
        return np.asarray(stats["pointwise_heldout_log_likelihood"].values).mean(axis=0)
    if "heldout_log_likelihood" not in stats:
        raise ValueError(
            f"method {method or model.default_method!r} reports no heldout_log_likelihood; pass "
            "score= (a callable) or a method that supports heldout="
        )
    return float(np.mean(stats["heldout_log_likelihood"].values))


def _mark_selection(table, pointwise, names) -> None:
    """Add ``heldout_loglik_se`` and ``selected`` (the one-standard-error rule) to ``table``.

    With per-slice scores, the standard error of the paired difference to the best row is
    sqrt(n) · sd(per-slice differences); the selected row is the smallest model (least sum of
    the swept sizes, then grid order) whose score is within one such standard error of the best.
    Larger models nest smaller ones, so beyond the true size the held-out score flattens rather
    than falls; the rule picks the size the data actually support. Without per-slice scores the
    best row is selected.
    """
    scores = table[SCORE_COLUMN].to_numpy()
    best = int(np.argmax(scores))
    if any(p is None for p in pointwise) or len({p.shape for p in pointwise}) != 1:
        table["selected"] = np.arange(len(table)) == best
        return
    diffs = np.stack(pointwise) - pointwise[best]
    se = np.sqrt(diffs.shape[1]) * diffs.std(axis=1, ddof=1) if diffs.shape[1] > 1 else np.zeros(len(table))
    table["heldout_loglik_se"] = se
    within = scores >= scores[best] - se
    size = table[names].sum(axis=1).to_numpy(dtype=float)
    order = np.lexsort((np.arange(len(table)), size))
    chosen = next(i for i in order if within[i])
    table["selected"] = np.arange(len(table)) == chosen


def _check_grid(grid, fixed) -> tuple[dict, dict]:
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError("grid must be a non-empty dict of name -> list of values, e.g. {'K_M': [2, 3, 4]}")
    grid = dict(grid)
    for name, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | np.ndarray) or len(values) == 0:
            raise ValueError(f"grid[{name!r}] must be a non-empty list of values, got {values!r}")
    fixed = dict(fixed or {})
    if not isinstance(fixed, Mapping):
        raise TypeError(f"fixed must be a dict of name -> value, got {type(fixed).__name__}")
    both = sorted(set(grid) & set(fixed))
    if both:
        raise ValueError(f"{both} appear in both grid and fixed; give each size in one of them")
    return {k: list(v) for k, v in grid.items()}, fixed


def _heldout_axes(model, heldout_axes) -> tuple[int, ...]:
    observed = tuple(getattr(model, "observed", ()))
    if heldout_axes is not None:
        axes = (heldout_axes,) if isinstance(heldout_axes, int | np.integer | str) else tuple(heldout_axes)
        unknown = [a for a in axes if isinstance(a, str) and a not in observed]
        if unknown:
            raise ValueError(f"heldout_axes names {unknown}, which are not visible nodes {list(observed)}")
        return tuple(observed.index(a) if isinstance(a, str) else int(a) for a in axes)
    conditioned = getattr(model, "condition_on", ())
    if not conditioned:
        raise ValueError(
            "heldout_axes is required for a model that conditions on no totals: the data axes whose "
            "slices are held out (e.g. (0, 1) for (m, n) faces)"
        )
    return tuple(observed.index(n) for n in conditioned)


def select_ranks(model_factory: Callable, X, grid: Mapping, fixed: Mapping | None = None,
                 heldout_fraction: float = 0.1, rng_key: KeyLike = 0, score: Callable | None = None, *,
                 heldout_axes=None, method: str | None = None, fit_options: Mapping | None = None,
                 **model_kwargs):
    """Sweep a grid of model sizes and score each by its speckled held-out likelihood (papers/003 §3).

    Parameters
    ----------
    model_factory : callable
        Builds a model from keyword sizes, ``model_factory(**point, **fixed, **model_kwargs)``,
        e.g. :func:`bam_ppl.models.dirichlet_tucker` with ``K_M, K_N, K_P, K_S``.
    X : array-like or CountTensor
        The data.
    grid : dict
        Name -> list of values; every combination (Cartesian product) is fitted.
    fixed : dict, optional
        Sizes kept fixed for every grid point.
    heldout_fraction : float
        Fraction of the slices along ``heldout_axes`` held out (one random mask shared by all
        grid points, so that their scores are comparable).
    rng_key : int or JAX key
        Draws the mask and seeds every fit (the same fit key for every grid point).
    score : callable, optional
        ``score(model, X, heldout, rng_key)`` returning a number or a 1-d array of per-slice
        values (summed for the table), higher is better. Default: the held-out log-likelihood of
        the fit by ``method`` (:func:`heldout_log_likelihood`), which for the Dirichlet Tucker
        model is eq. 2's multinomial log-likelihood of each held-out face.
    heldout_axes : int, str or tuple of them, optional
        Data axes whose slices are held out, as positions in the model's ``observed`` order or
        as node names; default the model's conditioned axes (the (m, n) faces for the Dirichlet
        Tucker model).
    method : str, optional
        Backend of the default score (default: the model's ``default_method``).
    fit_options : dict, optional
        Options of that backend (``num_iters``, ``num_restarts`` ...).
    **model_kwargs
        Passed to ``model_factory`` (e.g. ``alpha``).

    Returns
    -------
    pandas.DataFrame
        One row per grid point, in grid order: the grid and fixed sizes, ``heldout_loglik``,
        with per-slice scores ``heldout_loglik_se`` (standard error of the paired difference to
        the best row), and ``selected``, the smallest model within one standard error of the
        best (the best row without per-slice scores). ``table.attrs`` holds ``grid`` (the swept
        names), ``fixed`` and the ``heldout`` mask.
    """
    import pandas as pd

    grid, fixed = _check_grid(grid, fixed)
    check_positive(heldout_fraction, "heldout_fraction", upper=1.0)
    if score is not None and not callable(score):
        raise TypeError(f"score must be a callable score(model, X, heldout, rng_key), got {type(score).__name__}")
    if score is not None and (method is not None or fit_options):
        raise ValueError("method and fit_options configure the default score; a custom score fits by itself")
    fit_options = dict(fit_options or {})
    key = as_key(rng_key)
    import jax

    mask_key, fit_key = jax.random.split(key)
    names = list(grid)
    points = [dict(zip(names, values)) for values in itertools.product(*grid.values())]
    models = [model_factory(**point, **fixed, **model_kwargs) for point in points]
    data = models[0].as_data(X) if hasattr(models[0], "as_data") else as_count_tensor(X)
    axes = _heldout_axes(models[0], heldout_axes)
    if any(a < 0 or a >= data.ndim for a in axes) or len(set(axes)) != len(axes):
        raise ValueError(f"heldout_axes must be distinct axes of the {data.ndim}-way data, got {axes}")
    heldout = speckled_mask(tuple(data.shape[a] for a in axes), heldout_fraction, mask_key)
    if score is None:
        def score(model, X, heldout, rng_key):
            return heldout_log_likelihood(model, X, heldout, rng_key=rng_key, method=method, **fit_options)
    rows, pointwise = [], []
    for point, model in zip(points, models):
        value = np.asarray(score(model, data, heldout, fit_key), dtype=np.float64)
        if value.ndim > 1:
            raise ValueError(f"score must return a number or a 1-d array of per-slice values, got shape {value.shape}")
        pointwise.append(value if value.ndim == 1 else None)
        rows.append({**point, **fixed, SCORE_COLUMN: float(value.sum())})
    table = pd.DataFrame(rows, columns=[*names, *fixed, SCORE_COLUMN])
    _mark_selection(table, pointwise, names)
    table.attrs.update(grid=names, fixed=fixed, heldout=heldout, heldout_axes=axes)
    return table


def plot_rank_selection(table, ax=None):
    """Profile plot of a :func:`select_ranks` table: for each swept size, the best held-out
    log-likelihood over the other sizes, with the selected grid point marked.

    Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    if SCORE_COLUMN not in getattr(table, "columns", ()):
        raise ValueError(f"table must be a select_ranks result with a {SCORE_COLUMN!r} column")
    names = list(table.attrs.get("grid") or [c for c in table.columns if c != SCORE_COLUMN])
    if ax is None:
        fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.0), squeeze=False)
        axes = axes[0]
    else:
        axes = np.atleast_1d(ax)
        if axes.size != len(names):
            raise ValueError(f"ax must hold {len(names)} axes (one per swept size {names})")
        fig = axes[0].figure
    best = table.loc[table["selected"].idxmax()] if "selected" in table else table.loc[table[SCORE_COLUMN].idxmax()]
    for axis, name in zip(axes, names):
        profile = table.groupby(name)[SCORE_COLUMN].max()
        axis.plot(profile.index, profile.to_numpy(), marker="o")
        axis.axvline(best[name], color="C3", linestyle="--", label=f"selected {name} = {best[name]}")
        axis.set_xlabel(name)
        axis.set_ylabel("held-out log-likelihood")
        axis.legend(fontsize="small")
    fig.tight_layout()
    return fig
