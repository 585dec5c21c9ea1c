"""Tempered sequential Monte Carlo over token allocations (``method="tempered"``, and the annealing of the default).

Particles move from a start distribution (the Pólya-urn prior π₀, a flatter urn, or a product reference q around an
allocation) to the posterior π_β ∝ q^(1−β) (π₀ L)^β through adaptive temperatures (conditional ESS, Zhou, Johansen &
Aston 2016), with systematic resampling and collapsed-Gibbs sweeps that leave each π_β invariant (Del Moral, Doucet &
Jasra 2006); every visited allocation gives log π(S) (Cemgil et al. 2020, eq. 3.11), a sure lower bound. The
derivation, the starts and the label symmetries: docs/api_internals.rst, "Tempered SMC and reverse annealing".

This module holds the SMC loop (temperatures, weights, resampling) and :func:`run_tempered`; the problem's arrays
live in :mod:`~bam_ppl.infer.smc.tempered_problem`, the numba kernel in :mod:`~bam_ppl.infer.smc.tempered_numba`
and :mod:`~bam_ppl.infer.smc.tempered_sweeps`, the JAX kernel in :mod:`~bam_ppl.infer.smc.tempered_jax`, the
references in :mod:`~bam_ppl.infer.smc.references` and the symmetries in :mod:`~bam_ppl.infer.smc.symmetry`.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import NamedTuple

import jax
import numpy as np

from ...estimate import EvidenceEstimate, EvidenceWarning, pool_runs
from ...models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel
from ...progress import make_bar, resolve_progress
from ...types import as_key
from ...validation import check_choice, check_int, check_positive, renamed_options
from ..gibbs.collapsed import KERNELS, resolve_kernel
from ..info import TemperedInfo
from ..prepare import configs_of_allocation, prepare
from ..registry import register_evidence
from .references import (
    _checked_reference,
    _references_per_run,
    chain_references,
    default_reference_sweeps,
    with_reference,
)
from .symmetry import _log_sum_exp, label_symmetries_of, symmetric_log_weights
from .tempered_jax import JaxParticles
from .tempered_numba import NumbaParticles
from .tempered_problem import (
    TemperedProblem,
    best_allocation,
    build_tempered_problem,
    exact_log_start,
    exact_log_terms,
)

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
# The most of the last push that following_moves counts as kept: steps at most 4 times finer in χ², 2 times as many
# temperatures; where the moves keep more, finer steps buy little (without moves the path is importance sampling).
MAX_KEPT = 0.75


# -- the SMC sampler -------------------------------------------------------------------------------
def _normalise(log_w: np.ndarray) -> np.ndarray:
    return log_w - _log_sum_exp(log_w)


def conditional_ess(log_w_normalised: np.ndarray, log_like: np.ndarray, step: float) -> float:
    """Conditional ESS fraction (Σ W w)² / Σ W w² of the incremental weights w = L^step."""
    a = step * (log_like - np.max(log_like))
    first = _log_sum_exp(log_w_normalised + a)
    second = _log_sum_exp(log_w_normalised + 2.0 * a)
    return float(np.exp(2.0 * first - second))


def next_temperature(beta: float, log_w_normalised: np.ndarray, log_like: np.ndarray, rho: float) -> float:
    """The largest β' ≤ 1 (by bisection) whose conditional ESS fraction (``conditional_ess``) stays ≥ ``rho``."""
    # copies: a read-only array (the JAX kernel's) would be another type, so another compilation
    return _next_temperature(float(beta), np.array(log_w_normalised, np.float64), np.array(log_like, np.float64),
                             float(rho))


def _log_sum_exp_scaled(log_w, shifted, scale):
    """log Σ exp(log_w + scale · shifted), one pass for the peak and one for the sum."""
    peak = -np.inf
    for i in range(log_w.shape[0]):
        peak = max(peak, log_w[i] + scale * shifted[i])
    if not np.isfinite(peak):
        return peak
    total = 0.0
    for i in range(log_w.shape[0]):
        total += math.exp(log_w[i] + scale * shifted[i] - peak)
    return peak + math.log(total)


