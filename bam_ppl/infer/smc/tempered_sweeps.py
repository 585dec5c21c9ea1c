"""The tempered SMC's Gibbs sweeps where a token's weights factorise (:class:`~bam_ppl.infer.smc.tempered_problem.FactorisedTempered`,
numba): every row reads consecutive entries from its start at the token's cell, the rows that every
token reads at the same place are cached per configuration, and, where every entry of a row starts
from one value, each factor is read from a table over the count instead of one log and one exp per
configuration. The general kernel and the particles: :mod:`~bam_ppl.infer.smc.tempered_numba`."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..kernels import FASTMATH, compile_numba, inverse_cdf

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None


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


def _draw(rng, weight):
    """A configuration drawn with probability ∝ ``weight``."""
    total = 0.0
    for c in range(weight.shape[0]):
        total += weight[c]
    return inverse_cdf(weight, rng.random() * total)


def _constant_product(counts, starts, first, stop, c):
    product = 1.0
    for k in range(first, stop):
        product *= counts[starts[k] + c]
    return product


def _set_constant(counts, starts, ends, c, lat, vis):
    """lat[c], vis[c]: the constant rows' factors of configuration c (FactorisedTempered's groups)."""
    lat[c] = _constant_product(counts, starts, 0, ends[0], c) / _constant_product(counts, starts, ends[0], ends[1], c)
    vis[c] = _constant_product(counts, starts, ends[1], ends[2], c) / _constant_product(counts, starts, ends[2], ends[3], c)


def _shift_factorised(counts, token_starts, token, constant_starts, c, step):
    for v in range(token_starts.shape[1]):
        counts[token_starts[token, v] + c] += step
    for start in constant_starts:
        counts[start + c] += step


def _factorised_factors(counts, token_starts, varying_ends, token, constant_lat, constant_vis, lat, vis):
    """lat, vis (L,) of ``token`` (removed from ``counts``): the constant rows' cached products times
    its varying rows, read from their starts at its cell (:class:`~bam_ppl.infer.smc.tempered_problem.FactorisedTempered`)."""
    num_configs = lat.shape[0]
    for c in range(num_configs):
        lat[c] = constant_lat[c]
        vis[c] = constant_vis[c]
    for v in range(varying_ends[3]):
        first = token_starts[token, v]
        if v < varying_ends[0]:
            for c in range(num_configs):
                lat[c] *= counts[first + c]
        elif v < varying_ends[1]:
            for c in range(num_configs):
                lat[c] /= counts[first + c]
        elif v < varying_ends[2]:
            for c in range(num_configs):
                vis[c] *= counts[first + c]
        else:
            for c in range(num_configs):
                vis[c] /= counts[first + c]


def _sweeps_factorised(rng, moves, particle, layout, st, scratch):
    """``moves.num_sweeps`` Gibbs sweeps of one :class:`OneParticle` targeting π_β (``moves``: a
    :class:`~bam_ppl.infer.smc.tempered_numba.Moves`), in token order, as the _SWEEP pass of
    :func:`_tempered_block` does them (the same weights, draws and log terms, ``rng`` consumed
    alike) where ``factorised`` (:class:`~bam_ppl.infer.smc.tempered_problem.FactorisedTempered`) is usable and the start is π₀ or a
    reference: the constant rows' products are cached per configuration and updated as a token
    leaves and joins, and each token reads only its varying rows (NMF(4): two of five), each from
    its start at the token's cell."""
    counts, conf, logs = particle
    f, constant_starts = layout.factorised, layout.constant_starts
    token_starts, varying_ends, constant_ends = f.token_starts, f.varying_ends, f.constant_ends
    token_cell, referenced, log_reference = layout.token_cell, st.referenced, st.log_reference
    _, lat, vis, start, weight = scratch
    num_configs = weight.shape[0]
    num_tokens = token_cell.shape[0]
    constant_lat, constant_vis = np.empty(num_configs), np.empty(num_configs)
    for c in range(num_configs):
        _set_constant(counts, constant_starts, constant_ends, c, constant_lat, constant_vis)
    for _ in range(moves.num_sweeps):
        for token in range(num_tokens):
            old = conf[token]
            _shift_factorised(counts, token_starts, token, constant_starts, old, -1.0)
            _set_constant(counts, constant_starts, constant_ends, old, constant_lat, constant_vis)
            _factorised_factors(counts, token_starts, varying_ends, token, constant_lat, constant_vis, lat, vis)
            cell = token_cell[token]
            for c in range(num_configs):
                if referenced:
                    start[c] = log_reference[cell, c]
                weight[c] = _linear_weight(lat, vis, start, c, moves.beta, referenced)
            new = _draw(rng, weight)
            _shift_factorised(counts, token_starts, token, constant_starts, new, 1.0)
            _set_constant(counts, constant_starts, constant_ends, new, constant_lat, constant_vis)
            conf[token] = new
            if new != old:
                logs[0] += math.log(lat[new] / lat[old])
                logs[1] += math.log(vis[new] / vis[old])
                logs[2] += start[new] - start[old]


