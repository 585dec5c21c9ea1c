"""Numba CPU kernel for the Pólya-urn SMC of :mod:`bam_ppl.infer.smc.polya_urn` (``kernel="numba"``).

The same filter as the JAX core: one shared token order per run, the free configuration drawn
from its exact conditional, the incremental weight p_V(c_V | S) of eq. 4.11, adaptive
resampling with the same four schemes, and the same rules for tied tables, missing entries and
the rescaling of extreme products. Each run is a compiled loop over tokens and particles; runs
go to threads (the kernel releases the GIL). Only the random streams differ from the JAX
kernel (a NumPy ``Generator`` per run, seeded from the JAX key).

Resampling moves no counts. A table row (one entry or column, all particles) is stored in the
particle order of the *generation* — the number of resamplings since the last re-indexing — in
which a token last wrote it, and ``lineage[k, p]`` is the slot that the ancestor of the current
particle p held in generation k (composed at each resampling for the generations that rows
still refer to). Before a token reads or updates a row of an earlier
generation, the row is copied into the current order through its lineage (copy on write), so a
resampling costs O(depth × P) instead of copying every particle's tables, O(P × Σ table sizes),
and only when ``depth`` generations are used up are all rows re-indexed at once. Rows no token
touches are never copied, and the run time depends far less on the size of the tables
(Cemgil et al. 2019 Fig. 10b). In XLA the reads through the lineage are element gathers several times
slower than the row reads of the eager copy, so the JAX kernel copies.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from ..kernels import FASTMATH as _FASTMATH
from ..kernels import HAVE_NUMBA, numba
from ..kernels import inverse_cdf as _inverse_cdf

SCHEMES = ("systematic", "stratified", "multinomial", "residual")
# Resamplings between two re-indexings of all rows. A resampling composes the ancestor maps of
# the generations rows still refer to, at most depth × P indices.
LINEAGE_DEPTH = 64


def _search(cdf, positions, ancestors, start):
    """ancestors[start + k] = the first p with cdf[p] > positions[k] (clipped to the last)."""
    found = np.searchsorted(cdf, positions, side="right")
    last = cdf.shape[0] - 1
    for k in range(positions.shape[0]):
        ancestors[start + k] = min(found[k], last)


def _normalised_cdf(weights, cdf):
    total = weights.sum()
    running = 0.0
    for p in range(weights.shape[0]):
        running += weights[p] / total
        cdf[p] = running
    cdf[weights.shape[0] - 1] = 1.0


def _resample(rng, scheme, weights, ancestors, cdf):
    """Ancestors of one run's particles from non-negative ``weights`` with a positive sum
    (the schemes of :mod:`bam_ppl.infer.smc.resampling`, in the order of ``SCHEMES``)."""
    num = weights.shape[0]
    if scheme == 3:  # residual: floor(num · w) copies, the rest multinomial on the remainders
        total = weights.sum()
        filled = 0
        for p in range(num):
            copies = int(math.floor(num * weights[p] / total))
            for _ in range(min(copies, num - filled)):
                ancestors[filled] = p
                filled += 1
            cdf[p] = num * weights[p] / total - copies
        if filled < num:
            remainder = cdf.copy()
            if remainder.sum() > 0.0:
                _normalised_cdf(remainder, cdf)
                _search(cdf, rng.random(num - filled), ancestors, filled)
            else:  # the copies fell short only by rounding
                ancestors[filled:] = np.argmax(weights)
        return
    _normalised_cdf(weights, cdf)
    if scheme == 0:
        positions = (np.arange(num) + rng.random()) / num
    elif scheme == 1:
        positions = (np.arange(num) + rng.random(num)) / num
    else:
        positions = rng.random(num)
    _search(cdf, positions, ancestors, 0)


def _to_current(table, row, row_generation, generation, lineage, live, scratch):
    """Store ``table[row]`` in the current particle order (copy on write: particles that share
    an ancestor share its slot until then). A row never written (generation −1) is zero for
    every particle and needs no copy; ``live`` counts the written rows of each generation."""
    old = row_generation[row]
    if old != generation:
        if old >= 0:
            slots = lineage[old]
            values = table[row]
            for p in range(values.shape[0]):
                scratch[p] = values[slots[p]]
            for p in range(values.shape[0]):
                values[p] = scratch[p]
            live[old] -= 1
        live[generation] += 1
        row_generation[row] = generation


def _multiply(product, prior, values, first):
    """``product *= prior + values`` (``product = prior + values`` when ``first``)."""
    if first:
        for p in range(values.shape[0]):
            product[p] = prior + values[p]
    else:
        for p in range(values.shape[0]):
            product[p] *= prior + values[p]


def _permute(values, ancestors, scratch):
    """values[..., p] = values[..., ancestors[p]] for a 2-d (rows, P) array, in place."""
    for r in range(values.shape[0]):
        for p in range(values.shape[1]):
            scratch[p] = values[r, ancestors[p]]
        for p in range(values.shape[1]):
            values[r, p] = scratch[p]


def _reindex(table, row_generation, lineage, scratch):
    """Every written row of ``table`` in the current particle order, at generation 0; returns
    how many."""
    written = 0
    for r in range(table.shape[0]):
        if row_generation[r] < 0:
            continue
        written += 1
        slots = lineage[row_generation[r]]
        for p in range(table.shape[1]):
            scratch[p] = table[r, slots[p]]
        for p in range(table.shape[1]):
            table[r, p] = scratch[p]
        row_generation[r] = 0
    return written


class RunState(NamedTuple):
    """The particles of one run (of every run, with a leading run axis, in :class:`NumbaRuns`)."""

    counts: np.ndarray  # (entries, P): table rows, each in the particle order of its generation
    column_counts: np.ndarray  # (columns, P)
    count_generation: np.ndarray  # (entries,) generation of each row, −1 if never written
    column_generation: np.ndarray  # (columns,)
    lineage: np.ndarray  # (depth, P): slot of each current particle's ancestor in generation k
    live: np.ndarray  # (depth,): written rows of each generation
    generation: np.ndarray  # (1,): the current generation
    log_weights: np.ndarray  # (P,) since the last resampling
    log_prob: np.ndarray  # (P,) log urn probability of each particle's allocation
    log_evidence: np.ndarray  # (1,) log of the product of the closed epochs' mean weights


class HostUrn(NamedTuple):
    """The urn tables of :class:`~bam_ppl.infer.smc.polya_urn.UrnTables` and the filter's settings."""

    cell_flat: np.ndarray  # (M, U) int64
    config_flat: np.ndarray  # (M, L) int64
    cell_col: np.ndarray  # (M, U) int64
    config_col: np.ndarray  # (M, L) int64
    alpha: np.ndarray  # (entries,) concentration
    alpha_col: np.ndarray  # (columns,) column concentration
    tied_before: np.ndarray  # (M, M) bool: member k is an earlier member of m's table
    valid: np.ndarray  # (U, L) bool, or (1, 1) when every configuration is allowed
    has_valid: bool
    rescale_every: int  # members between two rescalings of the products
    threshold: float  # resample when ESS < threshold × P
    scheme: int  # index in SCHEMES


