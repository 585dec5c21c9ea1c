"""Numba CPU kernel of the tempered SMC (:mod:`bam_ppl.infer.smc.tempered`, ``engine="numba"``):
collapsed-Gibbs sweeps of the particles, in blocks run in threads (the kernel releases the GIL)."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from ..kernels import compile_numba, shuffle, unrolled
from .tempered_problem import (
    TemperedProblem,
    counts_of_configs,
    exact_log_start,
    exact_log_terms,
)
from .tempered_sweeps import (
    RowTables,
    _draw,
    _factorised_factors,
    _linear_weight,
    _row_tables,
    _rows_tables,
    _rows_tables_pay,
    _set_constant,
    _start_powers,
    _sweeps_factorised,
    _sweeps_rows_tabulated,
    _sweeps_tabulated,
    _tables_pay,
)

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None

# what a pass of the numba kernel does with each token
_SWEEP = 0
_URN = 1


class KernelTables(NamedTuple):
    """The rows of the tempered weights as the kernel reads them (fields of
    :class:`~bam_ppl.infer.smc.tempered_problem.TemperedProblem`, kernel numbering)."""

    row_base: np.ndarray
    row_offset: np.ndarray
    valid: np.ndarray
    has_valid: bool
    latent_numerators: np.ndarray
    latent_denominators: np.ndarray
    visible_numerators: np.ndarray
    visible_denominators: np.ndarray
    tied: np.ndarray  # (rows,) whether a row is tied to an earlier member of the same token
    tie_rows: np.ndarray
    tie_earlier: np.ndarray
    moved: np.ndarray
    log_space: bool
    shift: np.ndarray
    tilted: bool  # weights of start^(1−β) (π₀ L)^β; False: of π₀ L^β
    log_reference: np.ndarray
    referenced: bool  # the start is the product reference ``log_reference``
    row_value: np.ndarray  # (rows,) every entry of a row starts from this value (nan: not one)
    entries: np.ndarray  # every entry the rows read, its base and row (TemperedProblem's, empty where not tabulated)
    entry_base: np.ndarray
    entry_row: np.ndarray


class TokenLayout(NamedTuple):
    """Where the tokens are: each token's cell and the cells' token ranges."""

    token_cell: np.ndarray
    cell_start: np.ndarray


class FactorisedLayout(NamedTuple):
    """What the factorised sweeps read (:func:`_factorised_block`): each token's cell, the factorised
    rows and their constant rows' starts as a tuple (:func:`~bam_ppl.infer.kernels.unrolled`), whose
    length is part of the type: only the kernels that read it are compiled once per length."""

    token_cell: np.ndarray
    factorised: tuple
    constant_starts: tuple


class Scratch(NamedTuple):
    """Work arrays of :func:`_token_weights`: row bases, latent, visible and start factors, weights."""

    base: np.ndarray
    lat: np.ndarray
    vis: np.ndarray
    start: np.ndarray
    weight: np.ndarray


class Moves(NamedTuple):
    """What a pass does to each particle: ``mode`` _URN draws every token from the start at β = 0
    (in a random order); _SWEEP does Gibbs sweeps targeting π_β, the tokens in a fixed order (a
    systematic scan: each update leaves π_β invariant, so their composition does)."""

    mode: int
    beta: float
    num_sweeps: int


class ParticleArrays(NamedTuple):
    """The particles the kernel moves in place (leading axis: particle)."""

    shifted: np.ndarray  # α + counts (kernel numbering)
    config: np.ndarray  # every token's configuration
    log_prior: np.ndarray
    log_like: np.ndarray
    log_start: np.ndarray


class OneParticle(NamedTuple):
    """One particle's state, changed in place: α + counts, every token's configuration and the
    changes (3,) of its log π₀, log L and log start since they were last added up."""

    counts: np.ndarray
    conf: np.ndarray
    logs: np.ndarray


def kernel_tables(tp: TemperedProblem, tilted: bool) -> KernelTables:
    """The tables the kernel reads (``tilted`` False: weights of π₀ L^β)."""
    tied = np.zeros(tp.row_base.shape[0], np.bool_)
    tied[tp.tie_rows] = True
    return KernelTables(tp.row_base, tp.row_offset, tp.valid, tp.has_valid, tp.latent_numerators,
                        tp.latent_denominators, tp.visible_numerators, tp.visible_denominators, tied, tp.tie_rows,
                        tp.tie_earlier, tp.moved, tp.log_space, tp.shift, tp.tilted and tilted, tp.log_reference,
                        tp.referenced and tilted, tp.row_value, tp.entries, tp.entry_base, tp.entry_row)


def token_layout(tp: TemperedProblem) -> TokenLayout:
    return TokenLayout(tp.token_cell, tp.cell_start)


def factorised_layout(tp: TemperedProblem) -> FactorisedLayout:
    return FactorisedLayout(tp.token_cell, tp.factorised, unrolled(tp.factorised.constant_starts))


def _row_value(shifted, st, use_shift, base, r, c):
    """(α + S)[index of row r at configuration c] (plus ``st.shift`` there when ``use_shift``), plus
    one where a tied earlier member of the same token has its increment at the same index."""
    index = base[r] + st.row_offset[r, c]
    v = shifted[index]
    if use_shift:
        v += st.shift[index]
    if st.tied[r]:
        for tie in range(st.tie_rows.shape[0]):
            if st.tie_rows[tie] == r:
                e = st.tie_earlier[tie]
                if base[e] + st.row_offset[e, c] == index:
                    v += 1.0
    return v


def _group_factor(shifted, st, use_shift, base, numerators, denominators, out):
    """out[c] = ∏ numerator rows / ∏ denominator rows at configuration c (its log if ``st.log_space``)."""
    num_configs = out.shape[0]
    row_offset, tied = st.row_offset, st.tied
    if st.log_space:
        out[:] = 0.0
        for r in numerators:
            for c in range(num_configs):
                out[c] += math.log(_row_value(shifted, st, use_shift, base, r, c))
        for r in denominators:
            for c in range(num_configs):
                out[c] -= math.log(_row_value(shifted, st, use_shift, base, r, c))
        return
    out[:] = 1.0
    for r in numerators:
        if tied[r] or use_shift:
            for c in range(num_configs):
                out[c] *= _row_value(shifted, st, use_shift, base, r, c)
        else:
            b = base[r]
            for c in range(num_configs):
                out[c] *= shifted[b + row_offset[r, c]]
    for r in denominators:
        if tied[r] or use_shift:
            for c in range(num_configs):
                out[c] /= _row_value(shifted, st, use_shift, base, r, c)
        else:
            b = base[r]
            for c in range(num_configs):
                out[c] /= shifted[b + row_offset[r, c]]


def _token_weights(counts, cell, beta, scratch, st):
    """The tempered conditional of one token at ``cell`` over its configurations (the token not in
    ``counts``): fills lat, vis with the products of its latent-table and visible-table factors
    (their logs when ``log_space``), start with the log of its start factor (the reference's log q,
    or the start urn's; left at 0 untilted), and weight with start^(1−β) (lat · vis)^β
    (lat · vis^β untilted), divided by their largest in log space. The start
    factor is kept as a log since the weights and the particle's log start need only its log: one
    log and one exp per configuration instead of three exps and two logs (the reference-started
    runs spent most of their time on them).
    """
    base, lat, vis, start, weight = scratch
    valid, has_valid, log_space, tilted = st.valid, st.has_valid, st.log_space, st.tilted
    num_configs = weight.shape[0]
    _set_base(base, st.row_base, cell)
    _group_factor(counts, st, False, base, st.latent_numerators, st.latent_denominators, lat)
    _group_factor(counts, st, False, base, st.visible_numerators, st.visible_denominators, vis)
    if st.referenced:
        for c in range(num_configs):
            start[c] = st.log_reference[cell, c]
    elif tilted:
        _group_factor(counts, st, True, base, st.latent_numerators, st.latent_denominators, start)
        if not log_space:
            for c in range(num_configs):
                start[c] = math.log(start[c])
    if log_space:
        largest = -np.inf
        for c in range(num_configs):
            if tilted:
                weight[c] = start[c] + beta * (lat[c] + vis[c] - start[c])
            else:
                weight[c] = lat[c] + beta * vis[c]
            if has_valid and not valid[cell, c]:
                weight[c] = -np.inf
            largest = max(largest, weight[c])
        for c in range(num_configs):
            weight[c] = math.exp(weight[c] - largest)
        return
    for c in range(num_configs):
        weight[c] = 0.0 if has_valid and not valid[cell, c] else _linear_weight(lat, vis, start, c, beta, tilted)


def _weight_scratch(num_rows, num_configs):
    """:class:`Scratch` for ``num_rows`` rows and ``num_configs`` configurations."""
    return Scratch(np.empty(num_rows, np.int64), np.empty(num_configs), np.empty(num_configs), np.zeros(num_configs),
                   np.empty(num_configs))


def _set_base(base, row_base, cell):
    for r in range(row_base.shape[0]):
        base[r] = row_base[r, cell]


def _log_factor(values, c, log_space):
    return values[c] if log_space else math.log(values[c])


def _log_change(values, new, old, log_space):
    """log values[new] − log values[old], with one log."""
    return values[new] - values[old] if log_space else math.log(values[new] / values[old])


def _shift_token(counts, base, row_offset, moved, c, step):
    for m in moved:
        counts[base[m] + row_offset[m, c]] += step


def _fast_paths(mode, usable, st):
    """Which sweeps of :mod:`~bam_ppl.infer.smc.tempered_sweeps` a _SWEEP pass from a reference or
    π₀ can take: factorised (where the rows allow: ``usable``), or the general rows with tables."""
    plain = mode == _SWEEP and (st.referenced or not st.tilted)
    fast = plain and usable
    return fast, plain and not fast


def sweep_tables(mode, beta, layout, f, st, work):
    """The tables of a pass's sweeps at ``beta`` (:class:`~bam_ppl.infer.smc.tempered_sweeps.RowTables`
    without the start's powers, which each reference has its own of): those of the factorised rows
    and those of the general rows, each empty unless its sweep applies and its tables cost fewer logs
    and exps than the pass's ``work`` sweeps of a particle would compute. Built once per pass and
    shared by every block and reference. ``f``: the factorised rows."""
    fast, general = _fast_paths(mode, f.usable, st)
    return (_row_tables(beta, layout, f, st, fast and _tables_pay(layout, f, st, work)),
            _rows_tables(beta, st, layout.token_cell.shape[0], general and _rows_tables_pay(layout, st, work)))


def _segment_tables(beta, st, shared):
    """The pass's :func:`sweep_tables` ``shared`` with the start's powers of ``st``'s reference."""
    factorised, general = shared
    powers = _start_powers(beta, st, factorised.power.shape[0] + general.power.shape[0] > 0)
    return (RowTables(factorised.power, powers, factorised.latent, factorised.log_gamma),
            RowTables(general.power, powers, general.latent, general.log_gamma))


def _add_logs(particles, p, logs):
    particles.log_prior[p] += logs[0]
    particles.log_like[p] += logs[1]
    particles.log_start[p] += logs[2]


def _factorised_block(rng, block, moves, particles, fast_layout, st, shared):
    """:func:`_tempered_block` for a _SWEEP pass that takes the factorised path (:func:`_fast_paths`):
    each particle's sweeps by :func:`_sweeps_tabulated` (where the pass's tables were built) or
    :func:`_sweeps_factorised`, ``rng`` consumed as the general kernel would."""
    scratch = _weight_scratch(st.row_base.shape[0], st.row_offset.shape[1])
    logs = np.zeros(3)
    tables, _ = _segment_tables(moves.beta, st, shared)
    for p in range(block[0], block[1]):
        particle = OneParticle(particles.shifted[p], particles.config[p], logs)
        logs[:] = 0.0
        if tables.power.shape[0] > 0:
            _sweeps_tabulated(rng, moves, particle, fast_layout, st, tables, scratch.weight)
        else:
            _sweeps_factorised(rng, moves, particle, fast_layout, st, scratch)
        _add_logs(particles, p, logs)


def _tempered_block(rng, block, moves, particles, layout, st, shared):
    """Particles ``block`` = (first, stop) of :class:`ParticleArrays` ``particles``, drawing from the
    block's Generator ``rng``, where the pass does not take the factorised path (that is
    :func:`_factorised_block`).

    ``moves.mode`` _URN adds every token (random order) drawn from the start distribution's urn
    conditional (β = 0); _SWEEP does ``moves.num_sweeps`` Gibbs sweeps targeting π_β in token order. The
    weights are those of :func:`_token_weights`; the particle's log π₀, log L and log start change by the
    logs of the factors of its new configuration minus those of the old one. ``shared``: the pass's :func:`sweep_tables`.
    """
    mode, beta, row_base, row_offset, moved, log_space = moves.mode, moves.beta, st.row_base, st.row_offset, st.moved, st.log_space
    token_cell, num_configs = layout.token_cell, row_offset.shape[1]
    num_tokens = token_cell.shape[0]
    scratch = _weight_scratch(row_base.shape[0], num_configs)
    base, lat, vis, start, weight = scratch
    logs = np.zeros(3)
    order = np.arange(num_tokens)
    _, row_tables = _segment_tables(beta, st, shared)
    by_rows = row_tables.power.shape[0] > 0
    for p in range(block[0], block[1]):
        counts, conf = particles.shifted[p], particles.config[p]
        logs[:] = 0.0
        if by_rows:
            _sweeps_rows_tabulated(rng, moves, OneParticle(counts, conf, logs), token_cell, st,
                                   row_tables, scratch)
        for _ in range(0 if by_rows else 1 if mode == _URN else moves.num_sweeps):
            if mode == _URN:
                shuffle(rng, order)
            for position in range(num_tokens):
                token = order[position]
                cell = token_cell[token]
                old = conf[token]
                if mode == _SWEEP:
                    for r in range(row_base.shape[0]):
                        base[r] = row_base[r, cell]
                    _shift_token(counts, base, row_offset, moved, old, -1.0)
                _token_weights(counts, cell, beta, scratch, st)
                new = _draw(rng, weight)
                _shift_token(counts, base, row_offset, moved, new, 1.0)
                conf[token] = new
                if mode == _URN:
                    logs[0] += _log_factor(lat, new, log_space)
                    logs[1] += _log_factor(vis, new, log_space)
                    logs[2] += start[new]
                elif new != old:
                    logs[0] += _log_change(lat, new, old, log_space)
                    logs[1] += _log_change(vis, new, old, log_space)
                    logs[2] += start[new] - start[old]
        _add_logs(particles, p, logs)


def _draw_product(rng, block, particles, token_cell, st, q):
    """Particles ``block`` = (first, stop), fresh, drawn exactly from the product start q(z) =
    Π_τ q(cell of τ, z_τ) (``st.log_reference``; ``q`` (U, L) its probabilities, 0 where a cell does not
    allow a configuration): every token's configuration, the counts it adds, and log q(z) into
    ``particles.log_start``; log π₀ and log L are the caller's (closed forms of the counts)."""
    row_base, row_offset, moved, log_q = st.row_base, st.row_offset, st.moved, st.log_reference
    for p in range(block[0], block[1]):
        counts, conf = particles.shifted[p], particles.config[p]
        total = 0.0
        for token in range(token_cell.shape[0]):
            cell = token_cell[token]
            c = _draw(rng, q[cell])
            for m in moved:
                counts[row_base[m, cell] + row_offset[m, c]] += 1.0
            conf[token] = c
            total += log_q[cell, c]
        particles.log_start[p] = total


def _log_multinomial_block(first, stop, config, token_cell, cell_start, num_configs, log_int, out):
    """out[p] = Σ_(cell, configuration) lnΓ(S + 1) = Σ_tokens log(rank within its group)."""
    seen = np.zeros(num_configs, np.int64)
    for p in range(first, stop):
        total = 0.0
        for u in range(cell_start.shape[0] - 1):
            for t in range(cell_start[u], cell_start[u + 1]):
                c = config[p, t]
                seen[c] += 1
                total += log_int[seen[c]]
            for t in range(cell_start[u], cell_start[u + 1]):
                seen[config[p, t]] = 0
        out[p] = total


def _cell_probabilities(shifted, st, cell_start, f, out):
    """out[u, c] = the urn conditional (β = 1) of a token of cell u at configuration c, given the
    counts ``shifted`` (concentration + counts, kernel numbering); 0 where not allowed. Read as
    :func:`_sweeps_factorised` reads the rows where ``factorised`` is usable, so that these averages
    stay a small part of a reference chain's time."""
    num_configs = st.row_offset.shape[1]
    scratch = _weight_scratch(st.row_base.shape[0], num_configs)
    _, lat, vis, _, weight = scratch
    # Factorised (``f``, a FactorisedTempered): the constant rows once, each cell's varying rows
    # through its first token's indices.
    usable, token_starts, varying_ends, constant_starts, constant_ends = (f.usable, f.token_starts, f.varying_ends,
                                                                          f.constant_starts, f.constant_ends)
    constant_lat, constant_vis = np.ones(num_configs), np.ones(num_configs)
    for c in range(num_configs if usable else 0):
        _set_constant(shifted, constant_starts, constant_ends, c, constant_lat, constant_vis)
    for cell in range(out.shape[0]):
        if usable:
            _factorised_factors(shifted, token_starts, varying_ends, cell_start[cell], constant_lat, constant_vis, lat, vis)
            for c in range(num_configs):
                weight[c] = lat[c] * vis[c]
        else:  # the cell as int32, as the moves pass it: one compilation of _token_weights
            _token_weights(shifted, np.int32(cell), 1.0, scratch, st)
        total = 0.0
        for c in range(num_configs):
            total += weight[c]
        for c in range(num_configs):
            out[cell, c] = weight[c] / total


if numba is not None:
    # _token_weights is called, not inlined: four inlined copies of its row lookups made numba's
    # compilation far longer, and the call is cheap next to the loops inside it. The small helpers
    # are inlined: left to calls, they make the tempered SMC markedly slower.
    compile_numba(globals(), inline=("_row_value", "_group_factor", "_weight_scratch", "_log_factor", "_log_change",
                                     "_shift_token", "_set_base", "_add_logs"),
                  nogil=("_fast_paths", "sweep_tables", "_segment_tables", "_token_weights", "_factorised_block", "_tempered_block", "_draw_product", "_log_multinomial_block", "_cell_probabilities"))


class NumbaParticles:
    """P particles as NumPy arrays, moved by the numba kernel in ``NUM_BLOCKS`` blocks of particles.

    Block b draws from a Generator seeded by ``keys[b]``; blocks run in threads (the kernel
    releases the GIL), so results do not depend on the number of cores.
    """

    def __init__(self, tp: TemperedProblem, num_particles: int, keys, pool: ThreadPoolExecutor):
        self.tp = tp
        self.num_particles = num_particles
        self.shifted = np.tile(tp.concentration + tp.fixed_counts, (num_particles, 1))
        self.config = np.zeros((num_particles, tp.token_cell.shape[0]), np.int32)
        self.log_prior = np.zeros(num_particles)
        self.log_like = np.zeros(num_particles)
        self.log_start = np.zeros(num_particles)
        edges = np.linspace(0, num_particles, len(keys) + 1).astype(np.int64)
        self.blocks = [(b, int(edges[b]), int(edges[b + 1])) for b in range(len(keys)) if edges[b + 1] > edges[b]]
        self.rngs = [np.random.default_rng(np.asarray(k, np.uint32)) for k in keys]
        self.pool = pool
        self.structure = kernel_tables(tp, True)
        self.layout = token_layout(tp)
        self.fast_layout = factorised_layout(tp)

    def _run(self, mode, beta, num_sweeps):
        tp = self.tp
        moves = Moves(mode, float(beta), num_sweeps)
        particles = ParticleArrays(self.shifted, self.config, self.log_prior, self.log_like, self.log_start)

        passes = 1 if mode == _URN else num_sweeps
        shared = sweep_tables(mode, float(beta), self.layout, tp.factorised, self.segments(0, self.num_particles)[0][2],
                              self.num_particles * passes)
        usable = tp.factorised.usable

        def one(block):
            b, first, stop = block
            for begin, end, structure in self.segments(first, stop):  # one Generator per block, in order
                if _fast_paths(mode, usable, structure)[0]:
                    _factorised_block(self.rngs[b], (begin, end), moves, particles, self.fast_layout, structure,
                                      shared)
                else:
                    _tempered_block(self.rngs[b], (begin, end), moves, particles, self.layout, structure, shared)

        list(self.pool.map(one, self.blocks))

    def segments(self, first: int, stop: int) -> list:
        """Ranges of particles ``first..stop`` and the kernel structure each is moved with (one here;
        a mixture start has one per reference: :class:`~bam_ppl.infer.smc.mixture_start.MixtureParticles`)."""
        return [(first, stop, self.structure)]

    def initialise(self) -> None:
        """Exact draws from the start: from π₀'s urn token by token (the latent tables; missing visible
        values uniform), or, from product references, every token on its own (:meth:`_draw_products`)."""
        if all(structure.referenced for _, _, structure in self.segments(0, self.num_particles)):
            self._draw_products()
        else:
            self._run(_URN, 0.0, 1)

    def _draw_products(self) -> None:
        """Every particle drawn from its segment's product reference (:func:`_draw_product`), each block
        from its own Generator; log π₀ and log L from the counts in closed form."""
        tp = self.tp
        self.shifted[:] = tp.concentration + tp.fixed_counts
        self.log_start[:] = 0.0
        particles = ParticleArrays(self.shifted, self.config, self.log_prior, self.log_like, self.log_start)

        def one(block):
            b, first, stop = block
            for begin, end, structure in self.segments(first, stop):
                q = np.exp(structure.log_reference)
                q = np.where(structure.valid, q, 0.0) if structure.has_valid else q
                _draw_product(self.rngs[b], (begin, end), particles, self.layout.token_cell, structure, q)

        list(self.pool.map(one, self.blocks))
        for p in range(self.num_particles):
            self.log_prior[p], self.log_like[p] = exact_log_terms(tp, self.counts(p))

    def move(self, beta: float, num_sweeps: int) -> None:
        self._run(_SWEEP, beta, num_sweeps)

    def add_offsets(self, prior: float, like: float, start: float) -> None:
        self.log_prior += prior
        self.log_like += like
        self.log_start += start

    def set_configs(self, config: np.ndarray) -> None:
        """Put the particles at the given token configurations (P, T) (tests and restarts)."""
        config = np.asarray(config, np.int32)
        self.config[:] = config
        for p in range(self.num_particles):
            counts = counts_of_configs(self.tp, config[p])
            self.shifted[p] = self.tp.concentration + counts
            self.log_prior[p], self.log_like[p] = exact_log_terms(self.tp, counts)
            self.log_start[p] = exact_log_start(self.tp, counts, config[p])

    def counts(self, p: int) -> np.ndarray:
        return np.rint(self.shifted[p] - self.tp.concentration).astype(np.int64)

    def resample(self, ancestors: np.ndarray) -> None:
        self.shifted = self.shifted[ancestors]
        self.config = self.config[ancestors]
        self.log_prior = self.log_prior[ancestors]
        self.log_like = self.log_like[ancestors]
        self.log_start = self.log_start[ancestors]

    def log_multinomial(self) -> np.ndarray:
        out = np.empty(self.num_particles)
        tp = self.tp

        def one(block):
            _, first, stop = block
            _log_multinomial_block(first, stop, self.config, tp.token_cell, tp.cell_start, tp.num_configs,
                                   tp.log_int, out)

        list(self.pool.map(one, self.blocks))
        return out
