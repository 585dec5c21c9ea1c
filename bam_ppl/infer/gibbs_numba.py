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

import jax.numpy as jnp
import numpy as np

from ..types import numpy_generator

try:
    import numba
except ImportError:
    numba = None

HAVE_NUMBA = numba is not None

# What a call of the kernel does with each token.
SWEEP = 0  # remove the token's increments, redraw its configuration, add them back
URN = 1  # add the token, drawn from the urn given the tokens placed so far (papers/000 §4.2)
UNIFORM = 2  # add the token with a configuration drawn uniformly among those its cell allows


def _row_values(values, shifted, base, row_offset, row, tie_rows, tie_earlier):
    """values[c] = (α + S)[index of ``row`` at configuration c], plus one where a tied earlier
    member of the same token has its increment at the same index."""
    row_base = base[row]
    for c in range(values.shape[0]):
        values[c] = shifted[row_base + row_offset[row, c]]
    for tie in range(tie_rows.shape[0]):
        if tie_rows[tie] == row:
            earlier = tie_earlier[tie]
            for c in range(values.shape[0]):
                if base[earlier] + row_offset[earlier, c] == row_base + row_offset[row, c]:
                    values[c] += 1.0


def _place_tokens(rng, mode, num_sweeps, shuffle, shifted, config, order, token_cell, row_base,
                  row_offset, valid, numerator_rows, denominator_rows, tie_rows, tie_earlier, moved,
                  log_space, has_valid):
    """``num_sweeps`` passes over the tokens of one chain, in place.

    The counts are carried as ``shifted`` = concentration + counts (float64), so that each
    factor of the urn weights costs one load; the caller recovers the integer counts by
    rounding (±1 steps on numbers far below 2**52 stay within rounding error of an integer
    offset of the concentration). ``order`` is reshuffled
    (Fisher–Yates) before each pass when ``shuffle``. Each token's configuration is drawn by
    inverse CDF with one uniform from ``rng``. The weights are built one row at a time over all
    configurations, loops the compiler can vectorise.
    """
    num_rows = row_base.shape[0]
    num_configs = row_offset.shape[1]
    num_tokens = order.shape[0]
    logs = log_space and mode != UNIFORM
    base = np.empty(num_rows, np.int64)
    tied = np.zeros(num_rows, np.bool_)
    for tie in range(tie_rows.shape[0]):
        tied[tie_rows[tie]] = True
    consecutive = np.ones(num_rows, np.bool_)  # offsets first, first + 1, first + 2, ...
    for r in range(num_rows):
        for c in range(1, num_configs):
            if row_offset[r, c] != row_offset[r, 0] + c:
                consecutive[r] = False
    values = np.empty(num_configs)
    denominator = np.empty(num_configs)
    weight = np.empty(num_configs)
    for _ in range(num_sweeps):
        if shuffle:
            for i in range(num_tokens - 1, 0, -1):
                j = int(rng.random() * (i + 1))
                order[i], order[j] = order[j], order[i]
        for position in range(num_tokens):
            token = order[position]
            cell = token_cell[token]
            for r in range(num_rows):
                base[r] = row_base[r, cell]
            if mode == SWEEP:
                old = config[token]
                for m in moved:
                    i = base[m] + row_offset[m, old]
                    shifted[i] -= 1.0
            # Unnormalised weights of eq. 4.1 over the free configurations.
            if mode == UNIFORM:
                weight[:] = 1.0
            elif logs:
                weight[:] = 0.0
                for r in numerator_rows:
                    _row_values(values, shifted, base, row_offset, r, tie_rows, tie_earlier)
                    for c in range(num_configs):
                        weight[c] += math.log(values[c])
                for r in denominator_rows:
                    _row_values(values, shifted, base, row_offset, r, tie_rows, tie_earlier)
                    for c in range(num_configs):
                        weight[c] -= math.log(values[c])
            else:
                weight[:] = 1.0
                denominator[:] = 1.0
                for r in numerator_rows:
                    if tied[r]:
                        _row_values(values, shifted, base, row_offset, r, tie_rows, tie_earlier)
                        for c in range(num_configs):
                            weight[c] *= values[c]
                    elif consecutive[r]:  # the common case after relabelling: a vector load
                        start = base[r] + row_offset[r, 0]
                        for c in range(num_configs):
                            weight[c] *= shifted[start + c]
                    else:
                        for c in range(num_configs):
                            weight[c] *= shifted[base[r] + row_offset[r, c]]
                for r in denominator_rows:
                    if tied[r]:
                        _row_values(values, shifted, base, row_offset, r, tie_rows, tie_earlier)
                        for c in range(num_configs):
                            denominator[c] *= values[c]
                    elif consecutive[r]:
                        start = base[r] + row_offset[r, 0]
                        for c in range(num_configs):
                            denominator[c] *= shifted[start + c]
                    else:
                        for c in range(num_configs):
                            denominator[c] *= shifted[base[r] + row_offset[r, c]]
                total = 0.0
                for c in range(num_configs):
                    weight[c] /= denominator[c]
                    total += weight[c]
            if has_valid or logs or mode == UNIFORM:
                if has_valid:
                    for c in range(num_configs):
                        if not valid[cell, c]:
                            weight[c] = -np.inf if logs else 0.0
                if logs:
                    largest = weight.max()
                    for c in range(num_configs):
                        weight[c] = math.exp(weight[c] - largest)
                total = weight.sum()
            # Inverse CDF, accumulating only up to the target. Rounding can leave the target at
            # the total: then the last configuration with a positive weight.
            target = rng.random() * total
            new = num_configs - 1
            cumulative = 0.0
            for c in range(num_configs):
                cumulative += weight[c]
                if target < cumulative:
                    new = c
                    break
            else:
                while new > 0 and weight[new] == 0.0:
                    new -= 1
            for m in moved:
                i = base[m] + row_offset[m, new]
                shifted[i] += 1.0
            config[token] = new


