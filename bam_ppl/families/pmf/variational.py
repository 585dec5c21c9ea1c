"""VB-PMF and SVB-PMF for the PMF tensor model (Chege et al. 2024), rank detection by pruning.

* ``"vb"`` — VB-PMF (Algorithm 1): closed-form updates (eqs. 22, 28, 32–36), the ELBO (eq. 39)
  after every sweep, a relative-change stopping rule, pruning of components with E[λ_r] < ε.
* ``"svb"`` — SVB-PMF (Algorithm 2): minibatches of M patterns drawn in proportion to their
  counts (uniform sampling of samples), natural-gradient steps scaled by T (eqs. 48–53), the
  adaptive step size of Ranganath et al. (eq. 54) per block with its running averages warm-started
  from several minibatches, stopping on held-out NLL.

VB-PMF is the generic mean-field VB of :mod:`bam_ppl.infer.variational.vb` on the allocation
model ``r -> x1; …; r -> xN`` (responsibilities over r, Dirichlet updates of every table, the
ELBO from the same pass), plus the pruning of components at the end. Two hooks carry what is
particular to it: a missing entry drops its member from the cell
(:func:`~bam_ppl.infer.variational.vb.marginalised_leaf_layout`: the paper marginalises missing
entries, where the free-node layout would give them a q of their own), and its own random start
α̃ = prior + U(0, 1) · T / R (:func:`~bam_ppl.infer.variational.vb.run_from`). Its ELBO is eq. (39), the
generic one less the count tensor's multinomial coefficient and total-count term.

SVB-PMF keeps its own step on the sample patterns of :mod:`.common`: a natural-gradient step
reads a minibatch of M patterns, where the generic problem's gathers and scatters run over all
cells. The JAX cores run in float64 inside ``jax.enable_x64(True)``: with α_λ = 1e-6,
ψ(α̃) ≈ −1e6.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import digamma

from ...infer.registry import deprecated_alias, register
from ...infer.variational import vb as vb_core
from ...models.pmf import PMFTensorModel, categorical_samples
from ...models.sampling import dirichlet_rows
from ...progress import resolve_progress, run_in_chunks
from ...types import as_key, numpy_generator
from ...validation import check_int, check_positive
from .common import (
    PatternArrays,
    Tables,
    column_sums,
    fit_inference_data,
    gather_sum,
    pattern_arrays,
    prepare_samples,
    split_factors,
    statistics,
)

DEFAULT_PRUNE_THRESHOLD = 1e-3


# -- variational quantities on sample patterns (Chege et al. 2024 eqs. 32–36), for SVB-PMF ----------------
class Prior(NamedTuple):
    alpha_lambda: float
    alpha: float


def expected_logs(q: Tables, row_variable, num_variables):
    """E_q[log λ] (eq. 32a) and E_q[log a_{n,r,i}] (eq. 32b, with the index typo fixed)."""
    log_weights = digamma(q.weights) - digamma(q.weights.sum())
    column_totals = column_sums(q.factors, row_variable, num_variables)  # (N, R)
    log_factors = digamma(q.factors) - digamma(column_totals)[row_variable]
    return log_weights, log_factors


def responsibilities(log_weights, log_factors, rows):
    """ρ (eq. 36) from log γ (eq. 34, observed entries only)."""
    log_gamma = log_weights[None, :] + gather_sum(log_factors, rows)
    unnormalised = jnp.exp(log_gamma - log_gamma.max(axis=1, keepdims=True))
    return unnormalised / unnormalised.sum(axis=1, keepdims=True)


def _initial_q(key, prior: Prior, total: float, rank: int, sizes):
    """Random start α̃ = prior + U(0, 1) · T / R (per category: T / (R I_n)); Chege et al. 2024 leaves it open."""
    key_w, key_f = jax.random.split(key)
    per_row = jnp.repeat(jnp.asarray([total / (rank * s) for s in sizes]), jnp.asarray(tuple(sizes)),
                         total_repeat_length=int(sum(sizes)))
    weights = prior.alpha_lambda + jax.random.uniform(key_w, (rank,)) * total / rank
    factors = prior.alpha + jax.random.uniform(key_f, (int(sum(sizes)), rank)) * per_row[:, None]
    return Tables(weights, factors)


# -- VB-PMF (Algorithm 1) on the generic VB core ---------------------------------------------------------
def vb_problem(model: PMFTensorModel, data):
    """The generic VB problem of ``r -> x1; …; r -> xN`` for the sample patterns ``data``.

    Missing entries drop out of their cells (:func:`~bam_ppl.infer.variational.vb.marginalised_leaf_layout`),
    so the updates are eqs. 32–36, 22 and 28. The ELBO is that of eq. (39): the likelihood of the
    T samples in order, without the count tensor's multinomial coefficient or total-count term,
    so its only constant is the prior normalisers. Returns the bound model and the problem.
    """
    bound = model.bind(data)
    layout, mask = vb_core.marginalised_leaf_layout(bound, data)
    problem = vb_core.build_problem(bound, data, layout, member_mask=mask)
    return bound, problem._replace(constant=jnp.asarray(-vb_core.log_beta_prior(bound)))


# One compiled program each instead of dozens of eager operations (each compiled for its shape on a first call).
_initial_q_jit = jax.jit(_initial_q, static_argnames=("prior", "total", "rank", "sizes"))
_fresh_state = jax.jit(lambda problem, alpha_hat: vb_core.fresh_state(vb_core.expected_log_theta(problem, alpha_hat),
                                                                      alpha_hat))


def vb_start(bound, problem, q: Tables) -> vb_core.VBState:
    """The generic VB state of the Dirichlet parameters ``q`` (stacked), one restart."""
    sizes = [bound.sizes[name] for name in bound.visible]
    tables = {"r": np.asarray(q.weights), **dict(zip(bound.visible, split_factors(q.factors, sizes)))}
    alpha_hat = np.concatenate([np.ravel(tables[t.name]) for t in bound.tables])
    return jax.tree.map(lambda x: x[None], jax.device_get(_fresh_state(problem, alpha_hat)))


# -- SVB-PMF (Algorithm 2) -----------------------------------------------------------------------------
class StepSize(NamedTuple):
    """Running averages of the adaptive step size (Ranganath et al. 2013; Chege et al. 2024 eq. 54)."""

    mean_gradient: jnp.ndarray       # ḡ, shaped like the block's parameters
    mean_square_norm: jnp.ndarray    # h̄ = running mean of gᵀg, one per block
    memory: jnp.ndarray              # τ, one per block


class SVBState(NamedTuple):
    q: Tables
    weight_rate: StepSize            # one block: λ
    factor_rate: StepSize            # one block per (n, r)
    iteration: jnp.ndarray


def _natural_gradients(key, q: Tables, arrays: PatternArrays, prior: Prior, cdf, batch_size):
    """Minibatch-averaged noisy natural gradients (eqs. 50–53): prior + (T/M) Σ_m stats − α̃."""
    draws = jax.random.uniform(key, (batch_size,)) * cdf[-1]
    batch = jnp.minimum(jnp.searchsorted(cdf, draws, side="right"), cdf.shape[0] - 1)
    rows = arrays.rows[batch]
    log_weights, log_factors = expected_logs(q, arrays.row_variable, len(arrays.sizes))
    rho = responsibilities(log_weights, log_factors, rows)
    scale = cdf[-1] / batch_size  # each sampled point stands for T / M samples
    stats = statistics(rho, jnp.full((batch_size,), scale), rows, arrays.num_rows)
    return Tables(prior.alpha_lambda + stats.weights - q.weights,
                       prior.alpha + stats.factors - q.factors)


def _block_norms(gradient: Tables, row_variable, num_variables):
    return (jnp.sum(gradient.weights ** 2),
            column_sums(gradient.factors ** 2, row_variable, num_variables))


def _step_size(mean_norm, mean_square_norm):
    """ξ = ḡᵀḡ / h̄ in [0, 1] (eq. 54); a block whose gradients were all zero keeps ξ = 0."""
    safe = jnp.where(mean_square_norm > 0, mean_square_norm, 1.0)
    return jnp.where(mean_square_norm > 0, jnp.clip(mean_norm / safe, 0.0, 1.0), 0.0)


def svb_step(key, state: SVBState, arrays: PatternArrays, prior: Prior, cdf, batch_size) -> SVBState:
    """One SVB-PMF step: minibatch ρ, natural gradients, adaptive ξ, α̃ ← α̃ + ξ g (eqs. 50–54)."""
    N = len(arrays.sizes)
    g = _natural_gradients(key, state.q, arrays, prior, cdf, batch_size)
    square_w, square_f = _block_norms(g, arrays.row_variable, N)

    # λ block: scalars.
    rw = state.weight_rate
    fw = 1.0 / rw.memory
    mean_w = (1.0 - fw) * rw.mean_gradient + fw * g.weights
    sq_w = (1.0 - fw) * rw.mean_square_norm + fw * square_w
    xi_w = _step_size(jnp.sum(mean_w ** 2), sq_w)
    weight_rate = StepSize(mean_w, sq_w, rw.memory * (1.0 - xi_w) + 1.0)

    # (n, r) blocks: per-block scalars of shape (N, R), broadcast to the stacked rows.
    rf = state.factor_rate
    ff = 1.0 / rf.memory
    mean_f = (1.0 - ff[arrays.row_variable]) * rf.mean_gradient + ff[arrays.row_variable] * g.factors
    sq_f = (1.0 - ff) * rf.mean_square_norm + ff * square_f
    xi_f = _step_size(column_sums(mean_f ** 2, arrays.row_variable, N), sq_f)
    factor_rate = StepSize(mean_f, sq_f, rf.memory * (1.0 - xi_f) + 1.0)

    q = Tables(state.q.weights + xi_w * g.weights,
                    state.q.factors + xi_f[arrays.row_variable] * g.factors)
    return SVBState(q, weight_rate, factor_rate, state.iteration + 1)


def svb_init(key, arrays: PatternArrays, prior: Prior, rank: int, total: float, cdf, batch_size,
             warmup_batches):
    """Random α̃ and step-size averages warm-started from ``warmup_batches`` minibatches.

    A single-minibatch start gives ξ = 1 and τ = 1 forever, which collapses SVB onto one
    component (pmf digest §3.3); Monte-Carlo averages with τ = their number avoid that.
    """
    key_q, key_g = jax.random.split(key)
    q = _initial_q(key_q, prior, total, rank, arrays.sizes)
    keys = jax.random.split(key_g, warmup_batches)
    grads = jax.vmap(lambda k: _natural_gradients(k, q, arrays, prior, cdf, batch_size))(keys)
    square_w, square_f = jax.vmap(lambda g: _block_norms(g, arrays.row_variable, len(arrays.sizes)))(grads)
    dtype = q.weights.dtype
    weight_rate = StepSize(grads.weights.mean(0), square_w.mean(0), jnp.full((), warmup_batches, dtype))
    factor_rate = StepSize(grads.factors.mean(0), square_f.mean(0),
                           jnp.full(square_f.shape[1:], warmup_batches, dtype))
    return SVBState(q, weight_rate, factor_rate, jnp.zeros((), jnp.int32))


def _heldout_nll(q: Tables, arrays: PatternArrays):
    """Mean NLL per held-out sample under the posterior-mean PMF (Chege et al. 2024 §V, Alg. 2 line 10)."""
    weights = q.weights / q.weights.sum()
    totals = column_sums(q.factors, arrays.row_variable, len(arrays.sizes))
    factors = q.factors / totals[arrays.row_variable]
    log_mix = jnp.log(weights)[None, :] + gather_sum(jnp.log(factors), arrays.rows)
    return -(arrays.weights @ jax.scipy.special.logsumexp(log_mix, axis=1)) / arrays.weights.sum()


# -- adapters ----------------------------------------------------------------------------------------
def _dirichlet_draws(rng, concentration, num_samples):
    """(1, num_samples, *concentration.shape) Dirichlet draws, columns along the last axis; a
    pruned-away weight (α̃ ≈ α_λ) underflows to 0."""
    return dirichlet_rows(rng, concentration, size=(num_samples, *np.shape(concentration)))[None]


def _posterior_idata(model, data, weights_conc, factor_conc, keep, *, key, num_samples, method, sample_stats,
                     attrs):
    """Prune to the kept components and build InferenceData with Dirichlet posterior draws;
    ``factor_conc`` holds one ``(R, I_n)`` table of Dirichlet parameters per variable."""
    w_conc = np.asarray(weights_conc)[keep]
    f_conc = [np.asarray(table)[keep] for table in factor_conc]
    rng = numpy_generator(key)
    weights = _dirichlet_draws(rng, w_conc, num_samples)
    factors = [_dirichlet_draws(rng, table, num_samples) for table in f_conc]
    names = model.with_rank(int(keep.sum())).variables
    variational = {"concentration_r": (("r",), w_conc),
                   **{f"concentration_{name}": (("r", name), table) for name, table in zip(names, f_conc)}}
    return fit_inference_data(model, data, weights, factors, method=method, sample_stats=sample_stats,
                              extra_groups={"variational": variational},
                              attrs=dict(attrs, alpha_lambda=model.alpha_lambda, alpha=model.alpha))


def _check_common(num_iters, tol, prune_threshold, num_samples):
    check_int(num_iters, "num_iters", minimum=1)
    check_positive(tol, "tol", allow_zero=True)
    check_positive(prune_threshold, "prune_threshold", upper=1.0, allow_zero=True)
    check_int(num_samples, "num_samples", minimum=1)


@register("vb", models=(PMFTensorModel,))
def vb_pmf(model, data, *, rng_key=0, num_iters: int = 3000, tol: float = 1e-7,
           prune_threshold: float = DEFAULT_PRUNE_THRESHOLD, num_samples: int = 200,
           num_categories=None, progress_bar: bool | None = None):
    """VB-PMF (Chege et al. 2024 Algorithm 1): mean-field VB with rank detection by pruning.

    Parameters
    ----------
    model : PMFTensorModel
    data : (T, N) codes with -1/NaN/NA for missing, DataFrame of categoricals, or CountTensor
    rng_key : int or JAX key
        Random initialisation of α̃ and the posterior draws.
    num_iters : int
        Maximum number of sweeps.
    tol : float
        Stop when |ΔELBO| ≤ tol · |ELBO| (relative change; Chege et al. 2024 uses 1e-7).
    prune_threshold : float
        ε: components with E_q[λ_r] < ε are deleted (eq. 24; default 1e-3).
    num_samples : int
        Posterior Dirichlet draws stored per table.
    num_categories : int or sequence, optional
        Alphabet sizes I_n when the data do not show every category.
    progress_bar : bool or None
        tqdm bar over iterations; ``None`` reports long runs (:mod:`bam_ppl.progress`).

    Returns
    -------
    InferenceData
        ``posterior``: ``theta_r`` (chain, draw, r) and ``theta_x<n>`` (chain, draw, r, x<n>) for
        the kept components; ``variational``: their Dirichlet parameters; ``sample_stats.elbo``
        (chain, iteration); ``attrs``: ``detected_rank``, ``max_rank``, ``converged``,
        ``num_iterations``, ``elbo``.
    """
    _check_common(num_iters, tol, prune_threshold, num_samples)
    key_fit, key_draw = jax.random.split(as_key(rng_key))
    model, data = prepare_samples(model, data, num_categories)
    prior = Prior(model.alpha_lambda, model.alpha)
    with jax.enable_x64(True):
        bound, problem = vb_problem(model, data)
        start = vb_start(bound, problem, _initial_q_jit(key_fit, prior, float(data.total), model.max_rank,
                                                        tuple(int(s) for s in data.shape)))
        result = vb_core.run_from(start, problem, num_iters=num_iters, tol=tol,
                                  progress_bar=resolve_progress(progress_bar), desc="VB-PMF")
    tables = bound.split_flat(result.alpha_hat[0])
    keep = tables["r"] / tables["r"].sum() >= prune_threshold
    return _posterior_idata(
        model, data, tables["r"], [tables[name] for name in bound.visible], keep, key=key_draw, num_samples=num_samples,
        method="vb",
        sample_stats={"elbo": (("chain", "iteration"), result.elbo_trace)},
        attrs=dict(converged=bool(result.converged[0]), num_iterations=int(result.iterations[0]),
                   elbo=float(result.elbo[0]), tol=tol, prune_threshold=prune_threshold),
    )


class SVBProblem(NamedTuple):
    """The arrays every SVB-PMF step reads: the training and held-out patterns (on the device) and the
    training weights' cumulative sums (for drawing minibatches)."""

    arrays: PatternArrays
    heldout: PatternArrays
    cdf: jnp.ndarray


