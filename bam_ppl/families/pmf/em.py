"""Maximum-likelihood EM over candidate ranks of the PMF model, the rank chosen by BIC or AIC
(Chege et al. 2024 §V baselines).

Every candidate rank is one start of the shared EM loop (:mod:`bam_ppl.infer.em_driver`): all
candidates run side by side (vmapped) as rank-``max(ranks)`` models whose components beyond
the candidate's rank start, and stay, at weight zero. ML EM is MAP-EM with flat Dirichlet priors,
but the E-step stays on the sample patterns of :mod:`.common` rather than the generic
:mod:`bam_ppl.infer.em`: a missing entry drops out of the pattern's likelihood exactly, where the
generic E-step enumerates every missing coordinate as a free configuration (R · Π I_missing of
them per cell, and a different, slower iteration towards the same fixed points); and the
E-step works in log space, where the product of N ≈ 50 factor entries would underflow.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ...infer import em_driver
from ...infer.registry import register
from ...models.pmf import PMFTensorModel
from ...progress import resolve_progress, run_in_chunks
from ...types import as_key
from ...validation import check_int, check_positive
from .common import (
    PatternArrays,
    Tables,
    column_sums,
    fit_inference_data,
    log_mixture,
    pattern_arrays,
    prepare_samples,
    split_factors,
    statistics,
)

CHUNK_SIZE = 25
"""EM iterations per compiled call; the progress bar and convergence are checked between calls."""

EM_FLOOR = 1e-10
"""Added to every factor count: keeps log A finite for categories a component never sees, so test NLLs stay finite."""


def _log_normalisers(params: Tables, arrays: PatternArrays):
    log_mix = log_mixture(params.weights, params.factors, arrays.rows)
    return log_mix, jax.scipy.special.logsumexp(log_mix, axis=1, keepdims=True)


def log_likelihood(params: Tables, arrays: PatternArrays):
    """log p(Y) = Σ_t log Σ_r λ_r Π_{n observed} A_n(y_nt, r) (Chege et al. 2024 eq. 2, missing entries marginalised)."""
    return arrays.weights @ _log_normalisers(params, arrays)[1][:, 0]


def em_step(params: Tables, arrays: PatternArrays):
    """E-step responsibilities and M-step updates of ML EM for the CPD; also log p(Y) of the incoming params."""
    log_mix, log_norm = _log_normalisers(params, arrays)
    rho = jnp.exp(log_mix - log_norm)
    stats = statistics(rho, arrays.weights, arrays.rows, arrays.num_rows)
    counts = stats.factors + EM_FLOOR
    factors = counts / column_sums(counts, arrays.row_variable, len(arrays.sizes))[arrays.row_variable]
    return Tables(stats.weights / arrays.weights.sum(), factors), arrays.weights @ log_norm[:, 0]


def candidate_starts(key, arrays: PatternArrays, ranks) -> Tables:
    """One start per candidate rank: uniform weights over its components, zero beyond; factor
    columns of U(0.5, 1.5) entries normalised."""
    max_rank = int(max(ranks))
    active = jnp.arange(max_rank)[None, :] < jnp.asarray(ranks)[:, None]
    raw = jax.random.uniform(key, (len(ranks), arrays.num_rows, max_rank), minval=0.5, maxval=1.5)
    weights = active.astype(raw.dtype)
    totals = jax.vmap(lambda f: column_sums(f, arrays.row_variable, len(arrays.sizes)))(raw)
    return Tables(weights / weights.sum(1, keepdims=True), raw / totals[:, arrays.row_variable])


def em_run(key, arrays: PatternArrays, ranks, num_iters: int, tol: float,
           progress_bar: bool = False) -> em_driver.EMState:
    """EM for every candidate rank at once (call under ``jax.enable_x64(True)``); the states have a
    leading candidate axis, their trace holds log p(Y) after each iteration."""
    device = arrays.on_device()
    step = lambda params: em_step(params, device)  # noqa: E731
    objective = lambda params: log_likelihood(params, device)  # noqa: E731
    capacity = em_driver.trace_capacity(num_iters)
    states = jax.vmap(lambda p: em_driver.start(objective, p, capacity))(candidate_starts(key, device, ranks))
    advance = jax.jit(jax.vmap(lambda s, until: em_driver.advance(step, s, until=until, tol=tol), in_axes=(0, None)))
    states = run_in_chunks(lambda s, start, stop: advance(s, stop), states, num_iters, chunk=CHUNK_SIZE,
                           show=progress_bar, description="EM", unit="sweep",
                           stop_early=lambda s: bool(s.converged.all()))
    return jax.jit(jax.vmap(lambda s: em_driver.finish(objective, s)))(states)


def information_criteria(log_likelihood, ranks, sizes, num_samples):
    """AIC = −2 log L + 2k and BIC = −2 log L + k log T, k = (R − 1) + R Σ_n (I_n − 1).

    T is the number of samples (rows), not of observed entries (the paper leaves it open).
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    free = (ranks - 1.0) + ranks * float(sum(s - 1 for s in sizes))
    log_likelihood = np.asarray(log_likelihood, dtype=np.float64)
    return -2.0 * log_likelihood + 2.0 * free, -2.0 * log_likelihood + free * math.log(num_samples)


