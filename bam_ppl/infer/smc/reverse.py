"""A stochastic upper bound on the log evidence by reverse annealing: bidirectional Monte Carlo.

Grosse, Ghahramani & Adams (2015), "Sandwiching the marginal likelihood using bidirectional Monte
Carlo" (arXiv:1511.02543), reverse AIS. Annealed importance sampling (Neal 2001) runs a chain
through targets f_0, …, f_K from a normalised start to the unnormalised posterior
f_K(z) ∝ p(z | X), and its weight has expectation Z_K / Z_0. Run backwards — from an *exact* draw of the posterior,
through f_K, …, f_0, each move leaving the next target invariant — the weight

    w = Π_{k=1..K} f_{k−1}(z_k) / f_k(z_k)            (Grosse et al. 2015, the reverse AIS weight)

has expectation Z_0 / Z_K. On data simulated from the model, the allocation that generated X is
such a draw. R reverse runs give 1/Ẑ_up = mean_r w_r / Z_0 with E[1/Ẑ_up] = 1/p(X), so that
log Ẑ_up is a stochastic upper bound (by Markov's inequality, P[log Ẑ_up < log p(X) − b] ≤ e^(−b)),
while the forward estimators' log Ẑ is a stochastic lower bound: the two sandwich log p(X), and
the width of the sandwich bounds the error of both where no enumeration exists.

The path is the one of the tempered SMC from the latent urn (:mod:`bam_ppl.infer.smc.tempered`):
f_β(z) = start(z)^(1−β) (π₀(z) L(z))^β, with π₀ the latent urn (or the flatter urn of
``start_a``) whose normaliser is known, and the same collapsed-Gibbs sweeps as moves.
"""

from __future__ import annotations

import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import jax
import numpy as np

from ...data import CountTensor
from ...estimate import EvidenceEstimate, EvidenceWarning, below_bound, pool_runs
from ...models.allocation import DEFAULT_MAX_CONFIGS, BoundModel, CellLayout
from ...types import as_key
from ...validation import check_choice, check_int, check_positive
from ..gibbs.collapsed import KERNELS, resolve_kernel
from ..info import UpperBoundInfo
from ..prepare import configs_of_allocation, prepare
from . import mixture
from .mixture import ENGINE, mixture_problem
from .mixture_start import MixtureParticles, MixtureStart
from .references import Reference, drive, references_from_allocations, with_reference
from .symmetry import label_symmetries_of
from .tempered import NUM_BLOCKS, log_target_ratio, usable_cores
from .tempered_jax import JaxParticles
from .tempered_numba import NumbaParticles, kernel_tables
from .tempered_problem import TemperedProblem, build_tempered_problem

# β_k = 1 − (1 − k / K)^SCHEDULE_POWER crowds the temperatures near β = 1, where the reverse runs
# lose most of their weight: on NMF(4) it gave tighter bounds than linear or (k / K)^p at equal K.
SCHEDULE_POWER = 2
# Default temperatures per token, and at least MIN_TEMPERATURES: the reverse path's bias falls as
# 1/K and grows with the path's length, which grows with T.
TEMPERATURES_PER_TOKEN = 1.0
MIN_TEMPERATURES = 200
# A relabelling move wherever 1 − β has grown by this factor since the last: the move draws labels with
# probability ∝ q(h(z))^(1−β), so it tracks their law to 5 % in the exponent; a run in labels q does not cover
# loses weight at every step until it moves (evenly spaced moves left NMF(4) bounds 2–3 nats loose).
RELABEL_GROWTH = 1.05


class ReverseRuns(NamedTuple):
    """Output of :func:`reverse_anneal`: ``log_weights`` (R,) the log of each run's reverse weight
    w_r, ``schedule`` (K + 1,) the temperatures from 0 to 1 (run from 1 down to 0)."""

    log_weights: np.ndarray
    schedule: np.ndarray


