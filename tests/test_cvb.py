"""Collapsed VB (method="cvb"): exact on a single token, a valid bound, agreement with VB."""

import jax
import numpy as np
import pytest

import bam_ppl as bam
from bam_ppl.convert import attrs_of, group
from bam_ppl.data import CountTensor, as_count_tensor
from bam_ppl.infer.exact import exact_log_evidence, exact_posterior_mean
from bam_ppl.infer.variational import cvb as cvb_backend
from bam_ppl.parallel import chain_keys

X1 = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])


def _single_token_cases():
    one = np.zeros((3, 4), int)
    one[1, 2] = 1
    sym = np.zeros((3, 3), int)
    sym[2, 2] = 1
    cube = np.zeros((2, 3, 2), int)
    cube[1, 0, 1] = 1
    missing = CountTensor(np.array([[1, -1]]), [1], shape=(2, 3))
    return {
        "nmf": (bam.models.nmf(3, a=0.7), one),
        "snmf": (bam.models.symmetric_nmf(2, a=1.3), sym),
        "cp": (bam.models.cp(2, order=3, a=0.4), cube),
        "missing": (bam.models.nmf(2, a=1.0), missing),
    }


@pytest.mark.parametrize("case", ["nmf", "snmf", "cp", "missing"])
def test_single_token_expected_counts_are_exact(case):
    """With one token the collapsed update has nothing to approximate: CVB0's expected family
    counts are the exact posterior means (the urn probability with the token's own count removed,
    including the within-token increment of tied tables)."""
    model, X = _single_token_cases()[case]
    data = as_count_tensor(X)
    bound = model.bind(data)
    layout = bound.cell_layout(data)
    member_table = tuple(int(t) for t in layout.member_table)
    with jax.enable_x64(True):
        problem = cvb_backend.build_cvb_problem(bound, data, layout)
        result = cvb_backend.run(chain_keys(0, 2), problem, member_table, num_iters=5, tol=0.0)
    exact = exact_posterior_mean(model, data, lambda counts: counts)
    np.testing.assert_allclose(result.expected, np.broadcast_to(exact, result.expected.shape), atol=1e-12)


@pytest.mark.parametrize(
    "model,X",
    [
        (bam.models.nmf(2, a=1.0), X1),
        (bam.models.lda(3, a=2.0), X1),
        (bam.models.symmetric_nmf(2, a=1.0), np.array([[3, 1, 0], [1, 0, 2], [0, 2, 1]])),
    ],
    ids=["nmf", "lda", "snmf"],
)
def test_recorded_bound_is_below_exact_evidence(model, X):
    idata = bam.infer(model, X, method="cvb", rng_key=1, num_chains=4, num_iters=100, num_samples=5)
    stats = group(idata, "sample_stats")
    elbo = stats["elbo"].values
    assert stats["training_log_likelihood"].dims == ("chain", "iteration")
    assert np.all(np.isfinite(elbo)) and np.all(np.isfinite(stats["training_log_likelihood"].values))
    assert elbo.max() <= exact_log_evidence(model, X) + 1e-9


def _document_word_matrix():
    rng = np.random.default_rng(0)
    docs, words, topics = 40, 60, 4
    topic_words = rng.dirichlet(np.full(words, 0.1), topics)
    doc_topics = rng.dirichlet(np.full(topics, 0.3), docs)
    return np.stack([rng.multinomial(80, doc_topics[d] @ topic_words) for d in range(docs)])


def test_cvb0_and_vb_training_log_likelihoods_agree_on_documents():
    X = _document_word_matrix()
    model = bam.AllocationModel("d -> k -> w", latent={"k": 4}, condition_on="d",
                                priors={"k": 0.5, "w": 0.1})
    runs = {
        method: bam.infer(model, X, method=method, rng_key=0, num_chains=4, num_iters=1000,
                          num_samples=5)
        for method in ("vb", "cvb")
    }
    best = {
        method: group(idata, "sample_stats")["final_training_log_likelihood"].values[
            attrs_of(idata)["best_restart"]]
        for method, idata in runs.items()
    }
    assert abs(best["vb"] - best["cvb"]) <= 0.01 * abs(best["cvb"]), best
    # VB maximises the bound that CVB0 only monitors.
    assert attrs_of(runs["vb"])["best_elbo"] >= attrs_of(runs["cvb"])["best_elbo"]


def test_inference_data_and_reproducibility():
    model = bam.models.nmf(2, a=1.0)  # and the restarts of test_recorded_bound_is_below_exact_evidence[nmf]: one program
    first = bam.infer(model, X1, method="cvb", rng_key=5, num_chains=4, num_samples=20)
    again = bam.infer(model, X1, method="cvb", rng_key=5, num_chains=4, num_samples=20)
    post = group(first, "posterior")
    assert post["theta_i"].shape == (1, 20, 2, 3)
    np.testing.assert_allclose(post["theta_j"].sum("j").values, 1.0, rtol=1e-10)
    np.testing.assert_array_equal(post["theta_j"].values, group(again, "posterior")["theta_j"].values)
    stats = group(first, "sample_stats")
    assert attrs_of(first)["best_restart"] == int(np.argmax(stats["final_elbo"].values))


@pytest.mark.parametrize(
    "options,error,match",
    [
        (dict(num_iters=-3), ValueError, "num_iters"),
        (dict(tol=-0.5), ValueError, "tol"),
        (dict(init="uniform"), ValueError, "init"),
        (dict(num_chains=True), TypeError, "num_chains"),
    ],
)
def test_bad_options_raise(options, error, match):
    with pytest.raises(error, match=match):
        bam.infer(bam.models.nmf(2), X1, method="cvb", **options)
