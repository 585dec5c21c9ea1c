"""Collapsed Gibbs sampling of token allocations for any allocation model (notes/bam_digest.md §9).

The Pólya-Bayes process of Cemgil et al. 2019 §4.1 is exchangeable: the probability of a sequence of
tokens depends only on the final counts (eq. 4.2). Any token can therefore be treated as the last
one. Removing it (the reverse process, eq. 4.4) and redrawing its free configuration (latent
nodes, and visible nodes that are missing for that token) from the urn's one-step conditional

    p(c_free | c_visible, S^{-τ}) ∝ ∏_m (α_fa(m) + S^{-τ}_fa(m))(c) / (α_pa(m) + S^{-τ}_pa(m))(c)

(eq. 4.1, restricted to the configurations consistent with the token's observed cell) is a Gibbs
update whose stationary distribution is π(S | X). Θ and λ stay integrated out; for each kept
sample the tables are drawn from their conditional posterior Dirichlet(α + S_fa) (eq. 3.10), so
the output is an ordinary MCMC sample of Θ that ArviZ can diagnose.

The state is the configuration of every token and the concatenated table counts and column
counts laid out by :meth:`BoundModel.cell_layout`. One sweep is a ``lax.scan`` over the tokens;
chains are ``vmap``-ed. A sweep costs O(T × configurations × table members): it scales with the
number of tokens, never with the dense size of X. On a CPU the same sweep also runs as a numba
kernel (:mod:`bam_ppl.infer.gibbs.collapsed_numba`, option ``engine``); log π(S) of the kept samples is
computed by the same JAX code for both kernels, the Θ draws of the numba kernel with NumPy on the
host (:class:`HostDraws`), where the states already are.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln
from scipy.special import gammaln as np_gammaln

from ...convert import allocation_inference_data
from ...models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel, BoundModel, CellLayout
from ...models.sampling import dirichlet_log_draws
from ...parallel import chain_keys, shard_axis
from ...progress import resolve_progress, run_in_chunks
from ...types import as_key, numpy_generator
from ...validation import check_choice, check_int, renamed_options
from ..kernels import KERNELS, resolve_kernel  # noqa: F401  (KERNELS: tempered SMC takes it from here)
from ..prepare import prepare
from ..registry import register
from . import collapsed_numba as gibbs_numba

INITS = ("urn", "uniform")
TOKEN_ORDERS = ("random", "fixed")
CHAIN_METHODS = ("vectorized", "sequential")
PROGRESS_UPDATES = 20
RECORD_BLOCK_BYTES = 2**26  # kept states the numba kernel hands to one compiled record call


class GibbsSpec(NamedTuple):
    """Static (hashable) structure of the sampler.

    The urn conditional is a product of ratios; each factor is a *row*: a (member, count or
    column) pair whose index into the concatenated count vector depends on the configuration.
    ``numerator_rows`` are table counts, ``denominator_rows`` column counts; ``ties`` lists
    (row, earlier row) pairs of tied members whose within-token increment enters the factor;
    ``moved`` lists the rows whose count a token changes when it moves. ``log_space`` says
    whether the products could leave the float32 range, so that they are summed as logs.
    """

    num_configs: int
    num_table_entries: int
    numerator_rows: tuple[int, ...]
    denominator_rows: tuple[int, ...]
    ties: tuple[tuple[int, int], ...]
    moved: tuple[int, ...]
    log_space: bool
    has_valid: bool
    has_total_term: bool
    token_order: str


class GibbsProblem(NamedTuple):
    """Arrays describing the data and the prior, shared by all chains."""

    token_cell: jax.Array  # (T,) observed cell of each token
    row_base: jax.Array  # (R, U) index of each row at each cell
    row_offset: jax.Array  # (R, L) offset added by each free configuration
    valid: jax.Array  # (U, L) configurations allowed by each cell ((1, 1) without missing data)
    concentration: jax.Array  # (F + C,) α of every table entry, then of every column
    column_of: jax.Array  # (F,) column of each table entry
    fixed_counts: jax.Array  # (F + C,) counts that no configuration changes
    log_joint_constant: jax.Array  # terms of log π(S) that do not depend on the allocation
    rate_shape: jax.Array  # a + T: shape of λ | S (eq. 3.10)
    rate_rate: jax.Array  # b + 1


class GibbsState(NamedTuple):
    """One chain: the free configuration of every token and the counts it implies.

    ``counts`` holds the table counts S_fa of every table, concatenated (F entries), followed by
    their column sums (C entries), so that one gather and one scatter serve a token.
    """

    config: jax.Array  # (T,) int32
    counts: jax.Array  # (F + C,) int32


class GibbsDraw(NamedTuple):
    """What is kept per sample: Θ ~ Dirichlet(α + S), λ ~ Gamma(a + T, b + 1) and log π(S)."""

    theta: jax.Array  # (F,)
    total_rate: jax.Array  # ()
    log_joint: jax.Array  # ()


def _varies(offsets: np.ndarray) -> bool:
    return bool((offsets != offsets[0]).any())


def build_problem(bound: BoundModel, data, layout: CellLayout,
                  token_order: str = "random") -> tuple[GibbsSpec, GibbsProblem]:
    """Arrays and static structure of the sampler for ``data`` under ``bound``."""
    M, U, L = layout.num_members, data.nnz, layout.num_configs
    F = int(bound.table_starts[-1])
    before = layout.same_table_before
    # (member, kind) -> base (U,) and offset (L,) into the concatenated count vector.
    index = {}
    for m in range(M):
        index[m, "count"] = (layout.cell_flat[m], layout.config_flat[m])
        index[m, "column"] = (layout.cell_col[m] + F, layout.config_col[m])
    varies = {key: _varies(offset) for key, (_, offset) in index.items()}
    # A factor whose index does not depend on the configuration is the same for every
    # configuration and is left out, unless a tied member earlier in the same token moves.
    needed = [
        (m, kind) for kind in ("count", "column") for m in range(M)
        if varies[m, kind] or any(varies[k, kind] for k in before[m])
    ]
    rows = list(needed)
    for m, kind in needed:
        rows.extend((k, kind) for k in before[m] if (k, kind) not in rows)
    row_of = {key: r for r, key in enumerate(rows)}
    numerator = tuple(row_of[key] for key in needed if key[1] == "count")
    denominator = tuple(row_of[key] for key in needed if key[1] == "column")
    alpha = bound.flat_concentration
    alpha_col = bound.flat_column_concentration
    # Every factor lies in [α_min, α_max + T]; multiply directly in float32 when no partial
    # product can leave [1e-30, 1e30], otherwise add logs.
    smallest = np.log10(min(alpha.min(), alpha_col.min()))
    largest = np.log10(max(alpha.max(), alpha_col.max()) + data.total)
    extremes = [len(rows_) * bound_ for rows_ in (numerator, denominator) for bound_ in (smallest, largest)]
    extremes += [len(numerator) * smallest - len(denominator) * largest,
                 len(numerator) * largest - len(denominator) * smallest]
    spec = GibbsSpec(
        num_configs=L,
        num_table_entries=F,
        numerator_rows=numerator,
        denominator_rows=denominator,
        ties=tuple((row_of[m, kind], row_of[k, kind]) for m, kind in needed for k in before[m]),
        moved=tuple(r for r, key in enumerate(rows) if varies[key]),
        log_space=bool(max(abs(e) for e in extremes) > 30),
        has_valid=layout.valid is not None,
        has_total_term=bound.has_total_term,
        token_order=token_order,
    )
    fixed = np.zeros(alpha.size + alpha_col.size, np.int64)
    for key, (base, offset) in index.items():
        if not varies[key]:
            np.add.at(fixed, base + offset[0], data.counts)
    # log π(S) (eq. 3.11) = constant + Σ lnΓ(α + S) − Σ lnΓ(α_col + S_col) − Σ ln S(i)!
    constant = (bound.log_total_term() + bound.conditioned_log_factorials(data)
                - np_gammaln(alpha).sum() + np_gammaln(alpha_col).sum())
    valid = layout.valid if layout.valid is not None else np.ones((1, 1), bool)
    b = bound.b if bound.b is not None else 1.0
    problem = GibbsProblem(
        token_cell=np.repeat(np.arange(U), data.counts).astype(np.int32),
        row_base=np.array([index[key][0] for key in rows], np.int32).reshape(len(rows), U),
        row_offset=np.array([index[key][1] for key in rows], np.int32).reshape(len(rows), L),
        valid=np.asarray(valid),
        concentration=np.concatenate([alpha, alpha_col]).astype(np.float64),
        column_of=bound.column_of.astype(np.int32),
        fixed_counts=fixed.astype(np.int32),
        log_joint_constant=np.float64(constant),
        rate_shape=np.float64(bound.a + data.total),
        rate_rate=np.float64(b + 1.0),
    )
    return spec, problem


# -- the urn conditional ---------------------------------------------------------------------------
def _redraw(spec: GibbsSpec, problem: GibbsProblem, counts, cell, old, uniform, remove: bool):
    """Remove one token (if ``remove``), redraw its configuration, add it back.

    The conditional is eq. 4.1 with the token's own increments taken out of the counts: over
    the configurations of the token's cell, the product of the numerator rows' (α + S^{−τ})
    divided by the product of the denominator rows'.
    """
    index = problem.row_base[:, cell][:, None] + problem.row_offset  # (R, L)
    moved = jnp.asarray(spec.moved, jnp.int32)
    value = counts[index]
    if remove:
        # S^{−τ} without a scatter: subtract the token's old increments where indices coincide.
        old_index = index[moved, old]
        value = value - jnp.sum(index[:, :, None] == old_index, axis=-1, dtype=value.dtype)
    value = problem.concentration.astype(jnp.float32)[index] + value.astype(jnp.float32)
    for row, earlier in spec.ties:  # the token's own increment in a tied table
        value = value.at[row].add((index[earlier] == index[row]).astype(jnp.float32))
    numerator = value[jnp.asarray(spec.numerator_rows, jnp.int32)]
    denominator = value[jnp.asarray(spec.denominator_rows, jnp.int32)]
    if spec.log_space:
        logp = jnp.sum(jnp.log(numerator), axis=0) - jnp.sum(jnp.log(denominator), axis=0)
        if spec.has_valid:
            logp = jnp.where(problem.valid[cell], logp, -jnp.inf)
        weight = jnp.exp(logp - logp.max())
    else:
        weight = jnp.prod(numerator, axis=0) / jnp.prod(denominator, axis=0)
        if spec.has_valid:
            weight = jnp.where(problem.valid[cell], weight, 0.0)
    # Inverse-CDF draw with one uniform number per token.
    cdf = jnp.cumsum(weight)
    new = jnp.minimum(jnp.sum(cdf < uniform * cdf[-1]), spec.num_configs - 1).astype(jnp.int32)
    new_index = index[moved, new]
    if remove:
        step = jnp.concatenate([jnp.full(moved.shape, -1, counts.dtype), jnp.ones(moved.shape, counts.dtype)])
        counts = counts.at[jnp.concatenate([old_index, new_index])].add(step)
    else:
        counts = counts.at[new_index].add(1)
    return counts, new


def _token_order(spec: GibbsSpec, key, num_tokens: int):
    if spec.token_order == "random":
        return jax.random.permutation(key, num_tokens).astype(jnp.int32)
    return jnp.arange(num_tokens, dtype=jnp.int32)


def sweep(spec: GibbsSpec, problem: GibbsProblem, key, state: GibbsState) -> GibbsState:
    """One Gibbs sweep: every token is removed and redrawn from the urn conditional once."""
    key_order, key_draw = jax.random.split(key)
    order = _token_order(spec, key_order, problem.token_cell.shape[0])
    uniforms = jax.random.uniform(key_draw, order.shape, jnp.float32)

    def step(counts, token):
        cell, old, uniform = token
        return _redraw(spec, problem, counts, cell, old, uniform, remove=True)

    counts, new = jax.lax.scan(step, state.counts, (problem.token_cell[order], state.config[order], uniforms))
    return GibbsState(state.config.at[order].set(new), counts)


def init(spec: GibbsSpec, problem: GibbsProblem, key, method: str = "urn") -> GibbsState:
    """Initial allocation of one chain.

    ``"urn"`` adds the tokens one at a time, in random order, each drawn from the Pólya-urn
    conditional given the tokens already placed (one particle of the SMC proposal, Cemgil et al. 2019
    §4.2); ``"uniform"`` draws every token's configuration uniformly among those its cell allows.
    """
    num_tokens = problem.token_cell.shape[0]
    moved = jnp.asarray(spec.moved, jnp.int32)
    if method == "uniform":
        logits = jnp.zeros((num_tokens, spec.num_configs), jnp.float32)
        if spec.has_valid:
            logits = jnp.where(problem.valid[problem.token_cell], logits, -jnp.inf)
        config = jax.random.categorical(key, logits).astype(jnp.int32)
        index = problem.row_base[moved][:, problem.token_cell] + problem.row_offset[moved][:, config]
        return GibbsState(config, problem.fixed_counts.at[index.reshape(-1)].add(1))

    key_order, key_draw = jax.random.split(key)
    order = jax.random.permutation(key_order, num_tokens).astype(jnp.int32)
    uniforms = jax.random.uniform(key_draw, order.shape, jnp.float32)

    def add(counts, token):
        cell, uniform = token
        return _redraw(spec, problem, counts, cell, 0, uniform, remove=False)

    counts, new = jax.lax.scan(add, problem.fixed_counts, (problem.token_cell[order], uniforms))
    return GibbsState(jnp.zeros(num_tokens, jnp.int32).at[order].set(new), counts)


# -- what is kept per sample -----------------------------------------------------------------------
def log_joint(spec: GibbsSpec, problem: GibbsProblem, state: GibbsState):
    """log π(S) of the current allocation (eq. 3.11), in the precision of the problem's floats.

    The multinomial term Σ ln S(i)! groups tokens by (observed cell, configuration); with missing
    entries tokens of different observed patterns stay apart, as in exact enumeration. Sorting
    the group keys makes each token's rank r within its group, and Σ_groups ln n! = Σ_tokens ln r.
    """
    F = spec.num_table_entries
    shifted = gammaln(problem.concentration + state.counts.astype(problem.concentration.dtype))
    value = problem.log_joint_constant + jnp.sum(shifted[:F]) - jnp.sum(shifted[F:])
    key = problem.token_cell.astype(jax.dtypes.canonicalize_dtype(jnp.int64))
    keys = jnp.sort(key * spec.num_configs + state.config)
    position = jnp.arange(keys.shape[0])
    starts = jnp.concatenate([jnp.ones(1, bool), keys[1:] != keys[:-1]])
    rank = position - jax.lax.cummax(jnp.where(starts, position, 0)) + 1
    return value - jnp.sum(jnp.log(rank.astype(shifted.dtype)))


def draw(spec: GibbsSpec, problem: GibbsProblem, key, state: GibbsState) -> GibbsDraw:
    """Θ ~ Dirichlet(α + S_fa) per column, λ ~ Gamma(a + T, b + 1) (eq. 3.10), and log π(S)."""
    key_theta, key_rate = jax.random.split(key)
    # Log-space Gamma draws keep columns with tiny concentrations (a ≪ 1) normalisable.
    F = spec.num_table_entries
    log_gamma = jax.random.loggamma(key_theta, problem.concentration[:F] + state.counts[:F])
    num_columns = problem.concentration.shape[0] - F
    column_max = jax.ops.segment_max(log_gamma, problem.column_of, num_segments=num_columns)
    weights = jnp.exp(log_gamma - column_max[problem.column_of])
    theta = weights / jax.ops.segment_sum(weights, problem.column_of, num_segments=num_columns)[problem.column_of]
    if spec.has_total_term:
        rate = jax.random.gamma(key_rate, problem.rate_shape) / problem.rate_rate
    else:
        rate = jnp.zeros((), problem.rate_shape.dtype)
    return GibbsDraw(theta.astype(jnp.float32), rate, log_joint(spec, problem, state))


class HostDraws:
    """Θ ~ Dirichlet(α + S), λ ~ Gamma(a + T, b + 1) and log π(S) of :func:`draw` with NumPy on the host.

    The numba kernel keeps its states on the host; there NumPy's Gamma sampler is far faster than
    JAX's rejection loops on a CPU, which otherwise dominate a run that keeps many samples, and
    no JAX program is compiled for a new shape of data. Chain c draws from a Generator seeded by
    ``keys[c]``.
    """

    def __init__(self, spec: GibbsSpec, problem: GibbsProblem, keys):
        self.num_table_entries = spec.num_table_entries
        self.all_concentration = np.asarray(problem.concentration, np.float64)
        self.concentration = self.all_concentration[:spec.num_table_entries]
        self.column_of = np.asarray(problem.column_of)
        self.has_total_term = spec.has_total_term
        self.rate_shape, self.rate_rate = float(problem.rate_shape), float(problem.rate_rate)
        self.log_joint_constant = float(problem.log_joint_constant)
        self.token_group = np.asarray(problem.token_cell, np.int64) * spec.num_configs
        self.rngs = [numpy_generator(jnp.asarray(key, jnp.uint32)) for key in keys]

    def log_joint(self, config: np.ndarray, counts: np.ndarray) -> float:
        """log π(S) of :func:`log_joint` in float64: the Dirichlet terms less Σ ln n! over the
        tokens' (observed cell, configuration) groups, each group's size n from a sort."""
        shifted = np_gammaln(self.all_concentration + counts)
        value = self.log_joint_constant + shifted[:self.num_table_entries].sum() - shifted[self.num_table_entries:].sum()
        groups = np.sort(self.token_group + config)
        starts = np.flatnonzero(np.concatenate([[True], groups[1:] != groups[:-1]]))
        return float(value - np_gammaln(np.diff(np.append(starts, groups.size)) + 1.0).sum())

    def __call__(self, chain: int, counts: np.ndarray) -> tuple[np.ndarray, float]:
        """(Θ (F,) float32, λ) for chain ``chain`` at table counts ``counts`` (F,)."""
        rng = self.rngs[chain]
        theta = np.exp(dirichlet_log_draws(rng, self.concentration + counts, self.column_of))
        rate = rng.gamma(self.rate_shape) / self.rate_rate if self.has_total_term else 0.0
        return theta.astype(np.float32), rate


# -- chains ----------------------------------------------------------------------------------------
def _over_chains(fn, chain_method, keys, states):
    """``fn(key, state)`` for every chain: ``vmap``-ed, or one chain after another.

    A sweep is a sequence of small dependent updates; on a CPU, batching chains into each update
    does not always pay, so ``"sequential"`` (``lax.map``) can be the faster choice there.
    """
    if chain_method == "vectorized":
        return jax.vmap(fn)(keys, states)
    return jax.lax.map(lambda pair: fn(*pair), (keys, states))


@functools.partial(jax.jit, static_argnames=("spec", "method"))
def _init_chains(spec, problem, keys, method):
    return jax.vmap(lambda k: init(spec, problem, k, method))(keys)


@functools.partial(jax.jit, static_argnames=("spec", "chain_method"))
def _advance(spec, problem, keys, states, first_sweep, num_sweeps, chain_method="vectorized"):
    """``num_sweeps`` sweeps of every chain; sweep s of a chain uses fold_in(chain key, s).

    The number of sweeps is an argument, not part of the program: a warmup of any length and
    the progress bar's chunks run one compiled program."""

    def body(s, states):
        sweep_keys = jax.vmap(jax.random.fold_in, (0, None))(keys, s)
        return _over_chains(lambda k, st: sweep(spec, problem, k, st), chain_method, sweep_keys, states)

    return jax.lax.fori_loop(first_sweep, first_sweep + num_sweeps, body, states)


