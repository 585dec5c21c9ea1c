"""Tempered sequential Monte Carlo over token allocations: an evidence estimator for real data sizes.

Every token τ of the data has a fixed observed cell and a free configuration z_τ (its latent
indices, and its visible indices that are missing). Summing the joint over token-level labels,

    p(X) = exp(C) · Σ_z π₀(z) L(z),

where C is the data-only constant of the Pólya-urn SMC (total-count term, multinomial
coefficients; :meth:`bam_ppl.models.allocation.BoundModel.log_data_constant`), π₀(z) the product over the
tables of the *latent* nodes of their Dirichlet-multinomial sequence probabilities
B(α + S)/B(α) — a proper distribution, drawn exactly token by token from the urn — and L(z) the
same product over the tables of the *visible* nodes. A visible index that is missing in a token
is drawn uniformly among the values its cell allows, and log Z₀ = Σ_τ log(number of allowed
values) makes π₀ a normalised distribution.

The sampler moves P particles through the tempered targets π_β ∝ π₀ L^β, 0 = β₀ < … < β_n = 1:
an SMC sampler (Del Moral, Doucet & Jasra 2006, "Sequential Monte Carlo samplers", JRSS B),
annealed importance sampling when it never resamples (Neal 2001, "Annealed importance
sampling", Statistics and Computing). Each step

1. chooses β_{t+1} by bisection so that the conditional ESS of the incremental weights
   L(z)^{β_{t+1} − β_t} stays at ``rho`` · P (Zhou, Johansen & Aston 2016, "Toward automatic
   model comparison: an adaptive sequential Monte Carlo approach", JCGS), or takes it from a
   fixed ``schedule`` (then the estimate is unbiased);
2. adds log Σ_p W_p L(z_p)^{Δβ} (normalised previous weights W) to log Z;
3. resamples (systematic) when the ESS falls below P / 2;
4. moves every particle with ``num_sweeps`` collapsed-Gibbs sweeps that leave π_β invariant: a
   token is removed and redrawn with probability ∝ [latent-table urn factors] ×
   [visible-table urn factors]^β (the rows of :func:`bam_ppl.infer.gibbs.collapsed.build_problem`).
   Optionally (``cell_moves``, ``pair_moves``, ``node_moves``; numba kernel) Metropolis–Hastings
   block moves follow: all tokens of a cell, all tokens in two configurations, or all tokens in
   two classes of a latent node (:func:`_node_tokens`), are removed and re-placed
   one by one from their tempered conditionals (sequential allocation, Dahl 2005; Jain & Neal
   2004) and the proposal is accepted with probability Π W(new) / Π W(old) (capped at 1), W being
   the sums of the conditional weights along the way.

With small concentrations (a < 1) π₀ puts nearly every token in one configuration and the
posterior's allocations are rare under it. The sampler then starts instead from the latent urn q
with larger concentrations (option ``start_a``) on the geometric path π_β ∝ q^(1−β) (π₀ L)^β;
the incremental weights become (π₀ L / q)^{Δβ} and the moves use q's factors to the power 1 − β.

From an allocation S* (option ``reference``) the start is instead a product over tokens,
q(z) = Π_τ q(cell of τ, z_τ), each cell's urn conditional averaged over posterior Gibbs sweeps
from S* (an estimate of the posterior's marginals, whose product is the product distribution
closest to the posterior), on the path q^(1−β) (π₀ L)^β: q lies near one relabelled copy of the posterior's bulk,
so the path stays short however many tokens there are, and a last reweighting by
|G| q(z) / Σ_g q(g(z)) over the label symmetries G counts the copies it never visits
(:func:`symmetric_log_weights`).

log π₀(z) and log L(z) of every particle are carried along (each move changes them by the log
ratio of the token's factors), so that every visited allocation gives log π(S) (eq. 3.11 of
Cemgil et al. 2020, "Bayesian allocation model: marginal likelihood-based model selection for
count tensors", IEEE JSTSP) for free: the largest of them is a *sure lower bound* on log p(X), since
p(X) = Σ_S π(S) ≥ π(S) for every S.

Two kernels run the particles: a numba CPU kernel (particles are independent Gibbs states, run in
threads) and a JAX kernel (``vmap`` over particles, ``lax.scan`` over tokens, jitted once with β
as an argument) for accelerators.
"""

from __future__ import annotations

import functools
import math
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import gammaln

from ...data import CountTensor
from ...estimate import EvidenceEstimate, EvidenceWarning, pool_runs
from ...models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel, BoundModel
from ...parallel import shard_axis
from ...progress import make_bar, resolve_progress
from ...types import as_key
from ...validation import check_choice, check_int, check_positive, renamed_options
from ..gibbs import collapsed_numba as gibbs_numba
from ..gibbs.chib import configs_of_allocation
from ..gibbs.collapsed import KERNELS, build_problem, resolve_kernel
from ..kernels import compile_numba, inverse_cdf, shuffle
from ..prepare import prepare
from ..registry import register_evidence

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None

RESAMPLE_ESS = 0.5  # resample when the ESS falls below this fraction of the particles
NUM_BLOCKS = 8  # particle blocks of the numba kernel, each with its own random stream
BISECTION_STEPS = 60
MAX_TEMPERATURES = 5_000
# Warn when more than this share of the draws from π₀ have one and the same likelihood.
DEGENERATE_SHARE = 0.5

# what a pass of the numba kernel does with each token
_SWEEP = 0
_URN = 1


# -- problem ---------------------------------------------------------------------------------------
class TemperedProblem(NamedTuple):
    """Host arrays of the tempered sampler (count vector in the numbering of ``new_of_old``)."""

    token_cell: np.ndarray  # (T,) int32, tokens sorted by cell
    cell_start: np.ndarray  # (U + 1,) first token of each cell
    row_base: np.ndarray  # (R, U) int64
    row_offset: np.ndarray  # (R, L) int64
    valid: np.ndarray  # (U, L) bool ((1, 1) without missing data)
    has_valid: bool
    latent_numerators: np.ndarray  # rows of the latent nodes' tables
    latent_denominators: np.ndarray
    visible_numerators: np.ndarray  # rows of the visible nodes' tables
    visible_denominators: np.ndarray
    tie_rows: np.ndarray
    tie_earlier: np.ndarray
    moved: np.ndarray
    log_space: bool
    concentration: np.ndarray  # (F + C,) α of entries then columns (kernel numbering)
    fixed_counts: np.ndarray  # (F + C,) int64
    new_of_old: np.ndarray  # (F + C,) kernel position of every entry
    log_int: np.ndarray  # log n for n = 0..max cell count (log 0 unused)
    num_configs: int
    num_table_entries: int
    log_z0: float  # Σ_τ log(number of configurations the token's cell allows at β = 0)
    constant: float  # C = BoundModel.log_data_constant
    joint_constant: float  # C + Σ_u lnΓ(X_u + 1): log π(S) = this + log π₀ + log L − Σ lnΓ(S + 1)
    entry_table: np.ndarray  # (F,) table of every entry (original numbering)
    column_table: np.ndarray  # (C,) table of every column
    table_is_latent: np.ndarray  # (num tables,) bool
    shift: np.ndarray  # (F + C,) start concentrations minus α on the latent tables (kernel numbering)
    tilted: bool  # whether the start differs from π₀ (a nonzero shift, or a reference)
    log_reference: np.ndarray  # (U, L) log q of the per-cell reference start ((1, 1) unused without one)
    referenced: bool  # whether the start is the per-cell reference q instead of an urn
    gibbs_rows: gibbs_numba.UrnRows  # the urn conditional at β = 1 as the collapsed-Gibbs kernel reads it
    node_swap: np.ndarray  # (N, L, V): configuration l with latent node n set to v (node moves); −1 past its size
    node_size: np.ndarray  # (N,) number of values of each latent node with two or more
    node_child: np.ndarray  # (N, U) value of each such node's first visible child at every cell (−1: none)
    factorised: FactorisedTempered  # the rows as the sweep's fast path reads them (usable False: the general path)


def node_children(bound: BoundModel, data: CountTensor, layout) -> np.ndarray:
    """(N, U) the observed value, at every nonzero cell, of the first visible child of each latent
    node of :func:`node_swaps` (−1 where missing or where the node has no visible child)."""
    model = bound.model
    nodes = [name for name in layout.free if name in model.latent and bound.sizes[name] >= 2]
    out = np.full((len(nodes), data.nnz), -1, np.int64)
    for k, name in enumerate(nodes):
        children = [c for c in model.observed if c in model.dag.children(name)]
        if children:
            out[k] = np.asarray(data.indices)[:, list(model.observed).index(children[0])]
    return out


def configs_with_node(layout, sizes, position: int, value: int) -> np.ndarray:
    """(L,) the configuration that agrees with each of ``layout.configs`` except that the free node
    at ``position`` takes ``value`` (configurations are numbered in C order of ``sizes``)."""
    new = np.array(layout.configs, np.int64)
    new[:, position] = value
    return np.ravel_multi_index(tuple(new.T), sizes)


def node_swaps(bound: BoundModel, layout) -> tuple[np.ndarray, np.ndarray]:
    """The ``node_swap`` and ``node_size`` of :class:`TemperedProblem`: for every free latent node n
    with two values or more, every configuration l and value v, the configuration that agrees with
    l except that n takes v."""
    sizes = [bound.sizes[name] for name in layout.free]
    nodes = [i for i, name in enumerate(layout.free) if name in bound.model.latent and sizes[i] >= 2]
    node_size = np.array([sizes[i] for i in nodes], np.int64)
    swap = np.full((len(nodes), layout.num_configs, int(node_size.max(initial=1))), -1, np.int64)
    for k, i in enumerate(nodes):
        for v in range(sizes[i]):
            swap[k, :, v] = configs_with_node(layout, sizes, i, v)
    return swap, node_size


def _row_tables(bound: BoundModel, row_base, row_offset, F: int) -> np.ndarray:
    """The table each row of the urn conditional reads (from the index range its entries fall in)."""
    starts, cstarts = bound.table_starts, bound.column_starts
    first = row_base[:, 0] + row_offset[:, 0]
    tables = np.empty(first.size, np.int64)
    for r, index in enumerate(first):
        if index < F:
            tables[r] = np.searchsorted(starts, index, side="right") - 1
        else:
            tables[r] = np.searchsorted(cstarts, index - F, side="right") - 1
    return tables


def table_is_latent(bound: BoundModel) -> np.ndarray:
    """Whether each table belongs to latent nodes (True) or visible nodes (False).

    A table tied across latent and visible nodes fits neither π₀ nor L: ValueError.
    """
    out = []
    for table in bound.tables:
        kinds = {m in bound.model.latent for m in table.members}
        if len(kinds) > 1:
            raise ValueError(
                f"tempered SMC: table {table.name!r} ties latent and visible nodes {table.members}; "
                "its factor belongs neither to the latent prior nor to the likelihood")
        out.append(kinds.pop())
    return np.array(out, bool)


