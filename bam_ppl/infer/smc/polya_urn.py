"""Pólya-urn sequential Monte Carlo for any allocation model (Cemgil et al. 2019 §4.1–4.2, Algorithms 1–3).

The Bayesian allocation model integrated over its tables and total rate is a Pólya urn
(eq. 4.1): token τ lands in the full cell c with probability

    p_τ(c | S^{τ−1}) = ∏_m Ŝ_fa(m)(c) / Ŝ_pa(m)(c),   Ŝ = α + S^{τ−1},

a product over the table members m (tied members of one table also see the increments of the
same token's earlier members, Cemgil et al. 2019 App. E). The SMC visits the T observed tokens in one
random order shared by all particles (exchangeability makes every order equally likely, so a
fixed order only removes the visible part of the proposal's variance; see the digest's
implementation notes). For each token it draws the free indices — latent nodes, and visible
nodes missing in that token — from their exact conditional given the visible ones, which makes
the incremental weight (eq. 4.11)

    u^τ = p_{τ,V}(c_V | S^{τ−1}) = Σ_l valid(c_V, l) ∏_m Ŝ_fa(m) / Ŝ_pa(m)

independent of the draw (up to the constant (T − τ + 1)/(X − S_V)(c_V), folded into the
multinomial coefficient below). Since u^τ is known before the draw, particles are resampled
*before* the latent draw (a fully adapted filter). The estimate of the evidence is

    log L_X = log Pr(T) + log T! − Σ_u lnΓ(X_u + 1) + Σ_epochs log mean_p W_p

(eq. 4.9; Algorithm 3 with Z started at 1 and the final un-resampled weights included), where
log Pr(T) + log T! = :meth:`BoundModel.log_total_term`. Under ``condition_on`` the total term
is replaced by Σ_c lnΓ(n_c + 1) over the conditioned cells (the multinomial given their totals).

The core is functional: :class:`SMCState`, :func:`init`, :func:`step` and :func:`run_tokens`
(a ``lax.scan`` of the step, jitted once per shapes and static settings). The leading axes of the
state are ``(chain, particle)``; each particle carries only the concatenated table counts and
their column sums (int32), so memory is O(chains × particles × Σ table sizes), independent of the
dense size of X.

On a CPU, :func:`run_smc` runs the same filter by default as a numba kernel
(:mod:`bam_ppl.infer.smc.polya_urn_numba`, ``engine="auto"``) whose resamplings move no counts: rows are
copied into the new particle order only when a token reads them, so its cost does not grow
with the size of the tables. In XLA those reads are element gathers several times slower than
the row reads here, so this core copies the particles' counts at each resampling.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...convert import allocation_inference_data, group
from ...estimate import EvidenceEstimate, pool_runs
from ...models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel, BoundModel, CellLayout
from ...models.sampling import dirichlet_log_draws
from ...parallel import chain_keys, chain_summary, shard_axis, with_attrs
from ...progress import resolve_progress, run_in_chunks
from ...types import Array, PRNGKey, as_key, numpy_generator
from ...validation import check_choice, check_int, check_positive, renamed_options
from ..info import PolyaUrnInfo
from ..kernels import HAVE_NUMBA, resolve_kernel
from ..prepare import Prepared
from ..prepare import prepare as prepare_problem
from ..registry import register, register_evidence
from . import polya_urn_numba as smc_numba
from .resampling import RESAMPLERS, weight_summary

# Runs with more particle-token updates than this show a progress bar unless told otherwise.
PROGRESS_BAR_MIN_UPDATES = 50_000_000
# Tokens per jitted call when a progress bar is shown (the bar advances once per call).
PROGRESS_CHUNK_TOKENS = 256
# Keys a run splits from its own key: token order, filter, final resampling, posterior draws.
CHAIN_STREAMS = 4
# VB restarts behind ``method="smc"``'s second sure bound: one in a good basin exposes a filter stuck far
# below it, four guard against a poor one (NMF(4), 4000 tokens: 0.07 s on numba, the filter 0.37 s).
VB_RESTARTS = 4
# The VB restarts' key, folded from the call's: an index no chain reaches (chain c folds in c).
VB_STREAM = 2**31 - 1


class UrnTables(NamedTuple):
    """The model's urn in flat form (see :class:`~bam_ppl.models.allocation.CellLayout`).

    ``concentration`` and ``column_concentration`` are α of all tables, concatenated, and their
    column sums; for member m, observed cell u and free configuration l the table entry is
    ``cell_flat[m, u] + config_flat[m, l]`` and its column ``cell_col[m, u] + config_col[m, l]``.
    ``valid`` (cells × configurations) is None unless the data have missing entries.
    """

    concentration: Array
    column_concentration: Array
    cell_flat: Array
    config_flat: Array
    cell_col: Array
    config_col: Array
    valid: Array | None


class SMCState(NamedTuple):
    """Particle system of ``num_chains`` independent runs.

    The counts are stored entry-major, particles on the last axis: the table entries of one token
    are then M × L contiguous rows of P values, gathered, updated and scattered back as vectors.

    Attributes
    ----------
    counts : int32 (chain, table entries, particle)
        Family counts S_fa of every table, concatenated.
    column_counts : int32 (chain, table columns, particle)
        Their sums over each table's child axis.
    log_weights : float64 (chain, particle)
        Log weights accumulated since the last resampling.
    log_prob : float64 (chain, particle)
        Log urn probability Σ_τ log p_τ(c_τ, l_τ | S^{τ−1}) of each particle's allocation so far
        (eq. 4.1), inherited on resampling; it ranks the final particles without evaluating
        lgamma over every table entry.
    log_evidence : float64 (chain,)
        Σ over completed resampling epochs of log mean_p W_p.
    key : (chain, 2) uint32
        Each run's PRNG key.
    """

    counts: Array
    column_counts: Array
    log_weights: Array
    log_prob: Array
    log_evidence: Array
    key: Array


class SMCInfo(NamedTuple):
    """Per-token diagnostics (BlackJAX-style): ESS before resampling and whether it resampled."""

    ess: Array
    resampled: Array


def urn_tables(bound: BoundModel, layout: CellLayout) -> UrnTables:
    """Device arrays of the urn for ``bound`` and the data's ``layout``."""
    return UrnTables(
        concentration=jnp.asarray(bound.flat_concentration, dtype=jnp.float64),
        column_concentration=jnp.asarray(bound.flat_column_concentration, dtype=jnp.float64),
        cell_flat=jnp.asarray(layout.cell_flat, dtype=jnp.int32),
        config_flat=jnp.asarray(layout.config_flat, dtype=jnp.int32),
        cell_col=jnp.asarray(layout.cell_col, dtype=jnp.int32),
        config_col=jnp.asarray(layout.config_col, dtype=jnp.int32),
        valid=None if layout.valid is None else jnp.asarray(layout.valid),
    )