if HAVE_NUMBA:
    _row_values = numba.njit(inline="always", cache=True)(_row_values)
    # nogil: chains run in threads, each with its own Generator and arrays.
    _place_tokens = numba.njit(nogil=True, cache=True, fastmath={"nsz", "arcp", "contract", "reassoc"})(_place_tokens)


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


def _seeded(key) -> np.random.Generator:
    """The chain's NumPy Generator, seeded from a raw JAX key (array of two uint32 words)."""
    return numpy_generator(jnp.asarray(key, jnp.uint32))


class NumbaChains:
    """Every chain's allocation as NumPy arrays, advanced by the numba kernel.

    Chain c draws from its own Generator seeded by ``sweep_keys[c]`` (its initial allocation
    from ``init_keys[c]``), so results do not depend on how the chains share the CPU cores:
    in parallel threads (the kernel releases the GIL) or one after another.

    Parameters
    ----------
    spec, problem : GibbsSpec, GibbsProblem
        From :func:`bam_ppl.infer.gibbs.build_problem`.
    init_keys, sweep_keys : array (num_chains, 2) uint32
        Raw JAX keys of each chain's initial allocation and of its sweeps.
    init_method : {"urn", "uniform"}
    parallel : bool
        Run the chains in up to ``os.cpu_count()`` threads rather than one after another.
    """

    def __init__(self, spec, problem, init_keys, sweep_keys, init_method: str, parallel: bool = True):
        num_chains = len(sweep_keys)
        num_tokens = problem.token_cell.shape[0]
        self.num_chains = num_chains
        self.shuffle = spec.token_order == "random"
        concentration = np.asarray(problem.concentration, np.float64)
        self._new_of_old, row_base, row_offset = contiguous_relabelling(
            np.asarray(problem.row_base, np.int64), np.asarray(problem.row_offset, np.int64), concentration.size)
        self.concentration = np.empty_like(concentration)
        self.concentration[self._new_of_old] = concentration
        as_rows = lambda rows: np.asarray(rows, np.int64).reshape(-1)  # noqa: E731
        self.structure = (
            np.asarray(problem.token_cell, np.int32), row_base, row_offset, np.asarray(problem.valid, np.bool_),
            as_rows(spec.numerator_rows), as_rows(spec.denominator_rows),
            as_rows([row for row, _ in spec.ties]), as_rows([earlier for _, earlier in spec.ties]),
            as_rows(spec.moved), bool(spec.log_space), bool(spec.has_valid),
        )
        fixed_counts = np.empty(concentration.size, np.int32)
        fixed_counts[self._new_of_old] = problem.fixed_counts
        self._counts = np.tile(fixed_counts, (num_chains, 1))  # in the kernel's numbering
        self.config = np.zeros((num_chains, num_tokens), np.int32)
        self.orders = np.tile(np.arange(num_tokens, dtype=np.int32), (num_chains, 1))
        self.rngs = [_seeded(key) for key in sweep_keys]
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
        self._each_chain(self.rngs, SWEEP, num_sweeps, self.shuffle, self.orders)

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown()

    def _each_chain(self, rngs, mode, num_sweeps, shuffle, orders):
        def one(chain):
            shifted = self.concentration + self._counts[chain]
            _place_tokens(rngs[chain], mode, num_sweeps, shuffle, shifted,
                          self.config[chain], orders[chain], *self.structure)
            self._counts[chain] = np.rint(shifted - self.concentration)

        if self.num_chains == 1:
            one(0)
        else:
            list(self._pool.map(one, range(self.num_chains)))
