"""Chib-style estimate of the evidence from collapsed Gibbs sweeps over token labels (``method="chib"``).

p(X) = p(X, z*) / p(z* | X) (Chib 1995), p(z* | X) from the probabilities that systematic-scan sweeps land on z*
(Murray & Salakhutdinov 2009), averaged over the label symmetries; every run its own z*, found by a
go-with-the-winners search. An unbiased estimate of p(X), a stochastic lower bound on log p(X). The derivation,
the symmetries and the search: docs/api_internals.rst, "Chib-style estimate"; the kernels:
:mod:`bam_ppl.infer.gibbs.chib_numba`.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import jax
import numpy as np
from scipy.special import gammaln, logsumexp

from ...estimate import EvidenceEstimate, pool_runs
from ...models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel
from ...progress import make_bar, resolve_progress
from ...types import as_key, numpy_generator
from ...validation import check_choice, check_int, renamed_options
from ..info import ChibInfo
from ..kernels import HAVE_NUMBA
from ..prepare import as_allocations, configs_of_allocation, prepare
from ..registry import register_evidence
from ..smc import symmetry
from .chib_numba import ChainState, OrderedRelabellings, anneal, chib_steps, icm_modes, urn_start
from .collapsed import build_problem
from .collapsed_numba import token_entries, urn_rows

KERNELS = ("auto", "jax", "numba")
DEFAULT_NUM_RUNS = 4
DEFAULT_NUM_SEARCHES = 8
DEFAULT_SWEEPS_PER_TOKEN = 2  # search sweeps by default: two per token, within the limits below
DEFAULT_NUM_WARMUP = 2000
MAX_DEFAULT_NUM_WARMUP = 10_000
DEFAULT_NUM_STEPS = 1000


def _resolve_kernel(kernel) -> str:
    if not isinstance(kernel, str):
        raise TypeError(f"engine must be a string, got {type(kernel).__name__}")
    check_choice(kernel, "engine", KERNELS)
    if kernel == "jax":
        raise ValueError('engine="jax" is not available for method="chib": its sweeps run in the numba '
                         'kernel only; use engine="numba" or "auto"')
    if not HAVE_NUMBA:
        raise ImportError('method="chib" needs numba: pip install "bam_ppl[fast]" (or numba>=0.60)')
    return "numba"


class TokenRows(NamedTuple):
    """Every token's entries of the urn conditional, read by the kernel where ``usable``: no tied
    members, no restricted cells, linear space, every row moved with the token, and at most
    MAX_TOKEN_ROW_ENTRIES entries in all."""

    usable: bool
    numerators: np.ndarray  # (T, numerator rows, L) int64: entry of row r at configuration c
    denominators: np.ndarray  # (T, denominator rows, L)


MAX_TOKEN_ROW_ENTRIES = 2**23  # 64 MB of indices


def token_rows(rows) -> TokenRows:
    """:class:`TokenRows` of an :class:`~bam_ppl.infer.gibbs.collapsed_numba.UrnRows`."""
    num_tokens, num_configs = rows.token_cell.shape[0], rows.row_offset.shape[1]
    every = [*rows.numerator_rows, *rows.denominator_rows]
    usable = (not rows.tie_rows.size and not rows.has_valid and not rows.log_space and bool(every)
              and sorted(rows.moved) == sorted(every) and num_tokens * len(every) * num_configs <= MAX_TOKEN_ROW_ENTRIES)
    if not usable:
        return TokenRows(False, np.zeros((0, 0, 0), np.int64), np.zeros((0, 0, 0), np.int64))
    return TokenRows(True, *(token_entries(rows.row_base, rows.row_offset, group, rows.token_cell)
                             for group in (rows.numerator_rows, rows.denominator_rows)))


class _Problem:
    """The host arrays one run needs, from :func:`bam_ppl.infer.gibbs.collapsed.build_problem`."""

    def __init__(self, bound, data, layout, label_symmetry: bool, max_relabellings: int,
                 estimator: str = "the Chib-style estimate"):
        spec, problem = build_problem(bound, data, layout, token_order="fixed")
        self.concentration = np.asarray(problem.concentration, np.float64)
        # Multiply the factors of the conditional directly unless a partial product could leave
        # the float64 range (each factor lies in [α_min, α_max + T + 1]).
        num_factors = len(spec.numerator_rows) + len(spec.denominator_rows)
        extremes = np.abs(np.log10([self.concentration.min(), self.concentration.max() + data.total + 1]))
        self.structure = urn_rows(
            spec, np.asarray(problem.token_cell, np.int64), np.asarray(problem.row_base, np.int64),
            np.asarray(problem.row_offset, np.int64), problem.valid, num_factors * extremes.max() > 280)
        self.fixed_counts = np.asarray(problem.fixed_counts, np.float64)
        self.fast = token_rows(self.structure)
        self.num_entries = int(spec.num_table_entries)
        self.num_configs = int(spec.num_configs)
        self.num_tokens = int(problem.token_cell.shape[0])
        self.constant = bound.log_data_constant(data)
        # log π(S) = log p(X, z) + Σ_u ln X_u! − Σ_(u,l) ln S(u, l)!
        self.cell_factorials = float(gammaln(np.asarray(data.counts, np.float64) + 1.0).sum())
        self.relabellings = np.arange(self.num_configs, dtype=np.int64)[None, :]
        if label_symmetry:
            self.relabellings = symmetry.label_symmetries(bound, layout, self.structure, self.concentration,
                                                          self.fixed_counts, self.num_entries, max_relabellings, estimator)

    def shifted_counts(self, config) -> np.ndarray:
        """concentration + counts of the token configurations ``config`` (T,)."""
        token_cell, row_base, row_offset = self.structure.token_cell, self.structure.row_base, self.structure.row_offset
        shifted = self.concentration + self.fixed_counts
        for m in self.structure.moved:
            np.add.at(shifted, row_base[m, token_cell] + row_offset[m, config], 1.0)
        return shifted

    def configs_of_allocation(self, bound, data, layout, start) -> np.ndarray:
        """Token configurations (T,) of an allocation given as (full cells (n, nodes), counts (n,)),
        as int32 like the searched ones, so that the kernels are compiled for one type only."""
        return configs_of_allocation(bound, data, layout, self.structure.token_cell, start, "start").astype(np.int32)

    def log_joint(self, shifted) -> float:
        """log p(X, z) of token-labelled z, from its shifted counts (exact, NumPy)."""
        F = self.num_entries
        tables = (gammaln(shifted[:F]).sum() - gammaln(self.concentration[:F]).sum()
                  - gammaln(shifted[F:]).sum() + gammaln(self.concentration[F:]).sum())
        return float(self.constant + tables)

    def log_prob_allocation(self, shifted, config) -> float:
        """log π(S(z)) (eq. 3.11, multinomial coefficient included): a sure lower bound on log p(X)."""
        cells = self.structure.token_cell
        groups = np.bincount(cells * self.num_configs + config)
        return self.log_joint(shifted) + self.cell_factorials - float(gammaln(groups + 1.0).sum())


ANNEAL_START = 0.1
ANNEAL_FRACTION = 0.8
SEARCH_ROUNDS = 10


def _schedule(num_warmup: int) -> np.ndarray:
    """β of each warmup sweep: geometric from ANNEAL_START to 1 over the first ANNEAL_FRACTION of
    the sweeps, then 1."""
    rising = int(num_warmup * ANNEAL_FRACTION)
    betas = np.ones(num_warmup)
    if rising > 0:
        betas[:rising] = np.geomspace(ANNEAL_START, 1.0, rising)
    return betas


class _Searcher:
    """One annealing chain of the search for z*, with the best state it has visited."""

    def __init__(self, problem: _Problem, rng: np.random.Generator):
        self.problem, self.rng = problem, rng
        self.shifted = problem.concentration + problem.fixed_counts
        self.config = np.zeros(problem.num_tokens, np.int32)
        self.current = urn_start(rng, self.shifted, self.config, problem.concentration, problem.num_entries,
                              problem.structure, problem.fast)
        self.best, self.best_shifted, self.best_config = self.current, self.shifted.copy(), self.config.copy()

    def anneal(self, betas) -> None:
        self.current, self.best = anneal(self.rng, betas, ChainState(self.shifted, self.config), self.current,
                                         ChainState(self.best_shifted, self.best_config), self.best,
                                         self.problem.structure, self.problem.fast)

    def take(self, other: _Searcher) -> None:
        """Continue from ``other``'s current state (its best so far stays its own)."""
        self.shifted[:], self.config[:], self.current = other.shifted, other.config, other.current


