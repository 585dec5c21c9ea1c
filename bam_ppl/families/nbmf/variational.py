"""Variational backends for Beta-Dir NBMF (Lumbreras et al. 2020): collapsed CVB0 and uncollapsed bICA.

``"cvb"`` — collapsed variational Bayes with the zero-order approximation (CVB0, §4.3 eq. 36):
q(Z) = Π q(z_fn) with responsibilities φ_fn updated in place, entry after entry, from the soft
counts with the entry's own contribution removed,

    φ_fkn ∝ (γ_k + L̄_fk^¬fn) (α_k + Ā_kn^¬fn)^v (β_k + B̄_kn^¬fn)^(1−v) / (α_k + β_k + M̄_kn^¬fn).

As in the Gibbs sampler, entries in distinct rows and columns do not share a count, so each
wrapped diagonal (see :mod:`bam_ppl.families.nbmf.gibbs`) is updated at once: this is the sequential
CVB0 recursion in a particular entry order. There is no objective (the Taylor approximation removes
the bound), so it runs a fixed ``num_iters`` and reports the training fit (eq. 66) per iteration.

``"vb"`` — the bICA baseline (Kabán & Bingham 2008): mean-field q(W) q(H) q(Z) with Dirichlet,
Beta and categorical factors, updated in parallel with the digamma terms frozen during a sweep.
φ is never stored: with ew_fk = exp E log w_fk and eh^v_kn = exp E log p(v | h_kn), the sufficient
statistics are matrix products, Σ_n φ_fkn = ew_fk [R¹ (eh¹)ᵀ + R⁰ (eh⁰)ᵀ]_fk with
R^v_fn = 1[v_fn = v, observed] / (ew eh^v)_fn, so a sweep costs O(FKN) with O(FN + (F+N)K) memory.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import digamma, gammaln

from ...infer.registry import register
from ...models.nbmf import ACTIVE_THRESHOLD, NBMF
from ...parallel import chain_keys, restart_layout
from ...types import numpy_generator
from ...validation import check_int, check_positive, renamed_options
from . import common


class CVBState(NamedTuple):
    phi: jnp.ndarray  # (D, m, K) responsibilities, 0 on missing entries
    L: jnp.ndarray  # (F, K) Σ_n φ_fkn
    A: jnp.ndarray  # (N, K) Σ_f φ_fkn v_fn
    B: jnp.ndarray  # (N, K) Σ_f φ_fkn (1 − v_fn)


class VariationalRun(NamedTuple):
    """One restart's state and per-iteration traces."""

    state: NamedTuple
    fit_trace: jnp.ndarray  # (num_iters,) CVB0: training NLL (eq. 66); VB: ELBO
    active: jnp.ndarray  # (num_iters,)


def _soft_counts(layout, phi, F, N):
    K = phi.shape[-1]
    ones = phi * layout.values[..., None]
    L = jnp.zeros((F, K), phi.dtype).at[layout.rows].add(phi)
    A = jnp.zeros((N, K), phi.dtype).at[layout.cols].add(ones)
    B = jnp.zeros((N, K), phi.dtype).at[layout.cols].add(phi - ones)
    return L, A, B


def cvb_means(L, A, B, hyper):
    """E_q[W] (F × K) and E_q[H] (K × N) (Lumbreras et al. 2020 eqs. 37–39)."""
    W = (hyper.row + L) / (hyper.row + L).sum(-1, keepdims=True)
    H = (hyper.alpha + A) / (hyper.alpha + hyper.beta + A + B)
    return W, H.T


def _training_nll(W, H, values, observed):
    """eq. 66 on the training entries."""
    p = jnp.clip(W @ H, 1e-12, 1 - 1e-12)
    return -jnp.sum(jnp.where(observed, jnp.where(values == 1, jnp.log(p), jnp.log1p(-p)), 0.0))


def _active(L, threshold):
    mass = L.sum(0)
    return jnp.sum(mass > threshold * mass.sum()).astype(jnp.int32)


