"""The arrays of the tempered SMC (:mod:`bam_ppl.infer.smc.tempered`): :class:`TemperedProblem`, built
from a bound model and data, and the closed-form log terms of an allocation."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy.special import gammaln

from ...data import CountTensor
from ...models.allocation import BoundModel
from ..gibbs import collapsed_numba as gibbs_numba
from ..gibbs.collapsed import build_problem


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
    factorised: FactorisedTempered  # the rows as the sweep's fast path reads them (usable False: the general path)
    row_value: np.ndarray  # (rows,) the concentration plus fixed counts every entry of a row starts from (nan: not one)
    # Every entry the rows read, once, where each row's entries start from one value (row_value) and no two rows
    # share one (else empty): the value it starts from, its row (the tabulated general sweep counts in integers).
    entries: np.ndarray
    entry_base: np.ndarray
    entry_row: np.ndarray


def entries_of_rows(first: np.ndarray, offsets: np.ndarray, bases: np.ndarray) -> tuple:
    """(entries, entry_base, entry_row): every entry that rows whose configuration c reads ``first[r, u] +
    offsets[r, c]`` at cell u read, once, the value ``bases[r]`` it starts from and the first row r that
    reads it; empty arrays where a base is not finite or two rows with different bases read one entry (one
    count could not serve two bases). Rows that share entries read one table (tied members: symmetric NMF's
    two visible rows and their two column rows), so they share its log Γ terms too."""
    read = [np.unique(first[r][:, None] + offsets[r][None, :]) for r in range(first.shape[0])]
    entries = np.concatenate(read + [np.zeros(0, np.int64)]).astype(np.int64)
    entry_row = np.repeat(np.arange(len(read)), [e.size for e in read]).astype(np.int64)
    bases = np.asarray(bases, np.float64)
    unique, first_read = np.unique(entries, return_index=True)
    kept = np.sort(first_read)  # each entry at its first read, in the rows' order
    if not np.isfinite(bases).all() or np.unique(np.column_stack([entries, bases[entry_row]]), axis=0).shape[0] \
            != unique.size:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
    return entries[kept], bases[entry_row[kept]], entry_row[kept]


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


def _row_groups(spec, row_latent: np.ndarray) -> list[np.ndarray]:
    """The urn conditional's rows in the four groups of :class:`TemperedProblem`: latent numerators,
    latent denominators, visible numerators, visible denominators (``row_latent``: per row)."""
    def rows(group, latent):
        return np.array([r for r in group if row_latent[r] == latent], np.int64)

    return [rows(spec.numerator_rows, True), rows(spec.denominator_rows, True), rows(spec.numerator_rows, False),
            rows(spec.denominator_rows, False)]


def build_tempered_problem(bound: BoundModel, data: CountTensor, layout, start_scale: float = 1.0) -> TemperedProblem:
    """The tempered sampler's arrays for ``data`` under ``bound`` (no compilation).

    ``start_scale`` multiplies the latent tables' concentrations in the start distribution (1: the
    latent prior π₀ itself); :func:`~bam_ppl.infer.smc.references.with_reference` makes it a per-cell reference instead.
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
    valid = np.asarray(problem.valid, bool)
    # Values of the missing visible nodes each cell allows (``valid`` leaves latent nodes free).
    latent_configs = math.prod(bound.sizes[n] for n in layout.free if n in bound.model.latent)
    allowed = valid.sum(1) // latent_configs if spec.has_valid else np.ones(data.nnz, np.int64)
    log_space = _needs_log_space(spec, concentration, data.total)
    token_cell = np.asarray(problem.token_cell, np.int32)
    constant = bound.log_data_constant(data)
    column_table = np.concatenate([np.full(t.size // t.shape[-1], k) for k, t in enumerate(bound.tables)])
    entry_table = np.concatenate([np.full(t.size, k) for k, t in enumerate(bound.tables)])
    counts = np.asarray(data.counts, np.int64)
    groups = _row_groups(spec, row_latent)
    row_value = row_values(row_base, row_offset, conc + fixed)
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
        factorised=factorised_tempered(token_cell, row_base, row_offset, groups, usable=(
            not spec.ties and not spec.has_valid and not log_space
            and sorted(spec.moved) == sorted([*spec.numerator_rows, *spec.denominator_rows])), row_value=row_value),
        row_value=row_value,
        **dict(zip(("entries", "entry_base", "entry_row"), entries_of_rows(row_base, row_offset, row_value))),
    )


def _needs_log_space(spec, concentration: np.ndarray, num_tokens: int) -> bool:
    """Whether a product of a token's factors (each between the least concentration and the largest plus every
    token) could leave the float64 range, about 10^±300: the weights are then kept in log space."""
    num_rows = len(spec.numerator_rows) + len(spec.denominator_rows)
    extremes = np.abs(np.log10([concentration.min(), concentration.max() + num_tokens]))
    return bool(num_rows * extremes.max() > 250)


def row_values(row_base, row_offset, base) -> np.ndarray:
    """(rows,) the value ``base`` (concentration plus fixed counts) of every entry a row reads, nan
    where its entries differ: a row whose entries hold that value plus a count is tabulated
    (:func:`~bam_ppl.infer.smc.tempered_sweeps._sweeps_rows_tabulated`)."""
    values = np.full(row_base.shape[0], np.nan)
    for r in range(row_base.shape[0]):
        entries = base[row_base[r][:, None] + row_offset[r][None, :]]
        if np.all(entries == entries.flat[0]):
            values[r] = entries.flat[0]
    return values


class FactorisedTempered(NamedTuple):
    """The rows of a token's tempered weights as :func:`~bam_ppl.infer.smc.tempered_sweeps._sweeps_factorised` reads them, where no
    members are tied, no cell restricts the configurations, every row moves with the token, the
    weights stay in the float64 range, every row reads consecutive entries (configuration c at its
    start + c) and no two configurations share an entry of a constant row (``usable``). Rows
    are in four groups — latent numerators, latent denominators, visible numerators, visible
    denominators — and within each those that read the same entries at every cell
    (``constant_starts``, their product cached per configuration) come apart from those that vary
    (``token_starts``, every token's own). Where every entry of a row starts from one value
    (concentration plus fixed counts: ``token_base``, ``constant_base``), ``tabulated``, its factors
    are read from tables over the count (:func:`~bam_ppl.infer.smc.tempered_sweeps._sweeps_tabulated`)."""

    usable: bool
    token_starts: np.ndarray  # (T, V) int32: first entry of each varying row at the token's cell
    varying_ends: np.ndarray  # (4,) end of each group among the varying rows
    constant_starts: np.ndarray  # (K,) int64: first entry of each constant row, by group (the sweeps take them unrolled)
    constant_ends: np.ndarray  # (4,) end of each group among the constant rows
    tabulated: bool
    token_base: np.ndarray  # (V,) the value every entry of each varying row starts from
    constant_base: np.ndarray  # (K,) the same for the constant rows
    entries: np.ndarray  # (E,) int64: every entry the rows read, once (tabulated; else empty)
    entry_base: np.ndarray  # (E,) the value each of them starts from
    entry_row: np.ndarray  # (E,) int64: its row (varying ones, then constant ones)


def factorised_tempered(token_cell, row_base, row_offset, groups, usable: bool,
                        row_value: np.ndarray) -> FactorisedTempered:
    """:class:`FactorisedTempered` of a problem's rows in kernel numbering: ``groups`` the four groups
    of rows, ``usable`` whether ties, restricted cells, log space or rows that do not move rule the
    fast path out (checked here too: consecutive entries and the size of the indices), ``row_value``
    the value every entry of each row starts from (:func:`row_values`)."""
    num_configs = row_offset.shape[1]
    constant = np.all(row_base == row_base[:, :1], axis=1)
    varying = [[int(r) for r in group if not constant[r]] for group in groups]
    fixed = [[int(r) for r in group if constant[r]] for group in groups]
    order = [r for group in varying for r in group]
    every = [r for group in groups for r in group]
    # Rows whose configurations share entries (Tucker: a row of one latent node) take the general
    # path: a move would change the cached products of many configurations.
    consecutive = bool(np.all(row_offset[every] == row_offset[every, :1] + np.arange(num_configs)))
    usable = (bool(usable) and consecutive and len(every) > 0
              and int(row_base.max(initial=0) + row_offset.max(initial=0)) < 2**31)
    if not usable:  # no rows for the fast path: every such problem's kernels share one compilation
        order, fixed = [], [[] for _ in groups]
    first = row_base + row_offset[:, :1]  # (R, U) each row's entry of configuration 0 at each cell
    token_base = row_value[order]
    constant_base = row_value[[r for group in fixed for r in group]]
    rows = order + [r for group in fixed for r in group]
    entries, entry_base, entry_row = entries_of_rows(first[rows], np.tile(np.arange(num_configs), (len(rows), 1)),
                                                     np.concatenate([token_base, constant_base]))
    tabulated = usable and entries.size > 0
    return FactorisedTempered(
        usable=usable,
        token_starts=np.ascontiguousarray(first[order][:, token_cell].T, np.int32).reshape(len(token_cell), len(order)),
        varying_ends=np.cumsum([len(group) for group in varying] if usable else [0] * 4).astype(np.int64),
        constant_starts=np.array([first[r, 0] for group in fixed for r in group], np.int64),
        constant_ends=np.cumsum([len(group) for group in fixed]).astype(np.int64),
        tabulated=tabulated,
        token_base=token_base,
        constant_base=constant_base,
        entries=entries,
        entry_base=entry_base,
        entry_row=entry_row,
    )


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


def best_allocation(bound, data, layout, tp: TemperedProblem, config) -> tuple[np.ndarray, np.ndarray]:
    """Full cells (n, nodes) and counts (n,) of an allocation, grouped by (observed cell, configuration)."""
    keys, counts = np.unique(tp.token_cell.astype(np.int64) * tp.num_configs + np.asarray(config),
                             return_counts=True)
    full = bound.full_cells(data, layout)  # (U, L, nodes)
    return full[keys // tp.num_configs, keys % tp.num_configs], counts