def _next_temperature(beta, log_w, log_like, rho):
    """:func:`next_temperature`, compiled where numba is: the bisection's 120 sums of P terms cost less
    than the NumPy calls they would take, which outweighed the moves of a few particles."""
    shifted = log_like - np.max(log_like)

    def ess(step):
        return math.exp(2.0 * _log_sum_exp_scaled(log_w, shifted, step) - _log_sum_exp_scaled(log_w, shifted, 2.0 * step))

    if ess(1.0 - beta) >= rho:
        return 1.0
    low, high = 0.0, 1.0 - beta
    for _ in range(BISECTION_STEPS):
        middle = 0.5 * (low + high)
        if ess(middle) >= rho:
            low = middle
        else:
            high = middle
    step = low if low > 0 else high
    return min(1.0, beta + step)


if numba is not None:
    _log_sum_exp_scaled = numba.njit(cache=True, inline="always")(_log_sum_exp_scaled)
    _next_temperature = numba.njit(cache=True)(_next_temperature)


def systematic_resample(rng: np.random.Generator, log_w_normalised: np.ndarray) -> np.ndarray:
    """Systematic resampling: ancestors of P equally weighted particles."""
    num = log_w_normalised.size
    cdf = np.cumsum(np.exp(log_w_normalised))
    cdf /= cdf[-1]
    positions = (rng.random() + np.arange(num)) / num
    return np.minimum(np.searchsorted(cdf, positions, side="right"), num - 1)


class TemperedState(NamedTuple):
    """A tempered SMC run between two temperatures (the shape of BlackJAX's tempered SMC state):
    the particles' normalised log weights, the temperature β and log Ẑ_β, the estimate so far of
    the log normalising constant of π_β (the particles themselves are moved in place)."""

    log_w: np.ndarray
    beta: float
    log_z: float


class TemperedStepInfo(NamedTuple):
    """One step: its temperature, the ESS after the reweighting, whether it resampled."""

    beta: float
    ess: float
    resampled: bool


def log_target_ratio(particles, tp: TemperedProblem) -> np.ndarray:
    """Per particle, log of π₀ L over the start distribution (log L when the start is π₀): the
    log incremental weight per unit of β."""
    if tp.tilted:
        return np.asarray(particles.log_prior) + np.asarray(particles.log_like) - np.asarray(particles.log_start)
    return np.asarray(particles.log_like)


def adaptive_temperature(rho: float):
    """The temperature solver that keeps the conditional ESS fraction at ``rho`` (:func:`next_temperature`)."""
    return lambda state, ratio: next_temperature(state.beta, state.log_w, ratio, rho)


def scheduled_temperature(schedule: np.ndarray):
    """The temperature solver of a fixed ``schedule`` (strictly increasing, ending at 1): the
    first temperature above the current one."""
    return lambda state, ratio: float(schedule[np.searchsorted(schedule, state.beta, side="right")])


def step(rng: np.random.Generator, state: TemperedState, particles, log_ratio, solve_temperature, move,
         resample=systematic_resample) -> tuple[TemperedState, TemperedStepInfo]:
    """One step of the tempered SMC: the next temperature ``solve_temperature(state, ratio)``, the
    reweighting by L^(β' − β) (``ratio = log_ratio(particles)``, the log weight per unit of β),
    resampling (``resample(rng, log_w)``, ancestors) when the ESS falls below ``RESAMPLE_ESS`` of the
    particles, then ``move(particles, β')``, a π_β'-invariant kernel, in place."""
    num = state.log_w.size
    ratio = log_ratio(particles)
    beta = solve_temperature(state, ratio)
    increment = (beta - state.beta) * ratio
    log_z = state.log_z + _log_sum_exp(state.log_w + increment)
    log_w = _normalise(state.log_w + increment)
    ess = float(1.0 / np.exp(_log_sum_exp(2.0 * log_w)))
    resampled = ess < RESAMPLE_ESS * num
    if resampled:
        particles.resample(resample(rng, log_w))
        log_w = np.full(num, -np.log(num))
    move(particles, beta)
    return TemperedState(log_w, beta, log_z), TemperedStepInfo(beta, ess, resampled)


