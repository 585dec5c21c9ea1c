"""References of the tempered SMC (:mod:`bam_ppl.infer.smc.tempered`): product distributions
q(z) = Π_τ q(cell of τ, z_τ) built from collapsed-Gibbs chains of the posterior, from which the
sampler starts on the path q^(1−β) (π₀ L)^β."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import jax
import numpy as np

from ...models.allocation import DEFAULT_MAX_CONFIGS
from ...types import as_key
from ...validation import check_int
from ..gibbs import collapsed_numba as gibbs_numba
from ..gibbs.augmented_numba import augmented_sweeps, posterior_concentration, split_draws
from ..prepare import configs_of_allocation, prepare
from .tempered_numba import _cell_probabilities, kernel_tables
from .tempered_problem import (
    TemperedProblem,
    build_tempered_problem,
    counts_of_configs,
)

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None


REFERENCE_FLOOR = 1e-3  # share of the reference spread evenly over a cell's allowed configurations
# One chain per reference: chains of the posterior settle in modes of different mass, and an
# average over chains in different modes is a blend that fits none of them. The chains of several
# references run at once, one per core.


class Reference(NamedTuple):
    """A reference distribution q for the tempered SMC, built once (:func:`build_references`) and
    shared by the runs it is passed to: ``log_q`` (U, L) per nonzero cell and free configuration."""

    log_q: np.ndarray
    num_sweeps: int


def default_reference_sweeps(num_tokens: int) -> int:
    """Chain length of a reference when ``reference_sweeps`` is not given: the engine's
    (:func:`~bam_ppl.infer.smc.mixture.chain_sweeps` at effort 1), so that every reference's chain
    travels as far through the posterior's bulk, whichever method builds it."""
    from .mixture import chain_sweeps, effort_sizes  # mixture builds on this module

    return chain_sweeps(effort_sizes(1.0), num_tokens)


# Conditionals averaged every this many sweeps: consecutive sweeps barely differ, and computing
# them is a sizeable share of a chain's time.
REFERENCE_THIN = 4


def reference_from_chain(tp: TemperedProblem, config: np.ndarray, num_sweeps: int, seed,
                         floor: float = REFERENCE_FLOOR, skip: int = 0) -> np.ndarray:
    """A per-cell reference q for :func:`with_reference`, from the allocation with token
    configurations ``config`` (T,): every cell's urn conditional (eq. 4.1, β = 1) averaged over
    ``num_sweeps`` collapsed-Gibbs sweeps of the posterior (every REFERENCE_THIN-th, and the
    start; with ``num_sweeps`` 0 the allocation's own conditionals) by one chain started there
    and seeded by ``seed``, the first ``skip`` sweeps left out, then mixed with ``floor`` of the uniform distribution over the
    configurations the cell allows so that none is out of reach. The average over a long chain
    estimates the posterior's marginals in the mode it settles in, the product over tokens of
    which is the closest product distribution to the posterior there (KL(π ‖ q)). A chain started
    at a high-probability allocation falls from it into the posterior's bulk; ``skip`` leaves its
    way there out of q. The chain runs the
    collapsed-Gibbs backend's sweeps (:func:`~bam_ppl.infer.gibbs.collapsed_numba.gibbs_sweeps`,
    faster than the tempered kernel at β = 1, which also tracks the log terms), the tokens in a
    fixed order (a systematic scan: each update leaves the posterior invariant, and q only starts
    the annealing, so the order bears on q's fit, never on the estimate's unbiasedness; it saves a
    shuffle's random draw per token), and releases the
    GIL, so that the chains of several references run in threads. Returns log q (U, L), 0 where a configuration
    is not allowed (the kernel masks those)."""
    chain = start_chain(tp, None, config, seed)
    chain.sweep(min(int(skip), num_sweeps))
    return averaged_reference(chain, max(0, num_sweeps - int(skip)), floor).log_q


# States a chain keeps from the sweeps its reference averages, to tell which later starts the reference covers
# (:func:`~bam_ppl.infer.smc.mixture.covered_by`): a further state of the region it explored falls below all of
# them with probability 1/17.
RECORDED_STATES = 16


class ChainReference(NamedTuple):
    """A reference ``log_q`` (U, L) and the token configurations ``states`` (RECORDED_STATES, T) of
    states its chain visited while averaging, evenly spread."""

    log_q: np.ndarray
    states: np.ndarray


