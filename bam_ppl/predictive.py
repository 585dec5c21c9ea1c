"""Posterior predictive replicates and label alignment of InferenceData from any backend.

:func:`posterior_predictive` adds a ``posterior_predictive`` group (replicates of the observed
data, one per chain and draw, with the dims of ``observed_data``) so that ``az.plot_ppc`` and
``az.loo_pit`` work. :func:`relabel` undoes label switching of latent components across chains
and draws so that ``az.summary`` / ``az.rhat`` of component tables are meaningful.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

import numpy as np
import xarray as xr
from scipy.optimize import linear_sum_assignment

from .convert import attrs_of, group, with_groups
from .pointwise import MAX_ELEMENTS, dense_cell_probabilities, table_members
from .types import KeyLike, numpy_generator

SAMPLE_DIMS = ("chain", "draw")


def _is_nbmf(model, attrs) -> bool:
    from .models.nbmf import NBMF

    return isinstance(model, NBMF) or ("n_components" in attrs and "prior" in attrs and "structure" not in attrs)


def posterior_predictive(model, idata, rng_key: KeyLike = 0, *, max_elements: int = MAX_ELEMENTS):
    """InferenceData with a ``posterior_predictive`` group: one replicate of X per chain and draw.

    Parameters
    ----------
    model : AllocationModel (any preset: CP, NMF, LDA, PMF, Dirichlet Tucker, ...) or NBMF
        The model that produced ``idata`` (its structure is read from ``idata.attrs``).
    idata : InferenceData (ArviZ 0.x) or DataTree (ArviZ 1.x) from ``bam.infer`` with any backend.
    rng_key : int or JAX key
    max_elements : int
        Largest ``chain × draw × cells`` replicate array; above it a ``ValueError`` asks to thin
        the draws first (e.g. ``idata.sel(draw=slice(None, None, 10))``).

    Returns
    -------
    A copy of ``idata`` with ``posterior_predictive["X"]`` (``["V"]`` for NBMF) of dims
    ``(chain, draw, *dims of observed_data)`` and ``observed_data`` kept, so ``az.plot_ppc(idata)``
    works.

    Replicates follow the model's likelihood given each draw: Poisson(λ p(cell)) for allocation
    models with a sampled total rate λ; under ``condition_on`` a Multinomial per conditioned cell
    with the observed totals (a backend without λ, e.g. PMF, gives the Multinomial of the observed
    total T); Bernoulli([WH]_fn) for NBMF (entries missing in the data stay NaN).
    """
    attrs = attrs_of(idata)
    post = group(idata, "posterior")
    obs = group(idata, "observed_data")
    gen = numpy_generator(rng_key)
    if _is_nbmf(model, attrs):
        W = np.asarray(post["W"].values, dtype=np.float64)
        H = np.asarray(post["H"].values, dtype=np.float64)
        V = obs["V"]
        if W.shape[0] * W.shape[1] * V.size > max_elements:
            raise ValueError(_too_many(W.shape[:2], V.size, max_elements))
        p = np.clip(np.einsum("cdfk,cdkn->cdfn", W, H), 0.0, 1.0)
        draws = (gen.random(p.shape) < p).astype(np.float64)
        draws = np.where(np.isnan(V.values), np.nan, draws)
        rep = xr.DataArray(draws, dims=(*SAMPLE_DIMS, *V.dims),
                           coords={**{d: post.coords[d] for d in SAMPLE_DIMS}, **V.coords})
        return with_groups(idata, {"posterior_predictive": xr.Dataset({"V": rep})})
    if "X" not in obs:
        raise ValueError("posterior_predictive needs observed_data['X'] as a dense array; this fit "
                         "stored sparse cells (data with missing entries or too large to densify)")
    X = obs["X"]
    visible = tuple(X.dims)
    members = table_members(attrs["structure"], condition_on=_list_attr(attrs.get("condition_on")),
                            tie=ast.literal_eval(attrs["tie"]) if "tie" in attrs else ())
    theta = {}
    for name, _, _ in members:
        if f"theta_{name}" not in post:
            raise ValueError(f"posterior has no theta_{name}; cannot replicate the data")
        var = post[f"theta_{name}"]
        theta[name] = np.asarray(var.values, dtype=np.float64)
    chains, draws_n = post.sizes["chain"], post.sizes["draw"]
    if chains * draws_n * X.size > max_elements:
        raise ValueError(_too_many((chains, draws_n), X.size, max_elements))
    shape = tuple(X.shape)
    p = dense_cell_probabilities(members, theta, visible, shape)
    cond = _list_attr(attrs.get("condition_on"))
    x = np.asarray(X.values)
    if "total_rate" in post and not cond:
        rate = np.asarray(post["total_rate"].values, dtype=np.float64)
        rate = rate.reshape(rate.shape + (1,) * len(shape))
        rep = gen.poisson(rate * p)
    else:
        cond_axes = [visible.index(c) for c in cond]
        rest_axes = [i for i in range(len(shape)) if i not in cond_axes]
        order = cond_axes + rest_axes
        cond_shape = tuple(shape[i] for i in cond_axes)
        p_c = np.transpose(p, (0, 1, *(2 + i for i in order))).reshape(chains, draws_n, *cond_shape, -1)
        p_c = p_c / p_c.sum(-1, keepdims=True)
        n = np.transpose(x, order).reshape(*cond_shape, -1).sum(-1).astype(np.int64)
        rep = gen.multinomial(np.broadcast_to(n, p_c.shape[:-1]), p_c)
        rep = rep.reshape(chains, draws_n, *cond_shape, *(shape[i] for i in rest_axes))
        rep = np.transpose(rep, (0, 1, *(2 + i for i in np.argsort(order))))
    da = xr.DataArray(rep.astype(np.int64), dims=(*SAMPLE_DIMS, *visible),
                      coords={**{d: post.coords[d] for d in SAMPLE_DIMS}, **X.coords})
    return with_groups(idata, {"posterior_predictive": xr.Dataset({"X": da})})


def _list_attr(value) -> tuple[str, ...]:
    if not value or value == "None":
        return ()
    return tuple(v for v in str(value).split(",") if v)


def _too_many(sample_shape, cells, limit):
    return (f"{sample_shape[0]}×{sample_shape[1]} draws × {cells} cells exceeds max_elements={limit}; "
            "thin the draws first, e.g. idata.sel(draw=slice(None, None, 10))")


# -- label switching ------------------------------------------------------------------------------
def latent_dims(idata) -> tuple[str, ...]:
    """The posterior dims that index exchangeable latent components (from ``idata.attrs``)."""
    attrs = attrs_of(idata)
    if "latent" in attrs and attrs["latent"] not in ("", "None", "{}"):
        return tuple(ast.literal_eval(str(attrs["latent"])))
    if "n_components" in attrs:
        return ("component",)
    if "detected_rank" in attrs:
        return ("r",)
    return ()


def relabel(idata, dims: Sequence[str] | str | None = None, *, num_iters: int = 3):
    """Align the latent labels of every chain and draw to one reference (label switching).

    Latent components of a mixture, CP, NMF, LDA or NBMF are exchangeable: permuting the labels of
    a latent node (and the matching rows/columns of every table) leaves the likelihood and the
    prior unchanged, so different chains settle on different labellings and ``az.rhat`` /
    ``az.summary`` of ``theta_<child>`` report large R̂ and tiny ESS that say nothing about
    convergence. This function finds, for each chain and draw, the permutation of each latent
    dim that best matches a reference (Hungarian matching, ``scipy.optimize.linear_sum_assignment``,
    on the squared distance between the draw's and the reference's component tables: every
    posterior variable that has that dim and no other latent dim, e.g. θ of the latent node's
    children and its own weights), and applies it to **every** posterior variable with the dim.
    The reference starts as chain 0's posterior mean and is re-estimated as the mean of the
    aligned draws ``num_iters`` times (a simple version of Stephens 2000). Only the ``posterior``
    group changes; other groups (variational parameters, expectations, log-likelihood) are kept.
    Relabelling removes permutations only: an R̂ that stays large afterwards means chains in
    genuinely different modes.

    Label-invariant quantities need no relabelling and are unchanged by it: the evidence
    (``bam.log_evidence``), the cell probabilities p(cell) and the fitted mean (E[WH] for NBMF),
    ``total_rate``, ``log_likelihood`` / LOO, posterior predictive draws, and any statistic
    symmetric in the labels (sorted component weights, the number of active components).

    Parameters
    ----------
    idata : InferenceData or DataTree from any backend
    dims : str or sequence of str, optional
        Latent dims to align; default: the model's latent nodes (``attrs["latent"]``), or
        ``"component"`` for NBMF.
    num_iters : int

    Returns
    -------
    A copy of ``idata`` with a relabelled ``posterior`` (``attrs["relabelled"]`` lists the dims).
    """
    post = group(idata, "posterior").copy()
    if dims is None:
        dims = latent_dims(idata)
    else:
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        unknown = [d for d in dims if d not in post.dims]
        if unknown:
            raise ValueError(f"dims {unknown} are not dims of the posterior {sorted(map(str, post.dims))}")
    dims = tuple(d for d in dims if d in post.dims and post.sizes[d] > 1)
    for d in dims:
        stacked = _component_tables(post, d, dims)
        if stacked is None:
            continue
        reference = stacked[0].mean(0)
        perm = None
        for _ in range(max(1, num_iters)):
            perm = _match(stacked, reference)
            aligned = np.take_along_axis(stacked, perm[:, :, None, :], axis=-1)
            reference = aligned.mean((0, 1))
        for v in list(post.data_vars):
            if d in post[v].dims:
                post[v] = _permute(post[v], d, perm)
    post.attrs = {**post.attrs, "relabelled": ",".join(dims)}
    return with_groups(idata, {"posterior": post})


def _component_tables(post: xr.Dataset, d: str, dims: Sequence[str]) -> np.ndarray | None:
    """``(chain, draw, features, K)``: every posterior variable with latent dim ``d`` and no other latent dim
    of ``dims``, side by side; None where there is none."""
    others = set(dims) - {d}
    keys = [v for v in post.data_vars if d in post[v].dims and not others & set(post[v].dims)]
    return np.concatenate([_components(post[v], d) for v in keys], axis=2) if keys else None


class LabelSwitchingWarning(UserWarning):
    """The chains of a result settled in different labellings of a latent node (:func:`switched_chains`)."""


# A permutation of the labels must bring a chain's mean tables this many times closer to chain 0's (in squared
# distance) to count as a switch: chains in one labelling differ by Monte Carlo noise, whichever way they are matched.
SWITCH_RATIO = 4.0


def switched_chains(idata) -> dict[str, list[int]]:
    """For each latent dim (as :func:`relabel` finds them), the chains whose labels are a permutation of chain 0's: their
    posterior mean component tables lie ``SWITCH_RATIO`` times closer to chain 0's, in squared distance, once the
    labels are matched (Hungarian matching, as :func:`relabel`) than as they are. Such chains make
    ``az.summary``/``az.rhat`` of the latent tables report R̂ far above 1 that says nothing of convergence;
    :func:`relabel` aligns them. Empty where the result has one chain or no latent dim."""
    try:
        post = group(idata, "posterior")
    except (AttributeError, KeyError):
        return {}
    if post.sizes.get("chain", 1) < 2:
        return {}
    dims = tuple(d for d in latent_dims(idata) if d in post.dims and post.sizes[d] > 1)
    chain_means = post.mean("draw").expand_dims("draw", axis=1)  # the draws averaged first: no copy of them all
    found = {}
    for d in dims:
        stacked = _component_tables(chain_means, d, dims)
        if stacked is None or not np.all(np.isfinite(stacked)):
            continue
        means = stacked[:, 0]  # (C, F, K)
        perm = _match(stacked, means[0])[:, 0]  # (C, K)
        matched = np.take_along_axis(means, perm[:, None, :], axis=-1)
        as_is, aligned = ((means - means[:1]) ** 2).sum((1, 2)), ((matched - means[:1]) ** 2).sum((1, 2))
        chains = [c for c in range(1, means.shape[0]) if as_is[c] > SWITCH_RATIO * aligned[c]]
        if chains:
            found[str(d)] = chains
    return found


def _components(var: xr.DataArray, d: str) -> np.ndarray:
    """``(chain, draw, features, K)`` view of a variable with latent dim ``d`` last."""
    rest = [x for x in var.dims if x not in (*SAMPLE_DIMS, d)]
    arr = np.asarray(var.transpose(*SAMPLE_DIMS, *rest, d).values, dtype=np.float64)
    C, D, K = arr.shape[0], arr.shape[1], arr.shape[-1]
    return arr.reshape(C, D, -1, K)


def _match(stacked: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """perm[c, t, j] = the draw's label that becomes label j (closest to reference column j)."""
    C, D, _, K = stacked.shape
    a2 = (stacked ** 2).sum(2)  # (C, D, K)
    r2 = (reference ** 2).sum(0)  # (K,)
    cost = a2[..., :, None] + r2[None, None, None, :] - 2 * np.einsum("cdfa,fb->cdab", stacked, reference)
    perm = np.empty((C, D, K), dtype=np.int64)
    for c in range(C):
        for t in range(D):
            rows, cols = linear_sum_assignment(cost[c, t])
            perm[c, t, cols] = rows
    return perm


def _permute(var: xr.DataArray, d: str, perm: np.ndarray) -> xr.DataArray:
    order = list(var.dims)
    moved = var.transpose(*SAMPLE_DIMS, *[x for x in order if x not in (*SAMPLE_DIMS, d)], d)
    arr = np.asarray(moved.values)
    index = perm.reshape(perm.shape[:2] + (1,) * (arr.ndim - 3) + perm.shape[2:])
    out = moved.copy(data=np.take_along_axis(arr, index, axis=-1))
    return out.transpose(*order)
