"""Dirichlet Tucker decomposition of a count tensor with fixed face totals (Zhang & Linderman).

A tensor X of shape M × N × P × S (mouse × epoch × position × syllable in Zhang & Linderman) whose
(m, n) faces all hold C counts is modelled as (eq. 2)

    vec(X_mn) ~ Mult(C, Σ_ijkl g_ijkl ψ_mi φ_nj vec(θ_k λ_lᵀ)),

with mouse loadings ψ_m ∈ Δ_{K_M}, epoch loadings φ_n ∈ Δ_{K_N}, position factors θ_k ∈ Δ_P,
syllable factors λ_l ∈ Δ_S and a core whose faces vec(G_ij) ∈ Δ_{K_P K_S} (eq. 1), each with a
symmetric Dirichlet prior (§1). The 3-way variant (M × N × P) drops s, λ and l.

As an allocation model the tensor is the DAG

    m -> i;  n -> j;  (i, j) -> k;  (i, j, k) -> l;  k -> p;  l -> s

with the totals of (m, n) conditioned. The core is written with two latent nodes rather than one
node q = (k, l) with children p and s: a single q would give p and s tables indexed by the pair
(k, l), i.e. K_P K_S position factors instead of K_P, which is a different (larger) model. With
two nodes, p(k, l | i, j) = p(k | i, j) p(l | i, j, k) is any distribution on the K_P × K_S grid,
exactly G_ij, and θ_{p|k}, λ_{s|l} are the paper's factors. The Dirichlet prior carries over
exactly: vec(G_ij) ~ Dir(α_g 1_{K_P K_S}) is equivalent (aggregation and neutrality of the
Dirichlet) to independent Σ_l g_ijkl ~ Dir(K_S α_g 1_{K_P}) and g_ijk· / Σ_l g_ijkl ~ Dir(α_g 1_{K_S}),
so the node priors are k: K_S α_g and l: α_g. The evidence of this allocation model is therefore
the evidence of the paper's model, and every generic backend (exact enumeration, SMC, VB) runs
on it. Point estimates, in contrast, depend on the parameterisation: the MAP-EM backend
(``method="map"``) works in the paper's (ψ, φ, θ, λ, G).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ..types import KeyLike, numpy_generator
from .allocation import AllocationModel

PARAMETERS = ("psi", "phi", "theta", "lambda", "core")


class DirichletTuckerParams(NamedTuple):
    """Parameters of a Dirichlet Tucker decomposition (Zhang & Linderman §1).

    Attributes
    ----------
    psi : array (M, K_M)
        Mouse loadings ψ_m (rows on the simplex).
    phi : array (N, K_N)
        Epoch loadings φ_n.
    theta : array (K_P, P)
        Position factors θ_k (rows on the simplex).
    lam : array (K_S, S) or None
        Syllable factors λ_l; None for the 3-way variant.
    core : array (K_M, K_N, K_P, K_S), or (K_M, K_N, K_P) for the 3-way variant
        Core tensor G; each face G_ij sums to one (eq. 1).
    """

    psi: np.ndarray
    phi: np.ndarray
    theta: np.ndarray
    lam: np.ndarray | None
    core: np.ndarray

    def as_four_way(self) -> DirichletTuckerParams:
        """The same parameters with the 3-way variant written as S = K_S = 1."""
        if self.lam is not None:
            return self
        return DirichletTuckerParams(self.psi, self.phi, self.theta, np.ones((1, 1)), self.core[..., None])

    def face_probabilities(self) -> np.ndarray:
        """Multinomial cell probabilities of every face, shape (M, N, P, S) or (M, N, P) (eq. 2)."""
        four = self.as_four_way()
        probs = np.einsum("mi,nj,ijkl,kp,ls->mnps", four.psi, four.phi, four.core, four.theta, four.lam,
                          optimize=True)
        return probs if self.lam is not None else probs[..., 0]

    def reconstruct(self, total) -> np.ndarray:
        """E[X] = C · G ×₁ Ψ ×₂ Φ ×₃ Θ ×₄ Λ (Zhang & Linderman §1.1); ``total`` is C or an (M, N) array."""
        probs = self.face_probabilities()
        total = np.asarray(total, dtype=np.float64)
        return probs * total.reshape(total.shape + (1,) * (probs.ndim - total.ndim))

    @classmethod
    def from_inference_data(cls, idata, draw: int = 0, chain: int = 0) -> DirichletTuckerParams:
        """Read the point estimates ``psi, phi, theta, lambda, core`` of a fitted result."""
        from ..convert.read import group

        post = group(idata, "posterior")
        missing = [n for n in ("psi", "phi", "theta", "core") if n not in post]
        if missing:
            raise ValueError(f"idata has no posterior variable(s) {missing}; fit with method='map' or 'sem'")

        def pick(name):
            return np.asarray(post[name].values[chain, draw])

        lam = pick("lambda") if "lambda" in post else None
        return cls(pick("psi"), pick("phi"), pick("theta"), lam, pick("core"))


def _check_ranks(ranks) -> tuple[int, ...]:
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__len__"):
        raise TypeError(f"ranks must be a tuple (K_M, K_N, K_P, K_S) or (K_M, K_N, K_P), got {ranks!r}")
    ranks = tuple(ranks)
    if len(ranks) not in (3, 4):
        raise ValueError(
            f"ranks must have 4 entries (K_M, K_N, K_P, K_S) or 3 (K_M, K_N, K_P), got {len(ranks)}"
        )
    for name, k in zip(("K_M", "K_N", "K_P", "K_S"), ranks):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"ranks: {name} must be an int, got {type(k).__name__}")
        if k < 1:
            raise ValueError(f"ranks: {name} must be at least 1, got {k}")
    return tuple(int(k) for k in ranks)


def _check_alpha(alpha, order: int) -> dict[str, float]:
    names = PARAMETERS if order == 4 else tuple(n for n in PARAMETERS if n != "lambda")
    if isinstance(alpha, Mapping):
        unknown = sorted(set(alpha) - set(names))
        if unknown:
            raise ValueError(f"alpha: unknown parameter(s) {unknown}; expected keys among {list(names)}")
        values = {n: alpha.get(n, 1.1) for n in names}
    else:
        values = {n: alpha for n in names}
    out = {}
    for n, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"alpha[{n!r}] must be a positive number, got {type(v).__name__}")
        if not np.isfinite(v) or v <= 0:
            raise ValueError(f"alpha[{n!r}] must be a positive finite number, got {v}")
        out[n] = float(v)
    return out


class DirichletTuckerModel(AllocationModel):
    """Dirichlet Tucker decomposition (Zhang & Linderman) as an allocation model.

    Parameters
    ----------
    ranks : tuple of int
        (K_M, K_N, K_P, K_S) for an M × N × P × S tensor, or (K_M, K_N, K_P) for the 3-way
        variant on M × N × P.
    alpha : float or dict
        Symmetric Dirichlet concentration of every parameter (Zhang & Linderman uses 1.1), or a dict with
        keys among ``psi, phi, theta, lambda, core`` (missing keys take 1.1). MAP estimation
        (``method="map"``/``"sem"``) needs every value > 1; the evidence and sampling accept any
        positive value.

    Notes
    -----
    The DAG and the mapping of the core prior onto the two latent nodes k, l are explained in the
    module docstring; :meth:`sample` draws in the paper's parameterisation.
    """

    default_method = "map"

    def __init__(self, ranks, alpha=1.1):
        ranks = _check_ranks(ranks)
        self.ranks = ranks
        self.order = len(ranks)
        self.alpha = _check_alpha(alpha, self.order)
        a = self.alpha
        if self.order == 4:
            structure = "m -> i; n -> j; (i, j) -> k; (i, j, k) -> l; k -> p; l -> s"
            latent = dict(i=ranks[0], j=ranks[1], k=ranks[2], l=ranks[3])
            observed = ("m", "n", "p", "s")
            # Aggregation property: the k-marginal of vec(G_ij) ~ Dir(α_g) is Dir(K_S α_g).
            priors = dict(i=a["psi"], j=a["phi"], k=a["core"] * ranks[3], l=a["core"], p=a["theta"],
                          s=a["lambda"])
        else:
            structure = "m -> i; n -> j; (i, j) -> k; k -> p"
            latent = dict(i=ranks[0], j=ranks[1], k=ranks[2])
            observed = ("m", "n", "p")
            priors = dict(i=a["psi"], j=a["phi"], k=a["core"], p=a["theta"])
        super().__init__(structure, latent=latent, observed=observed, priors=priors,
                         condition_on=("m", "n"))

    # -- parameters ----------------------------------------------------------------------------
    def check_map_alpha(self) -> None:
        """Raise unless every concentration exceeds one (the MAP of Zhang & Linderman §2 needs α > 1)."""
        low = {n: v for n, v in self.alpha.items() if v <= 1.0}
        if low:
            raise ValueError(
                f"alpha must exceed 1 for MAP estimation, got {low}: with α ≤ 1 the Dirichlet density "
                "is unbounded or flat at the simplex boundary, so the posterior mode need not exist "
                "and the M-step (α − 1 + expected counts) can leave the simplex (Zhang & Linderman §2.2). "
                "Use alpha > 1 (the paper uses 1.1), or an evidence/sampling method"
            )

    def params_from_tables(self, tables: Mapping[str, np.ndarray]) -> DirichletTuckerParams:
        """Paper parameters from allocation-model tables ``{i, j, k, l, p, s}`` (table layout)."""
        core = np.asarray(tables["k"])
        if self.order == 4:
            core = core[..., None] * np.asarray(tables["l"])
            return DirichletTuckerParams(np.asarray(tables["i"]), np.asarray(tables["j"]),
                                         np.asarray(tables["p"]), np.asarray(tables["s"]), core)
        return DirichletTuckerParams(np.asarray(tables["i"]), np.asarray(tables["j"]),
                                     np.asarray(tables["p"]), None, core)

    def tables_from_params(self, params: DirichletTuckerParams) -> dict[str, np.ndarray]:
        """Allocation-model tables (θ_{i|m}, θ_{j|n}, θ_{k|ij}, θ_{l|ijk}, θ_{p|k}, θ_{s|l})."""
        core = np.asarray(params.core, dtype=np.float64)
        if self.order == 4:
            marginal = core.sum(-1)
            conditional = core / np.where(marginal > 0, marginal, 1.0)[..., None]
            return dict(i=params.psi, j=params.phi, k=marginal, l=conditional, p=params.theta, s=params.lam)
        return dict(i=params.psi, j=params.phi, k=core, p=params.theta)

    # -- generative draws -----------------------------------------------------------------------
    def sample(self, rng_key: KeyLike, shape=None, total=None):
        """Draw parameters from the prior and a tensor whose every (m, n) face sums to ``total``.

        Parameters
        ----------
        rng_key : int or JAX key
        shape : tuple of int
            (M, N, P, S), or (M, N, P) for the 3-way variant.
        total : int or array (M, N)
            C, the number of counts of every face (or one per face).

        Returns
        -------
        params : DirichletTuckerParams
            ψ, φ, θ, λ, G drawn from their Dirichlet priors (Zhang & Linderman §1).
        X : np.ndarray of int64, shape ``shape``
            vec(X_mn) ~ Mult(C, ·) as in eq. 2.

        Unlike :meth:`AllocationModel.sample` this never builds the allocation tensor (8 axes).
        """
        # NumPy's samplers, seeded from the key: the same key gives the same draw, and no
        # Gamma/multinomial kernels are compiled for a one-off host-side draw.
        rng = numpy_generator(rng_key)
        if shape is None:
            raise ValueError(f"shape is required: the sizes {self.observed} of the tensor")
        shape = tuple(self.visible_sizes(shape).values())
        if total is None:
            raise ValueError("total is required: the number of counts C of every (m, n) face")
        M, N = shape[:2]
        counts = np.asarray(total)
        if counts.dtype.kind not in "iuf":
            raise TypeError(f"total must be an int or an (M, N) array of ints, got dtype {counts.dtype}")
        if counts.ndim not in (0, 2) or (counts.ndim == 2 and counts.shape != (M, N)):
            raise ValueError(f"total must be an int or an array of shape {(M, N)}, got shape {counts.shape}")
        if (counts < 0).any() or (counts != np.round(counts)).any():
            raise ValueError("total must hold nonnegative integers (counts per (m, n) face)")
        counts = np.broadcast_to(counts.astype(np.int64), (M, N))
        ranks = self.ranks if self.order == 4 else (*self.ranks, 1)
        sizes = shape if self.order == 4 else (*shape, 1)
        a = self.alpha

        def dirichlet(conc, size, batch):
            return rng.dirichlet(np.full(size, conc), size=batch)

        psi = dirichlet(a["psi"], ranks[0], sizes[0])
        phi = dirichlet(a["phi"], ranks[1], sizes[1])
        theta = dirichlet(a["theta"], sizes[2], ranks[2])
        lam = dirichlet(a["lambda"], sizes[3], ranks[3]) if self.order == 4 else np.ones((1, 1))
        core = dirichlet(a["core"], ranks[2] * ranks[3], (ranks[0], ranks[1])).reshape(ranks)
        params = DirichletTuckerParams(psi, phi, theta, lam, core)
        probs = params.face_probabilities().reshape(M, N, -1)
        # Guard against rounding: the multinomial needs probabilities summing to at most one.
        X = rng.multinomial(counts, probs / probs.sum(-1, keepdims=True))
        X = X.astype(np.int64).reshape(shape)
        if self.order == 3:
            params = DirichletTuckerParams(psi, phi, theta, None, core[..., 0])
        return params, X

    def __repr__(self) -> str:
        alphas = set(self.alpha.values())
        alpha = f"{alphas.pop():g}" if len(alphas) == 1 else str(self.alpha)
        return f"DirichletTuckerModel(ranks={self.ranks}, alpha={alpha})"


def dirichlet_tucker(ranks=None, alpha=1.1, *, K_M: int | None = None, K_N: int | None = None,
                     K_P: int | None = None, K_S: int | None = None) -> DirichletTuckerModel:
    """Dirichlet Tucker decomposition (Zhang & Linderman) of an M × N × P × S count tensor.

    Parameters
    ----------
    ranks : tuple of int, optional
        (K_M, K_N, K_P, K_S), or (K_M, K_N, K_P) for the 3-way variant on M × N × P tensors.
    alpha : float or dict
        Dirichlet concentration(s); see :class:`DirichletTuckerModel`.
    K_M, K_N, K_P, K_S : int, optional
        The ranks as keywords instead of ``ranks`` (convenient for :func:`bam_ppl.select_ranks`
        grids); leave K_S out for the 3-way variant.

    Examples
    --------
    >>> model = dirichlet_tucker((3, 2, 2, 3))
    >>> params, X = model.sample(0, shape=(30, 8, 10, 12), total=500)   # doctest: +SKIP
    >>> idata = bam_ppl.infer(model, X, method="map", rng_key=0)          # doctest: +SKIP
    """
    keywords = dict(K_M=K_M, K_N=K_N, K_P=K_P, K_S=K_S)
    given = {k: v for k, v in keywords.items() if v is not None}
    if ranks is not None and given:
        raise ValueError(f"pass either ranks or the keywords {sorted(given)}, not both")
    if ranks is None:
        needed = ["K_M", "K_N", "K_P"]
        missing = [k for k in needed if k not in given]
        if missing:
            raise ValueError(f"dirichlet_tucker needs ranks=(K_M, K_N, K_P[, K_S]) or keywords; missing {missing}")
        ranks = tuple(given[k] for k in ("K_M", "K_N", "K_P", "K_S") if k in given)
    return DirichletTuckerModel(ranks, alpha=alpha)
