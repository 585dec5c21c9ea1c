"""MAP estimation of the Dirichlet Tucker decomposition by EM (Zhang & Linderman §2) and stochastic EM.

The E-step's expected allocation tensor E[z_mnpsijkl] = x_mnps π_mnpsijkl (§2.1) has eight axes;
it is never built. Every M-step statistic is a contraction of it, and each contraction factors
through the collapsed quantities of §2.3: the cell rate C_mnps = Σ_kl H_mnkl θ_kp λ_ls, with
H_mnkl = Σ_ij g_ijkl ψ_mi φ_nj, and the ratio Y = X / C. Then, for example (§2.3),

    E[α_kp] − α_θ = θ_kp Σ_mn Σ_l (Σ_s Y_mnps λ_ls) H_mnkl,

and likewise for λ, ψ, φ and G, so the largest temporary is O(MNPS · max K) (Y and its
contraction with one factor matrix) instead of O(MNPS K_M K_N K_P K_S).

The algorithm works on a list of (m, n) faces, so the same step serves full-batch EM (all faces)
and stochastic EM (a minibatch of faces, Cappé & Moulines' online EM: running sufficient
statistics s ← (1 − ρ_t) s + ρ_t ŝ_batch with ρ_t = (t + delay)^−power, then the M-step of s).
Held-out faces (§3) get weight zero, i.e. their augmentation counts are fixed at zero.

The M-step is the mode of each Dirichlet conditional (§2.2), ψ_mi ∝ α_ψ − 1 + E[Σ z], which
needs α > 1.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln as jgammaln
from scipy.special import gammaln

from ...convert import observed_variables, to_inference_data
from ...infer import em_driver
from ...infer.registry import register
from ...models.dirichlet_tucker import DirichletTuckerModel, DirichletTuckerParams
from ...parallel import chain_keys, restart_layout
from ...progress import progress, resolve_progress
from ...types import numpy_generator
from ...validation import check_choice, check_int, check_positive, renamed_options

DTYPES = {"float32": jnp.float32, "float64": jnp.float64}


class Faces(NamedTuple):
    """A set of (m, n) faces: counts (F, P, S), their mouse/epoch indices, weights and constants.

    ``log_coefficient`` is log C_f! − Σ log x_fps! of each face's multinomial (eq. 2).
    """

    counts: jax.Array
    mouse: jax.Array
    epoch: jax.Array
    weight: jax.Array
    log_coefficient: jax.Array


class Concentrations(NamedTuple):
    psi: jax.Array
    phi: jax.Array
    theta: jax.Array
    lam: jax.Array
    core: jax.Array


# -- E-step: collapsed contractions (§2.3) ----------------------------------------------------
def _face_core(params: DirichletTuckerParams, faces: Faces) -> jax.Array:
    """H_fkl = Σ_ij g_ijkl ψ_{m_f i} φ_{n_f j}: the core mixed by each face's loadings."""
    return jnp.einsum("fi,fj,ijkl->fkl", params.psi[faces.mouse], params.phi[faces.epoch], params.core)


def _cell_rates(params: DirichletTuckerParams, mixed: jax.Array) -> jax.Array:
    """C_fps = Σ_kl H_fkl θ_kp λ_ls, contracted one factor at a time (memory F·P·max(S, K_S))."""
    per_syllable = jnp.einsum("fkl,ls->fks", mixed, params.lam)
    return jnp.einsum("fks,kp->fps", per_syllable, params.theta)


def _log_likelihood(faces: Faces, rates: jax.Array) -> jax.Array:
    """log Mult(x_f | C_f, rates_f) of every face (eq. 2); rates of a face sum to one."""
    observed = faces.counts > 0
    log_rates = jnp.log(jnp.where(observed, rates, 1.0))
    return faces.log_coefficient + jnp.sum(jnp.where(observed, faces.counts * log_rates, 0.0), axis=(1, 2))


class Statistics(NamedTuple):
    """Expected sufficient statistics E[Σ z] for each parameter (Zhang & Linderman §2.2), same shapes."""

    psi: jax.Array
    phi: jax.Array
    theta: jax.Array
    lam: jax.Array
    core: jax.Array


