"""Data-augmentation Gibbs chains (Tanner & Wong 1987) of an allocation model's posterior p(S | X).

The collapsed chain (:mod:`~bam_ppl.infer.gibbs.collapsed_numba`) moves one token at a time, so a
cell holding hundreds of tokens changes its split among the configurations by about one token per
sweep, and each sweep costs a draw per token. This chain keeps the tables θ instead and alternates

    θ | S ~ Π_columns Dirichlet(α + n(S))            (the conjugate update, Cemgil et al. 2019 §2),
    S_u | θ ~ Multinomial(X_u, p(· | u, θ)),  p(l | u, θ) ∝ Π_m θ_m[f_m(u, l)],

for every observed cell u at once: a sweep costs a draw per table entry and per cell and
configuration, however many tokens the cells hold, and moves whole groups of a cell's tokens
between configurations. Both steps leave p(θ, S | X) invariant, so S alone is a chain of p(S | X).
The arrays are those of the VB kernel (:class:`~bam_ppl.infer.variational.vb_numba.HostProblem`).
"""

from __future__ import annotations

import math

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None


def _log_gamma_draw(rng, shape: float) -> float:
    """log of a Gamma(shape, 1) draw, exact for small shapes too: G = G' U^(1/shape) with G' ~
    Gamma(shape + 1) (Marsaglia & Tsang 2000, §6), whose log does not underflow."""
    if shape >= 1.0:
        return math.log(rng.standard_gamma(shape))
    return math.log(rng.standard_gamma(shape + 1.0)) + math.log(1.0 - rng.random()) / shape


def split_draws(cells) -> int:
    """Binomials that drawing every cell's split takes at most: min(X_u, L_u) per cell (L_u the configurations
    it allows)."""
    return int(np.minimum(cells.counts, cells.valid.sum(1)).sum())


def posterior_concentration(split, cells, out) -> None:
    """α + n into ``out``, n the table counts of the cells' splits ``split`` (U, L)."""
    counts, cell_flat, config_flat, valid, mask, alpha, column_of, num_columns, _ = cells
    M, U = cell_flat.shape
    out[:] = alpha
    for u in range(U):
        for l in range(config_flat.shape[1]):
            if split[u, l] > 0:
                for m in range(M):
                    if mask[m, u] > 0.0:
                        out[cell_flat[m, u] + config_flat[m, l]] += split[u, l]


def _draw_log_tables(rng, split, cells, log_theta, column) -> None:
    """log θ ~ Dirichlet(α + n) per column into ``log_theta``, n the table counts of ``split`` (U, L)."""
    alpha, column_of = cells.alpha, cells.column_of
    posterior_concentration(split, cells, log_theta)
    column[:] = -np.inf
    for f in range(alpha.shape[0]):
        log_theta[f] = _log_gamma_draw(rng, log_theta[f])
        c = column_of[f]
        top = max(column[c], log_theta[f])
        column[c] = top + math.log(math.exp(column[c] - top) + math.exp(log_theta[f] - top))
    for f in range(alpha.shape[0]):
        log_theta[f] -= column[column_of[f]]


def _cell_conditional(u, cells, log_theta, probability) -> None:
    """Cell u's conditional p(· | u, θ) into ``probability`` (L,), 0 where a configuration is not allowed."""
    counts, cell_flat, config_flat, valid, mask, alpha, column_of, num_columns, _ = cells
    M, L = cell_flat.shape[0], config_flat.shape[1]
    top = -np.inf
    for l in range(L):
        total = 0.0
        for m in range(M):
            total += mask[m, u] * log_theta[cell_flat[m, u] + config_flat[m, l]]
        probability[l] = total
        if valid[u, l] and total > top:
            top = total
    norm = 0.0
    for l in range(L):
        probability[l] = math.exp(probability[l] - top) if valid[u, l] else 0.0
        norm += probability[l]
    for l in range(L):
        probability[l] /= norm


def _draw_split(rng, size, probability, split_u) -> None:
    """A cell's split of its ``size`` tokens, Multinomial(size, ``probability``), as a sequence of binomials."""
    left, rest = size, 1.0
    for l in range(probability.shape[0]):
        share = min(1.0, probability[l] / rest) if rest > 0.0 else 1.0
        drawn = left if l == probability.shape[0] - 1 or share >= 1.0 else (rng.binomial(left, share) if left > 0 else 0)
        split_u[l] = drawn
        left -= drawn
        rest -= probability[l]


def augmented_sweeps(rng, num_sweeps, skip, split, cells, total) -> int:
    """``num_sweeps`` sweeps from the allocation with cell splits ``split`` (U, L), in place; the
    conditionals p(· | u, θ) of every sweep after the first ``skip`` are added to ``total`` (U, L), an
    average whose expectation is each token's posterior marginal. Returns how many were added."""
    U, L = split.shape
    log_theta = np.empty(cells.alpha.shape[0])
    column = np.empty(cells.num_columns)
    probability = np.empty(L)
    for sweep in range(num_sweeps):
        _draw_log_tables(rng, split, cells, log_theta, column)
        for u in range(U):
            _cell_conditional(u, cells, log_theta, probability)
            if sweep >= skip:
                for l in range(L):
                    total[u, l] += probability[l]
            _draw_split(rng, int(cells.counts[u]), probability, split[u])
    return max(0, num_sweeps - skip)


if numba is not None:
    _log_gamma_draw = numba.njit(inline="always", cache=True)(_log_gamma_draw)
    posterior_concentration = numba.njit(nogil=True, cache=True)(posterior_concentration)
    _draw_log_tables = numba.njit(nogil=True, cache=True)(_draw_log_tables)
    _cell_conditional = numba.njit(nogil=True, cache=True)(_cell_conditional)
    _draw_split = numba.njit(nogil=True, cache=True)(_draw_split)
    augmented_sweeps = numba.njit(nogil=True, cache=True)(augmented_sweeps)
