"""Numba CPU kernel for the collapsed Gibbs sweep of :mod:`bam_ppl.infer.gibbs.collapsed`.

On a CPU, one iteration of the JAX ``lax.scan`` over tokens costs a few XLA kernel launches, far
more than the arithmetic of one token update. This module runs the same update as compiled
machine code: the same problem arrays (:class:`~bam_ppl.infer.gibbs.collapsed.GibbsProblem`), the same
urn conditional (Cemgil et al. 2019 eq. 4.1 with the token's own increments removed, eq. 4.4), the same
tie and missing-entry handling; only the random streams differ (a NumPy ``Generator`` per chain,
seeded from the JAX key). numba is an optional dependency (extra ``fast``); without it
``HAVE_NUMBA`` is False and the JAX kernel is used.

Two sweeps share the state. ``_place_tokens`` handles every model (ties, missing entries,
several free nodes, log-space weights) and also places the tokens at initialisation.
``_sweep_factorised`` is the sweep of the common case where every factor of the weights reads
consecutive entries (one free node: NMF, LDA, CP, and every model whose families all contain
the free node): the factors whose entries do not depend on the token's cell (the latent node's
own counts, the column counts of its children) are kept as one product per configuration and
updated for the two configurations a token leaves and enters, and each token's row starts and
configuration sit in one record, so that a token in random order costs one cache miss for its
bookkeeping.
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
from ..kernels import log_urn_weights as _log_urn_weights
from ..kernels import multiply_rows as _multiply_rows
from ..kernels import row_kinds as _row_kinds
from ..kernels import seeded_generator as _seeded
from ..kernels import shuffle as _shuffle
from ..kernels import unrolled as _unrolled

# What a call of the kernel does with each token.
SWEEP = 0  # remove the token's increments, redraw its configuration, add them back
URN = 1  # add the token, drawn from the urn given the tokens placed so far (Cemgil et al. 2019 §4.2)
UNIFORM = 2  # add the token with a configuration drawn uniformly among those its cell allows


class UrnRows(NamedTuple):
    """The tokens' cells and the rows of the urn weights, as :func:`_place_tokens` reads them."""

    token_cell: np.ndarray  # (T,) int32
    row_base: np.ndarray  # (R, U): first entry of row r at cell u
    row_offset: np.ndarray  # (R, L): offset of configuration l in row r
    valid: np.ndarray  # (U, L) bool: the configurations each cell allows
    numerator_rows: np.ndarray  # rows whose entries multiply the weights
    denominator_rows: np.ndarray  # rows whose entries divide them
    tie_rows: np.ndarray  # tie_rows[k] reads the table of an earlier member tie_earlier[k]
    tie_earlier: np.ndarray
    moved: np.ndarray  # rows a token's configuration increments
    log_space: bool  # weights summed as logs: products could leave the float64 range
    has_valid: bool  # some cell restricts the configurations


def urn_rows(spec, token_cell, row_base, row_offset, valid, log_space: bool) -> UrnRows:
    """The :class:`UrnRows` of a :class:`~bam_ppl.infer.gibbs.collapsed.GibbsSpec` with its arrays
    (``row_base`` and ``row_offset`` in the numbering of the count vector the kernel reads)."""
    as_rows = lambda rows: np.asarray(rows, np.int64).reshape(-1)  # noqa: E731
    return UrnRows(
        np.asarray(token_cell), np.asarray(row_base), np.asarray(row_offset), np.asarray(valid, np.bool_),
        as_rows(spec.numerator_rows), as_rows(spec.denominator_rows),
        as_rows([row for row, _ in spec.ties]), as_rows([earlier for _, earlier in spec.ties]),
        as_rows(spec.moved), bool(log_space), bool(spec.has_valid),
    )


