"""Exact evidence and posterior expectations by enumerating allocation tensors (Cemgil et al. 2019 §5.1.1).

The evidence L_X = Σ_{S : S_V = X} π(S) (eq. 3.7) is a sum over every way of splitting each
observed cell's count among the configurations of the free (latent or missing) nodes:
∏_cells C(X_u + L_u − 1, L_u − 1) tensors. Without free nodes S = X and the sum is the closed
form (eq. 3.11), feasible at any size. The number of tensors is computed before enumerating; above
``max_tensors`` a ``ValueError`` names the estimators to use instead.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
from scipy.special import gammaln, logsumexp

from ..estimate import EvidenceEstimate
from ..models.allocation import AllocationModel, BoundModel, CellLayout
from .info import ExactInfo
from .registry import register_evidence

DEFAULT_MAX_TENSORS = 1_000_000


def _compositions(n: int, k: int) -> np.ndarray:
    """All vectors of k nonnegative integers summing to n (stars and bars), shape (C, k)."""
    if k == 1:
        return np.array([[n]], dtype=np.int64)
    rows = []
    for bars in itertools.combinations(range(n + k - 1), k - 1):
        edges = (-1, *bars, n + k - 1)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(k)])
    return np.array(rows, dtype=np.int64)


def count_allocations(data, layout: CellLayout) -> int:
    """Number of allocation tensors consistent with the data (exact integer)."""
    total = 1
    for u, n in enumerate(data.counts):
        k = layout.num_configs if layout.valid is None else int(layout.valid[u].sum())
        total *= math.comb(int(n) + k - 1, k - 1)
    return total


def log_count_allocations(data, layout: CellLayout) -> float:
    """Natural log of :func:`count_allocations`, without forming the (possibly huge) integer."""
    k = np.full(data.nnz, layout.num_configs) if layout.valid is None else layout.valid.sum(axis=1)
    n = data.counts.astype(np.float64)
    return float(np.sum(gammaln(n + k) - gammaln(k) - gammaln(n + 1.0)))


def _column_matrix(bound: BoundModel) -> np.ndarray:
    """(flat table index) -> (flat column index) incidence, for column sums of the counts."""
    cols = []
    cstart = bound.column_starts
    for k, t in enumerate(bound.tables):
        cols.append(cstart[k] + np.arange(t.size) // t.shape[-1])
    col_of = np.concatenate(cols)
    out = np.zeros((col_of.size, int(cstart[-1])))
    out[np.arange(col_of.size), col_of] = 1.0
    return out


def enumerate_allocations(bound: BoundModel, data, layout: CellLayout, max_tensors=DEFAULT_MAX_TENSORS,
                          chunk_size: int = 20_000):
    """Yield ``(log_prob, flat_counts)`` chunks over all allocation tensors consistent with data.

    ``log_prob`` is log π(S) (eq. 3.11, or its conditioned form) and ``flat_counts`` the table
    counts S_fa of every tensor, concatenated as in :attr:`BoundModel.flat_concentration`.
    """
    log_num = log_count_allocations(data, layout)
    if log_num > np.log(max_tensors) + 1e-9:
        raise ValueError(
            f"exact enumeration would visit about 10^{log_num / np.log(10):.1f} allocation tensors "
            f"(max_tensors={max_tensors}); use method='auto' or 'tempered' for an estimate with a "
            "standard error, or method='vb' for a lower bound"
        )
    num = count_allocations(data, layout)
    size = int(bound.table_starts[-1])
    contrib, lg = [], []
    for u, n in enumerate(data.counts):
        configs = np.arange(layout.num_configs) if layout.valid is None else np.flatnonzero(layout.valid[u])
        comps = _compositions(int(n), configs.size)
        onehot = np.zeros((configs.size, size))
        for m in range(layout.num_members):
            np.add.at(onehot, (np.arange(configs.size), layout.cell_flat[m, u] + layout.config_flat[m, configs]), 1.0)
        contrib.append(comps @ onehot)
        lg.append(gammaln(comps + 1.0).sum(1))
    alpha = bound.flat_concentration
    alpha_col = bound.flat_column_concentration
    colmat = _column_matrix(bound)
    const = (bound.log_total_term() + bound.conditioned_log_factorials(data)
             - (gammaln(alpha).sum() - gammaln(alpha_col).sum()))
    # Cells with a single composition (one allowed configuration) add the same to every tensor;
    # only the others are enumerated (np.unravel_index takes at most 64 axes).
    fixed_counts = sum((c[0] for c in contrib if c.shape[0] == 1), np.zeros(size))
    const -= sum(float(g[0]) for c, g in zip(contrib, lg) if c.shape[0] == 1)
    varying = [(c, g) for c, g in zip(contrib, lg) if c.shape[0] > 1]
    sizes = [c.shape[0] for c, _ in varying]
    for start in range(0, num, chunk_size):
        flat_idx = np.arange(start, min(start + chunk_size, num))
        choice = np.unravel_index(flat_idx, sizes) if sizes else ()
        counts = np.tile(fixed_counts, (flat_idx.size, 1))
        logp = np.full(flat_idx.size, const)
        for (cell_counts, cell_lg), ch in zip(varying, choice):
            counts += cell_counts[ch]
            logp -= cell_lg[ch]
        logp += gammaln(alpha + counts).sum(1) - gammaln(alpha_col + counts @ colmat).sum(1)
        yield logp, counts


def exact_log_evidence(model: AllocationModel, data, max_tensors: int = DEFAULT_MAX_TENSORS) -> float:
    """log L_X, exact: closed form without free nodes, enumeration otherwise."""
    data = model.as_data(data)
    bound = model.bind(data)
    if not bound.latent and not data.has_missing:
        cells = data.indices[:, [bound.visible.index(n) for n in bound.nodes]]
        return bound.log_prob_cells(cells, data.counts)
    layout = bound.cell_layout(data)
    parts = [logsumexp(logp) for logp, _ in enumerate_allocations(bound, data, layout, max_tensors)]
    return float(logsumexp(parts))


def exact_posterior_mean(model: AllocationModel, data, statistic, max_tensors: int = DEFAULT_MAX_TENSORS):
    """E[statistic(flat_counts) | X] under π(S | X), by enumeration.

    ``statistic`` maps a ``(chunk, size)`` array of concatenated table counts to ``(chunk, ...)``.
    """
    data = model.as_data(data)
    bound = model.bind(data)
    layout = bound.cell_layout(data)
    log_norm = exact_log_evidence(model, data, max_tensors)
    total = 0.0
    for logp, counts in enumerate_allocations(bound, data, layout, max_tensors):
        w = np.exp(logp - log_norm)
        stat = np.asarray(statistic(counts))
        total = total + np.tensordot(w, stat, axes=(0, 0))
    return total


def expected_cell_probabilities(bound: BoundModel, flat_counts: np.ndarray, grid_layout: CellLayout) -> np.ndarray:
    """E[p(i_V) | S] for every cell of ``grid_layout``: Σ_l ∏_m (α + S)/(column total).

    Exact because the tables are independent Dirichlets given S (eq. 3.10) and each table entry
    enters a product at most once (tied members use distinct draws: we add the within-token
    increment, as in the Pólya urn).
    """
    flat_counts = np.atleast_2d(flat_counts)
    alpha = bound.flat_concentration + flat_counts
    colmat = _column_matrix(bound)
    alpha_col = bound.flat_column_concentration + flat_counts @ colmat
    idx = grid_layout.cell_flat[:, :, None] + grid_layout.config_flat[:, None, :]
    cidx = grid_layout.cell_col[:, :, None] + grid_layout.config_col[:, None, :]
    prod = np.ones((flat_counts.shape[0],) + idx.shape[1:])
    for m in range(grid_layout.num_members):
        num = alpha[:, idx[m]]
        den = alpha_col[:, cidx[m]]
        for k in grid_layout.same_table_before[m]:
            num = num + (idx[k] == idx[m])
            den = den + (cidx[k] == cidx[m])
        prod *= num / den
    if grid_layout.valid is not None:
        prod *= grid_layout.valid
    return prod.sum(-1)


@register_evidence("exact", models=(AllocationModel,))
def _exact(model, data, *, rng_key=None, max_tensors: int = DEFAULT_MAX_TENSORS):
    """The exact log evidence by enumerating the allocation tensors (:func:`exact_log_evidence`)."""
    start = time.perf_counter()
    value = exact_log_evidence(model, data, max_tensors=max_tensors)
    return EvidenceEstimate(value=value, stderr=0.0, method="exact", kind="exact", num_runs=0,
                            seconds=time.perf_counter() - start, info=ExactInfo(max_tensors=max_tensors))