class TokenTrace(NamedTuple):
    """Per-token diagnostics of one run: the ESS after the token, and whether it resampled."""

    ess: np.ndarray
    resampled: np.ndarray


class TokenWork(NamedTuple):
    """Work arrays of :func:`_run_tokens`: the token's entries and columns (M, L), its weights' numerators
    (then its conditional) and denominators (L, P), and per-particle scratch."""

    entry: np.ndarray
    column: np.ndarray
    numerator: np.ndarray
    denominator: np.ndarray
    log_scale: np.ndarray
    total: np.ndarray
    weights: np.ndarray
    cdf: np.ndarray
    ancestors: np.ndarray
    chosen: np.ndarray
    level: np.ndarray
    cumulative: np.ndarray
    int_scratch: np.ndarray
    count_scratch: np.ndarray
    float_scratch: np.ndarray


def _token_work(num_members, num_configs, counts):
    """:class:`TokenWork` for tokens of ``num_members`` members and ``num_configs`` configurations over the
    particles of ``counts`` (entries, P)."""
    num_particles = counts.shape[1]
    return TokenWork(np.empty((num_members, num_configs), np.int64), np.empty((num_members, num_configs), np.int64),
                     np.empty((num_configs, num_particles)), np.empty((num_configs, num_particles)),
                     np.empty(num_particles), np.empty(num_particles), np.empty(num_particles),
                     np.empty(num_particles), np.empty(num_particles, np.int64), np.empty(num_particles, np.int64),
                     np.empty(num_particles), np.empty(num_particles), np.empty(num_particles, np.int64),
                     np.empty_like(counts[0]), np.empty(num_particles))