def _place_tokens(rng, mode, num_sweeps, shuffle, shifted, config, order, rows):
    """``num_sweeps`` passes over the tokens of one chain, in place; ``rows`` is an :class:`UrnRows`.

    The counts are carried as ``shifted`` = concentration + counts (float64), so that each
    factor of the urn weights costs one load; the caller recovers the integer counts by
    rounding (±1 steps on numbers far below 2**52 stay within rounding error of an integer
    offset of the concentration). ``order`` is reshuffled
    (Fisher–Yates) before each pass when ``shuffle``. Each token's configuration is drawn by
    inverse CDF with one uniform from ``rng``. The weights are built one row at a time over all
    configurations, loops the compiler can vectorise.
    """
    token_cell, row_base, row_offset, valid, moved = rows.token_cell, rows.row_base, rows.row_offset, rows.valid, rows.moved
    num_rows = row_base.shape[0]
    num_configs = row_offset.shape[1]
    logs = rows.log_space and mode != UNIFORM
    base = np.empty(num_rows, np.int64)
    values = np.empty(num_configs)
    denominator = np.empty(num_configs)
    weight = np.empty(num_configs)
    kinds = _row_kinds(rows)
    total = 0.0
    for _ in range(num_sweeps):
        if shuffle:
            _shuffle(rng, order)
        for position in range(order.shape[0]):
            token = order[position]
            cell = token_cell[token]
            for r in range(num_rows):
                base[r] = row_base[r, cell]
            if mode == SWEEP:
                old = config[token]
                for m in moved:
                    shifted[base[m] + row_offset[m, old]] -= 1.0
            if mode == UNIFORM:
                weight[:] = 1.0
            elif logs:
                _log_urn_weights(weight, values, shifted, base, rows)
            else:
                weight[:] = 1.0
                denominator[:] = 1.0
                _multiply_rows(weight, values, shifted, base, rows, kinds, rows.numerator_rows)
                _multiply_rows(denominator, values, shifted, base, rows, kinds, rows.denominator_rows)
                total = 0.0
                for c in range(num_configs):
                    weight[c] /= denominator[c]
                    total += weight[c]
            if rows.has_valid or logs or mode == UNIFORM:
                if rows.has_valid:
                    for c in range(num_configs):
                        if not valid[cell, c]:
                            weight[c] = -np.inf if logs else 0.0
                if logs:
                    largest = weight.max()
                    for c in range(num_configs):
                        weight[c] = math.exp(weight[c] - largest)
                total = weight.sum()
            new = _inverse_cdf(weight, rng.random() * total)
            for m in moved:
                shifted[base[m] + row_offset[m, new]] += 1.0
            config[token] = new


def _constant_factor(shifted, numerator_starts, denominator_starts, c, removed):
    """Product over the cell-independent rows of the weight of configuration ``c``: one division; with
    ``removed`` (1.0 or 0.0) that many tokens fewer at each entry, read without writing."""
    top = 1.0
    for start in numerator_starts:
        top *= shifted[start + c] - removed
    bottom = 1.0
    for start in denominator_starts:
        bottom *= shifted[start + c] - removed
    return top / bottom


def _sweep_factorised(rng, num_sweeps, shuffle, shifted, tokens, order, rows):
    """``num_sweeps`` Gibbs sweeps of one chain, in place, when every row reads consecutive entries.

    The weight of configuration c (eq. 4.1 with the token removed, eq. 4.4) is factor[c], the product
    over the rows every token reads at one place (``rows``: :class:`FactorisedRows`), times the token's
    varying numerator rows over its varying denominator rows; ``tokens[t]`` = (configuration, start of
    each varying row at t's cell). ``rng`` is consumed as :func:`_place_tokens` does. The token's own
    configuration reads its entries less one (exact on concentration + count), so a token that stays
    writes nothing and the draws are those of taking it out and putting it back.
    """
    num_configs, num_varying_numerators = rows.num_configs, rows.num_varying_numerators
    numerator_starts, denominator_starts = rows.numerator_starts, rows.denominator_starts
    num_varying = tokens.shape[1] - 1
    factor = np.empty(num_configs)
    for c in range(num_configs):
        factor[c] = _constant_factor(shifted, numerator_starts, denominator_starts, c, 0.0)
    weight = np.empty(num_configs)
    for _ in range(num_sweeps):
        if shuffle:
            _shuffle(rng, order)
        for position in range(order.shape[0]):
            token = order[position]
            old = tokens[token, 0]
            left = _constant_factor(shifted, numerator_starts, denominator_starts, old, 1.0)
            if num_varying == 2 and num_varying_numerators == 2:  # NMF, LDA: one fused loop
                first, second = tokens[token, 1], tokens[token, 2]
                for c in range(num_configs):
                    weight[c] = factor[c] * shifted[first + c] * shifted[second + c]
                weight[old] = left * (shifted[first + old] - 1.0) * (shifted[second + old] - 1.0)
            else:
                for c in range(num_configs):  # not weight[:] = factor: numba's shape checks take seconds to compile
                    weight[c] = factor[c]
                weight[old] = left
                for v in range(num_varying):
                    start = tokens[token, 1 + v]
                    if v < num_varying_numerators:
                        for c in range(num_configs):
                            weight[c] *= shifted[start + c] - (1.0 if c == old else 0.0)
                    else:
                        for c in range(num_configs):
                            weight[c] /= shifted[start + c] - (1.0 if c == old else 0.0)
            total = 0.0
            for c in range(num_configs):
                total += weight[c]
            new = _inverse_cdf(weight, rng.random() * total)
            if new == old:
                continue
            for v in range(1, num_varying + 1):
                shifted[tokens[token, v] + old] -= 1.0
                shifted[tokens[token, v] + new] += 1.0
            _move_constant(shifted, numerator_starts, denominator_starts, old, new)
            factor[old] = left
            factor[new] = _constant_factor(shifted, numerator_starts, denominator_starts, new, 0.0)
            tokens[token, 0] = new


