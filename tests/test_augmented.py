"""The data-augmentation chain of the mixture's references (``infer/gibbs/augmented_numba.py``): a
sweep leaves the posterior over the cells' splits invariant and the reference it builds averages to
the posterior marginals, both against exact enumeration."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import chi2

import bam_ppl as bam
from bam_ppl.data import CountTensor
from bam_ppl.infer.gibbs.augmented_numba import augmented_sweeps
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.smc import references, tempered_problem
from bam_ppl.infer.variational import vb
from bam_ppl.infer.variational.vb_numba import host_problem

CASES = {
    "nmf": (bam.models.nmf(2, a=1.0), np.array([[2, 1], [0, 2]])),
    "missing": (bam.models.cp(2, a=1.0), CountTensor.from_samples(
        np.array([[0, 1, 0], [1, -1, 0], [1, 1, 1], [0, 0, -1]]), shape=(2, 2, 2))),
    "tied": (bam.models.symmetric_nmf(2, a=0.5), np.array([[2, 1], [1, 0]])),
    "latent_middle": (bam.AllocationModel("i -> k; k -> j", latent={"k": 3}, observed=("i", "j"), a=0.5),
                      np.array([[2, 1], [0, 2]])),
}


def token_configs(tp) -> np.ndarray:
    """Every allowed configuration of the tempered problem ``tp``'s tokens (Z, T), by enumeration."""
    zs = np.array(list(itertools.product(range(tp.num_configs), repeat=tp.token_cell.size)), np.int32)
    return zs[tp.valid[tp.token_cell[None, :], zs].all(1)] if tp.has_valid else zs


def _posterior_splits(model, X):
    """The problem, the chain's arrays, every split S (n, U, L) of the tokens among the cells'
    configurations and its posterior probability, by enumeration of the token-level allocations."""
    data, bound, layout, _ = prepare(model, X)
    tp = tempered_problem.build_tempered_problem(bound, data, layout)
    L = tp.num_configs
    zs = token_configs(tp)
    log_p = np.array([sum(tempered_problem.exact_log_terms(tp, tempered_problem.counts_of_configs(tp, z))) for z in zs])
    U = tp.cell_start.size - 1
    splits = np.stack([np.bincount(tp.token_cell * L + z, minlength=U * L).reshape(U, L) for z in zs])
    unique, inverse = np.unique(splits.reshape(len(zs), -1), axis=0, return_inverse=True)
    probs = np.bincount(inverse.ravel(), weights=np.exp(log_p - logsumexp(log_p)))
    with jax.enable_x64(True):
        cells = host_problem(vb.build_problem(bound, data, layout))
    return tp, cells, zs[0], unique.reshape(-1, U, L).astype(np.int64), probs


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_sweep_leaves_the_posterior_over_splits_invariant(name):
    # Exact draws of the split, one sweep each, and the histogram is still the posterior (chi-square).
    _, cells, _, splits, probs = _posterior_splits(*CASES[name])
    index = {split.tobytes(): i for i, split in enumerate(splits)}
    num = 20_000
    rng = np.random.default_rng(0)
    moved = np.empty(num, np.int64)
    unused = np.zeros(splits.shape[1:])
    for n, s in enumerate(rng.choice(len(probs), size=num, p=probs)):
        split = splits[s].copy()
        augmented_sweeps(rng, 1, 1, split, cells, unused)
        moved[n] = index[split.tobytes()]
    found = np.bincount(moved, minlength=len(probs))
    statistic = ((found - num * probs) ** 2 / (num * probs)).sum()
    assert statistic < chi2.ppf(0.999, len(probs) - 1), (statistic, len(probs))
    assert not unused.any()  # sweeps before ``skip`` add nothing


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reference_averages_to_the_posterior_marginals(name):
    tp, cells, config, splits, probs = _posterior_splits(*CASES[name])
    sizes = np.diff(tp.cell_start)
    marginals = np.einsum("s,sul->ul", probs, splits) / sizes[:, None]
    chain = references.start_chain(tp, cells, config, [1, 2])  # as the engine's search runs it
    chain.sweep(100)  # its way into the posterior's bulk, left out of q
    log_q = references.averaged_reference(chain, 399_900, floor=0.0).log_q
    q = np.where(cells.valid, np.exp(log_q), 0.0)
    np.testing.assert_allclose(q, marginals, atol=0.02)
    assert np.array_equal(cells.counts, sizes)  # the chain's cells are the tempered problem's, in its order