class RowTables(NamedTuple):
    """A tempered sweep's factors as tables over the count n of an entry, so that a token's weights
    need no log or exp (:func:`_sweeps_tabulated`); rows: the varying ones, then the constant ones
    (:class:`~bam_ppl.infer.smc.tempered_problem.FactorisedTempered`). ``power[r, n]`` = (b_r + n)^(±e_r),
    e_r = β (1 on a latent row of an untilted path), − on a denominator; ``start[u, c]`` = q(u, c)^(1−β)
    of a reference (ones untilted); ``log_gamma[r, n]`` = ±Σ_(m<n) log(b_r + m) = ±log Γ(b_r + n)/Γ(b_r),
    the row's share of log π₀ or log L at count n."""

    power: np.ndarray
    start: np.ndarray
    latent: np.ndarray  # (rows,) bool: a latent table's row, whose factors are π₀'s
    log_gamma: np.ndarray


def _start_powers(beta, st, wanted):
    """(U, L) q(u, c)^(1−β) of the reference, or ones (1, L) without one or unless ``wanted``."""
    referenced = st.referenced and wanted
    start = np.ones((st.log_reference.shape[0] if referenced else 1, st.row_offset.shape[1]))
    for u in range(start.shape[0] if referenced else 0):
        for c in range(start.shape[1]):
            start[u, c] = math.exp((1.0 - beta) * st.log_reference[u, c])
    return start


def _row_tables(beta, layout, f, st, wanted):
    """:class:`RowTables` of the factorised rows ``f`` at ``beta`` (counts of at most T tokens), the start's
    powers left out (:func:`_start_powers`); empty unless ``wanted``."""
    num_varying = f.token_starts.shape[1]
    base = np.concatenate((f.token_base, f.constant_base)) if wanted else np.zeros(0)
    power = np.empty((base.shape[0], layout.token_cell.shape[0] + 1))
    log_gamma = np.zeros_like(power)
    latent = np.zeros(base.shape[0], np.bool_)
    for r in range(base.shape[0]):
        ends = f.varying_ends if r < num_varying else f.constant_ends
        k = r if r < num_varying else r - num_varying
        group = 0 if k < ends[0] else 1 if k < ends[1] else 2 if k < ends[2] else 3
        sign = 1.0 if group % 2 == 0 else -1.0
        exponent = beta if st.referenced or group >= 2 else 1.0
        latent[r] = group < 2
        for n in range(power.shape[1]):
            log = sign * math.log(base[r] + n)
            power[r, n] = math.exp(exponent * log)
            if n + 1 < power.shape[1]:
                log_gamma[r, n + 1] = log_gamma[r, n] + log
    return RowTables(power, np.ones((1, 1)), latent, log_gamma)


def _tables_pay(layout, f, st, num_sweeps):
    """Whether :func:`_sweeps_tabulated` applies to the factorised rows ``f`` and its tables cost fewer
    logs and exps than ``num_sweeps`` sweeps (of all the particles of a block) would compute without them."""
    num_tokens, num_configs = layout.token_cell.shape[0], st.row_offset.shape[1]
    table_size = (f.token_base.shape[0] + f.constant_base.shape[0]) * (num_tokens + 1) + st.log_reference.size
    return f.tabulated and table_size <= num_sweeps * num_tokens * num_configs


def _constant_power(n, starts, power, first_row, c, removed):
    """The constant rows' factor of configuration c, read from the tables (their rows from ``first_row`` on)
    at the token counts ``n`` less ``removed``, the rows' starts a tuple (:func:`~bam_ppl.infer.kernels.unrolled`).
    It takes the arrays, not the NamedTuples that hold them: inlined twice per token, those made the sweep
    markedly slower (``benchmarks/tempered_baseline.py``)."""
    factor, row = 1.0, first_row
    for start in starts:
        factor *= power[row, n[start + c] - removed]
        row += 1
    return factor


def _log_gamma_change(n, before, f, tables, logs):
    """Add to ``logs`` the change of (log π₀, log L) from the token counts ``before`` a call's sweeps to
    ``n`` after them: per entry read (``f.entries``, of row ``f.entry_row``), its row's log Γ(b + n)/Γ(b)
    at the new count less at the old one. One sum per entry instead of one per move: the moves' logs telescope."""
    prior, like = 0.0, 0.0
    for i in range(f.entries.shape[0]):
        e, r = f.entries[i], f.entry_row[i]
        if n[e] != before[e]:
            change = tables.log_gamma[r, n[e]] - tables.log_gamma[r, before[e]]
            if tables.latent[r]:
                prior += change
            else:
                like += change
    logs[0] += prior
    logs[1] += like