def _tied_constant_factor(shifted, rows, c, removed):
    """The constant rows' factor at configuration c (numerators over denominators) where tied members read one
    entry: the k-th of a run of m rows at one start reads x + k, less the token's m increments where ``removed``."""
    top, bottom = 1.0, 1.0
    for j in range(rows.constant_starts.shape[0]):
        value = shifted[rows.constant_starts[j] + c] + rows.constant_rank[j] - removed * rows.constant_run[j]
        if j < rows.constant_ends:
            top *= value
        else:
            bottom *= value
    return top / bottom


def _sweep_tied(rng, num_sweeps, shuffle, shifted, tokens, order, rows):
    """:func:`_sweep_factorised`'s fused case where the token's two varying rows read one table (symmetric
    NMF: tied members, Cemgil et al. 2019 eq. 4.4 with the second member's increment after the first's): at a
    cell whose two entries coincide they read x (x + 1), and the constant rows read one more for each earlier
    member at their entry (:func:`_tied_constant_factor`). The same draws as :func:`_place_tokens`."""
    num_configs, starts = rows.num_configs, rows.constant_starts
    factor = np.empty(num_configs)
    for c in range(num_configs):
        factor[c] = _tied_constant_factor(shifted, rows, c, 0.0)
    weight = np.empty(num_configs)
    for _ in range(num_sweeps):
        if shuffle:
            _shuffle(rng, order)
        for position in range(order.shape[0]):
            token = order[position]
            old, first, second = tokens[token, 0], tokens[token, 1], tokens[token, 2]
            left = _tied_constant_factor(shifted, rows, old, 1.0)
            both = 1.0 if first == second else 0.0  # the second member reads the first's increment
            for c in range(num_configs):
                weight[c] = factor[c] * shifted[first + c] * (shifted[second + c] + both)
            weight[old] = left * (shifted[first + old] - 1.0 - both) * (shifted[second + old] - 1.0)
            total = 0.0
            for c in range(num_configs):
                total += weight[c]
            new = _inverse_cdf(weight, rng.random() * total)
            if new == old:
                continue
            for v in (first, second):
                shifted[v + old] -= 1.0
                shifted[v + new] += 1.0
            for j in range(starts.shape[0]):
                shifted[starts[j] + old] -= 1.0
                shifted[starts[j] + new] += 1.0
            factor[old] = left
            factor[new] = _tied_constant_factor(shifted, rows, new, 0.0)
            tokens[token, 0] = new


