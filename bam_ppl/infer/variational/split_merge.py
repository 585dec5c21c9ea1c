"""Merge-and-birth moves for VB fits: a way out of the local optima of coordinate ascent.

Coordinate ascent stops where one latent value covers two groups of the data while two other values share one;
no update of one factor at a time leaves such an optimum. A move does the two at once, as the split-and-merge EM
of Ueda, Nakano, Ghahramani & Hinton (2000) and the birth and merge moves of VB (Hughes & Sudderth 2013) do: it
merges value b of a latent node into value a, and gives b a new start at a seed cell, drawn by its count: a share
of the responsibilities of every cell that shares a coordinate with the seed moves to b. VB runs from each move of
a round (screened, as the restarts are); the fit takes the best where its ELBO is higher, and stops after a round
that finds none. The ELBO only rises, so the fit's lower bound on log p(X) only tightens.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from scipy.special import digamma

from ...types import numpy_generator
from ..smc.symmetry import configs_with_node
from . import vb, vb_numba

# Iterations after which a round's moves are screened (the best runs on): a move changes two values of a converged
# fit, and the others start at their optimum.
SCREEN_ITERS = 50


class MoveProblem(NamedTuple):
    """What the moves of one model and data set read: the VB ``problem`` and its ``host`` arrays; the cells'
    ``layout`` (its free configurations) and ``sizes`` their nodes' sizes; ``latent`` the positions of the
    latent nodes with two values or more; ``coords`` (U, D) every cell's visible coordinates (−1 where missing)."""

    problem: vb.CellProblem
    host: vb_numba.HostProblem
    layout: object
    sizes: tuple
    latent: tuple
    coords: np.ndarray


def move_problem(bound, data, layout, problem: vb.CellProblem) -> MoveProblem:
    """The :class:`MoveProblem` of ``data`` under ``bound`` (``problem``: :func:`~bam_ppl.infer.variational.vb.build_problem`'s)."""
    sizes = tuple(bound.sizes[name] for name in layout.free)
    latent = tuple(p for p, name in enumerate(layout.free) if name in bound.model.latent and sizes[p] > 1)
    return MoveProblem(problem, vb_numba.host_problem(problem), layout, sizes, latent,
                       np.asarray(data.indices))


def responsibilities(host: vb_numba.HostProblem, log_weights: np.ndarray) -> np.ndarray:
    """(U, L) q(S) of every cell given E log θ = ``log_weights`` (the q(S) update of eq. D.1)."""
    potential = np.zeros(host.valid.shape)
    for m in range(host.cell_flat.shape[0]):
        potential += host.mask[m][:, None] * log_weights[host.cell_flat[m][:, None] + host.config_flat[m][None, :]]
    potential = np.where(host.valid, potential, -np.inf)
    phi = np.exp(potential - potential.max(axis=1, keepdims=True))
    return phi / phi.sum(axis=1, keepdims=True)


def states_from(host: vb_numba.HostProblem, phis: list) -> vb.VBState:
    """VB states (one per responsibilities (U, L) of ``phis``) with q(θ) = Dirichlet(α + E_Φ S), as
    :func:`~bam_ppl.infer.variational.vb.init_from_responsibilities` makes them, on host arrays."""
    alpha_hat = np.empty((len(phis), host.alpha.size))
    for k, phi in enumerate(phis):
        weighted = host.counts[:, None] * phi
        expected = np.zeros(host.alpha.size)
        for m in range(host.cell_flat.shape[0]):
            np.add.at(expected, host.cell_flat[m][:, None] + host.config_flat[m][None, :], host.mask[m][:, None] * weighted)
        alpha_hat[k] = host.alpha + expected
    return fresh_states(host, alpha_hat)


def fresh_states(host: vb_numba.HostProblem, alpha_hat: np.ndarray) -> vb.VBState:
    """VB states at q(θ) = Dirichlet(``alpha_hat``) (rows: states), before their first iteration."""
    num = alpha_hat.shape[0]
    column = np.stack([np.bincount(host.column_of, row, host.num_columns) for row in alpha_hat])
    log_weights = digamma(alpha_hat) - digamma(column)[:, host.column_of]
    return vb.VBState(log_weights, np.array(alpha_hat, np.float64), np.full(num, -np.inf), np.zeros(num, np.int32),
                      np.zeros(num, bool))