def _search(problem: _Problem, rngs, num_warmup: int, pool) -> list[dict]:
    """Annealed searches for z*, one chain per Generator, run as a population.

    The sweeps of each chain follow :func:`_schedule`; at SEARCH_ROUNDS evenly spaced points the
    worse half of the chains (by current p(X, z)) restart from copies of the better half ("go
    with the winners"). Each chain's best visited state is refined by iterated conditional
    modes. Returns per chain: configuration, shifted counts, log p(X, z), log π(S(z)).
    """
    searchers = list(pool.map(lambda rng: _Searcher(problem, rng), rngs))
    betas = _schedule(num_warmup)
    rounds = [chunk for chunk in np.array_split(betas, SEARCH_ROUNDS) if chunk.size]
    for r, chunk in enumerate(rounds):
        list(pool.map(lambda searcher, betas=chunk: searcher.anneal(betas), searchers))
        if r + 1 < len(rounds) and len(searchers) > 1:
            ranked = sorted(searchers, key=lambda searcher: searcher.current, reverse=True)
            half = len(ranked) // 2
            for winner, loser in zip(ranked[:half], ranked[len(ranked) - half:]):
                loser.take(winner)

    return list(pool.map(lambda searcher: _refine(problem, searcher.rng, searcher.best_shifted,
                                                  searcher.best_config), searchers))