def _sweep_fused_pair(rngs, num_sweeps, shifted, tokens, order, rows):
    """:func:`_sweep_factorised`'s fused case (two varying numerator rows: NMF, LDA) for two chains at once
    (``rngs``, ``shifted``, ``tokens``: pairs), in a fixed ``order``: each chain's draws are those it makes
    alone, but the core updates one chain's token while the other's waits on its loads and writes (the
    updates of one chain depend each on the last). Written out for both chains: a helper function or a
    loop over the pair ran at a third of the speed."""
    (rng_a, rng_b), (counts_a, counts_b), (records_a, records_b) = rngs, shifted, tokens
    numerator_starts, denominator_starts = rows.numerator_starts, rows.denominator_starts
    factor_a, factor_b = np.empty(rows.num_configs), np.empty(rows.num_configs)
    weight_a, weight_b = np.empty(rows.num_configs), np.empty(rows.num_configs)
    for c in range(rows.num_configs):
        factor_a[c] = _constant_factor(counts_a, numerator_starts, denominator_starts, c, 0.0)
        factor_b[c] = _constant_factor(counts_b, numerator_starts, denominator_starts, c, 0.0)
    for _ in range(num_sweeps):
        for position in range(order.shape[0]):
            token = order[position]
            old_a, first_a, second_a = records_a[token, 0], records_a[token, 1], records_a[token, 2]
            old_b, first_b, second_b = records_b[token, 0], records_b[token, 1], records_b[token, 2]
            left_a = _constant_factor(counts_a, numerator_starts, denominator_starts, old_a, 1.0)
            left_b = _constant_factor(counts_b, numerator_starts, denominator_starts, old_b, 1.0)
            for c in range(rows.num_configs):
                weight_a[c] = factor_a[c] * counts_a[first_a + c] * counts_a[second_a + c]
                weight_b[c] = factor_b[c] * counts_b[first_b + c] * counts_b[second_b + c]
            weight_a[old_a] = left_a * (counts_a[first_a + old_a] - 1.0) * (counts_a[second_a + old_a] - 1.0)
            weight_b[old_b] = left_b * (counts_b[first_b + old_b] - 1.0) * (counts_b[second_b + old_b] - 1.0)
            total_a, total_b = 0.0, 0.0
            for c in range(rows.num_configs):
                total_a += weight_a[c]
                total_b += weight_b[c]
            new_a = _inverse_cdf(weight_a, rng_a.random() * total_a)
            new_b = _inverse_cdf(weight_b, rng_b.random() * total_b)
            if new_a != old_a:
                _move(counts_a, first_a, second_a, numerator_starts, denominator_starts, old_a, new_a)
                factor_a[old_a] = left_a
                factor_a[new_a] = _constant_factor(counts_a, numerator_starts, denominator_starts, new_a, 0.0)
                records_a[token, 0] = new_a
            if new_b != old_b:
                _move(counts_b, first_b, second_b, numerator_starts, denominator_starts, old_b, new_b)
                factor_b[old_b] = left_b
                factor_b[new_b] = _constant_factor(counts_b, numerator_starts, denominator_starts, new_b, 0.0)
                records_b[token, 0] = new_b


def _move(counts, first, second, numerator_starts, denominator_starts, old, new):
    """A token's increments moved from configuration ``old`` to ``new`` (:func:`_sweep_fused_pair`)."""
    counts[first + old] -= 1.0
    counts[first + new] += 1.0
    counts[second + old] -= 1.0
    counts[second + new] += 1.0
    _move_constant(counts, numerator_starts, denominator_starts, old, new)


def _move_constant(counts, numerator_starts, denominator_starts, old, new):
    """The increments of the rows every token reads at one place moved from ``old`` to ``new``."""
    for start in numerator_starts:
        counts[start + old] -= 1.0
        counts[start + new] += 1.0
    for start in denominator_starts:
        counts[start + old] -= 1.0
        counts[start + new] += 1.0


class FactorisedRows(NamedTuple):
    """The rows of the urn weights in the form :func:`_sweep_factorised` (or, tied, :func:`_sweep_tied`) reads."""

    token_starts: np.ndarray  # (T, V) int32: start of each varying row at each token's cell
    num_configs: int
    num_varying_numerators: int
    numerator_starts: tuple | np.ndarray  # starts of the numerator rows every token reads at one place
    denominator_starts: tuple | np.ndarray  # (kernels.unrolled)
    # Tied members (:func:`_sweep_tied`): the constant rows' starts (numerators, then denominators from
    # ``constant_ends``), each row's rank among the rows at its start and their number.
    tied: bool = False
    constant_starts: np.ndarray = np.zeros(0, np.int64)
    constant_ends: int = 0
    constant_rank: np.ndarray = np.zeros(0)
    constant_run: np.ndarray = np.zeros(0)


