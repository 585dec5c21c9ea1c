"""Bayesian mean-parameterized nonnegative binary matrix factorization (Lumbreras et al. 2020).

A binary matrix V (F × N, entries 0/1, missing entries allowed) is modelled as
``v_fn ~ Bernoulli([WH]_fn)`` with no link function (Lumbreras et al. 2020 §3.1), so E[V | W, H] = WH.
Three prior families keep [WH]_fn in [0, 1]:

=============  ===========================================  ===========================
prior          W (F × K)                                    H (K × N)
=============  ===========================================  ===========================
``beta-dir``   rows w_f ~ Dirichlet(γ/K, …, γ/K)             h_kn ~ Beta(α, β)
``dir-beta``   w_fk ~ Beta(α, β)                             columns h_n ~ Dirichlet(η, …, η)
``dir-dir``    rows w_f ~ Dirichlet(γ/K, …, γ/K)             columns h_n ~ Dirichlet(η, …, η)
=============  ===========================================  ===========================

γ is the *total* concentration of the row Dirichlet (γ_k = γ/K: the paper's nonparametric
truncation with K = 100, §4.4); η is the concentration of each component (η_k = η, §6.2).
Dir-Beta is Beta-Dir on Vᵀ (§3.1), and every backend runs it that way.

This module also holds the evaluation helpers of Lumbreras et al. 2020 §6: random held-out masks, the
held-out perplexity (eq. 67) and the data-approximation negative log-likelihood (eq. 66).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from ..data import as_binary_matrix
from ..types import KeyLike, as_key
from ..validation import check_choice, check_int, check_positive

PRIORS = ("beta-dir", "dir-beta", "dir-dir")
ACTIVE_THRESHOLD = 0.01
"""Default mass threshold for an *active* component (Lumbreras et al. 2020 leaves "active" undefined).

