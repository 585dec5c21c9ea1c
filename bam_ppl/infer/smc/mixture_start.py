"""The start of the tempered SMC from a mixture of references, Σ_b w_b q_b(z), its particles, and the last
reweighting f(b, z) that counts every basin and relabelled copy once (the derivation:
:mod:`bam_ppl.infer.smc.mixture`)."""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
from scipy.special import logsumexp

from ..variational.vb_numba import HostProblem
from .references import with_reference
from .split_moves import split_move_draws, split_move_work, split_moves_block, split_problem
from .symmetry import _log_sum_exp, orbit_log_sums
from .tempered_numba import NumbaParticles, ParticleArrays, kernel_tables
from .tempered_problem import TemperedProblem


class MixtureStart(NamedTuple):
    """The start Σ_b w_b q_b(z): ``log_q`` (B, U, L) every reference's log q per nonzero cell and
    free configuration (as ``references.Reference`` holds it), and
    ``log_weights`` (B,) log w_b, normalised."""

    log_q: np.ndarray
    log_weights: np.ndarray


def uniform_start(log_qs) -> MixtureStart:
    """Equal weights over the references ``log_qs``."""
    log_q = np.ascontiguousarray(np.stack([np.asarray(q, np.float64) for q in log_qs]))
    return MixtureStart(log_q, np.full(log_q.shape[0], -np.log(log_q.shape[0])))


def component_sizes(log_weights: np.ndarray, num_particles: int) -> np.ndarray:
    """Particles of each component: P · w_b rounded by largest remainders (a stratified draw of the
    labels; :func:`initial_log_weights` makes up for the rounding)."""
    share = np.exp(np.asarray(log_weights) - _log_sum_exp(log_weights)) * num_particles
    sizes = np.floor(share).astype(np.int64)
    order = np.argsort(sizes - share, kind="stable")  # largest remainders first
    sizes[order[: num_particles - sizes.sum()]] += 1
    return sizes


def initial_log_weights(start: MixtureStart, sizes: np.ndarray) -> np.ndarray:
    """Normalised start weights of the particles, w_b / n_b for each of the n_b particles of
    component b, so that the weighted particles are an unbiased draw of Σ_b w_b q_b with any
    rounding of the sizes (components with no particle leave the mixture)."""
    kept = sizes > 0
    log_w = np.where(kept, start.log_weights, -np.inf)
    log_w = log_w - _log_sum_exp(log_w[kept])
    return np.repeat(np.where(kept, log_w - np.log(np.maximum(sizes, 1)), -np.inf), sizes)


def kept_start(start: MixtureStart, num_particles: int) -> tuple[MixtureStart, np.ndarray, np.ndarray]:
    """The start that ``num_particles`` particles draw from: ``start`` without the components that get no particle
    (``component_sizes``), renormalised; which components it keeps, and their particles."""
    sizes = component_sizes(start.log_weights, num_particles)
    kept = sizes > 0
    weights = start.log_weights[kept]
    return MixtureStart(start.log_q[kept], weights - _log_sum_exp(weights)), kept, sizes[kept]


class CallStart(NamedTuple):
    """The call's start q̄ = (1/R) Σ_r q_r of the runs' starts as drawn (``kept_start``), its components run by run
    (``start``), the run each came from (``run_of``), and the run ``run`` it reweights."""

    start: MixtureStart
    run_of: np.ndarray
    run: int

    @property
    def first(self) -> int:
        """Where run ``run``'s components begin in ``start``."""
        return int(np.searchsorted(self.run_of, self.run))


def call_starts(starts: list[MixtureStart], num_particles: int) -> list[CallStart]:
    """Each run's :class:`CallStart` for the runs' starts ``starts`` (:mod:`bam_ppl.infer.smc.mixture`)."""
    drawn = [kept_start(start, num_particles)[0] for start in starts]
    sizes = [start.log_q.shape[0] for start in drawn]
    start = MixtureStart(np.ascontiguousarray(np.concatenate([start.log_q for start in drawn])),
                         np.concatenate([start.log_weights for start in drawn]) - np.log(len(drawn)))
    run_of = np.repeat(np.arange(len(drawn)), sizes)
    return [CallStart(start, run_of, r) for r in range(len(drawn))]


class PendingCallStarts:
    """The runs' :class:`CallStart` (:func:`call_starts`), known once every run's start is (:meth:`add`): a run
    can anneal as soon as its own search ends and wait for the others' only at its last reweighting
    (:meth:`waiter`). :meth:`fail` releases the waiters with an error where a search raised. One thread adds."""

    def __init__(self, num_runs: int, num_particles: int):
        self._starts, self._num_particles = [None] * num_runs, num_particles
        self._calls, self._ready = None, threading.Event()

    def add(self, run: int, start: MixtureStart) -> None:
        """Run ``run``'s start; with the last of them, every run's :class:`CallStart`."""
        self._starts[run] = start
        if all(start is not None for start in self._starts):
            self._calls = call_starts(self._starts, self._num_particles)
            self._ready.set()

    def fail(self) -> None:
        """Releases the waiters: with an error unless every start was added."""
        self._ready.set()

    def waiter(self, run: int):
        """A function that waits for run ``run``'s :class:`CallStart` and returns it."""
        def wait() -> CallStart:
            self._ready.wait()
            if self._calls is None:
                raise RuntimeError("tempered SMC from a mixture: another run's search failed")
            return self._calls[run]
        return wait


