"""Model-size selection by speckled held-out likelihood (Zhang & Linderman §3), for any model family.

Random "speckled" sets of slices of the data (for the Dirichlet Tucker decomposition, whole
(m, n) faces) are held out; every model of a grid of sizes is fitted to the rest and scored on
the held-out part. Holding out scattered slices rather than whole rows keeps every row and
column in the fit, so their loadings can still be estimated (§3). By default the slices are
split into speckled folds and every slice is held out once (cross-validation), so every model
is scored on all the data; the models are then compared slice by slice (paired differences).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .data import as_count_tensor
from .parallel import Task, check_executor, run_tasks, score_task
from .types import KeyLike, as_key, numpy_generator
from .validation import check_positive, renamed_options

SCORE_COLUMN = "heldout_loglik"


def speckled_mask(shape: Sequence[int], fraction: float, rng_key: KeyLike = 0) -> np.ndarray:
    """A boolean mask of ``shape`` (True = held out) holding out about ``fraction`` of the entries.

    ``round(fraction × size)`` entries (at least one) are drawn uniformly without replacement;
    then every index along every axis that lost all its entries gets one of them back, so no row
    or column is left without data (an index with a single entry along the other axes, as in a
    1-d mask, is exempt). The same key gives the same mask.
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
        if size // shape[axis] == 1:
            continue  # an index with a single entry cannot keep one (a 1-d mask holds out whole slices)
        moved = np.moveaxis(mask, axis, 0).reshape(shape[axis], -1)
        for index in np.flatnonzero(moved.all(axis=1)):
            restore = rng.integers(moved.shape[1])
            moved[index, restore] = False
        mask = np.moveaxis(moved.reshape(np.moveaxis(mask, axis, 0).shape), 0, axis)
    return mask


#: Number of speckled folds of :func:`select_ranks` when neither ``folds`` nor
#: ``heldout_fraction`` is given: every slice is scored once by a fit to the other four fifths.
#: A fit to a fraction (F − 1)/F of the data pays its extra parameters' estimation cost in
#: proportion to F/(F − 1) (1.5 at three folds, 1.25 at five), which holds back the larger of two
#: models; scikit-learn's default too (benchmarks/dtucker_ranks.py compares 3 and 5).
DEFAULT_FOLDS = 5
#: Rounds of repairs :func:`speckled_folds` tries before it gives up (each round fixes every
#: index left inside a single fold; a repair rarely breaks another index).
MAX_FOLD_REPAIRS = 100