def expected_statistics(params: DirichletTuckerParams, faces: Faces, num_mice: int, num_epochs: int):
    """E-step: (Statistics, per-face log-likelihood) without the 8-way allocation tensor."""
    mixed = _face_core(params, faces)
    rates = _cell_rates(params, mixed)
    loglik = _log_likelihood(faces, rates)
    weighted = faces.weight[:, None, None] * faces.counts
    ratio = jnp.where(weighted > 0, weighted / jnp.where(weighted > 0, rates, 1.0), 0.0)  # Y = X / C
    ratio_by_l = jnp.einsum("fps,ls->fpl", ratio, params.lam)                              # Σ_s Y λ
    ratio_by_kl = jnp.einsum("fpl,kp->fkl", ratio_by_l, params.theta)                      # B_fkl
    theta_stat = params.theta * jnp.einsum("fpl,fkl->kp", ratio_by_l, mixed)
    ratio_by_k = jnp.einsum("fps,kp->fks", ratio, params.theta)                            # Σ_p θ Y
    lam_stat = params.lam * jnp.einsum("fks,fkl->ls", ratio_by_k, mixed)
    psi_f, phi_f = params.psi[faces.mouse], params.phi[faces.epoch]
    loading = jnp.einsum("ijkl,fkl->fij", params.core, ratio_by_kl)
    psi_stat = psi_f * jnp.einsum("fij,fj->fi", loading, phi_f)
    phi_stat = phi_f * jnp.einsum("fij,fi->fj", loading, psi_f)
    core_stat = params.core * jnp.einsum("fi,fj,fkl->ijkl", psi_f, phi_f, ratio_by_kl)
    stats = Statistics(
        jax.ops.segment_sum(psi_stat, faces.mouse, num_segments=num_mice),
        jax.ops.segment_sum(phi_stat, faces.epoch, num_segments=num_epochs),
        theta_stat, lam_stat, core_stat,
    )
    return stats, loglik


# -- M-step and prior -------------------------------------------------------------------------
def _mode(pseudo_counts: jax.Array, axis) -> jax.Array:
    """Mode of a Dirichlet with parameters α + counts, given α − 1 + counts (all positive)."""
    return pseudo_counts / pseudo_counts.sum(axis=axis, keepdims=True)


def m_step(stats: Statistics, alpha: Concentrations) -> DirichletTuckerParams:
    """Modes of the Dirichlet conditionals (Zhang & Linderman §2.2): ψ*_mi ∝ α_ψ − 1 + E[Σ z]."""
    return DirichletTuckerParams(
        _mode(alpha.psi - 1.0 + stats.psi, -1),
        _mode(alpha.phi - 1.0 + stats.phi, -1),
        _mode(alpha.theta - 1.0 + stats.theta, -1),
        _mode(alpha.lam - 1.0 + stats.lam, -1),
        _mode(alpha.core - 1.0 + stats.core, (-2, -1)),
    )


def _log_dirichlet(x: jax.Array, alpha: jax.Array, axis) -> jax.Array:
    """Σ over rows of log Dir(x_row | α 1): the symmetric Dirichlet density with its normaliser."""
    size = math.prod(x.shape[a] for a in (axis if isinstance(axis, tuple) else (axis,)))
    rows = x.size // size
    norm = jgammaln(alpha * size) - size * jgammaln(alpha)
    return rows * norm + (alpha - 1.0) * jnp.sum(jnp.log(x))


def log_prior(params: DirichletTuckerParams, alpha: Concentrations) -> jax.Array:
    """log p(ψ, φ, θ, λ, G) under the Dirichlet priors of Zhang & Linderman §1."""
    return (_log_dirichlet(params.psi, alpha.psi, -1) + _log_dirichlet(params.phi, alpha.phi, -1)
            + _log_dirichlet(params.theta, alpha.theta, -1) + _log_dirichlet(params.lam, alpha.lam, -1)
            + _log_dirichlet(params.core, alpha.core, (-2, -1)))