def start_chain(tp: TemperedProblem, cells, config: np.ndarray, seed):
    """A posterior chain at the token configurations ``config``, seeded by ``seed``: collapsed
    (``cells`` None) or data augmentation (``cells`` the problem's ``HostProblem``, its cells' arrays)."""
    return _Chain.start(tp, config, seed) if cells is None else _AugmentedChain.start(tp, cells, config, seed)


def averaged_reference(chain, num_sweeps: int, floor: float = REFERENCE_FLOOR) -> ChainReference:
    """The reference of ``chain`` (:func:`start_chain`) over its next ``num_sweeps`` sweeps, and
    RECORDED_STATES of the states it visits (the last one's at the end)."""
    return drive(averaged_reference_steps(chain, num_sweeps, floor))


def averaged_reference_steps(chain, num_sweeps: int, floor: float = REFERENCE_FLOOR):
    """:func:`averaged_reference` as steps (:func:`drive`)."""
    marks = np.linspace(num_sweeps, 0, RECORDED_STATES, endpoint=False)[::-1]
    marks = np.minimum(np.round(marks / chain.thin) * chain.thin, num_sweeps).astype(np.int64)  # on averaged sweeps
    marks[-1] = num_sweeps
    total, states, done = chain.average_from(), [], 0
    for mark in marks:
        done += yield from chain.average_steps(max(0, int(mark) - done), total)
        states.append(chain.config())
    return ChainReference(_floored_log_q(total, chain.allowed(), floor), np.stack(states))


def drive(steps):
    """Runs ``steps``, a generator that yields the chain sweeps it needs as ``(chain, num_sweeps)`` and returns
    its result, making each sweep as it asks; its result."""
    try:
        chain, num_sweeps = next(steps)
        while True:
            chain.sweep(num_sweeps)
            chain, num_sweeps = next(steps)
    except StopIteration as stop:
        return stop.value


def drive_pair(first, second) -> list:
    """:func:`drive` of two independent generators in one thread: while both wait on sweeps of collapsed chains
    that one kernel can sweep together (``gibbs_sweeps_pair`` of ``bam_ppl.infer.gibbs.collapsed_numba``), their
    common sweeps run there, about a quarter faster, every chain's draws those it makes alone; the rest in
    turn. Their results."""
    steps, waiting, results = (first, second), [None, None], [None, None]

    def advance(k):
        try:
            waiting[k] = list(next(steps[k]))
        except StopIteration as stop:
            waiting[k], results[k] = None, stop.value

    advance(0)
    advance(1)
    while waiting[0] is not None or waiting[1] is not None:
        if waiting[0] is not None and waiting[1] is not None and _Chain.pairable(waiting[0][0], waiting[1][0]):
            swept = min(waiting[0][1], waiting[1][1])
            waiting[0][0].sweep_with(waiting[1][0], swept)
            ready = [0, 1]
        else:
            ready = [0 if waiting[0] is not None else 1]
            swept = waiting[ready[0]][1]
            waiting[ready[0]][0].sweep(swept)
        for k in ready:
            waiting[k][1] -= swept
            if waiting[k][1] == 0:
                advance(k)
    return results