def fixed_schedule(num_temperatures: int) -> np.ndarray:
    """(K + 1,) temperatures β_k = 1 − (1 − k / K)^SCHEDULE_POWER, k = 0..K, from 0 to 1."""
    return 1.0 - (1.0 - np.arange(num_temperatures + 1) / num_temperatures) ** SCHEDULE_POWER


def relabelling_log_q(config: np.ndarray, token_cell: np.ndarray, log_q: np.ndarray,
                      relabellings: np.ndarray) -> np.ndarray:
    """log q_b(h(z)) (B, G) of the token configurations ``config`` (T,) under every reference b of ``log_q``
    (B, U, L) and every relabelling h of ``relabellings`` (G, L): Σ_(u, l) S[u, l] log q_b[u, h(l)], S the
    allocation's counts per nonzero cell and configuration."""
    num_cells, num_configs = log_q.shape[1:]
    groups = np.bincount(token_cell * num_configs + config, minlength=num_cells * num_configs)
    scores = np.einsum("ul,bum->blm", groups.reshape(num_cells, num_configs), log_q)  # [b, l, l']
    return scores[:, np.arange(num_configs)[None, :], relabellings].sum(-1)


def relabel_move(particles, tp, relabellings: np.ndarray, beta: float, rng: np.random.Generator) -> None:
    """Move every particle to a relabelling h(z) of its allocation, h drawn among the label
    symmetries ``relabellings`` (G, L) with probability ∝ q(h(z))^(1−β), q the reference.

    p(X, z) is the same at every h(z), so this is a Gibbs move on z's orbit under the group and
    leaves q^(1−β) (π₀ L)^β invariant. It lets a run that left the posterior in the generating
    allocation's labelling reach the copy of the posterior that q covers; single-token moves
    cannot swap labels.
    """
    config = np.asarray(particles.config)
    moved, new = False, config.copy()
    for p in range(config.shape[0]):
        logits = (1.0 - beta) * relabelling_log_q(config[p], tp.token_cell, tp.log_reference[None], relabellings)[0]
        probabilities = np.exp(logits - logits.max())
        h = rng.choice(relabellings.shape[0], p=probabilities / probabilities.sum())
        if h != 0:  # the identity is first
            new[p], moved = relabellings[h][config[p]], True
    if moved:
        particles.set_configs(new)


class MixtureRuns(MixtureParticles):
    """Reverse runs on the path from a mixture start Σ_b w_b q_b (:mod:`~bam_ppl.infer.smc.mixture`): the
    extended targets w_b q_b(z)^(1−β) (π₀ L)(z)^β, whose normaliser is 1 at β = 0 and p(X) at β = 1. Each run
    carries a component b, which :func:`component_move` redraws; the runs are kept sorted by component, a
    contiguous range each, as the moves need, and every component stays open to every run."""

    def __init__(self, tp: TemperedProblem, num_runs: int, keys, pool, start: MixtureStart):
        NumbaParticles.__init__(self, tp, num_runs, keys, pool)
        self.start, self.kept = start, np.ones(start.log_weights.size, bool)
        self.structures = [kernel_tables(with_reference(tp, log_q), True) for log_q in start.log_q]
        self.split_problem, self.split_pairs, self.num_moves = None, 0, 0
        self.split_moves = np.zeros((2, 2), np.int64)
        self.component = np.zeros(num_runs, np.int64)
        self.sizes = np.bincount(self.component, minlength=start.log_weights.size)

    def place(self, config: np.ndarray, component: np.ndarray) -> np.ndarray:
        """Put run r at the token configurations ``config[r]`` with component ``component[r]``; the runs are
        then sorted by component: returns the order (run i is the former run ``order[i]``)."""
        order = np.argsort(component, kind="stable")
        self.component = np.asarray(component, np.int64)[order]
        self.sizes = np.bincount(self.component, minlength=self.start.log_weights.size)
        self.set_configs(np.asarray(config)[order])
        token_cell = self.tp.token_cell
        self.log_start[:] = [self.start.log_q[b][token_cell, c].sum() for b, c in zip(self.component, self.config)]
        return order