def init_params(rng: np.random.Generator, ranks, sizes, num_starts: int) -> DirichletTuckerParams:
    """``num_starts`` random starts (leading axis), every row uniform on its simplex (Dirichlet(1)).

    Drawn on the host: a JAX random sampler inside the jitted EM would dominate its compilation.
    """
    K_M, K_N, K_P, K_S = ranks
    M, N, P, S = sizes

    def draw(size, *batch):
        return rng.dirichlet(np.ones(size), size=(num_starts, *batch))

    return DirichletTuckerParams(draw(K_M, M), draw(K_N, N), draw(P, K_P), draw(S, K_S),
                  draw(K_P * K_S, K_M, K_N).reshape(num_starts, *ranks))


# -- full-batch EM ----------------------------------------------------------------------------
def _log_posterior(params: DirichletTuckerParams, faces: Faces, alpha: Concentrations) -> jax.Array:
    """log p(X_fitted, params) up to nothing: fitted faces' eq. 2 plus the Dirichlet priors."""
    loglik = _log_likelihood(faces, _cell_rates(params, _face_core(params, faces)))
    return jnp.sum(faces.weight * loglik) + log_prior(params, alpha)


def em_step(params: DirichletTuckerParams, faces: Faces, alpha: Concentrations, num_mice: int, num_epochs: int):
    """One EM iteration: (new params, log posterior of the *incoming* params)."""
    stats, loglik = expected_statistics(params, faces, num_mice, num_epochs)
    current = jnp.sum(faces.weight * loglik) + log_prior(params, alpha)
    return m_step(stats, alpha), current


def _normalise_logs(logs: DirichletTuckerParams) -> DirichletTuckerParams:
    """Rows of every table back onto their simplex from unnormalised logs (the core per (i, j) face)."""
    axes = (-1, -1, -1, -1, (-2, -1))
    return DirichletTuckerParams(*(jnp.exp(u - jax.scipy.special.logsumexp(u, axis=a, keepdims=True))
                                   for u, a in zip(logs, axes)))


def squarem_step(params: DirichletTuckerParams, faces: Faces, alpha: Concentrations, num_mice: int,
                 num_epochs: int):
    """One SQUAREM iteration (Varadhan & Roland 2008, scheme S3) of the EM map F: (new params, log
    posterior of the *incoming* params).

    In the log parameters u (every table is positive: the M-step's α − 1 + E[Σ z] > 0),
    r = u₁ − u₀ and v = u₂ − 2u₁ + u₀ from two EM updates u₁ = F(u₀), u₂ = F(u₁); the jump
    u₀ − 2a r + a² v with a = −‖r‖/‖v‖ (at most −1; a = −1 lands on u₂) is put back on the
    simplices and given one more EM update. The jump is kept only if its log posterior is at
    least that of u₁; otherwise u₂ is returned. Every iteration therefore gains at least as much
    as one EM update (the objective never falls), and along EM's slow directions, where
    successive updates are nearly collinear, it moves many updates' worth at once.
    """
    first, current = em_step(params, faces, alpha, num_mice, num_epochs)
    second, after_one = em_step(first, faces, alpha, num_mice, num_epochs)
    u0, u1, u2 = (jax.tree.map(jnp.log, p) for p in (params, first, second))
    r = jax.tree.map(lambda a, b: b - a, u0, u1)
    v = jax.tree.map(lambda a, b, c: c - 2.0 * b + a, u0, u1, u2)

    def norm(tree):
        return jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(tree)))

    tiny = jnp.finfo(current.dtype).tiny
    step = jnp.minimum(-norm(r) / jnp.maximum(norm(v), tiny), -1.0)
    jumped = _normalise_logs(jax.tree.map(lambda a, b, c: a - 2.0 * step * b + step * step * c, u0, r, v))
    stabilised, jumped_value = em_step(jumped, faces, alpha, num_mice, num_epochs)
    keep = jnp.isfinite(jumped_value) & (jumped_value >= after_one)
    return jax.tree.map(lambda a, b: jnp.where(keep, a, b), stabilised, second), current


