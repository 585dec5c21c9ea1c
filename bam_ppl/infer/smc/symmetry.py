"""Label symmetries of the tempered SMC from a reference (:mod:`bam_ppl.infer.smc.tempered`): the
relabellings of the latent values that leave p(X, z) unchanged, and the sums of a product
reference over them (enumerated, or a permanent per relabelling of the other nodes)."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from ..kernels import compile_numba
from .tempered_problem import (
    TemperedProblem,
    configs_with_node,
)

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None


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
SINKHORN_STEPS = 20
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
    programming over the subsets S of columns given to the first |S| rows: f(S) = Σ_(j ∈ S)
    f(S − {j}) A[|S| − 1, j], with A = exp(M) (a sum of nonnegative terms, so no cancellation;
    K 2^K steps). A is first balanced towards doubly stochastic by Sinkhorn steps in log space
    (each scales the permanent by a known factor), so that the products neither under- nor
    overflow. nan if the sum underflows all the same."""
    K = M.shape[0]
    L = M.copy()
    log_scale = 0.0
    for _ in range(SINKHORN_STEPS):
        for i in range(K):
            top = L[i].max()
            s = top + math.log(np.exp(L[i] - top).sum())
            L[i] -= s
            log_scale += s
        for j in range(K):
            top = L[:, j].max()
            s = top + math.log(np.exp(L[:, j] - top).sum())
            L[:, j] -= s
            log_scale += s
    A = np.exp(L)
    size = 1 << K
    count = np.zeros(size, np.int64)  # |S|; row |S| − 1 takes the last column of S
    f = np.zeros(size)
    f[0] = 1.0
    for S in range(1, size):
        count[S] = count[S >> 1] + (S & 1)
        row = count[S] - 1
        total = 0.0
        for j in range(K):
            if (S >> j) & 1:
                total += f[S ^ (1 << j)] * A[row, j]
        f[S] = total
    permanent = f[size - 1]
    if not (permanent > 0.0 and np.isfinite(permanent)):
        return np.nan
    return log_scale + math.log(permanent)


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
        order[d] = np.argsort(-row)
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


def orbit_log_sums(tp: TemperedProblem, log_ref: np.ndarray, config: np.ndarray,
                   symmetry: LabelSymmetry) -> tuple[np.ndarray, np.ndarray] | None:
    """(log q(z), log Σ_g q(g(z))) of every particle (``config`` (P, T)) for the product reference
    ``log_ref`` (U, L), over the label symmetries g of ``symmetry``; None when a permanent cannot
    be summed (:func:`_log_permanents`)."""
    num_configs = tp.num_configs
    own, orbit = np.empty(config.shape[0]), np.empty(config.shape[0])
    rows = np.arange(num_configs)
    if symmetry.swap is not None:
        K = symmetry.swap.shape[1]
        one_hot = (symmetry.value[:, None] == np.arange(K)).astype(np.float64)  # (L, K)
        targets = symmetry.swap[symmetry.relabellings]  # (H, L, K): h(l) with the node set to k
        sums = []  # (M, occupied) of every particle, summed below on every core
    for p in range(config.shape[0]):
        groups = np.bincount(tp.token_cell.astype(np.int64) * num_configs + config[p],
                             minlength=log_ref.shape[0] * num_configs).reshape(-1, num_configs)
        # log q(g(z)) = Σ_(u, l) S[u, l] log q[u, g(l)] for every g
        scores = groups.T @ log_ref  # (L, L): [l, l'] = Σ_u S[u, l] log q[u, l']
        if symmetry.swap is None:
            by_relabelling = scores[rows[None, :], symmetry.relabellings].sum(1)
            own[p], orbit[p] = by_relabelling[0], _log_sum_exp(by_relabelling)
            continue
        # g = σ ∘ h, σ permuting the values of the node of ``value``, h the others' (``relabellings``):
        # Σ_l scores[l, g(l)] = Σ_k M_h[k, σ(k)], M_h[k, j] = Σ over l with value k of scores[l, h(l) with value j]
        M = np.einsum("hlj,lk->hkj", scores[rows[None, :, None], targets], one_hot)
        occupied = np.bincount(symmetry.value, weights=groups.sum(0), minlength=K) > 0
        own[p] = np.trace(M[0])
        sums.append((M, occupied))
    if symmetry.swap is None:
        return own, orbit

    def log_sum(item):
        log_sums = _log_permanents(*item, PERMANENT_DROP_NATS, PERMANENT_MAX_NODES, PERMANENT_SUBSET_MAX)
        return _log_sum_exp(log_sums) if not np.isnan(log_sums).any() else np.nan

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # the sums release the GIL
        orbit = np.array(list(pool.map(log_sum, sums)))
    return None if np.isnan(orbit).any() else (own, orbit)


def _log_sum_exp(x: np.ndarray) -> float:
    peak = np.max(x)
    if not np.isfinite(peak):
        return float(peak)
    return float(peak + np.log(np.sum(np.exp(x - peak))))


def label_symmetries_of(bound, data, layout) -> LabelSymmetry:
    """The :class:`LabelSymmetry` of a problem: enumerated up to MAX_RELABELLINGS relabellings;
    beyond, the permanent of the largest symmetric node's permutations around the enumerated
    relabellings of the others, up to PERMANENT_MAX_OUTER of them; otherwise the identity alone,
    with the warning of :func:`~bam_ppl.infer.gibbs.chib.label_symmetries`."""
    from ..gibbs.chib import (
        MAX_RELABELLINGS,
        _Problem,
        label_symmetries,
        node_relabellings,
        symmetric_nodes,
    )

    problem = _Problem(bound, data, layout, False, MAX_RELABELLINGS)
    arrays = (problem.structure, problem.concentration, problem.fixed_counts, problem.num_entries)
    nodes = symmetric_nodes(bound, layout, *arrays)
    sizes = [bound.sizes[name] for name in layout.free]
    order = math.prod(math.factorial(sizes[p]) for p in nodes)
    if nodes and order > MAX_RELABELLINGS:
        largest = max(nodes, key=lambda p: sizes[p])
        others = [p for p in nodes if p != largest]
        if order // math.factorial(sizes[largest]) <= PERMANENT_MAX_OUTER:
            swap = np.stack([configs_with_node(layout, sizes, largest, k) for k in range(sizes[largest])], axis=1)
            return LabelSymmetry(node_relabellings(layout, sizes, others), np.asarray(layout.configs)[:, largest].copy(),
                                 swap, math.log(order))
    relabellings = label_symmetries(bound, layout, *arrays, MAX_RELABELLINGS, "the tempered SMC from a reference")
    return LabelSymmetry(relabellings, log_order=math.log(relabellings.shape[0]))


if numba is not None:
    compile_numba(globals(), nogil=("_log_permanent", "_log_permanents", "_log_permanent_by_subsets"))
