"""An allocation model as a NumPyro program (Cemgil et al. 2019 eq. 3.3–3.4).

λ ~ Gamma(a, b); every table column θ_{n|pa(n)}(:, i_pa) ~ Dirichlet(α_fa(n)(:, i_pa));
X(i_V) ~ Poisson(λ p(i_V)) with p(i_V) = Σ_latent ∏_n θ.

Two forms of the likelihood, with the same joint density:

* **dense** (default for fully observed data of at most :data:`DENSE_LIMIT` cells): one observed
  site ``X`` over every cell, Poisson(λ p) — or, under ``condition_on``, one Multinomial per
  conditioned cell with ``X`` reshaped to ``(*conditioned sizes, remaining cells)``. Then
  ``numpyro.infer.log_likelihood`` and ``az.from_numpyro`` find exactly one pointwise
  log-likelihood array.
* **sparse** (``dense=False``, used by ``bam.infer(..., method="nuts"/"svi")``, and always with
  missing entries): only nonzero cells are evaluated; the zero cells contribute
  exp(−λ (1 − Σ_nonzero p)) in closed form (site ``X_zero_cells``), because p sums to one. Under
  ``condition_on`` the multinomial is written as the same Poisson sites plus a closed-form
  correction (Poisson–multinomial identity, eq. 3.12). The cost scales with the nonzero cells.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import gammaln

from ..data import CountTensor

DENSE_LIMIT = 100_000
"""Largest number of cells for which ``program(X)`` uses the dense likelihood by default."""


def cell_probabilities(flat_theta, layout) -> jnp.ndarray:
    """p(observed values of each cell) = Σ over free configurations of ∏ table entries."""
    idx = layout.cell_flat[:, :, None] + layout.config_flat[:, None, :]
    prod = jnp.prod(flat_theta[idx], axis=0)
    if layout.valid is not None:
        prod = jnp.where(layout.valid, prod, 0.0)
    return prod.sum(-1)


def _all_cells(shape) -> CountTensor:
    idx = np.stack(np.unravel_index(np.arange(int(np.prod(shape))), shape), axis=1)
    return CountTensor(idx, np.ones(len(idx), dtype=np.int64), shape)


def _conditioned_groups(model, data: CountTensor) -> np.ndarray:
    pos = [model.observed.index(c) for c in model.condition_on]
    _, inv = np.unique(data.indices[:, pos], axis=0, return_inverse=True)
    return inv.reshape(-1)


def make_program(model):
    """Build ``program(X=None, *, shape=None, total=None, dense=None)`` for an :class:`AllocationModel`.

    ``dense`` chooses the form of the likelihood (module docstring); ``None`` means dense for fully
    observed data with at most :data:`DENSE_LIMIT` cells.
    """

    def program(X=None, *, shape=None, total=None, dense=None):
        if X is not None:
            data = model.as_data(X)
            bound = model.bind(data)
        else:
            if shape is None:
                raise ValueError("program(X=None) needs shape= (sizes of the visible nodes)")
            data = None
            T = None if model.condition_on else total
            if T is None and model.b is None and not model.condition_on:
                raise ValueError(
                    "program(X=None, shape=...) on a model with b=None needs total= (the number of "
                    "tokens T, which sets b = a / T as fitting did; for posterior predictive draws "
                    "pass the observed total, e.g. Predictive(program, samples)(key, shape=X.shape, "
                    "total=X.sum())), or a model with b set explicitly")
            bound = model.bind(shape=shape, total=T)
        if bound.has_total_term:
            rate = numpyro.sample("total_rate", dist.Gamma(bound.a, bound.b))
        thetas = [
            numpyro.sample(f"theta_{t.name}", dist.Dirichlet(jnp.asarray(t.concentration)))
            for t in bound.tables
        ]
        flat_theta = jnp.concatenate([th.reshape(-1) for th in thetas])
        if data is None:
            return _draw(model, bound, flat_theta, rate if bound.has_total_term else None, shape, total)
        if dense is None:
            dense = not data.has_missing and int(np.prod(data.shape)) <= DENSE_LIMIT
        elif dense and data.has_missing:
            raise ValueError("program(X, dense=True) needs fully observed X; use dense=False")
        if dense:
            _dense_likelihood(model, bound, data, flat_theta, rate if bound.has_total_term else None)
            return None
        layout = bound.cell_layout(data)
        p = cell_probabilities(flat_theta, layout)
        counts = jnp.asarray(data.counts)
        if bound.has_total_term:
            numpyro.sample("X", dist.Poisson(rate * p), obs=counts)
            numpyro.factor("X_zero_cells", -rate * (1.0 - p.sum()))
        else:
            group = _conditioned_groups(model, data)
            n = np.bincount(group, weights=data.counts).astype(np.float64)
            n_cell = jnp.asarray(n[group])
            numpyro.sample("X", dist.Poisson(n_cell * p), obs=counts)
            # Poisson(n_c p) on the nonzero cells -> multinomial(n_c, p) given each group's total.
            correction = (n_cell * p).sum() + jnp.sum(gammaln(n + 1.0) - n * jnp.log(n))
            numpyro.factor("X_multinomial_correction", correction)
        return None

    program.__name__ = "allocation_model"
    program.__doc__ = f"NumPyro program of {model!r}"
    return program


def _dense_likelihood(model, bound, data, flat_theta, rate):
    """One observed site ``X``: Poisson over every cell, or one Multinomial per conditioned cell."""
    shape = tuple(data.shape)
    layout = bound.cell_layout(_all_cells(shape))
    p = cell_probabilities(flat_theta, layout).reshape(shape)
    X = data.to_dense()
    if rate is not None:
        numpyro.sample("X", dist.Poisson(rate * p), obs=jnp.asarray(X))
        return
    cond_axes = [model.observed.index(c) for c in model.condition_on]
    rest_axes = [i for i in range(len(shape)) if i not in cond_axes]
    order = cond_axes + rest_axes
    cond_shape = tuple(shape[i] for i in cond_axes)
    p_c = jnp.transpose(p, order).reshape(*cond_shape, -1)
    x_c = np.transpose(X, order).reshape(*cond_shape, -1)
    numpyro.sample("X", dist.Multinomial(total_count=jnp.asarray(x_c.sum(-1)), probs=p_c),
                   obs=jnp.asarray(x_c))


def _draw(model, bound, flat_theta, rate, shape, total):
    grid = _all_cells(tuple(shape))
    layout = bound.cell_layout(grid)
    p = cell_probabilities(flat_theta, layout).reshape(tuple(shape))
    if rate is not None:
        return numpyro.sample("X", dist.Poisson(rate * p))
    if total is None:
        raise ValueError("program(X=None) under condition_on needs total= (tokens per conditioned cell)")
    cond_axes = [model.observed.index(c) for c in model.condition_on]
    rest_axes = [i for i in range(len(shape)) if i not in cond_axes]
    p_c = jnp.transpose(p, cond_axes + rest_axes)
    cond_shape = p_c.shape[: len(cond_axes)]
    p_c = p_c.reshape(*cond_shape, -1)
    n = jnp.broadcast_to(jnp.asarray(total), cond_shape)
    draws = numpyro.sample("X", dist.Multinomial(total_count=n, probs=p_c))
    draws = draws.reshape(*cond_shape, *[shape[i] for i in rest_axes])
    return jnp.transpose(draws, np.argsort(cond_axes + rest_axes))
