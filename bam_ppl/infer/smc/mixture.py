"""The tempered SMC from a mixture of references: every basin a search finds enters the start.

A reference q_b(z) = Π_τ q_b(cell of τ, z_τ) built around one basin of the posterior (``reference_from_chain`` in
``bam_ppl.infer.smc.references``) keeps the annealing path short at any number of tokens, but
covers that basin only. Which basins carry the posterior's mass is not known in advance, so every
one a cheap search finds enters one start distribution, and the importance weights decide how
much each carries (multiple importance sampling: Veach & Guibas 1995; Owen & Zhou 2000).

Each particle carries a component label b, drawn with probability w_b and kept along the path,
so that the sampler targets the extended distributions (Del Moral, Doucet & Jasra 2006)::

    γ_β(b, z) = w_b q_b(z)^(1−β) (π₀ L)(z)^β,   Z_0 = 1,   Z_1 = Σ_b w_b p(X) = p(X),

whose moves for a fixed b are those of the single-reference sampler. Resampling moves particles
from components whose tempered mass falls behind to those that hold it. A particle of component b
never leaves b's basin in practice, so each component alone would count only its own basin's
mass; the last step reweights every particle by::

    f(b, z) = |G| q_b(z) / Σ_b' w_b' Σ_g q_b'(g(z)),

with G the label symmetries (``orbit_log_sums`` in ``bam_ppl.infer.smc.symmetry``). With
q = Σ_b w_b q_b, under the final target w_b p(z | X)::

    E[f] = Σ_z p(z | X) |G| q(z) / Σ_g q(g(z)) = 1      (p(X, z) is invariant under G),

so Ẑ Σ_p W_p f(b_p, z_p) stays an unbiased estimate of p(X) on the natural scale; in a basin that
only component b covers, f ≈ ``|G| / w_b``, which restores the mass of every found basin and of every
relabelled copy of it. Components that cover the same basin share it (f ≈ 1 / (w_b + w_b')): a
basin found twice is not counted twice.

Each run's search takes its starts in turn. A start's chain stops as soon as an earlier reference covers
its state (it scores under that reference, up to relabelling, within the range of the reference's own
chain's states), checked after 0, 1, 2, 4, … sweeps up to halfway, and adds its weight to that reference;
the others finish theirs (:func:`scout`). A start judged covered in error loses only its own reference,
never the estimate's unbiasedness.

Each run r has a search of its own (its share of the call's scouts and VB restarts) and anneals from its start
q_r, but its last reweighting puts the start of the whole call, q̄ = (1/R) Σ_r q_r, in f's denominator (the balance
heuristic of multiple importance sampling: Veach & Guibas 1995; Owen & Zhou 2000). By the identity above with q̄
for q, summed over the runs' components, E[(1/R) Σ_r Ẑ_r | searches] = p(X): a basin that one search found counts
in full in the call, not 1/R of it. The runs are then not alike (a run whose search missed a basin stays low), so
the stated error takes the searches as its units (:func:`~bam_ppl.estimate.pool_searches`): the spread of the
call's value over bootstrap resamples of the searches, each run reweighted once more by the start of the resampled
searches. It is wide where the value rests on a basin that few searches found, narrow where most found it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import NamedTuple

import jax
import numpy as np

from ...estimate import EvidenceEstimate, EvidenceWarning, pool_searches, single_search_share
from ...models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel
from ...parallel import chain_keys
from ...progress import make_bar, resolve_progress
from ...types import as_key
from ...validation import check_int, check_positive
from ..info import MixtureInfo
from ..prepare import prepare
from ..registry import register_evidence
from ..variational.vb_numba import HostProblem, host_problem
from .mixture_start import (
    CallStart,
    MixtureParticles,
    MixtureStart,
    PendingCallStarts,
    mixture_log_weights,
)
from .references import (
    augmented_chain_is_cheaper,
    augmented_sweep_draws,
    averaged_reference_steps,
    configs_from_counts,
    drive,
    drive_pair,
    kernel_counts,
    mean_table_log_likelihood,
    start_chain,
    uniform_reference,
    with_reference,
)
from .resampling import effective_sample_size
from .symmetry import LabelSymmetry, _log_sum_exp, label_symmetries_of, orbit_log_sums
from .tempered import NUM_BLOCKS, PathOptions, TemperedRun, _one_run, pooled, usable_cores
from .tempered_numba import NumbaParticles, numba
from .tempered_problem import TemperedProblem, best_allocation, build_tempered_problem


class MixtureRun(NamedTuple):
    """One run of :func:`run_mixture`: its log evidence (with the last reweighting), the tempered run, its
    moves of whole cells (``MixtureParticles.split_moves``), the share of its estimate that each
    component of its start carries at the end (0 for one that got no particles; nan where not summed) and,
    reweighted by a :class:`~bam_ppl.infer.smc.mixture_start.CallStart`, the log share of each search's start in
    the call's at each particle (:func:`~bam_ppl.estimate.pool_searches`)."""

    log_evidence: float
    run: TemperedRun
    split_moves: np.ndarray
    component_shares: np.ndarray
    search_log_shares: np.ndarray = np.zeros((0, 0))  # (R, P) log (q_s / R q̄) at each particle (module docstring)

    def alone(self, search: int) -> float:
        """log Ẑ_r reweighted by the start of search ``search`` alone (its own: what that search gives by itself)."""
        shares = self.search_log_shares
        return self.log_evidence + _log_sum_exp(self.run.final_log_w - shares[search]) - np.log(shares.shape[0])