def _token_counts(counts, f):
    """The number of tokens at every entry the rows read (``f.entries``, each starting from ``f.entry_base``),
    as integers indexed like ``counts``: the sweep reads its tables without a conversion per factor."""
    n = np.zeros(counts.shape[0], np.int64)
    for i in range(f.entries.shape[0]):
        n[f.entries[i]] = int(counts[f.entries[i]] - f.entry_base[i] + 0.5)
    return n


def _set_counts(counts, n, before, f):
    """The entries whose token count changed from ``before`` to ``n`` back into ``counts``, as base + count."""
    for i in range(f.entries.shape[0]):
        e = f.entries[i]
        if n[e] != before[e]:
            counts[e] = f.entry_base[i] + n[e]


def _sweeps_tabulated(rng, moves, particle, layout, st, tables, weight):
    """:func:`_sweeps_factorised` where every row is ``tabulated``: each factor of a token's weights,
    start^(1−β) (lat · vis)^β or lat · vis^β untilted, is read from ``tables`` (:func:`_row_tables`)
    at the entries' integer token counts instead of one log and one exp per configuration, and the
    change of log π₀ and log L from the counts at the end (:func:`_log_gamma_change`); the same
    draws, ``rng`` consumed alike, up to rounding."""
    counts, conf, logs = particle
    f, constant_starts = layout.factorised, layout.constant_starts
    token_starts = f.token_starts
    token_cell, referenced, log_reference = layout.token_cell, st.referenced, st.log_reference
    power, start = tables.power, tables.start
    num_configs = weight.shape[0]
    num_varying = token_starts.shape[1]
    n = _token_counts(counts, f)
    before = n.copy()
    constant = np.empty(num_configs)
    for c in range(num_configs):
        constant[c] = _constant_power(n, constant_starts, power, num_varying, c, 0)
    for _ in range(moves.num_sweeps):
        for token in range(token_cell.shape[0]):
            old = conf[token]
            cell = token_cell[token]
            # The token's own configuration reads its counts less one: a token that stays writes nothing.
            left = _constant_power(n, constant_starts, power, num_varying, old, 1)
            total = 0.0
            for c in range(num_configs):
                removed = 1 if c == old else 0
                w = start[cell if referenced else 0, c] * (left if removed else constant[c])
                for v in range(num_varying):
                    w *= power[v, n[token_starts[token, v] + c] - removed]
                weight[c] = w
                total += w
            new = inverse_cdf(weight, rng.random() * total)
            if new == old:
                continue
            if referenced:
                logs[2] += log_reference[cell, new] - log_reference[cell, old]
            _shift_factorised(n, token_starts, token, constant_starts, old, -1)
            _shift_factorised(n, token_starts, token, constant_starts, new, 1)
            constant[old] = left
            constant[new] = _constant_power(n, constant_starts, power, num_varying, new, 0)
            conf[token] = new
    _log_gamma_change(n, before, f, tables, logs)
    _set_counts(counts, n, before, f)


def _largest_count(st, num_tokens):
    """The most tokens' increments an entry can hold: one per token, and one more for each tie (a tied member
    of the token can add its increment at the same entry)."""
    return num_tokens * (1 + st.tie_rows.shape[0])


def _rows_tables_pay(layout, st, num_sweeps):
    """Whether :func:`_sweeps_rows_tabulated` applies (linear weights, every row from one value, an entry
    read by two rows only where they start from the same value) and its tables cost fewer logs and exps than
    ``num_sweeps`` sweeps would compute."""
    num_tokens, num_configs = layout.token_cell.shape[0], st.row_offset.shape[1]
    if st.log_space or st.entries.shape[0] == 0:
        return False
    for r in range(st.row_value.shape[0]):
        if np.isnan(st.row_value[r]):
            return False
    table_size = st.row_value.shape[0] * (_largest_count(st, num_tokens) + 1) + st.log_reference.size
    return table_size <= num_sweeps * num_tokens * num_configs


