"""Generative draws from an allocation model (papers/000 §3.1–3.2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..types import PRNGKey


def _draw_tables(key: PRNGKey, bound) -> dict[str, np.ndarray]:
    keys = jax.random.split(key, len(bound.tables))
    out = {}
    for k, table in zip(keys, bound.tables):
        theta = jax.random.dirichlet(k, jnp.asarray(table.concentration, dtype=jnp.float32))
        theta = np.asarray(theta, dtype=np.float64)
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


def sample_allocation(model, key: PRNGKey, shape, total):
    """Draw an allocation tensor S (axes: ``model.dag.nodes``) and X = S_V (axes: ``observed``)."""
    if shape is None:
        raise ValueError(f"shape is required: the sizes of the visible nodes {model.observed}")
    sizes = {**model.visible_sizes(shape), **model.latent}
    nodes = model.dag.nodes
    k_rate, k_count, k_theta, k_tok = jax.random.split(key, 4)
    if model.condition_on:
        if total is None:
            raise ValueError("total is required under condition_on: tokens per conditioned cell")
        fixed = _conditioned_tokens(model, sizes, total)
        T = fixed.shape[0]
    else:
        if total is None:
            if model.b is None:
                raise ValueError("pass total= (the number of tokens) or give the model an explicit b")
            rate = float(jax.random.gamma(k_rate, model.a) / model.b)
            T = int(jax.random.poisson(k_count, rate))
        else:
            if isinstance(total, bool) or int(total) != total or total < 0:
                raise ValueError(f"total must be a nonnegative int, got {total!r}")
            T = int(total)
        fixed = np.zeros((T, 0), dtype=np.int64)
    bound = model.bind(shape=shape, total=max(T, 1))
    thetas = _draw_tables(k_theta, bound)
    owner = {m: t for t in bound.tables for m in t.members}
    values: dict[str, np.ndarray] = {n: fixed[:, i] for i, n in enumerate(model.condition_on)}
    keys = jax.random.split(k_tok, len(nodes))
    for k, n in zip(keys, nodes):
        if n in values:
            continue
        table = owner[n]
        theta = thetas[table.name]
        pars = model.dag.parents[n]
        cols = theta[tuple(values[p] for p in pars)] if pars else np.broadcast_to(theta, (T, theta.shape[-1]))
        logits = jnp.log(jnp.asarray(cols, dtype=jnp.float32))
        values[n] = np.asarray(jax.random.categorical(k, logits, axis=-1)) if T else np.zeros(0, np.int64)
    S = np.zeros(tuple(sizes[n] for n in nodes), dtype=np.int64)
    np.add.at(S, tuple(values[n] for n in nodes), 1)
    latent_axes = tuple(i for i, n in enumerate(nodes) if n in model.latent)
    X = S.sum(axis=latent_axes)
    kept = [n for n in nodes if n not in model.latent]
    X = np.transpose(X, [kept.index(n) for n in model.observed])
    return S, X