def component_move(particles: MixtureRuns, relabellings: np.ndarray | None, beta: float,
                   rng: np.random.Generator) -> np.ndarray:
    """Redraw every run's component b and relabelling h jointly, with probability ∝ w_b q_b(h(z))^(1−β):
    p(X, z) is the same at every h(z), so this is a Gibbs move on (b, z's orbit) and leaves the extended
    target invariant (:class:`MixtureRuns`). At β = 1 it draws b from the weights alone; on the way down it
    carries a run to the component, and the labels, that cover where it is. ``relabellings`` None: the
    identity only. Returns the order of the runs after the move (:meth:`MixtureRuns.place`)."""
    config = np.asarray(particles.config).astype(np.int64)
    num_configs = particles.start.log_q.shape[2]
    relabellings = np.arange(num_configs)[None, :] if relabellings is None else relabellings
    new_config, new_component = config.copy(), np.empty(config.shape[0], np.int64)
    for p in range(config.shape[0]):
        scores = relabelling_log_q(config[p], particles.tp.token_cell, particles.start.log_q, relabellings)
        logits = (particles.start.log_weights[:, None] + (1.0 - beta) * scores).reshape(-1)
        probabilities = np.exp(logits - logits.max())
        b, h = divmod(int(rng.choice(logits.size, p=probabilities / probabilities.sum())), relabellings.shape[0])
        new_config[p], new_component[p] = relabellings[h][config[p]], b
    return particles.place(new_config, new_component)


def reverse_anneal(particles, tp, schedule: np.ndarray, num_sweeps: int, relabel=None) -> ReverseRuns:
    """Anneal every particle, placed at an exact posterior draw (``particles.set_configs``), from
    β = 1 down to 0 through the increasing ``schedule``; each particle is one independent run.

    A first move at β = 1 leaves the draws exact and takes the runs apart. Then for k = K..1 the
    weight gains log f_{k−1}(z) − log f_k(z) = (β_{k−1} − β_k) log(π₀ L / start)(z) (the reverse
    AIS weight) and the particles move by ``num_sweeps`` sweeps that leave f_{k−1} invariant
    (none at β = 0), and, given ``relabel(particles, β)`` (a move among the label symmetries, or the
    components of a mixture start, that returns the runs' new order or None), at the first step and
    wherever 1 − β has grown by RELABEL_GROWTH since the last such move.
    """
    particles.move(1.0, num_sweeps)
    log_weights = np.zeros(particles.num_particles)
    relabelled_at = 0.0  # 1 − β at the last relabelling move
    for upper, lower in zip(schedule[:0:-1], schedule[-2::-1]):
        log_weights += (lower - upper) * log_target_ratio(particles, tp)
        if lower > 0.0:
            particles.move(float(lower), num_sweeps)
            if relabel is not None and 1.0 - lower >= RELABEL_GROWTH * relabelled_at:
                relabelled_at = 1.0 - lower
                order = relabel(particles, float(lower))
                log_weights = log_weights if order is None else log_weights[order]
    return ReverseRuns(log_weights, np.asarray(schedule))


