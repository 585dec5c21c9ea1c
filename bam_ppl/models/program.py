"""An allocation model as a NumPyro program (papers/000 eq. 3.3–3.4).

λ ~ Gamma(a, b); every table column θ_{n|pa(n)}(:, i_pa) ~ Dirichlet(α_fa(n)(:, i_pa));
X(i_V) ~ Poisson(λ p(i_V)) with p(i_V) = Σ_latent ∏_n θ. Only nonzero cells are evaluated: the
zero cells contribute exp(−λ (1 − Σ_nonzero p)) in closed form, because p sums to one. Under
``condition_on`` the likelihood is the multinomial of each conditioned cell's tokens, written as
the same Poisson sites plus a closed-form correction (Poisson–multinomial identity, eq. 3.12).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import gammaln

from ..data import CountTensor


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
    """Build ``program(X=None, *, shape=None, total=None)`` for an :class:`AllocationModel`."""

    def program(X=None, *, shape=None, total=None):
        if X is not None:
            data = model.as_data(X)
            bound = model.bind(data)
        else:
            if shape is None:
                raise ValueError("program(X=None) needs shape= (sizes of the visible nodes)")
            data = None
            T = None if model.condition_on else total
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
