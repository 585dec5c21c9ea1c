"""Label symmetries: the relabellings of the latent values that leave p(X, z) unchanged
(:func:`label_symmetries`, which Chib's estimate averages over), and the sums of a product reference
over them for the tempered SMC from references (enumerated, or a permanent per relabelling of the
other nodes: :func:`label_symmetries_of`)."""

from __future__ import annotations

import itertools
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from ..kernels import compile_numba
from .tempered_problem import TemperedProblem

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None

# Relabellings enumerated at most (8!): an estimator sums over each of them per particle or step.
MAX_RELABELLINGS = 40_320


def configs_with_node(layout, sizes, position: int, value: int) -> np.ndarray:
    """(L,) the configuration that agrees with each of ``layout.configs`` except that the free node
    at ``position`` takes ``value`` (configurations are numbered in C order of ``sizes``)."""
    new = np.array(layout.configs, np.int64)
    new[:, position] = value
    return np.ravel_multi_index(tuple(new.T), sizes)


class LabelSymmetry(NamedTuple):
    """The relabellings of the latent values that leave p(X, z) unchanged, as
    :func:`symmetric_log_weights` sums over them: enumerated (``relabellings`` (G, L), identity
    first) where G has at most MAX_RELABELLINGS elements. Otherwise the largest symmetric node's
    values (``value`` (L,)) and ``swap`` (L, K): configuration l with that node set to k, so that
    the sum over its K! permutations is a permanent (:func:`_log_permanent`), one for each of the
    ``relabellings`` (identity first) of the other symmetric nodes. ``log_order`` is log |G| (0: no
    symmetry, or one too large to sum over)."""

    relabellings: np.ndarray
    value: np.ndarray | None = None
    swap: np.ndarray | None = None
    log_order: float = 0.0


# Terms of the sum over relabellings more than this many nats below the sum so far are left out,
# with all their completions: at most K subtrees per partial assignment visited, so their share
# stays below K · PERMANENT_MAX_NODES · e^(−PERMANENT_DROP_NATS) (4 · 10^-6 for K = 20).
PERMANENT_DROP_NATS = 30.0
PERMANENT_MAX_NODES = 2_000_000  # partial assignments a sum may visit before it gives up
# Up to this many values the sum falls back, where the depth-first one gives up (many terms of
# similar size), to the exact one over subsets of values (K 2^K steps).
PERMANENT_SUBSET_MAX = 20
# The relabellings of the other symmetric nodes enumerated around the permanent of the largest
# (Tucker(6, 6, 2): 6! · 2!), at most this many: each particle then sums this many permanents.
PERMANENT_MAX_OUTER = 5040