class MixtureParticles(NumbaParticles):
    """Particles of the mixture start: component b's particles are a contiguous range, moved with b's
    reference. Systematic resampling keeps the ancestors in order, so the ranges stay contiguous.

    Given ``cells`` (a ``HostProblem``: the cells' kernels draw fewer random numbers than a token at a time,
    :func:`~bam_ppl.infer.smc.references.augmented_chain_is_cheaper`), every other move, the first included,
    is instead as many pairs of moves of whole cells' splits (:mod:`~bam_ppl.infer.smc.split_moves`) as draw
    the random numbers of a Gibbs sweep: the sweeps mix the tokens of cells that hold few, the cell moves
    the splits of cells that hold many. Binomials and Gammas cost several uniforms each, so the cell moves take
    about twice to five times a sweep's time (benchmarks/README.md, where the time goes)."""

    def __init__(self, tp: TemperedProblem, num_particles: int, keys, pool, start: MixtureStart,
                 cells: HostProblem | None = None):
        super().__init__(tp, num_particles, keys, pool)
        self.start, self.kept, self.sizes = kept_start(start, num_particles)
        self.component = np.repeat(np.arange(self.sizes.size), self.sizes)
        self.structures = [kernel_tables(with_reference(tp, log_q), True) for log_q in self.start.log_q]
        self.split_problem = None if cells is None else split_problem(cells, tp)
        self.split_pairs = 0 if cells is None else max(1, tp.token_cell.shape[0] // split_move_draws(cells))
        self.split_moves = np.zeros((2, 2), np.int64)  # (data augmentation, reference draws): proposed, accepted
        self.num_moves = 0

    def move(self, beta: float, num_sweeps: int) -> None:
        self.num_moves += 1
        if self.split_problem is None or self.num_moves % 2 == 0:
            super().move(beta, num_sweeps)
            return
        particles = ParticleArrays(self.shifted, self.config, self.log_prior, self.log_like, self.log_start)
        pairs = self.split_pairs * num_sweeps

        def one(block):
            b, first, stop = block
            work = split_move_work(self.split_problem.cells)
            for begin, end, structure in self.segments(first, stop):
                split_moves_block(self.rngs[b], (begin, end), float(beta), pairs, particles, self.split_problem,
                                  structure.log_reference, work)
            return work.accepted

        self.split_moves[:, 0] += pairs * self.num_particles
        self.split_moves[:, 1] += np.sum(list(self.pool.map(one, self.blocks)), axis=0)

    def segments(self, first: int, stop: int) -> list:
        edges = np.searchsorted(self.component[first:stop], np.arange(self.sizes.size + 1)) + first
        return [(int(edges[b]), int(edges[b + 1]), self.structures[b]) for b in range(self.sizes.size)
                if edges[b + 1] > edges[b]]

    def resample(self, ancestors: np.ndarray) -> None:
        if np.any(np.diff(ancestors) < 0):
            raise ValueError("MixtureParticles.resample: ancestors must be in order (systematic resampling)")
        super().resample(ancestors)
        self.component = self.component[ancestors]

    def initial_log_weights(self) -> np.ndarray:
        return initial_log_weights(self.start, self.sizes)


def mixture_log_weights(tp: TemperedProblem, start: MixtureStart, symmetry, config: np.ndarray,
                        component: np.ndarray, groups: np.ndarray | None = None):
    """log f(b_p, z_p) of every particle (:mod:`bam_ppl.infer.smc.mixture`), or None where a sum over the label
    symmetries cannot be made (:func:`~bam_ppl.infer.smc.symmetry.orbit_log_sums`). Given ``groups`` (B,), the
    group of each component, also (G, P) the log share of each group's components in f's denominator at each
    particle (:func:`~bam_ppl.estimate.pool_searches`)."""
    sums = orbit_log_sums(tp, start.log_q, config, symmetry)
    if sums is None:
        return None
    own, orbit = sums  # (B, P)
    mixed = orbit + start.log_weights[:, None]
    own = symmetry.log_order + own[component, np.arange(config.shape[0])]
    total = logsumexp(mixed, axis=0)
    if groups is None:
        return own - total
    shares = [logsumexp(mixed[groups == g], axis=0) - total for g in range(int(groups.max()) + 1)]
    return own - total, np.array(shares)

