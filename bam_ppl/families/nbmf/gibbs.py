"""Collapsed Gibbs samplers for mean-parameterized NBMF (Lumbreras et al. 2020 §4.2 Alg. 1, §5.2 Alg. 2).

W and H are integrated out; the state is one label z_fn per observed entry (Beta-Dir) or a pair
(z_fn, c_fn) (Dir-Dir, the double augmentation of eqs. 45–52), with int32 counts

* L (F × K): L_fk = #{n : z_fn = k};
* Beta-Dir: A, B (N × K): ones and zeros of column n assigned to k;
* Dir-Dir: Q (N × K): Q_nk = #{f : c_fn = k}.

Missing entries have no label (stored as -1) and never enter a count.

**Scan order.** The conditional of entry (f, n) (eq. 25; eqs. 59–61) reads only row f's counts
L_f and column n's counts (A_n, B_n or Q_n). Entries in distinct rows *and* distinct columns are
therefore conditionally independent given all other labels, and drawing them together is an
exact Gibbs block update. A sweep visits the F·N entries in D = max(F, N) "wrapped diagonals"
{(f, n) : n − f ≡ s (mod N)} (or the transpose when F > N), each holding min(F, N) entries in
distinct rows and columns: ``lax.scan`` over the diagonals, vectorised inside one. This is the
sequential sampler of Alg. 1/2 with a different (systematic) visiting order, and the same
stationary distribution.

**Start.** Beta-Dir (and Dir-Beta) chains start, as the authors' R/Rcpp sampler does, from the
labels of a short bICA fit with 10 components (:func:`bica_labels`), not from the uniform labels
over all K components that the paper's text describes. From uniform labels with K = 100 the
collapsed sampler spends thousands of sweeps merging near-empty components on a large matrix
(lastfm, 25 % held out, 100 + 100 sweeps: held-out negative log-likelihood per entry 0.1775 from
uniform labels, 0.1586 from the bICA start; benchmarks/README.md, NBMF section).
``init="random"`` keeps the uniform start.

Kept sweeps accumulate the Rao-Blackwellised mean E[WH | V] ≈ (1/J) Σ_j E[W | Z⁽ʲ⁾] E[H | Z⁽ʲ⁾]
(eqs. 30–33; exact since W ⊥ H | Z); posterior draws of W and H are drawn from their conjugate
posteriors given the kept labels (eqs. 26–27, 62–63).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import digamma, gammaln

from ...infer.registry import register
from ...models.nbmf import ACTIVE_THRESHOLD, NBMF
from ...parallel import chain_keys
from ...types import numpy_generator
from ...validation import check_int, check_positive
from .common import (  # noqa: F401  (re-exported: the NBMF layout and checks)
    CHUNK_SWEEPS,
    DiagonalLayout,
    Hyper,
    check_data,
    core_problem,
    diagonal_layout,
    dirichlet_rows,
    nbmf_inference_data,
    run_in_chunks,
    to_matrix,
)
from .variational import VBState, vb_init, vb_sweep

MAX_STORED_BYTES = 2**31  # stored W and H draws above this need thinning=


def categorical(weights, uniforms):
    """Inverse-CDF draw of one label per row of nonnegative ``weights`` (…, K) with one uniform.

    Two-level search: the K weights are cut into ⌈√K⌉ groups, the group is found on the
    cumulative group totals and the label on the cumulative weights inside it. XLA's CPU cumsum
    costs O(K²) per row (a windowed reduction), so this is several times faster for K = 100.
    """
    K = weights.shape[-1]
    size = max(1, math.isqrt(K - 1) + 1)
    groups = -(-K // size)
    padded = jnp.pad(weights, [(0, 0)] * (weights.ndim - 1) + [(0, groups * size - K)])
    grouped = padded.reshape(weights.shape[:-1] + (groups, size))
    group_totals = grouped.sum(-1)
    group_cumulative = jnp.cumsum(group_totals, -1)
    target = uniforms[..., None] * group_cumulative[..., -1:]
    group = jnp.minimum(jnp.sum(group_cumulative < target, -1), groups - 1)[..., None]
    before = jnp.take_along_axis(group_cumulative - group_totals, group, -1)
    within = jnp.take_along_axis(grouped, group[..., None], -2)[..., 0, :]
    offset = jnp.minimum(jnp.sum(jnp.cumsum(within, -1) < target - before, -1), size - 1)
    return jnp.minimum(group[..., 0] * size + offset, K - 1).astype(jnp.int32)


class BetaDirState(NamedTuple):
    z: jnp.ndarray  # (D, m) int32, -1 where missing
    L: jnp.ndarray  # (F, K) int32
    A: jnp.ndarray  # (N, K) int32, ones
    B: jnp.ndarray  # (N, K) int32, zeros


class DirDirState(NamedTuple):
    z: jnp.ndarray  # (D, m) int32
    c: jnp.ndarray  # (D, m) int32
    L: jnp.ndarray  # (F, K) int32
    Q: jnp.ndarray  # (N, K) int32


def _one_hot(labels, K):
    return jax.nn.one_hot(labels, K, dtype=jnp.int32)  # label -1 (missing) -> zero row


def _row_counts(layout, labels, F, K):
    return jnp.zeros((F, K), jnp.int32).at[layout.rows].add(_one_hot(labels, K))


def _col_counts(layout, labels, N, K, weight=None):
    hot = _one_hot(labels, K)
    if weight is not None:
        hot = hot * weight[..., None]
    return jnp.zeros((N, K), jnp.int32).at[layout.cols].add(hot)


# -- Beta-Dir, Alg. 1 -----------------------------------------------------------------------------

def random_labels(key, layout, K):
    """Uniform random labels on the observed entries, -1 elsewhere (Lumbreras et al. 2020 §6.2)."""
    z = jax.random.randint(key, layout.values.shape, 0, K, dtype=jnp.int32)
    return jnp.where(layout.observed, z, -1)


def beta_dir_state(z, layout, F, N, K):
    """The Beta-Dir state of the labels ``z`` (laid out like ``layout``, -1 where missing)."""
    return BetaDirState(z, _row_counts(layout, z, F, K), _col_counts(layout, z, N, K, layout.values),
                        _col_counts(layout, z, N, K, 1 - layout.values))


def beta_dir_init(key, layout, F, N, K):
    """Uniform random labels on the observed entries (Lumbreras et al. 2020 §6.2)."""
    return beta_dir_state(random_labels(key, layout, K), layout, F, N, K)


def beta_dir_sweep(state, layout, uniforms, hyper):
    """One sweep of eq. 25 over all observed entries, one wrapped diagonal at a time."""
    K = state.L.shape[1]
    a, b, g = hyper.alpha, hyper.beta, hyper.row

    def block(counts, x):
        L, A, B = counts
        rows, cols, v, obs, u, z_old = x
        one = v[:, None]
        hot_old = _one_hot(z_old, K)
        L_rest = L[rows] - hot_old
        A_rest = A[cols] - hot_old * one
        B_rest = B[cols] - hot_old * (1 - one)
        # eq. 25: (γ_k + L^¬) (α_k + A^¬)^v (β_k + B^¬)^(1-v) / (α_k + β_k + M^¬)
        weights = (g + L_rest) * jnp.where(one == 1, a + A_rest, b + B_rest) / (a + b + A_rest + B_rest)
        z_new = jnp.where(obs, categorical(weights, u), -1)
        hot_new = _one_hot(z_new, K)
        L = L.at[rows].set(L_rest + hot_new, unique_indices=True)
        A = A.at[cols].set(A_rest + hot_new * one, unique_indices=True)
        B = B.at[cols].set(B_rest + hot_new * (1 - one), unique_indices=True)
        return (L, A, B), z_new

    (L, A, B), z = jax.lax.scan(
        block, (state.L, state.A, state.B),
        (layout.rows, layout.cols, layout.values, layout.observed, uniforms[0], state.z))
    return BetaDirState(z, L, A, B)


def _dirichlet_rows_log_marginal(counts, concentration):
    """Σ_rows log of Γ(Σc)/ΠΓ(c_k) · Π_k Γ(c_k + n_k) / Γ(Σc + Σ_k n_k) (eqs. 22, 56)."""
    counts = counts.astype(jnp.float32)
    total = concentration.sum()
    return jnp.sum(gammaln(total) - gammaln(concentration).sum() + gammaln(concentration + counts).sum(-1)
                   - gammaln(total + counts.sum(-1)))


def beta_dir_log_joint(state, hyper):
    """log p(V, Z) (Lumbreras et al. 2020 eqs. 22–24), the monitoring trace."""
    a, b = hyper.alpha, hyper.beta
    A, B = state.A.astype(jnp.float32), state.B.astype(jnp.float32)
    columns = gammaln(a + b) - gammaln(a) - gammaln(b) + gammaln(a + A) + gammaln(b + B) - gammaln(a + b + A + B)
    return _dirichlet_rows_log_marginal(state.L, hyper.row) + columns.sum()


def beta_dir_means(state, hyper):
    """E[W | Z] (F × K) and E[H | Z] (K × N) (eqs. 26–27)."""
    L = state.L.astype(jnp.float32) + hyper.row
    A, B = state.A.astype(jnp.float32), state.B.astype(jnp.float32)
    return L / L.sum(-1, keepdims=True), ((hyper.alpha + A) / (hyper.alpha + hyper.beta + A + B)).T


# -- Dir-Dir, Alg. 2 ------------------------------------------------------------------------------

def dir_dir_init(key, layout, F, N, K):
    """Random z and c = z, as in the authors' code (Lumbreras et al. 2020 §5.2, Alg. 2).

    The start violates v = Σ_k c_k z_k where v = 0; the first sweep draws z ≠ c there (eqs.
    60–61), so every state from sweep 1 on satisfies the constraint. In trials on the Catalan
    parliament this start reached the paper's mode (NLL ≈ 8,930) more reliably than a random
    valid C, which left one chain of two in a poorer one (≈ 9,590).
    """
    return dir_dir_state(random_labels(key, layout, K), layout, F, N, K)


def dir_dir_state(z, layout, F, N, K):
    """The Dir-Dir state with labels ``z`` and c = z (the first sweep repairs v = 0 entries)."""
    return DirDirState(z, z, _row_counts(layout, z, F, K), _col_counts(layout, z, N, K))


def dir_dir_sweep(state, layout, uniforms, hyper):
    """One sweep of eqs. 59–61: joint x = z = c when v = 1; z | c then c | z when v = 0."""
    K = state.L.shape[1]
    g, e = hyper.row, hyper.column

    def block(counts, x):
        L, Q = counts
        rows, cols, v, obs, u_z, u_c, z_old, c_old = x
        hot_z, hot_c = _one_hot(z_old, K), _one_hot(c_old, K)
        L_rest = L[rows] - hot_z
        Q_rest = Q[cols] - hot_c
        row_weight = g + L_rest  # eq. 57
        col_weight = e + Q_rest  # eq. 58
        one = v[:, None] == 1
        # v = 1: x = z = c jointly (eq. 59); v = 0: z given the current c (eq. 60) ...
        z_draw = categorical(jnp.where(one, row_weight * col_weight, row_weight * (1 - hot_c)), u_z)
        # ... then c given the new z (eq. 61).
        c_zero = categorical(col_weight * (1 - _one_hot(z_draw, K)), u_c)
        z_new = jnp.where(obs, z_draw, -1)
        c_new = jnp.where(obs, jnp.where(v == 1, z_draw, c_zero), -1)
        L = L.at[rows].set(L_rest + _one_hot(z_new, K), unique_indices=True)
        Q = Q.at[cols].set(Q_rest + _one_hot(c_new, K), unique_indices=True)
        return (L, Q), (z_new, c_new)

    (L, Q), (z, c) = jax.lax.scan(
        block, (state.L, state.Q),
        (layout.rows, layout.cols, layout.values, layout.observed, uniforms[0], uniforms[1],
         state.z, state.c))
    return DirDirState(z, c, L, Q)


def dir_dir_log_joint(state, hyper):
    """log p(V, Z, C) on the constraint set (Lumbreras et al. 2020 eqs. 53–56)."""
    return _dirichlet_rows_log_marginal(state.L, hyper.row) + _dirichlet_rows_log_marginal(state.Q, hyper.column)


def dir_dir_means(state, hyper):
    """E[W | Z] and E[H | C] (eqs. 62–63)."""
    L = state.L.astype(jnp.float32) + hyper.row
    Q = state.Q.astype(jnp.float32) + hyper.column
    return L / L.sum(-1, keepdims=True), (Q / Q.sum(-1, keepdims=True)).T


class Sampler(NamedTuple):
    """The functions of one collapsed sampler.

    A state holds ``n_labels`` label arrays (one uniform each per entry and sweep) followed by
    its count arrays, which are saved at every stored draw.
    """

    init: object
    sweep: object
    log_joint: object
    means: object
    n_labels: int
    from_labels: object  # (z, layout, F, N, K) -> state


SAMPLERS = {
    "beta-dir": Sampler(beta_dir_init, beta_dir_sweep, beta_dir_log_joint, beta_dir_means, 1,
                        beta_dir_state),
    "dir-dir": Sampler(dir_dir_init, dir_dir_sweep, dir_dir_log_joint, dir_dir_means, 2,
                       dir_dir_state),
}


# -- the start: the authors' warm start from bICA --------------------------------------------------

INITS = ("bica", "random")
BICA_INIT_COMPONENTS = 10
BICA_INIT_ITERS = 100


def bica_labels(key, layout, F, N, hyper, *, num_components=BICA_INIT_COMPONENTS,
                num_iters=BICA_INIT_ITERS):
    """Labels from a short uncollapsed VB (bICA) fit with few components, as the authors' code starts.

    The authors' sampler (R/Rcpp, github.com/alumbreras/NBMF, ``BernoulliNMF``) does not start
    from the uniform labels the paper's text describes: it runs ``num_iters`` = 100 iterations of
    bICA with ``num_components`` = 10 components (random one-hot start, the same α, β and γ_k)
    and sets z_fn = argmax_k q(z_fn = k). Only those components hold labels at the start; the
    other K − 10 stay empty until the sampler opens them (each keeps weight γ_k).

    Uniform labels over K = 100 components put ~1 % of every row and column in each component:
    the collapsed sampler then spends hundreds of sweeps merging them (the log joint still rises
    after 2000 sweeps on lastfm), while from this start it begins near a good mode.
    """

    K0 = min(num_components, hyper.row.shape[0])
    small = Hyper(hyper.row[:K0], hyper.alpha[:K0], hyper.beta[:K0], hyper.column[:K0])
    values = jnp.zeros((F, N), jnp.float32).at[layout.rows, layout.cols].set(layout.values)
    observed = jnp.zeros((F, N), bool).at[layout.rows, layout.cols].set(layout.observed)
    state = vb_init(key, values, observed, small)
    state = jax.lax.fori_loop(0, num_iters, lambda _, s: VBState(*vb_sweep(s, values, observed, small)[0]),
                              state)
    # q(z_fn = k) ∝ exp{E log w_fk + E log p(v_fn | h_kn)}: its argmax, entry by entry.
    log_w = digamma(state.row) - digamma(state.row.sum(-1, keepdims=True))  # (F, K0)
    total = digamma(state.ones + state.zeros)
    log_h1, log_h0 = (digamma(state.ones) - total).T, (digamma(state.zeros) - total).T  # (N, K0)
    score = log_w[layout.rows] + jnp.where(layout.values[..., None] == 1, log_h1[layout.cols],
                                           log_h0[layout.cols])
    return jnp.where(layout.observed, jnp.argmax(score, -1).astype(jnp.int32), -1)


def default_init(kind):
    """bICA start for Beta-Dir (and Dir-Beta); uniform labels for Dir-Dir.

    Dir-Dir keeps the start its Catalan parliament check was calibrated with (random z, c = z).
    """
    return "bica" if kind == "beta-dir" else "random"


def check_init(init):
    if init is not None and init not in INITS:
        raise ValueError(f"init must be one of {INITS} or None (the default for the prior), got {init!r}")
    return init


def initial_state(key, layout, hyper, *, kind, F, N, K, init):
    sampler = SAMPLERS[kind]
    if init == "random":
        return sampler.init(key, layout, F, N, K)
    return sampler.from_labels(bica_labels(key, layout, F, N, hyper), layout, F, N, K)


def conjugate_draws(rng: np.random.Generator, kind: str, hyper: Hyper, counts) -> tuple:
    """W and H drawn from their conditionals given saved counts (eqs. 26–27, 62–63).

    ``counts`` are the state's count arrays with leading (chain, draw) axes: (L, A, B) for
    Beta-Dir, (L, Q) for Dir-Dir. The draws are made with NumPy after the run: XLA's Gamma
    sampler is slow to compile and to run on CPU, and these draws do not feed back into the chain.
    """
    to_np = lambda x: np.asarray(x, dtype=np.float64)
    W = dirichlet_rows(rng, to_np(hyper.row) + counts[0])
    if kind == "beta-dir":
        H = rng.beta(to_np(hyper.alpha) + counts[1], to_np(hyper.beta) + counts[2])
    else:
        H = dirichlet_rows(rng, to_np(hyper.column) + counts[1])
    return W.astype(np.float32), np.swapaxes(H, -1, -2).astype(np.float32)


# -- the chain driver -----------------------------------------------------------------------------

class GibbsChain(NamedTuple):
    """Everything one chain carries across sweeps."""

    state: NamedTuple
    mean_sum: jnp.ndarray  # (F, N) Σ_kept E[W|Z] E[H|Z]
    counts: tuple  # the state's counts at each stored draw, (num_draws, ...) each
    draw_active: jnp.ndarray  # (num_draws,) active components at each draw
    log_joint: jnp.ndarray  # (num_sweeps,)
    active: jnp.ndarray  # (num_sweeps,)
    assignments: tuple  # (num_draws, D, m) labels per draw, or () when not kept


def _active(L, threshold):
    mass = L.sum(0).astype(jnp.float32)
    return jnp.sum(mass > threshold * mass.sum()).astype(jnp.int32)


def init_chain(key, layout, hyper, *, kind, F, N, K, num_sweeps, num_draws, keep_assignments,
               init="bica"):
    sampler = SAMPLERS[kind]
    state = initial_state(key, layout, hyper, kind=kind, F=F, N=N, K=K, init=init)
    n_labels = sampler.n_labels if keep_assignments else 0
    labels = tuple(jnp.zeros((num_draws,) + layout.values.shape, jnp.int32) for _ in range(n_labels))
    counts = tuple(jnp.zeros((num_draws,) + c.shape, c.dtype) for c in state[sampler.n_labels:])
    return GibbsChain(state, jnp.zeros((F, N), jnp.float32), counts, jnp.zeros(num_draws, jnp.int32),
                      jnp.zeros(num_sweeps, jnp.float32), jnp.zeros(num_sweeps, jnp.int32), labels)


def run_sweeps(chain, key, start, stop, layout, hyper, *, kind, num_warmup, thinning, threshold):
    """Sweeps ``start .. stop-1`` of one chain (sweep i uses ``fold_in(key, i)``)."""
    sampler = SAMPLERS[kind]

    def body(i, chain):
        uniforms = jax.random.uniform(jax.random.fold_in(key, i), (sampler.n_labels,) + layout.values.shape)
        state = sampler.sweep(chain.state, layout, uniforms, hyper)
        chain = chain._replace(state=state,
                               log_joint=chain.log_joint.at[i].set(sampler.log_joint(state, hyper)),
                               active=chain.active.at[i].set(_active(state.L, threshold)))
        kept = i - num_warmup

        def accumulate(chain):
            W_mean, H_mean = sampler.means(state, hyper)
            return chain._replace(mean_sum=chain.mean_sum + W_mean @ H_mean)

        def store(chain):
            j = kept // thinning
            labels = tuple(saved.at[j].set(current) for saved, current in zip(chain.assignments, state))
            counts = tuple(saved.at[j].set(current)
                           for saved, current in zip(chain.counts, state[sampler.n_labels:]))
            return chain._replace(counts=counts, assignments=labels,
                                  draw_active=chain.draw_active.at[j].set(_active(state.L, threshold)))

        chain = jax.lax.cond(kept >= 0, accumulate, lambda c: c, chain)
        return jax.lax.cond((kept >= 0) & ((kept + 1) % thinning == 0), store, lambda c: c, chain)

    return jax.lax.fori_loop(start, stop, body, chain)


@functools.partial(jax.jit, static_argnames=("kind", "F", "N", "K", "num_sweeps", "num_draws",
                                             "keep_assignments", "init"))
def _init_chains(keys, layout, hyper, *, kind, F, N, K, num_sweeps, num_draws, keep_assignments,
                 init="bica"):
    fn = functools.partial(init_chain, kind=kind, F=F, N=N, K=K, num_sweeps=num_sweeps,
                           num_draws=num_draws, keep_assignments=keep_assignments, init=init)
    return jax.vmap(fn, in_axes=(0, None, None))(keys, layout, hyper)


@functools.partial(jax.jit, static_argnames=("kind", "num_warmup", "thinning", "threshold"))
def _run_chains(chains, keys, start, stop, layout, hyper, *, kind, num_warmup, thinning, threshold):
    fn = functools.partial(run_sweeps, kind=kind, num_warmup=num_warmup, thinning=thinning,
                           threshold=threshold)
    return jax.vmap(fn, in_axes=(0, 0, None, None, None, None))(chains, keys, start, stop, layout, hyper)


class GibbsResult(NamedTuple):
    """NumPy outputs of :func:`sample`, in the core's orientation (rows = the Dirichlet side)."""

    W: np.ndarray  # (chains, draws, F, K)
    H: np.ndarray  # (chains, draws, K, N)
    mean: np.ndarray  # (chains, F, N) Rao-Blackwellised E[WH | V]
    draw_active: np.ndarray  # (chains, draws)
    log_joint: np.ndarray  # (chains, sweeps)
    active: np.ndarray  # (chains, sweeps)
    assignments: tuple  # (chains, draws, F, N) labels per kept draw (z, and c for Dir-Dir)