def token_entries(row_base, row_offset, rows, token_cell, dtype=np.int64) -> np.ndarray:
    """(T, len(rows), L): the entry that each token reads in each of ``rows`` at each configuration
    (the kernels' per-token indices where rows do not read consecutive entries)."""
    rows = np.asarray(rows, np.int64).reshape(-1)
    index = row_base[rows][:, token_cell][:, :, None] + row_offset[rows][:, None, :]  # (R, T, L)
    return np.ascontiguousarray(index.transpose(1, 0, 2), dtype).reshape(len(token_cell), rows.size, row_offset.shape[1])


def factorised_rows(rows: UrnRows, concentration, num_tokens):
    """:class:`FactorisedRows` of a problem, or None when :func:`_sweep_factorised` does not apply.

    It applies when no cell restricts the configurations, every row reads consecutive entries (after
    :func:`contiguous_relabelling`), no partial product of the weights can leave the float64 range and
    no members are tied, or the ties are symmetric NMF's (:func:`_tied_rows`).
    """
    token_cell, row_base, row_offset = rows.token_cell, rows.row_base, rows.row_offset
    num_configs = row_offset.shape[1]
    consecutive = np.all(row_offset == row_offset[:, :1] + np.arange(num_configs))
    numerator_rows, denominator_rows = list(rows.numerator_rows), list(rows.denominator_rows)
    every = numerator_rows + denominator_rows
    if (not every or rows.has_valid or not consecutive or sorted(rows.moved) != sorted(every)):
        return None  # no rows: nothing is free (a latent-free model), the general sweep is a no-op
    # Every factor lies in [α_min, α_max + T]; a partial product of all of them stays within
    # 10**±300 when each does within 10**±(300 / number of factors).
    exponents = np.abs(np.log10([concentration.min(), concentration.max() + num_tokens]))
    if len(every) * exponents.max() + np.log10(num_configs) > 300:
        return None
    starts = row_base + row_offset[:, :1]  # (R, U)
    if starts.max() + num_configs >= 2**31:  # the token records are int32
        return None
    constant = np.all(starts == starts[:, :1], axis=1)
    varying_numerators = [r for r in numerator_rows if not constant[r]]
    varying = varying_numerators + [r for r in denominator_rows if not constant[r]]
    constant_starts = lambda group: _unrolled([starts[r, 0] for r in group if constant[r]])  # noqa: E731
    if rows.tie_rows.size:
        return _tied_rows(rows, starts, constant, varying, numerator_rows, denominator_rows, token_cell, num_configs)
    return FactorisedRows(
        token_starts=np.ascontiguousarray(starts[varying][:, token_cell].T, dtype=np.int32),
        num_configs=num_configs,
        num_varying_numerators=len(varying_numerators),
        numerator_starts=constant_starts(numerator_rows),
        denominator_starts=constant_starts(denominator_rows),
    )


def _tied_rows(rows: UrnRows, starts, constant, varying, numerator_rows, denominator_rows, token_cell,
               num_configs) -> FactorisedRows | None:
    """:class:`FactorisedRows` for :func:`_sweep_tied` where the ties are symmetric NMF's: two varying numerator
    rows that may read one table, and constant rows tied only to constant rows of their group at their start;
    else None."""
    groups = {r: g for g, group in enumerate((numerator_rows, denominator_rows)) for r in group}
    fixed = [r for r in numerator_rows if constant[r]] + [r for r in denominator_rows if constant[r]]
    pairs = list(zip(rows.tie_rows.tolist(), rows.tie_earlier.tolist()))
    varying_pair = len(varying) == 2 and all(r in numerator_rows for r in varying)
    allowed = all(sorted((r, e)) == sorted(varying) or (constant[r] and constant[e] and groups[r] == groups[e]
                                                          and starts[r, 0] == starts[e, 0]) for r, e in pairs)
    if not (varying_pair and allowed):
        return None
    at = [int(starts[r, 0]) for r in fixed]
    key = [(groups[r], a) for r, a in zip(fixed, at)]
    rank = [key[:j].count(key[j]) for j in range(len(key))]
    return FactorisedRows(
        token_starts=np.ascontiguousarray(starts[varying][:, token_cell].T, dtype=np.int32),
        num_configs=num_configs, num_varying_numerators=2, numerator_starts=(), denominator_starts=(), tied=True,
        constant_starts=np.array(at, np.int64), constant_ends=sum(constant[r] for r in numerator_rows),
        constant_rank=np.array(rank, np.float64), constant_run=np.array([key.count(k) for k in key], np.float64))


