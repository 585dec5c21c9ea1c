"""Cell probabilities and pointwise log-likelihoods of posterior draws (LOO, WAIC, predictive checks).

Every sampling backend hands θ draws (and λ draws) to :mod:`bam_ppl.convert`, which calls
:func:`allocation_log_likelihood` to write the ``log_likelihood`` group that ``az.loo``,
``az.waic`` and ``az.compare`` read. One entry per observation, under the likelihood the model
uses (Cemgil et al. 2019 eq. 3.3–3.4):

* **Poisson cells** (no ``condition_on``, λ sampled): ``log Poisson(x_u | λ p(u))`` for every
  cell u, with p(u) = Σ over latent configurations of the product of θ tables. Zero cells are
  observations too (they contribute ``−λ p(u)``).
* **Multinomial** (``condition_on``, or a backend that does not sample λ such as PMF VB, whose
  likelihood is then the multinomial given T): the multinomial of each conditioned group g
  (a document, say) is split over its cells as
  ``x_u log p(u) − log x_u! + (x_u / n_g) log n_g!`` — the multinomial coefficient is apportioned
  to cells in proportion to their counts, so the entries of a group sum to its exact
  multinomial log-pmf, and a zero cell contributes exactly 0.
* **Bernoulli** (NBMF): ``log Bernoulli(v_fn | [WH]_fn)`` per observed entry
  (:func:`bernoulli_log_likelihood`).

The Poisson and multinomial forms differ by the Poisson term of the totals, so compare with
``az.compare`` only fits of the same form on the same data (as with ``bam.compare``, where
conditioned models have no Gamma–Poisson total term either).

**Dense or aggregated.** Up to :data:`DENSE_CELL_LIMIT` cells (and fully observed data) the
entries are the dense cells, ``log_likelihood["X"]`` with the dims of ``observed_data["X"]``.
Above it (or with missing entries) they are the nonzero cells in the order of the data's
``indices`` plus, for Poisson models, one last entry that aggregates every zero cell,
``−λ (1 − Σ_nonzero p(u))``: dims ``("chain", "draw", "X_cell")``. The aggregated form still sums
to the full log-likelihood, but LOO then treats "all empty cells" as a single observation.
When ``chain × draw × entries`` exceeds :data:`MAX_ELEMENTS` (or the work exceeds
:data:`MAX_WORK`) no group is written and ``attrs["log_likelihood"]`` says why;
:func:`allocation_log_likelihood` with larger limits (or on thinned draws) computes it anyway.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.special import gammaln

DENSE_CELL_LIMIT = 200_000
"""Largest number of cells for which the log-likelihood is written per dense cell."""
MAX_ELEMENTS = 20_000_000
"""Largest ``chain × draw × entries`` array written to the ``log_likelihood`` group."""
MAX_WORK = 1_000_000_000
"""Largest ``draws × cells × latent configurations × tables`` evaluated automatically."""
_CHUNK_ELEMENTS = 20_000_000


# -- allocation models --------------------------------------------------------------------------
def table_members(structure, condition_on: Sequence[str] = (),
                  tie: Sequence[Sequence[str]] = ()) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(table name, child, parents)`` of every node that owns a table, as in ``AllocationModel``."""
    from .dag import DAG

    dag = structure if isinstance(structure, DAG) else DAG(structure)
    tied = {n: tuple(g) for g in tie for n in g}
    out = []
    for n in dag.nodes:
        if n in condition_on:
            continue
        out.append(("_".join(tied.get(n, (n,))), n, tuple(dag.parents[n])))
    return out