def _refine(problem: _Problem, rng: np.random.Generator, shifted, config) -> dict:
    """A searched state refined by iterated conditional modes (in place): its configuration,
    shifted counts, log p(X, z) and, as ``sure``, the larger log π(S(z)) of the state before and after with its
    configuration. ICM climbs p(X, z) of one labelling, which splits a cell's tokens less evenly than the
    allocations that carry p(X) = Σ_S π(S) (π(S) counts the labellings of S): on cells of many tokens it can
    lower log π(S) by hundreds of nats, and the sure bound keeps the state it started from."""
    before = (problem.log_prob_allocation(shifted, config), config.copy())
    passes = icm_modes(rng, shifted, config, problem.structure, problem.fast)
    shifted = np.rint(shifted - problem.concentration) + problem.concentration
    after = (problem.log_prob_allocation(shifted, config), config)
    return dict(config=config, shifted=shifted, log_joint=problem.log_joint(shifted),
                sure=max(before, after, key=lambda bound: bound[0]), icm_passes=int(passes))


def _ordered_relabellings(relabellings, star) -> OrderedRelabellings:
    """The distinct actions of the relabellings on z*, for the kernel's ``_transition_into_star``.

    T(z → g(z*)) depends on g only through its images of the configurations z* uses, so the
    relabellings are grouped by those images (``images``, (U, D), in order of first appearance
    along the tokens): one representative per group (``relabellings``, (U, L)), with
    the log of the group sizes (``log_sizes``), ordered as the leaves of a trie of their images in
    which each position ranks z*'s own configuration first, so that the identity's group comes
    first and groups that share a prefix of images follow one another. ``distinct[t]`` is the
    number of distinct configurations among z*'s first t + 1 tokens, and
    ``shared_tokens[d]`` the number of leading tokens whose configurations are among the first d.
    """
    _, first = np.unique(star, return_index=True)
    first = np.sort(first)
    images = relabellings[:, star[first]]
    groups, representative, sizes = np.unique(images, axis=0, return_index=True, return_counts=True)
    # Rank each configuration by its first appearance in z* (unused ones after): the identity's
    # images then read (0, 1, …, D − 1), the smallest key, and it comes first.
    rank = np.empty(relabellings.shape[1], np.int64)
    rank[star[first]] = np.arange(first.size)
    unused = np.setdiff1d(np.arange(relabellings.shape[1]), star[first])
    rank[unused] = first.size + np.arange(unused.size)
    trie = np.lexsort(rank[groups].T[::-1])
    new = np.zeros(star.size, np.int64)
    new[first] = 1
    distinct = np.cumsum(new)
    shared_tokens = np.searchsorted(distinct, np.arange(first.size + 1), side="right")
    return OrderedRelabellings(np.ascontiguousarray(relabellings[representative[trie]]),
                               np.ascontiguousarray(groups[trie]), np.log(sizes[trie].astype(np.float64)), distinct,
                               shared_tokens)