def merge_and_birth(mp: MoveProblem, phi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One move (module docstring) of the responsibilities ``phi`` (U, L): a latent node and two of its values, b
    merged into a, drawn uniformly; a seed cell drawn by its count; a uniform share of its neighbours'
    responsibilities moved to b. The share is drawn rather than set: how much of the seed's group b must take to
    stay a group of its own differs from table to table."""
    position = mp.latent[rng.integers(len(mp.latent))]
    a, b = rng.choice(mp.sizes[position], size=2, replace=False)
    value = mp.layout.configs[:, position]
    new = phi.copy()
    np.add.at(new, (slice(None), configs_with_node(mp.layout, mp.sizes, position, a)[value == b]), phi[:, value == b])
    new[:, value == b] = 0.0
    seed = rng.choice(len(mp.host.counts), p=mp.host.counts / mp.host.counts.sum())
    near = np.any((mp.coords == mp.coords[seed]) & (mp.coords >= 0), axis=1)
    moved = new * (rng.random() * near)[:, None]
    new -= moved
    np.add.at(new, (slice(None), configs_with_node(mp.layout, mp.sizes, position, b)), moved)
    return new


def improve(mp: MoveProblem, alpha_hat: np.ndarray, rng: np.random.Generator, moves_per_round: int,
            screen_iters: int) -> tuple[np.ndarray, float]:
    """The fit q(θ) = Dirichlet(``alpha_hat``) run to its optimum, then moved by rounds of ``moves_per_round``
    moves (:func:`merge_and_birth`, screened after ``screen_iters`` iterations, the best run on) while a round finds
    a higher optimum: an ELBO above what ``NUM_ITERS`` more iterations of the fit could add at ``TOL``; its α̂ and
    ELBO."""
    fit = vb.run_from(fresh_states(mp.host, alpha_hat[None]), mp.problem, num_iters=vb.NUM_ITERS, tol=vb.TOL,
                      engine="numba")
    alpha_hat, elbo = fit.alpha_hat[0], float(fit.elbo[0])
    if not mp.latent or moves_per_round == 0:
        return alpha_hat, elbo
    while True:
        phi = responsibilities(mp.host, fresh_states(mp.host, alpha_hat[None]).log_weights[0])
        moved = vb.run_screened(states_from(mp.host, [merge_and_birth(mp, phi, rng) for _ in range(moves_per_round)]),
                                mp.problem, num_iters=vb.NUM_ITERS, tol=vb.TOL, progress_bar=False,
                                screen_iters=screen_iters, screen_keep=1, engine="numba")
        best = int(np.argmax(moved.elbo))
        # A higher optimum, not the ascent that further iterations of the fit itself could still make.
        if not moved.elbo[best] > elbo + vb.NUM_ITERS * vb.TOL * abs(elbo):
            return alpha_hat, elbo
        alpha_hat, elbo = moved.alpha_hat[best], float(moved.elbo[best])


# The moves' stream: fold_in(key, MOVE_STREAM), an index that no restart takes (restart r folds in r).
MOVE_STREAM = 2**32 - 1


def moved_fits(fitted: vb.Fitted, indices, num_moves: int, keys) -> list[tuple[np.ndarray, float]]:
    """α̂ and ELBO of each fit in ``indices`` (restarts or starts), moved on by :func:`moved_fit` from its key in
    ``keys``, on one move problem of ``fitted``."""
    mp = move_problem(fitted.bound, fitted.data, fitted.layout, fitted.problem)
    return [moved_fit(mp, fitted, index, num_moves, key) for index, key in zip(indices, keys)]


def moved_fit(mp: MoveProblem, fitted: vb.Fitted, index: int, num_moves: int, key) -> tuple[np.ndarray, float]:
    """α̂ and ELBO of fit ``index`` (a restart or a start) run to its optimum and moved on by rounds of ``num_moves``
    merge-and-birth moves while a round finds a higher optimum (:func:`improve` on the move problem ``mp``, at the
    restarts' defaults ``vb.NUM_ITERS`` and ``vb.TOL`` on the numba kernel, whatever the restarts ran), drawing from
    ``key``; the fit as it ended where that is higher (its optimum, recomputed, may differ from its last
    iterate by rounding)."""
    alpha_hat, elbo = np.asarray(fitted.result.alpha_hat[index]), float(fitted.result.elbo[index])
    with jax.enable_x64(True):
        moved_alpha, moved = improve(mp, alpha_hat, numpy_generator(key), num_moves, SCREEN_ITERS)
    return (moved_alpha, moved) if moved > elbo else (alpha_hat, elbo)


def moved_restarts(fitted: vb.Fitted, num_moves: int, first_chain: int) -> tuple[np.ndarray, np.ndarray]:
    """α̂ (R, ...) and ELBO (R,) of every restart of ``fitted``, each moved on by :func:`moved_fits` (restart r from
    ``fold_in(fold_in(key, MOVE_STREAM), first_chain + r)``, so that a restart run as a task of its own moves alike);
    the restarts as they ended with ``num_moves=0``."""
    result = fitted.result
    if not num_moves:
        return np.asarray(result.alpha_hat), np.asarray(result.elbo, np.float64)
    move_key = jax.random.fold_in(fitted.key, MOVE_STREAM)
    restarts = range(len(result.elbo))
    fits = moved_fits(fitted, restarts, num_moves, [jax.random.fold_in(move_key, first_chain + r) for r in restarts])
    return np.stack([alpha for alpha, _ in fits]), np.array([elbo for _, elbo in fits])