class Scouted(NamedTuple):
    """What one start of the search found (:func:`run_search`): the reference ``log_q`` (U, L) its chain
    built (None where an earlier start's reference covers where the chain got to, which then
    carries it: ``covered_by``, its index among the run's starts, −1 for a reference), the annealed
    scout's ``log_evidence`` (nan for a drawn one or a VB fit), the ``config`` its chain started
    from, the ``sweeps`` that chain ran, and, for a reference, ``floor`` and ``ceiling``: the least and
    the largest log Σ_g q(g(z)) over the states z its chain visited while averaging (:func:`covered_by`)."""

    log_q: np.ndarray | None
    log_evidence: float
    config: np.ndarray
    sweeps: int
    floor: float = np.inf
    ceiling: float = -np.inf
    covered_by: int = -1


class MixtureProblem(NamedTuple):
    """What every run of one call shares, prepared once: the problem with the latent urn as its
    start (the scouts'), the same with the references' structure, the label symmetries, the cells'
    arrays ``host`` (:func:`still_climbing`), and whether the references' chains are data-augmentation
    chains (:func:`~bam_ppl.infer.smc.references.augmented_chain_is_cheaper`)."""

    tp: TemperedProblem
    scout_tp: TemperedProblem
    symmetry: LabelSymmetry
    host: HostProblem
    augmented: bool = False

    @property
    def cells(self) -> HostProblem | None:
        """The cells' arrays that data-augmentation chains and cell moves need; None for collapsed chains."""
        return self.host if self.augmented else None


class MixtureOptions(NamedTuple):
    """The sizes of one call (:class:`EngineConfig` says why each): the particles of each run (``num_particles``
    if given, else :func:`particles_for`), the scouts of each kind (:func:`scouts_per_kind`), the sweeps
    of each reference's chain (:func:`chain_sweeps`), the path's ``rho`` and the VB restarts."""

    num_particles: int | None
    particles_per_reference: int
    min_particles: int
    num_scouts: int
    search_draws: int | None  # None: num_scouts given, whatever the search costs
    scout_particles: int
    reference_sweeps: int
    sweeps_per_token: float
    chain_token_moves: int
    rho: float
    vb_restarts: int


