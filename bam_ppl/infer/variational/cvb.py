"""Collapsed variational Bayes (CVB0) for allocation models.

Θ and λ are integrated out, as in the Pólya urn (Cemgil et al. 2019 §4.1, eq. 4.1), and each token keeps
a distribution Φ[u, ·] over the free configurations of its cell u. CVB0 (the zeroth-order
collapsed update, Asuncion et al. 2009) sets

    Φ[u, l] ∝ Π_m  (α + N − own)(f_m(u, l)) / (α + N − own)_col(c_m(u, l)),

the urn probability of configuration l given every other token, with the expected family counts
N = Σ_u X_u Φ[u, ·] standing in for the counts and ``own`` the token's own expected contribution
removed (the cell's other X_u − 1 tokens stay in N). Members sharing a tied table add the
within-token increment of the urn, as in eq. 4.1 applied to App. E. All cells are updated
together from the previous sweep's counts, at O(nnz × configurations × members) per sweep.

Per sweep the run records the training log-likelihood under the posterior-mean tables and the
ELBO of eq. D.1 at the current Φ (a valid lower bound on log L_X for any Φ, though CVB0 does
not maximise it). The registry adapter is :func:`cvb` (``method="cvb"``).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...convert import allocation_inference_data
from ...models.allocation import AllocationModel
from ...parallel import best_index, chain_keys, restart_layout
from ...types import Array
from ...validation import check_int, renamed_options
from ..prepare import prepare
from ..registry import register
from .vb import (
    INITS,
    LOG_THETA_INITS,
    CellProblem,
    build_problem,
    check_options,
    column_sums,
    elbo_value,
    initial_values,
    iterate,
    member_column_gather,
    member_gather,
    member_indices,
    normalise_responsibilities,
    posterior_draws,
    scatter_to_tables,
    show_progress,
    sum_over_members,
    training_log_likelihood,
)


class CVBProblem(NamedTuple):
    """A :class:`CellProblem` plus, per member, which configurations share a table entry.

    ``flat_group[m, l]`` (``col_group[m, l]``) numbers the distinct values of
    ``config_flat[m, l]`` (``config_col[m, l]``): configurations in one group hit the same table
    entry (column) of member m within any cell, so a token's own contribution there is the sum
    of its Φ over the group.
    """

    cells: CellProblem
    flat_group: Array
    col_group: Array


def build_cvb_problem(bound, data, layout) -> CVBProblem:
    """Device arrays of a :class:`CVBProblem` (call under ``jax.enable_x64(True)``)."""
    def groups(offsets):
        return np.stack([np.unique(row, return_inverse=True)[1].reshape(-1) for row in offsets])

    return CVBProblem(build_problem(bound, data, layout), jnp.asarray(groups(layout.config_flat)),
                      jnp.asarray(groups(layout.config_col)))


class CVBState(NamedTuple):
    """One restart: responsibilities, expected family counts and the last sweep's monitors."""

    phi: Array
    expected: Array
    training_log_likelihood: Array
    elbo: Array
    iteration: Array
    converged: Array


def init(problem: CVBProblem, phi: Array) -> CVBState:
    """State for given initial responsibilities Φ (monitors start at −inf)."""
    cells = problem.cells
    expected = scatter_to_tables(cells, cells.counts[:, None] * phi)
    start = jnp.full((), -jnp.inf, expected.dtype)
    return CVBState(phi, expected, start, start, jnp.zeros((), jnp.int32), jnp.zeros((), bool))


def init_from_log_theta(problem: CVBProblem, log_theta: Array) -> CVBState:
    """Φ ∝ Π_m θ for a drawn θ (``init="tables"`` or ``"dirichlet"``)."""
    phi, _ = normalise_responsibilities(problem.cells, sum_over_members(problem.cells, log_theta))
    return init(problem, phi)


def _group_sum(phi: Array, group: Array) -> Array:
    """For every configuration l, Σ_{l' in l's group} Φ[:, l'] (groups number at most L)."""
    num = phi.shape[1]
    summed = jax.ops.segment_sum(phi.T, group, num_segments=num)
    return summed[group].T