class TemperedRun(NamedTuple):
    """One run: log evidence, schedule and diagnostics, the best allocation it visited."""

    log_evidence: float
    schedule: np.ndarray
    num_resamplings: int
    min_ess: float
    lower_bound: float
    best_config: np.ndarray
    degenerate_start: bool  # most draws from π₀ had the same likelihood
    log_relabelled: float  # log Σ_p W_p |G| w(z_p) to add for the label symmetries: 0 without; nan where not summed
    # Each particle's normalised share of the estimate at β = 1, the last reweighting included (None where not summed).
    final_log_w: np.ndarray | None = None


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
    same form; ``seconds`` the wall time.
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
    seconds: float
    reference_sweeps: int | None = None


class PathOptions(NamedTuple):
    """How a run travels from β = 0 to 1 (:func:`run_tempered`): the adaptive schedule's ``rho``
    or a fixed ``schedule``, and ``num_sweeps`` Gibbs sweeps per temperature; with ``follow_moves``
    the adaptive steps shrink where the moves keep the particles where the last reweighting put them
    (:func:`following_moves`)."""

    rho: float = 0.9
    num_sweeps: int = 1
    schedule: np.ndarray | None = None
    follow_moves: bool = False


def _centred(values: np.ndarray, groups) -> np.ndarray:
    """``values`` less the mean of their group (``groups`` (P,) integer labels, or None: one group)."""
    if groups is None:
        return values - values.mean()
    groups = np.asarray(groups)
    return values - (np.bincount(groups, values) / np.maximum(np.bincount(groups), 1))[groups]


def following_moves(path: PathOptions, log_ratio):
    """The temperature solver and the move of a path whose steps shrink where the moves keep the particles
    correlated with where the last reweighting put them: after each move, c, the correlation across particles
    (within a start's component) of the log weight per unit of β before and after it; the next step keeps the
    conditional χ² of its weights at (1/rho − 1)(1 − c): moves that leave a share c of each push leave the
    particles behind π_β by Σ_k c^k = 1 / (1 − c) pushes, so the pushes shrink by as much. c is taken at most
    ``MAX_KEPT``; without moves that keep anything (c = 0) the steps are those of ``rho``."""
    kept = [0.0]

    def solve(state, ratio):
        return next_temperature(state.beta, state.log_w, ratio, 1.0 / (1.0 + (1.0 / path.rho - 1.0) * (1.0 - kept[0])))

    def move(particles, beta):
        groups = getattr(particles, "component", None)
        before = _centred(log_ratio(particles), groups)
        particles.move(beta, path.num_sweeps)
        after = _centred(log_ratio(particles), groups)
        spread = float(np.std(before) * np.std(after))
        kept[0] = float(np.clip(np.mean(before * after) / spread, 0.0, MAX_KEPT)) if spread > 0.0 else 0.0

    return solve, move