def sample(rng_key, values, observed, hyper: Hyper, *, kind="beta-dir", num_warmup=4000,
           num_samples=1000, num_chains=1, thinning=1, threshold=ACTIVE_THRESHOLD,
           progress_bar=False, keep_assignments=False, init=None, first_chain=0) -> GibbsResult:
    """Run collapsed Gibbs chains ``first_chain .. first_chain + num_chains - 1`` (vectorised) on a
    validated binary matrix; chain c splits ``fold_in(rng_key, c)`` into its init, sweep and
    draw keys (:func:`bam_ppl.parallel.chain_keys`), so it draws what it draws run alone.

    ``init``: ``"bica"`` (:func:`bica_labels`, the default for Beta-Dir) or ``"random"``
    (uniform labels; the default for Dir-Dir, see :func:`dir_dir_init`). Sweeps run in jitted
    chunks (:func:`run_in_chunks`) so a progress bar can follow them.
    """
    init = default_init(kind) if init is None else init
    F, N = values.shape
    K = hyper.row.shape[0]
    layout = DiagonalLayout(*(jnp.asarray(a) for a in diagonal_layout(values, observed)))
    num_sweeps = num_warmup + num_samples
    num_draws = num_samples // thinning
    init_keys, keys, draw_keys = chain_keys(rng_key, num_chains, first_chain, parts=3)
    chains = _init_chains(init_keys, layout, hyper, kind=kind, F=F, N=N,
                          K=K, num_sweeps=num_sweeps, num_draws=num_draws,
                          keep_assignments=keep_assignments, init=init)
    advance = lambda chains, start, stop: _run_chains(
        chains, keys, start, stop, layout, hyper, kind=kind, num_warmup=num_warmup,
        thinning=thinning, threshold=float(threshold))
    chains = run_in_chunks(advance, chains, num_sweeps, progress_bar, f"gibbs {kind}", "sweep")
    layout_np = diagonal_layout(values, observed)
    assignments = tuple(to_matrix(layout_np, np.asarray(a), (F, N)) for a in chains.assignments)
    counts = tuple(np.asarray(c) for c in chains.counts)
    draws = [conjugate_draws(numpy_generator(key), kind, hyper, tuple(n[c:c + 1] for n in counts))
             for c, key in enumerate(draw_keys)]
    W, H = (np.concatenate(parts) for parts in zip(*draws))
    return GibbsResult(W, H,
                       np.asarray(chains.mean_sum, dtype=np.float64) / num_samples,
                       np.asarray(chains.draw_active), np.asarray(chains.log_joint),
                       np.asarray(chains.active), assignments)


