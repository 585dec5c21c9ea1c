"""The VB iteration of :mod:`bam_ppl.infer.variational.vb` as a numba kernel on host arrays.

The same coordinate ascent as :func:`~bam_ppl.infer.variational.vb.step` (App. D of Cemgil et al.
2019), restart by restart: q(S), then q(θ), then the ELBO. A cell's configuration weighs
Π_m exp(E log θ_m), the exponentials taken once per table entry rather than once per cell and configuration
(as Hoffman, Blei & Bach 2010 do for LDA). numba compiles it once per machine for
every shape (``cache=True``), where XLA compiles the vectorised step anew for every data shape, about
as long as the evidence engine's whole VB search then runs.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None

from ..kernels import FASTMATH, compile_numba

_SHIFT = 10  # ψ(x) = ψ(x + 10) − Σ_{k<10} 1 / (x + k), then the asymptotic series at x + 10 ≥ 10
_DIGAMMA_SERIES = (1.0 / 12, -1.0 / 120, 1.0 / 252, -1.0 / 240, 1.0 / 132, -691.0 / 32760)  # B_2n / (2n)


def _digamma(x: float) -> float:
    """ψ(x) for x > 0 (Abramowitz & Stegun 6.3.5 and 6.3.18), absolute error below 1e-15 at x ≥ 1e-3."""
    shift = 0.0
    for k in range(_SHIFT):
        shift += 1.0 / (x + k)
    y = x + _SHIFT
    inv2 = 1.0 / (y * y)
    series = 0.0
    for n in range(len(_DIGAMMA_SERIES) - 1, -1, -1):
        series = series * inv2 + _DIGAMMA_SERIES[n]
    return math.log(y) - 0.5 / y - series * inv2 - shift


# Below this, a cell's summed weights (each at most 1) may have lost precision to underflow: it is weighed in logs.
_TINY = 1e-280


def _cell_log_domain(problem, log_weights, u, potential) -> float:
    """Cell u's configurations' weights exp(Σ_m log w) into ``potential``, scaled by their largest, and the
    log of that largest: the path for a cell whose weights all underflow in :func:`_vb_restart`."""
    _, cell_flat, config_flat, valid, mask = problem[:5]
    top = -np.inf
    for l in range(potential.size):
        total = 0.0
        for m in range(cell_flat.shape[0]):
            total += mask[m, u] * log_weights[cell_flat[m, u] + config_flat[m, l]]
        potential[l] = total
        if valid[u, l] and total > top:
            top = total
    for l in range(potential.size):
        potential[l] = math.exp(potential[l] - top) if valid[u, l] else 0.0
    return top


def _theta_update(alpha, expected, column_of, alpha_hat, log_weights, column, entropy) -> tuple:
    """q(θ) from the expected counts ``expected`` (App. D of Cemgil et al. 2019): ``alpha_hat`` = α + E[n] and
    ``log_weights`` = E log θ, in place; returns the ELBO's Σ log B(α̂) and its ``entropy`` less Σ_f E log θ_f · E[n_f]."""
    column[:] = 0.0
    for f in range(alpha.shape[0]):
        entropy -= log_weights[f] * expected[f]
        alpha_hat[f] = alpha[f] + expected[f]
        column[column_of[f]] += alpha_hat[f]
    log_beta = 0.0
    for c in range(column.size):
        log_beta -= math.lgamma(column[c])
        column[c] = _digamma(column[c])
    for f in range(alpha.shape[0]):
        log_beta += math.lgamma(alpha_hat[f])
        log_weights[f] = _digamma(alpha_hat[f]) - column[column_of[f]]
    return log_beta, entropy