def _conditionals(u, g, run, urn, work):
    """Every particle's conditional of a token at cell u (eq. 4.11's terms) into ``work.numerator`` (L, P), its
    sum into ``work.total`` and the log of the rescalings of extreme products into ``work.log_scale``."""
    counts, column_counts, lineage, live = run.counts, run.column_counts, run.lineage, run.live
    numerator, denominator, log_scale, entry, column = (work.numerator, work.denominator, work.log_scale,
                                                        work.entry, work.column)
    num_members, num_configs = urn.config_flat.shape
    num_particles = counts.shape[1]
    log_scale[:] = 0.0
    for m in range(num_members):
        for l in range(num_configs):
            e = urn.cell_flat[m, u] + urn.config_flat[m, l]
            c = urn.cell_col[m, u] + urn.config_col[m, l]
            entry[m, l] = e
            column[m, l] = c
            # Earlier members of the same (tied) table have already added this token.
            prior = urn.alpha[e]
            prior_column = urn.alpha_col[c]
            for k in range(m):
                if urn.tied_before[m, k]:
                    prior += 1.0 if entry[k, l] == e else 0.0
                    prior_column += 1.0 if column[k, l] == c else 0.0
            _to_current(counts, e, run.count_generation, g, lineage, live, work.count_scratch)
            _to_current(column_counts, c, run.column_generation, g, lineage, live, work.count_scratch)
            _multiply(numerator[l], prior, counts[e], m == 0)
            _multiply(denominator[l], prior_column, column_counts[c], m == 0)
        if urn.has_valid and m == 0:
            for l in range(num_configs):
                if not urn.valid[u, l]:
                    numerator[l, :] = 0.0
        if (m + 1) % urn.rescale_every == 0 and m + 1 < num_members:
            for p in range(num_particles):
                peak = 0.0
                for l in range(num_configs):
                    ratio = numerator[l, p] / denominator[l, p]
                    numerator[l, p] = ratio
                    denominator[l, p] = 1.0
                    peak = max(peak, ratio)
                if peak > 0.0:
                    for l in range(num_configs):
                        numerator[l, p] /= peak
                    log_scale[p] += np.log(peak)
                else:
                    log_scale[p] = -np.inf
    work.total[:] = 0.0
    for l in range(num_configs):
        for p in range(num_particles):
            probability = numerator[l, p] / denominator[l, p]
            numerator[l, p] = probability
            work.total[p] += probability