#: Updates of the MAP-EM backend: plain EM, or SQUAREM-accelerated EM (three EM updates an iteration).
ACCELERATIONS = {"none": em_step, "squarem": squarem_step}


@functools.partial(jax.jit, static_argnames=("sizes", "capacity", "acceleration"))
def _run_em_restarts(starts: DirichletTuckerParams, faces, alpha, num_iters, tol, *, sizes, capacity,
                     acceleration="none"):
    """EM from every start with the shared loop (:mod:`bam_ppl.infer.em_driver`); ``trace[t]`` is
    the log posterior after t updates. ``lax.map`` runs the restarts one after another: memory
    stays that of a single run."""
    update = ACCELERATIONS[acceleration]

    def run_one(params):
        return em_driver.run(lambda p: update(p, faces, alpha, sizes[0], sizes[1]),
                             lambda p: _log_posterior(p, faces, alpha), params,
                             num_iters=num_iters, tol=tol, capacity=capacity)

    return em_driver.run_starts(run_one, starts, sequential=True)


def _run_each_restart(starts: DirichletTuckerParams, *args, **options):
    """:func:`_run_em_restarts` called once per start: one compiled program serves every
    restart, so restart r rounds exactly as it does run alone (XLA may compile a loop over
    several starts differently from a loop over one)."""
    runs = [_run_em_restarts(DirichletTuckerParams(*(p[r:r + 1] for p in starts)), *args, **options)
            for r in range(starts[0].shape[0])]
    return jax.tree.map(lambda *parts: jnp.concatenate(parts), *runs)


# -- stochastic EM ----------------------------------------------------------------------------
class SEMState(NamedTuple):
    params: DirichletTuckerParams
    statistics: Statistics


def sem_step(state: SEMState, batch_index, t, faces: Faces, alpha: Concentrations, *, scale,
             num_mice: int, num_epochs: int, step_delay, step_power):
    """One online-EM step on the minibatch of faces ``batch_index``.

    The minibatch statistics are multiplied by ``scale`` = fitted faces / batch size, an unbiased
    estimate of the full-data statistics; ρ_t = (t + delay)^−power with power ∈ (0.5, 1]
    satisfies the Robbins–Monro conditions.
    """
    batch = jax.tree.map(lambda a: a[batch_index], faces)
    stats, loglik = expected_statistics(state.params, batch, num_mice, num_epochs)
    rho = (t + step_delay) ** (-step_power)
    running = jax.tree.map(lambda old, new: (1.0 - rho) * old + rho * scale * new, state.statistics, stats)
    estimate = scale * jnp.sum(loglik) + log_prior(state.params, alpha)
    return SEMState(m_step(running, alpha), running), estimate


