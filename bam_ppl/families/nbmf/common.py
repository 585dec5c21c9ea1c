"""What the NBMF backends share: the data checks and orientation, the wrapped-diagonal layout of
the entries, the chunked loop and the InferenceData of a fit (Lumbreras et al. 2020).

The Gibbs sampler (:mod:`.gibbs`) and the variational backends (:mod:`.variational`) both build
on this module; neither imports the other's internals for it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from ...convert import to_inference_data
from ...data import BinaryData, as_binary_matrix
from ...models.nbmf import EXPECTATIONS_GROUP, NBMF
from ...models.sampling import dirichlet_rows  # noqa: F401  (the NBMF backends draw W and H with it)
from ...pointwise import bernoulli_log_likelihood
from ...progress import resolve_progress
from ...progress import run_in_chunks as run_chunks

CHUNK_SWEEPS = 50


class DiagonalLayout(NamedTuple):
    """Observed entries grouped into wrapped diagonals (distinct rows and columns in each)."""

    rows: np.ndarray  # (D, m) int32
    cols: np.ndarray  # (D, m) int32
    values: np.ndarray  # (D, m) int32, 0 where missing
    observed: np.ndarray  # (D, m) bool


def diagonal_layout(values: np.ndarray, observed: np.ndarray) -> DiagonalLayout:
    """Split the F × N entries into D = max(F, N) blocks of min(F, N) with distinct rows/columns."""
    F, N = values.shape
    if F <= N:
        rows = np.broadcast_to(np.arange(F), (N, F))
        cols = (np.arange(F)[None, :] + np.arange(N)[:, None]) % N
    else:
        cols = np.broadcast_to(np.arange(N), (F, N))
        rows = (np.arange(N)[None, :] + np.arange(F)[:, None]) % F
    rows = np.ascontiguousarray(rows, dtype=np.int32)
    cols = np.ascontiguousarray(cols, dtype=np.int32)
    return DiagonalLayout(rows, cols, values[rows, cols].astype(np.int32), observed[rows, cols])


def to_matrix(layout: DiagonalLayout, block_values: np.ndarray, shape, fill=-1) -> np.ndarray:
    """Scatter per-entry values laid out like ``layout`` (leading dims kept) back to F × N."""
    block_values = np.asarray(block_values)
    lead = block_values.shape[: block_values.ndim - 2]
    out = np.full(lead + tuple(shape), fill, dtype=block_values.dtype)
    out[..., layout.rows, layout.cols] = block_values
    return out


class Hyper(NamedTuple):
    """Per-component prior pseudo-counts of the core (rows = the Dirichlet side of W)."""

    row: jnp.ndarray  # γ_k (K,)
    alpha: jnp.ndarray  # α_k (K,) (Beta-Dir)
    beta: jnp.ndarray  # β_k (K,) (Beta-Dir)
    column: jnp.ndarray  # η_k (K,) (Dir-Dir)


def core_problem(model: NBMF, values, observed):
    """Orient the data for the core: Dir-Beta runs as Beta-Dir on Vᵀ (Lumbreras et al. 2020 §3.1).

    Returns ``(kind, values, observed, hyper, transposed)``.
    """
    K = model.n_components
    full = lambda x: jnp.full(K, x, dtype=jnp.float32)
    if model.prior == "dir-beta":
        hyper = Hyper(full(model.eta), full(model.alpha), full(model.beta), full(model.eta))
        return "beta-dir", values.T, observed.T, hyper, True
    hyper = Hyper(jnp.asarray(model.row_concentration(), jnp.float32), full(model.alpha),
                  full(model.beta), jnp.asarray(model.column_concentration(), jnp.float32))
    return model.prior, values, observed, hyper, False


def check_data(model: NBMF, data, mask) -> BinaryData:
    binary = as_binary_matrix(data, mask)
    if model.prior == "dir-dir" and model.n_components < 2 and not (binary.values[binary.observed] == 1).all():
        raise ValueError("dir-dir with n_components=1 gives probability 1 to every entry; "
                         "the data have zeros, so use n_components >= 2")
    return binary


def run_in_chunks(advance, carry, total, progress_bar, description, unit):
    """:func:`bam_ppl.progress.run_in_chunks` over chunks of ``CHUNK_SWEEPS`` iterations, with the
    bounds passed as int32 values so that every chunk reuses one compilation of ``advance``."""
    return run_chunks(lambda c, start, stop: advance(c, jnp.int32(start), jnp.int32(stop)), carry, total,
                      chunk=CHUNK_SWEEPS, show=resolve_progress(progress_bar), description=description,
                      unit=unit)


def nbmf_inference_data(model, binary: BinaryData, *, W, H, mean, sample_stats, method, transposed, attrs):
    """InferenceData of an NBMF fit; undoes the Dir-Beta transpose (W = H'ᵀ, H = W'ᵀ).

    Besides ``W`` and ``H`` the posterior holds ``H_columns`` (col, component) for the Dirichlet
    column priors (the program's sample site), and ``log_likelihood["V"]`` is the pointwise
    Bernoulli log-likelihood of every observed entry (:func:`bam_ppl.pointwise.bernoulli_log_likelihood`).
    """
    values, observed, rows, cols = binary
    if transposed:
        W, H, mean = np.swapaxes(H, -1, -2), np.swapaxes(W, -1, -2), np.swapaxes(mean, -1, -2)
    F, N = values.shape
    coords = {"row": rows if rows is not None else np.arange(F),
              "col": cols if cols is not None else np.arange(N),
              "component": np.arange(model.n_components)}
    posterior = {"W": (("chain", "draw", "row", "component"), W),
                 "H": (("chain", "draw", "component", "col"), H)}
    if model.prior != "beta-dir":
        # The program samples the Dirichlet columns as site "H_columns" (H is deterministic):
        # without it numpyro.infer.Predictive would draw H from the prior.
        posterior["H_columns"] = (("chain", "draw", "col", "component"), np.swapaxes(H, -1, -2))
    groups = {
        "posterior": posterior,
        EXPECTATIONS_GROUP: {"WH": (("chain", "row", "col"), mean)},
        "sample_stats": sample_stats,
        "observed_data": {"V": (("row", "col"), np.where(observed, values, np.nan))},
    }
    try:
        groups["log_likelihood"] = bernoulli_log_likelihood(W, H, values, observed)
    except ValueError as err:
        attrs = {**attrs, "log_likelihood": f"not written: {err}"}
    return to_inference_data(groups, coords=coords,
                             attrs={"method": method, **model.hyperparameters, **attrs})