class _Chain(NamedTuple):
    """A collapsed-Gibbs chain of the posterior as the reference builders run it (numba, no GIL)."""

    tp: TemperedProblem
    rows: object
    factorised: object
    structure: object
    rng: np.random.Generator
    shifted: np.ndarray  # α + counts (kernel numbering), updated in place
    state: np.ndarray  # every token's configuration, updated in place
    order: np.ndarray  # the tokens in the order every sweep visits them (:func:`reference_from_chain`)
    out: np.ndarray  # (U, L) the cells' conditionals at the last call of ``conditionals``
    thin: int = REFERENCE_THIN

    @classmethod
    def start(cls, tp: TemperedProblem, config: np.ndarray, seed) -> _Chain:
        rows = tp.gibbs_rows
        return cls(tp, rows, gibbs_numba.factorised_rows(rows, tp.concentration, tp.token_cell.shape[0]),
                   kernel_tables(tp, False), np.random.default_rng(np.asarray(seed, np.uint32)),
                   tp.concentration + counts_of_configs(tp, config), np.array(config, np.int32),
                   np.arange(len(config), dtype=np.int32), np.empty((tp.cell_start.shape[0] - 1, tp.num_configs)))

    def sweep(self, num_sweeps: int) -> int:
        if num_sweeps > 0:
            gibbs_numba.gibbs_sweeps(self.rng, num_sweeps, False, self.shifted, self.state, self.order, self.rows,
                                     self.factorised)
        return num_sweeps

    def conditionals(self) -> np.ndarray:
        _cell_probabilities(self.shifted, self.structure, self.tp.cell_start, self.tp.factorised, self.out)
        return self.out

    def average_from(self) -> np.ndarray:
        """The sum of conditionals an average starts with: the current state's."""
        return self.conditionals().copy()

    def sweep_with(self, other: _Chain, num_sweeps: int) -> None:
        """``num_sweeps`` sweeps of this chain and ``other`` (:meth:`pairable`) in one kernel."""
        if num_sweeps > 0:
            gibbs_numba.gibbs_sweeps_pair((self.rng, other.rng), num_sweeps, (self.shifted, other.shifted),
                                          (self.state, other.state), self.order, self.factorised)

    @staticmethod
    def pairable(chain, other) -> bool:
        """Whether :meth:`sweep_with` sweeps ``chain`` and ``other`` together: collapsed chains of one problem
        whose rows take the fused kernel."""
        return (isinstance(chain, _Chain) and isinstance(other, _Chain) and chain.tp is other.tp
                and gibbs_numba.is_fused(chain.factorised))

    def average_steps(self, num_sweeps: int, total: np.ndarray):
        """``num_sweeps`` sweeps, the conditionals of every REFERENCE_THIN-th added to ``total``, as steps
        (:func:`drive`); the sweeps made."""
        done = 0
        while done < num_sweeps:
            step = min(REFERENCE_THIN, num_sweeps - done)
            yield self, step
            done += step
            total += self.conditionals()
        return done

    def config(self) -> np.ndarray:
        return self.state.astype(np.int64)

    def allowed(self) -> np.ndarray:
        return self.out


class _AugmentedChain(NamedTuple):
    """A data-augmentation chain of the posterior (:mod:`~bam_ppl.infer.gibbs.augmented_numba`): the
    tables drawn given the cells' splits ``split`` (U, L), then every cell's split given them."""

    cells: object
    rng: np.random.Generator
    split: np.ndarray
    thin: int = 1

    @classmethod
    def start(cls, tp: TemperedProblem, cells, config: np.ndarray, seed) -> _AugmentedChain:
        num_cells, num_configs = cells.valid.shape
        split = np.bincount(tp.token_cell.astype(np.int64) * num_configs + np.asarray(config, np.int64),
                            minlength=num_cells * num_configs).reshape(num_cells, num_configs)
        return cls(cells, np.random.default_rng(np.asarray(seed, np.uint32)), split)

    def sweep(self, num_sweeps: int) -> int:
        if num_sweeps > 0:
            augmented_sweeps(self.rng, num_sweeps, num_sweeps, self.split, self.cells, np.zeros(self.split.shape))
        return num_sweeps

    def average_from(self) -> np.ndarray:
        return np.zeros(self.split.shape)

    def average_steps(self, num_sweeps: int, total: np.ndarray):
        """The sweeps and their average in one kernel call, as steps that ask for nothing (:func:`drive`)."""
        yield from ()
        return augmented_sweeps(self.rng, num_sweeps, 0, self.split, self.cells, total) if num_sweeps > 0 else 0

    def config(self) -> np.ndarray:
        """Token configurations of the splits (tokens sorted by cell)."""
        return np.repeat(np.tile(np.arange(self.split.shape[1]), self.split.shape[0]), self.split.reshape(-1))

    def allowed(self) -> np.ndarray:
        return self.cells.valid.astype(np.float64)


def augmented_sweep_draws(cells) -> int:
    """Random numbers a data-augmentation sweep draws at most: one per table entry and min(X_u, L_u)
    per cell u (L_u its allowed configurations)."""
    return int(cells.alpha.size + split_draws(cells))


def augmented_chain_is_cheaper(cells, sweeps_factor: float) -> bool:
    """Whether a data-augmentation chain of ``sweeps_factor`` times the sweeps draws fewer random
    numbers (:func:`augmented_sweep_draws`) than the collapsed chain, whose sweep draws one per token."""
    return bool(sweeps_factor * augmented_sweep_draws(cells) < cells.counts.sum())