def reverse_upper_bounds(tp, configs: np.ndarray, schedule: np.ndarray, num_sweeps: int, kernel: str,
                         key, relabellings: np.ndarray | None = None, start: MixtureStart | None = None) -> np.ndarray:
    """log Z_0 − log w_r (R,) of one reverse run (:func:`reverse_anneal`) from each row of ``configs``
    (R, T), the token configurations of exact posterior draws, under the problem ``tp`` of
    :func:`~bam_ppl.infer.smc.tempered_problem.build_tempered_problem`: each is a stochastic upper bound
    on log p(X) whose exp(−value) has expectation 1/p(X). log Z_0 = C + log Z₀ is the forward
    sampler's start (the data constant and the start's normaliser; C alone from a reference or a mixture).
    ``kernel`` "numba" or "jax"; ``key`` an int or a JAX key; ``relabellings`` the label
    symmetries for :func:`relabel_move` on the path from a reference (None: no such moves); ``start`` a
    mixture of references to anneal back to instead (numba only; :class:`MixtureRuns`, whose components and
    labels :func:`component_move` redraws, first at β = 1)."""
    num_runs, key = configs.shape[0], as_key(key)
    pool = ThreadPoolExecutor(max_workers=usable_cores()) if kernel == "numba" else None
    try:
        with jax.enable_x64(True):
            seeds = np.asarray(jax.random.split(key, NUM_BLOCKS + 1)).astype(np.uint32)
            rng = np.random.default_rng(seeds[NUM_BLOCKS])
            if start is not None:
                particles = MixtureRuns(tp, num_runs, seeds[:NUM_BLOCKS], pool, start)
                particles.place(configs, np.zeros(num_runs, np.int64))
                component_move(particles, relabellings, 1.0, rng)  # the runs are exchangeable: their order is immaterial
                tp = with_reference(tp, start.log_q[0])  # the weights' form, log π₀ L − log q_b with each run's b
                relabel = lambda ps, beta: component_move(ps, relabellings, beta, rng)  # noqa: E731
            else:
                particles = NumbaParticles(tp, num_runs, seeds[:NUM_BLOCKS], pool) if kernel == "numba" else \
                    JaxParticles(tp, num_runs, key)
                particles.set_configs(configs)
                relabel = None if relabellings is None else \
                    (lambda ps, beta: relabel_move(ps, tp, relabellings, beta, rng))
            runs = reverse_anneal(particles, tp, schedule, num_sweeps, relabel)
    finally:
        if pool is not None:
            pool.shutdown()
    return tp.constant + tp.log_z0 - runs.log_weights


def _allocation_cells(bound, allocation) -> tuple[np.ndarray, np.ndarray]:
    """(cells (n, nodes), counts (n,)) of the nonzero entries of a dense allocation tensor S
    (axes ``bound.nodes``, as :meth:`AllocationModel.sample` returns it), or of an allocation
    already given as (cells, counts)."""
    if isinstance(allocation, tuple) and len(allocation) == 2:
        return allocation
    try:
        S = np.asarray(allocation)
    except (TypeError, ValueError):
        S = np.asarray(None)
    if S.dtype == object or not (np.issubdtype(S.dtype, np.integer) or np.issubdtype(S.dtype, np.floating)):
        raise TypeError("allocation must be the allocation tensor S of model.sample (integer counts, "
                        f"axes {bound.nodes}) or (cells, counts), got {type(allocation).__name__}")
    expected = tuple(bound.sizes[n] for n in bound.nodes)
    if S.shape != expected:
        raise ValueError(f"allocation must have shape {expected} (axes {bound.nodes}), got {S.shape}")
    if not np.all(np.isfinite(S)) or np.any(S < 0) or np.any(S != np.round(S)):
        raise ValueError("allocation must hold nonnegative integer counts")
    cells = np.argwhere(S > 0)
    return cells, S[tuple(cells.T)].astype(np.int64)


def _check_options(num_chains, num_temperatures, num_sweeps, engine, start_a, max_configs, reference,
                   reference_sweeps) -> None:
    check_int(num_chains, "num_chains", minimum=2)
    if num_temperatures is not None:
        check_int(num_temperatures, "num_temperatures", minimum=1)
    check_int(num_sweeps, "num_sweeps", minimum=1)
    if not isinstance(engine, str):
        raise TypeError(f"engine must be a string, got {type(engine).__name__}")
    check_choice(engine, "engine", KERNELS)
    if start_a is not None:
        check_positive(start_a, "start_a")
    check_int(max_configs, "max_configs", minimum=1)
    if isinstance(reference, str):
        check_choice(reference, "reference", ("search",))
        if engine == "jax":
            raise ValueError("reference='search' anneals back to a mixture of references on the numba kernel: "
                             "engine must be 'auto' or 'numba', got 'jax'")
    elif reference is not None and not isinstance(reference, Reference) and not (
            isinstance(reference, (tuple, list)) and len(reference) == 2):
        raise TypeError("reference must be 'search', an allocation (cells, counts) found without the generating "
                        "allocation (e.g. a forward estimate's best_cells, best_counts) or a Reference, got "
                        f"{type(reference).__name__}")
    if reference_sweeps is not None:
        check_int(reference_sweeps, "reference_sweeps", minimum=0)


