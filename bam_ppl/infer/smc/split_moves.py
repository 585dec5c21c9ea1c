"""Metropolis–Hastings moves of whole cells' splits for the tempered targets γ_β ∝ q^(1−β) p^β.

The Gibbs sweeps of the tempered SMC redraw one token at a time, so on a table whose few cells hold
hundreds of tokens each a sweep costs a draw per token and moves a cell's split among its
configurations by about one token. These moves redraw every cell's split at once, at a cost of a
draw per table entry and per cell and configuration, whatever the number of tokens:

* the data-augmentation step (Tanner & Wong 1987; ``bam_ppl.infer.gibbs.augmented_numba``),
  θ | S ~ p(θ | S, X), then S'_u | θ ~ Multinomial(X_u, p(· | u, θ)), is reversible with respect to
  p(S | X), so as a proposal for γ_β it is accepted with probability
  min(1, [(q / p)(S') / (q / p)(S)]^(1−β)): always at β = 1;
* a draw from the reference itself, S'_u ~ Multinomial(X_u, q_u), is an independence proposal
  accepted with probability min(1, [(p / q)(S') / (p / q)(S)]^β): always at β = 0.

Both act on the cells' counts n_ul (q and p depend on the tokens through them alone; the multinomial
coefficients of the counts cancel from both ratios); a changed cell's tokens then take a uniformly random
arrangement of its new split, as the target, exchangeable within a cell, has them.
p(S, X) is the product of the tables' Dirichlet-multinomial terms (Cemgil et al. 2019 eq. 2.9), read
from the VB kernel's arrays (``bam_ppl.infer.variational.vb_numba.HostProblem``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..gibbs.augmented_numba import (
    _cell_conditional,
    _draw_log_tables,
    _draw_split,
    posterior_concentration,
    split_draws,
)

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None


class SplitProblem(NamedTuple):
    """The cells' arrays (``cells``, a ``HostProblem``) and where the tempered problem keeps the tokens: each
    token's cell, the cells' token ranges, and the rows a token's configuration increments."""

    cells: tuple
    token_cell: np.ndarray
    cell_start: np.ndarray
    row_base: np.ndarray
    row_offset: np.ndarray
    moved: np.ndarray


def split_problem(cells, tp) -> SplitProblem:
    """The :class:`SplitProblem` of the cells ``cells`` and the tempered problem ``tp``."""
    return SplitProblem(cells, tp.token_cell, tp.cell_start, tp.row_base, tp.row_offset, tp.moved)


class SplitMoveWork(NamedTuple):
    """Work arrays of one block of particles: the current and proposed splits (U, L), the tables' log θ,
    their columns' totals, one cell's probabilities, the accepted moves of each kind (2,), and one cell's
    configurations still to place (L,)."""

    split: np.ndarray
    proposed: np.ndarray
    log_theta: np.ndarray
    column: np.ndarray
    probability: np.ndarray
    accepted: np.ndarray
    left: np.ndarray


def split_move_work(cells) -> SplitMoveWork:
    """:class:`SplitMoveWork` for the cells ``cells`` (a ``HostProblem``)."""
    num_cells, num_configs = cells.valid.shape
    return SplitMoveWork(np.zeros((num_cells, num_configs), np.int64), np.zeros((num_cells, num_configs), np.int64),
                         np.empty(cells.alpha.shape[0]), np.empty(cells.num_columns), np.empty(num_configs),
                         np.zeros(2, np.int64), np.zeros(num_configs, np.int64))


def split_move_draws(cells) -> int:
    """Random numbers one pair of moves draws: a Gamma per table entry, and for each proposal at most
    min(X_u, L_u) binomials per cell (L_u the configurations it allows)."""
    return int(cells.alpha.size + 2 * split_draws(cells))


def _log_joint(split, cells, log_theta, column) -> float:
    """log p(S, X) up to a constant: Σ_entries lnΓ(α + n) − Σ_columns lnΓ(Σα + N), n the tables' counts of
    ``split``; ``log_theta`` and ``column`` are work arrays."""
    posterior_concentration(split, cells, log_theta)
    column[:] = 0.0
    total = 0.0
    for f in range(cells.alpha.shape[0]):
        total += math.lgamma(log_theta[f])
        column[cells.column_of[f]] += log_theta[f]
    for c in range(cells.num_columns):
        total -= math.lgamma(column[c])
    return total


def _log_reference(split, log_q) -> float:
    """log q(S) = Σ_(u, l) n_ul log q_ul."""
    total = 0.0
    for u in range(split.shape[0]):
        for l in range(split.shape[1]):
            if split[u, l] > 0:
                total += split[u, l] * log_q[u, l]
    return total


def reference_probabilities(cells, log_q) -> np.ndarray:
    """q (U, L) from its log ``log_q``, 0 where a cell does not allow a configuration, each cell's row summing to 1."""
    q = np.zeros(log_q.shape)
    for u in range(q.shape[0]):
        norm = 0.0
        for l in range(q.shape[1]):
            if cells.valid[u, l]:
                q[u, l] = math.exp(log_q[u, l])
                norm += q[u, l]
        for l in range(q.shape[1]):
            q[u, l] /= norm
    return q