def _chain(problem: _Problem, rng: np.random.Generator, star: dict, num_steps: int) -> float:
    """log p̂(z* | X) of one chain of ``num_steps`` sweeps around z*."""
    s = int(rng.integers(1, num_steps + 1))
    ordered = _ordered_relabellings(problem.relabellings, star["config"])
    log_transition = chib_steps(rng, s, num_steps, star["shifted"].copy(), star["config"].copy(), ordered,
                                problem.structure, problem.fast)
    return float(logsumexp(log_transition) - math.log(num_steps))


def _check_options(num_runs, num_searches, num_warmup, num_steps, label_symmetry, kernel, max_configs,
                   progress_bar):
    """The options under their internal names (runs, search sweeps, chain sweeps), checked and
    reported under their public ones (num_chains, num_search_sweeps, num_samples)."""
    num_runs = check_int(num_runs, "num_chains", minimum=1)
    num_searches = check_int(num_searches, "num_searches", minimum=1)
    if num_warmup is not None:
        num_warmup = check_int(num_warmup, "num_search_sweeps", minimum=0)
    num_steps = check_int(num_steps, "num_samples", minimum=1)
    check_int(max_configs, "max_configs", minimum=1)
    if not isinstance(label_symmetry, bool):
        raise TypeError(f"label_symmetry must be a bool, got {type(label_symmetry).__name__}")
    resolve_progress(progress_bar)  # validates
    return num_runs, num_searches, num_warmup, num_steps, _resolve_kernel(kernel)


@register_evidence("chib", models=(AllocationModel,))
@renamed_options(num_runs="num_chains", num_warmup="num_search_sweeps", num_steps="num_samples", kernel="engine")
def chib_log_evidence(model, data, *, rng_key=0, num_chains: int = DEFAULT_NUM_RUNS,
                      num_searches: int = DEFAULT_NUM_SEARCHES,
                      num_search_sweeps: int | None = None, num_samples: int = DEFAULT_NUM_STEPS,
                      label_symmetry: bool = True, engine: str = "auto",
                      max_configs: int = DEFAULT_MAX_CONFIGS, progress_bar: bool | None = None,
                      start=None) -> EvidenceEstimate:
    """Chib-style estimate of log p(X) from collapsed Gibbs (Murray & Salakhutdinov 2009), a
    method of another kind than the SMC estimators, as a cross-check of them.

    log p(X) = log p(X, z*) − log p̂(z* | X) for a searched token labelling z*, with p(z* | X)
    the average of the exact transition probabilities T(z^(s) → z*) of a Gibbs chain of
    ``num_samples`` sweeps run backwards and forwards from z* (Chib 1995; Wallach et al. 2009).
    Each run is an unbiased estimate of p(X); runs are pooled by log-mean-exp. A z* in a poor mode
    gives a value far too low although the runs agree: it shows as a ``lower_bound`` below other
    estimators' sure bounds (module documentation: z*, the label symmetries, the bias).

    Parameters
    ----------
    num_chains, num_searches : int
        Independent runs (formerly ``num_runs``), each a search group's z* and one chain around it;
        search chains for z*, split into min(num_chains, num_searches) groups (all in threads).
    num_search_sweeps : int, optional
        Annealed Gibbs sweeps of each search chain (formerly ``num_warmup``); default two per token,
        within [2000, 10 000], and 2000 with a ``start``.
    num_samples : int
        Sweeps of each chain around z* (formerly ``num_steps``).
    label_symmetry : bool
        Average the transition probabilities over the relabellings that leave p(X, z) unchanged
        (up to 8! of them); without it the estimate is low by up to log of their number.
    engine : {"auto", "numba"}
        Only the numba CPU kernel exists (formerly ``kernel``).
    max_configs, progress_bar
        Largest number of free-node configurations enumerated per token; a tqdm bar (None: over 2000 tokens).
    start : (cells, counts) or list of them, optional
        Allocations that compete with run r's searched z* (start r modulo their number) after
        iterated conditional modes, e.g. a tempered run's ``details["run_best_cells"]``,
        ``details["run_best_counts"]``; chosen independently of the chains, they keep runs unbiased.

    Returns an :class:`~bam_ppl.estimate.EvidenceEstimate`: ``lower_bound`` the largest log π(S) of the
    searched and started states (a sure bound), its allocation ``details["best_cells"]``,
    ``details["best_counts"]``; ``info`` a :class:`~bam_ppl.infer.info.ChibInfo`.
    """
    began = time.perf_counter()
    num_runs, num_searches, num_warmup, num_steps, kernel = _check_options(
        num_chains, num_searches, num_search_sweeps, num_samples, label_symmetry, engine, max_configs, progress_bar)
    key = as_key(rng_key)
    data, bound, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="the Chib estimator")
    if num_warmup is None:
        per_token = DEFAULT_SWEEPS_PER_TOKEN * data.total if start is None else 0
        num_warmup = int(np.clip(per_token, DEFAULT_NUM_WARMUP, MAX_DEFAULT_NUM_WARMUP))
    problem = _Problem(bound, data, layout, label_symmetry, symmetry.MAX_RELABELLINGS)
    start_configs = [problem.configs_of_allocation(bound, data, layout, one) for one in as_allocations(start)]
    show = resolve_progress(progress_bar, long_run=data.total > 2000)
    bar = make_bar(num_searches + num_runs, "chib", show, unit="chain")
    try:
        runs = _runs(problem, key, start_configs, num_runs, num_searches, num_warmup, num_steps, bar)
    finally:
        bar.close()
    settings = dict(num_steps=num_steps, num_warmup=num_warmup, num_runs=num_runs, num_searches=num_searches)
    return _estimate(problem, (bound, data, layout), runs, dict(settings, kernel=kernel), began)