def _one_run(particles, tp: TemperedProblem, rng: np.random.Generator, path: PathOptions, symmetry=None,
             initial_log_w=None, final_log_weights=None):
    """One tempered SMC run over ``particles`` (already allocated) along ``path``. ``initial_log_w``
    (P,) the normalised start weights (default equal); ``final_log_weights`` a function of the
    particles returning the log weights of the last reweighting (default: the label symmetries').
    ``tp``'s start must be particle 0's: its closed-form terms there fix every particle's offsets."""
    num = particles.num_particles
    particles.initialise()
    # Constant factors the rows leave out (equal for every allocation): fixed from one particle.
    exact_prior, exact_like = exact_log_terms(tp, particles.counts(0))
    exact_start = exact_log_start(tp, particles.counts(0), np.asarray(particles.config[0])) if tp.tilted else 0.0
    particles.add_offsets(exact_prior - float(np.asarray(particles.log_prior)[0]),
                          exact_like - float(np.asarray(particles.log_like)[0]),
                          exact_start - float(np.asarray(particles.log_start)[0]) if tp.tilted else 0.0)

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
    like = log_target_ratio(particles, tp)
    _, repeats = np.unique(np.round(like / max(1.0, float(np.abs(like).max())), 9), return_counts=True)
    degenerate = bool(tp.visible_numerators.size + tp.visible_denominators.size) and num > 1 and \
        repeats.max() > DEGENERATE_SHARE * num
    log_w = np.full(num, -np.log(num)) if initial_log_w is None else np.asarray(initial_log_w, np.float64)
    state = TemperedState(log_w, 0.0, tp.constant + tp.log_z0)
    solve = adaptive_temperature(path.rho) if path.schedule is None else scheduled_temperature(path.schedule)
    betas, resamplings, min_ess = [], 0, float(num)
    ratio = lambda ps: log_target_ratio(ps, tp)  # noqa: E731
    move = lambda ps, beta: ps.move(beta, path.num_sweeps)  # noqa: E731
    if path.follow_moves:
        solve, move = following_moves(path, ratio)
    while state.beta < 1.0:
        state, info = step(rng, state, particles, ratio, solve, move)
        betas.append(info.beta)
        min_ess = min(min_ess, info.ess)
        resamplings += info.resampled
        visit()
        if len(betas) >= MAX_TEMPERATURES:
            raise RuntimeError(f"tempered SMC: more than {MAX_TEMPERATURES} temperatures (rho={path.rho}); lower rho, or use "
                               "method='auto' for models with very small concentrations")
    log_w, log_z = state.log_w, state.log_z
    log_relabelled, final_log_w = 0.0, log_w
    if final_log_weights is not None or (symmetry is not None and symmetry.log_order > 0):
        weights = final_log_weights(particles) if final_log_weights is not None else \
            symmetric_log_weights(tp, np.asarray(particles.config), symmetry)
        log_relabelled = np.nan if weights is None else _log_sum_exp(log_w + weights)
        final_log_w = None if weights is None else log_w + weights - log_relabelled
    return TemperedRun(float(log_z), np.array(betas), resamplings, min_ess, best_value, best_config, degenerate,
                       float(log_relabelled), final_log_w)


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


def _path_options(rho, num_sweeps, schedule) -> PathOptions:
    """The :class:`PathOptions` of the options given, checked before any work."""
    check_positive(rho, "rho", upper=1.0)
    if rho >= 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho}")
    return PathOptions(float(rho), check_int(num_sweeps, "num_sweeps", minimum=1), _check_schedule(schedule))


def _check_options(num_particles, engine, progress_bar, max_configs, start_a=None, reference_sweeps=0) -> str:
    """Check the sizes and settings of a call before any work; the kernel ``engine`` names."""
    check_int(num_particles, "num_particles", minimum=2)
    if not isinstance(engine, str):
        raise TypeError(f"engine must be a string, got {type(engine).__name__}")
    check_choice(engine, "engine", KERNELS)
    resolve_progress(progress_bar)  # validates
    check_int(max_configs, "max_configs", minimum=1)
    if start_a is not None:
        check_positive(start_a, "start_a")
    if reference_sweeps is not None:
        check_int(reference_sweeps, "reference_sweeps", minimum=0)
    return resolve_kernel(engine)