@functools.partial(jax.jit, static_argnames=("spec", "capacity", "thinning", "record", "chain_method"))
def _sample(spec, problem, keys, draw_keys, states, first_sweep, first_draw, num_draws, *, capacity, thinning, record,
            chain_method="vectorized"):
    """``num_draws`` kept samples, each after ``thinning`` sweeps, recorded by ``record``.

    The program holds ``capacity`` samples whatever ``num_draws`` (at most ``capacity``), so that
    the progress bar's short first and last chunks run the same program; the samples past
    ``num_draws`` run no sweep and their records are to be dropped."""

    def body(states, d):
        sweeps = jnp.where(d < num_draws, thinning, 0)
        states = _advance(spec, problem, keys, states, first_sweep + d * thinning, sweeps, chain_method)
        record_keys = jax.vmap(jax.random.fold_in, (0, None))(draw_keys, first_draw + d)
        return states, jax.vmap(lambda k, st: record(spec, problem, k, st))(record_keys, states)

    return jax.lax.scan(body, states, jnp.arange(capacity))


def _chunk_size(num_warmup: int, num_samples: int, progress_bar: bool) -> int:
    """Sweeps per call between two updates of the progress bar: about ``PROGRESS_UPDATES`` chunks
    with a bar, one chunk without."""
    total = num_warmup + num_samples
    return max(math.ceil(total / PROGRESS_UPDATES) if progress_bar else total, 1)