def default_temperatures(num_tokens: int) -> int:
    """Temperatures when ``num_temperatures`` is not given: TEMPERATURES_PER_TOKEN × T, at least
    MIN_TEMPERATURES."""
    return max(MIN_TEMPERATURES, int(round(TEMPERATURES_PER_TOKEN * num_tokens)))


class _Path(NamedTuple):
    """The problem whose path the runs take back (``tp``, with its start), the label symmetries
    for :func:`relabel_move` or :func:`component_move` (None: none, or no reference) and the mixture
    ``start`` the runs anneal back to (None: ``tp``'s own start)."""

    tp: object
    relabellings: np.ndarray | None
    start: MixtureStart | None = None


class _Generated(NamedTuple):
    """X prepared for the model (:func:`~bam_ppl.infer.prepare.prepare`), the tempered problem on it
    (``tp``, the path back to the urn), and the generating allocation as nonzero full ``cells`` and
    ``counts`` and as the configuration of every token (``config``, (T,))."""

    data: CountTensor
    bound: BoundModel
    layout: CellLayout
    tp: TemperedProblem
    cells: np.ndarray
    counts: np.ndarray
    config: np.ndarray


def _generated(model, X, allocation, start_a, reference, max_configs) -> _Generated:
    """:class:`_Generated` of the call, with ``allocation`` and ``reference`` checked against X (a
    ValueError naming the one that does not fit) before any chain runs."""
    data, bound, layout, _ = prepare(model, X, max_configs=max_configs, algorithm="the reverse annealing")
    cells, counts = _allocation_cells(bound, allocation)
    start_scale = 1.0 if start_a is None or reference is not None else max(1.0, float(start_a) / bound.a)
    tp = build_tempered_problem(bound, data, layout, start_scale)
    config = configs_of_allocation(bound, data, layout, tp.token_cell, (cells, counts), "allocation")
    generated = _Generated(data, bound, layout, tp, cells, counts, config)
    _checked_reference(generated, reference)
    return generated


def _checked_reference(generated: _Generated, reference) -> None:
    """ValueError naming ``reference`` where it does not fit X (before any chain runs)."""
    data, tp = generated.data, generated.tp
    if isinstance(reference, Reference):
        shape = (data.nnz, tp.num_configs)
        if np.shape(reference.log_q) != shape or not np.all(np.isfinite(reference.log_q)):
            raise ValueError(f"reference: a Reference for these data and this model has a finite log_q of shape "
                             f"{shape}, got shape {np.shape(reference.log_q)}")
    elif reference is not None and not isinstance(reference, str):
        configs_of_allocation(generated.bound, data, generated.layout, tp.token_cell, tuple(reference), "reference")