def chain_sweeps(options: MixtureOptions, num_tokens: int) -> int:
    """Sweeps of each reference's chain: ``sweeps_per_token`` · T, at least ``reference_sweeps``, at
    most ``chain_token_moves`` / T."""
    wanted = max(options.reference_sweeps, int(round(options.sweeps_per_token * num_tokens)))
    return max(1, min(wanted, options.chain_token_moves // num_tokens))


# The kinds of start whose chains share the search's budget: VB fits, annealed and drawn scouts.
START_KINDS = 3


def scouts_per_kind(options: MixtureOptions, num_tokens: int, draws_per_sweep: int | None = None) -> int:
    """Starts of each kind: ``num_scouts``, fewer (at least one) where the chains of all kinds would draw more than
    ``search_draws`` random numbers together, a chain drawing ``draws_per_sweep`` for each of its
    :func:`chain_sweeps` (:func:`sweep_draws`; by default one per token, a collapsed chain's)."""
    if options.search_draws is None:
        return options.num_scouts
    per_sweep = num_tokens if draws_per_sweep is None else draws_per_sweep
    affordable = options.search_draws // (START_KINDS * chain_sweeps(options, num_tokens) * per_sweep)
    return int(np.clip(affordable, 1, options.num_scouts))


def sweep_draws(problem: MixtureProblem) -> int:
    """Random numbers a start's chain draws for each of its :func:`chain_sweeps`: one per token for a
    collapsed chain, ``augmented_sweeps`` data-augmentation sweeps' worth for the other
    (:func:`~bam_ppl.infer.smc.references.augmented_sweep_draws`)."""
    if problem.cells is None:
        return int(problem.tp.token_cell.shape[0])
    return ENGINE.augmented_sweeps * augmented_sweep_draws(problem.cells)


def particles_for(options: MixtureOptions, num_references: int) -> int:
    """Particles of each run: ``num_particles`` if given, else ``particles_per_reference`` for each of
    the call's ``num_references`` (every run's starts, and the defensive component), at least ``min_particles``."""
    if options.num_particles is not None:
        return options.num_particles
    return max(options.min_particles, options.particles_per_reference * num_references)


def call_particles(options: MixtureOptions, num_starts: int) -> int:
    """Particles of each run of a call whose searches have ``num_starts`` starts in all (:func:`particles_for`
    over them, those an earlier reference covers included, and the defensive component): a basin region
    many starts reach still gets the particles it had when each built a reference of its own."""
    return particles_for(options, num_starts + 1)


def vb_fits(options: MixtureOptions) -> int:
    """VB fits that start references: as many as the scouts of each kind, at most one per restart."""
    return min(options.num_scouts, options.vb_restarts)


def run_starts(options: MixtureOptions) -> int:
    """Starts of one run's search (:func:`search_kinds`): its VB fits and its scouts of both kinds."""
    return vb_fits(options) + 2 * options.num_scouts


def run_share(options: MixtureOptions, num_runs: int) -> MixtureOptions:
    """The sizes of one run's search: its share of the call's scouts of each kind and VB restarts,
    rounded up (at least one scout of each kind)."""
    def share(size, least):
        return max(least, -(-size // num_runs))

    return options._replace(num_scouts=share(options.num_scouts, 1), vb_restarts=share(options.vb_restarts, 0))


class CallSeeds(NamedTuple):
    """Every random stream of one call: ``runs`` (R, NUM_BLOCKS + 1, 2) uint32, each run's particle
    blocks and resampling; ``starts`` (R, 2·S + V, 2, 2) uint32, two for each start of each run's
    search (:func:`run_search`); ``vb`` (R,) each run's key for its VB restarts."""

    runs: np.ndarray
    starts: np.ndarray
    vb: jax.Array


def call_seeds(key, num_runs: int, num_starts: int) -> CallSeeds:
    """The streams of ``num_runs`` runs whose searches have ``num_starts`` starts each."""
    run_key, start_key, vb_key = jax.random.split(key, 3)

    def streams(key, num):
        return np.asarray(jax.random.key_data(jax.random.split(key, num))).astype(np.uint32)

    return CallSeeds(streams(run_key, num_runs * (NUM_BLOCKS + 1)).reshape(num_runs, NUM_BLOCKS + 1, -1),
                     streams(start_key, 2 * num_runs * num_starts).reshape(num_runs, num_starts, 2, -1),
                     jax.random.split(vb_key, num_runs))


class _Inline:
    """An executor that runs its tasks in the calling thread (a scout inside a pool's thread)."""

    map = staticmethod(lambda fn, *items: list(map(fn, *items)))


class Started(NamedTuple):
    """A start of the search before its chain sweeps (:func:`start`): the ``chain``
    (:func:`~bam_ppl.infer.smc.references.start_chain`), the annealed scout's ``log_evidence`` (nan
    for the others), the ``config`` the chain starts from and its full ``sweeps``."""

    chain: object
    log_evidence: float
    config: np.ndarray
    sweeps: int


def start(problem: MixtureProblem, options: MixtureOptions, seeds: np.ndarray, kind) -> Started:
    """One start of the search: an annealed scout (``kind`` "annealed": a tempered SMC run of
    ``scout_particles`` from the latent urn, whose best allocation marks a basin it reached), a drawn
    one ("drawn": one draw from the urn) or a given allocation's token configurations (an array: a
    VB fit rounded), and a posterior chain of :func:`chain_sweeps` sweeps from there to run
    (``augmented_sweeps`` times as many where ``problem.cells`` is given): the way from a mode, or
    from an urn draw, into the posterior's bulk."""
    scout_tp = problem.scout_tp
    if isinstance(kind, np.ndarray):
        config, value = kind, np.nan
    elif kind == "annealed":
        particles = NumbaParticles(scout_tp, options.scout_particles, seeds[:1], _Inline())
        result = _one_run(particles, scout_tp, np.random.default_rng(seeds[1]), PathOptions(options.rho))
        config, value = result.best_config, result.log_evidence
    else:
        particles = NumbaParticles(scout_tp, 1, seeds[:1], _Inline())
        particles.initialise()
        config, value = np.asarray(particles.config[0]).copy(), np.nan
    sweeps = chain_sweeps(options, problem.tp.token_cell.shape[0])
    sweeps *= 1 if problem.cells is None else ENGINE.augmented_sweeps
    return Started(start_chain(problem.tp, problem.cells, config, seeds[1]), value, config, sweeps)


def check_marks(problem: MixtureProblem, sweeps: int) -> np.ndarray:
    """The sweeps of a start's chain of ``sweeps`` after which :func:`scout` asks whether an earlier
    reference covers it: none, 1, 2, 4, … up to halfway, so that a chain that reaches a covered region
    stops within twice the sweeps it took; halfway only for data-augmentation chains (``problem.cells``),
    which cover nothing (:func:`scout`)."""
    half = sweeps // 2
    if problem.cells is not None or half == 0:
        return np.array([half])
    return np.append(0, np.unique(np.minimum(2 ** np.arange(int(np.log2(half)) + 2), half)))


def covered_by(problem: MixtureProblem, found: list[Scouted], config: np.ndarray) -> int:
    """Index in ``found`` of the reference that covers the state ``config`` best, −1 if none does. A
    reference q covers z when log Σ_g q(g(z)) over the label symmetries g lies between its ``floor`` and
    ``ceiling``, the least and the largest over the states its own chain visited: z is then as typical of
    q as that chain's states (a new draw from the same basin lands there with probability (n − 1)/(n + 1)
    for n recorded states), where a mode, which scores above them all, need not be in q's basin."""
    kept = [b for b, f in enumerate(found) if f.log_q is not None]
    if not kept:
        return -1
    sums = orbit_log_sums(problem.tp, np.stack([found[b].log_q for b in kept]), config[None], problem.symmetry)
    if sums is None:
        return -1
    score = sums[1][:, 0]
    margin = np.minimum(score - [found[b].floor for b in kept], [found[b].ceiling for b in kept] - score)
    return kept[int(np.argmax(margin))] if margin.max() >= 0.0 else -1


def still_climbing(problem: MixtureProblem, states: np.ndarray) -> bool:
    """Whether a chain still climbed while its ``states`` (in order) were recorded: the data's log-likelihood at
    the tables' posterior mean (:func:`~bam_ppl.infer.smc.references.mean_table_log_likelihood`) higher over the
    later half of them than over the earlier by more than two standard errors (the comparison of a chain's early
    and late means of Geweke 1992, one-sided: a chain that falls from a mode into a basin's bulk has arrived)."""
    values = np.array([mean_table_log_likelihood(problem.tp.token_cell, problem.host, state) for state in states])
    early, late = np.array_split(values, 2)
    spread = np.sqrt(early.var(ddof=1) / early.size + late.var(ddof=1) / late.size)
    return bool(late.mean() - early.mean() > 2.0 * spread)


def finish(problem: MixtureProblem, started: Started):
    """The second half of a start's chain, whose average is its reference
    (:func:`~bam_ppl.infer.smc.references.averaged_reference`), once more where the chain was still climbing
    (:func:`still_climbing`: a reference over its way up covers the basin it reaches poorly), and the
    reference's ``floor`` and ``ceiling``; as steps (:func:`~bam_ppl.infer.smc.references.drive`), a ``Scouted``."""
    half = started.sweeps - started.sweeps // 2
    reference = yield from averaged_reference_steps(started.chain, half)
    if still_climbing(problem, reference.states):
        reference = yield from averaged_reference_steps(started.chain, half)
        started = started._replace(sweeps=started.sweeps + half)
    # Data-augmentation chains cover nothing (:func:`scout`): their range is not needed.
    sums = None if problem.cells is not None else orbit_log_sums(problem.tp, reference.log_q, reference.states,
                                                                 problem.symmetry)
    if sums is None:
        return Scouted(reference.log_q, started.log_evidence, started.config, started.sweeps)
    return Scouted(reference.log_q, started.log_evidence, started.config, started.sweeps,
                   float(np.min(sums[1])), float(np.max(sums[1])))


def scout(problem: MixtureProblem, options: MixtureOptions, seeds: np.ndarray, kind, found: list[Scouted]):
    """One start of a run's search (:func:`start`) after the run's earlier ones, ``found``: its chain
    sweeps up to halfway, and stops as soon as an earlier reference covers its state
    (:func:`covered_by`, at :func:`check_marks`), adding its weight to that reference's; otherwise it
    finishes and builds a reference (:func:`finish`). A basin many starts reach is built once, and a
    start that lands in one costs the few sweeps that show it. Data-augmentation chains all finish: a
    product over tokens fits a dense cell's split of its tokens poorly, so its range of scores says
    nothing of which states lie in one basin. As
    steps (:func:`~bam_ppl.infer.smc.references.drive`), a ``Scouted``."""
    started, done = start(problem, options, seeds, kind), 0
    for mark in check_marks(problem, started.sweeps):
        yield started.chain, int(mark) - done
        done = int(mark)
        cover = -1 if problem.cells is not None else covered_by(problem, found, started.chain.config())
        if cover >= 0:
            return Scouted(None, started.log_evidence, started.config, done, covered_by=cover)
    return (yield from finish(problem, started))


def run_search(problem: MixtureProblem, options: MixtureOptions, seeds: np.ndarray, kinds: list):
    """One run's search as steps (:func:`~bam_ppl.infer.smc.references.drive`), start by start (:func:`scout`):
    ``kinds[i]`` with ``seeds[i]``. A start builds a reference only where no earlier one covers it, so a search keeps
    one reference per basin region it reaches: references of one basin score each other's particles nats apart over
    thousands of tokens, and a second one spreads the last reweighting without covering more (benchmarks/README.md)."""
    found = []
    for seed, kind in zip(seeds, kinds):
        found.append((yield from scout(problem, options, seed, kind, found)))
    return found


def vb_start_configs(prepared, tp: TemperedProblem, key, options: MixtureOptions) -> tuple[list, float]:
    """Token configurations of the :func:`vb_fits` best of ``vb_restarts`` random VB restarts (screened:
    :func:`~bam_ppl.infer.variational.vb.run`), the best run on to its optimum and then moved on by rounds of as
    many merge-and-birth moves as restarts while a round finds a higher ELBO
    (:func:`~bam_ppl.infer.variational.split_merge.improve`: coordinate ascent stops where one value covers two groups
    of the data, which no update of one factor leaves), each rounded to an allocation
    (:func:`~bam_ppl.infer.smc.references.configs_from_counts`): coordinate ascent climbs to basins that neither
    annealing nor chains from urn draws reach; and the best fit's ELBO, a lower bound on log p(X) (-inf without
    restarts)."""
    from ..variational import split_merge, vb

    if options.vb_restarts == 0:
        return [], -np.inf
    bound, data, layout = prepared
    with jax.enable_x64(True):
        problem = vb.build_problem(bound, data, layout)
        init_keys, move_keys = chain_keys(key, options.vb_restarts, 0, parts=2)
        result = vb.run(init_keys, problem, num_iters=ENGINE.vb_screen_iters, tol=vb.TOL,
                        # the numba kernel: XLA would compile the step anew for every data shape
                        engine="numba")
        best = np.argsort(-np.asarray(result.elbo), kind="stable")[:vb_fits(options)]
        fits = result.alpha_hat[best]
        fits[0], elbo = split_merge.improve(split_merge.move_problem(bound, data, layout, problem), fits[0],
                                            np.random.default_rng(np.asarray(move_keys[0], np.uint32)),
                                            options.vb_restarts, split_merge.SCREEN_ITERS)
    return ([configs_from_counts(tp, kernel_counts(tp, alpha_hat - bound.flat_concentration, bound.column_of))
             for alpha_hat in fits], elbo)


def search_kinds(vb_configs: list, options: MixtureOptions) -> list:
    """The starts of one run's search (:func:`run_search`): the allocations of its VB fits
    ``vb_configs``, then ``num_scouts`` annealed and as many drawn scouts. The kinds find different
    basins: VB's coordinate ascent climbs to optima that sampling rarely visits on real data,
    annealing carries a scout across the allocations of sparse tables, a chain from a draw mixes
    between groupings of the cells of dense ones."""
    return list(vb_configs) + ["annealed", "drawn"] * options.num_scouts


def run_mixture(problem: MixtureProblem, options: MixtureOptions, seeds: np.ndarray, pool,
                start: MixtureStart, num_particles: int, call: Callable[[], CallStart] | None = None) -> MixtureRun:
    """One run (``seeds`` (NUM_BLOCKS + 1, 2)): the tempered SMC of ``num_particles`` particles from the
    mixture ``start`` of its search's references, reweighted at the end by its own start or by the call's,
    which ``call()`` returns once every run's search has ended (module docstring)."""
    tp = problem.tp
    particles = MixtureParticles(tp, num_particles, seeds[:NUM_BLOCKS], pool, start, problem.cells)
    changes = []

    def last_weights(ps):
        config = np.asarray(ps.config)
        if call is None:
            return mixture_log_weights(tp, ps.start, problem.symmetry, config, ps.component)
        whole = call()
        weights = mixture_log_weights(tp, whole.start, problem.symmetry, config, whole.first + ps.component,
                                      whole.run_of)
        if weights is None:
            return None
        changes.append(weights[1])
        return weights[0]

    # The run's problem carries the reference of particle 0's component (the first that kept particles): the
    # closed-form log start that _one_run checks particle 0 against is that component's.
    run = _one_run(particles, with_reference(tp, particles.start.log_q[0]), np.random.default_rng(seeds[NUM_BLOCKS]),
                   PathOptions(options.rho, follow_moves=True), initial_log_w=particles.initial_log_weights(),
                   final_log_weights=last_weights)
    shares = np.full(start.log_weights.size, np.nan)
    if run.final_log_w is not None:
        shares[:] = 0.0
        shares[particles.kept] = np.bincount(particles.component, np.exp(run.final_log_w), particles.sizes.size)
    value = run.log_evidence + run.log_relabelled
    if not changes:
        return MixtureRun(value, run, particles.split_moves, shares)
    return MixtureRun(value, run, particles.split_moves, shares, changes[0])


@dataclass(frozen=True)
class EngineConfig:
    """The numbers of the engine (one line of why each); ``effort`` scales the scouts (so the particles), the
    chains' least sweeps and budgets, the VB restarts and the temperatures (``effort_sizes``)."""

    # Particles of each run per start of the call (all runs' searches), a pair for each component of the start:
    # the rest of the annealing's work goes into temperatures (rho), which the moves can follow ...
    particles_per_reference: int = 2
    # ... and at least this many where the search's budget allows few starts (16 000 tokens and more), on the same
    # split: the runs' spread is the stated error, and a few particles spread wider.
    min_particles: int = 32
    # Starts of each kind per call (VB fits, annealed and drawn scouts), shared out among the runs: how many basins
    # the searches can find. The kinds reach different basins (on ICEWS the VB fits reach the best one most often),
    # so each gets a third of about the chains that two kinds of 32 had ...
    num_scouts: int = 20
    # ... as long as their chains draw at most this many random numbers together (20 of each kind up to 8000 tokens
    # of collapsed chains, two of each per run at 16 000): a smaller search misses basins (benchmarks/README.md).
    search_draws: int = 3_276_800_000
    # A chain's length per token (counts drift a token at a time): with 0.2 T the whole engine spreads four times wider
    # at 4000 tokens, and at 16 000 a reference's value still rises past 0.8 T (benchmarks/README.md). Its length,
    sweeps_per_token: float = 0.8
    # at least this many sweeps, so that q averages over many states on small tables,
    reference_sweeps: int = 200
    # and at most this many token moves: a chain's cost stays bounded at any number of tokens.
    chain_token_moves: int = 204_800_000
    # Sweeps of a data-augmentation chain (a cell at a time) for each the collapsed chain would run: it mixes more
    # slowly per sweep (Liu, Wong & Kong 1994), and runs where that many sweeps still draw fewer random numbers.
    augmented_sweeps: int = 4
    # Random VB restarts per call (shared out among the runs), screened; cheap on the numba kernel (no compile per shape).
    vb_restarts: int = 100
    # Iterations after which the VB restarts are screened (where a restart ends up is settled early).
    vb_screen_iters: int = 200
    # Particles per annealed scout, not scaled: a scout need only reach a basin, not weigh it.
    scout_particles: int = 4
    # Runs, each with a search of its own: the searches' spread is the stated error (estimate.pool_searches).
    num_chains: int = 4
    # Conditional-ESS fraction kept from one temperature to the next (Zhou, Johansen & Aston 2016), a step's χ²
    # 1/rho − 1 ≈ 1/130: where the moves mix, particles and temperatures buy the same variance for their cost, and
    # where the particles lag behind π_β only finer steps help (benchmarks/README.md); finer still where a move
    # leaves them correlated with where the last reweighting put them (tempered.following_moves).
    rho: float = 0.9923


ENGINE = EngineConfig()


def effort_sizes(effort: float, config: EngineConfig | None = None) -> MixtureOptions:
    """The sizes of a call at ``effort`` under ``config`` (default :data:`ENGINE`): the starts (scouts and VB
    restarts), so the particles, and the chains' least sweeps and budgets grow with it (never below one, 16
    particles and 10 sweeps), and each step's conditional χ² (1/rho − 1) shrinks as 1/effort², so that the
    temperatures grow about as effort: the annealing's work, particles times temperatures, grows as effort²,
    half of it on a finer path, which the moves can follow where more particles alone would not
    (benchmarks/README.md, the cost knob)."""
    config = config or ENGINE

    def grow(size, least=1):
        return max(least, int(round(size * effort)))

    return MixtureOptions(None, config.particles_per_reference, grow(config.min_particles, 16),
                          grow(config.num_scouts), grow(config.search_draws), config.scout_particles,
                          grow(config.reference_sweeps, 10), config.sweeps_per_token, grow(config.chain_token_moves),
                          # ρ / (ρ + (1 − ρ) / effort²) = 1 / (1 + (1/ρ − 1) / effort²), and ρ itself at effort 1
                          config.rho / (config.rho + (1.0 - config.rho) / effort ** 2), grow(config.vb_restarts))


def _options(effort, num_particles, num_scouts, rho, reference_sweeps, vb_restarts) -> MixtureOptions:
    """The sizes of a run from the options given, checked before any work: a number given is used as
    it is (``reference_sweeps`` then fixes every chain's length)."""
    check_positive(effort, "effort")
    sizes = effort_sizes(float(effort))
    if num_particles is not None:
        sizes = sizes._replace(num_particles=check_int(num_particles, "num_particles", minimum=2))
    if num_scouts is not None:
        sizes = sizes._replace(num_scouts=check_int(num_scouts, "num_scouts", minimum=1), search_draws=None)
    if reference_sweeps is not None:
        sweeps = check_int(reference_sweeps, "reference_sweeps", minimum=0)
        sizes = sizes._replace(reference_sweeps=sweeps, sweeps_per_token=0.0, chain_token_moves=np.iinfo(np.int64).max)
    if vb_restarts is not None:
        sizes = sizes._replace(vb_restarts=check_int(vb_restarts, "vb_restarts", minimum=0))
    if rho is None:
        return sizes
    check_positive(rho, "rho", upper=1.0)
    if rho >= 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho}")
    return sizes._replace(rho=float(rho))


def check_options(options: dict) -> None:
    """The engine's options in ``options`` (those given, by name) checked as :func:`mixture_log_evidence`
    checks them, before any work: for ``method="auto"``, which may enumerate instead."""
    _options(options.get("effort", 1.0), options.get("num_particles"), options.get("num_scouts"),
             options.get("rho"), options.get("reference_sweeps"), options.get("vb_restarts"))
    if "num_chains" in options:
        check_int(options["num_chains"], "num_chains", minimum=1)
    if "max_configs" in options:
        check_int(options["max_configs"], "max_configs", minimum=1)
    if "progress_bar" in options:
        resolve_progress(options["progress_bar"])


def mixture_problem(model, data, max_configs: int) -> tuple[MixtureProblem, tuple]:
    """The :class:`MixtureProblem` of ``data`` under ``model``, and the prepared (bound, data, layout)."""
    from ..variational import vb

    data, bound, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="the tempered SMC")
    tp = build_tempered_problem(bound, data, layout)
    with jax.enable_x64(True):
        cells = host_problem(vb.build_problem(bound, data, layout))
    return (MixtureProblem(tp, build_tempered_problem(bound, data, layout, max(1.0, 1.0 / bound.a)),
                           label_symmetries_of(bound, data, layout), cells,
                           augmented_chain_is_cheaper(cells, ENGINE.augmented_sweeps)),
            (bound, data, layout))


def defended_start(found: list[Scouted], tp: TemperedProblem, more: tuple = ()) -> MixtureStart:
    """The mixture of the search's references, each weighted by the starts it carries (its own and
    those it covers, :func:`scout`), and, as one more component of one start's weight, the
    uniform distribution over every cell's configurations: a defensive component (Hesterberg 1995)
    that covers what no reference does, so that the importance weights stay bounded. Further searches
    ``more`` (other runs') add their references alike."""
    log_q, weights = [], []
    for own in (found, *more):
        carried = np.bincount([i if f.log_q is not None else f.covered_by for i, f in enumerate(own)],
                              minlength=len(own))
        kept = [i for i, f in enumerate(own) if f.log_q is not None]
        log_q += [own[i].log_q for i in kept]
        weights += carried[kept].tolist()
    weights = np.array(weights + [1.0])
    return MixtureStart(np.ascontiguousarray(np.stack(log_q + [uniform_reference(tp)]), np.float64),
                        np.log(weights / weights.sum()))


@register_evidence("mixture", models=(AllocationModel,))
def mixture_log_evidence(model, data, *, rng_key=0, effort: float = 1.0, num_chains: int = ENGINE.num_chains,
                         num_particles: int | None = None, num_scouts: int | None = None, rho: float | None = None,
                         reference_sweeps: int | None = None, vb_restarts: int | None = None,
                         progress_bar: bool | None = None, max_configs: int = DEFAULT_MAX_CONFIGS) -> EvidenceEstimate:
    """Tempered SMC estimate of log p(X) from a mixture of references (module docstring).

    Each of ``num_chains`` runs has a search of its own (:func:`run_search`), which builds a reference
    around each basin its scouts and VB fits find, and anneals particles from their mixture to the
    posterior, reweighted at the end by every run's (:func:`run_mixture`); the runs are pooled by
    log-mean-exp, with the searches as the units of the stated error (:func:`~bam_ppl.estimate.pool_searches`).

    Parameters
    ----------
    effort : float > 0
        Scales the call's starts of each kind (20 · effort VB fits, annealed and drawn scouts; fewer where their
        chains would draw more than 3.3 billion · effort random numbers), so the particles (2 per start of the
        call's searches, at least 32 · effort), each chain's least sweeps (200 · effort; 0.8 T where more, at
        most 205 million · effort token moves), the VB restarts (100 · effort) and the temperatures (each
        step's conditional χ², 1/rho − 1, divided by effort²; ``rho`` 0.9923 at effort 1), unless given one by
        one (:class:`EngineConfig`): the annealing's work grows as effort², a call's time between effort and
        effort² times the default's (benchmarks/README.md).
    num_particles : int, optional
        Particles of each run.
    num_scouts : int, optional
        Starts of each kind (VB fits, annealed and drawn scouts) in the call, whatever their chains cost,
        shared out among the runs (rounded up: at least one scout of each kind per run).
    num_chains : int
        Runs, each with a search of its own (≥ 2 for a standard error).
    rho : float in (0, 1), optional
        Conditional-ESS fraction kept between consecutive temperatures (Zhou, Johansen & Aston 2016); by
        default that of ``effort``.
    reference_sweeps : int, optional
        Posterior sweeps of each reference's chain (the last half average into its reference; a
        data-augmentation chain, ``info.chain == "augmented"``, runs ``EngineConfig.augmented_sweeps`` times as many).
    vb_restarts : int, optional
        Random VB restarts in the call, shared out among the runs; the best of each run's (as many as
        its scouts of each kind) start references (0: none).

    The sure ``lower_bound`` is the largest log π(S) visited (allocation: ``details["best_cells"]``,
    ``details["best_counts"]``), ``details["vb_bound"]`` the best VB ELBO, a second sure bound
    (``bam.log_evidence`` warns of an estimate well below either); ``details["search_log_evidence"]`` each run
    reweighted by its own search's start alone; ``info`` (:class:`~bam_ppl.infer.info.MixtureInfo`): temperatures,
    scouts, chain sweeps, settings.
    """
    num_runs = check_int(num_chains, "num_chains", minimum=1)
    options = _options(effort, num_particles, num_scouts, rho, reference_sweeps, vb_restarts)
    check_int(max_configs, "max_configs", minimum=1)
    resolve_progress(progress_bar)  # validates
    if numba is None:
        raise ImportError("method='mixture' builds its references with the numba kernel: pip install numba")
    began, key = time.perf_counter(), as_key(rng_key)
    problem, (bound, data, layout) = mixture_problem(model, data, max_configs)
    plan = call_plan(problem, options, key, num_runs, data.total)
    show = resolve_progress(progress_bar, long_run=num_runs > 1 and data.total * options.min_particles > 2_000_000)
    bar = make_bar(num_runs, "tempered SMC from a mixture", show, unit="run")
    try:
        runs, found, vb_bound = searched_runs(problem, plan, (bound, data, layout), bar)
    finally:
        bar.close()
    return _estimate(runs, found, vb_bound, problem, plan.share, (bound, data, layout), began, effort)


class CallPlan(NamedTuple):
    """The sizes and streams of one call's runs: ``share`` each run's sizes (``run_share``), ``seeds``
    every stream (``call_seeds``) and ``num_particles`` each run's particles (``call_particles``)."""

    share: MixtureOptions
    seeds: CallSeeds
    num_particles: int


def call_plan(problem: MixtureProblem, options: MixtureOptions, key, num_runs: int, num_tokens: int) -> CallPlan:
    """The plan of a call of ``num_runs`` runs with the sizes ``options`` on ``problem``, a table of
    ``num_tokens`` tokens (its scouts within the search's budget, :func:`scouts_per_kind`)."""
    options = options._replace(num_scouts=scouts_per_kind(options, num_tokens, sweep_draws(problem)),
                               search_draws=None)
    share = run_share(options, num_runs)
    starts = run_starts(share)
    with jax.enable_x64(True):
        seeds = call_seeds(key, num_runs, starts)
    return CallPlan(share, seeds, call_particles(share, num_runs * starts))


def searched_group(problem: MixtureProblem, plan: CallPlan, prepared, group: list) -> list[tuple[list[Scouted], float]]:
    """The searches of runs ``group`` (one or two) of a call, their VB fits included (:func:`run_search_of`; two in
    one thread, their chains swept together where they can be: :func:`~bam_ppl.infer.smc.references.drive_pair`);
    for each run, what its search found and its best ELBO."""
    steps = [run_search_of(problem, plan, prepared, r) for r in group]
    return drive_pair(*steps) if len(steps) == 2 else [drive(steps[0])]


def run_search_of(problem: MixtureProblem, plan: CallPlan, prepared, r: int):
    """Run ``r``'s search as steps (:func:`~bam_ppl.infer.smc.references.drive`): its VB fits
    (``vb_start_configs``), then its starts' chains (:func:`run_search`); what it found, its best ELBO."""
    configs, elbo = vb_start_configs(prepared, problem.tp, plan.seeds.vb[r], plan.share)
    return (yield from run_search(problem, plan.share, plan.seeds.starts[r], search_kinds(configs, plan.share))), elbo


def searched_runs(problem: MixtureProblem, plan: CallPlan, prepared, bar
                  ) -> tuple[list[MixtureRun], list[list[Scouted]], float]:
    """The call's runs: every run's search (:func:`searched_group`: one or, with twice as many runs as cores, two to
    a thread, their chains swept together), then each run's annealing from its own start as soon as its search ends,
    reweighted by the call's start once every search has (:class:`~bam_ppl.infer.smc.mixture_start.PendingCallStarts`,
    :func:`run_mixture`), its particle blocks in its thread (over a pool where there are fewer runs than cores; their
    streams make the result the same on any number of cores and in any order); the runs, what each search found and
    the best ELBO."""
    cores = usable_cores()
    num_runs = plan.seeds.runs.shape[0]
    size = 2 if num_runs >= 2 * cores else 1
    groups = [list(range(num_runs))[first:first + size] for first in range(0, num_runs, size)]
    found, elbos, runs = [None] * num_runs, [None] * num_runs, [None] * num_runs
    calls = PendingCallStarts(num_runs, plan.num_particles)
    # The annealings' threads beside the searches': one that waits for the call's start holds no core, the cores
    # stay busy until the last search ends, and at most as many runs hold their particles at once as there are cores.
    with ThreadPoolExecutor(max_workers=cores) as pool, ThreadPoolExecutor(max_workers=cores) as annealing, \
            ThreadPoolExecutor(max_workers=cores) as blocks:
        block_pool = _Inline() if num_runs >= cores else blocks
        searches = {pool.submit(searched_group, problem, plan, prepared, group): group for group in groups}
        try:
            for done in as_completed(searches):
                for r, (own, elbo) in zip(searches[done], done.result()):
                    found[r], elbos[r] = own, elbo
                    start = defended_start(own, problem.tp)
                    calls.add(r, start)
                    runs[r] = annealing.submit(run_mixture, problem, plan.share, plan.seeds.runs[r], block_pool,
                                               start, plan.num_particles, calls.waiter(r) if num_runs > 1 else None)
        finally:
            calls.fail()  # releases the annealings' waits should a search have raised
        for _ in as_completed([run for run in runs if run is not None]):
            bar.update(1)
    return [run.result() for run in runs], found, max(elbos)


def _estimate(runs, found: list[list[Scouted]], vb_bound: float, problem: MixtureProblem, options: MixtureOptions, prepared,
              began: float, effort) -> EvidenceEstimate:
    """The :class:`~bam_ppl.estimate.EvidenceEstimate` of the runs, built at the boundary."""
    bound, data, layout = prepared
    values = np.array([run.log_evidence for run in runs])
    summed = not np.isnan(values).any()
    if not summed:
        warnings.warn(f"tempered SMC from a mixture: the sum over the relabellings of the latent labels has too many "
                      f"terms of similar size to add up; the estimate counts none of them and may fall short of "
                      f"log p(X) by up to {problem.symmetry.log_order:.1f} nats", EvidenceWarning, stacklevel=3)
        values = np.array([run.run.log_evidence for run in runs])
    pooled_by_search = summed and len(runs) > 1
    weights, shares = [run.run.final_log_w for run in runs], [run.search_log_shares for run in runs]
    value, stderr = pool_searches(values, weights, shares) if pooled_by_search else pooled(values)
    single = single_search_share(values, weights, shares) if pooled_by_search else np.nan
    alone = [run.alone(r) if pooled_by_search else run.log_evidence for r, run in enumerate(runs)]
    best = max(runs, key=lambda run: run.run.lower_bound).run
    cells, counts = best_allocation(bound, data, layout, problem.tp, best.best_config)
    lower_bound = float(bound.log_prob_cells(cells, counts))
    seconds = time.perf_counter() - began
    return EvidenceEstimate(
        value=value, stderr=stderr, method="mixture", kind="estimate", lower_bound=lower_bound,
        run_values=tuple(values.tolist()), seconds=seconds,
        details=dict(run_log_evidence=values.tolist(), lower_bound=lower_bound, best_cells=cells, best_counts=counts,
                     vb_bound=vb_bound, seconds=seconds, search_log_evidence=alone, single_search_share=single),
        info=MixtureInfo(num_temperatures=[run.run.schedule.size for run in runs],
                         scout_log_evidence=[[f.log_evidence for f in own] for own in found],
                         chain_sweeps=[[f.sweeps for f in own] for own in found],
                         num_particles=call_particles(options, sum(map(len, found))),
                         num_scouts=options.num_scouts * len(runs), num_runs=len(runs), effort=float(effort),
                         chain="collapsed" if problem.cells is None else "augmented",
                         split_move_acceptance=_acceptance(sum(run.split_moves for run in runs)),
                         num_references=[sum(f.log_q is not None for f in own) for own in found],
                         component_shares=[np.round(run.component_shares, 6).tolist() for run in runs],
                         final_ess=[float("nan") if run.run.final_log_w is None
                                    else float(effective_sample_size(run.run.final_log_w)) for run in runs],
                         single_search_share=single))


def _acceptance(moves: np.ndarray) -> tuple:
    """Accepted share of each kind of cell move (nan where none was proposed)."""
    return tuple(float(accepted / proposed) if proposed else float("nan") for proposed, accepted in moves)