def pooled(run_log_evidence) -> tuple[float, float]:
    """Log-mean-exp of the runs and a standard error from their spread
    (:func:`bam_ppl.estimate.pool_runs`); nan for one run."""
    value, stderr = pool_runs(np.asarray(run_log_evidence, np.float64))
    return float(value), float(stderr)


@renamed_options(num_runs="num_chains", kernel="engine")
def run_tempered(model, data, rng_key=0, *, num_particles: int = 256, num_chains: int = 4, rho: float = 0.9,
                 num_sweeps: int = 1, schedule=None, engine: str = "auto", progress_bar: bool | None = None,
                 max_configs: int = DEFAULT_MAX_CONFIGS, start_a: float | None = 1.0, reference=None,
                 reference_sweeps: int | None = None) -> TemperedResult:
    """Run ``num_chains`` independent tempered SMC samplers over the token allocations (the sampler,
    its schedules and starts: the docs/api_internals.rst).

    Parameters
    ----------
    model, data, rng_key
        The AllocationModel, its counts (array-like or CountTensor, missing entries allowed) and an int or JAX key.
    num_particles, num_chains : int
        Particles per run (≥ 2); independent runs (formerly ``num_runs``), pooled by log-mean-exp, whose
        spread gives ``stderr`` (a bias they share is not in it: raise the effort until the value stops rising).
    rho : float in (0, 1)
        Conditional-ESS fraction kept between consecutive temperatures: higher means more temperatures.
    num_sweeps : int
        Collapsed-Gibbs sweeps over all tokens per temperature.
    schedule : array, optional
        Fixed increasing temperatures in (0, 1] ending at 1 (e.g. a pilot run's ``schedules[0]``)
        instead of the adaptive ones (``rho`` is ignored): the estimator is then unbiased on the natural scale.
    engine : {"auto", "numba", "jax"}
        (Formerly ``kernel``.) The numba CPU kernel or the JAX kernel; "auto": numba on a CPU when installed.
    progress_bar : bool or None
        A tqdm bar over runs (None: only when there are several runs and many tokens).
    max_configs : int
        Largest number of joint free-node configurations enumerated per token.
    start_a : float, optional
        Start from the latent urn with concentrations scaled by max(1, start_a / a) (default 1: flatter
        than π₀ for small a); None: from π₀.
    reference : (cells, counts) or Reference or list of Reference, optional
        Start from a product q near the posterior's bulk, on a path whose length does not grow with T:
        an allocation from which each run's chain builds its own q, or references built once
        (:func:`~bam_ppl.infer.smc.references.build_references`), one shared or one per run.
    reference_sweeps : int, optional
        Sweeps of each reference chain (0: the allocation's own conditionals); default the engine's
        (:func:`~bam_ppl.infer.smc.references.default_reference_sweeps`: 0.8 × T, at least 200, at
        most 205 million token moves).
    """
    num_runs = check_int(num_chains, "num_chains", minimum=1)
    kernel = _check_options(num_particles, engine, progress_bar, max_configs, start_a, reference_sweeps)
    path = _path_options(rho, num_sweeps, schedule)
    if reference is not None and numba is None:
        raise ImportError("tempered SMC: a reference is built by the numba kernel: pip install numba")
    key = as_key(rng_key)
    data, bound, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="the tempered SMC")
    problems = _run_problems(bound, data, layout, start_a, reference, reference_sweeps, num_runs)
    progress_bar = resolve_progress(progress_bar, long_run=num_runs > 1 and data.total * num_particles > 2_000_000)
    start = time.perf_counter()
    with (_thread_pool(kernel == "numba" or reference is not None) as pool,
          make_bar(num_runs, "tempered SMC", progress_bar, unit="run") as bar, jax.enable_x64(True)):
        symmetry = label_symmetries_of(bound, data, layout) if reference is not None else None
        runs = _runs(problems, _RunSettings(num_runs, num_particles, kernel, path, pool), key, symmetry, bar)
    _warn_of_degenerate_starts(runs)
    return _result(runs, symmetry, bound, data, layout, problems.tp, time.perf_counter() - start,
                   problems.reference_sweeps if reference is not None else None)


