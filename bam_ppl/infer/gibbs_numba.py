"""Numba CPU kernel for the collapsed Gibbs sweep of :mod:`bam_ppl.infer.gibbs`.

On a CPU, one iteration of the JAX ``lax.scan`` over tokens costs a few XLA kernel launches, far
more than the arithmetic of one token update. This module runs the same update as compiled
machine code: the same problem arrays (:class:`~bam_ppl.infer.gibbs.GibbsProblem`), the same
urn conditional (papers/000 eq. 4.1 with the token's own increments removed, eq. 4.4), the same
tie and missing-entry handling; only the random streams differ (a NumPy ``Generator`` per chain,
seeded from the JAX key). numba is an optional dependency (extra ``fast``); without it
``HAVE_NUMBA`` is False and the JAX kernel is used.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

try:
    import numba
except ImportError:
    numba = None

HAVE_NUMBA = numba is not None

# What a call of the kernel does with each token.
SWEEP = 0  # remove the token's increments, redraw its configuration, add them back
URN = 1  # add the token, drawn from the urn given the tokens placed so far (papers/000 §4.2)
UNIFORM = 2  # add the token with a configuration drawn uniformly among those its cell allows


def _row_value(shifted, index, row, tie_rows, tie_earlier):
    """(α + S)[index[row]] plus the increments of tied earlier members of the same token."""
    value = shifted[index[row]]
    for tie in range(tie_rows.shape[0]):
        if tie_rows[tie] == row and index[tie_earlier[tie]] == index[row]:
            value += 1.0
    return value


def _place_tokens(rng, mode, num_sweeps, shuffle, counts, shifted, config, order, token_cell, row_base,
                  row_offset, valid, numerator_rows, denominator_rows, tie_rows, tie_earlier, moved,
                  log_space, has_valid):
    """``num_sweeps`` passes over the tokens of one chain, in place.

    ``counts`` (int) and ``shifted`` (= concentration + counts, float64) are updated together:
    the urn weights read ``shifted`` so that each factor costs one load. ``order`` is reshuffled
    (Fisher–Yates) before each pass when ``shuffle``. Each token's configuration is drawn by
    inverse CDF with one uniform from ``rng``.
    """
    num_rows = row_base.shape[0]
    num_configs = row_offset.shape[1]
    num_tokens = order.shape[0]
    logs = log_space and mode != UNIFORM
    index = np.empty(num_rows, np.int64)
    cdf = np.empty(num_configs)
    for _ in range(num_sweeps):
        if shuffle:
            for i in range(num_tokens - 1, 0, -1):
                j = int(rng.random() * (i + 1))
                order[i], order[j] = order[j], order[i]
        for position in range(num_tokens):
            token = order[position]
            cell = token_cell[token]
            if mode == SWEEP:
                old = config[token]
                for m in moved:
                    i = row_base[m, cell] + row_offset[m, old]
                    counts[i] -= 1
                    shifted[i] -= 1.0
            # Unnormalised weights of eq. 4.1 over the free configurations, stored in ``cdf``.
            largest = -np.inf
            for c in range(num_configs):
                if has_valid and not valid[cell, c]:
                    cdf[c] = -np.inf if logs else 0.0
                    continue
                if mode == UNIFORM:
                    cdf[c] = 1.0
                    continue
                for r in range(num_rows):
                    index[r] = row_base[r, cell] + row_offset[r, c]
                if logs:
                    weight = 0.0
                    for r in numerator_rows:
                        weight += math.log(_row_value(shifted, index, r, tie_rows, tie_earlier))
                    for r in denominator_rows:
                        weight -= math.log(_row_value(shifted, index, r, tie_rows, tie_earlier))
                    largest = max(largest, weight)
                else:
                    numerator = 1.0
                    for r in numerator_rows:
                        numerator *= _row_value(shifted, index, r, tie_rows, tie_earlier)
                    denominator = 1.0
                    for r in denominator_rows:
                        denominator *= _row_value(shifted, index, r, tie_rows, tie_earlier)
                    weight = numerator / denominator
                cdf[c] = weight
            total = 0.0
            last_positive = 0
            for c in range(num_configs):
                weight = math.exp(cdf[c] - largest) if logs else cdf[c]
                if weight > 0.0:
                    last_positive = c
                total += weight
                cdf[c] = total
            # Inverse CDF; rounding can put the target at the total, hence the last fallback.
            target = rng.random() * total
            new = last_positive
            for c in range(num_configs):
                if target < cdf[c]:
                    new = c
                    break
            for m in moved:
                i = row_base[m, cell] + row_offset[m, new]
                counts[i] += 1
                shifted[i] += 1.0
            config[token] = new


if HAVE_NUMBA:
    _row_value = numba.njit(inline="always", cache=True)(_row_value)
    # nogil: chains run in threads, each with its own Generator and arrays.
    _place_tokens = numba.njit(nogil=True, cache=True)(_place_tokens)


def _seeded(key) -> np.random.Generator:
    """A NumPy Generator seeded from the words of a raw JAX key."""
    return np.random.default_rng([int(word) for word in np.asarray(key, np.uint32).reshape(-1)])


class NumbaChains:
    """Every chain's allocation as NumPy arrays, advanced by the numba kernel.

    Chain c draws from its own Generator seeded by ``sweep_keys[c]`` (its initial allocation
    from ``init_keys[c]``), so results do not depend on how the chains share the CPU cores;
    with several chains they run in threads (the kernel releases the GIL).

    Parameters
    ----------
    spec, problem : GibbsSpec, GibbsProblem
        From :func:`bam_ppl.infer.gibbs.build_problem`.
    init_keys, sweep_keys : array (num_chains, 2) uint32
        Raw JAX keys of each chain's initial allocation and of its sweeps.
    init_method : {"urn", "uniform"}
    """

    def __init__(self, spec, problem, init_keys, sweep_keys, init_method: str):
        num_chains = len(sweep_keys)
        num_tokens = problem.token_cell.shape[0]
        self.num_chains = num_chains
        self.shuffle = spec.token_order == "random"
        self.concentration = np.asarray(problem.concentration, np.float64)
        as_rows = lambda rows: np.asarray(rows, np.int64).reshape(-1)  # noqa: E731
        self.structure = (
            np.asarray(problem.token_cell, np.int32), np.asarray(problem.row_base, np.int32),
            np.asarray(problem.row_offset, np.int32), np.asarray(problem.valid, np.bool_),
            as_rows(spec.numerator_rows), as_rows(spec.denominator_rows),
            as_rows([row for row, _ in spec.ties]), as_rows([earlier for _, earlier in spec.ties]),
            as_rows(spec.moved), bool(spec.log_space), bool(spec.has_valid),
        )
        self.counts = np.tile(np.asarray(problem.fixed_counts, np.int32), (num_chains, 1))
        self.config = np.zeros((num_chains, num_tokens), np.int32)
        self.orders = np.tile(np.arange(num_tokens, dtype=np.int32), (num_chains, 1))
        self.rngs = [_seeded(key) for key in sweep_keys]
        self._pool = ThreadPoolExecutor(max_workers=min(num_chains, os.cpu_count() or 1))
        # The urn initialisation visits the tokens in random order, whatever the sweep order.
        init_orders = np.tile(np.arange(num_tokens, dtype=np.int32), (num_chains, 1))
        mode = URN if init_method == "urn" else UNIFORM
        self._each_chain([_seeded(key) for key in init_keys], mode, 1, mode == URN, init_orders)

    def advance(self, num_sweeps: int) -> None:
        """``num_sweeps`` Gibbs sweeps of every chain."""
        self._each_chain(self.rngs, SWEEP, num_sweeps, self.shuffle, self.orders)

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown()

    def _each_chain(self, rngs, mode, num_sweeps, shuffle, orders):
        def one(chain):
            shifted = self.concentration + self.counts[chain]
            _place_tokens(rngs[chain], mode, num_sweeps, shuffle, self.counts[chain], shifted,
                          self.config[chain], orders[chain], *self.structure)

        if self.num_chains == 1:
            one(0)
        else:
            list(self._pool.map(one, range(self.num_chains)))