def _warmup_then_samples(warm_up, keep, carry, *, num_warmup: int, num_samples: int, progress_bar: bool):
    """``warm_up(carry, first_sweep, num_sweeps)`` over the warmup sweeps, then ``keep(carry,
    first_draw, num_draws)`` over the kept samples, in the chunks of :func:`run_in_chunks`
    under one bar: about ``PROGRESS_UPDATES`` chunks with a bar, one chunk without."""

    def advance(carry, start, stop):
        if start < num_warmup:
            carry = warm_up(carry, start, min(stop, num_warmup) - start)
        if stop > num_warmup:
            first_draw = max(start, num_warmup) - num_warmup
            carry = keep(carry, first_draw, stop - num_warmup - first_draw)
        return carry

    return run_in_chunks(advance, carry, num_warmup + num_samples, chunk=_chunk_size(num_warmup, num_samples, progress_bar),
                         show=progress_bar, description="gibbs", unit="draw")


def run(rng_key, spec: GibbsSpec, problem: GibbsProblem, *, num_chains: int = 4, num_warmup: int = 500,
        num_samples: int = 500, thinning: int = 1, init_method: str = "urn",
        chain_method: str = "vectorized", progress_bar: bool = False, record=draw, first_chain: int = 0):
    """Run chains ``first_chain .. first_chain + num_chains - 1``; return the final states and the kept records.

    Each record has leading axes ``(num_samples, num_chains)``. ``record(spec, problem, key,
    state)`` maps a state to what is kept (default :func:`draw`). Randomness is tied to the chain
    (chain c splits ``fold_in(rng_key, c)`` into its init, sweep and draw keys) and to the sweep and
    draw numbers, so the result depends neither on the chains run beside it nor on how the run is
    split for the progress bar.
    """
    init_keys, sweep_keys, draw_keys = chain_keys(rng_key, num_chains, first_chain, parts=3)
    states = _init_chains(spec, problem, init_keys, init_method)
    if chain_method == "vectorized":  # chains split across jax.devices()
        states, sweep_keys, draw_keys = shard_axis((states, sweep_keys, draw_keys), num_chains, 0, "chains")
    records = []
    capacity = min(_chunk_size(num_warmup, num_samples, progress_bar), num_samples)

    def warm_up(states, first_sweep, num_sweeps):
        return _advance(spec, problem, sweep_keys, states, first_sweep, num_sweeps, chain_method)

    def keep(states, first_draw, num_draws):
        first_sweep = num_warmup + first_draw * thinning
        states, block = _sample(spec, problem, sweep_keys, draw_keys, states, first_sweep, first_draw, num_draws,
                                capacity=capacity, thinning=thinning, record=record, chain_method=chain_method)
        records.append(block if num_draws == capacity else jax.tree.map(lambda x: np.asarray(x)[:num_draws], block))
        return states

    states = _warmup_then_samples(warm_up, keep, states, num_warmup=num_warmup, num_samples=num_samples,
                                  progress_bar=progress_bar)
    return states, jax.tree.map(lambda *xs: jnp.concatenate(xs), *records)