def _thread_pool(needed: bool):
    """Threads for the numba kernel's particle blocks and the reference chains (one per block, at
    most one per core), shut down on leaving the ``with``; where not ``needed``, a context giving None."""
    return ThreadPoolExecutor(max_workers=usable_cores()) if needed else nullcontext()


def usable_cores() -> int:
    """Threads that runs and particle blocks share out: the cores, at most one per block."""
    return max(1, min(NUM_BLOCKS, os.cpu_count() or 1))


class _RunSettings(NamedTuple):
    """How the runs go: ``num_runs`` runs of ``num_particles`` particles on the ``kernel`` ("numba"
    or "jax") along ``path``, in the threads of ``pool`` (None: no threads)."""

    num_runs: int
    num_particles: int
    kernel: str
    path: PathOptions
    pool: ThreadPoolExecutor | None


class _RunProblems(NamedTuple):
    """What the runs start from (:func:`_run_problems`): the problem ``tp``; ``run_tps`` each run's
    problem where references are given; ``reference_config`` the configuration that each run's own
    reference chain starts from where an allocation is; ``reference_sweeps`` those chains' sweeps."""

    tp: TemperedProblem
    run_tps: list | None
    reference_config: np.ndarray | None
    reference_sweeps: int | None


def _runs(problems: _RunProblems, settings: _RunSettings, key, symmetry, bar) -> list[TemperedRun]:
    """Every run (:func:`_one_run`), each with its own random streams drawn from ``key``, and with its
    own reference where ``problems`` holds an allocation; ``bar`` advances after each."""
    num_runs, pool = settings.num_runs, settings.pool
    # Seeds of every run: one Generator per particle block and one for resampling.
    seeds = np.asarray(jax.random.split(key, num_runs * (NUM_BLOCKS + 1)))
    seeds = seeds.reshape(num_runs, NUM_BLOCKS + 1, -1).astype(np.uint32)
    run_tps = problems.run_tps
    if problems.reference_config is not None:  # every run its own q, so that their spread includes q's
        run_keys = [jax.random.fold_in(key, num_runs + r) for r in range(num_runs)]
        run_tps = [with_reference(problems.tp, log_q) for log_q in chain_references(
            problems.tp, [problems.reference_config] * num_runs, problems.reference_sweeps, run_keys, pool)]
    runs = []
    for r, run_tp in enumerate(run_tps or [problems.tp] * num_runs):
        particles = NumbaParticles(run_tp, settings.num_particles, seeds[r, :NUM_BLOCKS], pool) \
            if settings.kernel == "numba" else JaxParticles(run_tp, settings.num_particles, jax.random.fold_in(key, r))
        runs.append(_one_run(particles, run_tp, np.random.default_rng(seeds[r, NUM_BLOCKS]), settings.path, symmetry))
        bar.update(1)
    return runs


def _run_problems(bound, data, layout, start_a, reference, reference_sweeps, num_runs) -> _RunProblems:
    """The tempered problem and what the runs start from (:class:`_RunProblems`)."""
    if reference is None:
        start_scale = 1.0 if start_a is None else max(1.0, float(start_a) / bound.a)
        return _RunProblems(build_tempered_problem(bound, data, layout, start_scale), None, None, reference_sweeps)
    tp = build_tempered_problem(bound, data, layout)
    references = _references_per_run(reference, num_runs)
    if references is None:  # an allocation
        config = configs_of_allocation(bound, data, layout, tp.token_cell, reference, "reference")
        sweeps = default_reference_sweeps(data.total) if reference_sweeps is None else reference_sweeps
        return _RunProblems(tp, None, config, sweeps)
    built = sorted({ref.num_sweeps for ref in references})
    if reference_sweeps is not None and built != [reference_sweeps]:
        raise ValueError(f"reference_sweeps: the references were built with {built} sweeps; "
                         "leave reference_sweeps out, or pass an allocation as reference")
    return _RunProblems(tp, [with_reference(tp, _checked_reference(tp, ref)) for ref in references], None, built[-1])