def _propose(rng, kind, work, cells, q) -> None:
    """Into ``work.proposed``: kind 0 the data-augmentation step from ``work.split``, kind 1 a draw from q."""
    U = work.split.shape[0]
    if kind == 0:
        _draw_log_tables(rng, work.split, cells, work.log_theta, work.column)
    for u in range(U):
        if kind == 0:
            _cell_conditional(u, cells, work.log_theta, work.probability)
            _draw_split(rng, int(cells.counts[u]), work.probability, work.proposed[u])
        else:
            _draw_split(rng, int(cells.counts[u]), q[u], work.proposed[u])


def split_moves(rng, beta, num_pairs, work, cells, log_q, q) -> tuple:
    """``num_pairs`` pairs of moves (a data-augmentation proposal, then a draw from q, given also as
    :func:`reference_probabilities`) of the split ``work.split`` under γ_β, in place; ``work.accepted`` counts
    the accepted ones of each kind. Returns the changes of log p(S, X) and of log q(S)."""
    log_p = _log_joint(work.split, cells, work.log_theta, work.column)
    log_ref = _log_reference(work.split, log_q)
    start_p, start_ref = log_p, log_ref
    for _ in range(num_pairs):
        for kind in range(2):
            _propose(rng, kind, work, cells, q)
            new_p = _log_joint(work.proposed, cells, work.log_theta, work.column)
            new_ref = _log_reference(work.proposed, log_q)
            if kind == 0:
                log_ratio = (1.0 - beta) * ((new_ref - new_p) - (log_ref - log_p))
            else:
                log_ratio = beta * ((new_p - new_ref) - (log_p - log_ref))
            if log_ratio >= 0.0 or rng.random() < math.exp(log_ratio):
                for u in range(work.split.shape[0]):  # a loop: a slice copy compiles numba's shape checks
                    for c in range(work.split.shape[1]):
                        work.split[u, c] = work.proposed[u, c]
                log_p, log_ref = new_p, new_ref
                work.accepted[kind] += 1
    return log_p - start_p, log_ref - start_ref


def _split_of(config, token_cell, split) -> None:
    split[:, :] = 0
    for t in range(config.shape[0]):
        split[token_cell[t], config[t]] += 1


def _place_split(rng, work, config, counts, problem) -> None:
    """Give the tokens of every cell whose split ``work.split`` changed a uniformly random arrangement of it,
    moving each changed token's increments in ``counts`` (α + counts, kernel numbering); ``problem`` is the
    :class:`SplitProblem`.
    γ_β is exchangeable within a cell, so given a split its arrangement is uniform: the move keeps γ_β over the
    tokens, not only over the splits, and the Gibbs sweeps may visit the tokens in a fixed order. A cell whose
    split stayed keeps its arrangement, uniform given that split whatever the proposals did."""
    split, left = work.split, work.left
    cell_start, row_base, row_offset, moved = problem.cell_start, problem.row_base, problem.row_offset, problem.moved
    for u in range(split.shape[0]):
        left[:] = 0
        for t in range(cell_start[u], cell_start[u + 1]):
            left[config[t]] += 1
        changed = False
        for l in range(split.shape[1]):
            if left[l] != split[u, l]:
                changed = True
            left[l] = split[u, l]
        if not changed:
            continue
        for t in range(cell_start[u], cell_start[u + 1]):  # each token from the configurations still to place
            pick = int(rng.random() * (cell_start[u + 1] - t))
            l = 0
            while pick >= left[l]:
                pick -= left[l]
                l += 1
            left[l] -= 1
            old = config[t]
            if old != l:
                for m in moved:
                    counts[row_base[m, u] + row_offset[m, old]] -= 1.0
                    counts[row_base[m, u] + row_offset[m, l]] += 1.0
                config[t] = l


def split_moves_block(rng, block, beta, num_pairs, particles, problem, log_q, work) -> None:
    """:func:`split_moves` for particles ``block`` = (first, stop) of ``particles`` (the tempered kernel's
    ``ParticleArrays``), whose log L and log start take the changes of log p and log q; ``problem`` is a
    :class:`SplitProblem`."""
    q = reference_probabilities(problem.cells, log_q)
    for p in range(block[0], block[1]):
        _split_of(particles.config[p], problem.token_cell, work.split)
        change_p, change_ref = split_moves(rng, beta, num_pairs, work, problem.cells, log_q, q)
        if change_p != 0.0 or change_ref != 0.0:
            _place_split(rng, work, particles.config[p], particles.shifted[p], problem)
            particles.log_like[p] += change_p
            particles.log_start[p] += change_ref


if numba is not None:
    _log_joint = numba.njit(nogil=True, cache=True)(_log_joint)
    _log_reference = numba.njit(nogil=True, cache=True)(_log_reference)
    reference_probabilities = numba.njit(nogil=True, cache=True)(reference_probabilities)
    _propose = numba.njit(nogil=True, cache=True)(_propose)
    split_moves = numba.njit(nogil=True, cache=True)(split_moves)
    _split_of = numba.njit(nogil=True, cache=True)(_split_of)
    _place_split = numba.njit(nogil=True, cache=True)(_place_split)
    split_moves_block = numba.njit(nogil=True, cache=True)(split_moves_block)
