"""MAP-EM for any allocation model (Cemgil et al. 2019 Table 1, "EM": Θ*, λ* ↔ E_P{S}).

EM on the augmented model: the allocation S is the missing data, (Θ, λ) the parameters.

* E-step: for every nonzero cell u and every free configuration l (latent nodes, and visible
  nodes missing in that cell), the responsibility r_ul = ∏_m θ_m(l; u) / Σ_l' ∏_m θ_m(l'; u);
  the expected table counts are E S_fa = Σ_u X_u Σ_l r_ul e_fa(u, l). This is the balance form
  of the KL-NMF multiplicative update (eq. 2.8–2.9).
* M-step: the mode of the Dirichlet posterior given E S (eq. 3.10), θ = (α − 1 + E S) normalised
  per column. The mode is interior only for concentrations ≥ 1, so smaller concentrations are
  rejected; models such as Dirichlet Tucker (Zhang & Linderman) use α > 1 on purpose.

λ separates from Θ (the total T is Poisson(λ) whatever Θ), so its MAP is closed form,
λ* = (a + T − 1) / (b + 1). The objective recorded per iteration is the log posterior density up
to the evidence, log p(X, Θ, λ*), which EM never decreases; the loop, its stopping rule and the
restarts are the shared :mod:`bam_ppl.infer.em_driver`. Cost per iteration:
O(nnz × free configurations × table members).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy
from scipy.special import gammaln as np_gammaln

from ..convert import allocation_inference_data
from ..models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel, BoundModel, CellLayout
from ..parallel import chain_keys, restart_layout
from ..progress import progress, resolve_progress
from ..types import as_key
from ..validation import check_choice, check_int, check_positive, renamed_options
from . import em_driver
from .prepare import prepare
from .registry import register

INITS = ("random", "prior")
LONG_RUN_WORK = 10**9  # cells × configurations × restarts × iterations worth a bar


class EMProblem(NamedTuple):
    """Arrays of the E- and M-steps (float64 inside ``jax.enable_x64``)."""

    index: jax.Array  # (M, U, L) table-entry index of each member, cell and configuration
    valid: jax.Array  # (U, L) configurations allowed by each cell ((1, 1) without missing data)
    counts: jax.Array  # (U,) X of each nonzero cell
    concentration: jax.Array  # (F,) α of every table entry, concatenated
    column_of: jax.Array  # (F,) column of each table entry
    column_size: jax.Array  # (F,) number of entries in the column of each entry
    column_zeros: jax.Array  # (C,) zeros, one per column (fixes the number of columns)
    log_posterior_constant: jax.Array  # terms that do not depend on Θ


def check_concentrations(bound: BoundModel) -> None:
    """MAP needs every Dirichlet concentration ≥ 1: below 1 the density has no interior mode."""
    for table in bound.tables:
        smallest = float(table.concentration.min())
        if smallest < 1.0:
            raise ValueError(
                f"method='map' needs Dirichlet concentrations >= 1, but table {table.name!r} has "
                f"concentration {smallest:.4g}; the posterior mode does not exist there. Set "
                f"priors={{{table.members[0]!r}: 1.1}} (or another value >= 1) or a larger a"
            )


def build_problem(bound: BoundModel, data, layout: CellLayout) -> EMProblem:
    """Arrays for ``data`` under ``bound`` (see :class:`EMProblem`)."""
    alpha = bound.flat_concentration
    column_of = bound.column_of
    column_size = np.concatenate([np.full(t.size, t.shape[-1]) for t in bound.tables])
    index = layout.cell_flat[:, :, None] + layout.config_flat[:, None, :]
    # Dirichlet normalisers Σ_columns [lnΓ(Σα) − Σ lnΓ(α)], and the multinomial coefficient of X
    # given its total (or given each conditioned cell's total), Cemgil et al. 2019 eq. 3.12–3.15.
    constant = np_gammaln(bound.flat_column_concentration).sum() - np_gammaln(alpha).sum()
    constant += bound.conditioned_log_factorials(data) - np_gammaln(data.counts + 1.0).sum()
    if not bound.conditioned:
        # λ* = (a + T − 1)/(b + 1): log Gamma(λ*; a, b) + log Poisson(T; λ*) with the T! of the
        # Poisson cancelling the multinomial's.
        a, b, T = bound.a, bound.b, data.total
        rate = (a + T - 1.0) / (b + 1.0)
        constant += a * np.log(b) - np_gammaln(a) + (a + T - 1.0) * np.log(rate) - (b + 1.0) * rate
    return EMProblem(
        index=index.astype(np.int32),
        valid=np.asarray(layout.valid if layout.valid is not None else np.ones((1, 1), bool)),
        counts=data.counts.astype(np.float64),
        concentration=alpha.astype(np.float64),
        column_of=column_of.astype(np.int32),
        column_size=column_size.astype(np.float64),
        column_zeros=np.zeros(int(bound.column_starts[-1])),
        log_posterior_constant=np.float64(constant),
    )


def _configuration_probabilities(problem: EMProblem, theta, has_valid: bool):
    """p(cell u, configuration l | Θ) = ∏_m θ_m, zero where l contradicts the cell, (U, L)."""
    prob = jnp.prod(theta[problem.index], axis=0)
    return jnp.where(problem.valid, prob, 0.0) if has_valid else prob


def log_posterior(problem: EMProblem, theta, has_valid: bool):
    """log p(X, Θ, λ*) = log-likelihood + Dirichlet log densities (+ the λ terms)."""
    cell_prob = _configuration_probabilities(problem, theta, has_valid).sum(-1)
    return _log_posterior_given_cells(problem, theta, cell_prob)


def _log_posterior_given_cells(problem: EMProblem, theta, cell_prob):
    log_lik = jnp.sum(problem.counts * jnp.log(cell_prob))
    return problem.log_posterior_constant + log_lik + jnp.sum(xlogy(problem.concentration - 1.0, theta))


def _normalise(problem: EMProblem, weights):
    """Columns of ``weights`` scaled to sum to one; an all-zero column becomes uniform."""
    totals = jnp.asarray(problem.column_zeros).at[problem.column_of].add(weights)[problem.column_of]
    return jnp.where(totals > 0, weights / jnp.where(totals > 0, totals, 1.0), 1.0 / problem.column_size)


def em_step(problem: EMProblem, theta, has_valid: bool):
    """One E-step (responsibilities, expected counts) and M-step (Dirichlet mode).

    Returns the updated tables and log p(X, Θ, λ*) of the incoming ``theta``: the E-step's cell
    probabilities are the likelihood's, so the objective costs no second pass.
    """
    prob = _configuration_probabilities(problem, theta, has_valid)
    cell_prob = prob.sum(-1)
    weight = problem.counts[:, None] * prob / cell_prob[:, None]  # X_u r_ul
    members = problem.index.shape[0]
    expected = jnp.zeros_like(theta).at[problem.index.reshape(-1)].add(
        jnp.broadcast_to(weight, (members, *weight.shape)).reshape(-1))
    value = _log_posterior_given_cells(problem, theta, cell_prob)
    return _normalise(problem, problem.concentration - 1.0 + expected), value


def init(problem: EMProblem, key, method: str):
    """Initial tables: columns uniform on the simplex (``"random"``) or drawn from the prior."""
    shape = problem.concentration if method == "prior" else jnp.ones_like(problem.concentration)
    return _normalise(problem, jax.random.gamma(key, shape, dtype=problem.concentration.dtype))


def run(problem: EMProblem, key, *, num_iters, tol, init_method: str, has_valid: bool,
        capacity: int) -> em_driver.EMState:
    """EM from one initialisation with the shared loop (:func:`bam_ppl.infer.em_driver.run`):
    until an iteration gains at most ``tol`` relative log posterior, or ``num_iters`` iterations."""
    return em_driver.run(lambda theta: em_step(problem, theta, has_valid),
                         lambda theta: log_posterior(problem, theta, has_valid),
                         init(problem, key, init_method), num_iters=num_iters, tol=tol, capacity=capacity)


@functools.partial(jax.jit, static_argnames=("init_method", "has_valid", "capacity"))
def _run_restarts(problem, keys, tol, num_iters, init_method, has_valid, capacity):
    return em_driver.run_starts(lambda k: run(problem, k, num_iters=num_iters, tol=tol, init_method=init_method,
                                              has_valid=has_valid, capacity=capacity), keys)


@register("map", models=(AllocationModel,))
@restart_layout("restart", "restart_log_posterior")
@renamed_options(num_restarts="num_chains")
def map_em(model, data, *, rng_key=0, num_iters: int = 1000, tol: float = 1e-8, num_chains: int = 10,
           init: str = "random", max_configs: int = DEFAULT_MAX_CONFIGS, progress_bar: bool | None = None,
           _first_chain: int = 0):
    """MAP estimate of the tables by EM on the augmented model, best of several restarts.

    Parameters
    ----------
    model : AllocationModel
        Every Dirichlet concentration must be ≥ 1 (e.g. ``priors={"k": 1.1, ...}``).
    data : array-like or CountTensor
    rng_key : int or JAX key
    num_iters : int
        Largest number of EM iterations per restart.
    tol : float
        Stop when an iteration raises the log posterior by at most ``tol`` relative to it (>= 0;
        with 0 EM stops only once an iteration gains nothing, or after ``num_iters`` iterations).
    num_chains : int
        Independent initialisations (restarts; formerly ``num_restarts``), vmapped; the one with
        the highest log posterior is kept. Restart r starts from ``fold_in(rng_key, r)`` alone,
        so ``bam.infer(..., executor=...)`` runs it as a task of its own (``_first_chain=r``).
    init : {"random", "prior"}
        Initial columns uniform on the simplex, or drawn from their Dirichlet prior.
    max_configs : int
        Largest number of joint free-node configurations enumerated per cell.
    progress_bar : bool or None
        Accepted like every backend's (:mod:`bam_ppl.progress`); the restarts run as one
        compiled loop, so a bar has one step.

    Returns
    -------
    InferenceData
        ``posterior``: the MAP point as a single draw (chain 1, draw 1) of ``theta_<table>`` and
        ``total_rate`` (λ*, absent when totals are conditioned on); ``sample_stats``:
        ``log_posterior`` per iteration of the best restart (dims ``("chain", "iteration")``),
        ``restart_log_posterior`` and ``restart_iterations`` (chain, restart).
        ``attrs["point_estimate"]`` says that the single draw is the posterior mode.
    """
    num_iters = check_int(num_iters, "num_iters")
    tol = check_positive(tol, "tol", allow_zero=True)
    num_chains = check_int(num_chains, "num_chains")
    first_chain = check_int(_first_chain, "_first_chain", minimum=0)
    check_choice(init, "init", INITS)
    resolve_progress(progress_bar)  # validates
    key = as_key(rng_key)
    data, bound, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="MAP-EM")
    check_concentrations(bound)
    problem = build_problem(bound, data, layout)
    # Log posteriors of large data sets differ by far less than float32 resolves: EM's
    # monotonicity is only visible in float64.
    work = data.nnz * layout.num_configs * num_chains * num_iters
    show = resolve_progress(progress_bar, long_run=work > LONG_RUN_WORK)
    with jax.enable_x64(True), progress(1, "map (EM restarts)", show, unit="fit") as bar:
        states = _run_restarts(problem, chain_keys(key, num_chains, first_chain), tol, num_iters, init,
                               layout.valid is not None, em_driver.trace_capacity(num_iters))
        states = jax.tree.map(np.asarray, states)
        bar.update(1)
    finals = em_driver.final_objectives(states)
    best = em_driver.best_start(finals)
    theta = bound.split_flat(states.params[best][None, None])
    rate = None
    if bound.has_total_term:
        rate = np.full((1, 1), (bound.a + data.total - 1.0) / (bound.b + 1.0))
    stats = {
        "log_posterior": (("chain", "iteration"), em_driver.trace_of(states, best, first=1)[None]),
        "restart_log_posterior": (("chain", "restart"), finals[None]),
        "restart_iterations": (("chain", "restart"), states.iteration[None]),
    }
    return allocation_inference_data(
        bound, data, theta=theta, total_rate=rate, method="map", sample_stats=stats,
        attrs=dict(point_estimate="MAP: a single draw holding the posterior mode, not posterior samples",
                   num_iters=num_iters, tol=tol, num_restarts=num_chains,
                   init=init, best_restart=first_chain + best, converged=int(states.converged[best]),
                   log_posterior=float(finals[best])),
    )