def _warn_of_degenerate_starts(runs) -> None:
    if any(r.degenerate_start for r in runs):
        warnings.warn(
            "tempered SMC: most particles drawn from the start distribution have the same "
            "likelihood (small concentrations put all tokens in one configuration), so the "
            "allocations the posterior favours are rare at the start and single-token Gibbs moves "
            "find them slowly: the estimate can be too low and its runs spread. Start from a "
            "flatter urn (start_a=1 or larger), raise the effort (rho=0.99, num_sweeps=5, more "
            "particles) until the estimate stops rising, or use method='auto' (a start around the "
            "basins a search finds) or 'exact'.",
            EvidenceWarning, stacklevel=3)


def _result(runs, symmetry, bound, data, layout, tp, seconds: float, reference_sweeps) -> TemperedResult:
    """The runs pooled, with each run's and the best allocation visited."""
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
        seconds=seconds, reference_sweeps=reference_sweeps,
    )


@register_evidence("tempered", models=(AllocationModel,))
@renamed_options(num_runs="num_chains", kernel="engine")
def tempered_log_evidence(model, data, *, rng_key=0, num_particles: int = 256, num_chains: int = 4,
                          rho: float = 0.9, num_sweeps: int = 1, schedule=None, engine: str = "auto",
                          progress_bar: bool | None = None, max_configs: int = DEFAULT_MAX_CONFIGS,
                          start_a: float | None = 1.0, reference=None, reference_sweeps: int | None = None):
    """Tempered SMC estimate of log p(X) over the token allocations (see :func:`run_tempered`).

    Annealing from the latent urn prior to the posterior with adaptive temperatures (Del Moral,
    Doucet & Jasra 2006; Neal 2001; Zhou, Johansen & Aston 2016) and collapsed-Gibbs moves;
    ``details`` holds the runs' values and the allocation that attains the sure lower bound
    (largest log π(S) visited: ``best_cells`` (n, nodes), ``best_counts`` (n,), its nonzero
    cells, so that ``bound.log_prob_cells(best_cells, best_counts)`` is the bound); ``info`` (a
    :class:`~bam_ppl.infer.info.TemperedInfo`) every run's best allocation, the schedules and
    diagnostics.
    """
    result = run_tempered(model, data, rng_key, num_particles=num_particles, num_chains=num_chains, rho=rho,
                          num_sweeps=num_sweeps, schedule=schedule, engine=engine, progress_bar=progress_bar,
                          max_configs=max_configs, start_a=start_a, reference=reference,
                          reference_sweeps=reference_sweeps)
    return EvidenceEstimate(
        value=result.log_evidence, stderr=result.stderr, method="tempered", kind="estimate",
        lower_bound=result.lower_bound, run_values=tuple(result.run_log_evidence.tolist()), seconds=result.seconds,
        details=dict(run_log_evidence=result.run_log_evidence.tolist(), lower_bound=result.lower_bound,
                     best_cells=result.best_cells, best_counts=result.best_counts, seconds=result.seconds),
        info=TemperedInfo(
            num_particles=num_particles, num_runs=num_chains, num_temperatures=result.num_temperatures.tolist(),
            num_resamplings=result.num_resamplings.tolist(), min_ess=float(result.min_ess.min()),
            schedule=[s.tolist() for s in result.schedules], rho=rho if schedule is None else None,
            num_sweeps=num_sweeps, kernel=resolve_kernel(engine), start_a=start_a, referenced=reference is not None,
            reference_sweeps=result.reference_sweeps,
            run_best_cells=result.run_best_cells, run_best_counts=result.run_best_counts),
    )