def _reweigh(rng, t, g, run, urn, work, trace):
    """Weigh the particles by the token's predictive (``work.total``) and resample them where the ESS falls
    below the threshold, the token's conditionals and the particles' rows following; returns the generation."""
    log_weights, weights, num_particles = run.log_weights, work.weights, run.counts.shape[1]
    peak = -np.inf
    for p in range(num_particles):
        log_weights[p] += np.log(work.total[p]) + work.log_scale[p]
        peak = max(peak, log_weights[p])
    if not np.isfinite(peak):
        peak = 0.0
    weight_sum = 0.0
    square_sum = 0.0
    for p in range(num_particles):
        shifted = log_weights[p] - peak
        weights[p] = math.exp(shifted) if shifted > -700.0 else 0.0
        weight_sum += weights[p]
        square_sum += weights[p] * weights[p]
    ess = weight_sum * weight_sum / square_sum if square_sum > 0.0 else np.nan
    resample = ess < urn.threshold * num_particles
    trace.ess[t] = ess
    trace.resampled[t] = resample
    if not resample:
        return g
    run.log_evidence[0] += peak + np.log(weight_sum / num_particles)
    ancestors, float_scratch, lineage, live = work.ancestors, work.float_scratch, run.lineage, run.live
    _resample(rng, urn.scheme, weights, ancestors, work.cdf)
    _permute(work.numerator, ancestors, float_scratch)
    for x in (work.total, work.log_scale, run.log_prob):
        for p in range(num_particles):
            float_scratch[p] = x[ancestors[p]]
        x[:] = float_scratch
    for k in range(g + 1):  # only generations that rows still refer to
        if live[k] > 0:
            _permute(lineage[k:k + 1], ancestors, work.int_scratch)
    g += 1
    if g == lineage.shape[0]:
        live[:] = 0
        live[0] = (_reindex(run.counts, run.count_generation, lineage, work.count_scratch)
                   + _reindex(run.column_counts, run.column_generation, lineage, work.count_scratch))
        g = 0
    for p in range(num_particles):
        lineage[g, p] = p
    run.generation[0] = g
    log_weights[:] = 0.0
    return g


def _draw_and_add(rng, g, run, work):
    """Draw every particle's configuration of the token from its conditional and add the token's increments."""
    numerator, level, cumulative, chosen, log_scale = work.numerator, work.level, work.cumulative, work.chosen, work.log_scale
    num_members, num_configs = work.entry.shape
    num_particles = run.counts.shape[1]
    # Inverse CDF for all particles at once, configurations outer: the same left-to-right
    # sums as a per-particle search, in loops over contiguous particles.
    for p in range(num_particles):
        level[p] = rng.random() * work.total[p]
        cumulative[p] = 0.0
        chosen[p] = -1
    for l in range(num_configs):
        row = numerator[l]
        for p in range(num_particles):
            cumulative[p] += row[p]
            if chosen[p] < 0 and cumulative[p] > level[p]:
                chosen[p] = l
    for p in range(num_particles):
        if chosen[p] < 0:  # rounding left the level at the total
            chosen[p] = _inverse_cdf(numerator[:, p], level[p])
        run.log_prob[p] += np.log(numerator[chosen[p], p]) + log_scale[p]
    # After a resampling the token's rows are of the previous generation: into the new
    # order before the increments.
    for m in range(num_members):
        for l in range(num_configs):
            _to_current(run.counts, work.entry[m, l], run.count_generation, g, run.lineage, run.live, work.count_scratch)
            _to_current(run.column_counts, work.column[m, l], run.column_generation, g, run.lineage, run.live,
                        work.count_scratch)
    for m in range(num_members):
        for p in range(num_particles):
            run.counts[work.entry[m, chosen[p]], p] += 1
            run.column_counts[work.column[m, chosen[p]], p] += 1


def _run_tokens(rng, cells, run, urn, trace):
    """Add the tokens ``cells`` to every particle of one run, in place (see :func:`smc.step`).

    ``run`` is the run's :class:`RunState`, ``urn`` a :class:`HostUrn`; ``trace`` (a
    :class:`TokenTrace`) receives the per-token diagnostics.
    """
    num_members, num_configs = urn.config_flat.shape
    work = _token_work(num_members, num_configs, run.counts)
    for t in range(cells.shape[0]):
        g = run.generation[0]
        _conditionals(cells[t], g, run, urn, work)
        g = _reweigh(rng, t, g, run, urn, work, trace)
        _draw_and_add(rng, g, run, work)


