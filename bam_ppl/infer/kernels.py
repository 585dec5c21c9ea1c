"""What runs the token loops of the samplers: kernel selection and the numba helpers they share.

The Pólya-urn SMC, collapsed Gibbs, tempered SMC and Chib's estimator each have a JAX kernel (any
JAX device) and a numba CPU kernel (:mod:`bam_ppl.infer.smc.polya_urn_numba`,
:mod:`bam_ppl.infer.gibbs.collapsed_numba`). :func:`resolve_kernel` picks one; the small numba
functions below are compiled once here and inlined into every kernel that calls them.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ..types import numpy_generator
from ..validation import check_choice

try:
    import numba
except ImportError:
    numba = None

HAVE_NUMBA = numba is not None
KERNELS = ("auto", "jax", "numba")
# Floating-point freedoms of the hot loops: no NaN or infinity arises there, and the order of a
# sum of positive weights does not matter beyond rounding.
FASTMATH = {"nsz", "arcp", "contract", "reassoc"}


def compile_numba(namespace: dict, *, inline=(), nogil=()) -> None:
    """Compile the functions named in ``inline`` and ``nogil`` of a module's ``namespace``
    (``globals()``) with numba, in place: the first are inlined into the kernels that call them,
    the second release the GIL so that threads over blocks of particles or chains run at once.
    Each keeps its name, so the kernels find the compiled versions when they are compiled."""
    for name in inline:
        namespace[name] = numba.njit(inline="always", cache=True)(namespace[name])
    for name in nogil:
        namespace[name] = numba.njit(nogil=True, cache=True)(namespace[name])


def resolve_kernel(kernel: str, option: str = "engine") -> str:
    """The kernel that ``kernel`` names: ``"auto"`` is numba on a CPU when it is installed
    (``option``: the option's name in messages)."""
    check_choice(kernel, option, KERNELS)
    if kernel == "numba" and not HAVE_NUMBA:
        raise ImportError(f'{option}="numba" needs numba: pip install "bam_ppl[fast]" (or numba>=0.60)')
    if kernel == "auto":
        if jax.default_backend() != "cpu":
            return "jax"
        if not HAVE_NUMBA:
            warnings.warn(
                f"numba is not installed, so {option}='auto' runs the JAX kernel: it draws from other "
                "random streams, so the same rng_key gives other results than an install with numba "
                "(a dependency of bam_ppl: pip install numba)", UserWarning, stacklevel=3)
            return "jax"
        return "numba"
    return kernel


def unrolled(starts):
    """A few row starts as a kernel takes them: a tuple of ints, so that numba compiles the kernel
    for their number and unrolls the loops over them (``benchmarks/tempered_baseline.py``); none as an
    empty array (numba cannot iterate an empty tuple)."""
    starts = tuple(int(s) for s in np.asarray(starts).reshape(-1))
    return starts if starts else np.empty(0, np.int64)


def seeded_generator(key) -> np.random.Generator:
    """A chain's NumPy Generator, seeded from a raw JAX key (array of two uint32 words)."""
    return numpy_generator(jnp.asarray(key, jnp.uint32))


def shuffle(rng, order):
    """Fisher–Yates shuffle of ``order`` in place, one uniform from ``rng`` per position."""
    for i in range(order.shape[0] - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        order[i], order[j] = order[j], order[i]


def inverse_cdf(weight, target):
    """The first configuration whose cumulative weight exceeds ``target`` (uniform × total).

    Rounding can leave the target at the total: then the last configuration with a positive
    weight.
    """
    cumulative = 0.0
    for c in range(weight.shape[0]):
        cumulative += weight[c]
        if target < cumulative:
            return c
    new = weight.shape[0] - 1
    while new > 0 and weight[new] == 0.0:
        new -= 1
    return new


def row_values(values, shifted, base, row_offset, row, tie_rows, tie_earlier):
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


def log_urn_weights(weight, values, shifted, base, rows):
    """weight[c] = log of the unnormalised urn weight of configuration c (:func:`multiply_rows`): Σ log (α + S)
    over the numerator rows of ``rows`` minus the same over its denominator rows, for products that could
    leave the float64 range."""
    weight[:] = 0.0
    for r in rows.numerator_rows:
        row_values(values, shifted, base, rows.row_offset, r, rows.tie_rows, rows.tie_earlier)
        for c in range(weight.shape[0]):
            weight[c] += math.log(values[c])
    for r in rows.denominator_rows:
        row_values(values, shifted, base, rows.row_offset, r, rows.tie_rows, rows.tie_earlier)
        for c in range(weight.shape[0]):
            weight[c] -= math.log(values[c])


def row_kinds(rows):
    """Per row of ``rows`` (an ``UrnRows``): whether a tie reads it, and whether its offsets run
    first, first + 1, first + 2, … (the common case after relabelling: a vector load)."""
    num_rows, num_configs = rows.row_offset.shape
    tied = np.zeros(num_rows, np.bool_)
    for tie in range(rows.tie_rows.shape[0]):
        tied[rows.tie_rows[tie]] = True
    consecutive = np.ones(num_rows, np.bool_)
    for r in range(num_rows):
        for c in range(1, num_configs):
            if rows.row_offset[r, c] != rows.row_offset[r, 0] + c:
                consecutive[r] = False
    return tied, consecutive


def multiply_rows(out, values, shifted, base, rows, kinds, which):
    """out[c] *= Π over the rows ``which`` of (α + S) at configuration c (``kinds``: :func:`row_kinds`): the
    numerator rows of ``rows`` (an ``UrnRows``) into the weights, the denominator rows into their divisors, so
    that the caller's quotient is the unnormalised urn weight (Cemgil et al. 2019 eq. 4.1; its log where
    ``rows.log_space``: :func:`log_urn_weights`). The callers divide themselves: inlined into another inlined
    helper this ran the collapsed sweep on Tucker rows 12 % slower, with the log branch there too at half
    speed (``benchmarks/chain_cost.py``)."""
    tied, consecutive = kinds
    for r in which:
        if tied[r]:
            row_values(values, shifted, base, rows.row_offset, r, rows.tie_rows, rows.tie_earlier)
            for c in range(out.shape[0]):
                out[c] *= values[c]
        elif consecutive[r]:
            start = base[r] + rows.row_offset[r, 0]
            for c in range(out.shape[0]):
                out[c] *= shifted[start + c]
        else:
            for c in range(out.shape[0]):
                out[c] *= shifted[base[r] + rows.row_offset[r, c]]

if HAVE_NUMBA:
    # nogil: chains run in threads, each with its own Generator and arrays.
    compile_numba(globals(), inline=("inverse_cdf", "row_values", "log_urn_weights", "multiply_rows"),
                  nogil=("shuffle", "row_kinds"))