def cvb_init(key, layout, F, N, K):
    """One-hot responsibilities at uniform random labels (Lumbreras et al. 2020 §4.3: many components used)."""
    z = jax.random.randint(key, layout.values.shape, 0, K)
    phi = jax.nn.one_hot(z, K, dtype=jnp.float32) * layout.observed[..., None]
    return CVBState(phi, *_soft_counts(layout, phi, F, N))


def cvb_sweep(state, layout, hyper):
    """One CVB0 pass (eq. 36) over every observed entry, one wrapped diagonal at a time."""
    a, b, g = hyper.alpha, hyper.beta, hyper.row

    def block(counts, x):
        L, A, B = counts
        rows, cols, v, obs, phi_old = x
        one = v[:, None].astype(phi_old.dtype)
        L_rest = L[rows] - phi_old
        A_rest = A[cols] - phi_old * one
        B_rest = B[cols] - phi_old * (1 - one)
        weights = (g + L_rest) * jnp.where(one == 1, a + A_rest, b + B_rest) / (a + b + A_rest + B_rest)
        phi_new = weights / weights.sum(-1, keepdims=True) * obs[:, None]
        L = L.at[rows].set(L_rest + phi_new, unique_indices=True)
        A = A.at[cols].set(A_rest + phi_new * one, unique_indices=True)
        B = B.at[cols].set(B_rest + phi_new * (1 - one), unique_indices=True)
        return (L, A, B), phi_new

    _, phi = jax.lax.scan(block, (state.L, state.A, state.B),
                          (layout.rows, layout.cols, layout.values, layout.observed, state.phi))
    # Rebuild the soft counts from φ so float32 round-off of the in-place updates cannot drift.
    return CVBState(phi, *_soft_counts(layout, phi, state.L.shape[0], state.A.shape[0]))


def run_cvb(run, start, stop, layout, hyper, values, observed, *, threshold):
    def body(i, run):
        state = cvb_sweep(run.state, layout, hyper)
        W, H = cvb_means(state.L, state.A, state.B, hyper)
        return VariationalRun(state, run.fit_trace.at[i].set(_training_nll(W, H, values, observed)),
                              run.active.at[i].set(_active(state.L, threshold)))

    return jax.lax.fori_loop(start, stop, body, run)


# -- uncollapsed mean-field VB (bICA) -------------------------------------------------------------

class VBState(NamedTuple):
    row: jnp.ndarray  # (F, K) γ̃: q(w_f) = Dirichlet(γ̃_f)
    ones: jnp.ndarray  # (K, N) α̃: q(h_kn) = Beta(α̃, β̃)
    zeros: jnp.ndarray  # (K, N) β̃


def _expected_log_dirichlet(concentration):
    return digamma(concentration) - digamma(concentration.sum(-1, keepdims=True))


def _kl_dirichlet(posterior, prior):
    """KL(Dir(posterior) ‖ Dir(prior)) summed over the leading axes (last axis = simplex)."""
    prior = jnp.broadcast_to(prior, posterior.shape)
    return jnp.sum(gammaln(posterior.sum(-1)) - gammaln(posterior).sum(-1) - gammaln(prior.sum(-1))
                   + gammaln(prior).sum(-1)
                   + ((posterior - prior) * _expected_log_dirichlet(posterior)).sum(-1))


def vb_init(key, values, observed, hyper):
    """Random one-hot responsibilities, as for CVB0 (the paper shares the init, §6.4)."""
    K = hyper.row.shape[0]
    phi = jax.nn.one_hot(jax.random.randint(key, values.shape, 0, K), K) * observed[..., None]
    ones = (phi * values[..., None]).sum(0).T
    return VBState(hyper.row + phi.sum(1), hyper.alpha[:, None] + ones,
                   hyper.beta[:, None] + phi.sum(0).T - ones)


