"""Generative draws from an allocation model (Cemgil et al. 2019 §3.1–3.2).

Draws are made with NumPy's Generator seeded from the JAX key (the same key gives the same draw):
the number of tokens is itself random, and eager JAX would compile anew for every new T.
"""

from __future__ import annotations

import numpy as np

from ..types import PRNGKey, numpy_generator


def dirichlet_log_draws(rng: np.random.Generator, concentration, column_of: np.ndarray,
                        size: int | None = None) -> np.ndarray:
    """log θ for θ ~ Dirichlet(concentration) in every column of a concatenated table vector.

    ``concentration`` is (..., F) with the columns of ``column_of`` (F,) contiguous; the result
    has its shape, or (size, F) for a (F,) concentration and an int ``size``. Gamma variates are
    drawn as Gamma(c) = Gamma(c + 1) · U^{1/c} in log space, so that concentrations far below
    one (BDeu at small a, sparse posteriors) give finite log θ instead of columns of zeros.
    """
    concentration = np.asarray(concentration, dtype=np.float64)
    shape = concentration.shape if size is None else (size, *concentration.shape)
    log_gamma = np.log(rng.standard_gamma(concentration + 1.0, size=shape)) + np.log(
        rng.random(shape)) / concentration
    starts = np.flatnonzero(np.diff(column_of, prepend=-1))
    top = np.maximum.reduceat(log_gamma, starts, axis=-1)[..., column_of]
    log_total = np.log(np.add.reduceat(np.exp(log_gamma - top), starts, axis=-1))[..., column_of]
    return log_gamma - top - log_total


def dirichlet_rows(rng: np.random.Generator, concentration, size=None) -> np.ndarray:
    """Dirichlet vectors along the last axis of ``concentration`` as normalised Gamma draws
    (``size``: the output shape, by default that of ``concentration``). A row whose Gammas all
    underflow (concentrations far below one) stays zero instead of 0/0."""
    gammas = rng.standard_gamma(np.asarray(concentration, dtype=np.float64), size=size)
    totals = gammas.sum(axis=-1, keepdims=True)
    return gammas / np.where(totals > 0, totals, 1.0)


def _draw_tables(rng: np.random.Generator, bound) -> dict[str, np.ndarray]:
    out = {}
    for table in bound.tables:
        conc = table.concentration
        columns = conc.reshape(-1, conc.shape[-1])
        theta = np.stack([rng.dirichlet(col) for col in columns]).reshape(conc.shape)
        # Tiny concentrations can underflow a whole column; fall back to a point mass there.
        bad = ~np.isfinite(theta).all(-1) | (theta.sum(-1) <= 0)
        if bad.any():
            theta[bad] = 0.0
            theta[bad, 0] = 1.0
        out[table.name] = theta / theta.sum(-1, keepdims=True)
    return out


def _conditioned_tokens(model, sizes, total) -> np.ndarray:
    cond = model.condition_on
    cond_shape = tuple(sizes[n] for n in cond)
    counts = np.broadcast_to(np.asarray(total), cond_shape)
    if counts.dtype.kind not in "iu" and not np.all(counts == np.round(counts)):
        raise ValueError("total must hold nonnegative integers (tokens per conditioned cell)")
    counts = counts.astype(np.int64)
    if (counts < 0).any():
        raise ValueError("total must be nonnegative")
    cells = np.stack(np.unravel_index(np.arange(counts.size), cond_shape), axis=1)
    return np.repeat(cells, counts.reshape(-1), axis=0)


def _categorical(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One draw per row of ``probs`` (rows sum to one) by inverting the cumulative sums."""
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[0]) * cdf[:, -1]
    return np.minimum((cdf < u[:, None]).sum(-1), probs.shape[-1] - 1)


def sample_allocation(model, key: PRNGKey, shape, total):
    """Draw an allocation tensor S (axes: ``model.dag.nodes``) and X = S_V (axes: ``observed``)."""
    if shape is None:
        raise ValueError(f"shape is required: the sizes of the visible nodes {model.observed}")
    sizes = {**model.visible_sizes(shape), **model.latent}
    nodes = model.dag.nodes
    rng = numpy_generator(key)
    if model.condition_on:
        if total is None:
            raise ValueError("total is required under condition_on: tokens per conditioned cell")
        fixed = _conditioned_tokens(model, sizes, total)
        T = fixed.shape[0]
    else:
        if total is None:
            if model.b is None:
                raise ValueError("pass total= (the number of tokens) or give the model an explicit b")
            T = int(rng.poisson(rng.gamma(model.a) / model.b))
        else:
            if isinstance(total, bool) or int(total) != total or total < 0:
                raise ValueError(f"total must be a nonnegative int, got {total!r}")
            T = int(total)
        fixed = np.zeros((T, 0), dtype=np.int64)
    bound = model.bind(shape=shape, total=max(T, 1))
    thetas = _draw_tables(rng, bound)
    owner = {m: t for t in bound.tables for m in t.members}
    values: dict[str, np.ndarray] = {n: fixed[:, i] for i, n in enumerate(model.condition_on)}
    for n in nodes:
        if n in values:
            continue
        theta = thetas[owner[n].name]
        pars = model.dag.parents[n]
        cols = theta[tuple(values[p] for p in pars)] if pars else np.broadcast_to(theta, (T, theta.shape[-1]))
        values[n] = _categorical(rng, cols) if T else np.zeros(0, np.int64)
    S = np.zeros(tuple(sizes[n] for n in nodes), dtype=np.int64)
    np.add.at(S, tuple(values[n] for n in nodes), 1)
    latent_axes = tuple(i for i, n in enumerate(nodes) if n in model.latent)
    X = S.sum(axis=latent_axes)
    kept = [n for n in nodes if n not in model.latent]
    X = np.transpose(X, [kept.index(n) for n in model.observed])
    return S, X