def _vb_restart(problem, state, b, num_iters, tol, trace):
    """``trace.size`` iterations of restart ``b`` of ``state`` (a ``VBState`` of host arrays, restarts on the
    leading axis) on ``problem`` (:class:`HostProblem`), in place; ``trace`` gets the ELBO after each
    iteration. A restart that converged (relative ELBO change ≤ ``tol``) or used ``num_iters``
    iterations keeps its state. The loop over cells is written out here: numba compiled a helper inlined
    per cell to half the speed (``benchmarks/vb_vs_sklearn.py --baseline``)."""
    counts, cell_flat, config_flat, valid, mask, alpha, column_of, num_columns, constant = problem
    log_weights, alpha_hat = state.log_weights[b], state.alpha_hat[b]
    elbos, iterations, converged = state.elbo, state.iteration, state.converged
    (M, U), L, F = cell_flat.shape, config_flat.shape[1], alpha.shape[0]
    potential, index = np.empty(L), np.empty((L, M), np.int64)
    expected, weights, column = np.empty(F), np.empty(F), np.empty(num_columns)
    for it in range(trace.shape[0]):
        if converged[b] or iterations[b] >= num_iters:
            trace[it] = elbos[b]
            continue
        shift = np.max(log_weights)
        for f in range(F):
            weights[f] = math.exp(log_weights[f] - shift)
        expected[:] = 0.0
        entropy = 0.0
        for u in range(U):
            norm, members = 0.0, 0.0
            for m in range(M):
                members += mask[m, u]
            for l in range(L):
                weight = 0.0
                if valid[u, l]:
                    weight = 1.0
                    for m in range(M):
                        index[l, m] = cell_flat[m, u] + config_flat[m, l]
                        if mask[m, u] != 0.0:
                            weight *= weights[index[l, m]]
                potential[l] = weight
                norm += weight
            if norm > _TINY:
                entropy += counts[u] * (math.log(norm) + members * shift)
            else:  # every weight underflowed: the cell in logs
                top = _cell_log_domain(problem, log_weights, u, potential)
                norm = np.sum(potential)
                entropy += counts[u] * (top + math.log(norm))
            for l in range(L):
                if valid[u, l]:
                    share = counts[u] * (potential[l] / norm)
                    for m in range(M):
                        expected[index[l, m]] += mask[m, u] * share
        log_beta, entropy = _theta_update(alpha, expected, column_of, alpha_hat, log_weights, column, entropy)
        elbo = constant + log_beta + entropy
        converged[b] = abs(elbo - elbos[b]) <= tol * abs(elbo)
        elbos[b] = elbo
        iterations[b] += 1
        trace[it] = elbo


def _vb_restarts(problem, state, first, stop, num_iters, tol, traces):
    """:func:`_vb_restart` for restarts ``first .. stop − 1`` (rows of ``traces``)."""
    for b in range(first, stop):
        _vb_restart(problem, state, b, num_iters, tol, traces[b])


if numba is not None:
    compile_numba(globals(), inline=("_digamma", "_cell_log_domain", "_theta_update"), nogil=("_vb_restarts",))
    # Sums of products in any order, as XLA's vectorised step takes them: no NaN or infinity arises.
    _vb_restart = numba.njit(nogil=True, cache=True, fastmath=FASTMATH)(_vb_restart)


class HostProblem(NamedTuple):
    """The arrays of a :class:`~bam_ppl.infer.variational.vb.CellProblem` the kernel reads, on the host: every
    configuration ``valid`` and every member's ``mask`` 1 where the problem has none."""

    counts: np.ndarray
    cell_flat: np.ndarray
    config_flat: np.ndarray
    valid: np.ndarray
    mask: np.ndarray
    alpha: np.ndarray
    column_of: np.ndarray
    num_columns: int
    constant: float


def host_problem(problem) -> HostProblem:
    """The :class:`HostProblem` of a ``CellProblem``: writable copies, as numba types read-only arrays (what
    NumPy makes of device arrays) as other arguments and would compile the kernel once more for them."""
    def copy(array, dtype):
        return np.array(array, dtype, order="C", copy=True)

    cell_flat = copy(problem.cell_flat, np.int64)
    M, U = cell_flat.shape
    L = problem.config_flat.shape[1]
    valid = np.ones((U, L), np.bool_) if problem.valid is None else copy(problem.valid, np.bool_)
    mask = np.ones((M, U)) if problem.member_mask is None else copy(problem.member_mask, np.float64)
    return HostProblem(copy(problem.counts, np.float64), cell_flat, copy(problem.config_flat, np.int64), valid, mask,
                       copy(problem.alpha, np.float64), copy(problem.column_of, np.int64),
                       int(problem.alpha_col.shape[0]), float(problem.constant))


def run_chunk(problem: HostProblem, states, num_iters: int, tol: float, length: int):
    """``length`` iterations of every restart of ``states`` (a ``VBState`` with a leading restart axis):
    the new states and the ELBO after each iteration (length, restarts), as the scanned JAX chunk
    returns them. The restarts are shared out among the cores."""
    state = type(states)(np.array(states.log_weights, np.float64, order="C", copy=True),
                         np.array(states.alpha_hat, np.float64, order="C", copy=True),
                         np.array(states.elbo, np.float64, copy=True), np.array(states.iteration, np.int64, copy=True),
                         np.array(states.converged, np.bool_, copy=True))
    traces = np.empty((state.elbo.size, length))
    edges = np.linspace(0, state.elbo.size, min(state.elbo.size, os.cpu_count() or 1) + 1).astype(np.int64)

    def restarts(first, stop):  # Python scalars: one compiled signature whatever the caller passes
        _vb_restarts(problem, state, int(first), int(stop), int(num_iters), float(tol), traces)

    with ThreadPoolExecutor(max_workers=edges.size - 1) as pool:
        list(pool.map(restarts, edges[:-1], edges[1:]))
    new = state._replace(iteration=state.iteration.astype(np.int32))
    return new, traces.T