def face_log_likelihood(params: DirichletTuckerParams, faces: Faces, chunk_size: int) -> jax.Array:
    """log Mult of every face (eq. 2), computed ``chunk_size`` faces at a time (bounded memory)."""
    num = faces.mouse.shape[0]
    padded = -(-num // chunk_size) * chunk_size
    pad = jax.tree.map(lambda a: jnp.concatenate([a, jnp.zeros((padded - num, *a.shape[1:]), a.dtype)]),
                       faces)
    chunks = jax.tree.map(lambda a: a.reshape(padded // chunk_size, chunk_size, *a.shape[1:]), pad)

    def one(chunk):
        return _log_likelihood(chunk, _cell_rates(params, _face_core(params, chunk)))

    return jax.lax.map(one, chunks).reshape(-1)[:num]


@functools.partial(jax.jit, static_argnames=("sizes",))
def _run_sem(params: DirichletTuckerParams, batches, faces, alpha, scale, step_delay, step_power, *, sizes):
    zeros = Statistics(*(jnp.zeros_like(p) for p in params))

    def body(state, inputs):
        batch_index, t = inputs
        return sem_step(state, batch_index, t, faces, alpha, scale=scale, num_mice=sizes[0],
                        num_epochs=sizes[1], step_delay=step_delay, step_power=step_power)

    steps = (batches, jnp.arange(batches.shape[0], dtype=faces.counts.dtype))
    state, trace = jax.lax.scan(body, SEMState(params, zeros), steps)
    loglik = face_log_likelihood(state.params, faces, batches.shape[1])
    return state.params, trace, loglik


# -- data preparation and validation ----------------------------------------------------------
def _faces(model: DirichletTuckerModel, X, heldout):
    """Validate X and the held-out mask; return (CountTensor, dense 4-way counts, fitted mask, C)."""
    data = model.as_data(X)
    if data.has_missing:
        raise ValueError("X has missing coordinates; hold out whole (m, n) faces with heldout= instead")
    model.visible_sizes(data.shape)
    dense = data.to_dense()
    if model.order == 3:
        dense = dense[..., None]
    M, N = dense.shape[:2]
    if heldout is None:
        held = np.zeros((M, N), dtype=bool)
    else:
        held = np.asarray(heldout)
        if held.dtype != bool:
            raise TypeError(f"heldout must be a boolean array of shape {(M, N)} (True = held out), "
                            f"got dtype {held.dtype}")
        if held.shape != (M, N):
            raise ValueError(f"heldout must have shape {(M, N)} (one entry per (m, n) face), got {held.shape}")
    fitted = ~held
    if not fitted.any():
        raise ValueError("heldout holds out every (m, n) face; at least one face must be fitted")
    sums = dense.sum(axis=(2, 3))
    fitted_sums = sums[fitted]
    if (fitted_sums != fitted_sums[0]).any():
        bad = np.argwhere(fitted & (sums != fitted_sums[0]))[0]
        raise ValueError(
            "X: every fitted (m, n) face must sum to the same total C (Zhang & Linderman eq. 2); face "
            f"{tuple(int(b) for b in np.argwhere(fitted)[0])} sums to {int(fitted_sums[0])} but face "
            f"{tuple(int(b) for b in bad)} sums to {int(sums[tuple(bad)])}"
        )
    if fitted_sums[0] <= 0:
        raise ValueError("X: the (m, n) faces hold no counts (C = 0); nothing to fit")
    return data, dense, fitted, int(fitted_sums[0])


def _face_arrays(dense: np.ndarray, fitted: np.ndarray, dtype) -> Faces:
    M, N, P, S = dense.shape
    counts = dense.reshape(M * N, P, S)
    totals = counts.sum(axis=(1, 2))
    coefficient = gammaln(totals + 1.0) - gammaln(counts + 1.0).sum(axis=(1, 2))
    mouse, epoch = np.divmod(np.arange(M * N), N)
    return Faces(jnp.asarray(counts, dtype), jnp.asarray(mouse, jnp.int32), jnp.asarray(epoch, jnp.int32),
                 jnp.asarray(fitted.reshape(-1), dtype), jnp.asarray(coefficient, dtype))


def _concentrations(model: DirichletTuckerModel, dtype) -> Concentrations:
    a = model.alpha
    # The 3-way variant runs as S = K_S = 1, where λ = [[1]] whatever its concentration.
    return Concentrations(*(jnp.asarray(a.get(n, 2.0), dtype) for n in ("psi", "phi", "theta", "lambda", "core")))


def _common_options(model, num_iters, tol, dtype):
    if not isinstance(model, DirichletTuckerModel):
        raise TypeError(f"model must be a DirichletTuckerModel, got {type(model).__name__}")
    check_int(num_iters, "num_iters")
    check_positive(tol, "tol", allow_zero=True)
    check_choice(dtype, "dtype", DTYPES)
    model.check_map_alpha()


# -- results ----------------------------------------------------------------------------------
def _inference_data(model, data, params: DirichletTuckerParams, fitted, total, loglik, *, method, sample_stats, attrs):
    """InferenceData of a point estimate: one chain, one draw, clearly labelled as such."""
    four = DirichletTuckerParams(*(np.asarray(p, np.float64) for p in params))
    out = four if model.order == 4 else DirichletTuckerParams(four.psi, four.phi, four.theta, None,
                                                              four.core[..., 0])
    tables = model.tables_from_params(out)
    reconstruction = out.reconstruct(total)

    def single(x):
        return np.asarray(x)[None, None]

    visible = model.observed
    core_dims = ("i", "j", "k", "l")[: model.order]
    posterior = {
        "psi": (("chain", "draw", "m", "i"), single(out.psi)),
        "phi": (("chain", "draw", "n", "j"), single(out.phi)),
        "theta": (("chain", "draw", "k", "p"), single(out.theta)),
        "core": (("chain", "draw", *core_dims), single(out.core)),
        "reconstruction": (("chain", "draw", *visible), single(reconstruction)),
    }
    if model.order == 4:
        posterior["lambda"] = (("chain", "draw", "l", "s"), single(out.lam))
    bound = model.bind(data)
    for table in bound.tables:
        posterior[f"theta_{table.name}"] = (("chain", "draw", *table.dims), single(tables[table.name]))
    held = ~fitted
    stats = dict(sample_stats)
    loglik = np.asarray(loglik, np.float64).reshape(fitted.shape)
    # Not "log_likelihood": ArviZ reads sample_stats.log_likelihood as a pointwise (chain, draw, ...)
    # array when no log_likelihood group exists.
    stats["final_log_likelihood"] = (("chain",), np.array([loglik[fitted].sum()]))
    if held.any():
        stats["heldout_log_likelihood"] = (("chain",), np.array([loglik[held].sum()]))
        # Per held-out face, in row-major (m, n) order: paired comparisons between models.
        stats["pointwise_heldout_log_likelihood"] = (("chain", "heldout_face"), loglik[held][None])
    observed, coords = observed_variables(data, visible)
    for n, k in zip(("i", "j", "k", "l"), model.ranks):
        coords.setdefault(n, np.arange(k))
    groups = {
        "posterior": posterior,
        "sample_stats": stats,
        "observed_data": observed,
        "constant_data": {"heldout": (("m", "n"), held)},
    }
    base = {
        "method": method,
        "point_estimate": "MAP: a single draw holding the posterior mode, not posterior samples",
        "model": repr(model),
        "structure": str(model.dag),
        "latent": str(model.latent),
        "ranks": str(model.ranks),
        "alpha": str(model.alpha),
        "observed": ",".join(visible),
        "condition_on": "m,n",
        "face_total": total,
        "heldout_faces": int(held.sum()),
    }
    return to_inference_data(groups, coords=coords, attrs={**base, **attrs})


def _ranks_and_sizes(model, dense):
    ranks = model.ranks if model.order == 4 else (*model.ranks, 1)
    return tuple(int(k) for k in ranks), tuple(int(s) for s in dense.shape)


@register("map", models=(DirichletTuckerModel,))
@restart_layout("restart", "restart_log_posterior")
@renamed_options(num_restarts="num_chains")
def dirichlet_tucker_map(model, data, *, rng_key=0, num_iters: int = 500, tol: float = 1e-7,
                         num_chains: int = 1, heldout=None, dtype: str = "float64",
                         progress_bar: bool | None = None, _first_chain: int = 0, acceleration: str = "none"):
    """MAP-EM for the Dirichlet Tucker decomposition with the collapsed allocation tensor (Zhang & Linderman §2).

    Parameters
    ----------
    model : DirichletTuckerModel
        Every concentration must exceed 1 (the mode does not exist otherwise).
    data : array-like (M, N, P, S) or (M, N, P), or CountTensor
        Counts; every fitted (m, n) face must sum to the same C.
    rng_key : int or JAX key
    num_iters : int
        Maximum EM iterations per restart.
    tol : float
        Stop when the log posterior gains less than ``tol`` × |log posterior| in an iteration
        (0 runs all ``num_iters``).
    num_chains : int
        Random starts (restarts; formerly ``num_restarts``), run one after another; the one with
        the highest log posterior is kept. Restart r starts from ``fold_in(rng_key, r)`` alone,
        so ``bam.infer(..., executor=...)`` runs it as a task of its own (``_first_chain=r``).
    heldout : bool array (M, N), optional
        Faces left out of the fit (their augmentation counts are zero, Zhang & Linderman §3); their
        multinomial log-likelihood under the estimate is reported as
        ``sample_stats["heldout_log_likelihood"]``.
    dtype : {"float64", "float32"}
        Arithmetic precision. float64 (default) makes the log posterior trace exactly monotone;
        float32 halves memory for large tensors.
    progress_bar : bool or None
        A bar over the restarts (each one compiled loop); ``None``: for several restarts (:mod:`bam_ppl.progress`).
    acceleration : {"none", "squarem"}
        ``"squarem"``: every iteration is a SQUAREM step (:func:`squarem_step`: three EM updates
        and a jump along their direction, never lowering the log posterior), which reaches the
        mode in far fewer updates where EM crawls; ``num_iters``, ``tol`` and ``log_posterior``
        then count those iterations.

    Returns
    -------
    InferenceData
        ``posterior``: ``psi, phi, theta, lambda, core`` (the paper's parameters), the allocation
        model tables ``theta_<node>``, and ``reconstruction`` = C · E-face probabilities, all as
        one chain with one draw (the MAP). ``sample_stats``: ``log_posterior`` (chain, iteration)
        (entry t after t updates), ``final_log_likelihood`` (fitted faces, at the estimate),
        ``heldout_log_likelihood`` and
        ``pointwise_heldout_log_likelihood`` (chain, heldout_face) if any face is held out,
        ``num_iterations``, ``converged``, ``restart_log_posterior`` (chain, restart).
    """
    _common_options(model, num_iters, tol, dtype)
    check_int(num_chains, "num_chains")
    check_int(_first_chain, "_first_chain", minimum=0)
    check_choice(acceleration, "acceleration", ACCELERATIONS)
    show = resolve_progress(progress_bar, long_run=num_chains > 1)
    data, dense, fitted, total = _faces(model, data, heldout)
    ranks, sizes = _ranks_and_sizes(model, dense)
    # Restart r starts from a Generator seeded by its own key, as it would run alone.
    each = [init_params(numpy_generator(key), ranks, sizes, 1)
            for key in chain_keys(rng_key, num_chains, _first_chain)]
    starts = DirichletTuckerParams(*(np.concatenate(p) for p in zip(*each)))
    with jax.enable_x64(dtype == "float64"), progress(1, "map (EM restarts)", show, unit="fit") as bar:
        dt = DTYPES[dtype]
        faces = _face_arrays(dense, fitted, dt)
        alpha = _concentrations(model, dt)
        starts = DirichletTuckerParams(*(jnp.asarray(p, dt) for p in starts))
        states = _run_each_restart(starts, faces, alpha, jnp.int32(num_iters), jnp.asarray(tol, dt),
                                  sizes=sizes, capacity=em_driver.trace_capacity(num_iters),
                                  acceleration=acceleration)
        bar.update(1)
        iterations = np.asarray(states.iteration)
        finals = em_driver.final_objectives(states)
        best = em_driver.best_start(finals)
        params = DirichletTuckerParams(*(p[best] for p in states.params))
        loglik = face_log_likelihood(params, faces, dense.shape[0] * dense.shape[1])
        loglik = np.asarray(loglik)
    trace = em_driver.trace_of(states, best).astype(np.float64)
    sample_stats = {
        "log_posterior": (("chain", "iteration"), trace[None]),
        "num_iterations": (("chain",), np.array([iterations[best]])),
        "converged": (("chain",), np.array([bool(states.converged[best])])),
        "restart_log_posterior": (("chain", "restart"), finals[None].astype(np.float64)),
    }
    attrs = dict(num_iters=num_iters, tol=tol, num_restarts=num_chains, best_restart=_first_chain + best,
                 dtype=dtype, acceleration=acceleration)
    return _inference_data(model, data, params, fitted, total, loglik, method="map",
                           sample_stats=sample_stats, attrs=attrs)


@register("sem", models=(DirichletTuckerModel,))
def dirichlet_tucker_sem(model, data, *, rng_key=0, num_iters: int = 5000, batch_size: int = 64,
                         step_delay: float = 1.0, step_power: float = 0.51, heldout=None,
                         dtype: str = "float64", progress_bar: bool | None = None):
    """Stochastic (online) EM over minibatches of (m, n) faces for large Dirichlet Tucker fits.

    Each step samples ``batch_size`` fitted faces without replacement, computes their expected
    statistics with the collapsed contractions of Zhang & Linderman §2.3 (memory O(batch · P · S · max K)),
    blends them into running statistics with step size ρ_t = (t + step_delay)^−step_power, and
    takes the M-step (Dirichlet modes, §2.2).

    Parameters
    ----------
    model, data, rng_key, heldout, dtype
        As for ``method="map"``.
    num_iters : int
        Number of minibatch steps.
    batch_size : int
        Faces per minibatch (at most the number of fitted faces).
    step_delay : float
        τ ≥ 1 in ρ_t = (t + τ)^−κ; larger values forget the early, poor statistics more slowly.
    step_power : float
        κ ∈ (0.5, 1], the decay of the step size (Robbins–Monro). EM on this model needs hundreds
        of full iterations, and Σ_t ρ_t counts roughly how many the running statistics have
        taken, so the default sits near 0.5 where the step size decays slowest.
    progress_bar : bool or None
        Like every backend's (:mod:`bam_ppl.progress`); the steps run as one compiled scan, so
        the bar has one step, filled when the scan ends.

    Returns
    -------
    InferenceData
        As for ``method="map"``, except that ``sample_stats["log_posterior_minibatch"]``
        (chain, iteration) holds the minibatch estimate of the log posterior at each step (the
        likelihood part scaled from the minibatch), while ``final_log_posterior`` and
        ``final_log_likelihood`` are exact full-data values for the final estimate.
    """
    _common_options(model, num_iters, 0.0, dtype)
    check_int(batch_size, "batch_size")
    check_positive(step_delay, "step_delay")
    if step_delay < 1.0:
        raise ValueError(f"step_delay must be >= 1 so that every step size is at most 1, got {step_delay}")
    check_positive(step_power, "step_power", upper=1.0)
    show = resolve_progress(progress_bar)
    if step_power <= 0.5:
        raise ValueError(f"step_power must be in (0.5, 1] (Robbins–Monro), got {step_power}")
    rng = numpy_generator(rng_key)
    data, dense, fitted, total = _faces(model, data, heldout)
    fitted_index = np.flatnonzero(fitted.reshape(-1))
    if batch_size > fitted_index.size:
        raise ValueError(
            f"batch_size must be at most the number of fitted faces ({fitted_index.size}), got {batch_size}")
    ranks, sizes = _ranks_and_sizes(model, dense)
    start = DirichletTuckerParams(*(p[0] for p in init_params(rng, ranks, sizes, 1)))
    # Each step's faces are drawn without replacement among the fitted ones (held-out faces never
    # enter a minibatch, so their augmentation counts stay zero).
    batches = np.stack([rng.choice(fitted_index, batch_size, replace=False) for _ in range(num_iters)])
    with jax.enable_x64(dtype == "float64"), progress(1, "sem (minibatch steps)", show, unit="fit"):
        dt = DTYPES[dtype]
        faces = _face_arrays(dense, fitted, dt)
        alpha = _concentrations(model, dt)
        params, trace, loglik = _run_sem(
            DirichletTuckerParams(*(jnp.asarray(p, dt) for p in start)), jnp.asarray(batches, jnp.int32), faces, alpha,
            jnp.asarray(fitted_index.size / batch_size, dt), jnp.asarray(step_delay, dt),
            jnp.asarray(step_power, dt), sizes=sizes)
        final = float(jnp.sum(faces.weight * loglik) + log_prior(params, alpha))
        loglik = np.asarray(loglik)
    sample_stats = {
        "log_posterior_minibatch": (("chain", "iteration"), np.asarray(trace, np.float64)[None]),
        "final_log_posterior": (("chain",), np.array([final])),
    }
    attrs = dict(num_iters=num_iters, batch_size=batch_size, step_delay=step_delay,
                 step_power=step_power, dtype=dtype)
    return _inference_data(model, data, params, fitted, total, loglik, method="sem",
                           sample_stats=sample_stats, attrs=attrs)