def mean_table_log_likelihood(token_cell: np.ndarray, cells, config: np.ndarray) -> float:
    """log p(X | θ̄) = Σ_u X_u log Σ_l Π_m θ̄_m[f_m(u, l)], θ̄ the posterior mean of the tables given the allocation
    with token configurations ``config`` (tokens in cells ``token_cell``; ``cells`` the problem's ``HostProblem``):
    it rises while a chain climbs into a basin and levels off, noisy, within one (``benchmarks/chain_climb.py``).
    VB's ``training_log_likelihood`` at α + n, on the host: its JAX ops compile anew for each data shape, which
    made a call at 1000 tokens 2.4 times as long."""
    num_cells, num_configs = cells.valid.shape
    split = np.bincount(np.asarray(token_cell, np.int64) * num_configs + np.asarray(config, np.int64),
                        minlength=num_cells * num_configs).reshape(num_cells, num_configs)
    concentration = np.empty(cells.alpha.shape[0])
    posterior_concentration(split, cells, concentration)
    log_theta = np.log(concentration) - np.log(np.bincount(cells.column_of, concentration,
                                                           cells.num_columns)[cells.column_of])
    log_p = np.zeros(cells.valid.shape)
    for m in range(cells.cell_flat.shape[0]):
        log_p += cells.mask[m][:, None] * log_theta[cells.cell_flat[m][:, None] + cells.config_flat[m][None, :]]
    return float(cells.counts @ np.logaddexp.reduce(np.where(cells.valid, log_p, -np.inf), axis=1))


def _floored_log_q(total: np.ndarray, last: np.ndarray, floor: float) -> np.ndarray:
    """log q (U, L) of summed conditionals ``total``, mixed with ``floor`` of the uniform distribution
    over the configurations each cell allows (those ``last`` gives mass); 0 where not allowed."""
    allowed = last > 0.0
    q = (1.0 - floor) * total / total.sum(1, keepdims=True) + floor * allowed / allowed.sum(1, keepdims=True)
    return np.where(allowed, np.log(np.where(allowed, q, 1.0)), 0.0)


def chain_references(tp: TemperedProblem, configs, num_sweeps: int, keys, pool) -> list[np.ndarray]:
    """log q of :func:`reference_from_chain`, one per start configuration in ``configs`` and raw
    JAX key (rows of ``keys``), their chains run on ``pool``."""
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
    _cell_probabilities(np.asarray(tp.concentration + counts_kernel, np.float64), kernel_tables(tp, False),
                        tp.cell_start, tp.factorised, probability)
    sizes = np.diff(tp.cell_start)
    share = probability * sizes[:, None]
    whole = np.floor(share).astype(np.int64)
    missing = sizes - whole.sum(1)
    ranks = np.argsort(np.argsort(-(share - whole), axis=1), axis=1)
    whole += ranks < missing[:, None]
    return np.repeat(np.tile(np.arange(tp.num_configs), num_cells), whole.reshape(-1)).astype(np.int64)


def uniform_reference(tp: TemperedProblem) -> np.ndarray:
    """log q (U, L) of the uniform distribution over the configurations each cell allows (0 where
    not allowed, as :func:`reference_from_chain` gives it)."""
    probability = np.empty((tp.cell_start.shape[0] - 1, tp.num_configs))
    _cell_probabilities(np.asarray(tp.concentration, np.float64), kernel_tables(tp, False), tp.cell_start,
                        tp.factorised, probability)
    allowed = probability > 0.0
    return np.where(allowed, -np.log(allowed.sum(1, keepdims=True)), 0.0)


def with_reference(tp: TemperedProblem, log_reference: np.ndarray) -> TemperedProblem:
    """``tp`` starting from the product q(z) = Π_τ q(cell of τ, z_τ) on the geometric path
    q^(1−β) (π₀ L)^β: ``log_reference`` (U, L) holds log q, normalised over the configurations
    each cell allows (:func:`reference_from_counts`). q is normalised, so log Z₀ = 0."""
    return tp._replace(log_reference=np.ascontiguousarray(log_reference, np.float64), referenced=True, tilted=True,
                       log_z0=0.0)


def build_references(model, data, allocation, rng_key=0, num: int = 1, reference_sweeps: int | None = None,
                     max_configs: int = DEFAULT_MAX_CONFIGS) -> list[Reference]:
    """``num`` references built from the allocation ``(cells, counts)`` by independent chains
    (:func:`references_from_allocations`), to pass to :func:`~bam_ppl.infer.smc.tempered.run_tempered` as ``reference``;
    their runs then share one q. Chains of the posterior settle in modes of different mass, so
    references from different chains differ: ``method="mixture"`` anneals from a mixture of several
    (:mod:`~bam_ppl.infer.smc.mixture`)."""
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

