"""VB with missing leaf entries marginalised (vb.marginalised_leaf_layout), the layout VB-PMF runs on."""

import numpy as np
import pytest
from scipy.special import gammaln

import bam_ppl as bam
from bam_ppl.convert import attrs_of
from bam_ppl.data import CountTensor
from bam_ppl.infer.variational import vb
from bam_ppl.models.pmf import pmf_tensor

SAMPLES = np.array([[0, 1, -1], [1, 1, 0], [0, -1, 2], [1, 0, 0], [0, 1, 1], [-1, 1, 2], [1, 1, 0]])


def test_complete_data_keep_the_free_node_layout():
    model = bam.AllocationModel("r -> i; r -> j; r -> k", latent={"r": 2})
    data = CountTensor.from_samples(np.array([[0, 1, 0], [1, 1, 1], [0, 0, 1], [0, 1, 0]]), shape=(2, 2, 2))
    bound = model.bind(data)
    layout, mask = vb.marginalised_leaf_layout(bound, data)
    reference = bound.cell_layout(data)
    for field in ("cell_flat", "config_flat", "cell_col", "config_col"):
        np.testing.assert_array_equal(getattr(layout, field), getattr(reference, field))
    assert layout.valid is None and mask.shape == (4, data.nnz) and np.all(mask == 1.0)


def test_a_missing_entry_drops_only_its_own_member():
    model = pmf_tensor(2).resolve(SAMPLES)
    data = bam.models.categorical_samples(SAMPLES)
    bound = model.bind(data)
    layout, mask = vb.marginalised_leaf_layout(bound, data)
    assert layout.valid is None and layout.num_configs == 2
    children = [child for _, child, _ in bound.members]
    for u, cell in enumerate(data.indices):
        observed = {f"x{n + 1}": code >= 0 for n, code in enumerate(cell)}
        assert [mask[m, u] for m in range(len(children))] == [float(observed.get(c, True)) for c in children]


def test_a_missing_entry_of_an_inner_node_is_refused():
    model = bam.AllocationModel("i -> k; k -> j", latent={"k": 2}, observed=("i", "j"))
    data = CountTensor.from_samples(np.array([[0, 1], [-1, 0]]), shape=(2, 2))
    with pytest.raises(ValueError, match="'i' has missing entries but is not a leaf"):
        vb.marginalised_leaf_layout(model.bind(data), data)


def test_one_component_elbo_is_the_exact_evidence_of_the_observed_entries():
    """With R = 1, q is the exact posterior, so the ELBO of eq. 39 is log p(observed entries):
    per variable a Dirichlet-categorical marginal of its observed codes (missing ones summed out)."""
    alpha, sizes = 0.7, (2, 2, 3)
    idata = bam.infer(pmf_tensor(1, alpha=alpha), SAMPLES, method="vb", rng_key=0, num_categories=list(sizes),
                      tol=0.0, num_iters=5, progress_bar=False)
    exact = 0.0
    for n, size in enumerate(sizes):
        counts = np.bincount(SAMPLES[SAMPLES[:, n] >= 0, n], minlength=size)
        exact += (gammaln(size * alpha) - gammaln(size * alpha + counts.sum())
                  + np.sum(gammaln(alpha + counts) - gammaln(alpha)))
    assert attrs_of(idata)["elbo"] == pytest.approx(exact, rel=1e-12)