def _current_rows(table, row_generation, lineage, particles):
    """out[r, k] = the value of row r for current particle ``particles[k]``."""
    out = np.empty((table.shape[0], particles.shape[0]), table.dtype)
    for r in range(table.shape[0]):
        slots = lineage[max(row_generation[r], 0)]  # rows never written are zero
        for k in range(particles.shape[0]):
            out[r, k] = table[r, slots[particles[k]]]
    return out


if HAVE_NUMBA:
    _search = numba.njit(cache=True)(_search)
    _normalised_cdf = numba.njit(cache=True)(_normalised_cdf)
    _resample = numba.njit(cache=True)(_resample)
    _to_current = numba.njit(inline="always", cache=True)(_to_current)
    _multiply = numba.njit(inline="always", cache=True)(_multiply)
    _permute = numba.njit(cache=True)(_permute)
    _reindex = numba.njit(cache=True)(_reindex)
    _token_work = numba.njit(inline="always", cache=True)(_token_work)
    _conditionals = numba.njit(inline="always", cache=True)(_conditionals)
    _reweigh = numba.njit(inline="always", cache=True)(_reweigh)
    _draw_and_add = numba.njit(inline="always", cache=True)(_draw_and_add)
    _run_tokens = numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)(_run_tokens)
    _current_rows = numba.njit(nogil=True, cache=True)(_current_rows)


class NumbaRuns:
    """``num_chains`` SMC runs of ``num_particles`` particles on the host, advanced block by block.

    ``urn`` is the :class:`~bam_ppl.infer.smc.polya_urn.UrnTables` content as NumPy arrays; ``rngs`` one
    Generator per run. Runs go to threads (at most the number of CPUs). ``state`` is every run's
    :class:`RunState`, with a leading run axis.
    """

    def __init__(self, urn, same_table_before, num_particles: int, num_tokens: int, rngs, *, resampling: str,
                 ess_threshold: float, rescale_every: int, lineage_depth: int | None = None):
        self.rngs = rngs
        self.urn = _host_urn(urn, same_table_before, resampling, ess_threshold, rescale_every)
        self.state = _initial_runs(len(rngs), self.urn, num_particles, num_tokens,
                                   LINEAGE_DEPTH if lineage_depth is None else lineage_depth)
        self._pool = ThreadPoolExecutor(max_workers=min(len(rngs), os.cpu_count() or 1))

    def close(self):
        self._pool.shutdown()

    def run(self, cells: np.ndarray):
        """Add the tokens ``cells`` (tokens, chain) to every run; returns their :class:`TokenTrace`,
        each field (chain, tokens)."""
        num_tokens, num_chains = cells.shape
        trace = TokenTrace(np.empty((num_chains, num_tokens)), np.empty((num_chains, num_tokens), np.bool_))

        def run_chain(c):
            _run_tokens(self.rngs[c], np.ascontiguousarray(cells[:, c], np.int64), self._chain(c), self.urn,
                        TokenTrace(trace.ess[c], trace.resampled[c]))

        list(self._pool.map(run_chain, range(num_chains)))
        return trace

    def _chain(self, c) -> RunState:
        """Run ``c``'s :class:`RunState`: views into ``state``, updated in place."""
        return RunState(*(x[c] for x in self.state))

    def chain_log_evidence(self) -> np.ndarray:
        """Per-run log of the product of epoch means, including the last, un-resampled epoch."""
        log_weights = self.state.log_weights
        peak = log_weights.max(axis=1, keepdims=True)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        mean = np.mean(np.exp(log_weights - peak), axis=1)
        return self.state.log_evidence[:, 0] + peak[:, 0] + np.log(mean)

    def best_particles(self):
        """Each run's most probable final particle: its family counts and log urn probability."""
        best = np.argmax(self.state.log_prob, axis=1)
        counts = np.stack([_current_rows(run.counts, run.count_generation, run.lineage, best[c:c + 1])[:, 0]
                           for c, run in enumerate(map(self._chain, range(best.shape[0])))])
        return counts, self.state.log_prob[np.arange(best.shape[0]), best]

    def final_particles(self, rngs):
        """Equally weighted particles by a final resampling: (chain, particle, entries) counts
        and column counts."""
        counts, column_counts = [], []
        for c, rng in enumerate(rngs):
            run = self._chain(c)
            peak = run.log_weights.max()
            weights = np.exp(run.log_weights - (peak if np.isfinite(peak) else 0.0))
            ancestors = np.empty(weights.shape[0], np.int64)
            _resample(rng, self.urn.scheme, weights, ancestors, np.empty_like(weights))
            # Rows gathered particle-contiguous, then one transposing copy to (particle, row).
            counts.append(_current_rows(run.counts, run.count_generation, run.lineage, ancestors).T)
            column_counts.append(_current_rows(run.column_counts, run.column_generation, run.lineage, ancestors).T)
        return np.stack(counts), np.stack(column_counts)