def vb_sweep(state, values, observed, hyper):
    """One parallel update; returns the new state and the ELBO of (old q(W), q(H), optimal q(Z))."""
    log_w = _expected_log_dirichlet(state.row)
    total = digamma(state.ones + state.zeros)
    log_h1 = digamma(state.ones) - total
    log_h0 = digamma(state.zeros) - total
    # Per-row and per-column shifts cancel in φ and are added back to the log-normalisers.
    shift_w = log_w.max(-1, keepdims=True)
    shift_1 = log_h1.max(0, keepdims=True)
    shift_0 = log_h0.max(0, keepdims=True)
    ew, eh1, eh0 = jnp.exp(log_w - shift_w), jnp.exp(log_h1 - shift_1), jnp.exp(log_h0 - shift_0)
    norm1, norm0 = ew @ eh1, ew @ eh0
    is_one = observed & (values == 1)
    is_zero = observed & (values == 0)
    r1 = jnp.where(is_one, 1.0 / jnp.where(is_one, norm1, 1.0), 0.0)
    r0 = jnp.where(is_zero, 1.0 / jnp.where(is_zero, norm0, 1.0), 0.0)
    row_counts = ew * (r1 @ eh1.T + r0 @ eh0.T)
    one_counts = eh1 * (ew.T @ r1)
    zero_counts = eh0 * (ew.T @ r0)
    log_norm = (jnp.where(is_one, jnp.log(jnp.where(is_one, norm1, 1.0)) + shift_1, 0.0)
                + jnp.where(is_zero, jnp.log(jnp.where(is_zero, norm0, 1.0)) + shift_0, 0.0))
    log_norm = log_norm.sum() + jnp.sum(shift_w[:, 0] * observed.sum(1))
    beta_posterior = jnp.stack([state.ones, state.zeros], -1)
    beta_prior = jnp.stack([jnp.broadcast_to(hyper.alpha[:, None], state.ones.shape),
                            jnp.broadcast_to(hyper.beta[:, None], state.ones.shape)], -1)
    elbo = log_norm - _kl_dirichlet(state.row, hyper.row) - _kl_dirichlet(beta_posterior, beta_prior)
    new = VBState(hyper.row + row_counts, hyper.alpha[:, None] + one_counts,
                  hyper.beta[:, None] + zero_counts)
    return new, elbo


def vb_means(state):
    return state.row / state.row.sum(-1, keepdims=True), state.ones / (state.ones + state.zeros)


def run_vb(run, start, stop, values, observed, hyper, *, threshold):
    def body(i, run):
        state, elbo = vb_sweep(run.state, values, observed, hyper)
        return VariationalRun(state, run.fit_trace.at[i].set(elbo),
                              run.active.at[i].set(_active(state.row - hyper.row, threshold)))

    return jax.lax.fori_loop(start, stop, body, run)


# -- drivers --------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("F", "N", "K", "num_iters"))
def _init_cvb(keys, layout, *, F, N, K, num_iters):
    states = jax.vmap(cvb_init, in_axes=(0, None, None, None, None))(keys, layout, F, N, K)
    return VariationalRun(states, jnp.zeros((keys.shape[0], num_iters)),
                          jnp.zeros((keys.shape[0], num_iters), jnp.int32))


@functools.partial(jax.jit, static_argnames=("threshold",))
def _advance_cvb(runs, start, stop, layout, hyper, values, observed, *, threshold):
    fn = functools.partial(run_cvb, threshold=threshold)
    return jax.vmap(fn, in_axes=(0, None, None, None, None, None, None))(
        runs, start, stop, layout, hyper, values, observed)


@functools.partial(jax.jit, static_argnames=("num_iters",))
def _init_vb(keys, values, observed, hyper, *, num_iters):
    states = jax.vmap(vb_init, in_axes=(0, None, None, None))(keys, values, observed, hyper)
    return VariationalRun(states, jnp.zeros((keys.shape[0], num_iters)),
                          jnp.zeros((keys.shape[0], num_iters), jnp.int32))


@functools.partial(jax.jit, static_argnames=("threshold",))
def _advance_vb(runs, start, stop, values, observed, hyper, *, threshold):
    fn = functools.partial(run_vb, threshold=threshold)
    return jax.vmap(fn, in_axes=(0, None, None, None, None, None))(runs, start, stop, values, observed, hyper)


