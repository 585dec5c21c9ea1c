"""Named allocation models (Cemgil et al. 2019 §5, Fig. 7): one-liners over :class:`AllocationModel`."""

from __future__ import annotations

from ..validation import check_int
from .allocation import AllocationModel


def _names(order: int) -> list[str]:
    order = check_int(order, "order")
    return list("ijk")[:order] if order <= 3 else [f"i{n + 1}" for n in range(order)]


def nmf(rank: int, a: float = 1.0, b: float | None = None) -> AllocationModel:
    """KL-NMF X(i, j) ≈ Σ_k W(i, k) H(k, j): ``k -> i; k -> j`` (Example 3.1)."""
    return AllocationModel("k -> i; k -> j", latent={"k": rank}, observed=("i", "j"), a=a, b=b)


def lda(topics: int, a: float = 1.0, b: float | None = None) -> AllocationModel:
    """LDA on a document × word matrix: ``d -> k -> w`` with each document's length fixed (§3.5)."""
    return AllocationModel("d -> k -> w", latent={"k": topics}, observed=("d", "w"), a=a, b=b,
                           condition_on=("d",))


def cp(rank: int, order: int = 3, a: float = 1.0, b: float | None = None) -> AllocationModel:
    """CP/PARAFAC (naive Bayes / latent class) of an order-N tensor: ``r -> i; r -> j; r -> k``."""
    names = _names(order)
    return AllocationModel("; ".join(f"r -> {n}" for n in names), latent={"r": rank}, a=a, b=b)


def tucker(ranks, a: float = 1.0, b: float | None = None) -> AllocationModel:
    """Tucker with a joint core over latents r1..rN, visible i_n a child of r_n (Fig. 7f)."""
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise TypeError(f"ranks must be a tuple of ints, one per visible axis (e.g. (3, 2, 2)), got {ranks!r}")
    ranks = tuple(ranks)
    if not ranks:
        raise ValueError("ranks must name at least one rank, got ()")
    names = _names(len(ranks))
    latents = [f"r{n + 1}" for n in range(len(ranks))]
    # The core p(r1..rN) as a complete DAG over the latents, rN first (Cemgil et al. 2019 Fig. 7f).
    order = latents[::-1]
    core = [f"({', '.join(order[:k])}) -> {order[k]}" for k in range(1, len(order))]
    edges = core + [f"{r} -> {n}" for r, n in zip(latents, names)]
    if len(order) == 1:
        edges = [f"{latents[0]} -> {names[0]}"]
    return AllocationModel("; ".join(edges), latent=dict(zip(latents, ranks)), observed=names, a=a, b=b)


def symmetric_nmf(rank: int, a: float = 1.0, b: float | None = None) -> AllocationModel:
    """Symmetric NMF X ≈ W diag(λ) Wᵀ: ``r -> i; r -> j`` with θ_{i|r} ≡ θ_{j|r} (App. E)."""
    return AllocationModel("r -> i; r -> j", latent={"r": rank}, a=a, b=b, tie=[("i", "j")])


def complete_graph(order: int, a: float = 1.0, b: float | None = None) -> AllocationModel:
    """The complete DAG over N visible nodes (no latents): a Dirichlet-multinomial on the joint."""
    names = _names(order)
    if order == 1:
        return AllocationModel(names[0], a=a, b=b)
    edges = [f"({', '.join(names[:k])}) -> {names[k]}" for k in range(1, order)]
    return AllocationModel("; ".join(edges), a=a, b=b)


def independence(order: int, a: float = 1.0, b: float | None = None) -> AllocationModel:
    """N mutually independent visible nodes (no edges)."""
    return AllocationModel("; ".join(_names(order)), a=a, b=b)
