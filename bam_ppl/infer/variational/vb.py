"""Mean-field variational Bayes for allocation models (Cemgil et al. 2019 §4.3, Appendix D).

The variational family is Q(S, λ, Θ) = q(S) q(λ) ∏ q(θ): q(S) is a product of multinomials
over the free configurations of each observed cell (responsibilities Φ[u, l]), each table
column is Dirichlet(α + E S_fa), and q(λ) = Gamma(a + T, b + 1). Every quantity is indexed
through :class:`~bam_ppl.models.allocation.CellLayout`, so an iteration costs
O(nnz × free configurations × table members) plus the table sizes, never the dense size of X.

The functional core is :func:`init` / :func:`step` / :func:`run` on a :class:`CellProblem`;
:func:`vb` (``method="vb"``) and :func:`vb_log_evidence` (the best ELBO over restarts,
``kind="lower_bound"``) are the registry adapters. :mod:`bam_ppl.infer.variational.cvb` reuses the cell
bookkeeping defined here. The iterations run as a scanned, vmapped JAX step or, with ``engine="numba"``
(the evidence engine's VB search), as the kernel of :mod:`bam_ppl.infer.variational.vb_numba`.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import gammaln as np_gammaln

from ...convert import allocation_inference_data
from ...data import MISSING, CountTensor
from ...estimate import EvidenceEstimate
from ...models.allocation import AllocationModel, BoundModel, CellLayout
from ...models.sampling import dirichlet_log_draws
from ...parallel import best_index, chain_keys, restart_layout
from ...progress import resolve_progress, run_in_chunks
from ...types import Array, as_key, numpy_generator
from ...validation import check_choice, check_int, check_positive, renamed_options
from ..info import VBInfo
from ..kernels import resolve_kernel
from ..prepare import as_allocations, configs_of_allocation, prepare
from ..registry import register, register_evidence

INITS = ("tables", "responsibilities", "dirichlet")
"""Initialisations. ``"tables"`` (the default) draws every table column from a symmetric
Dirichlet(:data:`START_CONCENTRATION`) and starts from E log θ := log θ; ``"responsibilities"``
draws each cell's Φ from a flat Dirichlet over its valid configurations; ``"dirichlet"`` draws
every column from Dirichlet(α + 0.1) and starts from log θ (the paper's code). Responsibilities
drawn cell by cell average out over the many cells of a table row, so the first tables are nearly
uniform, and on some models (Dirichlet Tucker) that symmetric point is a fixed point VB never
leaves; the paper's draws at small α sit deep in one corner of each simplex and stall in poorer
optima (``benchmarks/vb_starts.py`` compares the three)."""

START_CONCENTRATION = 3.0
"""Columns of the ``"tables"`` start: a column of K entries deviates from uniform by a relative
standard deviation √((K − 1)/(Kc + 1)), 0.38 to 0.58 at c = 3, alike in every cell that uses it,
so the start leaves the symmetric point without committing any state to a corner."""
LOG_THETA_INITS = ("tables", "dirichlet")
"""The starts that begin from drawn tables (E log θ := log θ) rather than from responsibilities."""
INIT_EXTRA_CONCENTRATION = 0.1  # the paper's code: Dirichlet(α + 0.1) columns for ``init="dirichlet"``
CHUNK_ITERS = 25
"""Iterations per compiled scan; convergence and the progress bar are checked between chunks."""
# A restart runs to its optimum: the relative ELBO change falls below TOL (double precision's reach over
# the sums of a few thousand cells) well within NUM_ITERS coordinate-ascent iterations.
NUM_ITERS = 1000
TOL = 1e-8
MIN_BATCH = 16  # restarts run side by side at the least in evidence calls (:func:`iterate`, vb_log_evidence)

AUTO_PROGRESS_WORK = 5e8
"""With ``progress_bar=None`` a bar is shown when cells × configurations × members × restarts ×
iterations exceeds this."""


class CellProblem(NamedTuple):
    """The arrays an allocation-model optimiser needs, for one bound model and data set.

    Attributes
    ----------
    counts : (U,) float
        X_u of every observed cell.
    cell_flat, cell_col : (M, U) int
        Per member, the cell's offset into the concatenated table (column) vector.
    config_flat, config_col : (M, L) int
        Per member, the free configuration's offset (see :class:`CellLayout`).
    valid : (U, L) bool or None
        Configurations compatible with each cell's observed coordinates (None: all are).
    alpha : (F,) float
        Prior concentrations of all tables, concatenated.
    alpha_col : (C,) float
        Their column sums.
    column_of : (F,) int
        Column index of every table entry (sorted: tables and columns are contiguous).
    constant : () float
        ELBO terms fixed by the data: log_total_term (or the conditioned cells'
        Σ lnΓ(n_c + 1)), −Σ_u lnΓ(X_u + 1) and −Σ log B(α).
    row_of_cell, row_col_of_cell : tuple of (U,) int, one per member
        Cells that share ``cell_flat[m, u]`` (``cell_col[m, u]``) share a row: for member m they
        read and write the same table entries for every configuration.
    row_flat, row_col : tuple of (G_m,) int, one per member
        The offset of each row. Gathers and scatters then move whole rows of L values, which
        is much faster than U × L single-entry updates.
    member_mask : (M, U) float or None
        1 where member m's factor is part of cell u's likelihood, 0 where the member's child is
        a visible leaf missing in the cell and marginalised exactly (see
        :func:`marginalised_leaf_layout`); None: every member of every cell.
    """

    counts: Array
    cell_flat: Array
    config_flat: Array
    cell_col: Array
    config_col: Array
    valid: Array | None
    alpha: Array
    alpha_col: Array
    column_of: Array
    constant: Array
    row_of_cell: tuple
    row_flat: tuple
    row_col_of_cell: tuple
    row_col: tuple
    member_mask: Array | None = None


def log_beta_prior(bound: BoundModel) -> float:
    """Σ log B(α) over the prior's columns, B(α) = Π Γ(α_i) / Γ(Σ α_i)."""
    return float(np_gammaln(bound.flat_concentration).sum() - np_gammaln(bound.flat_column_concentration).sum())


def data_constant(bound: BoundModel, data) -> float:
    """The ELBO's data-only terms (eq. D.1 first, fourth and last lines; conditioned variant)."""
    return float(bound.log_data_constant(data) - log_beta_prior(bound))


def marginalised_leaf_layout(bound: BoundModel, data) -> tuple[CellLayout, np.ndarray]:
    """A layout in which missing entries of visible leaves are summed out, and its member mask.

    A leaf's table column sums to one, so a cell whose leaf is missing has the likelihood of its
    other members alone: the member drops out of the cell (mask 0) instead of making the leaf a
    free node whose values q(S) would enumerate. Mean-field VB on this layout is VB for the
    model with the missing entries integrated out before the approximation (Chege et al. 2024
    §II), which the free-node layout is not. Returns the layout of ``data`` with missing codes
    read as 0 (the mask removes them) and the ``(members, cells)`` mask.
    """
    missing = data.indices == MISSING
    visible = {name: axis for axis, name in enumerate(bound.visible)}
    for name, axis in visible.items():
        if missing[:, axis].any() and bound.dag.children(name):
            raise ValueError(f"data: node {name!r} has missing entries but is not a leaf; only missing "
                             "leaves are marginalised")
    # The layout of a cell depends on its coordinates alone: lay out the distinct filled cells
    # (CountTensor merges duplicates) and read every cell's columns from its filled twin.
    filled, twin = np.unique(np.where(missing, 0, data.indices), axis=0, return_inverse=True)
    layout = bound.cell_layout(CountTensor(filled, np.ones(len(filled), np.int64), data.shape))
    layout = layout._replace(cell_flat=layout.cell_flat[:, twin.reshape(-1)], cell_col=layout.cell_col[:, twin.reshape(-1)])
    mask = np.stack([~missing[:, visible[child]] if child in visible else np.ones(data.nnz, bool)
                     for _, child, _ in bound.members])
    return layout, mask.astype(np.float64)


def build_problem(bound: BoundModel, data, layout: CellLayout, member_mask=None) -> CellProblem:
    """Device arrays of a :class:`CellProblem` (call under ``jax.enable_x64(True)``)."""
    def rows(offsets):
        unique, inverse = zip(*(np.unique(row, return_inverse=True) for row in offsets))
        return tuple(jnp.asarray(i.reshape(-1)) for i in inverse), tuple(jnp.asarray(u) for u in unique)

    row_of_cell, row_flat = rows(layout.cell_flat)
    row_col_of_cell, row_col = rows(layout.cell_col)
    return CellProblem(
        counts=jnp.asarray(data.counts, dtype=float),
        cell_flat=jnp.asarray(layout.cell_flat),
        config_flat=jnp.asarray(layout.config_flat),
        cell_col=jnp.asarray(layout.cell_col),
        config_col=jnp.asarray(layout.config_col),
        valid=None if layout.valid is None else jnp.asarray(layout.valid),
        alpha=jnp.asarray(bound.flat_concentration, dtype=float),
        alpha_col=jnp.asarray(bound.flat_column_concentration, dtype=float),
        column_of=jnp.asarray(bound.column_of),
        constant=jnp.asarray(data_constant(bound, data), dtype=float),
        row_of_cell=row_of_cell,
        row_flat=row_flat,
        row_col_of_cell=row_col_of_cell,
        row_col=row_col,
        member_mask=None if member_mask is None else jnp.asarray(member_mask, dtype=float),
    )


# -- float64 elementwise kernels ----------------------------------------------------------------
# On CPU, XLA's float64 exp, lgamma and digamma are slow while multiply-adds vectorise, so these
# run as polynomials: exp by range reduction to |r| ≤ ln2/2 and a degree-13 Taylor polynomial
# (relative error < 1e-15); lnΓ and ψ together by the shift x → x + 10 and the Stirling series,
# the shift's sums taken as log P(x) and P'(x)/P(x) for P(x) = Π_{k<10} (x + k) (relative error
# < 1e-14, absolute < 1e-13 below x = 1e3; tests/test_vb.py).
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_EXP_TAYLOR_DEGREE = 13
_SHIFT = 10
_BERNOULLI = (1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66, -691.0 / 2730)  # B_2, B_4, …, B_12
_HALF_LOG_2PI = 0.91893853320467274178


def exp_nonpositive(x: Array) -> Array:
    """exp(x) for x ≤ 0 (−inf allowed); arguments below −708 return at most 2^-1021."""
    x = jnp.maximum(x, -708.0)
    k = jnp.round(x * (1.0 / np.log(2.0)))
    r = (x - k * _LN2_HI) - k * _LN2_LO
    poly = jnp.ones_like(r)
    for n in range(_EXP_TAYLOR_DEGREE, 0, -1):
        poly = 1.0 + poly * r * (1.0 / n)
    scale = jax.lax.bitcast_convert_type((k.astype(jnp.int64) + 1023) << 52, jnp.float64)
    return poly * scale


def gammaln_digamma_positive(x: Array) -> tuple[Array, Array]:
    """(lnΓ(x), ψ(x)) for x > 0, sharing the shift and the logarithm."""
    y = x + _SHIFT
    inv = 1.0 / y
    # P(x) / y^10 and P'(x) / y^10 by the product rule, each factor (x + k) / y ≤ 1: no overflow.
    product, derivative = jnp.ones_like(x), jnp.zeros_like(x)
    for k in range(_SHIFT):
        factor = (x + k) * inv
        derivative = derivative * factor + product * inv
        product = product * factor
    log_y = jnp.log(y)
    inv2 = inv * inv
    gammaln_series = digamma_series = 0.0
    for n in range(len(_BERNOULLI), 0, -1):  # Horner in 1/y², highest order first
        b = _BERNOULLI[n - 1]
        gammaln_series = gammaln_series * inv2 + b / (2 * n * (2 * n - 1))
        digamma_series = digamma_series * inv2 + b / (2 * n)
    gammaln_y = (y - 0.5) * log_y - y + _HALF_LOG_2PI + gammaln_series * inv
    digamma_y = log_y - 0.5 * inv - digamma_series * inv2
    return gammaln_y - jnp.log(product) - _SHIFT * log_y, digamma_y - derivative / product


# -- cell bookkeeping shared with collapsed VB -------------------------------------------------
def column_sums(problem: CellProblem, table_vector: Array) -> Array:
    """Σ over the child of every column of a concatenated table vector."""
    return jax.ops.segment_sum(table_vector, problem.column_of,
                               num_segments=problem.alpha_col.shape[0], indices_are_sorted=True)


def member_indices(problem: CellProblem, m: int) -> tuple[Array, Array]:
    """Flat table and column indices ``(U, L)`` of member ``m`` for every cell and configuration."""
    flat = problem.cell_flat[m][:, None] + problem.config_flat[m][None, :]
    col = problem.cell_col[m][:, None] + problem.config_col[m][None, :]
    return flat, col


def member_gather(problem: CellProblem, m: int, table_vector: Array) -> Array:
    """table_vector[cell_flat[m, u] + config_flat[m, l]] for every cell and configuration."""
    rows = table_vector[problem.row_flat[m][:, None] + problem.config_flat[m][None, :]]
    return rows[problem.row_of_cell[m]]


def member_column_gather(problem: CellProblem, m: int, column_vector: Array) -> Array:
    """column_vector[cell_col[m, u] + config_col[m, l]] for every cell and configuration."""
    rows = column_vector[problem.row_col[m][:, None] + problem.config_col[m][None, :]]
    return rows[problem.row_col_of_cell[m]]


def sum_over_members(problem: CellProblem, table_vector: Array) -> Array:
    """Σ_m table_vector[index of member m] for every cell and configuration, shape (U, L)."""
    total = 0.0
    for m in range(problem.cell_flat.shape[0]):
        total = total + masked(problem, m, member_gather(problem, m, table_vector))
    return total


def masked(problem: CellProblem, m: int, values: Array) -> Array:
    """``values`` (U, L) zeroed at the cells where member ``m`` is marginalised out."""
    return values if problem.member_mask is None else values * problem.member_mask[m][:, None]


def scatter_to_tables(problem: CellProblem, weights: Array) -> Array:
    """Σ_{u,l} weights[u, l] added at every member's table entry: E S_fa for weights X_u Φ."""
    out = jnp.zeros_like(problem.alpha)
    for m in range(problem.cell_flat.shape[0]):
        rows = jax.ops.segment_sum(masked(problem, m, weights), problem.row_of_cell[m],
                                   num_segments=problem.row_flat[m].shape[0])
        out = out.at[problem.row_flat[m][:, None] + problem.config_flat[m][None, :]].add(rows)
    return out


def mask_invalid(problem: CellProblem, values: Array, fill) -> Array:
    """``values`` with ``fill`` at configurations a cell's observed coordinates exclude."""
    return values if problem.valid is None else jnp.where(problem.valid, values, fill)


def normalise_potential(problem: CellProblem, log_potential: Array) -> tuple[Array, Array]:
    """Φ ∝ exp(log_potential) over each cell's valid configurations, and each cell's log Z_u."""
    masked = mask_invalid(problem, log_potential, -jnp.inf)
    top = jnp.max(masked, axis=1)
    weights = mask_invalid(problem, exp_nonpositive(masked - top[:, None]), 0.0)
    total = jnp.sum(weights, axis=1)
    return weights * (1.0 / total)[:, None], top + jnp.log(total)


def normalise_responsibilities(problem: CellProblem, log_potential: Array) -> tuple[Array, Array]:
    """Φ as :func:`normalise_potential`, and log Φ (−inf at invalid configurations)."""
    phi, log_normaliser = normalise_potential(problem, log_potential)
    return phi, mask_invalid(problem, log_potential - log_normaliser[:, None], -jnp.inf)


def dirichlet_terms(problem: CellProblem, alpha_hat: Array) -> tuple[Array, Array]:
    """Σ log B(α̂) over the columns of q(θ) = Dirichlet(α̂), and E_q log θ = ψ(α̂_fa) − ψ(α̂_pa).

    Both from one pass of :func:`gammaln_digamma_positive` over the entries and the column sums
    (App. D; ψ(α̂_pa) is ψ of the column sum).
    """
    gammaln_entry, digamma_entry = gammaln_digamma_positive(alpha_hat)
    gammaln_column, digamma_column = gammaln_digamma_positive(column_sums(problem, alpha_hat))
    log_beta = jnp.sum(gammaln_entry) - jnp.sum(gammaln_column)
    return log_beta, digamma_entry - digamma_column[problem.column_of]


def expected_log_theta(problem: CellProblem, alpha_hat: Array) -> Array:
    """E_q log θ of :func:`dirichlet_terms` alone."""
    return dirichlet_terms(problem, alpha_hat)[1]


def entropy_term(problem: CellProblem, phi: Array, log_phi: Array) -> Array:
    """−Σ_u X_u Σ_l Φ log Φ (the last term of eq. D.1)."""
    plogp = mask_invalid(problem, phi * log_phi, 0.0)
    return -jnp.sum(problem.counts * plogp.sum(axis=1))


def elbo_value(problem: CellProblem, alpha_hat: Array, phi: Array, log_phi: Array) -> Array:
    """The ELBO (eq. D.1) of q(S) = Φ with q(θ) = Dirichlet(α̂), α̂ = α + E_Φ S.

    Valid for any Φ as long as α̂ is computed from that same Φ (the simplified form of D.1).
    """
    log_beta_post, _ = dirichlet_terms(problem, alpha_hat)
    return problem.constant + log_beta_post + entropy_term(problem, phi, log_phi)


def training_log_likelihood(problem: CellProblem, alpha_hat: Array) -> Array:
    """Σ_u X_u log p̄(u): the data's log-likelihood under the posterior-mean tables θ̄ = α̂/α̂_col.

    p̄(u) = Σ_l Π_m θ̄ over the valid configurations: the probability of the cell's observed
    coordinates (given the conditioned nodes under ``condition_on``); multinomial coefficients
    are left out.
    """
    log_mean = jnp.log(alpha_hat) - jnp.log(column_sums(problem, alpha_hat))[problem.column_of]
    log_cell = mask_invalid(problem, sum_over_members(problem, log_mean), -jnp.inf)
    return jnp.sum(problem.counts * jax.scipy.special.logsumexp(log_cell, axis=1))


def initial_log_theta(rng: np.random.Generator, problem: CellProblem, num_restarts: int, init: str) -> np.ndarray:
    """log θ with θ ~ Dirichlet per column, one row per restart: Dirichlet(:data:`START_CONCENTRATION`)
    for ``init="tables"``, Dirichlet(α + 0.1) for ``"dirichlet"`` (the paper's code)."""
    alpha = np.asarray(problem.alpha)
    concentration = np.full(alpha.shape, START_CONCENTRATION) if init == "tables" else alpha + INIT_EXTRA_CONCENTRATION
    return dirichlet_log_draws(rng, concentration, np.asarray(problem.column_of), num_restarts)


def initial_responsibilities(rng: np.random.Generator, problem: CellProblem, num_restarts: int) -> np.ndarray:
    """Φ ~ flat Dirichlet over each cell's valid configurations, shape (restarts, U, L)."""
    shape = (problem.cell_flat.shape[1], problem.config_flat.shape[1])
    valid = np.ones(shape, bool) if problem.valid is None else np.asarray(problem.valid)
    draws = rng.standard_gamma(1.0, size=(num_restarts, *shape)) * valid
    return draws / draws.sum(axis=-1, keepdims=True)


def initial_values(init: str, init_keys, problem: CellProblem) -> np.ndarray:
    """Every restart's start (leading axis: restart); restart r draws from a Generator seeded by
    ``init_keys[r]`` alone, so it starts where it would start run alone."""
    def draw(rng):
        if init in LOG_THETA_INITS:
            return initial_log_theta(rng, problem, 1, init)
        return initial_responsibilities(rng, problem, 1)

    # Rows of a host array: iterating over a JAX array compiles an unstack for every length.
    return np.concatenate([draw(np.random.default_rng(key)) for key in np.asarray(init_keys, np.uint32)])


# -- VB core --------------------------------------------------------------------------------
class VBState(NamedTuple):
    """One restart's variational state.

    ``log_weights`` is E_q log θ used by the next q(S) update; ``alpha_hat`` the Dirichlet
    parameters of q(θ) and ``elbo`` the bound evaluated right after the last θ update.
    """

    log_weights: Array
    alpha_hat: Array
    elbo: Array
    iteration: Array
    converged: Array


def fresh_state(log_weights: Array, alpha_hat: Array) -> VBState:
    """A state before the first iteration (explicit dtypes keep the scan's carry type fixed)."""
    return VBState(log_weights, alpha_hat, jnp.full((), -jnp.inf, alpha_hat.dtype),
                   jnp.zeros((), jnp.int32), jnp.zeros((), bool))


def init_from_log_theta(problem: CellProblem, log_theta: np.ndarray) -> VBState:
    """Restarts (leading axis of ``log_theta``) from E log θ := log θ for drawn θ (``init="tables"`` or
    ``"dirichlet"``), q(θ) the prior's until the first update; host arrays, nothing to compile."""
    num = len(log_theta)
    return VBState(np.asarray(log_theta, np.float64), np.tile(np.asarray(problem.alpha, np.float64), (num, 1)),
                   np.full(num, -np.inf), np.zeros(num, np.int32), np.zeros(num, bool))


def init_from_responsibilities(problem: CellProblem, phi: Array) -> VBState:
    """Start from q(θ) = Dirichlet(α + E_Φ S) for given responsibilities Φ."""
    alpha_hat = problem.alpha + scatter_to_tables(problem, problem.counts[:, None] * phi)
    return fresh_state(expected_log_theta(problem, alpha_hat), alpha_hat)


def step(problem: CellProblem, state: VBState, num_iters, tol) -> VBState:
    """One coordinate-ascent sweep: q(S), then q(θ), then the ELBO (eq. D.1).

    For Φ ∝ exp(s), s_ul = Σ_m log_weights (the weights used for this update), the entropy term
    of D.1 is −Σ_u X_u Σ_l Φ log Φ = Σ_u X_u log Z_u − ⟨log_weights, E_Φ S⟩, which needs no log
    per (cell, configuration); lnΓ and ψ of the new q(θ) come from one shared kernel. A restart
    that has converged (relative ELBO change ≤ ``tol``) or used ``num_iters`` iterations keeps
    its state.
    """
    phi, log_normaliser = normalise_potential(problem, sum_over_members(problem, state.log_weights))
    expected_counts = scatter_to_tables(problem, problem.counts[:, None] * phi)
    alpha_hat = problem.alpha + expected_counts
    log_beta_post, log_weights = dirichlet_terms(problem, alpha_hat)
    entropy = jnp.sum(problem.counts * log_normaliser) - jnp.sum(state.log_weights * expected_counts)
    elbo = problem.constant + log_beta_post + entropy
    converged = jnp.abs(elbo - state.elbo) <= tol * jnp.abs(elbo)
    new = VBState(log_weights, alpha_hat, elbo, state.iteration + 1, converged)
    active = ~state.converged & (state.iteration < num_iters)
    return jax.tree.map(lambda n, o: jnp.where(active, n, o), new, state)


def _run_chunk(problem, states, num_iters, tol, length):
    def body(states, _):
        states = jax.vmap(step, in_axes=(None, 0, None, None))(problem, states, num_iters, tol)
        return states, states.elbo

    return jax.lax.scan(body, states, None, length=length)


_init_responsibilities = jax.jit(jax.vmap(init_from_responsibilities, in_axes=(None, 0)))
_run_chunk_jit = jax.jit(_run_chunk, static_argnames="length")
_training_log_likelihood_batch = jax.jit(jax.vmap(training_log_likelihood, in_axes=(None, 0)))


def iterate(run_chunk, problem, states, *, num_iters: int, tol: float, progress_bar: bool, desc: str,
            min_batch: int = 1):
    """Scan chunks of iterations until every restart converged or used ``num_iters``.

    Returns the final states and the stacked per-iteration outputs ``(restart, iteration, ...)``,
    cut at the last iteration any restart ran.
    """
    outputs = []
    # Fewer restarts than ``min_batch`` run padded with copies of the first (which converge with
    # it): the small batches of one evidence call share one compiled program instead of one each.
    # Elsewhere (one fit, min_batch=1) the copies would only multiply the work.
    # The glue between the chunks runs on host arrays: an eager JAX op compiles anew for every shape.
    batch = int(jax.tree.leaves(states)[0].shape[0])
    if batch < min_batch:
        states = jax.tree.map(lambda x: np.concatenate([x, np.repeat(x[:1], min_batch - batch, axis=0)]),
                              jax.device_get(states))

    def advance(states, start, stop):
        states, out = run_chunk(problem, states, num_iters, tol, length=CHUNK_ITERS)
        outputs.append(out)
        return states

    states = run_in_chunks(advance, states, num_iters, chunk=CHUNK_ITERS, show=progress_bar, description=desc,
                           stop_early=lambda s: bool(np.all(jax.device_get(s.converged))))
    states = jax.tree.map(lambda x: x[:batch], jax.device_get(states))
    ran = int(states.iteration.max())
    stacked = jax.tree.map(lambda *xs: np.moveaxis(np.concatenate(xs, axis=0), 0, 1)[:batch], *jax.device_get(outputs))
    return states, jax.tree.map(lambda x: x[:, :ran], stacked)


def run_from(states: VBState, problem: CellProblem, *, num_iters: int, tol: float, progress_bar: bool = False,
             desc: str = "vb", min_batch: int = 1, engine: str = "jax") -> VBResult:
    """Run VB from given states (leading axis: restart), e.g. a family's own initialisation."""
    states, elbo_trace = iterate(*_chunks(problem, engine), states, num_iters=num_iters, tol=tol,
                                 progress_bar=progress_bar, desc=desc, min_batch=min_batch)
    return VBResult(np.asarray(states.alpha_hat), np.asarray(elbo_trace), np.asarray(states.elbo),
                    np.asarray(states.iteration), np.asarray(states.converged))


def _chunks(problem: CellProblem, engine: str):
    """The chunk runner of ``engine`` and the problem as it reads it: the scanned JAX step
    (``"jax"``) or the numba kernel on host arrays (``"numba"``, :mod:`~bam_ppl.infer.variational.vb_numba`),
    the same iterations up to rounding."""
    if engine == "numba":
        from . import vb_numba

        return vb_numba.run_chunk, vb_numba.host_problem(problem)
    return _run_chunk_jit, problem


class VBResult(NamedTuple):
    """Every restart's final q(θ) and ELBO trace (float64 host arrays)."""

    alpha_hat: np.ndarray
    elbo_trace: np.ndarray
    elbo: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray

def run(init_keys, problem: CellProblem, *, num_iters: int, tol: float, init: str = "tables",
        progress_bar: bool = False, screen_iters: int | None = None, screen_keep: int = 10,
        start_phi: np.ndarray | None = None, min_batch: int = 1, engine: str = "jax") -> VBResult:
    """Run one vmapped VB restart per key of ``init_keys`` (call under ``jax.enable_x64(True)``),
    then one from each of the responsibilities ``start_phi`` (S, U, L) where given, all of them to
    the end, or with ``screen_iters`` screened (:func:`run_screened`); ``engine`` runs the
    iterations (:func:`_chunks`)."""
    start = initial_values(init, init_keys, problem)
    given = start_phi is not None and len(start_phi) > 0
    if init in LOG_THETA_INITS:
        states = init_from_log_theta(problem, start)
        if given:
            states = jax.tree.map(lambda a, b: np.concatenate([a, b]), states,
                                  jax.device_get(_init_responsibilities(problem, jnp.asarray(start_phi))))
    else:  # one batch, one compiled program
        states = _init_responsibilities(problem, jnp.asarray(np.concatenate([start, start_phi]) if given else start))
    if screen_iters is not None and screen_iters < num_iters and screen_keep < states.elbo.shape[0]:
        return run_screened(states, problem, num_iters=num_iters, tol=tol, progress_bar=progress_bar,
                            screen_iters=screen_iters, screen_keep=screen_keep, min_batch=min_batch, engine=engine)
    return run_from(states, problem, num_iters=num_iters, tol=tol, progress_bar=progress_bar, min_batch=min_batch,
                    engine=engine)


def run_screened(states: VBState, problem: CellProblem, *, num_iters: int, tol: float, progress_bar: bool,
                 screen_iters: int, screen_keep: int, min_batch: int = 1, engine: str = "jax") -> VBResult:
    """Every restart for ``screen_iters`` iterations, then only the ``screen_keep`` with the highest
    ELBO on to ``num_iters`` (or convergence), each exactly as if run alone; the others keep their
    screened state, whose ELBO is a lower bound too (coordinate ascent only raises it). Where a
    restart ends up is mostly settled early, so a search over many restarts costs little more than
    its screening. Traces of the restarts left
    behind repeat their last value, as those of converged restarts do."""
    chunks = _chunks(problem, engine)
    screened, screen_trace = iterate(*chunks, states, num_iters=screen_iters, tol=tol,
                                     progress_bar=progress_bar, desc="vb (screening)", min_batch=min_batch)
    kept = np.sort(np.argsort(-screened.elbo, kind="stable")[:screen_keep])
    # The kept restarts go on counting from zero with the iterations left, so that the chunks stop
    # where they do; their totals are put back together below.
    resumed = jax.tree.map(lambda x: x[kept], screened)._replace(iteration=np.zeros(kept.size, np.int32))
    resumed, trace = iterate(*chunks, resumed, num_iters=num_iters - screen_iters, tol=tol,
                             progress_bar=progress_bar, desc="vb", min_batch=min_batch)
    final = jax.tree.map(lambda x: x.copy(), screened)
    for every, some in zip(final, resumed._replace(iteration=resumed.iteration + screened.iteration[kept])):
        every[kept] = some
    full = np.repeat(screen_trace[:, -1:], trace.shape[1], axis=1)
    full[kept] = trace
    return VBResult(np.asarray(final.alpha_hat), np.concatenate([screen_trace, full], axis=1), np.asarray(final.elbo),
                    np.asarray(final.iteration), np.asarray(final.converged))


# -- registry adapters ------------------------------------------------------------------------
def check_options(rng_key, num_iters, tol, num_chains, init, progress_bar, inits=INITS, first_chain=0):
    """Validate the options shared by the VB-type optimisers (before any compilation)."""
    key = as_key(rng_key)
    check_int(num_iters, "num_iters")
    check_positive(tol, "tol", allow_zero=True)
    check_int(num_chains, "num_chains")
    check_int(first_chain, "_first_chain", minimum=0)
    if not isinstance(init, str):
        raise TypeError(f"init must be a string, one of {list(inits)}, got {type(init).__name__}")
    check_choice(init, "init", inits)
    resolve_progress(progress_bar)  # validates
    return key


def show_progress(progress_bar, layout: CellLayout, data, num_chains: int, num_iters: int) -> bool:
    """``progress_bar`` itself, or for ``None`` whether the run is long (:mod:`bam_ppl.progress`)."""
    work = data.nnz * layout.num_configs * layout.num_members * num_chains * num_iters
    return resolve_progress(progress_bar, long_run=work > AUTO_PROGRESS_WORK)


def posterior_draws(rng_key, bound: BoundModel, alpha_hat: np.ndarray, num_samples: int):
    """θ ~ q(θ) = Dirichlet(α̂) per table (one chain) and λ ~ Gamma(a + T, b + 1) if it exists."""
    rng = numpy_generator(rng_key)
    log_theta = dirichlet_log_draws(rng, alpha_hat, bound.column_of, num_samples)
    theta = bound.split_flat(np.exp(log_theta)[None])
    rate = None
    if bound.has_total_term:
        rate = rng.gamma(bound.a + bound.total, 1.0 / (bound.b + 1.0), size=(1, num_samples))
    return theta, rate


class Fitted(NamedTuple):
    """What :func:`_fit` made: the bound model, data, cells' layout and VB problem, the restarts' result, the
    keys of each restart's posterior draws and the call's key."""

    bound: BoundModel
    data: CountTensor
    layout: CellLayout
    problem: CellProblem
    result: object
    draw_keys: object
    key: object  # the call's key


def _fit(model, data, rng_key, *, num_iters, tol, num_chains, init, progress_bar, engine, first_chain=0,
         screen_iters=None, screen_keep=10, start=None, min_batch=1) -> Fitted:
    """Restarts ``first_chain ..`` and their posterior draw keys; restart r's keys split
    ``fold_in(rng_key, r)`` (:func:`bam_ppl.parallel.chain_keys`). Runs from the allocations
    ``start`` follow the restarts in the result."""
    key = check_options(rng_key, num_iters, tol, num_chains, init, progress_bar, first_chain=first_chain)
    engine = resolve_kernel(engine)
    if screen_iters is not None:
        check_int(screen_iters, "screen_iters", minimum=1)
        check_int(screen_keep, "screen_keep", minimum=1)
    data, bound, layout, _ = prepare(model, data, algorithm="variational inference")
    start_phi = start_responsibilities(bound, data, layout, start)
    show = show_progress(progress_bar, layout, data, num_chains, num_iters)
    with jax.enable_x64(True):
        problem = build_problem(bound, data, layout)
        init_keys, draw_keys = chain_keys(key, num_chains, first_chain, parts=2)
        result = run(init_keys, problem, num_iters=num_iters, tol=tol, init=init, progress_bar=show,
                     screen_iters=screen_iters, screen_keep=screen_keep, start_phi=start_phi,
                     min_batch=min_batch if engine == "jax" else 1, engine=engine)
    return Fitted(bound, data, layout, problem, result, draw_keys, key)


def start_responsibilities(bound: BoundModel, data: CountTensor, layout: CellLayout, start) -> np.ndarray | None:
    """Responsibilities Φ (S, U, L) of the allocations ``start`` (one (cells, counts), as
    ``best_cells``, ``best_counts`` of the samplers, or a list of them): each cell's share of
    tokens in each configuration, so that the first q(θ) is the Dirichlet posterior given that
    allocation. None without ``start``; a ValueError naming ``start`` where an allocation does not
    add up to X (before any compilation)."""
    allocations = as_allocations(start)
    if not allocations:
        return None
    cell_totals = np.round(np.asarray(data.counts)).astype(np.int64)
    if not np.allclose(data.counts, cell_totals):
        raise ValueError("start: VB runs from an allocation only on integer counts")
    token_cell = np.repeat(np.arange(data.nnz), cell_totals)
    L = layout.num_configs
    configs = [configs_of_allocation(bound, data, layout, token_cell, allocation, "start") for allocation in allocations]
    counts = [np.bincount(token_cell * L + config, minlength=data.nnz * L).reshape(data.nnz, L) for config in configs]
    return np.stack(counts) / cell_totals[:, None]


@register("vb", models=(AllocationModel,))
@restart_layout("chain", "final_elbo")
@renamed_options(num_restarts="num_chains")
def vb(model, data, *, rng_key=0, num_iters: int = NUM_ITERS, tol: float = TOL, num_chains: int = 1,
       init: str = "tables", num_samples: int = 200, progress_bar: bool | None = None, engine: str = "jax",
       num_moves: int = 10, _first_chain: int = 0):
    """Mean-field variational Bayes (Cemgil et al. 2019 App. D); ELBO per iteration, best of restarts.

    Parameters
    ----------
    model : AllocationModel
    data : array-like or CountTensor
    rng_key : int or JAX key
    num_iters : int
        Maximum number of coordinate-ascent iterations per restart.
    tol : float
        Stop a restart when the relative ELBO change |ΔB| / |B| is at most ``tol`` (0: run all
        ``num_iters``).
    num_chains : int
        Independent random initialisations (restarts; formerly ``num_restarts``), run side by
        side (vmapped); the posterior comes from the one with the highest final ELBO. Restart r
        starts from and draws with ``fold_in(rng_key, r)`` alone, so ``bam.infer(...,
        executor=...)`` runs it as a task of its own (private option ``_first_chain=r``).
    init : {"tables", "responsibilities", "dirichlet"}
        ``"tables"``: E log θ starts as log θ with θ ~ Dirichlet(3) per column (:data:`INITS`);
        ``"responsibilities"``: each cell's Φ ~ flat Dirichlet, then q(θ) from it;
        ``"dirichlet"``: E log θ starts as log θ with θ ~ Dirichlet(α + 0.1) per column (the
        paper's code).
    num_samples : int
        Draws of θ (and λ) from the best restart's q.
    progress_bar : bool or None
        tqdm bar over iterations; ``None`` shows one for long runs only.
    engine : {"jax", "numba", "auto"}
        What runs the iterations, the same up to rounding: the vmapped JAX step (default), compiled
        for every data shape (about a second on a CPU), or the numba kernel
        (:mod:`~bam_ppl.infer.variational.vb_numba`), compiled once per machine but slower per
        iteration on large tables (benchmarks/README.md); ``"auto"``: numba on a CPU where installed.
    num_moves : int
        Each restart, once it stops, runs on through rounds of this many merge-and-birth moves while a round
        raises its ELBO, as ``bam.log_evidence(method="vb")`` moves its best
        (:func:`~bam_ppl.infer.variational.split_merge.improve`; restart r draws from ``fold_in(fold_in(rng_key,
        2³² − 1), r)``); 0: coordinate ascent alone, as in Cemgil et al. (2019).

    Returns
    -------
    InferenceData
        ``posterior``: ``theta_<table>`` (one chain: the best restart) and ``total_rate`` unless
        totals are conditioned on. ``sample_stats``: ``elbo`` (chain = restart, iteration: coordinate
        ascent; a converged restart keeps its last value), ``final_elbo`` (after the moves), ``iterations``,
        ``converged`` and ``final_training_log_likelihood`` per restart. ``attrs["best_restart"]`` names the
        restart the posterior comes from.
    """
    check_int(num_samples, "num_samples")
    check_int(num_moves, "num_moves", minimum=0)
    fitted = _fit(model, data, rng_key, num_iters=num_iters, tol=tol, num_chains=num_chains, init=init,
                  progress_bar=progress_bar, engine=engine, first_chain=_first_chain)
    bound, data, problem, result, draw_keys = fitted.bound, fitted.data, fitted.problem, fitted.result, fitted.draw_keys
    from .split_merge import moved_restarts

    alpha_hat, final_elbo = moved_restarts(fitted, num_moves, _first_chain)
    best = best_index(final_elbo)
    with jax.enable_x64(True):
        loglik = np.asarray(_training_log_likelihood_batch(problem, jnp.asarray(alpha_hat)))
    theta, rate = posterior_draws(draw_keys[best], bound, alpha_hat[best], num_samples)
    stats = {
        "elbo": (("chain", "iteration"), result.elbo_trace),
        "final_elbo": (("chain",), final_elbo),
        "iterations": (("chain",), result.iterations),
        "converged": (("chain",), result.converged),
        "final_training_log_likelihood": (("chain",), loglik),
    }
    return allocation_inference_data(
        bound, data, theta=theta, total_rate=rate, method="vb", sample_stats=stats,
        attrs=dict(best_restart=_first_chain + best, best_elbo=float(final_elbo[best]),
                   num_restarts=num_chains, num_iters=num_iters, tol=tol, init=init, num_moves=num_moves),
    )


@register_evidence("vb", models=(AllocationModel,))
@renamed_options(num_restarts="num_chains")
def vb_log_evidence(model, data, *, rng_key=0, num_iters: int = NUM_ITERS, tol: float = TOL,
                    num_chains: int = 10, init: str = "tables", progress_bar: bool | None = None,
                    screen_iters: int | None = None, screen_keep: int = 10, start=None, engine: str = "jax",
                    num_moves: int = 10):
    """The best ELBO over ``num_chains`` VB runs (restarts): a lower bound on log L_X (Cemgil et al.
    2019 §5.1).

    With ``num_moves``, the best fit runs on to its optimum and then through rounds of that many merge-and-birth
    moves (one value of a latent node merged into another, which starts again at a seed cell; Ueda et al. 2000,
    Hughes & Sudderth 2013) while a round raises its ELBO
    (:func:`~bam_ppl.infer.variational.split_merge.improve`): coordinate ascent stops where one value covers two
    groups of the data, which no update of one factor leaves, and the moves lift the bound out of such optima
    (benchmarks/README.md). The ELBO only rises, so the value stays a lower bound; ``num_moves=0`` gives the best
    of the restarts alone, the bound of Cemgil et al. (2019).

    With ``screen_iters``, every restart runs that many iterations and only the ``screen_keep``
    with the highest ELBO go on (:func:`run_screened`): a search over many restarts at a fraction
    of the cost (``method="auto"`` screens each run's share of its restarts at 200 iterations and keeps the best).

    ``start``: an allocation (cells, counts) or a list of them, e.g. the ``best_cells``,
    ``best_counts`` of a sampler's estimate, from each of which VB runs too: coordinate ascent
    from q(θ) given that allocation climbs to the optimum of its basin, which random restarts
    rarely reach on real data. The value is the best over restarts and starts.

    ``stderr`` is nan: the bound is deterministic given ``rng_key``, not a noisy estimate of the
    evidence. ``info`` (a :class:`~bam_ppl.infer.info.VBInfo`) holds every restart's final ELBO,
    the best restart's index, the runs from ``start`` (``start_elbo``, and ``best_start`` where
    one of them is the best, else None) and the best run's expected table counts
    ``expected_counts`` (α̂ − α per table entry, in the order of ``BoundModel.flat_concentration``).
    ``engine`` runs the iterations as in :func:`vb`.
    """
    began = time.perf_counter()
    check_int(num_moves, "num_moves", minimum=0)
    fitted = _fit(model, data, rng_key, num_iters=num_iters, tol=tol, num_chains=num_chains, init=init,
                  progress_bar=progress_bar, screen_iters=screen_iters, screen_keep=screen_keep, start=start,
                  min_batch=MIN_BATCH, engine=engine)
    result = fitted.result
    best = best_index(result.elbo)
    restarts = result.elbo[:num_chains]
    alpha_hat, elbo = np.asarray(result.alpha_hat[best]), float(result.elbo[best])
    moved = None
    if num_moves:
        from .split_merge import MOVE_STREAM, moved_fits

        [(alpha_hat, elbo)] = moved_fits(fitted, [best], num_moves, [jax.random.fold_in(fitted.key, MOVE_STREAM)])
        moved = elbo
    return EvidenceEstimate(
        value=elbo, stderr=math.nan, method="vb", kind="lower_bound",
        lower_bound=elbo, run_values=tuple(np.asarray(result.elbo, np.float64).tolist()),
        seconds=time.perf_counter() - began,
        info=VBInfo(elbo_per_restart=restarts, best_restart=best_index(restarts), iterations=result.iterations,
                    converged=result.converged, start_elbo=result.elbo[num_chains:],
                    best_start=best - num_chains if best >= num_chains else None,
                    expected_counts=alpha_hat - fitted.bound.flat_concentration, moved_elbo=moved),
    )