def own_contributions(problem: CVBProblem, phi: Array, member_table: tuple[int, ...]):
    """A token's own expected count at every member's table entry and column, each (M, U, L).

    Members of one tied table also receive the counts the token puts there through the other
    members (same entry in the same cell, compared elementwise).
    """
    cells = problem.cells
    num_members = len(member_table)
    own_flat = [_group_sum(phi, problem.flat_group[m]) for m in range(num_members)]
    own_col = [_group_sum(phi, problem.col_group[m]) for m in range(num_members)]
    for m in range(num_members):
        flat_m, col_m = member_indices(cells, m)
        for k in range(num_members):
            if k == m or member_table[k] != member_table[m]:
                continue
            flat_k, col_k = member_indices(cells, k)
            same_flat = flat_k[:, None, :] == flat_m[:, :, None]  # (U, L of m, L of k)
            same_col = col_k[:, None, :] == col_m[:, :, None]
            own_flat[m] = own_flat[m] + jnp.einsum("ulk,uk->ul", same_flat, phi)
            own_col[m] = own_col[m] + jnp.einsum("ulk,uk->ul", same_col, phi)
    return own_flat, own_col


def collapsed_log_potential(problem: CVBProblem, state: CVBState, member_table: tuple[int, ...]) -> Array:
    """log of the CVB0 urn probability of every (cell, configuration), unnormalised."""
    cells = problem.cells
    counts = cells.alpha + state.expected
    col_counts = cells.alpha_col + column_sums(cells, state.expected)
    own_flat, own_col = own_contributions(problem, state.phi, member_table)
    log_potential = 0.0
    for m in range(len(member_table)):
        # Removing the token's own share can only round below the prior pseudo-count.
        numerator = jnp.maximum(member_gather(cells, m, counts) - own_flat[m],
                                member_gather(cells, m, cells.alpha))
        denominator = jnp.maximum(member_column_gather(cells, m, col_counts) - own_col[m],
                                  member_column_gather(cells, m, cells.alpha_col))
        for k in range(m):
            if member_table[k] == member_table[m]:
                # Within one token, an earlier member of the same table has already added its
                # draw to the urn (eq. 4.1 with tied tables, App. E).
                flat, col = member_indices(cells, m)
                flat_k, col_k = member_indices(cells, k)
                numerator = numerator + (flat_k == flat)
                denominator = denominator + (col_k == col)
        log_potential = log_potential + jnp.log(numerator) - jnp.log(denominator)
    return log_potential


def step(problem: CVBProblem, state: CVBState, num_iters, tol, member_table: tuple[int, ...]) -> CVBState:
    """One synchronous CVB0 sweep over all cells, then the monitors.

    A restart stops once the relative change of its training log-likelihood is at most ``tol``
    or after ``num_iters`` sweeps.
    """
    cells = problem.cells
    phi, log_phi = normalise_responsibilities(cells, collapsed_log_potential(problem, state, member_table))
    expected = scatter_to_tables(cells, cells.counts[:, None] * phi)
    alpha_hat = cells.alpha + expected
    loglik = training_log_likelihood(cells, alpha_hat)
    elbo = elbo_value(cells, alpha_hat, phi, log_phi)
    converged = jnp.abs(loglik - state.training_log_likelihood) <= tol * jnp.abs(loglik)
    new = CVBState(phi, expected, loglik, elbo, state.iteration + 1, converged)
    active = ~state.converged & (state.iteration < num_iters)
    return jax.tree.map(lambda n, o: jnp.where(active, n, o), new, state)


def _run_chunk(problem, states, num_iters, tol, length, member_table):
    def body(states, _):
        states = jax.vmap(step, in_axes=(None, 0, None, None, None))(problem, states, num_iters, tol,
                                                                      member_table)
        return states, (states.training_log_likelihood, states.elbo)

    return jax.lax.scan(body, states, None, length=length)


_init_phi = jax.jit(jax.vmap(init, in_axes=(None, 0)))
_init_log_theta = jax.jit(jax.vmap(init_from_log_theta, in_axes=(None, 0)))
_run_chunk_jit = jax.jit(_run_chunk, static_argnames=("length", "member_table"))


class CVBResult(NamedTuple):
    """Every restart's final expected counts and monitor traces (float64 host arrays)."""

    expected: np.ndarray
    log_likelihood_trace: np.ndarray
    elbo_trace: np.ndarray
    training_log_likelihood: np.ndarray
    elbo: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray

def run(init_keys, problem: CVBProblem, member_table: tuple[int, ...], *, num_iters: int, tol: float,
        init: str = "tables", progress_bar: bool = False) -> CVBResult:
    """Run one vmapped CVB0 restart per key of ``init_keys`` (call under ``jax.enable_x64(True)``)."""
    start = jnp.asarray(initial_values(init, init_keys, problem.cells))
    states = _init_log_theta(problem, start) if init in LOG_THETA_INITS else _init_phi(problem, start)

    def run_chunk(problem, states, num_iters, tol, length):
        return _run_chunk_jit(problem, states, num_iters, tol, length=length, member_table=member_table)

    states, (loglik_trace, elbo_trace) = iterate(run_chunk, problem, states, num_iters=num_iters,
                                                 tol=tol, progress_bar=progress_bar, desc="cvb")
    return CVBResult(np.asarray(states.expected), np.asarray(loglik_trace), np.asarray(elbo_trace),
                     np.asarray(states.training_log_likelihood), np.asarray(states.elbo),
                     np.asarray(states.iteration), np.asarray(states.converged))


@register("cvb", models=(AllocationModel,))
@restart_layout("chain", "final_elbo")
@renamed_options(num_restarts="num_chains")
def cvb(model, data, *, rng_key=0, num_iters: int = 1000, tol: float = 1e-8, num_chains: int = 1,
        init: str = "tables", num_samples: int = 200, progress_bar: bool | None = None,
        _first_chain: int = 0):
    """Collapsed variational Bayes (CVB0) over each cell's latent configurations.

    The arguments are those of :func:`bam_ppl.infer.variational.vb.vb`; these differ:

    Parameters
    ----------
    num_iters : int
        Maximum number of sweeps per restart.
    tol : float
        Stop a restart when the relative change of its training log-likelihood is at most
        ``tol`` (0: run all ``num_iters``).
    num_chains : int
        Independent initialisations (restarts; formerly ``num_restarts``) run side by side; the
        posterior comes from the restart with the highest final ELBO.
    init : {"tables", "responsibilities", "dirichlet"}
        Initial Φ ∝ Π θ with θ ~ Dirichlet(3) per column, Φ ~ flat Dirichlet per cell, or
        Φ ∝ Π θ with θ ~ Dirichlet(α + 0.1) (:data:`~bam_ppl.infer.variational.vb.INITS`).
    num_samples : int
        Draws of θ from Dirichlet(α + N) of the best restart (and of λ from Gamma(a + T, b + 1)).
    progress_bar : bool or None
        tqdm bar over sweeps; ``None`` shows one for long runs only.

    Returns
    -------
    InferenceData
        ``posterior``: ``theta_<table>`` (one chain, the best restart) and ``total_rate``.
        ``sample_stats``: ``training_log_likelihood`` and ``elbo`` per sweep (chain = restart,
        iteration), ``final_elbo``, ``final_training_log_likelihood``, ``iterations`` and
        ``converged`` per restart; ``attrs["best_restart"]``.
    """
    key = check_options(rng_key, num_iters, tol, num_chains, init, progress_bar, INITS, _first_chain)
    check_int(num_samples, "num_samples")
    data, bound, layout, _ = prepare(model, data, algorithm="variational inference")
    show = show_progress(progress_bar, layout, data, num_chains, num_iters)
    member_table = tuple(int(t) for t in layout.member_table)
    with jax.enable_x64(True):
        problem = build_cvb_problem(bound, data, layout)
        init_keys, draw_keys = chain_keys(key, num_chains, _first_chain, parts=2)
        result = run(init_keys, problem, member_table, num_iters=num_iters, tol=tol, init=init, progress_bar=show)
    best = best_index(result.elbo)
    if not bool(result.converged[best]):
        warnings.warn(
            f"cvb stopped after num_iters={num_iters} sweeps before the relative change of the "
            f"training log-likelihood fell below tol={tol}; raise num_iters (or tol) for a converged fit",
            UserWarning, stacklevel=3)
    alpha_hat = bound.flat_concentration + result.expected[best]
    theta, rate = posterior_draws(draw_keys[best], bound, alpha_hat, num_samples)
    stats = {
        "training_log_likelihood": (("chain", "iteration"), result.log_likelihood_trace),
        "elbo": (("chain", "iteration"), result.elbo_trace),
        "final_training_log_likelihood": (("chain",), result.training_log_likelihood),
        "final_elbo": (("chain",), result.elbo),
        "iterations": (("chain",), result.iterations),
        "converged": (("chain",), result.converged),
    }
    return allocation_inference_data(
        bound, data, theta=theta, total_rate=rate, method="cvb", sample_stats=stats,
        attrs=dict(best_restart=_first_chain + best, best_elbo=float(result.elbo[best]),
                   num_restarts=num_chains, num_iters=num_iters, tol=tol, init=init),
    )