@register("gibbs", models=(NBMF,))
def gibbs(model: NBMF, data, *, rng_key=0, mask=None, num_warmup: int = 4000, num_samples: int = 1000,
          num_chains: int = 4, thinning: int | None = None, active_threshold: float = ACTIVE_THRESHOLD,
          progress_bar: bool | None = None, init: str | None = None, _first_chain: int = 0):
    """Collapsed Gibbs for NBMF (Beta-Dir and Dir-Beta: Alg. 1; Dir-Dir: Alg. 2 of Lumbreras et al. 2020).

    Parameters
    ----------
    model : NBMF
    data : array (F, N) of 0/1 with NaN for missing entries, or a BinaryMatrix
    rng_key : int or JAX key
    mask : array of bool (F, N), optional
        ``True`` = observed (NumPyro's convention); hidden entries get no label at all.
    num_warmup, num_samples : int
        Burn-in sweeps and kept sweeps (paper: 4000 and 1000, §6.2). Every kept sweep enters
        E[WH | V] (``model.expected_mean``).
    num_chains : int
        Independent chains, run vectorised (4, as every MCMC backend: R-hat needs several; the
        paper ran one). Chain c draws from ``fold_in(rng_key, c)`` alone, so
        ``bam.infer(..., executor=...)`` runs it as a task of its own (``_first_chain=c``).
    thinning : int, optional
        Posterior draws of W and H are stored every ``thinning`` kept sweeps (default 1: all
        ``num_samples`` of them, as every backend returns ``num_samples`` draws); every kept sweep
        enters E[WH | V] whatever the thinning. Draws above ``MAX_STORED_BYTES`` (2 GiB) need a
        larger thinning.
    active_threshold : float
        A component is active when it holds more than this fraction of the assignments z.
    progress_bar : bool or None
        tqdm bar over sweeps; ``None`` reports long runs (:mod:`bam_ppl.progress`).
    init : {"bica", "random"}, optional
        Starting labels. ``"bica"`` (default for Beta-Dir and Dir-Beta): the authors' code's
        start, 100 iterations of bICA (``method="vb"``) with 10 components, then each entry's most
        probable component (:func:`bica_labels`). ``"random"`` (default for Dir-Dir): uniform
        labels over the K components, as the paper's text says (§6.2); with K = 100 on a large
        matrix the chain then needs thousands of sweeps to merge the components (lastfm,
        25 % held out: held-out log-likelihood −0.1757 per entry after 450 + 50 sweeps against
        −0.1603 from the bICA start; benchmarks/README.md).

    Returns
    -------
    InferenceData
        posterior ``W`` (chain, draw, row, component), ``H`` (chain, draw, component, col);
        group ``expectations``: ``WH`` (chain, row, col) = E[WH | V] per chain; sample_stats
        ``n_active`` (chain, draw), traces ``log_joint`` (log p(V, Z), eqs. 22–24 / 53–56) and
        ``n_active_trace`` over all sweeps (chain, iteration).
    """
    num_warmup = check_int(num_warmup, "num_warmup", minimum=0)
    num_samples = check_int(num_samples, "num_samples", minimum=1)
    num_chains = check_int(num_chains, "num_chains", minimum=1)
    first_chain = check_int(_first_chain, "_first_chain", minimum=0)
    thinning = 1 if thinning is None else check_int(thinning, "thinning")
    if thinning > num_samples:
        raise ValueError(f"thinning must be <= num_samples ({num_samples}), got {thinning}")
    check_positive(active_threshold, "active_threshold", upper=1.0)
    check_init(init)
    binary = check_data(model, data, mask)
    stored = num_chains * (num_samples // thinning) * sum(binary.values.shape) * model.n_components * 8
    if stored > MAX_STORED_BYTES:
        raise ValueError(
            f"num_samples={num_samples} draws of W and H would take {stored / 2**30:.1f} GiB; keep "
            f"fewer with thinning= (every sweep still enters E[WH | V]), e.g. "
            f"thinning={int(np.ceil(stored / MAX_STORED_BYTES))}")
    kind, core_values, core_observed, hyper, transposed = core_problem(model, binary.values, binary.observed)
    init = default_init(kind) if init is None else init
    result = sample(rng_key, core_values, core_observed, hyper, kind=kind, num_warmup=num_warmup,
                    num_samples=num_samples, num_chains=num_chains, thinning=thinning,
                    threshold=active_threshold, progress_bar=progress_bar, init=init, first_chain=first_chain)
    stats = {"n_active": (("chain", "draw"), result.draw_active),
             "log_joint": (("chain", "iteration"), result.log_joint),
             "n_active_trace": (("chain", "iteration"), result.active)}
    return nbmf_inference_data(
        model, binary, W=result.W, H=result.H, mean=result.mean,
        sample_stats=stats, method="gibbs", transposed=transposed,
        attrs=dict(num_warmup=num_warmup, num_samples=num_samples, thinning=thinning,
                   active_threshold=active_threshold, init=init))