def build_tempered_problem(bound: BoundModel, data: CountTensor, layout, start_scale: float = 1.0) -> TemperedProblem:
    """The tempered sampler's arrays for ``data`` under ``bound`` (no compilation).

    ``start_scale`` multiplies the latent tables' concentrations in the start distribution (1: the
    latent prior π₀ itself); :func:`with_reference` makes it a per-cell reference instead.
    """
    spec, problem = build_problem(bound, data, layout, "random")
    F = spec.num_table_entries
    is_latent = table_is_latent(bound)
    row_base = np.asarray(problem.row_base, np.int64)
    row_offset = np.asarray(problem.row_offset, np.int64)
    row_latent = is_latent[_row_tables(bound, row_base, row_offset, F)]
    concentration = np.asarray(problem.concentration, np.float64)
    new_of_old, row_base, row_offset = gibbs_numba.contiguous_relabelling(row_base, row_offset, concentration.size)
    conc = np.empty_like(concentration)
    conc[new_of_old] = concentration
    fixed = np.empty(concentration.size, np.int64)
    fixed[new_of_old] = np.asarray(problem.fixed_counts)
    rows = lambda group, latent: np.array([r for r in group if row_latent[r] == latent], np.int64)  # noqa: E731
    valid = np.asarray(problem.valid, bool)
    # Values of the missing visible nodes each cell allows (``valid`` leaves latent nodes free).
    latent_configs = math.prod(bound.sizes[n] for n in layout.free if n in bound.model.latent)
    allowed = valid.sum(1) // latent_configs if spec.has_valid else np.ones(data.nnz, np.int64)
    # log space when a product of a token's factors could leave the float64 range
    num_rows = len(spec.numerator_rows) + len(spec.denominator_rows)
    extremes = np.abs(np.log10([concentration.min(), concentration.max() + data.total]))
    log_space = bool(num_rows * extremes.max() > 250)
    token_cell = np.asarray(problem.token_cell, np.int32)
    constant = bound.log_data_constant(data)
    column_table = np.concatenate([np.full(t.size // t.shape[-1], k) for k, t in enumerate(bound.tables)])
    entry_table = np.concatenate([np.full(t.size, k) for k, t in enumerate(bound.tables)])
    counts = np.asarray(data.counts, np.int64)
    swap, swap_sizes = node_swaps(bound, layout)
    groups = [rows(spec.numerator_rows, True), rows(spec.denominator_rows, True), rows(spec.numerator_rows, False),
              rows(spec.denominator_rows, False)]
    return TemperedProblem(
        token_cell=token_cell,
        cell_start=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        row_base=row_base, row_offset=row_offset, valid=valid, has_valid=bool(spec.has_valid),
        latent_numerators=groups[0], latent_denominators=groups[1], visible_numerators=groups[2],
        visible_denominators=groups[3],
        tie_rows=np.array([r for r, _ in spec.ties], np.int64).reshape(-1),
        tie_earlier=np.array([e for _, e in spec.ties], np.int64).reshape(-1),
        moved=np.array(spec.moved, np.int64).reshape(-1),
        log_space=log_space,
        concentration=conc, fixed_counts=fixed, new_of_old=new_of_old,
        log_int=np.log(np.maximum(np.arange(int(counts.max()) + 1), 1)).astype(np.float64),
        num_configs=int(spec.num_configs), num_table_entries=F,
        log_z0=float((counts * np.log(allowed)).sum()),
        constant=float(constant),
        joint_constant=float(constant + gammaln(counts + 1.0).sum()),
        entry_table=entry_table, column_table=column_table, table_is_latent=is_latent,
        shift=_start_shift(bound, is_latent, concentration, new_of_old, start_scale),
        tilted=bool(start_scale != 1.0 and is_latent.any()),
        log_reference=np.zeros((1, 1)), referenced=False,
        gibbs_rows=gibbs_numba.urn_rows(spec, token_cell, row_base, row_offset, valid, log_space),
        node_swap=swap, node_size=swap_sizes, node_child=node_children(bound, data, layout),
        factorised=factorised_tempered(token_cell, row_base, row_offset, groups, usable=(
            not spec.ties and not spec.has_valid and not log_space
            and sorted(spec.moved) == sorted([*spec.numerator_rows, *spec.denominator_rows]))),
    )


class FactorisedTempered(NamedTuple):
    """The rows of a token's tempered weights as :func:`_sweeps_factorised` reads them, where no
    members are tied, no cell restricts the configurations, every row moves with the token, the
    weights stay in the float64 range, no two configurations share an entry of a constant row and
    the indices fit MAX_FACTORISED_ENTRIES (``usable``). Rows
    are in four groups — latent numerators, latent denominators, visible numerators, visible
    denominators — and within each those that read the same entries at every cell
    (``constant_index``, their product cached per configuration) come apart from those that vary
    (``token_index``, every token's own entries)."""

    usable: bool
    token_index: np.ndarray  # (T, V, L) int32: entry of each varying row at the token's cell and configuration c
    varying_ends: np.ndarray  # (4,) end of each group among the varying rows
    constant_index: np.ndarray  # (K, L) int64: entry of each constant row at configuration c, by group
    constant_ends: np.ndarray  # (4,) end of each group among the constant rows


MAX_FACTORISED_ENTRIES = 2**24  # 64 MB of indices


def factorised_tempered(token_cell, row_base, row_offset, groups, usable: bool) -> FactorisedTempered:
    """:class:`FactorisedTempered` of a problem's rows in kernel numbering: ``groups`` the four groups
    of rows, ``usable`` whether ties, restricted cells, log space or rows that do not move rule the
    fast path out (checked here too: the size of the indices)."""
    num_configs = row_offset.shape[1]
    constant = np.all(row_base == row_base[:, :1], axis=1)
    varying = [[int(r) for r in group if not constant[r]] for group in groups]
    fixed = [[int(r) for r in group if constant[r]] for group in groups]
    order = [r for group in varying for r in group]
    # Where configurations share a constant row's entries (Tucker: a row of one latent node), a
    # move changes the cached products of many configurations and refreshing them costs more than
    # the general path saves.
    shared = any(np.unique(row_offset[r]).size < num_configs for group in fixed for r in group)
    usable = (bool(usable) and not shared and sum(len(group) for group in groups) > 0
              and len(token_cell) * len(order) * num_configs <= MAX_FACTORISED_ENTRIES
              and int(row_base.max(initial=0) + row_offset.max(initial=0)) < 2**31)
    if not usable:
        order = []
    return FactorisedTempered(
        usable=usable,
        token_index=gibbs_numba.token_entries(row_base, row_offset, order, token_cell, np.int32),
        varying_ends=np.cumsum([len(group) for group in varying] if usable else [0] * 4).astype(np.int64),
        constant_index=np.array([row_base[r, 0] + row_offset[r] for group in fixed for r in group],
                                np.int64).reshape(-1, num_configs),
        constant_ends=np.cumsum([len(group) for group in fixed]).astype(np.int64),
    )


def with_reference(tp: TemperedProblem, log_reference: np.ndarray) -> TemperedProblem:
    """``tp`` starting from the product q(z) = Π_τ q(cell of τ, z_τ) on the geometric path
    q^(1−β) (π₀ L)^β: ``log_reference`` (U, L) holds log q, normalised over the configurations
    each cell allows (:func:`reference_from_counts`). q is normalised, so log Z₀ = 0."""
    return tp._replace(log_reference=np.ascontiguousarray(log_reference, np.float64), referenced=True, tilted=True,
                       log_z0=0.0)


def _start_shift(bound, is_latent, concentration, new_of_old, start_scale) -> np.ndarray:
    """(start_scale − 1) · α on the latent tables' entries and columns, in kernel numbering."""
    F = int(bound.table_starts[-1])
    entry_table = np.concatenate([np.full(t.size, k) for k, t in enumerate(bound.tables)])
    column_table = np.concatenate([np.full(t.size // t.shape[-1], k) for k, t in enumerate(bound.tables)])
    latent = np.concatenate([is_latent[entry_table], is_latent[column_table]])
    shift = np.where(latent, (start_scale - 1.0) * concentration, 0.0)
    out = np.empty_like(shift)
    out[new_of_old] = shift
    assert out.shape[0] == F + column_table.size
    return out


def exact_log_terms(tp: TemperedProblem, counts_kernel: np.ndarray) -> tuple[float, float]:
    """Closed-form (log π₀(z), log L(z)) from a particle's counts (kernel numbering, F + C)."""
    counts = np.asarray(counts_kernel, np.float64)[tp.new_of_old]
    alpha = tp.concentration[tp.new_of_old]
    F = tp.num_table_entries
    term = gammaln(alpha + counts) - gammaln(alpha)
    per_table = np.bincount(tp.entry_table, weights=term[:F], minlength=tp.table_is_latent.size)
    per_table -= np.bincount(tp.column_table, weights=term[F:], minlength=tp.table_is_latent.size)
    return float(per_table[tp.table_is_latent].sum()), float(per_table[~tp.table_is_latent].sum())


def exact_log_start(tp: TemperedProblem, counts_kernel: np.ndarray, config: np.ndarray) -> float:
    """Closed-form log of the start distribution at a particle: its latent-table product (π₀ with
    α + shift), or Σ_τ log q(cell of τ, z_τ) with a reference."""
    if tp.referenced:
        return float(tp.log_reference[tp.token_cell, np.asarray(config)].sum())
    counts = np.asarray(counts_kernel, np.float64)[tp.new_of_old]
    alpha = (tp.concentration + tp.shift)[tp.new_of_old]
    F = tp.num_table_entries
    term = gammaln(alpha + counts) - gammaln(alpha)
    per_table = np.bincount(tp.entry_table, weights=term[:F], minlength=tp.table_is_latent.size)
    per_table -= np.bincount(tp.column_table, weights=term[F:], minlength=tp.table_is_latent.size)
    return float(per_table[tp.table_is_latent].sum())


def counts_of_configs(tp: TemperedProblem, config: np.ndarray) -> np.ndarray:
    """Counts (kernel numbering, F + C, int64) of the allocation with token configurations ``config``."""
    counts = tp.fixed_counts.copy()
    for m in tp.moved:
        np.add.at(counts, tp.row_base[m, tp.token_cell] + tp.row_offset[m, config], 1)
    return counts


def log_multinomial(tp: TemperedProblem, config: np.ndarray) -> float:
    """Σ_(cell, configuration) lnΓ(S + 1) of one allocation."""
    keys = tp.token_cell.astype(np.int64) * tp.num_configs + config
    return float(gammaln(np.bincount(keys) + 1.0).sum())


REFERENCE_FLOOR = 1e-3  # share of the reference spread evenly over a cell's allowed configurations
# One chain per reference: chains of the posterior settle in modes of different mass, and an
# average over chains in different modes is a blend that fits none of them. The chains of several
# references run at once, one per core.
# Sweeps per chain unless given: REFERENCE_SWEEPS_PER_TOKEN × T, at least REFERENCE_MIN_SWEEPS:
# the chain must travel through the posterior's bulk for q to cover it.
REFERENCE_SWEEPS_PER_TOKEN = 0.8
REFERENCE_MIN_SWEEPS = 100


class Reference(NamedTuple):
    """A reference distribution q for the tempered SMC, built once (:func:`build_references`) and
    shared by the runs it is passed to: ``log_q`` (U, L) per nonzero cell and free configuration."""

    log_q: np.ndarray
    num_sweeps: int


def default_reference_sweeps(num_tokens: int) -> int:
    """Chain length of a reference when ``reference_sweeps`` is not given."""
    return max(REFERENCE_MIN_SWEEPS, int(round(REFERENCE_SWEEPS_PER_TOKEN * num_tokens)))


def _structure(tp: TemperedProblem, tilted: bool) -> tuple:
    """The arrays the numba kernel reads, in its order (``tilted`` False: weights of π₀ L^β)."""
    tied = np.zeros(tp.row_base.shape[0], np.bool_)
    tied[tp.tie_rows] = True
    return (tp.row_base, tp.row_offset, tp.valid, tp.has_valid, tp.latent_numerators, tp.latent_denominators,
            tp.visible_numerators, tp.visible_denominators, tied, tp.tie_rows, tp.tie_earlier, tp.moved,
            tp.log_space, tp.shift, tp.tilted and tilted, tp.log_reference, tp.referenced and tilted)


# Conditionals averaged every this many sweeps: consecutive sweeps barely differ, and computing
# them is a sizeable share of a chain's time.
REFERENCE_THIN = 4


def reference_from_chain(tp: TemperedProblem, config: np.ndarray, num_sweeps: int, seed,
                         floor: float = REFERENCE_FLOOR) -> np.ndarray:
    """A per-cell reference q for :func:`with_reference`, from the allocation with token
    configurations ``config`` (T,): every cell's urn conditional (eq. 4.1, β = 1) averaged over
    ``num_sweeps`` collapsed-Gibbs sweeps of the posterior (every REFERENCE_THIN-th, and the
    start; with ``num_sweeps`` 0 the allocation's own conditionals) by one chain started there
    and seeded by ``seed``, then mixed with ``floor`` of the uniform distribution over the
    configurations the cell allows so that none is out of reach. The average over a long chain
    estimates the posterior's marginals in the mode it settles in, the product over tokens of
    which is the closest product distribution to the posterior there (KL(π ‖ q)). No burn-in is
    left out: a chain started at a high-probability allocation falls from it into the posterior's
    bulk, and the sweeps on its way there are part of the mass q should cover. The chain runs the
    collapsed-Gibbs backend's sweeps (:func:`~bam_ppl.infer.gibbs.collapsed_numba.gibbs_sweeps`,
    faster than the tempered kernel at β = 1, which also tracks the log terms) and releases the
    GIL, so that the chains of several references run in threads. Returns log q (U, L), 0 where a configuration
    is not allowed (the kernel masks those)."""
    return references_along_chain(tp, config, num_sweeps, seed, 1, floor)[0][0]


def references_along_chain(tp: TemperedProblem, config: np.ndarray, num_sweeps: int, seed, num_windows: int,
                           floor: float = REFERENCE_FLOOR) -> tuple[np.ndarray, np.ndarray]:
    """``num_windows`` references (W, U, L) from one chain of :func:`reference_from_chain`: the
    conditionals averaged over each of ``num_windows`` consecutive stretches of its sweeps (given
    the tables' parameters θ the posterior of the tokens is a product, so the posterior is a
    mixture over θ of products, which short windows follow along the chain), and (W,) the mean
    log π(S) of the allocations each window visited."""
    rows = tp.gibbs_rows
    factorised = gibbs_numba.factorised_rows(rows, tp.concentration, tp.token_cell.shape[0])
    structure = _structure(tp, False)
    num_cells = tp.cell_start.shape[0] - 1
    totals = np.zeros((num_windows, num_cells, tp.num_configs))
    out = np.empty((num_cells, tp.num_configs))
    rng = np.random.default_rng(np.asarray(seed, np.uint32))
    shifted = tp.concentration + counts_of_configs(tp, config)
    state = np.array(config, np.int32)
    order = np.arange(state.shape[0], dtype=np.int32)
    log_joint = np.zeros(num_windows)
    done = 0
    while True:
        _cell_probabilities(shifted, structure, tp.factorised, tp.cell_start, out)
        window = min(num_windows - 1, done * num_windows // max(num_sweeps, 1))
        totals[window] += out
        log_joint[window] += log_joint_of(tp, state, np.rint(shifted - tp.concentration))
        if done >= num_sweeps:
            break
        step = min(REFERENCE_THIN, num_sweeps - done)
        gibbs_numba.gibbs_sweeps(rng, step, True, shifted, state, order, rows, factorised)
        done += step
    allowed = out > 0.0
    visits = totals.sum((1, 2)) / num_cells  # states averaged into each window
    skipped = visits == 0  # a window the thinning left empty: the last state's
    totals[skipped], log_joint[skipped], visits[skipped] = out, log_joint_of(
        tp, state, np.rint(shifted - tp.concentration)), 1.0
    q = (1.0 - floor) * totals / totals.sum(2, keepdims=True) + floor * allowed / allowed.sum(1, keepdims=True)
    return np.where(allowed, np.log(np.where(allowed, q, 1.0)), 0.0), log_joint / visits


def log_joint_of(tp: TemperedProblem, config: np.ndarray, counts_kernel: np.ndarray) -> float:
    """log π(S) = log p(X, S) of the allocation with token configurations ``config``."""
    log_prior, log_like = exact_log_terms(tp, counts_kernel)
    return tp.joint_constant + log_prior + log_like - log_multinomial(tp, config)


def chain_references(tp: TemperedProblem, configs, num_sweeps: int, keys, pool) -> list[np.ndarray]:
    """log q of :func:`reference_from_chain`, one per start configuration in ``configs`` and raw
    JAX key (rows of ``keys``), their chains run on ``pool``. The chains make no node moves: a
    node move can swap two classes whole, and a chain that switches labels averages relabelled
    copies of the posterior into q."""
    seeds = np.asarray(keys).astype(np.uint32)
    return list(pool.map(lambda config, seed: reference_from_chain(tp, config, num_sweeps, seed), configs, seeds))


def kernel_counts(tp: TemperedProblem, entry_counts: np.ndarray, column_of: np.ndarray) -> np.ndarray:
    """Counts in kernel numbering (F + C) from counts of the table entries (F,) in the model's
    numbering (``BoundModel.flat_concentration``; the columns get their sums)."""
    entry_counts = np.asarray(entry_counts, np.float64)
    columns = np.bincount(column_of, weights=entry_counts, minlength=tp.concentration.size - entry_counts.size)
    out = np.empty(tp.concentration.size)
    out[tp.new_of_old] = np.concatenate([entry_counts, columns])
    return out


def configs_from_counts(tp: TemperedProblem, counts_kernel: np.ndarray) -> np.ndarray:
    """Token configurations (T,) of an allocation near expected counts (kernel numbering, e.g. a
    VB fit's): each cell's X_u tokens shared among its configurations in proportion to its urn
    conditional given those counts, by largest remainders."""
    num_cells = tp.cell_start.shape[0] - 1
    probability = np.empty((num_cells, tp.num_configs))
    _cell_probabilities(np.asarray(tp.concentration + counts_kernel, np.float64), _structure(tp, False), tp.factorised,
                        tp.cell_start, probability)
    sizes = np.diff(tp.cell_start)
    share = probability * sizes[:, None]
    whole = np.floor(share).astype(np.int64)
    missing = sizes - whole.sum(1)
    ranks = np.argsort(np.argsort(-(share - whole), axis=1), axis=1)
    whole += ranks < missing[:, None]
    return np.repeat(np.tile(np.arange(tp.num_configs), num_cells), whole.reshape(-1)).astype(np.int64)


class LabelSymmetry(NamedTuple):
    """The relabellings of the latent values that leave p(X, z) unchanged, as
    :func:`symmetric_log_weights` sums over them: enumerated (``relabellings`` (G, L), identity
    first) where G has at most MAX_RELABELLINGS elements. Otherwise the largest symmetric node's
    values (``value`` (L,)) and ``swap`` (L, K): configuration l with that node set to k, so that
    the sum over its K! permutations is a permanent (:func:`_log_permanent`), one for each of the
    ``relabellings`` (identity first) of the other symmetric nodes. ``log_order`` is log |G| (0: no
    symmetry, or one too large to sum over)."""

    relabellings: np.ndarray
    value: np.ndarray | None = None
    swap: np.ndarray | None = None
    log_order: float = 0.0


# Terms of the sum over relabellings more than this many nats below the sum so far are left out,
# with all their completions: at most K subtrees per partial assignment visited, so their share
# stays below K · PERMANENT_MAX_NODES · e^(−PERMANENT_DROP_NATS) (4 · 10^-6 for K = 20).
PERMANENT_DROP_NATS = 30.0
PERMANENT_MAX_NODES = 2_000_000  # partial assignments a sum may visit before it gives up
# Up to this many values the sum falls back, where the depth-first one gives up (many terms of
# similar size), to the exact one over subsets of values (K 2^K steps).
PERMANENT_SUBSET_MAX = 20
SINKHORN_STEPS = 20
# The relabellings of the other symmetric nodes enumerated around the permanent of the largest
# (Tucker(6, 6, 2): 6! · 2!), at most this many: each particle then sums this many permanents.
PERMANENT_MAX_OUTER = 5040


def _log_permanents(M, occupied, drop, max_nodes, subset_max):
    """log Σ_g exp(Σ_k M[h, k, g(k)]) over the permutations g of the K columns, for every h
    (H, K, K): depth first (:func:`_log_permanent`) and, where that gives up and K ≤
    ``subset_max``, over subsets (:func:`_log_permanent_by_subsets`); nan from the first that
    cannot be summed. Depth first, the cheap cases (one term far above the others) take
    microseconds; it gets a budget of 2^K / K partial assignments where the subsets can take over."""
    K = M.shape[1]
    budget = min(max_nodes, (1 << K) // K) if K <= subset_max else max_nodes
    out = np.full(M.shape[0], np.nan)
    for h in range(M.shape[0]):
        out[h] = _log_permanent(M[h], occupied, drop, budget)
        if np.isnan(out[h]) and K <= subset_max:
            out[h] = _log_permanent_by_subsets(M[h])
        if np.isnan(out[h]):
            break
    return out


def _log_permanent_by_subsets(M):
    """log Σ_g exp(Σ_k M[k, g(k)]) over the permutations g of the K columns, exactly, by dynamic
    programming over the subsets S of columns given to the first |S| rows: f(S) = Σ_(j ∈ S)
    f(S − {j}) A[|S| − 1, j], with A = exp(M) (a sum of nonnegative terms, so no cancellation;
    K 2^K steps). A is first balanced towards doubly stochastic by Sinkhorn steps in log space
    (each scales the permanent by a known factor), so that the products neither under- nor
    overflow. nan if the sum underflows all the same."""
    K = M.shape[0]
    L = M.copy()
    log_scale = 0.0
    for _ in range(SINKHORN_STEPS):
        for i in range(K):
            top = L[i].max()
            s = top + math.log(np.exp(L[i] - top).sum())
            L[i] -= s
            log_scale += s
        for j in range(K):
            top = L[:, j].max()
            s = top + math.log(np.exp(L[:, j] - top).sum())
            L[:, j] -= s
            log_scale += s
    A = np.exp(L)
    size = 1 << K
    count = np.zeros(size, np.int64)  # |S|; row |S| − 1 takes the last column of S
    f = np.zeros(size)
    f[0] = 1.0
    for S in range(1, size):
        count[S] = count[S >> 1] + (S & 1)
        row = count[S] - 1
        total = 0.0
        for j in range(K):
            if (S >> j) & 1:
                total += f[S ^ (1 << j)] * A[row, j]
        f[S] = total
    permanent = f[size - 1]
    if not (permanent > 0.0 and np.isfinite(permanent)):
        return np.nan
    return log_scale + math.log(permanent)


def _log_permanent(M, occupied, drop, max_nodes):
    """log Σ_g exp(Σ_k M[k, g(k)]) over the permutations g of the K columns, where the rows not
    ``occupied`` are zero (a node value no token takes): those rows add log((K − n)!) for the n
    occupied ones, whose injections into the columns are summed depth first, each row's columns
    largest entry first. A partial assignment is left out, with all its completions, when its
    bound lies ``drop`` nats below the sum so far: its sum plus, for each remaining row, the log
    of the row's whole sum Σ_j exp M[r, j] (the permanent of a nonnegative matrix is at most the
    product of its row sums); the columns after it at that depth, with smaller entries, are left
    out with it. Returns nan after ``max_nodes`` partial assignments (many terms of similar size)."""
    K = M.shape[0]
    rows = np.flatnonzero(occupied)
    n = rows.shape[0]
    if n == 0:
        return math.lgamma(K + 1.0)
    order = np.empty((n, K), np.int64)
    rest = np.zeros(n + 1)  # Σ over rows d.. of log Σ_j exp M[row, j]
    for d in range(n - 1, -1, -1):
        row = M[rows[d]]
        order[d] = np.argsort(-row)
        top = row[order[d, 0]]
        rest[d] = rest[d + 1] + top + math.log(np.exp(row - top).sum())
    used = np.zeros(K, np.bool_)
    column = np.zeros(n, np.int64)
    tried = np.zeros(n, np.int64)
    partial = np.zeros(n + 1)
    total = -np.inf
    visited = 0
    d = 0
    while d >= 0:
        if tried[d] == K:  # every column tried at this depth: back up
            d -= 1
            if d >= 0:
                used[column[d]] = False
                tried[d] += 1
            continue
        j = order[d, tried[d]]
        if used[j]:
            tried[d] += 1
            continue
        value = partial[d] + M[rows[d], j]
        if value + rest[d + 1] < total - drop:
            tried[d] = K
            continue
        if d == n - 1:
            total = max(total, value) + math.log1p(math.exp(-abs(total - value))) if total > -np.inf else value
            tried[d] += 1
            continue
        visited += 1
        if visited > max_nodes:
            return np.nan
        used[j] = True
        column[d] = j
        partial[d + 1] = value
        d += 1
        tried[d] = 0
    return total + math.lgamma(K - n + 1.0)


def symmetric_log_weights(tp: TemperedProblem, config: np.ndarray, symmetry: LabelSymmetry) -> np.ndarray | None:
    """log(|G| · w(z)) of every particle (P, T), with w(z) = q(z) / Σ_g q(g(z)) over the label
    symmetries g in G (``symmetry``, a :class:`LabelSymmetry`): the share of z's orbit that
    the reference q puts on z itself. For every z, Σ_h w(h(z)) = 1 over the relabellings h, and
    p(X, z) is invariant under them, so Σ_z p(X, z) |G| w(z) = p(X): reweighting the particles of
    π₁ by |G| w counts the copies of the posterior that a reference in one of them never visits
    (w = 1 for a particle in q's own copy when the copies lie far apart; ½ where q cannot tell
    two relabellings apart). None when a permanent cannot be summed (:func:`_log_permanents`:
    more than PERMANENT_SUBSET_MAX values and too many terms of similar size)."""
    sums = orbit_log_sums(tp, tp.log_reference, config, symmetry)
    return None if sums is None else symmetry.log_order + sums[0] - sums[1]


def orbit_log_sums(tp: TemperedProblem, log_ref: np.ndarray, config: np.ndarray,
                   symmetry: LabelSymmetry) -> tuple[np.ndarray, np.ndarray] | None:
    """(log q(z), log Σ_g q(g(z))) of every particle (``config`` (P, T)) for the product reference
    ``log_ref`` (U, L), over the label symmetries g of ``symmetry``; None when a permanent cannot
    be summed (:func:`_log_permanents`)."""
    num_configs = tp.num_configs
    own, orbit = np.empty(config.shape[0]), np.empty(config.shape[0])
    rows = np.arange(num_configs)
    if symmetry.swap is not None:
        K = symmetry.swap.shape[1]
        one_hot = (symmetry.value[:, None] == np.arange(K)).astype(np.float64)  # (L, K)
        targets = symmetry.swap[symmetry.relabellings]  # (H, L, K): h(l) with the node set to k
        sums = []  # (M, occupied) of every particle, summed below on every core
    for p in range(config.shape[0]):
        groups = np.bincount(tp.token_cell.astype(np.int64) * num_configs + config[p],
                             minlength=log_ref.shape[0] * num_configs).reshape(-1, num_configs)
        # log q(g(z)) = Σ_(u, l) S[u, l] log q[u, g(l)] for every g
        scores = groups.T @ log_ref  # (L, L): [l, l'] = Σ_u S[u, l] log q[u, l']
        if symmetry.swap is None:
            by_relabelling = scores[rows[None, :], symmetry.relabellings].sum(1)
            own[p], orbit[p] = by_relabelling[0], _log_sum_exp(by_relabelling)
            continue
        # g = σ ∘ h, σ permuting the values of the node of ``value``, h the others' (``relabellings``):
        # Σ_l scores[l, g(l)] = Σ_k M_h[k, σ(k)], M_h[k, j] = Σ over l with value k of scores[l, h(l) with value j]
        M = np.einsum("hlj,lk->hkj", scores[rows[None, :, None], targets], one_hot)
        occupied = np.bincount(symmetry.value, weights=groups.sum(0), minlength=K) > 0
        own[p] = np.trace(M[0])
        sums.append((M, occupied))
    if symmetry.swap is None:
        return own, orbit

    def log_sum(item):
        log_sums = _log_permanents(*item, PERMANENT_DROP_NATS, PERMANENT_MAX_NODES, PERMANENT_SUBSET_MAX)
        return _log_sum_exp(log_sums) if not np.isnan(log_sums).any() else np.nan

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # the sums release the GIL
        orbit = np.array(list(pool.map(log_sum, sums)))
    return None if np.isnan(orbit).any() else (own, orbit)


# -- numba kernel ----------------------------------------------------------------------------------
def _row_value(shifted, shift, use_shift, base, row_offset, r, c, tied, tie_rows, tie_earlier):
    """(α + S)[index of row r at configuration c] (plus ``shift`` there when ``use_shift``), plus
    one where a tied earlier member of the same token has its increment at the same index."""
    index = base[r] + row_offset[r, c]
    v = shifted[index]
    if use_shift:
        v += shift[index]
    if tied[r]:
        for tie in range(tie_rows.shape[0]):
            if tie_rows[tie] == r:
                e = tie_earlier[tie]
                if base[e] + row_offset[e, c] == index:
                    v += 1.0
    return v


def _group_factor(shifted, shift, use_shift, base, row_offset, numerators, denominators, tied, tie_rows,
                  tie_earlier, out, log_space):
    """out[c] = ∏ numerator rows / ∏ denominator rows at configuration c (its log if ``log_space``)."""
    num_configs = out.shape[0]
    if log_space:
        out[:] = 0.0
        for r in numerators:
            for c in range(num_configs):
                out[c] += math.log(_row_value(shifted, shift, use_shift, base, row_offset, r, c, tied, tie_rows,
                                              tie_earlier))
        for r in denominators:
            for c in range(num_configs):
                out[c] -= math.log(_row_value(shifted, shift, use_shift, base, row_offset, r, c, tied, tie_rows,
                                              tie_earlier))
        return
    out[:] = 1.0
    for r in numerators:
        if tied[r] or use_shift:
            for c in range(num_configs):
                out[c] *= _row_value(shifted, shift, use_shift, base, row_offset, r, c, tied, tie_rows, tie_earlier)
        else:
            b = base[r]
            for c in range(num_configs):
                out[c] *= shifted[b + row_offset[r, c]]
    for r in denominators:
        if tied[r] or use_shift:
            for c in range(num_configs):
                out[c] /= _row_value(shifted, shift, use_shift, base, row_offset, r, c, tied, tie_rows, tie_earlier)
        else:
            b = base[r]
            for c in range(num_configs):
                out[c] /= shifted[b + row_offset[r, c]]


def _token_weights(counts, base, cell, beta, lat, vis, start, weight, st):
    """The tempered conditional of one token at ``cell`` over its configurations (the token not in
    ``counts``): fills lat, vis with the products of its latent-table and visible-table factors
    (their logs when ``log_space``), start with the log of its start factor (the reference's log q,
    or the start urn's; left at 0 untilted), and weight with start^(1−β) (lat · vis)^β
    (lat · vis^β untilted) divided by a common factor; returns the log of that factor. The start
    factor is kept as a log since the weights and the particle's log start need only its log: one
    log and one exp per configuration instead of three exps and two logs (the reference-started
    runs spent most of their time on them).

    Every factor is the ratio by which adding the token multiplies the tables' Dirichlet-multinomial
    sequence probabilities, so the product of the weights along any order of placing tokens is the
    ratio of π_β after and before placing them (what the cell moves rely on).
    """
    (row_base, row_offset, valid, has_valid, lat_num, lat_den, vis_num, vis_den, tied, tie_rows, tie_earlier,
     moved, log_space, shift, tilted, log_reference, referenced) = st
    num_configs = weight.shape[0]
    _set_base(base, row_base, cell)
    _group_factor(counts, shift, False, base, row_offset, lat_num, lat_den, tied, tie_rows, tie_earlier, lat,
                  log_space)
    _group_factor(counts, shift, False, base, row_offset, vis_num, vis_den, tied, tie_rows, tie_earlier, vis,
                  log_space)
    if referenced:
        for c in range(num_configs):
            start[c] = log_reference[cell, c]
    elif tilted:
        _group_factor(counts, shift, True, base, row_offset, lat_num, lat_den, tied, tie_rows, tie_earlier, start,
                      log_space)
        if not log_space:
            for c in range(num_configs):
                start[c] = math.log(start[c])
    if log_space:
        largest = -np.inf
        for c in range(num_configs):
            if tilted:
                weight[c] = start[c] + beta * (lat[c] + vis[c] - start[c])
            else:
                weight[c] = lat[c] + beta * vis[c]
            if has_valid and not valid[cell, c]:
                weight[c] = -np.inf
            largest = max(largest, weight[c])
        for c in range(num_configs):
            weight[c] = math.exp(weight[c] - largest)
        return largest
    for c in range(num_configs):
        weight[c] = 0.0 if has_valid and not valid[cell, c] else _linear_weight(lat, vis, start, c, beta, tilted)
    return 0.0


def _linear_weight(lat, vis, start, c, beta, tilted):
    """A token's tempered weight at configuration c in linear space: start^(1−β) (lat · vis)^β
    (``start`` a log), or lat · vis^β untilted."""
    if tilted:
        if beta == 0.0:
            return math.exp(start[c])
        if beta == 1.0:
            return lat[c] * vis[c]
        return math.exp(start[c] + beta * (math.log(lat[c] * vis[c]) - start[c]))
    if beta == 0.0:
        return lat[c]
    if beta == 1.0:
        return lat[c] * vis[c]
    return lat[c] * math.exp(beta * math.log(vis[c]))


def _weight_scratch(num_rows, num_configs):
    """Work arrays of :func:`_token_weights`: row bases, latent, visible and start factors, weights."""
    return (np.empty(num_rows, np.int64), np.empty(num_configs), np.empty(num_configs), np.zeros(num_configs),
            np.empty(num_configs))


def _log_total(weight, scale, pair):
    """log W: the log of the sum of the token's weights (``scale`` their log factor), over the two
    configurations ``pair`` only when pair[0] ≥ 0."""
    if pair[0] >= 0:
        return scale + math.log(weight[pair[0]] + weight[pair[1]])
    total = 0.0
    for c in range(weight.shape[0]):
        total += weight[c]
    return scale + math.log(total)


def _restrict(weight, pair):
    """Zero the weights outside ``pair`` (when pair[0] ≥ 0)."""
    if pair[0] >= 0:
        for c in range(weight.shape[0]):
            if c != pair[0] and c != pair[1]:
                weight[c] = 0.0


def _draw(rng, weight):
    """A configuration drawn with probability ∝ ``weight``."""
    total = 0.0
    for c in range(weight.shape[0]):
        total += weight[c]
    return inverse_cdf(weight, rng.random() * total)


def _set_base(base, row_base, cell):
    for r in range(row_base.shape[0]):
        base[r] = row_base[r, cell]


def _log_factor(values, c, log_space):
    return values[c] if log_space else math.log(values[c])


def _log_change(values, new, old, log_space):
    """log values[new] − log values[old], with one log."""
    return values[new] - values[old] if log_space else math.log(values[new] / values[old])


def _shift_token(counts, base, row_offset, moved, c, step):
    for m in moved:
        counts[base[m] + row_offset[m, c]] += step


def _block_move(rng, tokens, pairs, beta, counts, conf, proposal, base, lat, vis, start, weight, logs, token_cell, st):
    """One Metropolis–Hastings move of a block of tokens: the tokens ``tokens`` are removed and
    re-placed in that order, each drawn from its tempered conditional given the tokens placed before
    it — restricted to the two configurations ``pairs[i]`` for the i-th token when pairs[i, 0] ≥ 0
    (a pair move: every token in one of two configurations; a node move: every token whose
    configuration gives one latent node either of two values, or only those of one value of its
    visible child). A sequentially allocated proposal (Dahl 2005, "Sequentially-allocated
    merge-split sampler for conjugate and nonconjugate Dirichlet process mixture models"; Jain &
    Neal 2004, "A split-merge Markov chain Monte Carlo procedure for the Dirichlet process mixture
    model", JCGS).

    With W_t the sum of token t's (restricted) conditional weights on the way, π_β(z) / q(z | old)
    = Π_t W_t times a factor of the tokens outside the block, so the acceptance probability is
    min(1, Π W_t(new) / Π W_t(old)) and the move leaves π_β invariant. The old path's W_t are found
    while removing the old tokens in reverse order. ``logs`` (3,) gets the change of (log π₀, log L,
    log start); returns whether the proposal was accepted.
    """
    row_base, row_offset, moved, log_space = st[0], st[1], st[11], st[12]
    log_old, log_new = 0.0, 0.0
    old_prior, old_like, old_start, new_prior, new_like, new_start = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    for i in range(tokens.shape[0] - 1, -1, -1):
        token = tokens[i]
        old = conf[token]
        _set_base(base, row_base, token_cell[token])
        _shift_token(counts, base, row_offset, moved, old, -1.0)
        scale = _token_weights(counts, base, token_cell[token], beta, lat, vis, start, weight, st)
        log_old += _log_total(weight, scale, pairs[i])
        old_prior += _log_factor(lat, old, log_space)
        old_like += _log_factor(vis, old, log_space)
        old_start += start[old]
    for i in range(tokens.shape[0]):
        token = tokens[i]
        scale = _token_weights(counts, base, token_cell[token], beta, lat, vis, start, weight, st)
        log_new += _log_total(weight, scale, pairs[i])
        _restrict(weight, pairs[i])
        new = _draw(rng, weight)
        proposal[i] = new
        new_prior += _log_factor(lat, new, log_space)
        new_like += _log_factor(vis, new, log_space)
        new_start += start[new]
        _shift_token(counts, base, row_offset, moved, new, 1.0)
    if math.log(1.0 - rng.random()) < log_new - log_old:
        for i in range(tokens.shape[0]):
            conf[tokens[i]] = proposal[i]
        logs[0] += new_prior - old_prior
        logs[1] += new_like - old_like
        logs[2] += new_start - old_start
        return True
    for i in range(tokens.shape[0]):
        _set_base(base, row_base, token_cell[tokens[i]])
        _shift_token(counts, base, row_offset, moved, proposal[i], -1.0)
        _shift_token(counts, base, row_offset, moved, conf[tokens[i]], 1.0)
    return False


def _pair_tokens(rng, conf, num_configs, members, pairs, cell_order, cell_start):
    """Draw two distinct configurations and gather the tokens in either of them into ``members``
    (their pair into ``pairs``), cell by cell in random cell order (so that the sequential proposal
    places a cell's tokens together and its urn can keep them together); returns their number."""
    a = int(rng.random() * num_configs)
    b = int(rng.random() * (num_configs - 1))
    if b >= a:
        b += 1
    shuffle(rng, cell_order)
    n = 0
    for cell in cell_order:
        for token in range(cell_start[cell], cell_start[cell + 1]):
            if conf[token] == a or conf[token] == b:
                members[n] = token
                pairs[n, 0], pairs[n, 1] = a, b
                n += 1
    return n


def _node_tokens(rng, conf, node_swap, node_size, node_child, members, pairs, cell_order, cell_start, token_cell):
    """Draw a latent node and two of its values v ≠ w, and gather every token whose configuration
    gives the node v or w into ``members``, cell by cell in random cell order; ``pairs`` gets each
    token's configuration with the node at v and at w, its other nodes kept (``node_swap[n, c, v]``:
    configuration c with node n set to v). A split–merge of two of the node's classes: the whole of
    classes v and w is re-divided between them, which single-token moves can only do through
    allocations of low probability (Jain & Neal 2004). Returns the number of tokens."""
    node = int(rng.random() * node_swap.shape[0])
    size = node_size[node]
    v = int(rng.random() * size)
    w = int(rng.random() * (size - 1))
    if w >= v:
        w += 1
    shuffle(rng, cell_order)
    n = 0
    for cell in cell_order:
        for token in range(cell_start[cell], cell_start[cell + 1]):
            c = conf[token]
            a, b = node_swap[node, c, v], node_swap[node, c, w]
            if c == a or c == b:
                members[n] = token
                pairs[n, 0], pairs[n, 1] = a, b
                n += 1
    if n > 0 and rng.random() < 0.5:
        # Half the time only the tokens of one value x of the node's visible child (one sender, one
        # word), x that of a random member: the set is the same before and after the move, and so is
        # the chance of drawing x.
        x = node_child[node, token_cell[members[int(rng.random() * n)]]]
        kept = 0
        for i in range(n):
            if node_child[node, token_cell[members[i]]] == x:
                members[kept] = members[i]
                pairs[kept, 0], pairs[kept, 1] = pairs[i, 0], pairs[i, 1]
                kept += 1
        n = kept
    return n


def _block_moves(rng, beta, num_cell_moves, num_pair_moves, num_node_moves, counts, conf, logs, accepted,
                 token_cell, cell_start, node_swap, node_size, node_child, st):
    """Metropolis–Hastings block moves of one state targeting π_β (:func:`_block_move`), in place:
    ``num_cell_moves`` passes over the cells with two tokens or more (in random order), each cell's
    tokens re-placed; ``num_pair_moves`` pair moves (the tokens of two random configurations
    re-placed between them: :func:`_pair_tokens`); ``num_node_moves`` node moves (the tokens of two
    classes of a latent node re-divided between them: :func:`_node_tokens`). ``logs`` (3,) gets the
    change of (log π₀, log L, log start), ``accepted`` (3,) the number of each kind accepted."""
    num_configs = st[1].shape[1]
    num_tokens = token_cell.shape[0]
    base, lat, vis, start, weight = _weight_scratch(st[0].shape[0], num_configs)
    proposal = np.empty(num_tokens, np.int32)
    members = np.empty(num_tokens, np.int64)
    pairs = np.full((num_tokens, 2), -1, np.int64)
    cells = np.flatnonzero(np.diff(cell_start) >= 2)
    cell_order = np.arange(cell_start.shape[0] - 1)
    all_tokens = np.arange(num_tokens)
    for _ in range(num_cell_moves):
        shuffle(rng, cells)
        for cell in cells:
            first, stop = cell_start[cell], cell_start[cell + 1]
            if _block_move(rng, all_tokens[first:stop], pairs[:stop - first], beta, counts, conf, proposal, base, lat,
                           vis, start, weight, logs, token_cell, st):
                accepted[0] += 1
    if num_configs < 2:
        return
    for kind, num_moves in ((1, num_pair_moves), (2, num_node_moves if node_swap.shape[0] else 0)):
        for _ in range(num_moves):
            if kind == 1:
                n = _pair_tokens(rng, conf, num_configs, members, pairs, cell_order, cell_start)
            else:
                n = _node_tokens(rng, conf, node_swap, node_size, node_child, members, pairs, cell_order, cell_start,
                                 token_cell)
            if n > 0 and _block_move(rng, members[:n], pairs[:n], beta, counts, conf, proposal, base, lat, vis,
                                     start, weight, logs, token_cell, st):
                accepted[kind] += 1


def _constant_product(counts, index, first, stop, c):
    product = 1.0
    for k in range(first, stop):
        product *= counts[index[k, c]]
    return product


def _set_constant(counts, index, ends, c, lat, vis):
    """lat[c], vis[c]: the constant rows' factors of configuration c (FactorisedTempered's groups)."""
    lat[c] = _constant_product(counts, index, 0, ends[0], c) / _constant_product(counts, index, ends[0], ends[1], c)
    vis[c] = _constant_product(counts, index, ends[1], ends[2], c) / _constant_product(counts, index, ends[2], ends[3], c)


def _shift_factorised(counts, token_index, token, constant_index, c, step):
    for v in range(token_index.shape[1]):
        counts[token_index[token, v, c]] += step
    for k in range(constant_index.shape[0]):
        counts[constant_index[k, c]] += step


def _factorised_factors(counts, token_index, varying_ends, token, constant_lat, constant_vis, lat, vis):
    """lat, vis (L,) of ``token`` (removed from ``counts``): the constant rows' cached products times
    its varying rows, read through its own indices (:class:`FactorisedTempered`)."""
    num_configs = lat.shape[0]
    for c in range(num_configs):
        lat[c] = constant_lat[c]
        vis[c] = constant_vis[c]
    for v in range(varying_ends[3]):
        if v < varying_ends[0]:
            for c in range(num_configs):
                lat[c] *= counts[token_index[token, v, c]]
        elif v < varying_ends[1]:
            for c in range(num_configs):
                lat[c] /= counts[token_index[token, v, c]]
        elif v < varying_ends[2]:
            for c in range(num_configs):
                vis[c] *= counts[token_index[token, v, c]]
        else:
            for c in range(num_configs):
                vis[c] /= counts[token_index[token, v, c]]


def _sweeps_factorised(rng, num_sweeps, beta, counts, conf, order, logs, token_cell, factorised, referenced,
                       log_reference, lat, vis, start, weight):
    """``num_sweeps`` Gibbs sweeps of one particle targeting π_β, as the _SWEEP pass of
    :func:`_tempered_block` does them (the same weights, draws and log terms, ``rng`` consumed
    alike) where ``factorised`` (:class:`FactorisedTempered`) is usable and the start is π₀ or a
    reference: the constant rows' products are cached per configuration and updated as a token
    leaves and joins, and each token reads only its varying rows (NMF(4): two of five) through
    indices of its own. ``lat``, ``vis``, ``start``, ``weight``: work arrays (L,)."""
    _, token_index, varying_ends, constant_index, constant_ends = factorised
    num_configs = weight.shape[0]
    num_tokens = order.shape[0]
    constant_lat, constant_vis = np.empty(num_configs), np.empty(num_configs)
    for c in range(num_configs):
        _set_constant(counts, constant_index, constant_ends, c, constant_lat, constant_vis)
    for _ in range(num_sweeps):
        shuffle(rng, order)
        for position in range(num_tokens):
            token = order[position]
            old = conf[token]
            _shift_factorised(counts, token_index, token, constant_index, old, -1.0)
            _set_constant(counts, constant_index, constant_ends, old, constant_lat, constant_vis)
            _factorised_factors(counts, token_index, varying_ends, token, constant_lat, constant_vis, lat, vis)
            cell = token_cell[token]
            for c in range(num_configs):
                if referenced:
                    start[c] = log_reference[cell, c]
                weight[c] = _linear_weight(lat, vis, start, c, beta, referenced)
            new = _draw(rng, weight)
            _shift_factorised(counts, token_index, token, constant_index, new, 1.0)
            _set_constant(counts, constant_index, constant_ends, new, constant_lat, constant_vis)
            conf[token] = new
            if new != old:
                logs[0] += math.log(lat[new] / lat[old])
                logs[1] += math.log(vis[new] / vis[old])
                logs[2] += start[new] - start[old]


def _tempered_block(rng, first, stop, mode, beta, num_sweeps, num_cell_moves, num_pair_moves, num_node_moves, shifted,
                    config, log_prior, log_like, log_start, accepted, token_cell, cell_start, node_swap, node_size,
                    node_child, st, factorised):
    """Particles ``first..stop`` of one block, drawing from the block's Generator ``rng``.

    ``mode`` _URN adds every token (random order) drawn from the start distribution's urn
    conditional (β = 0); _SWEEP does ``num_sweeps`` Gibbs sweeps targeting π_β (a fresh random
    order per sweep), then the block moves of :func:`_block_moves`; ``accepted`` (P, 3) counts each
    particle's accepted cell, pair and node moves. The weights are those of :func:`_token_weights`;
    the particle's log π₀, log L and log start change by the logs of the factors of its new
    configuration minus those of the old one.
    """
    row_base, row_offset, moved, log_space = st[0], st[1], st[11], st[12]
    num_configs = row_offset.shape[1]
    num_tokens = token_cell.shape[0]
    base, lat, vis, start, weight = _weight_scratch(row_base.shape[0], num_configs)
    logs = np.zeros(3)
    order = np.arange(num_tokens)
    passes = 1 if mode == _URN else num_sweeps
    fast = mode == _SWEEP and factorised[0] and (st[16] or not st[14])  # a reference or π₀ as the start
    for p in range(first, stop):
        counts = shifted[p]
        conf = config[p]
        logs[:] = 0.0
        if fast:
            _sweeps_factorised(rng, num_sweeps, beta, counts, conf, order, logs, token_cell, factorised, st[16],
                               st[15], lat, vis, start, weight)
        for _ in range(0 if fast else passes):
            shuffle(rng, order)
            for position in range(num_tokens):
                token = order[position]
                cell = token_cell[token]
                old = conf[token]
                if mode == _SWEEP:
                    for r in range(row_base.shape[0]):
                        base[r] = row_base[r, cell]
                    _shift_token(counts, base, row_offset, moved, old, -1.0)
                _token_weights(counts, base, cell, beta, lat, vis, start, weight, st)
                new = _draw(rng, weight)
                _shift_token(counts, base, row_offset, moved, new, 1.0)
                conf[token] = new
                if mode == _URN:
                    logs[0] += _log_factor(lat, new, log_space)
                    logs[1] += _log_factor(vis, new, log_space)
                    logs[2] += start[new]
                elif new != old:
                    logs[0] += _log_change(lat, new, old, log_space)
                    logs[1] += _log_change(vis, new, old, log_space)
                    logs[2] += start[new] - start[old]
        if mode == _SWEEP and num_cell_moves + num_pair_moves + num_node_moves > 0:
            _block_moves(rng, beta, num_cell_moves, num_pair_moves, num_node_moves, counts, conf, logs, accepted[p],
                         token_cell, cell_start, node_swap, node_size, node_child, st)
        log_prior[p] += logs[0]
        log_like[p] += logs[1]
        log_start[p] += logs[2]


def _log_multinomial_block(first, stop, config, token_cell, cell_start, num_configs, log_int, out):
    """out[p] = Σ_(cell, configuration) lnΓ(S + 1) = Σ_tokens log(rank within its group)."""
    seen = np.zeros(num_configs, np.int64)
    for p in range(first, stop):
        total = 0.0
        for u in range(cell_start.shape[0] - 1):
            for t in range(cell_start[u], cell_start[u + 1]):
                c = config[p, t]
                seen[c] += 1
                total += log_int[seen[c]]
            for t in range(cell_start[u], cell_start[u + 1]):
                seen[config[p, t]] = 0
        out[p] = total


def _cell_probabilities(shifted, st, factorised, cell_start, out):
    """out[u, c] = the urn conditional (β = 1) of a token of cell u at configuration c, given the
    counts ``shifted`` (concentration + counts, kernel numbering); 0 where not allowed. Read as
    :func:`_sweeps_factorised` reads the rows where ``factorised`` is usable, so that these averages
    stay a small part of a reference chain's time."""
    row_base, row_offset = st[0], st[1]
    num_configs = row_offset.shape[1]
    base, lat, vis, start, weight = _weight_scratch(row_base.shape[0], num_configs)
    # Factorised: the constant rows once, each cell's varying rows through its first token's indices.
    usable, token_index, varying_ends, constant_index, constant_ends = factorised
    constant_lat, constant_vis = np.ones(num_configs), np.ones(num_configs)
    for c in range(num_configs if usable else 0):
        _set_constant(shifted, constant_index, constant_ends, c, constant_lat, constant_vis)
    for cell in range(out.shape[0]):
        if usable:
            _factorised_factors(shifted, token_index, varying_ends, cell_start[cell], constant_lat, constant_vis, lat, vis)
            for c in range(num_configs):
                weight[c] = lat[c] * vis[c]
        else:  # the cell as int32, as the moves pass it: one compilation of _token_weights
            _token_weights(shifted, base, np.int32(cell), 1.0, lat, vis, start, weight, st)
        total = 0.0
        for c in range(num_configs):
            total += weight[c]
        for c in range(num_configs):
            out[cell, c] = weight[c] / total


if numba is not None:
    # _token_weights is called, not inlined: four inlined copies of its row lookups made numba's
    # compilation far longer, and the call is cheap next to the loops inside it. The small helpers
    # are inlined: left to calls, they make the tempered SMC markedly slower.
    compile_numba(globals(), inline=("_row_value", "_group_factor", "_weight_scratch", "_draw", "_log_factor", "_log_change",
                                     "_constant_product", "_set_constant", "_shift_factorised", "_factorised_factors",
                                     "_linear_weight", "_shift_token", "_set_base", "_log_total", "_restrict"),
                  nogil=("_log_permanent", "_log_permanents", "_log_permanent_by_subsets", "_token_weights", "_block_move", "_pair_tokens", "_node_tokens", "_block_moves", "_tempered_block", "_sweeps_factorised", "_log_multinomial_block",
                         "_cell_probabilities"))


def block_moves_proposed(tp: TemperedProblem, num_cell_moves: int, num_pair_moves: int,
                         num_node_moves: int) -> np.ndarray:
    """(3,) the cell, pair and node moves that :func:`_block_moves` proposes to one state."""
    cells = int(np.count_nonzero(np.diff(tp.cell_start) >= 2))
    many = tp.num_configs > 1
    return np.array([num_cell_moves * cells, num_pair_moves * many, num_node_moves * (many and tp.node_swap.shape[0] > 0)])


def posterior_block_moves(tp: TemperedProblem, rng: np.random.Generator, shifted: np.ndarray, config: np.ndarray,
                          num_node_moves: int) -> np.ndarray:
    """``num_node_moves`` node moves (:func:`_node_tokens`) of one posterior chain (β = 1, the
    untilted target) at counts ``shifted`` and configurations ``config``, in place; returns the
    numbers (3,) of cell, pair and node moves accepted."""
    accepted = np.zeros(3, np.int64)
    _block_moves(rng, 1.0, 0, 0, num_node_moves, shifted, config, np.zeros(3), accepted, tp.token_cell,
                 tp.cell_start, tp.node_swap, tp.node_size, tp.node_child, _structure(tp, False))
    return accepted


class NumbaParticles:
    """P particles as NumPy arrays, moved by the numba kernel in ``NUM_BLOCKS`` blocks of particles.

    Block b draws from a Generator seeded by ``keys[b]``; blocks run in threads (the kernel
    releases the GIL), so results do not depend on the number of cores.
    """

    def __init__(self, tp: TemperedProblem, num_particles: int, keys, pool: ThreadPoolExecutor):
        self.tp = tp
        self.num_particles = num_particles
        self.shifted = np.tile(tp.concentration + tp.fixed_counts, (num_particles, 1))
        self.config = np.zeros((num_particles, tp.token_cell.shape[0]), np.int32)
        self.log_prior = np.zeros(num_particles)
        self.log_like = np.zeros(num_particles)
        self.log_start = np.zeros(num_particles)
        edges = np.linspace(0, num_particles, len(keys) + 1).astype(np.int64)
        self.blocks = [(b, int(edges[b]), int(edges[b + 1])) for b in range(len(keys)) if edges[b + 1] > edges[b]]
        self.rngs = [np.random.default_rng(np.asarray(k, np.uint32)) for k in keys]
        self.pool = pool
        self.structure = _structure(tp, True)
        self.accepted = np.zeros((num_particles, 3), np.int64)
        self.block_moves = np.zeros((3, 2), np.int64)  # (cell, pair, node) moves: proposed, accepted

    def _run(self, mode, beta, num_sweeps, num_cell_moves=0, num_pair_moves=0, num_node_moves=0):
        self.accepted[:] = 0
        tp = self.tp

        def one(block):
            b, first, stop = block
            for begin, end, structure in self.segments(first, stop):  # one Generator per block, in order
                _tempered_block(self.rngs[b], begin, end, mode, float(beta), num_sweeps, num_cell_moves,
                                num_pair_moves, num_node_moves, self.shifted, self.config, self.log_prior,
                                self.log_like, self.log_start, self.accepted, tp.token_cell, tp.cell_start,
                                tp.node_swap, tp.node_size, tp.node_child, structure, tp.factorised)

        list(self.pool.map(one, self.blocks))
        self.block_moves += np.stack([self.num_particles * block_moves_proposed(
            tp, num_cell_moves, num_pair_moves, num_node_moves), self.accepted.sum(0)], axis=1)

    def segments(self, first: int, stop: int) -> list:
        """Ranges of particles ``first..stop`` and the kernel structure each is moved with (one here;
        a mixture start has one per reference: :class:`~bam_ppl.infer.smc.mixture.MixtureParticles`)."""
        return [(first, stop, self.structure)]

    def initialise(self) -> None:
        """Exact draws from π₀ (the urn over latent tables; missing visible values uniform)."""
        self._run(_URN, 0.0, 1)

    def move(self, beta: float, num_sweeps: int, num_cell_moves: int = 0, num_pair_moves: int = 0,
             num_node_moves: int = 0) -> None:
        self._run(_SWEEP, beta, num_sweeps, num_cell_moves, num_pair_moves, num_node_moves)

    def add_offsets(self, prior: float, like: float, start: float) -> None:
        self.log_prior += prior
        self.log_like += like
        self.log_start += start

    def set_configs(self, config: np.ndarray) -> None:
        """Put the particles at the given token configurations (P, T) (tests and restarts)."""
        config = np.asarray(config, np.int32)
        self.config[:] = config
        for p in range(self.num_particles):
            counts = counts_of_configs(self.tp, config[p])
            self.shifted[p] = self.tp.concentration + counts
            self.log_prior[p], self.log_like[p] = exact_log_terms(self.tp, counts)
            self.log_start[p] = exact_log_start(self.tp, counts, config[p])

    def counts(self, p: int) -> np.ndarray:
        return np.rint(self.shifted[p] - self.tp.concentration).astype(np.int64)

    def resample(self, ancestors: np.ndarray) -> None:
        self.shifted = self.shifted[ancestors]
        self.config = self.config[ancestors]
        self.log_prior = self.log_prior[ancestors]
        self.log_like = self.log_like[ancestors]
        self.log_start = self.log_start[ancestors]

    def log_multinomial(self) -> np.ndarray:
        out = np.empty(self.num_particles)
        tp = self.tp

        def one(block):
            _, first, stop = block
            _log_multinomial_block(first, stop, self.config, tp.token_cell, tp.cell_start, tp.num_configs,
                                   tp.log_int, out)

        list(self.pool.map(one, self.blocks))
        return out


# -- JAX kernel ------------------------------------------------------------------------------------
class _JaxRows(NamedTuple):
    """Static structure of the JAX kernel (hashable)."""

    latent_numerators: tuple
    latent_denominators: tuple
    visible_numerators: tuple
    visible_denominators: tuple
    ties: tuple
    moved: tuple
    has_valid: bool
    tilted: bool
    referenced: bool


def _jax_token(rows: _JaxRows, arrays, counts, cell, old, uniform, beta, remove: bool):
    """Remove one token (if ``remove``) and redraw it from π_β's conditional.

    Returns the counts, the new configuration and the changes of (log π₀, log L, log start).
    """
    row_base, row_offset, valid, concentration, shift, log_reference = arrays
    index = row_base[:, cell][:, None] + row_offset  # (R, L)
    moved = jnp.asarray(rows.moved, jnp.int32)
    value = counts[index]
    if remove:
        old_index = index[moved, old]
        value = value - jnp.sum(index[:, :, None] == old_index, axis=-1, dtype=value.dtype)
    value = concentration[index] + value.astype(concentration.dtype)
    for row, earlier in rows.ties:
        value = value.at[row].add((index[earlier] == index[row]).astype(value.dtype))

    def total(logs, group):
        if not group:
            return jnp.zeros(index.shape[1], logs.dtype)
        return jnp.sum(logs[jnp.asarray(group, jnp.int32)], axis=0)

    logs = jnp.log(value)
    log_lat = total(logs, rows.latent_numerators) - total(logs, rows.latent_denominators)
    log_vis = total(logs, rows.visible_numerators) - total(logs, rows.visible_denominators)
    if rows.referenced:
        log_start = log_reference[cell]
        logit = log_start + beta * (log_lat + log_vis - log_start)
    elif rows.tilted:
        logs_start = jnp.log(value + shift[index])
        log_start = total(logs_start, rows.latent_numerators) - total(logs_start, rows.latent_denominators)
        logit = log_start + beta * (log_lat + log_vis - log_start)
    else:
        log_start = jnp.zeros_like(log_lat)
        logit = log_lat + beta * log_vis
    if rows.has_valid:
        logit = jnp.where(valid[cell], logit, -jnp.inf)
    weight = jnp.exp(logit - logit.max())
    cdf = jnp.cumsum(weight)
    new = jnp.minimum(jnp.sum(cdf <= uniform * cdf[-1]), index.shape[1] - 1).astype(jnp.int32)
    new_index = index[moved, new]
    if remove:
        step = jnp.concatenate([jnp.full(moved.shape, -1, counts.dtype), jnp.ones(moved.shape, counts.dtype)])
        counts = counts.at[jnp.concatenate([old_index, new_index])].add(step)
        delta = jnp.stack([log_lat[new] - log_lat[old], log_vis[new] - log_vis[old], log_start[new] - log_start[old]])
    else:
        counts = counts.at[new_index].add(1)
        delta = jnp.stack([log_lat[new], log_vis[new], log_start[new]])
    return counts, new, delta


def _jax_pass(rows, arrays, token_cell, key, config, counts, beta, remove: bool):
    key_order, key_draw = jax.random.split(key)
    order = jax.random.permutation(key_order, token_cell.shape[0]).astype(jnp.int32)
    uniforms = jax.random.uniform(key_draw, order.shape, beta.dtype)

    def step(carry, token):
        counts, total = carry
        cell, old, uniform = token
        counts, new, delta = _jax_token(rows, arrays, counts, cell, old, uniform, beta, remove)
        return (counts, total + delta), new

    (counts, total), new = jax.lax.scan(step, (counts, jnp.zeros(3, beta.dtype)),
                                        (token_cell[order], config[order], uniforms))
    return config.at[order].set(new), counts, total


@functools.partial(jax.jit, static_argnames=("rows", "num_sweeps", "remove"))
def _jax_moves(rows, arrays, token_cell, keys, config, counts, logs, beta, num_sweeps, remove):
    """``num_sweeps`` passes of every particle (``remove=False``: the urn initialisation).

    ``logs`` (P, 3) carries every particle's log π₀, log L and log start.
    """

    def one(key, config, counts):
        def body(carry, s):
            config, counts, total = carry
            config, counts, delta = _jax_pass(rows, arrays, token_cell, jax.random.fold_in(key, s), config,
                                              counts, beta, remove)
            return (config, counts, total + delta), None

        (config, counts, total), _ = jax.lax.scan(body, (config, counts, jnp.zeros(3, beta.dtype)),
                                                  jnp.arange(num_sweeps))
        return config, counts, total

    config, counts, delta = jax.vmap(one)(keys, config, counts)
    return config, counts, logs + delta


@jax.jit
def _jax_log_multinomial(token_cell, config, num_configs):
    def one(conf):
        keys = jnp.sort(token_cell.astype(jnp.int64) * num_configs + conf)
        position = jnp.arange(keys.shape[0])
        starts = jnp.concatenate([jnp.ones(1, bool), keys[1:] != keys[:-1]])
        rank = position - jax.lax.cummax(jnp.where(starts, position, 0)) + 1
        return jnp.sum(jnp.log(rank.astype(jnp.float64)))

    return jax.vmap(one)(config)


class JaxParticles:
    """P particles on the default JAX device, moved by a jitted ``vmap`` of ``lax.scan`` sweeps."""

    def __init__(self, tp: TemperedProblem, num_particles: int, key):
        self.tp = tp
        self.num_particles = num_particles
        self.rows = _JaxRows(*(tuple(int(r) for r in g) for g in (
            tp.latent_numerators, tp.latent_denominators, tp.visible_numerators, tp.visible_denominators)),
            ties=tuple(zip(tp.tie_rows.tolist(), tp.tie_earlier.tolist())),
            moved=tuple(int(m) for m in tp.moved), has_valid=tp.has_valid, tilted=tp.tilted,
            referenced=tp.referenced)
        self.arrays = (jnp.asarray(tp.row_base, jnp.int32), jnp.asarray(tp.row_offset, jnp.int32),
                       jnp.asarray(tp.valid), jnp.asarray(tp.concentration, jnp.float64),
                       jnp.asarray(tp.shift, jnp.float64), jnp.asarray(tp.log_reference, jnp.float64))
        self.token_cell = jnp.asarray(tp.token_cell)
        self.key = key
        self.calls = 0
        self.config = jnp.zeros((num_particles, tp.token_cell.shape[0]), jnp.int32)
        self.counts_ = jnp.tile(jnp.asarray(tp.fixed_counts, jnp.int32), (num_particles, 1))
        self.logs = jnp.zeros((num_particles, 3), jnp.float64)  # log π₀, log L, log start
        self.block_moves = np.zeros((3, 2), np.int64)  # no block moves in this kernel

    log_prior = property(lambda self: np.asarray(self.logs[:, 0]))
    log_like = property(lambda self: np.asarray(self.logs[:, 1]))
    log_start = property(lambda self: np.asarray(self.logs[:, 2]))

    def add_offsets(self, prior: float, like: float, start: float) -> None:
        self.logs = self.logs + jnp.asarray([prior, like, start])

    def _run(self, beta, num_sweeps, remove):
        keys = jax.random.split(jax.random.fold_in(self.key, self.calls), self.num_particles)
        self.calls += 1
        # Particles split across jax.devices() (resampling and set_configs make arrays anew).
        keys, self.config, self.counts_, self.logs = shard_axis(
            (keys, self.config, self.counts_, self.logs), self.num_particles, 0, "particles")
        self.config, self.counts_, self.logs = _jax_moves(
            self.rows, self.arrays, self.token_cell, keys, self.config, self.counts_, self.logs,
            jnp.asarray(beta, jnp.float64), num_sweeps, remove)

    def initialise(self) -> None:
        self._run(0.0, 1, False)

    def move(self, beta: float, num_sweeps: int, num_cell_moves: int = 0, num_pair_moves: int = 0,
             num_node_moves: int = 0) -> None:
        """Gibbs sweeps only: the JAX kernel has no block moves (:func:`run_tempered` warns)."""
        self._run(beta, num_sweeps, True)

    def set_configs(self, config: np.ndarray) -> None:
        config = np.asarray(config, np.int32)
        counts = np.stack([counts_of_configs(self.tp, c) for c in config])
        logs = np.array([(*exact_log_terms(self.tp, c), exact_log_start(self.tp, c, z)) for c, z in zip(counts, config)])
        self.config, self.counts_ = jnp.asarray(config), jnp.asarray(counts, jnp.int32)
        self.logs = jnp.asarray(logs.reshape(-1, 3))

    def counts(self, p: int) -> np.ndarray:
        return np.asarray(self.counts_[p], np.int64)

    def resample(self, ancestors: np.ndarray) -> None:
        ancestors = jnp.asarray(ancestors)
        self.config, self.counts_, self.logs = self.config[ancestors], self.counts_[ancestors], self.logs[ancestors]

    def log_multinomial(self) -> np.ndarray:
        return np.asarray(_jax_log_multinomial(self.token_cell, self.config, self.tp.num_configs))


# -- the SMC sampler -------------------------------------------------------------------------------
def _log_sum_exp(x: np.ndarray) -> float:
    peak = np.max(x)
    if not np.isfinite(peak):
        return float(peak)
    return float(peak + np.log(np.sum(np.exp(x - peak))))


def _normalise(log_w: np.ndarray) -> np.ndarray:
    return log_w - _log_sum_exp(log_w)


def conditional_ess(log_w_normalised: np.ndarray, log_like: np.ndarray, step: float) -> float:
    """Conditional ESS fraction (Σ W w)² / Σ W w² of the incremental weights w = L^step."""
    a = step * (log_like - np.max(log_like))
    first = _log_sum_exp(log_w_normalised + a)
    second = _log_sum_exp(log_w_normalised + 2.0 * a)
    return float(np.exp(2.0 * first - second))


def next_temperature(beta: float, log_w_normalised: np.ndarray, log_like: np.ndarray, rho: float) -> float:
    """The largest β' ≤ 1 (by bisection) whose conditional ESS fraction stays ≥ ``rho``."""
    if conditional_ess(log_w_normalised, log_like, 1.0 - beta) >= rho:
        return 1.0
    low, high = 0.0, 1.0 - beta
    for _ in range(BISECTION_STEPS):
        middle = 0.5 * (low + high)
        if conditional_ess(log_w_normalised, log_like, middle) >= rho:
            low = middle
        else:
            high = middle
    step = low if low > 0 else high
    return min(1.0, beta + step)


def systematic_resample(rng: np.random.Generator, log_w_normalised: np.ndarray) -> np.ndarray:
    """Systematic resampling: ancestors of P equally weighted particles."""
    num = log_w_normalised.size
    cdf = np.cumsum(np.exp(log_w_normalised))
    cdf /= cdf[-1]
    positions = (rng.random() + np.arange(num)) / num
    return np.minimum(np.searchsorted(cdf, positions, side="right"), num - 1)


class TemperedRun(NamedTuple):
    """One run: log evidence, schedule and diagnostics, the best allocation it visited."""

    log_evidence: float
    schedule: np.ndarray
    num_resamplings: int
    min_ess: float
    lower_bound: float
    best_config: np.ndarray
    degenerate_start: bool  # most draws from π₀ had the same likelihood
    block_moves: np.ndarray  # (3, 2) cell, pair and node moves: proposed, accepted
    log_relabelled: float  # log Σ_p W_p |G| w(z_p) to add for the label symmetries: 0 without; nan where not summed


class TemperedResult(NamedTuple):
    """Output of :func:`run_tempered`.

    ``run_log_evidence`` (R,) the runs' log evidence estimates, ``log_evidence`` and ``stderr``
    the pooled value (log-mean-exp) and its standard error; ``num_temperatures``,
    ``num_resamplings`` (R,) and ``min_ess`` (R,, in particles, before resampling);
    ``schedules`` every run's temperatures (ending at 1); ``run_lower_bound`` (R,) the largest
    log π(S) each run visited and ``lower_bound`` their maximum, a sure lower bound on the log
    evidence; ``best_config`` (T,) the free configuration of every token of that allocation,
    ``best_cells`` (n, nodes) and ``best_counts`` (n,) its (observed cell, configuration) groups
    as full cells and counts, so that ``bound.log_prob_cells(best_cells, best_counts)`` equals
    ``lower_bound``; ``run_best_cells``, ``run_best_counts`` every run's best allocation in the
    same form; ``block_move_acceptance`` (3,) the share of cell, pair and node moves
    accepted (nan where none ran); ``seconds`` the wall time.
    """

    run_log_evidence: np.ndarray
    log_evidence: float
    stderr: float
    num_temperatures: np.ndarray
    num_resamplings: np.ndarray
    min_ess: np.ndarray
    schedules: list
    run_lower_bound: np.ndarray
    lower_bound: float
    best_config: np.ndarray
    best_cells: np.ndarray
    best_counts: np.ndarray
    run_best_cells: list
    run_best_counts: list
    block_move_acceptance: np.ndarray
    seconds: float
    reference_sweeps: int | None = None


def _one_run(particles, tp: TemperedProblem, rng: np.random.Generator, rho, num_sweeps, schedule,
             block_moves=(0, 0, 0), symmetry=None, initial_log_w=None, final_log_weights=None):
    """One tempered SMC run over ``particles`` (already allocated); see :func:`run_tempered`
    (``block_moves``: cell, pair and node moves per temperature). ``initial_log_w`` (P,) the
    normalised start weights (default equal); ``final_log_weights`` a function of the particles
    returning the log weights of the last reweighting (default: the label symmetries')"""
    num = particles.num_particles
    particles.initialise()
    # Constant factors the rows leave out (equal for every allocation): fixed from one particle.
    exact_prior, exact_like = exact_log_terms(tp, particles.counts(0))
    exact_start = exact_log_start(tp, particles.counts(0), np.asarray(particles.config[0])) if tp.tilted else 0.0
    particles.add_offsets(exact_prior - float(np.asarray(particles.log_prior)[0]),
                          exact_like - float(np.asarray(particles.log_like)[0]),
                          exact_start - float(np.asarray(particles.log_start)[0]) if tp.tilted else 0.0)

    def log_ratio():
        """log of π₀ L over the start distribution (log L when the start is π₀)."""
        if tp.tilted:
            return np.asarray(particles.log_prior) + np.asarray(particles.log_like) - np.asarray(particles.log_start)
        return np.asarray(particles.log_like)
    best_value, best_config = -np.inf, None

    def visit():
        nonlocal best_value, best_config
        value = (tp.joint_constant + np.asarray(particles.log_prior) + np.asarray(particles.log_like)
                 - particles.log_multinomial())
        p = int(np.argmax(value))
        if value[p] > best_value:
            best_value, best_config = float(value[p]), np.asarray(particles.config[p]).copy()

    visit()
    # Most draws from π₀ sharing one likelihood value (tiny concentrations put every token in one
    # configuration) means the posterior's allocations are rare under π₀: warned about below.
    like = log_ratio()
    _, repeats = np.unique(np.round(like / max(1.0, float(np.abs(like).max())), 9), return_counts=True)
    degenerate = bool(tp.visible_numerators.size + tp.visible_denominators.size) and num > 1 and \
        repeats.max() > DEGENERATE_SHARE * num
    log_w = np.full(num, -np.log(num)) if initial_log_w is None else np.asarray(initial_log_w, np.float64)
    log_z = tp.constant + tp.log_z0
    beta, betas, resamplings, min_ess = 0.0, [], 0, float(num)
    while beta < 1.0:
        ratio = log_ratio()
        if schedule is None:
            new_beta = next_temperature(beta, log_w, ratio, rho)
        else:
            new_beta = float(schedule[len(betas)])
        increment = (new_beta - beta) * ratio
        log_z += _log_sum_exp(log_w + increment)
        log_w = _normalise(log_w + increment)
        beta = new_beta
        betas.append(beta)
        ess = float(1.0 / np.exp(_log_sum_exp(2.0 * log_w)))
        min_ess = min(min_ess, ess)
        if ess < RESAMPLE_ESS * num:
            particles.resample(systematic_resample(rng, log_w))
            log_w = np.full(num, -np.log(num))
            resamplings += 1
        particles.move(beta, num_sweeps, *block_moves)
        visit()
        if len(betas) >= MAX_TEMPERATURES:
            raise RuntimeError(f"tempered SMC: more than {MAX_TEMPERATURES} temperatures (rho={rho}); lower rho, or use "
                               "method='smc' for models with very small concentrations")
    log_relabelled = 0.0
    if final_log_weights is not None:
        weights = final_log_weights(particles)
        log_relabelled = np.nan if weights is None else _log_sum_exp(log_w + weights)
    elif symmetry is not None and symmetry.log_order > 0:
        weights = symmetric_log_weights(tp, np.asarray(particles.config), symmetry)
        log_relabelled = np.nan if weights is None else _log_sum_exp(log_w + weights)
    return TemperedRun(float(log_z), np.array(betas), resamplings, min_ess, best_value, best_config, degenerate,
                       particles.block_moves.copy(), float(log_relabelled))


def relabelled_terms(runs, symmetry) -> np.ndarray:
    """Each run's term for the label symmetries (:attr:`TemperedRun.log_relabelled`), or zeros for
    every run, with a warning, where one run could not sum them: runs corrected and runs not would
    differ by up to log |G| and their pooled mean and spread would mean nothing."""
    terms = np.array([r.log_relabelled for r in runs])
    if not np.isnan(terms).any():
        return terms
    warnings.warn(f"tempered SMC from a reference: the sum over the relabellings of the latent labels has too many "
                  f"terms of similar size to add up in {int(np.isnan(terms).sum())} of {terms.size} runs; the "
                  f"estimate counts none of them and may fall short of log p(X) by up to {symmetry.log_order:.1f} nats",
                  EvidenceWarning, stacklevel=3)
    return np.zeros(terms.size)


def _check_schedule(schedule):
    if schedule is None:
        return None
    if isinstance(schedule, (str, bytes)):
        raise TypeError("schedule must be an increasing array of temperatures ending at 1, got a string")
    try:
        values = np.asarray(schedule, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(f"schedule must be an increasing array of temperatures ending at 1: {error}") from None
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"schedule must be a non-empty 1-D array of temperatures, got shape {values.shape}")
    if values[0] == 0.0:
        values = values[1:]
    if values.size == 0 or not np.all(np.isfinite(values)) or values[-1] != 1.0 or np.any(values <= 0) \
            or np.any(np.diff(values) <= 0):
        raise ValueError("schedule must be strictly increasing temperatures in (0, 1] ending at exactly 1 "
                         "(a leading 0 is allowed)")
    return values


def _check_options(num_particles, num_runs, rho, num_sweeps, schedule, kernel, progress_bar, max_configs,
                   start_a=None, cell_moves=0, pair_moves=0, reference_sweeps=0, node_moves=0):
    check_int(num_particles, "num_particles", minimum=2)
    check_int(num_runs, "num_runs", minimum=1)
    check_positive(rho, "rho", upper=1.0)
    if rho >= 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho}")
    check_int(num_sweeps, "num_sweeps", minimum=1)
    schedule = _check_schedule(schedule)
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a string, got {type(kernel).__name__}")
    check_choice(kernel, "kernel", KERNELS)
    resolve_progress(progress_bar)  # validates
    check_int(max_configs, "max_configs", minimum=1)
    if start_a is not None:
        check_positive(start_a, "start_a")
    check_int(cell_moves, "cell_moves", minimum=0)
    check_int(pair_moves, "pair_moves", minimum=0)
    check_int(node_moves, "node_moves", minimum=0)
    if reference_sweeps is not None:
        check_int(reference_sweeps, "reference_sweeps", minimum=0)
    return schedule


def pooled(run_log_evidence) -> tuple[float, float]:
    """Log-mean-exp of the runs and a standard error from their spread
    (:func:`bam_ppl.estimate.pool_runs`); nan for one run."""
    value, stderr = pool_runs(np.asarray(run_log_evidence, np.float64))
    return float(value), float(stderr)


@renamed_options(num_runs="num_chains", kernel="engine")
def run_tempered(model, data, rng_key=0, *, num_particles: int = 256, num_chains: int = 4, rho: float = 0.9,
                 num_sweeps: int = 1, schedule=None, engine: str = "auto", progress_bar: bool | None = None,
                 max_configs: int = DEFAULT_MAX_CONFIGS, start_a: float | None = 1.0,
                 cell_moves: int = 0, pair_moves: int = 0, node_moves: int = 0, reference=None,
                 reference_sweeps: int | None = None) -> TemperedResult:
    """Run ``num_chains`` independent tempered SMC samplers over the token allocations.

    Parameters
    ----------
    model, data, rng_key
        The AllocationModel, its counts (array-like or CountTensor, missing entries allowed:
        ``CountTensor.from_samples``) and an int or JAX key.
    num_particles : int
        Particles per run (P ≥ 2).
    num_chains : int
        Independent runs (formerly ``num_runs``); their estimates are pooled (log-mean-exp) and
        their spread gives the standard error.
    rho : float in (0, 1)
        Conditional-ESS fraction kept between consecutive temperatures (adaptive schedule, Zhou,
        Johansen & Aston 2016): higher means more temperatures.
    num_sweeps : int
        Collapsed-Gibbs sweeps over all tokens per temperature.
    schedule : array, optional
        Fixed increasing temperatures in (0, 1] ending at 1 (e.g. a pilot run's
        ``schedules[0]``); the estimator is then unbiased on the natural scale. ``rho`` is ignored.
    engine : {"auto", "numba", "jax"}
        (Formerly ``kernel``.) numba CPU kernel (threads over blocks of particles) or the JAX kernel (vmap over
        particles; any device). "auto": numba on a CPU when installed.
    progress_bar : bool or None
        A tqdm bar over runs (None: only when there are several runs and many tokens).
    max_configs : int
        Largest number of joint free-node configurations enumerated per token.
    start_a : float, optional
        Start from the latent tables' urn with concentrations scaled by max(1, start_a / a) (as
        if the model's equivalent sample size were ``start_a``) instead of the latent prior π₀,
        on the geometric path start^(1−β) · (π₀ L)^β. With small concentrations π₀ puts nearly
        every token in one configuration; a flatter start spreads the particles, and Gibbs moves
        merge tokens far more easily than they split them. Default 1: models with a ≥ 1 start
        from π₀, models with small a from the flatter urn. None: always start from π₀.
    cell_moves : int
        Passes of cell moves per temperature, after the sweeps: every cell with two tokens or more
        in turn has all its tokens removed and re-placed one by one from their tempered urn
        conditionals, a Metropolis–Hastings proposal accepted with probability
        min(1, Π W(new) / Π W(old)) (W: the sums of the conditional weights along the way;
        sequential allocation as in Dahl 2005 and Jain & Neal 2004). A cell's tokens reinforce each
        other through the urn, so single-token moves rarely move a large cell as a whole. numba
        kernel only.
    pair_moves : int
        Pair moves per temperature: two configurations drawn at random, and every token in either
        re-placed between them, cell by cell in random cell order, by the same sequential proposal.
        numba kernel only.
    node_moves : int
        Node moves per temperature (split–merge moves, Jain & Neal 2004): a latent node and two of
        its values drawn at random, and every token whose configuration gives the node either
        value re-placed between the two, its other nodes kept, by the same sequential proposal.
        It re-divides two classes of a node as a whole (two topics of NMF, two sender groups of
        a Tucker model), which single-token moves can do only through allocations of low
        probability. numba kernel only.
    reference : (cells, counts), optional
        An allocation (full cells (n, nodes) and counts (n,) adding up to X, e.g. the
        ``best_cells``, ``best_counts`` of an earlier run) around which to build the start: the
        product q(z) = Π_τ q(cell of τ, z_τ) of every cell's urn conditional averaged over
        ``reference_sweeps`` Gibbs sweeps of the posterior by a chain from it
        (:func:`reference_from_chain`; each run its own chain, so that the spread of the runs
        includes that of q), on the geometric path q^(1−β) (π₀ L)^β (``start_a`` is then
        unused). Or a :class:`Reference` from :func:`build_references`, shared by every run, or
        a list of ``num_chains`` of them, one per run (so that the runs' spread includes the
        references').
        Such a q approximates the posterior's marginals in one copy of its bulk, so the path is
        short whatever the number of tokens, where the path from π₀ grows with it. The
        relabellings of the latent values that leave p(X, z) unchanged make copies of every mode
        that a reference in one of them never visits; the last step reweights the particles by
        |G| w(z) (:func:`symmetric_log_weights`), which counts them. Modes of other shapes away
        from the reference are found only as far as the moves reach them: on tiny data the
        estimate can fall a little low where the prior-started sampler is exact, and references
        from different chains can give values far apart (``method="auto"`` uses it from 1000 tokens on, from the best of several references).
    reference_sweeps : int, optional
        Sweeps of each chain from ``reference`` whose conditionals are averaged into q (0: the
        reference allocation's own conditionals). Default: REFERENCE_SWEEPS_PER_TOKEN (0.8) × T,
        at least REFERENCE_MIN_SWEEPS (100): the chains must travel through the posterior's bulk,
        which takes longer as T grows.

    Notes
    -----
    ``stderr`` comes from the spread of the independent runs. A bias that every run shares —
    particles that have not mixed at some temperature, which makes log estimates too low — is
    not in it: check that the estimate no longer rises with effort (``num_sweeps``, ``rho``,
    ``num_particles``) before trusting a small error bar. An adaptive schedule also leaves a small
    bias (benchmarks/README.md, "Bias of the tempered SMC's adaptive schedule"); fixing
    ``schedule`` from a pilot run removes it. The sure lower bound ``lower_bound`` holds whatever
    the effort. Small tables whose few cells hold many tokens each are hard for it (HairEyeColor
    under CP(2): 4–13 nats low, with or without cell and pair moves); ``method="auto"`` uses the
    Pólya-urn SMC there (benchmarks/README.md, "Which estimator on small tables").
    """
    num_runs = check_int(num_chains, "num_chains", minimum=1)
    if not isinstance(engine, str):
        raise TypeError(f"engine must be a string, got {type(engine).__name__}")
    kernel = check_choice(engine, "engine", KERNELS)
    schedule = _check_options(num_particles, num_runs, rho, num_sweeps, schedule, kernel, progress_bar,
                              max_configs, start_a, cell_moves, pair_moves, reference_sweeps, node_moves)
    if reference is not None and numba is None:
        raise ImportError("tempered SMC: a reference is built by the numba kernel: pip install numba")
    kernel = resolve_kernel(kernel)
    if kernel == "jax" and cell_moves + pair_moves + node_moves > 0:
        warnings.warn("tempered SMC: the JAX kernel has no block moves; it runs the Gibbs sweeps only "
                      "(cell_moves, pair_moves and node_moves are ignored). Use engine='numba' for them.",
                      UserWarning, stacklevel=2)
        cell_moves = pair_moves = node_moves = 0
    key = as_key(rng_key)
    data, bound, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="the tempered SMC")
    references = None
    if reference is None:
        start_scale = 1.0 if start_a is None else max(1.0, float(start_a) / bound.a)
        tp = build_tempered_problem(bound, data, layout, start_scale)
    else:
        tp = build_tempered_problem(bound, data, layout)
        references = _references_per_run(reference, num_runs)
        if references is not None:
            built = sorted({ref.num_sweeps for ref in references})
            if reference_sweeps is not None and built != [reference_sweeps]:
                raise ValueError(f"reference_sweeps: the references were built with {built} sweeps; "
                                 "leave reference_sweeps out, or pass an allocation as reference")
            run_tps = [with_reference(tp, _checked_reference(tp, ref)) for ref in references]
            reference_sweeps = built[-1]
        else:
            reference_config = configs_of_allocation(bound, data, layout, tp.token_cell, reference, "reference")
            if reference_sweeps is None:
                reference_sweeps = default_reference_sweeps(data.total)
    progress_bar = resolve_progress(progress_bar, long_run=num_runs > 1 and data.total * num_particles > 2_000_000)
    start = time.perf_counter()
    runs = []
    pool = ThreadPoolExecutor(max_workers=max(1, min(NUM_BLOCKS, os.cpu_count() or 1))) \
        if kernel == "numba" or reference is not None else None
    bar = make_bar(num_runs, "tempered SMC", progress_bar, unit="run")
    symmetry = None
    try:
        with jax.enable_x64(True):
            # Seeds of every run: one Generator per particle block and one for resampling.
            seeds = np.asarray(jax.random.split(key, num_runs * (NUM_BLOCKS + 1)))
            seeds = seeds.reshape(num_runs, NUM_BLOCKS + 1, -1).astype(np.uint32)
            if reference is not None:
                symmetry = _label_symmetries(bound, data, layout)
            if references is None and reference is not None:  # every run its own q, so that their spread includes q's
                run_keys = [jax.random.fold_in(key, num_runs + r) for r in range(num_runs)]
                run_tps = [with_reference(tp, log_q) for log_q in
                           chain_references(tp, [reference_config] * num_runs, reference_sweeps, run_keys, pool)]
            for r in range(num_runs):
                run_tp = tp if reference is None else run_tps[r]
                if kernel == "numba":
                    particles = NumbaParticles(run_tp, num_particles, seeds[r, :NUM_BLOCKS], pool)
                else:
                    particles = JaxParticles(run_tp, num_particles, jax.random.fold_in(key, r))
                resample_rng = np.random.default_rng(seeds[r, NUM_BLOCKS])
                runs.append(_one_run(particles, run_tp, resample_rng, rho, num_sweeps, schedule,
                                     (cell_moves, pair_moves, node_moves), symmetry))
                bar.update(1)
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown()
    if any(r.degenerate_start for r in runs):
        warnings.warn(
            "tempered SMC: most particles drawn from the start distribution have the same "
            "likelihood (small concentrations put all tokens in one configuration), so the "
            "allocations the posterior favours are rare at the start and single-token Gibbs moves "
            "find them slowly: the estimate can be too low and its runs spread. Start from a "
            "flatter urn (start_a=1 or larger), raise the effort (rho=0.99, num_sweeps=5, more "
            "particles) until the estimate stops rising, or use method='smc' or 'exact'.",
            EvidenceWarning, stacklevel=2)
    values = np.array([r.log_evidence for r in runs]) + relabelled_terms(runs, symmetry)
    value, stderr = pooled(values)
    best = max(runs, key=lambda r: r.lower_bound)
    cells, counts = best_allocation(bound, data, layout, tp, best.best_config)
    run_best = [best_allocation(bound, data, layout, tp, r.best_config) for r in runs]
    lower_bound = bound.log_prob_cells(cells, counts)  # closed form, equal to the tracked value
    return TemperedResult(
        run_log_evidence=values, log_evidence=value, stderr=stderr,
        num_temperatures=np.array([r.schedule.size for r in runs]),
        num_resamplings=np.array([r.num_resamplings for r in runs]),
        min_ess=np.array([r.min_ess for r in runs]), schedules=[r.schedule for r in runs],
        run_lower_bound=np.array([r.lower_bound for r in runs]), lower_bound=float(lower_bound),
        best_config=best.best_config, best_cells=cells, best_counts=counts,
        run_best_cells=[c for c, _ in run_best], run_best_counts=[n for _, n in run_best],
        block_move_acceptance=_acceptance(sum(r.block_moves for r in runs)), seconds=time.perf_counter() - start,
        reference_sweeps=reference_sweeps if reference is not None else None,
    )


def build_references(model, data, allocation, rng_key=0, num: int = 1, reference_sweeps: int | None = None,
                     max_configs: int = DEFAULT_MAX_CONFIGS) -> list[Reference]:
    """``num`` references built from the allocation ``(cells, counts)`` by independent chains
    (:func:`references_from_allocations`), to pass to :func:`run_tempered` as ``reference``;
    their runs then share one q. Chains of the posterior settle in modes of different mass, so
    references from different chains differ: ``method="auto"`` builds several, tries each by a pilot run and runs from those whose pilots
    lie near the best."""
    check_int(num, "num", minimum=1)
    return references_from_allocations(model, data, [allocation] * num, rng_key, reference_sweeps, max_configs)


def references_from_allocations(model, data, allocations, rng_key=0, reference_sweeps: int | None = None,
                                max_configs: int = DEFAULT_MAX_CONFIGS) -> list[Reference]:
    """One reference from each allocation ``(cells, counts)`` of ``allocations``, by a chain
    started there (:func:`reference_from_chain`, ``reference_sweeps`` sweeps, by default
    :func:`default_reference_sweeps`), the chains run one per core."""
    if reference_sweeps is not None:
        check_int(reference_sweeps, "reference_sweeps", minimum=0)
    if numba is None:
        raise ImportError("tempered SMC: a reference is built by the numba kernel: pip install numba")
    data, bound, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="the tempered SMC")
    tp = build_tempered_problem(bound, data, layout)
    configs = [configs_of_allocation(bound, data, layout, tp.token_cell, allocation, "allocation")
               for allocation in allocations]
    sweeps = default_reference_sweeps(data.total) if reference_sweeps is None else reference_sweeps
    keys = jax.random.split(as_key(rng_key), len(configs))
    with ThreadPoolExecutor(max_workers=max(1, min(len(configs), os.cpu_count() or 1))) as pool:
        return [Reference(log_q, sweeps) for log_q in chain_references(tp, configs, sweeps, keys, pool)]


def _references_per_run(reference, num_runs: int) -> list[Reference] | None:
    """The :class:`Reference` of every run when ``reference`` is one (shared) or a sequence of
    them (one per run); None when it is an allocation."""
    if isinstance(reference, Reference):
        return [reference] * num_runs
    if (isinstance(reference, (list, tuple)) and len(reference) > 0
            and all(isinstance(ref, Reference) for ref in reference)):
        if len(reference) != num_runs:
            raise ValueError(f"reference: one Reference per run, got {len(reference)} for num_runs={num_runs}")
        return list(reference)
    return None


def _checked_reference(tp: TemperedProblem, reference: Reference) -> np.ndarray:
    shape = (tp.cell_start.shape[0] - 1, tp.num_configs)
    log_q = np.asarray(reference.log_q, np.float64)
    if log_q.shape != shape or not np.all(np.isfinite(log_q)):
        raise ValueError(f"reference: a Reference for these data and this model has a finite log_q of shape {shape} "
                         f"(nonzero cells, free configurations), got shape {log_q.shape}"
                         f"{'' if log_q.shape != shape else ' with non-finite values'}; build it with "
                         "build_references(model, data, allocation)")
    return log_q


def allocation_near_counts(model, data, expected_counts, max_configs: int = DEFAULT_MAX_CONFIGS):
    """An allocation (full cells (n, nodes), counts (n,)) near expected table counts (F,) in the
    model's numbering, e.g. a VB fit's ``details["expected_counts"]`` (:func:`configs_from_counts`)."""
    data, bound, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="the tempered SMC")
    tp = build_tempered_problem(bound, data, layout)
    config = configs_from_counts(tp, kernel_counts(tp, expected_counts, bound.column_of))
    return best_allocation(bound, data, layout, tp, config)


def _label_symmetries(bound, data, layout) -> LabelSymmetry:
    """The :class:`LabelSymmetry` of a problem: enumerated up to MAX_RELABELLINGS relabellings;
    beyond, the permanent of the largest symmetric node's permutations around the enumerated
    relabellings of the others, up to PERMANENT_MAX_OUTER of them; otherwise the identity alone,
    with the warning of :func:`~bam_ppl.infer.gibbs.chib.label_symmetries`."""
    from ..gibbs.chib import (
        MAX_RELABELLINGS,
        _Problem,
        label_symmetries,
        node_relabellings,
        symmetric_nodes,
    )

    problem = _Problem(bound, data, layout, False, MAX_RELABELLINGS)
    arrays = (problem.structure, problem.concentration, problem.fixed_counts, problem.num_entries)
    nodes = symmetric_nodes(bound, layout, *arrays)
    sizes = [bound.sizes[name] for name in layout.free]
    order = math.prod(math.factorial(sizes[p]) for p in nodes)
    if nodes and order > MAX_RELABELLINGS:
        largest = max(nodes, key=lambda p: sizes[p])
        others = [p for p in nodes if p != largest]
        if order // math.factorial(sizes[largest]) <= PERMANENT_MAX_OUTER:
            swap = np.stack([configs_with_node(layout, sizes, largest, k) for k in range(sizes[largest])], axis=1)
            return LabelSymmetry(node_relabellings(layout, sizes, others), np.asarray(layout.configs)[:, largest].copy(),
                                 swap, math.log(order))
    relabellings = label_symmetries(bound, layout, *arrays, MAX_RELABELLINGS, "the tempered SMC from a reference")
    return LabelSymmetry(relabellings, log_order=math.log(relabellings.shape[0]))


def _acceptance(block_moves: np.ndarray) -> np.ndarray:
    """Accepted share of the (cell, pair, node) moves from their (proposed, accepted) counts; nan where none ran."""
    proposed, accepted = block_moves[:, 0], block_moves[:, 1]
    return np.where(proposed > 0, accepted / np.maximum(proposed, 1), np.nan)


def best_allocation(bound, data, layout, tp: TemperedProblem, config) -> tuple[np.ndarray, np.ndarray]:
    """Full cells (n, nodes) and counts (n,) of an allocation, grouped by (observed cell, configuration)."""
    keys, counts = np.unique(tp.token_cell.astype(np.int64) * tp.num_configs + np.asarray(config),
                             return_counts=True)
    full = bound.full_cells(data, layout)  # (U, L, nodes)
    return full[keys // tp.num_configs, keys % tp.num_configs], counts


@register_evidence("tempered", models=(AllocationModel,))
@renamed_options(num_runs="num_chains", kernel="engine")
def tempered_log_evidence(model, data, *, rng_key=0, num_particles: int = 256, num_chains: int = 4,
                          rho: float = 0.9, num_sweeps: int = 1, schedule=None, engine: str = "auto",
                          progress_bar: bool | None = None, max_configs: int = DEFAULT_MAX_CONFIGS,
                          start_a: float | None = 1.0, cell_moves: int = 0, pair_moves: int = 0,
                          node_moves: int = 0, reference=None, reference_sweeps: int | None = None):
    """Tempered SMC estimate of log p(X) over the token allocations (see :func:`run_tempered`).

    Annealing from the latent urn prior to the posterior with adaptive temperatures (Del Moral,
    Doucet & Jasra 2006; Neal 2001; Zhou, Johansen & Aston 2016) and collapsed-Gibbs moves;
    ``details`` holds the runs' values, the sure lower bound (largest log π(S) visited) and the
    allocation that attains it (``best_cells`` (n, nodes), ``best_counts`` (n,): its nonzero
    cells, so that ``bound.log_prob_cells(best_cells, best_counts)`` is the bound) and every run's
    best allocation (``run_best_cells``, ``run_best_counts``), the schedules and diagnostics.
    """
    result = run_tempered(model, data, rng_key, num_particles=num_particles, num_chains=num_chains, rho=rho,
                          num_sweeps=num_sweeps, schedule=schedule, engine=engine, progress_bar=progress_bar,
                          max_configs=max_configs, start_a=start_a, cell_moves=cell_moves, pair_moves=pair_moves,
                          node_moves=node_moves, reference=reference, reference_sweeps=reference_sweeps)
    return EvidenceEstimate(
        value=result.log_evidence, stderr=result.stderr, method="tempered", kind="estimate",
        lower_bound=result.lower_bound, run_values=tuple(result.run_log_evidence.tolist()), seconds=result.seconds,
        details=dict(run_log_evidence=result.run_log_evidence.tolist(), lower_bound=result.lower_bound,
                     best_cells=result.best_cells, best_counts=result.best_counts,
                     run_best_cells=result.run_best_cells, run_best_counts=result.run_best_counts,
                     num_temperatures=result.num_temperatures.tolist(),
                     num_resamplings=result.num_resamplings.tolist(), min_ess=float(result.min_ess.min()),
                     schedule=[s.tolist() for s in result.schedules], num_particles=num_particles,
                     num_runs=num_chains, rho=rho if schedule is None else None, num_sweeps=num_sweeps,
                     kernel=resolve_kernel(engine), start_a=start_a, seconds=result.seconds,
                     cell_moves=cell_moves, pair_moves=pair_moves, node_moves=node_moves,
                     referenced=reference is not None,
                     reference_sweeps=result.reference_sweeps,
                     cell_move_acceptance=float(result.block_move_acceptance[0]),
                     pair_move_acceptance=float(result.block_move_acceptance[1]),
                     node_move_acceptance=float(result.block_move_acceptance[2])),
    )