def _rows_tables(beta, st, num_tokens, wanted):
    """:class:`RowTables` over the problem's rows (kernel numbering) at ``beta``, for
    :func:`_sweeps_rows_tabulated`: a row outside the weights' four groups reads ones (its log 0);
    ``latent[r]`` whether row r is a latent table's; the start's powers left out (:func:`_start_powers`).
    Empty unless ``wanted``."""
    num_rows = st.row_value.shape[0] if wanted else 0
    largest = _largest_count(st, num_tokens)
    power = np.ones((num_rows, largest + 1))
    log_gamma = np.zeros_like(power)
    latent = np.zeros(num_rows, np.bool_)
    groups = (st.latent_numerators, st.latent_denominators, st.visible_numerators, st.visible_denominators)
    for group in range(4 if wanted else 0):
        sign = 1.0 if group % 2 == 0 else -1.0
        exponent = beta if st.referenced or group >= 2 else 1.0
        for r in groups[group]:
            latent[r] = group < 2
            for n in range(largest + 1):
                log = sign * math.log(st.row_value[r] + n)
                power[r, n] = math.exp(exponent * log)
                if n < largest:
                    log_gamma[r, n + 1] = log_gamma[r, n] + log
    return RowTables(power, np.ones((1, 1)), latent, log_gamma)


def _tied_rows_factor(power, n, base, row_offset, st, c):
    """The product of the rows' factors at configuration c read from ``power`` where members are tied: a tied
    row reads one more where an earlier member of the token has its increment at the same entry. Inlined into the
    sweep: called per configuration, it took symmetric NMF 2.2 times as long (benchmarks/README.md)."""
    w = 1.0
    for r in range(row_offset.shape[0]):
        entry = base[r] + row_offset[r, c]
        count = n[entry]
        if st.tied[r]:
            for tie in range(st.tie_rows.shape[0]):
                earlier = st.tie_earlier[tie]
                if st.tie_rows[tie] == r and base[earlier] + row_offset[earlier, c] == entry:
                    count += 1
        w *= power[r, count]
    return w


def _sweeps_rows_tabulated(rng, moves, particle, token_cell, st, tables, scratch):
    """``moves.num_sweeps`` Gibbs sweeps targeting π_β as the general kernel does them (``rng`` consumed alike,
    the same draws up to rounding) where the weights do not factorise (Tucker: rows of one latent node
    shared by many configurations), every factor read from ``tables`` (:func:`_rows_tables`) at the
    row's entry at the token's cell and configuration, counted in integers as in :func:`_sweeps_tabulated`;
    cells may restrict the configurations. A tied row reads one more where an earlier member of the token
    has its increment at the same entry (:func:`~bam_ppl.infer.smc.tempered_numba._row_value`)."""
    counts, conf, logs = particle
    row_base, row_offset, moved = st.row_base, st.row_offset, st.moved
    has_valid, valid, referenced, log_reference = st.has_valid, st.valid, st.referenced, st.log_reference
    num_ties = st.tie_rows.shape[0]
    power, start = tables.power, tables.start
    base, _, _, _, weight = scratch
    num_rows, num_configs = row_base.shape[0], weight.shape[0]
    n = _token_counts(counts, st)
    before = n.copy()
    for _ in range(moves.num_sweeps):
        for token in range(token_cell.shape[0]):
            cell = token_cell[token]
            old = conf[token]
            for r in range(num_rows):
                base[r] = row_base[r, cell]
            for m in moved:
                n[base[m] + row_offset[m, old]] -= 1
            total = 0.0
            for c in range(num_configs):
                w = 0.0
                if not has_valid or valid[cell, c]:
                    w = start[cell if referenced else 0, c]
                    if num_ties == 0:
                        for r in range(num_rows):
                            w *= power[r, n[base[r] + row_offset[r, c]]]
                    else:  # a branch of its own (a check per row made Tucker's sweep 4–10 % slower), inlined
                        w *= _tied_rows_factor(power, n, base, row_offset, st, c)
                weight[c] = w
                total += w
            new = inverse_cdf(weight, rng.random() * total)
            if referenced:
                logs[2] += log_reference[cell, new] - log_reference[cell, old]
            for m in moved:
                n[base[m] + row_offset[m, new]] += 1
            conf[token] = new
    _log_gamma_change(n, before, st, tables, logs)
    _set_counts(counts, n, before, st)


if numba is not None:
    # The small helpers are inlined into the sweeps; the sweeps release the GIL (particle blocks run in threads).
    compile_numba(globals(), inline=("_linear_weight", "_draw", "_largest_count", "_constant_product", "_set_constant", "_shift_factorised",
                                     "_factorised_factors", "_constant_power", "_log_gamma_change", "_token_counts",
                                     "_set_counts", "_tied_rows_factor"),
                  nogil=("_sweeps_factorised", "_start_powers", "_row_tables", "_tables_pay", "_rows_tables_pay", "_rows_tables"))
    # Tables leave no NaN or infinity to guard, and the order of a product of positive factors does not matter.
    _sweeps_tabulated = numba.njit(nogil=True, cache=True, fastmath=FASTMATH)(_sweeps_tabulated)
    _sweeps_rows_tabulated = numba.njit(nogil=True, cache=True, fastmath=FASTMATH)(_sweeps_rows_tabulated)