def speckled_folds(shape: Sequence[int], folds: int, rng_key: KeyLike = 0) -> np.ndarray:
    """Split the entries of ``shape`` into ``folds`` speckled folds: an int array of fold numbers.

    The entries are dealt at random into folds of equal size (sizes differ by at most one).
    Holding out fold f (``assignment == f``) must leave every index along every axis some
    fitted entry, so no index may have all its entries in one fold: each such index swaps one
    of its entries with a random entry of another fold (which keeps the fold sizes), until none
    is left. An index with a single entry along the other axes (a 1-d shape, or an axis of a
    shape whose other sizes are all one) cannot keep one and is left as dealt. The same key gives
    the same folds.
    """
    shape = tuple(int(s) for s in shape)
    if isinstance(folds, bool) or not isinstance(folds, int | np.integer) or folds < 2:
        raise ValueError(f"folds must be an int >= 2, got {folds!r}")
    size = int(np.prod(shape))
    if folds > size:
        raise ValueError(f"folds must be at most the number of held-out slices ({size}), got {folds}")
    rng = numpy_generator(rng_key)
    flat = np.empty(size, dtype=np.int64)
    flat[rng.permutation(size)] = np.arange(size) % folds
    # Flat positions of every index's entries, axis by axis (rows of length one are exempt).
    positions = np.arange(size).reshape(shape)
    rows = [np.moveaxis(positions, axis, 0).reshape(shape[axis], -1) for axis in range(len(shape))
            if size // shape[axis] > 1]
    for _ in range(MAX_FOLD_REPAIRS):
        broken = [row for table in rows for row in table if (flat[row] == flat[row[0]]).all()]
        if not broken:
            return flat.reshape(shape)
        for row in broken:
            if not (flat[row] == flat[row[0]]).all():
                continue  # an earlier swap of this round already mended it
            inside = row[rng.integers(len(row))]
            others = np.flatnonzero(flat != flat[inside])
            outside = others[rng.integers(len(others))]
            flat[inside], flat[outside] = flat[outside], flat[inside]
    raise ValueError(f"could not split {shape} into {folds} folds that leave every index a fitted entry; "
                     "use fewer folds")


#: Largest number of held-out cells the missing-cell fit of an allocation model enumerates.
MAX_HELDOUT_CELLS = 2_000_000


def _accepts_heldout(model, method: str | None) -> bool:
    import inspect

    from .infer.registry import find

    name = method or getattr(model, "default_method", None)
    if name is None:
        return False
    params = inspect.signature(find(name, model).fn).parameters
    return "heldout" in params


def heldout_log_likelihood(model, X, heldout: np.ndarray, *, rng_key: KeyLike = 0, method: str | None = None,
                           heldout_axes=None, **fit_options) -> np.ndarray | float:
    """Fit ``model`` without the ``heldout`` slices and return their log-likelihood.

    Two fits are available:

    * a backend that accepts ``heldout=`` and reports ``sample_stats["heldout_log_likelihood"]``
      per chain, such as the Dirichlet Tucker ``"map"`` and ``"sem"`` backends. Where it also
      reports ``pointwise_heldout_log_likelihood`` (chain, slice), the per-slice values
      (averaged over chains) are returned, which lets :func:`select_ranks` compare models slice
      by slice;
    * for any other :class:`~bam_ppl.AllocationModel` that conditions on no totals (NMF, CP,
      Tucker, ...) with ``method=None``: the missing-cell fit of :func:`allocation_heldout_fit`
      (the held-out cells are unobserved, not zero), scored per held-out slice.

    A backend that cannot hold out data (``"smc"``, ``"gibbs"``, ...) named by ``method`` is an
    error: pass ``method=None`` or a ``score=`` to :func:`select_ranks`.
    """
    from .convert import group
    from .infer.registry import infer
    from .models.allocation import AllocationModel

    if not _accepts_heldout(model, method):
        if isinstance(model, AllocationModel) and method is None:
            data = model.as_data(X)
            axes = _heldout_axes(model, heldout_axes) if heldout_axes is not None or np.ndim(heldout) != data.ndim \
                else tuple(range(data.ndim))
            return allocation_heldout_fit(model, data, heldout, axes, rng_key=rng_key, **fit_options)["pointwise"]
        raise ValueError(
            f"method {method or getattr(model, 'default_method', None)!r} cannot hold out part of the data "
            f"for {type(model).__name__}"
            + ("; leave method=None for the missing-cell fit of an allocation model"
               if isinstance(model, AllocationModel) else "")
            + ", or pass score= (a callable score(model, X, heldout, rng_key)) to select_ranks"
        )
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


@renamed_options(num_restarts="num_chains")
def allocation_heldout_fit(model, X, heldout: np.ndarray, heldout_axes, *, rng_key: KeyLike = 0,
                           num_iters: int = 500, num_chains: int = 4, tol: float = 1e-7,
                           max_configs: int | None = None) -> dict:
    """Fit an allocation model with the ``heldout`` slices unobserved and score them.

    The held-out cells (every cell of every held-out slice along ``heldout_axes``, zero or not)
    are *missing*, not zero: EM on the augmented model imputes their expected counts
    E[X_u] = λ̂ p(u | Θ) in each E-step, with λ̂ = (a + T_train) / (b + 1 − Σ_held p(u | Θ)) the
    posterior-mean total rate given the training tokens, and sets each table to its Dirichlet
    posterior mean given the expected allocation counts, (α + E S) normalised (well defined for
    every concentration α > 0, unlike the posterior mode). ``num_chains`` random starts run
    until the relative change of the training log-likelihood is below ``tol``; the one with the
    highest training log-likelihood (multinomial of the training cells given their total) is
    kept. The score of each held-out slice is the Poisson log-likelihood of its cells,
    Σ_u log Poisson(X_u; λ̂ p(u | Θ̂)), the likelihood the model gives the cells.

    Only models that condition on no totals: under ``condition_on`` a held-out cell's rate
    depends on its slice's total, which this fit does not model.

    Returns
    -------
    dict
        ``pointwise`` (one value per held-out slice, in ``np.argwhere(heldout)`` order),
        ``heldout_loglik`` (their sum), ``train_loglik``, ``rate`` (λ̂), ``cell_prob`` p(u | Θ̂) of
        the held-out cells (slice by slice, each slice's cells in C order) and ``theta`` (the flat tables of the kept restart).
    """
    from scipy.special import gammaln

    data = model.as_data(X)
    if getattr(model, "condition_on", ()):
        raise ValueError(
            f"the missing-cell fit needs a model that conditions on no totals; this one conditions on "
            f"{tuple(model.condition_on)}. Pass score= to select_ranks (or a backend that takes heldout=)"
        )
    if data.has_missing:
        raise ValueError("the missing-cell fit needs fully observed cells (X has missing coordinates)")
    cells = _held_out_slices(data, np.asarray(heldout, dtype=bool), tuple(int(a) for a in heldout_axes))
    fit = _missing_cell_problem(model, data, cells, max_configs)
    with jax.enable_x64(True):
        keys = jax.random.split(as_key(rng_key), int(num_chains))
        thetas, values, cell, rate = _heldout_em(fit.problem, jnp.asarray(fit.is_held), jnp.asarray(fit.totals), keys,
                                                 int(num_iters), float(tol), has_valid=fit.has_valid)
        values = np.asarray(values)
        best = int(np.argmax(np.where(np.isfinite(values), values, -np.inf)))
        held = np.asarray(cell[best])[fit.is_held]
        rate = float(rate[best])
    held_cell = np.empty(cells.counts.size)
    held_cell[fit.held_position] = held  # back to slice-by-slice order
    mean = rate * held_cell
    logpmf = cells.counts * np.log(np.where(mean > 0, mean, 1.0)) - mean - gammaln(cells.counts + 1.0)
    logpmf = np.where((mean == 0) & (cells.counts > 0), -np.inf, logpmf)
    pointwise = np.bincount(cells.slice_of, weights=logpmf, minlength=cells.num_slices)
    return dict(pointwise=pointwise, heldout_loglik=float(pointwise.sum()), train_loglik=float(values[best]),
                rate=rate, cell_prob=held_cell, theta=np.asarray(thetas[best]))


class HeldoutCells(NamedTuple):
    """Every cell of the held-out slices, slice by slice, each slice's cells in C order
    (:func:`allocation_heldout_fit`): ``index`` (n, ndim) their coordinates, ``slice_of`` (n,) the
    slice each belongs to, ``counts`` (n,) their observed counts; ``train`` (a ``CountTensor``) the
    other cells' counts; ``num_slices``."""

    index: np.ndarray
    slice_of: np.ndarray
    counts: np.ndarray
    train: object
    num_slices: int


def _held_out_slices(data, heldout: np.ndarray, axes: tuple) -> HeldoutCells:
    """The :class:`HeldoutCells` of the slices ``heldout`` marks along ``axes`` of ``data``, checked."""
    from .data import CountTensor

    if heldout.shape != tuple(data.shape[a] for a in axes):
        raise ValueError(f"heldout has shape {heldout.shape}, expected {tuple(data.shape[a] for a in axes)} "
                         f"(the sizes of heldout_axes {axes})")
    rest = [a for a in range(data.ndim) if a not in axes]
    rest_shape = tuple(data.shape[a] for a in rest)
    slices = np.argwhere(heldout)
    per_slice = int(np.prod(rest_shape, dtype=np.int64)) if rest else 1
    num_cells = len(slices) * per_slice
    if num_cells == 0:
        raise ValueError("heldout holds out nothing")
    if num_cells > MAX_HELDOUT_CELLS:
        raise ValueError(f"the held-out slices hold {num_cells} cells (> {MAX_HELDOUT_CELLS}); hold out a "
                         "smaller fraction or pass score=")
    index = np.zeros((num_cells, data.ndim), dtype=np.int64)
    index[:, list(axes)] = np.repeat(slices, per_slice, axis=0)
    if rest:
        index[:, rest] = np.tile(np.indices(rest_shape).reshape(len(rest), -1).T, (len(slices), 1))
    entry_held = heldout[tuple(data.indices[:, a] for a in axes)] if data.nnz else np.zeros(0, bool)
    train = CountTensor(data.indices[~entry_held], data.counts[~entry_held], data.shape, dims=data.dims,
                        coords=data.coords)
    if train.total == 0:
        raise ValueError("every token lies in a held-out slice; hold out a smaller fraction")
    counts = np.zeros(num_cells)
    if data.nnz:
        held_flat = np.ravel_multi_index(tuple(index.T), data.shape)
        data_flat = np.ravel_multi_index(tuple(data.indices.T), data.shape)
        inside = np.isin(data_flat, held_flat)
        counts[_positions(held_flat, data_flat[inside])] = data.counts[inside]
    return HeldoutCells(index, np.repeat(np.arange(len(slices)), per_slice), counts, train, len(slices))


class MissingCellProblem(NamedTuple):
    """The EM problem of :func:`allocation_heldout_fit` over the training cells and then every held-out
    cell, padded (:func:`_padded_size`): ``is_held`` marks the held-out cells, ``held_position`` their
    place in :class:`HeldoutCells` order, ``totals`` (training tokens, a, b)."""

    problem: object
    is_held: np.ndarray
    held_position: np.ndarray
    totals: np.ndarray
    has_valid: bool


def _missing_cell_problem(model, data, cells: HeldoutCells, max_configs) -> MissingCellProblem:
    """The :class:`MissingCellProblem` of ``model`` bound to the training cells."""
    from .data import CountTensor
    from .infer import em
    from .models.allocation import DEFAULT_MAX_CONFIGS

    train, shape = cells.train, data.shape
    union = CountTensor(np.concatenate([train.indices, cells.index]),
                        np.ones(train.nnz + cells.index.shape[0], dtype=np.int64), shape)
    union_flat = np.ravel_multi_index(tuple(union.indices.T), shape)
    held_flat = np.ravel_multi_index(tuple(cells.index.T), shape)
    is_held = np.isin(union_flat, held_flat)
    train_flat = np.ravel_multi_index(tuple(train.indices.T), shape)
    counts = np.zeros(union.nnz)
    counts[~is_held] = train.counts[np.searchsorted(train_flat, union_flat[~is_held])]
    bound = model.bind(train)
    layout = bound.cell_layout(union, max_configs=max_configs or DEFAULT_MAX_CONFIGS)
    problem = em.build_problem(bound, union, layout)
    # Pad the cells to a size shared by the folds (copies of cell 0 holding no count and not held
    # out add nothing to any sum): every fold of one model then reuses one compiled fit.
    padding = _padded_size(union.nnz) - union.nnz
    problem = problem._replace(index=np.pad(problem.index, ((0, 0), (0, padding), (0, 0)), mode="edge"),
                               counts=np.pad(counts, (0, padding)))
    if layout.valid is not None:
        problem = problem._replace(valid=np.pad(problem.valid, ((0, padding), (0, 0)), mode="edge"))
    return MissingCellProblem(problem, np.pad(is_held, (0, padding)), _positions(held_flat, union_flat[is_held]),
                              np.array([float(train.total), float(bound.a), float(bound.b)]),
                              layout.valid is not None)


def _positions(flat: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Where each of ``values`` lies in ``flat`` (distinct flat indices, in any order; every value among them)."""
    order = np.argsort(flat, kind="stable")
    return order[np.searchsorted(flat, values, sorter=order)]


def _padded_size(n: int) -> int:
    """``n`` rounded up to one of eight sizes per octave: at most 1/8 padding, few distinct shapes."""
    step = 1 << max(int(n).bit_length() - 4, 0)
    return -(-int(n) // step) * step


def _heldout_cells(problem, theta, held, totals, has_valid):
    """Configuration and cell probabilities, Σ_held p(u | Θ) and the rate λ̂ of the missing-cell fit."""
    from .infer import em

    T_train, a, b = totals[0], totals[1], totals[2]
    prob = em._configuration_probabilities(problem, theta, has_valid)
    cell = prob.sum(-1)
    p_held = jnp.sum(jnp.where(held, cell, 0.0))
    rate = (a + T_train) / (b + jnp.maximum(1.0 - p_held, 1e-300))
    return prob, cell, p_held, rate


def _heldout_train_loglik(problem, cell, held, p_held, T_train):
    """Multinomial log-likelihood of the training cells given their total (up to a constant)."""
    log_cell = jnp.log(jnp.where(held, 1.0, cell))
    return jnp.sum(jnp.where(held, 0.0, problem.counts * log_cell)) - T_train * jnp.log1p(-p_held)


@functools.partial(jax.jit, static_argnames=("has_valid",))
def _heldout_em(problem, held, totals, keys, num_iters, tol, *, has_valid):
    """EM of :func:`allocation_heldout_fit` from every key: its tables, training log-likelihoods,
    cell probabilities and rates. The data are arguments, so equal shapes share one compiled program."""
    from .infer import em

    def step(theta):
        prob, cell, _, rate = _heldout_cells(problem, theta, held, totals, has_valid)
        filled = jnp.where(held, rate * cell, problem.counts)
        weight = filled[:, None] * prob / jnp.where(cell > 0, cell, 1.0)[:, None]
        members = problem.index.shape[0]
        expected = jnp.zeros_like(theta).at[problem.index.reshape(-1)].add(
            jnp.broadcast_to(weight, (members, *weight.shape)).reshape(-1))
        return em._normalise(problem, problem.concentration + expected)

    def loglik(theta):
        _, cell, p_held, _ = _heldout_cells(problem, theta, held, totals, has_valid)
        return _heldout_train_loglik(problem, cell, held, p_held, totals[0])

    def run(key):
        def body(state):
            theta, value, it, _ = state
            theta = step(theta)
            new = loglik(theta)
            return theta, new, it + 1, jnp.abs(new - value) / jnp.maximum(jnp.abs(new), 1.0)

        def not_done(state):
            return (state[2] < num_iters) & (state[3] > tol)

        theta = em.init(problem, key, "random")
        state = (theta, loglik(theta), jnp.zeros((), jnp.int32), jnp.asarray(jnp.inf))
        theta, value, _, _ = jax.lax.while_loop(not_done, body, state)
        _, cell, _, rate = _heldout_cells(problem, theta, held, totals, has_valid)
        return theta, value, cell, rate

    return jax.vmap(run)(keys)


def num_parameters(model, X) -> int | None:
    """Free parameters of ``model`` on data ``X``: Σ over its Dirichlet tables of rows × (columns − 1).

    For the Dirichlet Tucker decomposition this is the paper's count, M(K_M − 1) + N(K_N − 1) +
    K_P(P − 1) + K_S(S − 1) + K_M K_N (K_P K_S − 1). None for a model that is not an allocation
    model (or cannot be bound to ``X``).
    """
    from .models.allocation import AllocationModel

    if not isinstance(model, AllocationModel):
        return None
    try:
        tables = model.bind(model.as_data(X)).tables
    except (TypeError, ValueError):
        return None
    return int(sum(t.size - t.size // t.shape[-1] for t in tables))


def _mark_selection(table, pointwise, names, complexity=None) -> None:
    """Add the standard errors and ``selected`` (the one-standard-error rule) to ``table``.

    With per-slice scores s_i (the same n held-out slices for every row), ``heldout_loglik_se``
    is the standard error of a row's own total, sqrt(n) · sd(s_i), and
    ``heldout_loglik_diff_se`` that of its paired difference to the best row,
    sqrt(n) · sd(s_i − s_best,i) (nan on the best row). The slices differ far more from one
    another than the models do on any one slice, so only the paired difference measures how
    surely one model predicts better than another; the own standard error (tens of nats here
    where models differ by a few) would admit models that are plainly worse.

    The selected row is the simplest row *nested below the best* (every swept size at most the
    best's) whose score is within its ``heldout_loglik_diff_se`` of the best score (the best row
    itself qualifies): simplest by ``complexity`` (the number of free parameters where every
    model has one, :func:`num_parameters`), then by the sum of the swept sizes, then grid order.
    A row within one standard error of the best says that the best's extra components are not
    surely supported, which only holds for a row the best contains: a row larger than the best
    in some size (fewer parameters overall or not) adds a component the best lacks, and the
    best already predicts better than it. Without per-slice scores the best row is selected.
    """
    scores = table[SCORE_COLUMN].to_numpy()
    best = int(np.argmax(scores))
    size = table[names].sum(axis=1).to_numpy(dtype=float)
    simpler = np.zeros(len(table)) if complexity is None else np.asarray(complexity, dtype=float)
    order = np.lexsort((np.arange(len(table)), size, simpler))
    if any(p is None for p in pointwise) or len({p.shape for p in pointwise}) != 1:
        table["selected"] = np.arange(len(table)) == best
        return
    values = np.stack(pointwise)
    n = values.shape[1]
    if n > 1:
        se = np.sqrt(n) * values.std(axis=1, ddof=1)
        diff_se = np.sqrt(n) * (values - values[best]).std(axis=1, ddof=1)
        diff_se[best] = np.nan
    else:
        se = np.full(len(table), np.nan)
        diff_se = np.full(len(table), np.nan)
    table["heldout_loglik_se"] = se
    table["heldout_loglik_diff_se"] = diff_se
    within = scores >= scores[best] - np.where(np.isfinite(diff_se), diff_se, 0.0)
    sizes = table[names].to_numpy()
    try:  # nested below the best: every swept size at most the best's (sizes that do not order count as equal)
        within &= (sizes <= sizes[best]).all(axis=1)
    except TypeError:
        pass
    within[best] = True
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


#: Options :func:`select_ranks` gives the Dirichlet Tucker MAP-EM (``fit_options`` override
#: them). Models a few ranks apart differ by tens of nats over all held-out faces, while a fit
#: still tens of nats of log posterior short of its mode moves a fold's held-out total by as
#: much (plain EM is there after 2000 updates): SQUAREM-accelerated EM (1000 iterations, 3000
#: updates, with a tolerance that lets it run to them) and the better of two starts.
DIRICHLET_TUCKER_FIT_OPTIONS = dict(num_iters=1000, num_chains=2, acceleration="squarem", tol=1e-9)


def _default_fit_options(model, method) -> dict:
    from .models.dirichlet_tucker import DirichletTuckerModel

    if isinstance(model, DirichletTuckerModel) and (method or model.default_method) == "map":
        return dict(DIRICHLET_TUCKER_FIT_OPTIONS)
    return {}


def _check_folds(folds, heldout_fraction) -> int:
    """The number of folds, from ``folds`` and ``heldout_fraction`` (1: one mask of that fraction)."""
    if folds is not None and (isinstance(folds, bool) or not isinstance(folds, int | np.integer) or folds < 1):
        raise ValueError(f"folds must be an int >= 1 (1: a single held-out mask), got {folds!r}")
    if heldout_fraction is not None:
        check_positive(heldout_fraction, "heldout_fraction", upper=1.0)
        if heldout_fraction >= 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if folds is not None and folds != 1:
            raise ValueError(f"heldout_fraction ({heldout_fraction}) sets a single held-out mask, but folds={folds}; "
                             "pass one of them (each of k folds holds out 1/k of the slices)")
        return 1
    return DEFAULT_FOLDS if folds is None else int(folds)


def select_ranks(model_factory: Callable, X, grid: Mapping, fixed: Mapping | None = None,
                 heldout_fraction: float | None = None, rng_key: KeyLike = 0, score: Callable | None = None, *,
                 folds: int | None = None, heldout_axes=None, method: str | None = None,
                 fit_options: Mapping | None = None, executor=None, **options):
    """Sweep a grid of model sizes and score each by its speckled held-out likelihood (Zhang & Linderman §3).

    The slices along ``heldout_axes`` are split into ``folds`` speckled folds
    (:func:`speckled_folds`); every grid point is fitted once per fold without that fold's
    slices and scored on them, so every slice is held out once. Models are compared slice by
    slice: the selected one is the simplest model nested below the best whose total is within
    one standard error of its paired difference to the best total (see ``Returns``).

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
    heldout_fraction : float, optional
        Hold out a single speckled mask of this fraction of the slices (:func:`speckled_mask`)
        instead of folds (Zhang & Linderman's protocol; its 1/10 scores a tenth of the data, so
        the comparison is noisier). Not together with ``folds`` > 1.
    rng_key : int or JAX key
        Draws the folds (or mask) and seeds every fit (the same fit key for every grid point).
    score : callable, optional
        ``score(model, X, heldout, rng_key)`` returning a number or a 1-d array of per-slice
        values (summed for the table), higher is better; called once per grid point and fold.
        Default: the held-out log-likelihood of the fit by ``method``
        (:func:`heldout_log_likelihood`), which for the Dirichlet Tucker model is eq. 2's
        multinomial log-likelihood of each held-out face, and for other allocation models
        without ``condition_on`` (``nmf``, ``cp``, ``tucker`` ...) the Poisson log-likelihood of
        each held-out slice's cells after a fit that treats them as missing
        (:func:`allocation_heldout_fit`; e.g. ``heldout_axes=(0, 1)`` holds out single cells of
        a matrix).
    folds : int, optional
        Number of speckled folds (default :data:`DEFAULT_FOLDS`, 5, unless ``heldout_fraction``
        is given); 1 holds out a single mask of ``heldout_fraction`` (default 0.1).
    heldout_axes : int, str or tuple of them, optional
        Data axes whose slices are held out, as positions in the model's ``observed`` order or
        as node names; default the model's conditioned axes (the (m, n) faces for the Dirichlet
        Tucker model).
    method : str, optional
        Backend of the default score (default: the model's ``default_method`` when it takes
        ``heldout=``, else the missing-cell fit of an allocation model). A backend that cannot
        hold out data is an error.
    fit_options : dict, optional
        Deprecated: pass the backend's options as keywords (``**options``).
    executor : concurrent.futures.Executor or dask.distributed.Client, optional
        Scores the grid points there, one task per grid point and fold (:mod:`bam_ppl.parallel`),
        the data sent to each worker once; the table is the same as without an executor. A
        custom ``score`` must then be picklable (a process pool needs a module-level function;
        Dask also sends closures).
    **options
        Those that ``model_factory`` names in its signature are passed to it (e.g. ``alpha``;
        all of them when it takes ``**kwargs``); the others are options of the backend of the
        default score (``num_iters``, ``num_chains`` ...). The Dirichlet Tucker MAP-EM runs
        with :data:`DIRICHLET_TUCKER_FIT_OPTIONS` unless overridden here.

    Returns
    -------
    pandas.DataFrame
        One row per grid point, in grid order: the grid and fixed sizes, ``heldout_loglik`` (the
        sum over every held-out slice of every fold), ``num_parameters`` (free parameters, for
        allocation models), with per-slice scores ``heldout_loglik_se`` (the standard error of
        the row's own total, sqrt(n) · sd of its n per-slice values) and
        ``heldout_loglik_diff_se`` (that of its paired difference to the best row,
        sqrt(n) · sd(s_i − s_best,i); nan on the best row), and ``selected``: the simplest row
        (fewest free parameters, then least sum of the swept sizes, then grid order) among those
        nested below the best row (no swept size larger than the best's) whose score is at least
        the best score minus its ``heldout_loglik_diff_se`` (the best row without per-slice
        scores). ``table.attrs`` holds ``grid`` (the swept names), ``fixed``,
        ``folds`` (the fold of every slice along ``heldout_axes``; -1: never held out),
        ``heldout`` (the slices held out in some fold) and ``heldout_axes``.
    """
    import pandas as pd

    grid, fixed = _check_grid(grid, fixed)
    num_folds = _check_folds(folds, heldout_fraction)
    if score is not None and not callable(score):
        raise TypeError(f"score must be a callable score(model, X, heldout, rng_key), got {type(score).__name__}")
    model_kwargs, fit_options = _split_options(model_factory, options, fit_options)
    if score is not None and (method is not None or fit_options):
        raise ValueError(f"method and the fit options {sorted(fit_options)} configure the default score; a custom "
                         "score fits by itself")
    check_executor(executor)
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
    held_shape = tuple(data.shape[a] for a in axes)
    if num_folds == 1:
        mask = speckled_mask(held_shape, 0.1 if heldout_fraction is None else heldout_fraction, mask_key)
        assignment = np.where(mask, 0, -1)
        fold_keys = [fit_key]
    else:
        assignment = speckled_folds(held_shape, num_folds, mask_key)
        # One fit key per fold, shared by every grid point: the scores are compared point against point.
        fold_keys = [jax.random.fold_in(fit_key, f) for f in range(num_folds)]
    tasks = []
    for point, model in zip(points, models):
        fitter = score
        if fitter is None:
            options = {**_default_fit_options(model, method), **fit_options}
            fitter = functools.partial(_fit_score, method=method, fit_options=options)
        for f in range(num_folds):
            label = f"grid point {point}" + (f", fold {f}" if num_folds > 1 else "")
            tasks.append(Task(label, (fitter, model, assignment == f, fold_keys[f])))
    rows, pointwise = _score_rows(points, fixed, run_tasks(executor, score_task, tasks, data), num_folds)
    table = pd.DataFrame(rows, columns=[*names, *fixed, SCORE_COLUMN])
    complexity = [num_parameters(model, data) for model in models]
    if all(c is not None for c in complexity):
        table["num_parameters"] = complexity
    else:
        complexity = None
    _mark_selection(table, pointwise, names, complexity)
    table.attrs.update(grid=names, fixed=fixed, folds=assignment, heldout=assignment >= 0, heldout_axes=axes)
    return table


def _score_rows(points: list, fixed: dict, results: list, num_folds: int) -> tuple[list, list]:
    """The table's rows (each grid point's sizes and its score summed over folds) and each point's
    per-slice scores, fold after fold (None where ``score`` returned totals), from the scores of
    every grid point and fold (``results``, point after point)."""
    rows, pointwise = [], []
    for index, point in enumerate(points):
        parts = [np.asarray(raw, dtype=np.float64) for raw in results[index * num_folds:(index + 1) * num_folds]]
        if any(p.ndim > 1 for p in parts):
            bad = next(p for p in parts if p.ndim > 1)
            raise ValueError(f"score must return a number or a 1-d array of per-slice values, got shape {bad.shape}")
        pointwise.append(np.concatenate(parts) if all(p.ndim == 1 for p in parts) else None)
        rows.append({**point, **fixed, SCORE_COLUMN: float(sum(p.sum() for p in parts))})
    return rows, pointwise


def _split_options(model_factory, options: dict, fit_options: Mapping | None) -> tuple[dict, dict]:
    """(model kwargs, fit options) of :func:`select_ranks`: the keywords that ``model_factory``
    names go to it, the rest to the fit, with those of the deprecated ``fit_options``."""
    try:
        params = inspect.signature(model_factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: keep sending everything to it
        params = {"": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        model_kwargs, fit = dict(options), {}
    else:
        named = {name for name, p in params.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
        model_kwargs = {k: v for k, v in options.items() if k in named}
        fit = {k: v for k, v in options.items() if k not in named}
    if fit_options is not None:
        warnings.warn("select_ranks: fit_options= is deprecated and will be removed in the next release; pass the "
                      "backend's options as keywords (select_ranks(..., num_iters=...))", FutureWarning, stacklevel=3)
        both = sorted(set(fit) & set(fit_options))
        if both:
            raise ValueError(f"select_ranks: {both} given both as keywords and in fit_options; pass them as keywords only")
        fit = {**dict(fit_options), **fit}
    return model_kwargs, fit


def _fit_score(model, X, heldout, rng_key, *, method, fit_options):
    """The default score of :func:`select_ranks`: the held-out log-likelihood of the fit by ``method``."""
    return heldout_log_likelihood(model, X, heldout, rng_key=rng_key, method=method, **fit_options)


def plot_rank_selection(table, ax=None, errorbars: float = 1.0):
    """Profile plot of a :func:`select_ranks` table, with the one-standard-error rule drawn.

    One panel per swept size: for each of its values, the best held-out log-likelihood over the
    other sizes, with ± ``errorbars`` × ``heldout_loglik_diff_se`` of that row (the standard
    error of its paired difference to the best row, the one the rule uses; none on the best
    row, and no bars when the score had no per-slice values). The dotted horizontal line is the
    best score: a point whose bar reaches it is within one standard error of the best. The
    vertical line marks the selected grid point.

    Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    if SCORE_COLUMN not in getattr(table, "columns", ()):
        raise ValueError(f"table must be a select_ranks result with a {SCORE_COLUMN!r} column")
    if errorbars < 0:
        raise ValueError(f"errorbars must be >= 0 standard errors, got {errorbars}")
    names = list(table.attrs.get("grid") or [c for c in table.columns
                                             if c not in (SCORE_COLUMN, "selected", "num_parameters")
                                             and not c.startswith(SCORE_COLUMN)])
    if ax is None:
        fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.0), squeeze=False)
        axes = axes[0]
    else:
        axes = np.atleast_1d(ax)
        if axes.size != len(names):
            raise ValueError(f"ax must hold {len(names)} axes (one per swept size {names})")
        fig = axes[0].figure
    best = table.loc[table["selected"].idxmax()] if "selected" in table else table.loc[table[SCORE_COLUMN].idxmax()]
    top = table.loc[table[SCORE_COLUMN].idxmax()]
    has_se = "heldout_loglik_diff_se" in table and np.isfinite(table["heldout_loglik_diff_se"]).any()
    for axis, name in zip(axes, names):
        rows = table.loc[table.groupby(name)[SCORE_COLUMN].idxmax()].sort_values(name)
        yerr = None
        if has_se and errorbars:
            yerr = errorbars * np.nan_to_num(rows["heldout_loglik_diff_se"].to_numpy(dtype=float), nan=0.0)
        axis.errorbar(rows[name].to_numpy(), rows[SCORE_COLUMN].to_numpy(), yerr=yerr, marker="o", capsize=3,
                      label="held-out log-lik." + (f" ± {errorbars:g} paired se" if yerr is not None else ""))
        axis.axhline(top[SCORE_COLUMN], color="0.5", linestyle=":", label="best")
        axis.axvline(best[name], color="C3", linestyle="--", label=f"selected {name} = {best[name]}")
        axis.set_xlabel(name)
        axis.set_ylabel("held-out log-likelihood")
        axis.legend(fontsize="small")
    fig.tight_layout()
    return fig