def dense_cell_probabilities(members, theta: Mapping[str, np.ndarray], visible: Sequence[str],
                             shape: Sequence[int], batch_ndim: int = 2) -> np.ndarray:
    """p(cell) of every visible cell for a batch of θ draws, by one tensor contraction.

    ``theta[name]`` has shape ``(*batch, *parents, child)``; the result has shape
    ``(*batch, *shape)`` (``shape`` = sizes of ``visible``): Σ over the non-visible nodes of ∏ θ.
    Under ``condition_on`` the conditioned nodes have no table and p is the probability given
    the conditioned cell (constant along the conditioned axes).
    """
    first = np.asarray(next(iter(theta.values())))
    batch = first.shape[:batch_ndim]
    n = int(np.prod(batch, dtype=np.int64))
    letters = {}

    def letter(node):
        if node not in letters:
            letters[node] = _EINSUM_LETTERS[len(letters)]
        return letters[node]

    operands, subscripts = [], []
    for name, child, parents in members:
        arr = np.asarray(theta[name], dtype=np.float64)
        operands.append(arr.reshape(n, *arr.shape[batch_ndim:]))
        subscripts.append("Z" + "".join(letter(v) for v in (*parents, child)))
    present = [v for v in visible if v in letters]
    out_sub = "Z" + "".join(letters[v] for v in present)
    p = np.einsum(",".join(subscripts) + "->" + out_sub, *operands, optimize=True)
    expand = tuple(1 + k for k, v in enumerate(visible) if v not in letters)
    p = np.broadcast_to(np.expand_dims(p, expand), (n, *shape))
    return p.reshape(*batch, *shape)


_EINSUM_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXY"


