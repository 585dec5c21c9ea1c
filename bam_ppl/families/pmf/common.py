"""What the PMF backends share: the sample-pattern layout and the InferenceData of a fit (Chege et al. 2024).

Both work on the distinct sample patterns of the data (a CountTensor from
:func:`~bam_ppl.models.pmf.categorical_samples`) weighted by their counts: samples that share a
pattern share their responsibilities, so a sweep over U ≤ T patterns is exactly a sweep over the
T samples. The factor tables of all variables are stacked row-wise into one ``(Σ_n I_n, R)``
array; a sample's entry of variable n is the row ``offset_n + code``, and a missing entry points
at one extra all-zero row, so it drops out of every sum (Chege et al. 2024 §II, missing data
marginalised). A sweep costs O(N R U): one gather and one scatter-add per variable.

VB-PMF runs on the generic VB core instead (:mod:`.variational` says why and how).
"""

from __future__ import annotations

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...convert import allocation_inference_data
from ...data import MISSING
from ...models.pmf import PMFTensorModel, categorical_samples


@jax.tree_util.register_static
class Sizes(tuple):
    """I_1..I_N, static under ``jax.jit`` (a pytree node without leaves): a function of :class:`PatternArrays`
    compiles once per layout, its sizes part of the program's shapes."""


class PatternArrays(NamedTuple):
    """Distinct sample patterns as flat row indices into the stacked factor tables."""

    rows: np.ndarray           # (U, N) int32: offset_n + code, or num_rows for a missing entry
    weights: np.ndarray        # (U,) float64: how many samples share the pattern
    row_variable: np.ndarray   # (Σ I_n,) int32: the variable each stacked row belongs to
    sizes: tuple[int, ...]     # I_1..I_N

    @property
    def num_rows(self) -> int:
        return int(sum(self.sizes))

    @property
    def total(self) -> float:
        return float(self.weights.sum())

    def on_device(self) -> PatternArrays:
        """The same layout with JAX arrays (call under ``jax.enable_x64(True)``)."""
        return PatternArrays(jnp.asarray(self.rows), jnp.asarray(self.weights), jnp.asarray(self.row_variable),
                             self.sizes)


class Tables(NamedTuple):
    """Per-component quantities: mixing weights ``(R,)`` and the stacked factor tables ``(ΣI_n, R)``
    (probabilities, Dirichlet parameters, expected counts or gradients of them)."""

    weights: jnp.ndarray
    factors: jnp.ndarray


def prepare_samples(model, data, num_categories):
    """The PMF model resolved on validated samples, and the samples as a CountTensor of patterns."""
    if not isinstance(model, PMFTensorModel):
        raise TypeError(f"model must be a PMFTensorModel (bam_ppl.models.pmf_tensor), got {type(model).__name__}")
    data = categorical_samples(data, num_categories)
    return model.resolve(data), data


def pattern_arrays(data) -> PatternArrays:
    """Flat-row layout of a CountTensor of sample patterns (see module docstring)."""
    sizes = tuple(int(s) for s in data.shape)
    offsets = np.cumsum([0, *sizes[:-1]])
    rows = np.where(data.indices == MISSING, sum(sizes), data.indices + offsets[None, :])
    row_variable = np.repeat(np.arange(len(sizes)), sizes)
    return PatternArrays(rows.astype(np.int32), data.counts.astype(np.float64),
                         row_variable.astype(np.int32), Sizes(sizes))


def split_factors(stacked, sizes) -> list[np.ndarray]:
    """The stacked ``(ΣI_n, R)`` rows as one ``(R, I_n)`` table per variable."""
    offsets = np.cumsum([0, *sizes])
    stacked = np.asarray(stacked)
    return [stacked[offsets[n]:offsets[n + 1]].T for n in range(len(sizes))]


def gather_sum(table, rows):
    """Σ_n table[rows[:, n]] for a table padded with a final zero row; (B, R)."""
    padded = jnp.concatenate([table, jnp.zeros((1, table.shape[1]), table.dtype)])

    def add(acc, column):
        return acc + padded[column], None

    out, _ = lax.scan(add, jnp.zeros((rows.shape[0], table.shape[1]), table.dtype), rows.T)
    return out


def scatter_sum(values, rows, num_rows):
    """Per stacked row, the sum of ``values`` over the patterns whose entry is that row; (ΣI, R)."""

    def add(acc, column):
        return acc.at[column].add(values), None

    out, _ = lax.scan(add, jnp.zeros((num_rows + 1, values.shape[1]), values.dtype), rows.T)
    return out[:-1]


def column_sums(table, row_variable, num_variables):
    """Σ over each variable's rows of a stacked table: ``(N, R)``."""
    return jax.ops.segment_sum(table, row_variable, num_segments=num_variables)


def statistics(rho, weights, rows, num_rows) -> Tables:
    """Σ_t ρ_{r,t} and Σ_{t ∈ Ω_{n,i}} ρ_{r,t} for responsibilities ``rho`` of patterns counted ``weights``."""
    weighted = rho * weights[:, None]
    return Tables(weighted.sum(0), scatter_sum(weighted, rows, num_rows))


def log_mixture(weights, factors, rows):
    """log λ_r + Σ_n log A_n(y_n, r) per pattern, observed entries only: ``(U, R)``."""
    return jnp.log(weights)[None, :] + gather_sum(jnp.log(factors), rows)


def fit_inference_data(model, data, weights, factors, *, method: str, sample_stats, attrs, extra_groups=None):
    """InferenceData of a PMF fit with ``R`` components: ``weights`` ``(chain, draw, R)`` and one
    ``(chain, draw, R, I_n)`` array per variable in ``factors``; ``attrs`` gain ``detected_rank``,
    ``max_rank`` and the data's dims."""
    rank = int(np.shape(weights)[-1])
    pruned = model.with_rank(rank)
    theta = {"r": weights, **dict(zip(pruned.variables, factors))}
    attrs = dict(attrs, detected_rank=rank, max_rank=model.max_rank)
    if data.dims:
        attrs["data_dims"] = json.dumps(list(data.dims))
    return allocation_inference_data(pruned.bind(data), data, theta=theta, method=method, sample_stats=sample_stats,
                                     extra_groups=extra_groups, attrs=attrs)