def _draw_q(draw_keys, row, ones, zeros, num_samples):
    """Draws of W ~ Π_f Dir(row_f) and H ~ Π Beta(ones, zeros) per restart (eqs. 37–38).

    ``row`` (R, F, K), ``ones``/``zeros`` (R, K, N) → W (R, S, F, K), H (R, S, K, N), drawn with
    NumPy (see :func:`bam_ppl.families.nbmf.gibbs.conjugate_draws`), restart r from a Generator
    seeded by ``draw_keys[r]``.
    """
    expand = lambda x: np.repeat(np.asarray(x, np.float64)[:, None], num_samples, axis=1)
    row, ones, zeros = expand(row), expand(ones), expand(zeros)
    W, H = [], []
    for r, key in enumerate(draw_keys):
        rng = numpy_generator(key)
        W.append(common.dirichlet_rows(rng, row[r:r + 1]))
        H.append(rng.beta(ones[r:r + 1], zeros[r:r + 1]))
    return np.concatenate(W).astype(np.float32), np.concatenate(H).astype(np.float32)


def _check_options(model, method, num_iters, num_chains, num_samples, active_threshold, first_chain):
    if model.prior == "dir-dir":
        raise ValueError(f"method {method!r} serves the beta-dir and dir-beta priors; Lumbreras et al. 2020 gives "
                         "no variational scheme for dir-dir, use method='gibbs'")
    check_int(num_iters, "num_iters")
    check_int(num_chains, "num_chains")
    check_int(first_chain, "_first_chain", minimum=0)
    check_int(num_samples, "num_samples")
    check_positive(active_threshold, "active_threshold", upper=1.0)


@register("cvb", models=(NBMF,))
@restart_layout()  # every restart is kept, as a chain
@renamed_options(num_restarts="num_chains")
def cvb(model: NBMF, data, *, rng_key=0, mask=None, num_iters: int = 500, num_chains: int = 1,
        num_samples: int = 20, active_threshold: float = ACTIVE_THRESHOLD, progress_bar: bool | None = None,
        _first_chain: int = 0):
    """Collapsed VB with the zero-order approximation (CVB0) for Beta-Dir NBMF (Lumbreras et al. 2020 §4.3).

    Parameters
    ----------
    model : NBMF
        ``prior="beta-dir"`` (or ``"dir-beta"``, run on Vᵀ). With ``n_components=K`` small and
        ``gamma=K`` (γ_k = 1) this is the paper's c-bICA-K.
    data : array (F, N) of 0/1 with NaN for missing entries, or a BinaryMatrix
    rng_key : int or JAX key
    mask : array of bool (F, N), optional
        ``True`` = observed; hidden entries have no responsibility and enter no count.
    num_iters : int
        Sweeps over all observed entries (paper: 500).
    num_chains : int
        Independent random initialisations (restarts), run vectorised (the ``chain``
        dimension); formerly ``num_restarts``. Restart r starts from and draws with
        ``fold_in(rng_key, r)`` alone, so ``bam.infer(..., executor=...)`` runs it as a task of
        its own (private option ``_first_chain=r``).
    num_samples : int
        Draws of W and H from q(W) q(H) (eqs. 37–38) stored per restart.
    active_threshold : float
        A component is active when it holds more than this fraction of the soft assignments.
    progress_bar : bool or None
        tqdm bar over iterations; ``None`` reports long runs (:mod:`bam_ppl.progress`).

    Returns
    -------
    InferenceData
        posterior ``W``, ``H`` (draws from q); group ``expectations``: ``WH`` = E_q[W] E_q[H]
        (eq. 39) per restart; sample_stats ``nll`` (chain, iteration): training fit (eq. 66),
        ``n_active_trace`` (chain, iteration) and ``n_active`` (chain,).
    """
    _check_options(model, "cvb", num_iters, num_chains, num_samples, active_threshold, _first_chain)
    binary = common.check_data(model, data, mask)
    _, core_values, core_observed, hyper, transposed = common.core_problem(model, binary.values, binary.observed)
    F, N = core_values.shape
    layout = common.DiagonalLayout(*(jnp.asarray(a) for a in common.diagonal_layout(core_values, core_observed)))
    init_keys, draw_keys = chain_keys(rng_key, num_chains, _first_chain, parts=2)
    runs = _init_cvb(init_keys, layout, F=F, N=N,
                     K=model.n_components, num_iters=num_iters)
    data_args = (jnp.asarray(core_values, jnp.int32), jnp.asarray(core_observed))
    advance = lambda runs, start, stop: _advance_cvb(runs, start, stop, layout, hyper, *data_args,
                                                     threshold=float(active_threshold))
    runs = common.run_in_chunks(advance, runs, num_iters, progress_bar, "cvb", "iteration")
    state = runs.state
    W_mean, H_mean = jax.vmap(cvb_means, in_axes=(0, 0, 0, None))(state.L, state.A, state.B, hyper)
    W, H = _draw_q(draw_keys, hyper.row + state.L, jnp.swapaxes(hyper.alpha + state.A, -1, -2),
                   jnp.swapaxes(hyper.beta + state.B, -1, -2), num_samples)
    return _inference_data(model, binary, (W, H), (W_mean, H_mean), runs, fit_name="nll", method="cvb",
                           transposed=transposed, attrs=dict(num_iters=num_iters, active_threshold=active_threshold))