def sparse_cell_probabilities(bound, flat_theta: np.ndarray, layout) -> np.ndarray:
    """p(cell) of the cells of ``layout`` for draws of the concatenated table vector ``(n, size)``."""
    flat_theta = np.asarray(flat_theta, dtype=np.float64)
    n = flat_theta.shape[0]
    U, L = layout.cell_flat.shape[1], layout.num_configs
    out = np.empty((n, U))
    step = max(1, _CHUNK_ELEMENTS // max(1, U * L))
    idx = layout.cell_flat[:, :, None] + layout.config_flat[:, None, :]
    for start in range(0, n, step):
        chunk = flat_theta[start:start + step]
        prod = np.ones((chunk.shape[0], U, L))
        for m in range(layout.num_members):
            prod *= chunk[:, idx[m]]
        if layout.valid is not None:
            prod *= layout.valid
        out[start:start + step] = prod.sum(-1)
    return out


def _group_index(indices: np.ndarray, positions: Sequence[int]) -> np.ndarray:
    if not positions:
        return np.zeros(len(indices), dtype=np.int64)
    _, inv = np.unique(indices[:, list(positions)], axis=0, return_inverse=True)
    return inv.reshape(-1)


def poisson_terms(x, rate_p):
    """log Poisson(x | rate_p), 0 where both are 0."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where(x > 0, x * np.log(rate_p), 0.0)
    return term - rate_p - gammaln(x + 1.0)


def multinomial_terms(x, p, n_group):
    """Per-cell share of log Multinomial(x | n_g, p): coefficient apportioned by counts."""
    x = np.asarray(x, dtype=np.float64)
    n_group = np.asarray(n_group, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where(x > 0, x * np.log(p), 0.0)
        share = np.where(n_group > 0, x / n_group, 0.0) * gammaln(n_group + 1.0)
    return term - gammaln(x + 1.0) + share


def allocation_log_likelihood(bound, data, theta: Mapping[str, np.ndarray], total_rate=None, *,
                              dense_limit: int | None = None, max_elements: int | None = None,
                              max_work: float | None = None):
    """Pointwise log-likelihood of ``data`` for every draw of θ (and λ), see the module docstring.

    ``theta[name]`` has shape ``(chain, draw, *table shape)`` for every table of ``bound``;
    ``total_rate`` is ``(chain, draw)`` or None (then the multinomial given T is used). Returns
    ``(variables, coords)`` for the ``log_likelihood`` group, ``{"X": (dims, array)}``. Raises
    ``ValueError`` when the array or the work exceeds the limits (default: the module's
    :data:`DENSE_CELL_LIMIT`, :data:`MAX_ELEMENTS`, :data:`MAX_WORK`, read at call time).
    """
    dense_limit = DENSE_CELL_LIMIT if dense_limit is None else dense_limit
    max_elements = MAX_ELEMENTS if max_elements is None else max_elements
    max_work = MAX_WORK if max_work is None else max_work
    first = np.asarray(theta[bound.tables[0].name])
    chains, draws = first.shape[:2]
    n = chains * draws
    poisson = total_rate is not None and bound.has_total_term
    dense_size = math.prod(data.shape)
    dense = not data.has_missing and dense_size <= dense_limit
    entries = dense_size if dense else data.nnz + int(poisson)
    if n * entries > max_elements:
        raise ValueError(
            f"a pointwise log-likelihood of {chains}×{draws} draws × {entries} entries exceeds "
            f"max_elements={max_elements}; thin the draws first")
    cond_pos = [bound.visible.index(c) for c in bound.conditioned]
    members = [(bound.tables[t].name, child, pars) for t, child, pars in bound.members]
    if dense:
        layout_cells = dense_size
        configs = math.prod(bound.sizes[v] for v in bound.nodes if v not in bound.visible)
    else:
        layout_cells, configs = data.nnz, None
    if configs is None:
        layout = bound.cell_layout(data)
        configs = layout.num_configs
    work = float(n) * layout_cells * configs * max(1, len(members))
    if work > max_work:
        raise ValueError(
            f"a pointwise log-likelihood needs about {work:.3g} operations (max_work={max_work:.3g}); "
            "thin the draws first")
    rate = None if not poisson else np.asarray(total_rate, dtype=np.float64).reshape(n)
    if dense:
        p = dense_cell_probabilities(members, {k: np.asarray(v) for k, v in theta.items()},
                                     bound.visible, data.shape).reshape(n, -1)
        x = data.to_dense().reshape(-1).astype(np.float64)
        if poisson:
            values = poisson_terms(x[None], rate[:, None] * p)
        else:
            idx = np.stack(np.unravel_index(np.arange(dense_size), data.shape), axis=1)
            group = _group_index(idx, cond_pos)
            n_group = np.bincount(group, weights=x)[group]
            values = multinomial_terms(x[None], p, n_group[None])
        return {"X": (("chain", "draw", *bound.visible), values.reshape(chains, draws, *data.shape))}, {}
    flat = np.concatenate([np.asarray(theta[t.name], dtype=np.float64).reshape(n, -1) for t in bound.tables],
                          axis=1)
    p = sparse_cell_probabilities(bound, flat, layout)
    x = np.asarray(data.counts, dtype=np.float64)
    if poisson:
        values = np.concatenate([poisson_terms(x[None], rate[:, None] * p),
                                 (-rate * (1.0 - p.sum(1)))[:, None]], axis=1)
    else:
        group = _group_index(data.indices, cond_pos)
        n_group = np.bincount(group, weights=x)[group]
        values = multinomial_terms(x[None], p, n_group[None])
    return {"X": (("chain", "draw", "X_cell"), values.reshape(chains, draws, -1))}, {}


def try_allocation_log_likelihood(bound, data, theta, total_rate=None):
    """``(variables, None)`` from :func:`allocation_log_likelihood`, or ``(None, reason)``.

    Writing the group is automatic, so a fit too large for it is not an error: the reason is
    recorded in ``attrs["log_likelihood"]`` instead (call :func:`allocation_log_likelihood` with
    larger limits, or on thinned draws, to compute it anyway).
    """
    if not bound.tables or not all(t.name in theta for t in bound.tables):
        return None, "not written: the backend returned draws of only some tables"
    try:
        return allocation_log_likelihood(bound, data, theta, total_rate)[0], None
    except ValueError as err:
        return None, f"not written: {err}"


# -- NBMF ---------------------------------------------------------------------------------------
def bernoulli_log_likelihood(W, H, values, observed, *, max_elements: int | None = None,
                             floor: float = 1e-12):
    """log Bernoulli(v_fn | [WH]_fn) per observed entry for draws ``W`` (c, d, F, K), ``H`` (c, d, K, N).

    Fully observed data give dims ``("chain", "draw", "row", "col")`` (those of
    ``observed_data["V"]``); with missing entries only the observed ones are kept, in row-major
    order, along ``"observed_entry"``.
    """
    max_elements = MAX_ELEMENTS if max_elements is None else max_elements
    W = np.asarray(W, dtype=np.float64)
    H = np.asarray(H, dtype=np.float64)
    c, d, F, _ = W.shape
    N = H.shape[-1]
    if c * d * F * N > max_elements:
        raise ValueError(f"a pointwise log-likelihood of {c}×{d} draws × {F * N} entries exceeds "
                         f"max_elements={max_elements}")
    p = np.clip(np.einsum("cdfk,cdkn->cdfn", W, H), floor, 1.0 - floor)
    v = np.where(observed, values, 0).astype(np.float64)
    ll = v * np.log(p) + (1.0 - v) * np.log1p(-p)
    if np.all(observed):
        return {"V": (("chain", "draw", "row", "col"), ll)}
    return {"V": (("chain", "draw", "observed_entry"), ll[:, :, observed])}