A component is active when it holds more than this fraction of the observed entries'
assignments (Σ_f L_fk > threshold · #observed, with soft counts for CVB0/VB). With K = 100 and
γ_k = 1/K most of the 100 components keep a few stray assignments, so counting non-empty ones
says little; 1 % reproduces the paper's "9 active components" on the Catalan parliament.
"""
EXPECTATIONS_GROUP = "expectations"
PROBABILITY_FLOOR = 1e-12


class NBMF:
    """Mean-parameterized NBMF model (Lumbreras et al. 2020 §3).

    Parameters
    ----------
    n_components : int
        K, the number of components (the paper's nonparametric setting uses K = 100).
    prior : {"beta-dir", "dir-beta", "dir-dir"}
        Prior family (constraints c1, c2, c3 of §3.1).
    alpha, beta : float
        Beta(α, β) prior of the [0, 1]-constrained factor (α_k = α, β_k = β).
    gamma : float
        Total concentration of the Dirichlet prior on the rows of W: γ_k = γ / K.
    eta : float
        Concentration of each component in the Dirichlet prior on the columns of H: η_k = η.

    Notes
    -----
    Backends (``bam.infer(model, V, method=...)``, all accepting ``mask=`` with ``True`` =
    observed): ``"gibbs"`` (collapsed Gibbs, Beta-Dir Alg. 1 and Dir-Dir Alg. 2), ``"cvb"``
    (CVB0, Beta-Dir) and ``"vb"`` (uncollapsed mean-field VB, the bICA baseline, Beta-Dir).
    """

    default_method = "gibbs"

    def __init__(self, n_components: int, prior: str = "beta-dir", alpha: float = 1.0,
                 beta: float = 1.0, gamma: float = 1.0, eta: float = 1.0):
        self.n_components = check_int(n_components, "n_components", minimum=1)
        self.prior = check_choice(prior, "prior", PRIORS)
        self.alpha = check_positive(alpha, "alpha")
        self.beta = check_positive(beta, "beta")
        self.gamma = check_positive(gamma, "gamma")
        self.eta = check_positive(eta, "eta")

    def __repr__(self) -> str:
        return (f"NBMF(n_components={self.n_components}, prior={self.prior!r}, alpha={self.alpha}, "
                f"beta={self.beta}, gamma={self.gamma}, eta={self.eta})")

    @property
    def hyperparameters(self) -> dict:
        """The prior's settings, as recorded in InferenceData attrs."""
        return dict(prior=self.prior, n_components=self.n_components, alpha=self.alpha,
                    beta=self.beta, gamma=self.gamma, eta=self.eta)

    def row_concentration(self) -> np.ndarray:
        """γ_k = γ / K for each component (Dirichlet rows of W)."""
        return np.full(self.n_components, self.gamma / self.n_components)

    def column_concentration(self) -> np.ndarray:
        """η_k = η for each component (Dirichlet columns of H)."""
        return np.full(self.n_components, self.eta)

    def numpyro_model(self):
        """The uncollapsed program ``v_fn ~ Bernoulli([WH]_fn)`` (Lumbreras et al. 2020 eqs. 15–18, 45–48).

        Returns ``program(V=None, *, mask=None, shape=None)``: with ``V`` it conditions on the
        observed entries (NaN or ``mask == False`` entries are masked out of the likelihood);
        without it, ``shape=(F, N)`` draws a matrix. Sites: ``W`` (F × K); ``H`` (K × N) sampled
        directly for a Beta prior, else the deterministic transpose of ``H_columns`` (N × K, one
        Dirichlet per column). NUTS and SVI run on it like on any NumPyro model. The
        InferenceData of every NBMF backend stores ``H_columns`` beside ``H`` for the Dirichlet
        column priors, so ``Predictive(program, posterior_samples=...)`` built from its posterior
        conditions on the fitted H (a sample dict with ``H`` alone would leave ``H_columns`` to
        be drawn from the prior); :func:`bam_ppl.posterior_predictive` does this for you.
        """
        model = self

        def program(V=None, *, mask=None, shape=None):
            if V is not None:
                values, observed, _, _ = as_binary_matrix(V, mask)
                F, N = values.shape
            elif shape is None or len(shape) != 2:
                raise ValueError("program(V=None) needs shape=(F, N)")
            else:
                F, N = (check_int(s, "shape", minimum=1) for s in shape)
            K = model.n_components
            if model.prior == "dir-beta":
                W = numpyro.sample("W", dist.Beta(model.alpha, model.beta).expand([F, K]).to_event(2))
            else:
                with numpyro.plate("row", F):
                    W = numpyro.sample("W", dist.Dirichlet(jnp.asarray(model.row_concentration())))
            if model.prior == "beta-dir":
                H = numpyro.sample("H", dist.Beta(model.alpha, model.beta).expand([K, N]).to_event(2))
            else:
                with numpyro.plate("col", N):
                    H_columns = numpyro.sample(
                        "H_columns", dist.Dirichlet(jnp.asarray(model.column_concentration())))
                H = numpyro.deterministic("H", H_columns.T)
            # WH is a convex combination of values in [0, 1]; the floor only guards log(0).
            probs = jnp.clip(W @ H, PROBABILITY_FLOOR, 1.0 - PROBABILITY_FLOOR)
            if V is None:
                return numpyro.sample("V", dist.Bernoulli(probs=probs).to_event(2))
            likelihood = dist.Bernoulli(probs=probs).mask(jnp.asarray(observed)).to_event(2)
            numpyro.sample("V", likelihood, obs=jnp.asarray(values, dtype=jnp.float32))
            return None

        program.__name__ = "nbmf"
        program.__doc__ = f"NumPyro program of {self!r}"
        return program

    def expected_mean(self, idata, chain: int | None = None) -> np.ndarray:
        """E[WH | V] as an F × N array (Lumbreras et al. 2020 eqs. 32–33 and 39).

        Uses the backend's Rao-Blackwellised estimate when present (Gibbs: the average over kept
        sweeps of E[W | Z] E[H | Z]; CVB0/VB: E_q[W] E_q[H]); otherwise the average of W H over
        the posterior draws. ``chain`` selects one chain (or restart); by default chains are
        averaged. Dir-Dir chains can settle in different modes: compare them by their
        ``log_joint`` trace before averaging.
        """
        from ..convert.read import group

        try:
            expectations = group(idata, EXPECTATIONS_GROUP)
        except (AttributeError, KeyError):
            expectations = None
        select = (lambda x: x) if chain is None else (lambda x: x.isel(chain=[chain]))
        if expectations is not None and "WH" in expectations:
            return np.asarray(select(expectations["WH"]).mean("chain").values, dtype=np.float64)
        posterior = group(idata, "posterior")
        W = np.asarray(select(posterior["W"]).values, dtype=np.float64)
        H = np.asarray(select(posterior["H"]).values, dtype=np.float64)
        return np.einsum("cdfk,cdkn->fn", W, H) / (W.shape[0] * W.shape[1])


def nbmf(n_components: int, prior: str = "beta-dir", alpha: float = 1.0, beta: float = 1.0,
         gamma: float = 1.0, eta: float = 1.0) -> NBMF:
    """Mean-parameterized NBMF (Lumbreras et al. 2020); see :class:`NBMF`.

    Examples
    --------
    >>> import bam_ppl as bam
    >>> model = bam.models.nbmf(100, prior="beta-dir")          # nonparametric setting, §4.4
    >>> idata = bam.infer(model, V, method="cvb", num_iters=500)  # doctest: +SKIP
    >>> V_hat = model.expected_mean(idata)                        # doctest: +SKIP
    """
    return NBMF(n_components, prior=prior, alpha=alpha, beta=beta, gamma=gamma, eta=eta)


def random_heldout_mask(V, fraction: float = 0.25, rng_key: KeyLike = 0) -> np.ndarray:
    """Hold out each observed entry independently with probability ``fraction`` (Lumbreras et al. 2020 §6.4).

    Parameters
    ----------
    V : array of shape (F, N), or a shape tuple
        The data (NaN entries are never held out) or just its shape.
    fraction : float in (0, 1)
    rng_key : int or JAX key

    Returns
    -------
    ndarray of bool, shape (F, N)
        ``True`` for held-out (test) entries; train with ``mask=~heldout``.
    """
    import jax

    check_positive(fraction, "fraction", upper=1.0)
    if isinstance(V, tuple):
        shape = tuple(check_int(s, "shape", minimum=1) for s in V)
        observed = np.ones(shape, dtype=bool)
    else:
        _, observed, _, _ = as_binary_matrix(V)
    draw = np.asarray(jax.random.bernoulli(as_key(rng_key), fraction, observed.shape))
    return draw & observed


def _log_likelihood_terms(V, V_hat, selected):
    values, observed, _, _ = as_binary_matrix(V)
    V_hat = np.asarray(V_hat, dtype=np.float64)
    if V_hat.shape != values.shape:
        raise ValueError(f"V_hat must have the shape of V {values.shape}, got {V_hat.shape}")
    if np.isnan(V_hat[observed]).any() or (V_hat < 0).any() or (V_hat > 1).any():
        raise ValueError("V_hat must hold probabilities in [0, 1]")
    selected = observed if selected is None else observed & _bool_matrix(selected, values.shape)
    # A probability of exactly 0 or 1 (float32 rounding) would give an infinite loss.
    p = np.clip(V_hat[selected], PROBABILITY_FLOOR, 1.0 - PROBABILITY_FLOOR)
    v = values[selected]
    return v * np.log(p) + (1 - v) * np.log1p(-p)


def _bool_matrix(mask, shape):
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"masks must be boolean arrays, got dtype {mask.dtype}")
    if mask.shape != shape:
        raise ValueError(f"mask must have shape {shape}, got {mask.shape}")
    return mask


def heldout_perplexity(V, V_hat, heldout) -> float:
    """Mean negative log-likelihood per held-out entry, in nats (Lumbreras et al. 2020 eq. 67).

    ``-(1/T) Σ_{(f,n) held out} log Bernoulli(v_fn | v̂_fn)`` with T the number of held-out
    entries that are observed in ``V`` (entries already missing in V are not counted).
    """
    terms = _log_likelihood_terms(V, V_hat, heldout)
    if terms.size == 0:
        raise ValueError("heldout selects no observed entry of V")
    return float(-terms.mean())


def data_nll(V, V_hat, mask=None) -> float:
    """Data-approximation negative log-likelihood D(V | V̂) (Lumbreras et al. 2020 eq. 66).

    ``-Σ_fn [v log v̂ + (1 - v) log(1 - v̂)]`` over the observed entries of ``V`` (and those where
    ``mask`` is True), in nats.
    """
    return float(-_log_likelihood_terms(V, V_hat, mask).sum())