@functools.partial(jax.jit, static_argnames=("spec", "record"))
def _record_block(spec, problem, draw_keys, configs, counts, first_draw, record):
    """``record`` of a block of kept states (draw, chain, ...); draw d of chain c uses
    fold_in(draw_keys[c], first_draw + d), as :func:`_sample` does.

    The draws of a block are mapped one after another: the Gamma draws are rejection loops,
    and batching a whole block into one loop costs more than the draws one by one.
    """

    def one_draw(inputs):
        d, config, count = inputs
        keys = jax.vmap(jax.random.fold_in, (0, None))(draw_keys, first_draw + d)
        return jax.vmap(lambda k, c, n: record(spec, problem, k, GibbsState(c, n)))(keys, config, count)

    return jax.lax.map(one_draw, (jnp.arange(configs.shape[0]), configs, counts))


def run_numba(rng_key, spec: GibbsSpec, problem: GibbsProblem, *, num_chains: int = 4,
              num_warmup: int = 500, num_samples: int = 500, thinning: int = 1, init_method: str = "urn",
              chain_method: str = "vectorized", progress_bar: bool = False, record=draw, first_chain: int = 0):
    """:func:`run` with the sweeps done by the numba kernel; same arguments and outputs.

    The keys are split as in :func:`run`; each chain's initial allocation and sweeps draw from
    NumPy Generators seeded by its init and sweep keys. With the default ``record`` the Θ and
    λ draws and log π(S) are made on the host (:class:`HostDraws`, a Generator per chain seeded
    by its draw key); another ``record`` records kept sample d of a chain with fold_in(chain draw
    key, d), in blocks of a fixed size (about ``RECORD_BLOCK_BYTES``), so that one compiled call
    serves many samples. The same key gives the same result.
    """
    init_keys, sweep_keys, draw_keys = chain_keys(rng_key, num_chains, first_chain, parts=3)
    chains = gibbs_numba.NumbaChains(spec, problem, np.asarray(init_keys), np.asarray(sweep_keys), init_method,
                                     parallel=chain_method == "vectorized")
    kept = _KeptStates(spec, problem, draw_keys, record, num_samples, chains)

    def warm_up(_, first_sweep, num_sweeps):  # the chains carry their own random streams
        chains.advance(num_sweeps)

    def keep(_, first_draw, num_draws):
        for draw_index in range(first_draw, first_draw + num_draws):
            chains.advance(thinning)
            kept.add(draw_index, chains)

    try:
        _warmup_then_samples(warm_up, keep, None, num_warmup=num_warmup, num_samples=num_samples,
                             progress_bar=progress_bar)
    finally:
        chains.close()
    states = GibbsState(chains.config, chains.counts)
    return states, jax.tree.map(lambda *xs: np.concatenate(xs), *kept.records)