@register("vb", models=(NBMF,))
@restart_layout()  # every restart is kept, as a chain
@renamed_options(num_restarts="num_chains")
def vb(model: NBMF, data, *, rng_key=0, mask=None, num_iters: int = 500, num_chains: int = 1,
       num_samples: int = 20, active_threshold: float = ACTIVE_THRESHOLD, progress_bar: bool | None = None,
       _first_chain: int = 0):
    """Uncollapsed mean-field VB for Beta-Dir NBMF: the bICA baseline of Lumbreras et al. 2020 §6.

    The paper's bICA-K is ``nbmf(K, alpha=1, beta=1, gamma=K)`` (γ_k = 1) with small K.

    Parameters
    ----------
    Same as :func:`cvb`.

    Returns
    -------
    InferenceData
        posterior ``W``, ``H`` (draws from q); group ``expectations``: ``WH`` = E_q[W] E_q[H];
        sample_stats ``elbo`` (chain, iteration), ``n_active_trace`` and ``n_active``.
    """
    _check_options(model, "vb", num_iters, num_chains, num_samples, active_threshold, _first_chain)
    binary = common.check_data(model, data, mask)
    _, core_values, core_observed, hyper, transposed = common.core_problem(model, binary.values, binary.observed)
    data_args = (jnp.asarray(core_values, jnp.float32), jnp.asarray(core_observed))
    init_keys, draw_keys = chain_keys(rng_key, num_chains, _first_chain, parts=2)
    runs = _init_vb(init_keys, *data_args, hyper, num_iters=num_iters)
    advance = lambda runs, start, stop: _advance_vb(runs, start, stop, *data_args, hyper,
                                                    threshold=float(active_threshold))
    runs = common.run_in_chunks(advance, runs, num_iters, progress_bar, "vb", "iteration")
    state = runs.state
    W_mean, H_mean = jax.vmap(vb_means)(state)
    W, H = _draw_q(draw_keys, state.row, state.ones, state.zeros, num_samples)
    return _inference_data(model, binary, (W, H), (W_mean, H_mean), runs, fit_name="elbo", method="vb",
                           transposed=transposed, attrs=dict(num_iters=num_iters, active_threshold=active_threshold))


def _inference_data(model, binary: common.BinaryData, draws, means, runs, *, fit_name, method, transposed, attrs):
    """InferenceData of the VB and CVB fits: ``draws`` (W, H) from q and ``means`` (E_q[W], E_q[H]) per restart."""
    (W, H), (W_mean, H_mean) = draws, means
    mean = np.einsum("cfk,ckn->cfn", np.asarray(W_mean, np.float64), np.asarray(H_mean, np.float64))
    active = np.asarray(runs.active)
    stats = {fit_name: (("chain", "iteration"), np.asarray(runs.fit_trace)),
             "n_active_trace": (("chain", "iteration"), active),
             "n_active": (("chain",), active[:, -1])}
    return common.nbmf_inference_data(model, binary, W=np.asarray(W), H=np.asarray(H), mean=mean, sample_stats=stats,
                                      method=method, transposed=transposed, attrs=attrs)