def searched_start(problem: mixture.MixtureProblem, prepared, key, num_searches: int) -> MixtureStart:
    """The references of ``num_searches`` runs' searches of a default call keyed by ``key`` (each run's VB fits and
    search, :func:`~bam_ppl.infer.smc.mixture.run_search_of`) in one
    :func:`~bam_ppl.infer.smc.mixture.defended_start`, then each weighted by the share of the posterior's mass it
    carries at the end of a run from them (``MixtureRun.component_shares``), plus the share one particle carries (a
    component no particle ends in keeps a weight the run could not resolve from none): a start found from X alone
    whose weights follow the basins' masses, for the reverse annealing of :func:`evidence_upper_bound`, whose bound
    is tight where they do."""
    plan = mixture.call_plan(problem, mixture.effort_sizes(1.0), key, num_searches, problem.tp.token_cell.shape[0])
    cores = usable_cores()
    with ThreadPoolExecutor(max_workers=min(num_searches, cores)) as pool:
        first, *more = (found for found, _ in pool.map(
            lambda r: drive(mixture.run_search_of(problem, plan, prepared, r)), range(num_searches)))
    start = mixture.defended_start(first, problem.tp, tuple(more))
    with ThreadPoolExecutor(max_workers=cores) as blocks:
        run = mixture.run_mixture(problem, plan.share, plan.seeds.runs[0], blocks, start, plan.num_particles)
    if np.isnan(run.component_shares).any():  # the run could not sum over the label symmetries
        return start
    weights = run.component_shares + 1.0 / plan.num_particles
    return start._replace(log_weights=np.log(weights / weights.sum()))


def _reference_path(model, generated: _Generated, reference, reference_sweeps, max_configs, key) -> _Path:
    """The path back: the latent urn's (``reference`` None); from the reference q (built by a posterior chain
    from an allocation, or given); or from the mixture of the references of a default call's searches
    (``reference="search"``, :func:`searched_start`); and the label symmetries,
    enumerated, that the runs' relabelling moves draw from."""
    if reference is None:
        return _Path(generated.tp, None)
    data = generated.data
    symmetry = label_symmetries_of(generated.bound, data, generated.layout)
    relabellings = symmetry.relabellings if symmetry.swap is None and symmetry.relabellings.shape[0] > 1 else None
    if isinstance(reference, str):
        problem, prepared = mixture_problem(model, data, max_configs)
        return _Path(generated.tp, relabellings, searched_start(problem, prepared, key, ENGINE.num_chains))
    if not isinstance(reference, Reference):
        reference = references_from_allocations(model, data, [tuple(reference)], key, reference_sweeps, max_configs)[0]
    return _Path(with_reference(generated.tp, reference.log_q), relabellings)