class _KeptStates:
    """The kept states of the numba kernel, recorded in blocks of a fixed size.

    The block size (about ``RECORD_BLOCK_BYTES`` of states) is fixed, so that one compiled
    record call serves every block; a short last block is padded and trimmed. With the default
    ``record`` the Θ and λ draws are made on the host (:class:`HostDraws`) as each state is kept.
    """

    def __init__(self, spec, problem, draw_keys, record, num_samples: int, chains):
        self.spec, self.problem, self.draw_keys = spec, jax.device_put(problem), draw_keys
        self.num_samples = num_samples
        self.host_draws = HostDraws(spec, problem, np.asarray(draw_keys)) if record is draw else None
        self.record = record
        state_bytes = chains.config.nbytes + chains.counts.nbytes
        self.block = int(np.clip(RECORD_BLOCK_BYTES // state_bytes, 1, num_samples))
        self.records = []
        self.configs = self.counts = self.host = None  # the block being filled

    def add(self, draw_index: int, chains) -> None:
        """Keep the chains' current states as kept sample ``draw_index``."""
        d = draw_index % self.block
        if d == 0:  # fresh buffers: a recorded block may still be reading the last ones
            self.host = []
            if self.host_draws is None:
                self.configs = np.empty((self.block, *chains.config.shape), chains.config.dtype)
                self.counts = np.empty((self.block, *chains.counts.shape), chains.counts.dtype)
        if self.host_draws is None:
            self.configs[d], self.counts[d] = chains.config, chains.counts
        else:  # drawn now, from the chains' own states: nothing to buffer
            F = self.spec.num_table_entries
            self.host.append([(*self.host_draws(c, chains.counts[c, :F]),
                               self.host_draws.log_joint(chains.config[c], chains.counts[c]))
                              for c in range(chains.num_chains)])
        if d + 1 == self.block or draw_index + 1 == self.num_samples:
            self._record(draw_index - d, d + 1)

    def _record(self, first_draw: int, size: int) -> None:
        if self.host_draws is not None:
            self.records.append(GibbsDraw(*(np.array([[drawn[i] for drawn in row] for row in self.host])
                                            for i in range(3))))
            return
        self.configs[size:], self.counts[size:] = self.configs[size - 1], self.counts[size - 1]
        recorded = _record_block(self.spec, self.problem, self.draw_keys, self.configs, self.counts, first_draw,
                                 self.record)
        self.records.append(jax.tree.map(lambda x: x[:size], recorded))


# -- registry adapter ------------------------------------------------------------------------------
@register("gibbs", models=(AllocationModel,))
@renamed_options(kernel="engine")
def gibbs(model, data, *, rng_key=0, num_warmup: int = 500, num_samples: int = 500, num_chains: int = 4,
          thinning: int = 1, init: str = "urn", token_order: str = "random",
          chain_method: str = "vectorized", engine: str = "auto", progress_bar: bool | None = None,
          max_configs: int = DEFAULT_MAX_CONFIGS, _first_chain: int = 0):
    """Collapsed Gibbs over token allocations; Θ drawn from Dirichlet(α + S) per kept sample.

    Parameters
    ----------
    model : AllocationModel
    data : array-like or CountTensor
    rng_key : int or JAX key
    num_warmup : int
        Sweeps discarded before the first kept sample (>= 0).
    num_samples : int
        Kept samples per chain.
    num_chains : int
        Independent chains (vmapped by the JAX kernel, threads of the numba kernel). Chain c
        draws from ``fold_in(rng_key, c)`` alone, so ``bam.infer(..., executor=...)`` runs chain
        c as a task of its own (private option ``_first_chain=c``) and gets the same draws.
    thinning : int
        Sweeps between kept samples.
    init : {"urn", "uniform"}
        Initial allocation: sequential Pólya-urn draws, or uniform configurations.
    token_order : {"random", "fixed"}
        Visit the tokens in a fresh random order every sweep, or always in data order.
    chain_method : {"vectorized", "sequential"}
        Run the chains together (JAX: batched with ``vmap``; numba: in parallel threads) or
        one after another (JAX: ``lax.map``); the draws are identical; which is faster on a
        CPU depends on the problem and the free cores (benchmarks/README.md).
    engine : {"auto", "jax", "numba"}
        What runs the sweeps (formerly ``kernel``): a JAX ``lax.scan`` over tokens, or a
        compiled numba loop (CPU, needs the ``fast`` extra), many times faster on a CPU.
        ``"auto"`` picks numba when it is installed and JAX runs on the CPU. The two sample the
        same posterior from different random streams.
    progress_bar : bool or None
        Show a tqdm bar; ``None`` reports long runs (:mod:`bam_ppl.progress`).
    max_configs : int
        Largest number of joint free-node configurations enumerated per token.

    Returns
    -------
    InferenceData
        ``posterior``: ``theta_<table>`` and ``total_rate`` (absent when totals are
        conditioned on); ``sample_stats``: ``log_joint`` = log π(S) of each kept allocation.
    """
    num_warmup = check_int(num_warmup, "num_warmup", minimum=0)
    num_samples = check_int(num_samples, "num_samples")
    num_chains = check_int(num_chains, "num_chains")
    first_chain = check_int(_first_chain, "_first_chain", minimum=0)
    thinning = check_int(thinning, "thinning")
    check_choice(init, "init", INITS)
    check_choice(token_order, "token_order", TOKEN_ORDERS)
    check_choice(chain_method, "chain_method", CHAIN_METHODS)
    kernel = resolve_kernel(engine)
    progress_bar = resolve_progress(progress_bar)
    key = as_key(rng_key)
    data, bound, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="collapsed Gibbs")
    spec, problem = build_problem(bound, data, layout, token_order)
    # log π(S) is accumulated over every table entry and token: float64 keeps it exact to
    # well below a nat; the sweep itself works in explicit float32/int32.
    options = dict(num_chains=num_chains, num_warmup=num_warmup, num_samples=num_samples,
                   thinning=thinning, init_method=init, progress_bar=progress_bar, first_chain=first_chain)
    with jax.enable_x64(True):
        run_kernel = run_numba if kernel == "numba" else run
        _, draws = run_kernel(key, spec, problem, chain_method=chain_method, **options)
        draws = jax.tree.map(lambda x: np.swapaxes(np.asarray(x), 0, 1), draws)
    theta = bound.split_flat(draws.theta)
    return allocation_inference_data(
        bound, data, theta=theta,
        total_rate=draws.total_rate.astype(np.float32) if bound.has_total_term else None,
        method="gibbs",
        sample_stats={"log_joint": (("chain", "draw"), draws.log_joint)},
        attrs=dict(num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                   thinning=thinning, init=init, token_order=token_order, chain_method=chain_method,
                   kernel=kernel),
    )