def em_rank_selection(model, data, *, rng_key=0, ranks=None, num_iters: int = 1000, tol: float = 1e-7,
                      num_categories=None, progress_bar: bool | None = None):
    """ML EM for each candidate rank and their AIC / BIC (Chege et al. 2024 §V baselines).

    Returns
    -------
    dict with ``ranks``, ``log_likelihood``, ``aic``, ``bic`` (per candidate), ``weights`` and
    ``factors`` (per candidate, stacked rows, padded to the largest rank), ``iterations`` and the
    resolved ``model`` and ``data``.
    """
    ranks = list(range(1, model.max_rank + 1)) if ranks is None else [int(r) for r in ranks]
    for r in ranks:
        check_int(r, "ranks[...]", minimum=1)
    if not ranks:
        raise ValueError("ranks must list at least one candidate rank")
    check_int(num_iters, "num_iters", minimum=1)
    check_positive(tol, "tol", allow_zero=True)
    model, data = prepare_samples(model, data, num_categories)
    arrays = pattern_arrays(data)
    with jax.enable_x64(True):
        states = em_run(as_key(rng_key), arrays, ranks, num_iters, tol, resolve_progress(progress_bar))
        loglik = em_driver.final_objectives(states)
        aic, bic = information_criteria(loglik, ranks, arrays.sizes, arrays.total)
        return dict(ranks=np.asarray(ranks), log_likelihood=loglik, aic=aic, bic=bic,
                    weights=np.asarray(states.params.weights), factors=np.asarray(states.params.factors),
                    iterations=np.asarray(states.iteration), converged=np.asarray(states.converged),
                    model=model, data=data)


def em_candidate_idata(fit, index: int, criterion: str = "bic"):
    """InferenceData (one point-estimate draw) of candidate ``index`` of an :func:`em_rank_selection` fit."""
    rank = int(fit["ranks"][index])
    model, data = fit["model"], fit["data"]
    factors = [f[None, None] for f in split_factors(fit["factors"][index][:, :rank], data.shape)]
    stats = {name: (("rank_candidate",), fit[name]) for name in ("log_likelihood", "aic", "bic")}
    attrs = dict(criterion=criterion, candidate_ranks=",".join(str(r) for r in fit["ranks"]))
    return fit_inference_data(model, data, fit["weights"][index][:rank][None, None], factors,
                              method=f"em_{criterion}", sample_stats=stats, attrs=attrs)


def _em_idata(model, data, criterion, **options):
    """The rank that ``criterion`` ("bic" or "aic") picks from :func:`em_rank_selection` with ``options``."""
    fit = em_rank_selection(model, data, **options)
    return em_candidate_idata(fit, int(np.argmin(fit[criterion])), criterion)


@register("em_bic", models=(PMFTensorModel,))
def em_bic(model, data, *, rng_key=0, ranks=None, num_iters: int = 1000, tol: float = 1e-7,
           num_categories=None, progress_bar: bool | None = None):
    """ML EM over candidate ranks (default 1..max_rank), the rank chosen by BIC; one point-estimate draw."""
    return _em_idata(model, data, "bic", rng_key=rng_key, ranks=ranks, num_iters=num_iters, tol=tol,
                     num_categories=num_categories, progress_bar=progress_bar)


@register("em_aic", models=(PMFTensorModel,))
def em_aic(model, data, *, rng_key=0, ranks=None, num_iters: int = 1000, tol: float = 1e-7,
           num_categories=None, progress_bar: bool | None = None):
    """ML EM over candidate ranks (default 1..max_rank), the rank chosen by AIC; one point-estimate draw."""
    return _em_idata(model, data, "aic", rng_key=rng_key, ranks=ranks, num_iters=num_iters, tol=tol,
                     num_categories=num_categories, progress_bar=progress_bar)