def _host_urn(urn, same_table_before, resampling: str, ess_threshold: float, rescale_every: int) -> HostUrn:
    """The :class:`HostUrn` of :class:`~bam_ppl.infer.smc.polya_urn.UrnTables` ``urn``."""
    num_members = urn.cell_flat.shape[0]
    tied_before = np.zeros((num_members, num_members), np.bool_)
    for m, earlier in enumerate(same_table_before):
        tied_before[m, list(earlier)] = True
    has_valid = urn.valid is not None
    as_index = lambda x: np.ascontiguousarray(x, np.int64)  # noqa: E731
    return HostUrn(
        cell_flat=as_index(urn.cell_flat), config_flat=as_index(urn.config_flat),
        cell_col=as_index(urn.cell_col), config_col=as_index(urn.config_col),
        alpha=np.ascontiguousarray(urn.concentration, np.float64),
        alpha_col=np.ascontiguousarray(urn.column_concentration, np.float64),
        tied_before=tied_before,
        valid=np.ascontiguousarray(urn.valid, np.bool_) if has_valid else np.ones((1, 1), np.bool_),
        has_valid=has_valid, rescale_every=int(rescale_every), threshold=float(ess_threshold),
        scheme=SCHEMES.index(resampling))


def _initial_runs(num_chains: int, urn: HostUrn, num_particles: int, num_tokens: int, depth: int) -> RunState:
    """Every run's :class:`RunState` before the first token: empty tables, generation 0."""
    entries, columns = urn.alpha.shape[0], urn.alpha_col.shape[0]
    # Counts never exceed the number of tokens: 16 bits when they fit, so that twice as many
    # rows stay in the CPU caches.
    dtype = np.int16 if num_tokens <= np.iinfo(np.int16).max else np.int32
    return RunState(
        counts=np.zeros((num_chains, entries, num_particles), dtype),
        column_counts=np.zeros((num_chains, columns, num_particles), dtype),
        count_generation=np.full((num_chains, entries), -1, np.int64),  # −1: never written
        column_generation=np.full((num_chains, columns), -1, np.int64),
        lineage=np.ascontiguousarray(np.broadcast_to(
            np.arange(num_particles, dtype=np.int64), (num_chains, depth, num_particles))),
        live=np.zeros((num_chains, depth), np.int64),
        generation=np.zeros((num_chains, 1), np.int64),
        log_weights=np.zeros((num_chains, num_particles)),
        log_prob=np.zeros((num_chains, num_particles)),
        log_evidence=np.zeros((num_chains, 1)),
    )