class ChibRuns(NamedTuple):
    """What :func:`_runs` found: the searches (a list per group), the refined starts, each run's z*
    and each run's log p̂(z* | X)."""

    searches: list
    starts: list
    stars: list
    log_posterior: list


def _estimate(problem: _Problem, prepared, runs: ChibRuns, settings: dict, began: float) -> EvidenceEstimate:
    """The :class:`~bam_ppl.estimate.EvidenceEstimate` of the runs, built at the boundary."""
    bound, data, layout = prepared
    values = np.array([star["log_joint"] for star in runs.stars]) - np.array(runs.log_posterior)
    value, stderr = pool_runs(values)
    searched = [found for group in runs.searches for found in group]
    lower_bound, best_config = max((found["sure"] for found in searched + runs.starts), key=lambda sure: sure[0])
    keys, best_counts = np.unique(problem.structure.token_cell * problem.num_configs + best_config,
                                  return_counts=True)
    best_cells = bound.full_cells(data, layout)[keys // problem.num_configs, keys % problem.num_configs]
    return EvidenceEstimate(
        value=value, stderr=stderr, method="chib", kind="estimate", lower_bound=lower_bound,
        run_values=tuple(values.tolist()), seconds=time.perf_counter() - began,
        details=dict(run_log_evidence=values.tolist(), lower_bound=lower_bound, best_cells=best_cells,
                     best_counts=best_counts),
        info=ChibInfo(
            log_joint_star=[float(star["log_joint"]) for star in runs.stars],
            search_log_joint=[found["log_joint"] for found in searched],
            start_log_joint=[found["log_joint"] for found in runs.starts],
            log_posterior_star=runs.log_posterior,
            icm_passes=[found["icm_passes"] for found in searched + runs.starts],
            num_relabellings=int(problem.relabellings.shape[0]), **settings),
    )


def _runs(problem: _Problem, key, start_configs, num_runs: int, num_searches: int, num_warmup: int,
          num_steps: int, bar) -> ChibRuns:
    """The searches, the refined starts, each run's z* (the best of its group's searches and its
    start) and each run's log p̂(z* | X) (:class:`ChibRuns`), searches and chains in threads."""
    search_key, chain_key = jax.random.split(key)
    search_rngs = [numpy_generator(k) for k in jax.random.split(search_key, num_searches)]
    chain_rngs = [numpy_generator(k) for k in jax.random.split(chain_key, num_runs)]
    groups = np.array_split(np.arange(num_searches), min(num_runs, num_searches))

    def chain(r):
        log_posterior = _chain(problem, chain_rngs[r], stars[r], num_steps)
        bar.update(1)
        return log_posterior

    threads = max(1, min(max(num_runs, num_searches), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        searches = [_search(problem, [search_rngs[i] for i in group], num_warmup, pool) for group in groups]
        # ICM is deterministic: the Generator is not drawn from.
        starts = [_refine(problem, np.random.default_rng(0), problem.shifted_counts(config), config)
                  for config in start_configs]
        bar.update(num_searches)
        stars = [max(searches[r % len(groups)] + ([starts[r % len(starts)]] if starts else []),
                     key=lambda found: found["log_joint"]) for r in range(num_runs)]
        return ChibRuns(searches, starts, stars, list(pool.map(chain, range(num_runs))))