def evidence_upper_bound(model, X, allocation, rng_key=0, *, num_chains: int = 16,
                         num_temperatures: int | None = None, num_sweeps: int = 1, engine: str = "auto",
                         start_a: float | None = 1.0, reference=None, reference_sweeps: int | None = None,
                         max_configs: int = DEFAULT_MAX_CONFIGS) -> EvidenceEstimate:
    """A stochastic upper bound on log p(X) by reverse annealing from the allocation that generated X.

    Bidirectional Monte Carlo (Grosse, Ghahramani & Adams 2015; the module's docstring): runs from
    the generating allocation, an exact posterior draw when X was drawn from ``model``, back along
    the tempered SMC's path (:func:`reverse_anneal`) give log Ẑ_up with E[1/Ẑ_up] = 1/p(X): a
    stochastic upper bound, which with a forward estimate (a stochastic lower bound) sandwiches log p(X).

    Parameters
    ----------
    model : AllocationModel
        The model X was simulated from.
    X : array-like or CountTensor
        The counts, the second output of ``model.sample``.
    allocation : array or (cells, counts)
        The allocation tensor S that generated X (the first output of ``model.sample``, axes in
        ``model.dag.nodes`` order), or its nonzero entries as full cells (n, nodes) and counts
        (n,). Its margins over the latent nodes must give X (ValueError otherwise).
    rng_key : int or JAX key
    num_chains : int
        Independent reverse runs (≥ 2): their spread gives the standard error.
    num_temperatures : int, optional
        K of the schedule :func:`fixed_schedule` (fixed: the weights stay unbiased); default T tokens, at least 200.
    num_sweeps, engine, start_a, reference_sweeps, max_configs
        As in :func:`~bam_ppl.infer.smc.tempered.run_tempered`: Gibbs sweeps per temperature; the
        kernels ({"auto", "numba", "jax"}); the start of the path without a reference; sweeps of the
        chain that builds q from an allocation; configurations enumerated per token.
    reference : "search", (cells, counts) or Reference, optional
        Anneal back to a start found from X alone instead, on the tempered SMC's short path from it:
        ``"search"``, the mixture of the references of a default call's searches (numba;
        :func:`searched_start`), whose components and labels the runs move among
        (:func:`component_move`): tight where a search reached S's basin (flat posteriors: None, 16–48 T temperatures). Or one
        product reference q, covering one basin, from an allocation found *without* ``allocation`` (a forward
        estimate's ``details["best_cells"], details["best_counts"]``; one built from S bounds only S's basin)
        or a ``Reference``; :func:`relabel_move` carries the runs to its labels (up to 8! symmetries; ``RELABEL_GROWTH``).

    Returns
    -------
    EvidenceEstimate
        ``kind="upper_bound"``, ``method="reverse"``; ``stderr`` the runs' spread given the one allocation
        (:func:`bam_ppl.estimate.pool_runs` on −log Ẑ_up); ``run_values`` each run's bound; ``lower_bound`` log p(X, S),
        a sure lower bound; ``info`` an :class:`~bam_ppl.infer.info.UpperBoundInfo`. An EvidenceWarning where the
        bound lies 3 stderr below log p(X, S): S is no draw of the posterior.
    """
    _check_options(num_chains, num_temperatures, num_sweeps, engine, start_a, max_configs, reference, reference_sweeps)
    run_key, reference_key = jax.random.split(as_key(rng_key))
    generated = _generated(model, X, allocation, start_a, reference, max_configs)
    engine = "numba" if reference == "search" else resolve_kernel(engine)
    start = time.perf_counter()
    path = _reference_path(model, generated, reference, reference_sweeps, max_configs, reference_key)
    schedule = fixed_schedule(num_temperatures or default_temperatures(generated.data.total))
    run_upper_bound = reverse_upper_bounds(path.tp, np.tile(generated.config, (num_chains, 1)), schedule, num_sweeps,
                                           engine, run_key, path.relabellings, path.start)
    info = UpperBoundInfo(run_upper_bound=run_upper_bound.tolist(), schedule=schedule.tolist(), kernel=engine,
                          num_temperatures=schedule.size - 1, num_sweeps=num_sweeps, referenced=reference is not None)
    lower_bound = float(generated.bound.log_prob_cells(generated.cells, generated.counts))
    return _upper_bound(info, lower_bound, time.perf_counter() - start)


def _upper_bound(info: UpperBoundInfo, lower_bound: float, seconds: float) -> EvidenceEstimate:
    """The pooled bound of the runs, with a warning where it lies below the allocation's own log
    p(X, S), a sure lower bound."""
    # pool_runs pools log(1/Ẑ_r), whose mean on the natural scale is unbiased for 1/p(X).
    run_upper_bound = np.asarray(info.run_upper_bound, np.float64)
    negated, stderr = pool_runs(-run_upper_bound)
    messages = ()
    if below_bound(-negated, stderr, lower_bound):
        messages = (f"the upper bound {-negated:.6g} ± {stderr:.3g} lies {lower_bound + negated:.4g} nats below "
                    f"log p(X, S) = {lower_bound:.6g} of the allocation: S is not a draw of this model's posterior "
                    "given X (X simulated from another model, or S not the allocation that generated it), and the "
                    "value bounds nothing",)
        warnings.warn(messages[0], EvidenceWarning, stacklevel=3)
    return EvidenceEstimate(
        value=-negated, stderr=stderr, method="reverse", kind="upper_bound", lower_bound=lower_bound,
        run_values=tuple(run_upper_bound.tolist()), seconds=seconds, warnings=messages,
        details=dict(lower_bound=lower_bound, seconds=seconds), info=info)