def gibbs_sweeps(rng, num_sweeps: int, shuffle: bool, shifted, config, order, rows: UrnRows,
                 factorised: FactorisedRows | None) -> None:
    """``num_sweeps`` collapsed-Gibbs sweeps of one chain in place (``shifted`` = concentration +
    counts, ``config`` the tokens' configurations): :func:`_sweep_factorised` where ``factorised``
    (from :func:`factorised_rows`) applies, else :func:`_place_tokens`."""
    if factorised is None:
        _place_tokens(rng, SWEEP, num_sweeps, shuffle, shifted, config, order, rows)
        return
    tokens = np.empty((factorised.token_starts.shape[0], 1 + factorised.token_starts.shape[1]), np.int32)
    tokens[:, 0], tokens[:, 1:] = config, factorised.token_starts
    if factorised.tied:
        _sweep_tied(rng, num_sweeps, shuffle, shifted, tokens, order, factorised)
    else:
        _sweep_factorised(rng, num_sweeps, shuffle, shifted, tokens, order, factorised)
    config[:] = tokens[:, 0]



def is_fused(factorised: FactorisedRows | None) -> bool:
    """Whether :func:`gibbs_sweeps_pair` sweeps two chains of rows ``factorised`` in one kernel (NMF, LDA)."""
    return (factorised is not None and not factorised.tied and factorised.token_starts.shape[1] == 2
            and factorised.num_varying_numerators == 2)


def gibbs_sweeps_pair(rngs, num_sweeps: int, shifted, configs, order, factorised: FactorisedRows) -> None:
    """:func:`gibbs_sweeps` of two chains (``rngs``, ``shifted``, ``configs``: pairs) on the same rows, in the
    fixed ``order``, in one kernel (:func:`_sweep_fused_pair`, where :func:`is_fused`): the same draws."""
    records = []
    for config in configs:
        tokens = np.empty((config.shape[0], 3), np.int32)
        tokens[:, 0], tokens[:, 1:] = config, factorised.token_starts
        records.append(tokens)
    _sweep_fused_pair(tuple(rngs), num_sweeps, tuple(shifted), tuple(records), order, factorised)
    for config, tokens in zip(configs, records):
        config[:] = tokens[:, 0]

if HAVE_NUMBA:
    # nogil: chains run in threads, each with its own Generator and arrays.
    _place_tokens = numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)(_place_tokens)
    _constant_factor = numba.njit(inline="always", cache=True)(_constant_factor)
    _sweep_factorised = numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)(_sweep_factorised)
    _move_constant = numba.njit(inline="always", cache=True)(_move_constant)
    _move = numba.njit(inline="always", cache=True)(_move)
    _sweep_fused_pair = numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)(_sweep_fused_pair)
    _tied_constant_factor = numba.njit(inline="always", cache=True)(_tied_constant_factor)
    _sweep_tied = numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)(_sweep_tied)


def contiguous_relabelling(row_base, row_offset, size):
    """A relabelling of the count vector that puts the entries one token reads side by side.

    For LDA the topic–word entries of one word, read for every topic, lie a whole vocabulary
    apart in the ``(*parents, child)`` layout; the kernel then waits on a cache miss per
    configuration. Entries are renumbered in order of first use by (row, distinct base,
    configuration), so that one token's reads of a row are consecutive. The relabelling is
    kept only if every row still reads ``new_base[cell] + new_offset[configuration]``;
    otherwise the identity is returned.

    Returns
    -------
    new_of_old : (size,) int array
        New position of every entry.
    row_base, row_offset : arrays
        The rows in the new numbering.
    """
    touched = [(np.unique(bases)[:, None] + offsets[None, :]).reshape(-1)
               for bases, offsets in zip(row_base, row_offset)]
    touched = np.concatenate(touched + [np.arange(size)])  # untouched entries keep their order, last
    _, first = np.unique(touched, return_index=True)
    old_in_new_order = touched[np.sort(first)]
    new_of_old = np.empty(size, np.int64)
    new_of_old[old_in_new_order] = np.arange(size)
    new_index = new_of_old[row_base[:, :, None] + row_offset[:, None, :]]  # (R, U, L)
    new_offset = new_index[:, 0, :] - new_index[:, 0, :1]
    new_base = new_index[:, :, 0]
    if not np.array_equal(new_index, new_base[:, :, None] + new_offset[:, None, :]):
        return np.arange(size), row_base, row_offset
    return new_of_old, new_base.astype(np.int32), new_offset.astype(np.int32)