def _log_permanents(M, occupied, drop, max_nodes, subset_max):
    """log Σ_g exp(Σ_k M[h, k, g(k)]) over the permutations g of the K columns, for every h
    (H, K, K): depth first (:func:`_log_permanent`) and, where that gives up and K ≤
    ``subset_max``, over subsets (:func:`_log_permanent_by_subsets`); nan from the first that
    cannot be summed. Depth first, the cheap cases (one term far above the others) take
    microseconds; it gets a budget of 2^K / K partial assignments where the subsets can take over."""
    K = M.shape[1]
    budget = min(max_nodes, (1 << K) // K) if K <= subset_max else max_nodes
    out = np.full(M.shape[0], np.nan)
    for h in range(M.shape[0]):
        out[h] = _log_permanent(M[h], occupied, drop, budget)
        if np.isnan(out[h]) and K <= subset_max:
            out[h] = _log_permanent_by_subsets(M[h])
        if np.isnan(out[h]):
            break
    return out


def _log_permanent_by_subsets(M):
    """log Σ_g exp(Σ_k M[k, g(k)]) over the permutations g of the K columns, exactly, by dynamic
    programming over the subsets S of columns given to the first |S| rows, in log space so that
    entries thousands of nats apart neither under- nor overflow: f(S) = log Σ_(j ∈ S)
    exp(f(S − {j}) + M[|S| − 1, j]) (K 2^K steps). nan if no permutation has a finite sum."""
    K = M.shape[0]
    size = 1 << K
    count = np.zeros(size, np.int64)  # |S|; row |S| − 1 takes the last column of S
    f = np.full(size, -np.inf)
    f[0] = 0.0
    for S in range(1, size):
        count[S] = count[S >> 1] + (S & 1)
        row = count[S] - 1
        peak = -np.inf
        for j in range(K):
            if (S >> j) & 1:
                peak = max(peak, f[S ^ (1 << j)] + M[row, j])
        if peak == -np.inf:
            continue
        total = 0.0
        for j in range(K):
            if (S >> j) & 1:
                total += math.exp(f[S ^ (1 << j)] + M[row, j] - peak)
        f[S] = peak + math.log(total)
    return f[size - 1] if np.isfinite(f[size - 1]) else np.nan


def _log_permanent(M, occupied, drop, max_nodes):
    """log Σ_g exp(Σ_k M[k, g(k)]) over the permutations g of the K columns, where the rows not
    ``occupied`` are zero (a node value no token takes): those rows add log((K − n)!) for the n
    occupied ones, whose injections into the columns are summed depth first, each row's columns
    largest entry first. A partial assignment is left out, with all its completions, when its
    bound lies ``drop`` nats below the sum so far: its sum plus, for each remaining row, the log
    of the row's whole sum Σ_j exp M[r, j] (the permanent of a nonnegative matrix is at most the
    product of its row sums); the columns after it at that depth, with smaller entries, are left
    out with it. Returns nan after ``max_nodes`` partial assignments (many terms of similar size)."""
    K = M.shape[0]
    rows = np.flatnonzero(occupied)
    n = rows.shape[0]
    if n == 0:
        return math.lgamma(K + 1.0)
    order = np.empty((n, K), np.int64)
    rest = np.zeros(n + 1)  # Σ over rows d.. of log Σ_j exp M[row, j]
    for d in range(n - 1, -1, -1):
        row = M[rows[d]]
        columns = np.argsort(-row)
        for j in range(K):  # a loop: a slice copy compiles numba's shape checks (seconds)
            order[d, j] = columns[j]
        top = row[order[d, 0]]
        rest[d] = rest[d + 1] + top + math.log(np.exp(row - top).sum())
    used = np.zeros(K, np.bool_)
    column = np.zeros(n, np.int64)
    tried = np.zeros(n, np.int64)
    partial = np.zeros(n + 1)
    total = -np.inf
    visited = 0
    d = 0
    while d >= 0:
        if tried[d] == K:  # every column tried at this depth: back up
            d -= 1
            if d >= 0:
                used[column[d]] = False
                tried[d] += 1
            continue
        j = order[d, tried[d]]
        if used[j]:
            tried[d] += 1
            continue
        value = partial[d] + M[rows[d], j]
        if value + rest[d + 1] < total - drop:
            tried[d] = K
            continue
        if d == n - 1:
            total = max(total, value) + math.log1p(math.exp(-abs(total - value))) if total > -np.inf else value
            tried[d] += 1
            continue
        visited += 1
        if visited > max_nodes:
            return np.nan
        used[j] = True
        column[d] = j
        partial[d + 1] = value
        d += 1
        tried[d] = 0
    return total + math.lgamma(K - n + 1.0)


def symmetric_log_weights(tp: TemperedProblem, config: np.ndarray, symmetry: LabelSymmetry) -> np.ndarray | None:
    """log(|G| · w(z)) of every particle (P, T), with w(z) = q(z) / Σ_g q(g(z)) over the label
    symmetries g in G (``symmetry``, a :class:`LabelSymmetry`): the share of z's orbit that
    the reference q puts on z itself. For every z, Σ_h w(h(z)) = 1 over the relabellings h, and
    p(X, z) is invariant under them, so Σ_z p(X, z) |G| w(z) = p(X): reweighting the particles of
    π₁ by |G| w counts the copies of the posterior that a reference in one of them never visits
    (w = 1 for a particle in q's own copy when the copies lie far apart; ½ where q cannot tell
    two relabellings apart). None when a permanent cannot be summed (:func:`_log_permanents`:
    more than PERMANENT_SUBSET_MAX values and too many terms of similar size)."""
    sums = orbit_log_sums(tp, tp.log_reference, config, symmetry)
    return None if sums is None else symmetry.log_order + sums[0] - sums[1]


# Entries of the particles' token counts per cell and configuration held at once (C · U · L floats).
CHUNK_ENTRIES = 4_000_000


def orbit_log_sums(tp: TemperedProblem, log_refs: np.ndarray, config: np.ndarray,
                   symmetry: LabelSymmetry) -> tuple[np.ndarray, np.ndarray] | None:
    """(log q_b(z), log Σ_g q_b(g(z))) of every particle (``config`` (P, T)) for each product
    reference of ``log_refs`` (B, U, L), over the label symmetries g of ``symmetry``: two (B, P)
    arrays, or (P,) ones for one reference (U, L); None when a permanent cannot be summed
    (:func:`_log_permanents`). A particle's counts S[u, l] of tokens per cell and configuration
    serve every reference: log q_b(g(z)) = Σ_(u, l) S[u, l] log q_b[u, g(l)]."""
    log_refs = np.asarray(log_refs, np.float64)
    single = log_refs.ndim == 2
    log_refs = log_refs[None] if single else log_refs
    B, U, L = log_refs.shape
    P = config.shape[0]
    by_cell = log_refs.transpose(1, 0, 2).reshape(U, B * L)  # [u, (b, l')]
    rows = np.arange(L)
    own, orbit = np.empty((P, B)), np.empty((P, B))
    per_value = 1 if symmetry.swap is None else symmetry.swap.shape[1]  # the gathered (L, K) per relabelling
    per_particle = max(U * L, B * symmetry.relabellings.shape[0] * L * per_value)
    chunk = max(1, CHUNK_ENTRIES // per_particle)
    for first in range(0, P, chunk):
        z = np.asarray(config[first:first + chunk], np.int64)
        C = z.shape[0]
        index = (np.arange(C)[:, None] * U + tp.token_cell[None, :].astype(np.int64)) * L + z
        groups = np.bincount(index.ravel(), minlength=C * U * L).reshape(C, U, L).astype(np.float64)
        # scores[c, b, l, l'] = Σ_u S[u, l] log q_b[u, l']
        scores = (groups.transpose(0, 2, 1).reshape(C * L, U) @ by_cell).reshape(C, L, B, L).transpose(0, 2, 1, 3)
        part = slice(first, first + C)
        if symmetry.swap is None:
            by_relabelling = scores[:, :, rows[None, :], symmetry.relabellings].sum(-1)  # (C, B, G)
            own[part] = by_relabelling[..., 0]
            peak = by_relabelling.max(-1)
            orbit[part] = peak + np.log(np.exp(by_relabelling - peak[..., None]).sum(-1))
            continue
        # g = σ ∘ h, σ permuting the values of the node of ``value``, h the others' (``relabellings``):
        # Σ_l scores[l, g(l)] = Σ_k M_h[k, σ(k)], M_h[k, j] = Σ over l with value k of scores[l, h(l) with value j]
        K = symmetry.swap.shape[1]
        one_hot = (symmetry.value[:, None] == np.arange(K)).astype(np.float64)  # (L, K)
        targets = symmetry.swap[symmetry.relabellings]  # (H, L, K): h(l) with the node set to k
        M = np.ascontiguousarray(np.einsum("cbhlj,lk->cbhkj", scores[:, :, rows[None, :, None], targets], one_hot))
        occupied = groups.sum(1) @ one_hot > 0  # (C, K)
        own[part] = np.trace(M[:, :, 0], axis1=-2, axis2=-1)
        orbit[part] = _summed_permanents(M, occupied)
        if np.isnan(orbit[part]).any():
            return None
    own, orbit = own.T, orbit.T
    return (own[0], orbit[0]) if single else (own, orbit)


def _summed_permanents(M: np.ndarray, occupied: np.ndarray) -> np.ndarray:
    """log Σ_h permanent(exp M[c, b, h]) (C, B) of every particle c and reference b, the rows of
    particle c not ``occupied[c]`` left out (:func:`_log_permanents`), on every core (the sums
    release the GIL); nan where one cannot be summed."""
    C, B = M.shape[:2]

    def log_sums(c):
        out = np.empty(B)
        for b in range(B):
            sums = _log_permanents(M[c, b], occupied[c], PERMANENT_DROP_NATS, PERMANENT_MAX_NODES,
                                   PERMANENT_SUBSET_MAX)
            out[b] = np.nan if np.isnan(sums).any() else _log_sum_exp(sums)
        return out

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return np.stack(list(pool.map(log_sums, range(C))))


def _log_sum_exp(x: np.ndarray) -> float:
    peak = np.max(x)
    if not np.isfinite(peak):
        return float(peak)
    return float(peak + np.log(np.sum(np.exp(x - peak))))


def relabelling_is_symmetry(relabel, structure, concentration, fixed_counts, num_entries) -> bool:
    """Whether relabelling every token's configuration by ``relabel`` leaves p(X, z) unchanged
    for every z: it must permute the count entries the tokens touch (a well-defined bijection
    that keeps tables and columns apart), preserve their concentrations and fixed counts, and
    keep every cell's allowed configurations."""
    row_base, row_offset, valid, moved, has_valid = (structure.row_base, structure.row_offset, structure.valid,
                                                     structure.moved, structure.has_valid)
    if has_valid and not np.array_equal(valid, valid[:, relabel]):
        return False
    if moved.size == 0:
        return True
    for m in moved:
        bases = np.unique(row_base[m])
        src = (bases[:, None] + row_offset[m][None, :]).reshape(-1)
        dst = (bases[:, None] + row_offset[m][relabel][None, :]).reshape(-1)
        if m == moved[0]:
            sources, targets = src, dst
        else:
            sources, targets = np.concatenate([sources, src]), np.concatenate([targets, dst])
    pairs = np.unique(np.stack([sources, targets]), axis=1)
    if np.unique(pairs[0]).size != pairs.shape[1] or np.unique(pairs[1]).size != pairs.shape[1]:
        return False  # not a function, or not one to one
    src, dst = pairs
    return bool(np.array_equal(concentration[src], concentration[dst])
                and np.array_equal(fixed_counts[src], fixed_counts[dst])
                and np.array_equal(src < num_entries, dst < num_entries))


def symmetric_nodes(bound, layout, structure, concentration, fixed_counts, num_entries) -> list[int]:
    """Positions in ``layout.free`` of the latent nodes any permutation of whose values leaves
    p(X, z) unchanged: those for which the transposition of the first two values and the cycle of
    all of them are symmetries (they generate the symmetric group, and symmetries compose)."""
    configs = layout.configs
    sizes = [bound.sizes[n] for n in layout.free]
    nodes = []
    for position, name in enumerate(layout.free):
        K = sizes[position]
        if name not in bound.model.latent or K < 2:
            continue
        generators = [[1, 0, *range(2, K)], [*range(1, K), 0]]
        relabellings = []
        for permutation in generators:
            new = configs.copy()
            new[:, position] = np.asarray(permutation)[configs[:, position]]
            relabellings.append(np.ravel_multi_index(tuple(new.T), sizes))
        if all(relabelling_is_symmetry(r, structure, concentration, fixed_counts, num_entries) for r in relabellings):
            nodes.append(position)
    return nodes


def label_symmetries(bound, layout, structure, concentration, fixed_counts, num_entries,
                     max_relabellings: int, estimator: str = "the estimate") -> np.ndarray:
    """The relabellings of the free configurations (G, L), identity first, that permute the
    values of latent nodes and leave p(X, z) unchanged: the product over the nodes of
    :func:`symmetric_nodes` of all permutations of their values. Only the identity is returned
    when the group has more than ``max_relabellings`` elements, with a warning that ``estimator``
    then averages over none of them.
    """
    configs = layout.configs
    sizes = [bound.sizes[n] for n in layout.free]
    identity = np.arange(configs.shape[0])
    nodes = symmetric_nodes(bound, layout, structure, concentration, fixed_counts, num_entries)
    order = math.prod(math.factorial(sizes[p]) for p in nodes)
    if not nodes:
        return identity[None, :]
    if order > max_relabellings:
        warnings.warn(f"the latent labels have {order} symmetries, more than {max_relabellings}: "
                      f"{estimator} averages over none of them and may fall short of log p(X) "
                      f"by up to log {order} = {math.log(order):.1f} nats", stacklevel=3)
        return identity[None, :]
    return node_relabellings(layout, sizes, nodes)


def node_relabellings(layout, sizes, nodes) -> np.ndarray:
    """(G, L) every relabelling of the configurations that permutes the values of the free nodes
    at positions ``nodes`` (all their permutations, the identity first)."""
    configs = layout.configs
    out = []
    for permutations in itertools.product(*[itertools.permutations(range(sizes[p])) for p in nodes]):
        new = configs.copy()
        for p, permutation in zip(nodes, permutations):
            new[:, p] = np.asarray(permutation)[configs[:, p]]
        out.append(np.ravel_multi_index(tuple(new.T), sizes))
    return np.array(out, np.int64)


def label_symmetries_of(bound, data, layout) -> LabelSymmetry:
    """The :class:`LabelSymmetry` of a problem: enumerated up to MAX_RELABELLINGS relabellings;
    beyond, the permanent of the largest symmetric node's permutations around the enumerated
    relabellings of the others, up to PERMANENT_MAX_OUTER of them; otherwise the identity alone,
    with the warning of :func:`label_symmetries`."""
    from ..gibbs.chib import _Problem

    problem = _Problem(bound, data, layout, False, MAX_RELABELLINGS)
    arrays = (problem.structure, problem.concentration, problem.fixed_counts, problem.num_entries)
    nodes = symmetric_nodes(bound, layout, *arrays)
    sizes = [bound.sizes[name] for name in layout.free]
    order = math.prod(math.factorial(sizes[p]) for p in nodes)
    largest = max(nodes, key=lambda p: sizes[p]) if nodes else None
    # The permanent where enumerating costs more (|G| · L per particle against at most K² 2^K steps
    # per permanent, the sum over subsets, one for each relabelling of the other nodes) or is not allowed.
    K = sizes[largest] if nodes else 0
    outer = order // math.factorial(K) if nodes else 1
    if nodes and (order > MAX_RELABELLINGS or outer * K * K * 2 ** K < order * layout.num_configs):
        others = [p for p in nodes if p != largest]
        if outer <= PERMANENT_MAX_OUTER:
            swap = np.stack([configs_with_node(layout, sizes, largest, k) for k in range(sizes[largest])], axis=1)
            return LabelSymmetry(node_relabellings(layout, sizes, others), np.asarray(layout.configs)[:, largest].copy(),
                                 swap, math.log(order))
    relabellings = label_symmetries(bound, layout, *arrays, MAX_RELABELLINGS, "the tempered SMC from a reference")
    return LabelSymmetry(relabellings, log_order=math.log(relabellings.shape[0]))


if numba is not None:
    compile_numba(globals(), nogil=("_log_permanent", "_log_permanents", "_log_permanent_by_subsets"))