def init(keys: PRNGKey, urn: UrnTables, num_particles: int) -> SMCState:
    """Empty urns: every particle of every run starts from S = 0 with weight 1."""
    num_chains = keys.shape[0]
    return SMCState(
        counts=jnp.zeros((num_chains, urn.concentration.shape[0], num_particles), jnp.int32),
        column_counts=jnp.zeros((num_chains, urn.column_concentration.shape[0], num_particles), jnp.int32),
        log_weights=jnp.zeros((num_chains, num_particles), jnp.float64),
        log_prob=jnp.zeros((num_chains, num_particles), jnp.float64),
        log_evidence=jnp.zeros((num_chains,), jnp.float64),
        key=keys,
    )


def _token_indices(urn: UrnTables, cell: Array, same_table_before):
    """Table entries, columns and tie increments of one token, shared by all particles.

    Returns ``(entry, column, prior, prior_column)``, each (members, configurations): the flat
    entry/column indices and α at those indices plus the within-token increments of tied members
    (an earlier member of the same table that used the same entry has already added one token).
    """
    entry = urn.cell_flat[:, cell][:, None] + urn.config_flat
    column = urn.cell_col[:, cell][:, None] + urn.config_col
    prior = urn.concentration[entry]
    prior_column = urn.column_concentration[column]
    rows, rows_col = [], []
    for m, earlier in enumerate(same_table_before):
        add = sum((entry[k] == entry[m]).astype(prior.dtype) for k in earlier) if earlier else 0.0
        add_col = sum((column[k] == column[m]).astype(prior.dtype) for k in earlier) if earlier else 0.0
        rows.append(prior[m] + add)
        rows_col.append(prior_column[m] + add_col)
    return entry, column, jnp.stack(rows), jnp.stack(rows_col)


def _configuration_probabilities(counts, column_counts, entry, column, prior, prior_column, valid_row,
                                 rescale_every: int):
    """Urn probabilities of every free configuration for all particles of one run, scaled.

    ``counts`` (entries, P) and ``column_counts`` (columns, P) are one run's particles. Returns
    ``(probabilities, log_scale)`` of shapes (L, P) and (P,) with
    p_τ(c_V, l | S_p) = probabilities[l, p] · exp(log_scale[p]).

    The product over members of eq. 4.1 is taken as one product of numerators Ŝ_fa and one of
    denominators Ŝ_pa, then a single division per configuration: divisions dominate the cost of
    this step on CPUs. Every ``rescale_every`` members (chosen by :func:`rescale_interval` so the
    partial products cannot leave the float64 range) the ratio is divided by its maximum over the
    configurations and the log of that maximum moved to ``log_scale``.
    """
    num_members = entry.shape[0]
    numerator = denominator = None
    log_scale = jnp.zeros(counts.shape[-1], jnp.float64)
    for m in range(num_members):
        factor = prior[m][:, None] + counts[entry[m]]
        column_factor = prior_column[m][:, None] + column_counts[column[m]]
        numerator = factor if numerator is None else numerator * factor
        denominator = column_factor if denominator is None else denominator * column_factor
        if valid_row is not None and m == 0:
            numerator = jnp.where(valid_row[:, None], numerator, 0.0)
        if (m + 1) % rescale_every == 0 and m + 1 < num_members:
            ratio = numerator / denominator
            peak = jnp.max(ratio, axis=0)
            numerator, denominator = ratio / peak, None
            log_scale = log_scale + jnp.log(peak)
    probabilities = numerator if denominator is None else numerator / denominator
    return probabilities, log_scale