class NumbaChains:
    """Every chain's allocation as NumPy arrays, advanced by the numba kernel.

    Chain c draws from its own Generator seeded by ``sweep_keys[c]`` (its initial allocation
    from ``init_keys[c]``), so results do not depend on how the chains share the CPU cores:
    in parallel threads (the kernel releases the GIL) or one after another.

    Parameters
    ----------
    spec, problem : GibbsSpec, GibbsProblem
        From :func:`bam_ppl.infer.gibbs.collapsed.build_problem`.
    init_keys, sweep_keys : array (num_chains, 2) uint32
        Raw JAX keys of each chain's initial allocation and of its sweeps.
    init_method : {"urn", "uniform"}
    parallel : bool
        Run the chains in up to ``os.cpu_count()`` threads rather than one after another.
    factorised : bool
        Sweep with :func:`_sweep_factorised` where it applies (see :func:`factorised_rows`);
        False always uses the general :func:`_place_tokens`. Both draw the same allocations
        from the same keys, up to floating-point rounding of the weights.
    """

    def __init__(self, spec, problem, init_keys, sweep_keys, init_method: str, parallel: bool = True,
                 factorised: bool = True):
        num_chains = len(sweep_keys)
        num_tokens = problem.token_cell.shape[0]
        self.num_chains = num_chains
        self.shuffle = spec.token_order == "random"
        concentration = np.asarray(problem.concentration, np.float64)
        self._new_of_old, row_base, row_offset = contiguous_relabelling(
            np.asarray(problem.row_base, np.int64), np.asarray(problem.row_offset, np.int64), concentration.size)
        self.concentration = np.empty_like(concentration)
        self.concentration[self._new_of_old] = concentration
        self.rows = urn_rows(spec, np.asarray(problem.token_cell, np.int32), row_base, row_offset, problem.valid,
                             spec.log_space)
        fixed_counts = np.empty(concentration.size, np.int32)
        fixed_counts[self._new_of_old] = problem.fixed_counts
        self._counts = np.tile(fixed_counts, (num_chains, 1))  # in the kernel's numbering
        self.config = np.zeros((num_chains, num_tokens), np.int32)
        self.orders = np.tile(np.arange(num_tokens, dtype=np.int32), (num_chains, 1))
        self.rngs = [_seeded(key) for key in sweep_keys]
        self._factorised = factorised_rows(self.rows, self.concentration, num_tokens) if factorised else None
        self._pool = ThreadPoolExecutor(max_workers=min(num_chains, os.cpu_count() or 1) if parallel else 1)
        # The urn initialisation visits the tokens in random order, whatever the sweep order.
        init_orders = np.tile(np.arange(num_tokens, dtype=np.int32), (num_chains, 1))
        mode = URN if init_method == "urn" else UNIFORM
        self._each_chain([_seeded(key) for key in init_keys], mode, 1, mode == URN, init_orders)

    @property
    def counts(self) -> np.ndarray:
        """(num_chains, F + C) table and column counts in the layout of :class:`GibbsState`."""
        return self._counts[:, self._new_of_old]

    def advance(self, num_sweeps: int) -> None:
        """``num_sweeps`` Gibbs sweeps of every chain."""
        self._on_each_chain(lambda chain, shifted: gibbs_sweeps(
            self.rngs[chain], num_sweeps, self.shuffle, shifted, self.config[chain], self.orders[chain], self.rows,
            self._factorised))

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown()

    def _each_chain(self, rngs, mode, num_sweeps, shuffle, orders):
        self._on_each_chain(lambda chain, shifted: _place_tokens(
            rngs[chain], mode, num_sweeps, shuffle, shifted, self.config[chain], orders[chain], self.rows))

    def _on_each_chain(self, place):
        """Runs ``place(chain, shifted)`` on every chain, with shifted = concentration + counts."""
        def one(chain):
            shifted = self.concentration + self._counts[chain]
            place(chain, shifted)
            self._counts[chain] = np.rint(shifted - self.concentration)

        if self.num_chains == 1:
            one(0)
        else:
            list(self._pool.map(one, range(self.num_chains)))