# Module-level programs, compiled once per layout and size instead of once per call.
@functools.partial(jax.jit, static_argnames=("prior", "batch_size", "length"))
def _run_steps(state: SVBState, key, problem: SVBProblem, prior: Prior, batch_size: int, length: int):
    """``length`` SVB steps (Algorithm 2) on minibatches of ``batch_size``, then the held-out NLL."""
    def body(s, k):
        return svb_step(k, s, problem.arrays, prior, problem.cdf, batch_size), None

    state, _ = lax.scan(body, state, jax.random.split(key, length))
    return state, _heldout_nll(state.q, problem.heldout)


_svb_init = jax.jit(svb_init, static_argnames=("prior", "rank", "total", "batch_size", "warmup_batches"))
_heldout_nll_jit = jax.jit(_heldout_nll)


@register("svb", models=(PMFTensorModel,))
def svb_pmf(model, data, *, rng_key=0, batch_size: int | None = None, num_iters: int = 20_000,
            tol: float = 1e-4, eval_every: int | None = None, validation=None,
            validation_fraction: float = 0.1, warmup_batches: int = 10,
            prune_threshold: float = DEFAULT_PRUNE_THRESHOLD, num_samples: int = 200,
            num_categories=None, progress_bar: bool | None = None):
    """SVB-PMF (Chege et al. 2024 Algorithm 2): stochastic VB with natural gradients and rank detection.

    Parameters
    ----------
    model : PMFTensorModel
    data : as for ``"vb"``; the training samples
    rng_key : int or JAX key
    batch_size : int, optional
        M, samples per step (default ⌈√T⌉, Chege et al. 2024 §V-B).
    num_iters : int
        Maximum number of steps.
    tol : float
        Stop when the held-out NLL improves by less than tol (relative) between evaluations.
    eval_every : int, optional
        Steps between held-out evaluations (default: one pass, ⌈T / M⌉).
    validation : samples, optional
        Held-out samples for the stopping rule; default: ``validation_fraction`` of ``data``
        held out at random (Chege et al. 2024 §V-B holds out 10 %).
    warmup_batches : int
        Minibatches whose gradients warm-start the adaptive step size (Chege et al. 2024 eq. 54).
    prune_threshold, num_samples, num_categories, progress_bar
        As for ``"vb"``.

    Returns
    -------
    InferenceData
        As for ``"vb"``, with ``sample_stats.heldout_nll`` (chain, evaluation) instead of the ELBO,
        and ``attrs`` ``batch_size``, ``num_iterations``, ``converged``.
    """
    _check_common(num_iters, tol, prune_threshold, num_samples)
    check_int(warmup_batches, "warmup_batches", minimum=2)
    if batch_size is not None:
        check_int(batch_size, "batch_size", minimum=1)
    if eval_every is not None:
        check_int(eval_every, "eval_every", minimum=1)
    check_positive(validation_fraction, "validation_fraction", upper=0.5)
    key = as_key(rng_key)
    key_split, key_init, key_steps, key_draw = jax.random.split(key, 4)
    model, data = prepare_samples(model, data, num_categories)
    if validation is None:
        tokens = data.tokens()
        order = np.asarray(jax.random.permutation(key_split, tokens.shape[0]))
        cut = max(1, int(round(validation_fraction * tokens.shape[0])))
        heldout = categorical_samples(tokens[order[:cut]], data.shape)
        train = categorical_samples(tokens[order[cut:]], data.shape)
    else:
        heldout = categorical_samples(validation, data.shape)
        if heldout.ndim != data.ndim:
            raise ValueError(f"validation has {heldout.ndim} variables, data {data.ndim}")
        train = data
    T = train.total
    M = batch_size or math.ceil(math.sqrt(T))
    eval_every = eval_every or math.ceil(T / M)
    arrays, heldout_arrays = pattern_arrays(train), pattern_arrays(heldout)
    prior = Prior(model.alpha_lambda, model.alpha)
    with jax.enable_x64(True):
        problem = SVBProblem(arrays.on_device(), heldout_arrays.on_device(), jnp.cumsum(jnp.asarray(arrays.weights)))
        state = _svb_init(key_init, problem.arrays, prior=prior, rank=model.max_rank, total=arrays.total,
                          cdf=problem.cdf, batch_size=M, warmup_batches=warmup_batches)
        nll_trace = []

        def advance(carry, start, stop):
            state, previous, _ = carry
            state, nll = _run_steps(state, jax.random.fold_in(key_steps, start), problem, prior=prior, batch_size=M,
                                    length=stop - start)
            nll_trace.append(float(nll))
            return state, nll_trace[-1], (previous - nll_trace[-1]) <= tol * abs(nll_trace[-1])

        start = (state, float(_heldout_nll_jit(state.q, problem.heldout)), False)
        state, _, converged = run_in_chunks(advance, start, num_iters, chunk=eval_every,
                                            show=resolve_progress(progress_bar), description="SVB-PMF",
                                            stop_early=lambda carry: carry[2])
        done = min(len(nll_trace) * eval_every, num_iters)
        weights = np.asarray(state.q.weights)
        keep = weights / weights.sum() >= prune_threshold
        return _posterior_idata(
            model, data, weights, split_factors(state.q.factors, data.shape), keep, key=key_draw,
            num_samples=num_samples, method="svb",
            sample_stats={"heldout_nll": (("chain", "evaluation"), np.asarray(nll_trace)[None])},
            attrs=dict(converged=converged, num_iterations=done, batch_size=M, tol=tol,
                       prune_threshold=prune_threshold, heldout_nll=nll_trace[-1]),
        )


# The names of earlier releases: "vi" for VB-PMF, and "svi", which elsewhere means NumPyro's SVI.
deprecated_alias("vi", "vb", models=(PMFTensorModel,))
deprecated_alias("svi", "svb", models=(PMFTensorModel,),
                 note=" (for every other model 'svi' is NumPyro's SVI; for PMF models it will be too)")