def rescale_interval(bound: BoundModel, num_tokens: int) -> int:
    """How many members' factors :func:`_configuration_probabilities` may multiply before rescaling.

    Every numerator factor α + S lies in [min α, max α + T + M] and every denominator factor in
    [min α_col, max α_col + T + M] (M within-token increments of tied members). A product of k
    such factors, and the ratio of two, stays inside the float64 range (2^±1022) with a wide
    margin while k · max |log2 bound| ≤ 900.
    """
    num_members = len(bound.members)
    slack = float(num_tokens + num_members)
    bounds = [bound.flat_concentration.min(), bound.flat_concentration.max() + slack,
              bound.flat_column_concentration.min(), bound.flat_column_concentration.max() + slack]
    widest = max(abs(math.log2(float(b))) for b in bounds)
    return int(min(num_members, max(1, 900 // max(widest, 1.0))))


def _draw_configuration(probabilities, uniforms):
    """Inverse-CDF draw of each particle's configuration from its (L, P) scaled probabilities.

    The probabilities are first rounded down to integer multiples of 2^-52 of their total, so
    every partial sum is an integer below 2^53 and exact in float64 whatever the order of the
    additions. That lets the cumulative sums be one triangular matrix product (XLA's CPU
    ``cumsum`` costs O(L²) per particle) while staying exactly non-decreasing, and keeps
    configurations of probability zero (missing-data constraints) from ever being drawn; the
    rounding drops only configurations below 2^-52 of the total, which float64 sums cannot
    resolve either.

    ``chosen[p]`` counts the configurations whose cumulative mass is at most u_p · total, i.e. it
    is the first l with cumulative mass above that level. Entries at the full total are not
    counted, so a rounding of u_p · total up to the total cannot select a trailing configuration
    of probability zero.
    """
    num_configs = probabilities.shape[0]
    total = jnp.sum(probabilities, axis=0)
    scale = jnp.where(total > 0, 2.0**52 / jnp.where(total > 0, total, 1.0), 0.0)
    lower = jnp.tril(jnp.ones((num_configs, num_configs), probabilities.dtype))
    cumulative = lower @ jnp.floor(probabilities * scale)
    total = cumulative[-1]
    below = (cumulative <= uniforms * total) & (cumulative < total)
    return jnp.sum(below, axis=0, dtype=jnp.int32)


def _add_token(counts, column_counts, entry, column, chosen):
    """Add each particle's drawn configuration to its family and column counts.

    One scatter of M × L rows of P increments (a one-hot row per configuration); it adds, so
    members that share an entry (configurations a member does not depend on, tied tables) count
    every increment.
    """
    num_members, num_configs = entry.shape
    one_hot = (jnp.arange(num_configs, dtype=jnp.int32)[:, None] == chosen[None, :]).astype(counts.dtype)
    increments = jnp.broadcast_to(one_hot, (num_members, *one_hot.shape)).reshape(-1, one_hot.shape[1])
    counts = counts.at[entry.reshape(-1)].add(increments)
    column_counts = column_counts.at[column.reshape(-1)].add(increments)
    return counts, column_counts


def _take_particles(x, ancestors):
    """``x[:, ancestors]`` for (rows, P) ``x``, written as a gather from the flattened array.

    The flat form keeps the result in ``x``'s row-major layout; the column gather ``x[:, a]``
    lets XLA pick a particle-major layout for the resampling branch, which then forces a
    re-layout copy of the whole count array at every token, resampled or not.
    """
    rows, num_particles = x.shape
    dtype = jnp.int32 if rows * num_particles < 2**31 else jnp.int64
    flat = (jnp.arange(rows, dtype=dtype)[:, None] * num_particles + ancestors[None, :]).reshape(-1)
    return x.reshape(-1)[flat].reshape(rows, num_particles)


def step(state: SMCState, cell: Array, urn: UrnTables, *, same_table_before, resampling: str,
         ess_threshold: float, rescale_every: int = 1) -> tuple[SMCState, SMCInfo]:
    """Add one observed token (per run, cell index ``cell`` of shape (chain,)) to every particle.

    1. incremental weight u^τ = p_{τ,V}(c_V | S) of every particle (eq. 4.11);
    2. if ESS < ``ess_threshold`` · P in a run: close its epoch (log mean W into the evidence)
       and resample its particles with the chosen scheme;
    3. draw the free configuration from its exact conditional p(l | c_V, S) (§4.2 proposal);
    4. add the token to the drawn family counts.
    """
    num_particles = state.counts.shape[-1]
    keys = jax.vmap(lambda k: jax.random.split(k, 3))(state.key)
    next_key, resample_key, draw_key = keys[:, 0], keys[:, 1], keys[:, 2]

    def weigh(counts, column_counts, cell):
        entry, column, prior, prior_column = _token_indices(urn, cell, same_table_before)
        valid_row = None if urn.valid is None else urn.valid[cell]
        probs, log_scale = _configuration_probabilities(
            counts, column_counts, entry, column, prior, prior_column, valid_row, rescale_every)
        return entry, column, probs, log_scale

    entry, column, probs, log_scale = jax.vmap(weigh)(state.counts, state.column_counts, cell)
    log_increment = jnp.log(jnp.sum(probs, axis=1)) + log_scale
    log_weights = state.log_weights + log_increment

    ess, epoch = weight_summary(log_weights)
    resample = ess < ess_threshold * num_particles
    log_evidence = jnp.where(resample, state.log_evidence + epoch, state.log_evidence)

    def resample_particles(operands):
        counts, column_counts, probs, log_scale, log_prob = operands
        resampler = RESAMPLERS[resampling]
        drawn = jax.vmap(lambda k, w: resampler(k, w, num_particles))(resample_key, log_weights)
        identity = jnp.arange(num_particles, dtype=jnp.int32)
        ancestors = jnp.where(resample[:, None], drawn, identity[None, :])
        tables = tuple(jax.vmap(_take_particles)(x, ancestors) for x in (counts, column_counts, probs))
        per_particle = tuple(jnp.take_along_axis(x, ancestors, axis=1) for x in (log_scale, log_prob))
        return tables + per_particle

    # A real branch (the predicate is one scalar): the resampler and the O(P × table size) copy
    # run only for tokens where some run resamples; otherwise the carry passes through unchanged.
    counts, column_counts, probs, log_scale, log_prob = lax.cond(
        jnp.any(resample), resample_particles, lambda operands: operands,
        (state.counts, state.column_counts, probs, log_scale, state.log_prob))
    log_weights = jnp.where(resample[:, None], 0.0, log_weights)

    # 32 random bits per draw (half the bits of a float64 uniform), exact in float64: u ∈ [0, 1)
    # on a grid of 2^-32, far finer than the float64 rounding of the probabilities themselves.
    bits = jax.vmap(lambda k: jax.random.bits(k, (num_particles,), jnp.uint32))(draw_key)
    uniforms = bits.astype(jnp.float64) * 2.0 ** -32
    chosen = jax.vmap(_draw_configuration)(probs, uniforms)
    chosen_prob = jnp.take_along_axis(probs, chosen[:, None, :], axis=1)[:, 0]
    log_prob = log_prob + jnp.log(chosen_prob) + log_scale
    counts, column_counts = jax.vmap(_add_token)(counts, column_counts, entry, column, chosen)
    new_state = SMCState(counts, column_counts, log_weights, log_prob, log_evidence, next_key)
    return new_state, SMCInfo(ess=ess, resampled=resample)


@partial(jax.jit, static_argnames=("same_table_before", "resampling", "rescale_every"))
def run_tokens(state: SMCState, cells: Array, active: Array, urn: UrnTables, ess_threshold: Array, *,
               same_table_before, resampling: str, rescale_every: int = 1) -> tuple[SMCState, SMCInfo]:
    """``lax.scan`` of :func:`step` over a block of tokens.

    ``cells`` is (tokens, chain): the observed cell of each token in each run's order. ``active``
    (tokens,) is False for padding at the end of the last block, where the state is left as is.
    """

    def body(state, inputs):
        cell, is_active = inputs
        stepped = partial(step, urn=urn, same_table_before=same_table_before, resampling=resampling,
                          ess_threshold=ess_threshold, rescale_every=rescale_every)
        idle = lambda s, _: (s, SMCInfo(jnp.full(s.log_evidence.shape, jnp.nan, jnp.float64),
                                        jnp.zeros(s.log_evidence.shape, bool)))
        return lax.cond(is_active, stepped, idle, state, cell)

    return lax.scan(body, state, (cells, active))


def finish(state: SMCState) -> Array:
    """Per-run log of the product of epoch means, including the last, un-resampled epoch."""
    num_particles = state.log_weights.shape[1]
    return state.log_evidence + jax.nn.logsumexp(state.log_weights, axis=-1) - math.log(num_particles)


def _token_orders(keys: PRNGKey, tokens: np.ndarray, *, padded: int) -> np.ndarray:
    """(padded, chain) observed cells: one random order of the tokens per run (from its key in
    ``keys``), zero-padded.

    The order is shared by that run's particles (§7 notes); ``tokens`` lists each observed
    cell once per token. Drawn on the host, by a NumPy generator seeded with the run's raw key:
    a JAX permutation would compile anew for every number of tokens.
    """
    orders = np.zeros((padded, keys.shape[0]), np.int32)
    for run, key in enumerate(np.asarray(keys, np.uint32)):
        orders[:tokens.shape[0], run] = np.random.default_rng(key).permutation(tokens)
    return orders


@jax.jit
def _close_runs(state: SMCState):
    """Per-run log evidence (up to the data constant) and each run's most probable particle.

    The most probable allocation among the final particles (taken before the final resampling,
    which could drop it) and its log urn probability.
    """
    best = jnp.argmax(state.log_prob, axis=-1)
    chain_idx = jnp.arange(state.counts.shape[0])
    return finish(state), state.counts[chain_idx, :, best], state.log_prob[chain_idx, best]


@partial(jax.jit, static_argnames=("resampling",))
def _final_particles(state: SMCState, keys: PRNGKey, *, resampling: str):
    """Equally weighted particles by a final resampling (§4.2, Algorithm 3), particle-major
    (chain, particle, entries) as in :class:`SMCResult`; run c resamples with ``keys[c]``."""
    num_particles = state.counts.shape[-1]
    resampler = RESAMPLERS[resampling]
    ancestors = jax.vmap(lambda k, w: resampler(k, w, num_particles))(keys, state.log_weights)
    take = jax.vmap(lambda x, a: x[:, a].T)
    return take(state.counts, ancestors), take(state.column_counts, ancestors)


class SMCResult(NamedTuple):
    """Output of :func:`run_smc` (numpy arrays).

    ``chain_log_evidence`` (chain,) is each run's full log L_X estimate; ``counts`` (chain,
    particle, entries) the equally weighted particles after the final resampling (None when
    run with ``keep_particles=False``); ``best_counts`` (chain, entries) the final particle whose
    allocation is most probable (the "most likely decomposition" of Cemgil et al. 2019 §5.2, Fig. 13)
    and ``best_log_prob`` its log urn probability Σ_τ log p_τ (eq. 4.1); ``ess`` and
    ``resampled`` (chain, token) the per-token diagnostics.
    """

    chain_log_evidence: np.ndarray
    counts: np.ndarray
    column_counts: np.ndarray
    best_counts: np.ndarray
    best_log_prob: np.ndarray
    ess: np.ndarray
    resampled: np.ndarray
    best_log_joint: np.ndarray  # (chain,) log p(X, z) of the best particle: a sure lower bound


class FilterOutput(NamedTuple):
    """What one kernel (JAX or numba) hands back from the filter, before the data constant is added:
    per-run log evidence, the best final particle's counts and log π, the final particles' counts
    (None without ``keep_particles``) and the (chain, token) ESS and resampling traces."""

    chain_log_evidence: Array
    best_counts: Array
    best_log_prob: Array
    counts: Array | None
    column_counts: Array | None
    ess: Array
    resampled: Array


def _check_options(num_particles, num_chains, ess_threshold, resampling, max_configs, progress_bar):
    check_int(num_particles, "num_particles", minimum=1)
    check_int(num_chains, "num_chains", minimum=1)
    check_positive(ess_threshold, "ess_threshold", upper=1.0, allow_zero=True)
    if not isinstance(resampling, str):
        raise TypeError(f"resampling must be a string, got {type(resampling).__name__}")
    check_choice(resampling, "resampling", RESAMPLERS)
    check_int(max_configs, "max_configs", minimum=1)
    resolve_progress(progress_bar)  # validates


@renamed_options(kernel="engine")
def run_smc(model: AllocationModel, data, rng_key=0, *, num_particles: int = 1000, num_chains: int = 4,
            ess_threshold: float = 0.5, resampling: str = "systematic",
            max_configs: int = DEFAULT_MAX_CONFIGS, progress_bar: bool | None = None,
            keep_particles: bool = True, engine: str = "auto") -> SMCResult:
    """Run ``num_chains`` independent Pólya-urn SMC runs of ``num_particles`` particles.

    Parameters
    ----------
    model : AllocationModel
    data : array-like or CountTensor
        Counts, or samples with missing entries (``CountTensor.from_samples``).
    rng_key : int or JAX key
    num_particles, num_chains : int
    ess_threshold : float in [0, 1]
        Resample a run when its ESS drops below ``ess_threshold · num_particles``; 0 gives plain
        sequential importance sampling (never resampled, unbiased).
    resampling : {"systematic", "stratified", "multinomial", "residual"}
    max_configs : int
        Largest number of joint free-node configurations to enumerate per token.
    progress_bar : bool or None
        tqdm bar over blocks of tokens; None shows it for long runs only.
    keep_particles : bool
        Resample the final particles and return their counts (needed for the posterior only;
        the evidence alone skips this O(chains × P × Σ table sizes) copy and transfer).
    engine : {"auto", "jax", "numba"}
        What runs the filter (formerly ``kernel``): the JAX core (``vmap`` over particles,
        ``lax.scan`` over tokens; any JAX device) or the numba CPU kernel
        (:mod:`bam_ppl.infer.smc.polya_urn_numba`, extra ``fast``), whose resamplings move no
        counts, so its cost does not grow with the size of the tables. ``"auto"`` picks numba on
        a CPU when it is installed. Same estimator, other random streams.
    """
    _check_options(num_particles, num_chains, ess_threshold, resampling, max_configs, progress_bar)
    problem = prepare_problem(model, data, max_configs=max_configs, algorithm="the SMC")
    return _run_prepared(problem, rng_key, num_particles=num_particles, num_chains=num_chains,
                         ess_threshold=ess_threshold, resampling=resampling, progress_bar=progress_bar,
                         keep_particles=keep_particles, kernel=engine)


def _run_prepared(problem: Prepared, rng_key, *, num_particles, num_chains, ess_threshold, resampling,
                  progress_bar, keep_particles, kernel, first_chain=0) -> SMCResult:
    """:func:`run_smc` on a problem already validated and bound, runs ``first_chain ..``.

    Run c splits ``fold_in(rng_key, c)`` (:func:`bam_ppl.parallel.chain_keys`) into the keys of
    its token order, its filter, its final resampling and (:func:`smc`) its posterior draws, so
    it is the same run alone or beside others.
    """
    kernel = resolve_kernel(kernel)
    key = as_key(rng_key)
    data, bound, layout, constant = problem
    num_tokens = data.total
    progress_bar = resolve_progress(
        progress_bar, long_run=num_tokens * num_particles * num_chains > PROGRESS_BAR_MIN_UPDATES)
    with jax.enable_x64(True):
        order_keys, run_keys, final_keys, _ = chain_keys(key, num_chains, first_chain, parts=CHAIN_STREAMS)
        block = min(num_tokens, PROGRESS_CHUNK_TOKENS) if progress_bar else num_tokens
        num_blocks = -(-num_tokens // block)
        padded = num_blocks * block
        tokens = np.repeat(np.arange(data.nnz, dtype=np.int32), data.counts)
        cells = _token_orders(order_keys, tokens, padded=padded)
        rescale_every = rescale_interval(bound, num_tokens)
        run = _run_numba if kernel == "numba" else _run_jax
        out = run(
            bound, layout, cells, num_tokens=num_tokens, block=block, num_chains=num_chains,
            num_particles=num_particles, ess_threshold=ess_threshold, resampling=resampling,
            rescale_every=rescale_every, progress_bar=progress_bar, keep_particles=keep_particles,
            run_keys=run_keys, final_keys=final_keys)
    return SMCResult(
        chain_log_evidence=np.asarray(out.chain_log_evidence) + constant,
        counts=None if out.counts is None else np.asarray(out.counts, np.int32),
        column_counts=None if out.column_counts is None else np.asarray(out.column_counts, np.int32),
        best_counts=np.asarray(out.best_counts, np.int32),
        best_log_prob=np.asarray(out.best_log_prob),
        ess=np.asarray(out.ess),
        resampled=np.asarray(out.resampled),
        best_log_joint=np.asarray(out.best_log_prob) + constant,
    )


def _over_token_blocks(advance, carry, num_tokens: int, block: int, progress_bar: bool, description: str):
    """``advance(carry, rows)`` over the token slices of ``block`` tokens, with a bar over blocks."""
    return run_in_chunks(lambda c, b, _: advance(c, slice(b * block, (b + 1) * block)), carry,
                         -(-num_tokens // block), chunk=1, show=progress_bar, description=description,
                         unit="block")


def _run_jax(bound, layout, cells, *, num_tokens, block, num_chains, num_particles, ess_threshold,
             resampling, rescale_every, progress_bar, keep_particles, run_keys, final_keys):
    """The JAX core over all tokens; see :func:`run_smc`."""
    urn = urn_tables(bound, layout)
    active = jnp.arange(cells.shape[0]) < num_tokens
    state = init(run_keys, urn, num_particles)
    state = shard_axis(state, num_particles, -1, "particles")  # particles split across jax.devices()
    threshold = jnp.asarray(ess_threshold, jnp.float64)
    infos = []

    def advance(state, rows):
        state, info = run_tokens(state, cells[rows], active[rows], urn, threshold,
                                 same_table_before=layout.same_table_before, resampling=resampling,
                                 rescale_every=rescale_every)
        infos.append(info)
        return state

    state = _over_token_blocks(advance, state, num_tokens, block, progress_bar,
                               f"SMC ({num_chains}×{num_particles})")
    chain_log, best_counts, best_log_prob = _close_runs(state)
    counts = column_counts = None
    if keep_particles:
        counts, column_counts = _final_particles(state, final_keys, resampling=resampling)
    ess = jnp.concatenate([i.ess for i in infos])[:num_tokens].T
    resampled = jnp.concatenate([i.resampled for i in infos])[:num_tokens].T
    return FilterOutput(chain_log, best_counts, best_log_prob, counts, column_counts, ess, resampled)


def _run_numba(bound, layout, cells, *, num_tokens, block, num_chains, num_particles, ess_threshold,
               resampling, rescale_every, progress_bar, keep_particles, run_keys, final_keys):
    """The numba kernel over all tokens (one NumPy Generator per run); see :func:`run_smc`."""
    host_urn = UrnTables(
        concentration=bound.flat_concentration, column_concentration=bound.flat_column_concentration,
        cell_flat=layout.cell_flat, config_flat=layout.config_flat, cell_col=layout.cell_col,
        config_col=layout.config_col, valid=layout.valid)
    rngs = [numpy_generator(k) for k in run_keys]
    runs = smc_numba.NumbaRuns(host_urn, layout.same_table_before, num_particles, num_tokens, rngs,
                               resampling=resampling, ess_threshold=ess_threshold, rescale_every=rescale_every)
    cells = np.asarray(cells)[:num_tokens]
    traces = []
    try:
        _over_token_blocks(lambda _, rows: traces.append(runs.run(cells[rows])), None, num_tokens, block,
                           progress_bar, f"SMC ({num_chains}×{num_particles})")
    finally:
        runs.close()
    best_counts, best_log_prob = runs.best_particles()
    counts = column_counts = None
    if keep_particles:
        counts, column_counts = runs.final_particles(
            [numpy_generator(k) for k in final_keys])
    ess = np.concatenate([t.ess for t in traces], axis=1)
    resampled = np.concatenate([t.resampled for t in traces], axis=1)
    return FilterOutput(runs.chain_log_evidence(), best_counts, best_log_prob, counts, column_counts, ess,
                        resampled)


def _draw_posterior(draw_keys: PRNGKey, bound: BoundModel, counts: np.ndarray):
    """θ per particle from Dirichlet(α + S_fa) (eq. 3.10), and λ ~ Gamma(a + T, b + 1).

    Drawn with NumPy on the host (the particles' counts are there already; NumPy's Gamma
    sampler is far faster than JAX's on a CPU), in log space so that tiny concentrations stay
    normalisable; run c from a Generator seeded by ``draw_keys[c]``.
    """
    log_theta, rates = [], []
    for c, key in enumerate(draw_keys):
        rng = numpy_generator(key)
        log_theta.append(dirichlet_log_draws(rng, bound.flat_concentration + counts[c:c + 1], bound.column_of))
        if bound.has_total_term:
            rates.append(rng.gamma(bound.a + bound.total, 1.0 / (bound.b + 1.0), size=(1, counts.shape[1])))
    theta = bound.split_flat(np.exp(np.concatenate(log_theta)))
    return theta, np.concatenate(rates) if rates else None


def _pooled_evidence(idata) -> dict:
    """The root attributes that pool the runs: log L_X and its standard error (:func:`pool_runs`)."""
    value, stderr = pool_runs(group(idata, "sample_stats")["log_marginal_likelihood"].values)
    return dict(log_marginal_likelihood=value, log_marginal_likelihood_stderr=stderr)


@register("smc", models=(AllocationModel,))
@chain_summary(_pooled_evidence)
@renamed_options(kernel="engine")
def smc(model, data, *, rng_key=0, num_particles: int = 1000, num_chains: int = 4,
        ess_threshold: float = 0.5, resampling: str = "systematic",
        max_configs: int = DEFAULT_MAX_CONFIGS, progress_bar: bool | None = None, engine: str = "auto",
        _first_chain: int = 0):
    """Pólya-urn SMC (Cemgil et al. 2019 §4.2): posterior particles and per-run evidence estimates.

    Chains are independent SMC runs; draws are the equally weighted particles after a final
    resampling, each with θ drawn from its Dirichlet posterior (eq. 3.10). ``sample_stats``
    holds ``log_marginal_likelihood`` (chain), the ``ess`` trace and ``resampled`` flags (chain,
    token), and ``best_particle_counts_<table>`` (chain, *table dims): the family counts of each
    run's most probable final allocation (Cemgil et al. 2019 §5.2, Fig. 13). See :func:`run_smc` for
    the options. Run c draws from ``fold_in(rng_key, c)`` alone, so ``bam.infer(...,
    executor=...)`` runs it as a task of its own (private option ``_first_chain=c``).
    """
    _check_options(num_particles, num_chains, ess_threshold, resampling, max_configs, progress_bar)
    first_chain = check_int(_first_chain, "_first_chain", minimum=0)
    kernel = engine
    problem = prepare_problem(model, data, max_configs=max_configs, algorithm="the SMC")
    result = _run_prepared(problem, rng_key, num_particles=num_particles, num_chains=num_chains,
                           ess_threshold=ess_threshold, resampling=resampling, progress_bar=progress_bar,
                           keep_particles=True, kernel=kernel, first_chain=first_chain)
    data, bound = problem.data, problem.bound
    draw_keys = chain_keys(rng_key, num_chains, first_chain, parts=CHAIN_STREAMS)[-1]
    theta, rate = _draw_posterior(draw_keys, bound, result.counts)
    stats = {
        "log_marginal_likelihood": (("chain",), result.chain_log_evidence),
        "ess": (("chain", "token"), result.ess),
        "resampled": (("chain", "token"), result.resampled),
        "best_particle_log_prob": (("chain",), result.best_log_prob),
    }
    for table in bound.tables:
        stats[f"best_particle_counts_{table.name}"] = (
            ("chain", *table.dims), bound.split_flat(result.best_counts)[table.name])
    idata = allocation_inference_data(
        bound, data, theta=theta, total_rate=rate, method="smc", sample_stats=stats,
        attrs=dict(num_particles=num_particles, num_chains=num_chains, ess_threshold=ess_threshold,
                   resampling=resampling, kernel=resolve_kernel(kernel)),
    )
    return with_attrs(idata, _pooled_evidence(idata))


@register_evidence("smc", models=(AllocationModel,))
@renamed_options(kernel="engine")
def smc_log_evidence(model, data, *, rng_key=0, num_particles: int = 1000, num_chains: int = 4,
                     ess_threshold: float = 0.5, resampling: str = "systematic",
                     max_configs: int = DEFAULT_MAX_CONFIGS, progress_bar: bool | None = None,
                     engine: str = "auto", vb_restarts: int = VB_RESTARTS):
    """Unbiased Pólya-urn SMC estimate of L_X pooled over ``num_chains`` independent runs.

    The value is the log-mean-exp of the runs' estimates; its standard error comes from their
    spread (:func:`bam_ppl.evidence.pool_runs`). ``lower_bound`` is log p(X, z) of the
    most probable final particle over all runs, a sure lower bound on log L_X; ``info`` (a
    :class:`~bam_ppl.infer.info.PolyaUrnInfo`) holds ``min_ess`` and the resampling rate. The token-by-token filter can
    collapse onto a few allocation histories when T is large (thousands of tokens); then its
    runs disagree or fall below the lower bound and an EvidenceWarning says so. Where a very
    small concentration makes the urn open a component with vanishing probability (a sparse
    prior on mixing weights), every run can miss the allocations that hold the mass and agree
    on a value far too low; the best ELBO of ``vb_restarts`` random VB restarts
    (``info.vb_bound``, a second sure lower bound; 0: none) lets the EvidenceWarning see it.
    """
    start = time.perf_counter()
    _check_options(num_particles, num_chains, ess_threshold, resampling, max_configs, progress_bar)
    check_int(vb_restarts, "vb_restarts", minimum=0)
    problem = prepare_problem(model, data, max_configs=max_configs, algorithm="the SMC")
    result = _run_prepared(problem, rng_key, num_particles=num_particles, num_chains=num_chains,
                           ess_threshold=ess_threshold, resampling=resampling, progress_bar=progress_bar,
                           keep_particles=False, kernel=engine)
    value, stderr = pool_runs(result.chain_log_evidence)
    lower_bound = float(np.max(result.best_log_joint))
    vb_bound = _vb_bound(problem, rng_key, vb_restarts)
    runs = result.chain_log_evidence.tolist()
    return EvidenceEstimate(
        value=value, stderr=stderr, method="smc", kind="estimate", lower_bound=lower_bound,
        run_values=tuple(runs), seconds=time.perf_counter() - start,
        details=dict(run_log_evidence=runs, chain_log_evidence=runs, lower_bound=lower_bound),
        info=PolyaUrnInfo(num_particles=num_particles, num_chains=num_chains,
                     min_ess=float(np.min(result.ess)) if result.ess.size else float(num_particles),
                     num_resamplings=result.resampled.sum(axis=-1).tolist(), ess_threshold=ess_threshold,
                     resampling=resampling, resampling_rate=float(result.resampled.mean()), vb_bound=vb_bound),
    )


def _vb_bound(problem: Prepared, rng_key, num_restarts: int) -> float:
    """The best ELBO of ``num_restarts`` random VB restarts on the prepared problem (a sure lower
    bound on log L_X; -inf without restarts)."""
    from ..variational import vb

    if num_restarts == 0:
        return -math.inf
    data, bound, layout, _ = problem
    with jax.enable_x64(True):
        cells = vb.build_problem(bound, data, layout)
        keys = jax.random.split(jax.random.fold_in(as_key(rng_key), VB_STREAM), num_restarts)
        result = vb.run(keys, cells, num_iters=vb.NUM_ITERS, tol=vb.TOL, engine="numba" if HAVE_NUMBA else "jax")
    return float(np.max(np.asarray(result.elbo)))
