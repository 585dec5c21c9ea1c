"""Dirichlet Tucker decomposition (papers/003): the allocation-model preset, MAP-EM and stochastic EM."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from scipy.special import gammaln
from scipy.stats import multinomial

import bam_ppl as bam
from bam_ppl.convert import attrs_of, group
from bam_ppl.infer.exact import exact_log_evidence
from bam_ppl.models.dirichlet_tucker import (
    DirichletTuckerModel,
    DirichletTuckerParams,
    dirichlet_tucker,
)
from bam_ppl.models.program import cell_probabilities

PLANTED_RANKS = (3, 2, 2, 3)
PLANTED_SHAPE = (30, 8, 10, 12)
PLANTED_TOTAL = 500
# Fits on the planted tensor share one compiled program: the same restarts and a trace buffer of
# the same size (num_iters in [128, 255]).
FIT = dict(num_iters=250, num_chains=2)


def paper_log_likelihood(params: DirichletTuckerParams, X) -> float:
    """Σ_mn log Mult(vec X_mn | C, Σ g ψ φ vec(θ_k λ_lᵀ)) written straight from eq. 2."""
    probs = params.face_probabilities()
    M, N = X.shape[:2]
    return sum(
        multinomial.logpmf(X[m, n].reshape(-1), X[m, n].sum(), probs[m, n].reshape(-1))
        for m in range(M) for n in range(N)
    )


def mean_matched_correlation(truth, estimate) -> float:
    """Mean correlation of columns after the best permutation (Hungarian matching)."""
    k = truth.shape[1]
    corr = np.corrcoef(truth.T, estimate.T)[:k, k:]
    rows, cols = linear_sum_assignment(-corr)
    return float(corr[rows, cols].mean())


def factor_correlations(truth: DirichletTuckerParams, est: DirichletTuckerParams) -> dict:
    return dict(
        psi=mean_matched_correlation(truth.psi, est.psi),
        phi=mean_matched_correlation(truth.phi, est.phi),
        theta=mean_matched_correlation(truth.theta.T, est.theta.T),
        lam=mean_matched_correlation(truth.lam.T, est.lam.T),
    )


@functools.cache
def planted(alpha: float = 0.3):
    """A tensor drawn from the model with well-separated factors (small planted α)."""
    return dirichlet_tucker(PLANTED_RANKS, alpha=alpha).sample(0, shape=PLANTED_SHAPE, total=PLANTED_TOTAL)


# -- the preset is a faithful allocation model ------------------------------------------------
def random_params(rng, ranks, shape):
    K_M, K_N, K_P, K_S = ranks
    M, N, P, S = shape
    return DirichletTuckerParams(
        rng.dirichlet(np.ones(K_M), M), rng.dirichlet(np.ones(K_N), N), rng.dirichlet(np.ones(P), K_P),
        rng.dirichlet(np.ones(S), K_S), rng.dirichlet(np.ones(K_P * K_S), (K_M, K_N)).reshape(ranks),
    )


def test_preset_likelihood_equals_paper_eq2():
    rng = np.random.default_rng(0)
    ranks, shape = (2, 2, 2, 3), (3, 2, 3, 2)
    model = dirichlet_tucker(ranks)
    params = random_params(rng, ranks, shape)
    _, X = model.sample(1, shape=shape, total=7)
    data = bam.CountTensor.from_dense(X)
    bound = model.bind(data)
    tables = model.tables_from_params(params)
    with jax.enable_x64(True):
        flat = jnp.concatenate([jnp.asarray(tables[t.name]).reshape(-1) for t in bound.tables])
        p_cells = np.asarray(cell_probabilities(flat, bound.cell_layout(data)))
    # The allocation model's cell probabilities are p(p, s | m, n) = eq. 2's multinomial parameter.
    np.testing.assert_allclose(p_cells, params.face_probabilities()[tuple(data.indices.T)], rtol=1e-10)
    face_totals = X.sum(axis=(2, 3))
    preset = (
        np.sum(data.counts * np.log(p_cells)) - gammaln(data.counts + 1.0).sum()
        + gammaln(face_totals + 1.0).sum()
    )
    np.testing.assert_allclose(preset, paper_log_likelihood(params, X), rtol=1e-10)
    # and the round trip tables <-> paper parameters
    back = model.params_from_tables(tables)
    np.testing.assert_allclose(back.core, params.core, rtol=1e-12)


def test_preset_structure_and_priors():
    model = dirichlet_tucker((2, 3, 4, 5), alpha=1.1)
    assert isinstance(model, bam.AllocationModel)
    assert model.condition_on == ("m", "n")
    assert model.observed == ("m", "n", "p", "s")
    assert model.latent == dict(i=2, j=3, k=4, l=5)
    # vec(G_ij) ~ Dir(α 1_{K_P K_S}): k-marginal Dir(K_S α), l | k Dir(α) (aggregation property).
    assert model.priors["k"] == pytest.approx(5 * 1.1)
    assert model.priors["l"] == pytest.approx(1.1)
    three = dirichlet_tucker((2, 3, 4))
    assert three.observed == ("m", "n", "p") and three.priors["k"] == pytest.approx(1.1)
    assert dirichlet_tucker(K_M=2, K_N=3, K_P=4, K_S=5).ranks == (2, 3, 4, 5)


def test_exact_evidence_matches_prior_monte_carlo():
    """The preset's evidence equals E_prior[eq. 2] under the paper's vec(G_ij) ~ Dir(α) prior."""
    ranks, alpha = (1, 1, 2, 2), 1.1
    model = dirichlet_tucker(ranks, alpha=alpha)
    X = np.array([[[[2, 0], [0, 1]]], [[[0, 1], [2, 0]]]])     # M=2, N=1, P=S=2, C=3
    exact = exact_log_evidence(model, X)
    assert bam.log_evidence(model, X, method="exact").value == pytest.approx(exact)
    rng = np.random.default_rng(0)
    draws = 200_000
    theta = rng.dirichlet(np.full(2, alpha), (draws, 2))
    lam = rng.dirichlet(np.full(2, alpha), (draws, 2))
    core = rng.dirichlet(np.full(4, alpha), draws).reshape(draws, 2, 2)
    probs = np.einsum("dkl,dkp,dls->dps", core, theta, lam).reshape(draws, -1)
    like = np.ones(draws)
    for m in range(2):
        like *= multinomial.pmf(X[m, 0].reshape(-1), 3, probs)
    estimate, stderr = like.mean(), like.std() / np.sqrt(draws)
    assert abs(np.exp(exact) - estimate) < 4 * stderr


@pytest.mark.slow
@pytest.mark.stats
def test_generic_evidence_backends_run_on_the_preset():
    """SMC (unbiased estimate) and VB (lower bound) against the exact evidence of a tiny tensor."""
    model = dirichlet_tucker((1, 1, 2, 2))
    _, X = dirichlet_tucker((1, 1, 2, 2), alpha=0.3).sample(1, shape=(2, 1, 2, 2), total=3)
    exact = bam.log_evidence(model, X, method="exact").value
    smc = bam.log_evidence(model, X, method="smc", rng_key=0)
    assert abs(smc.value - exact) < 4 * smc.stderr + 1e-6
    assert bam.log_evidence(model, X, method="vb", rng_key=0).value <= exact + 1e-6


def test_sample_faces_sum_to_total():
    model = dirichlet_tucker((2, 2, 3, 2))
    params, X = model.sample(3, shape=(5, 4, 6, 7), total=40)
    assert X.shape == (5, 4, 6, 7) and X.dtype == np.int64
    assert (X.sum(axis=(2, 3)) == 40).all()
    np.testing.assert_allclose(params.core.sum(axis=(2, 3)), 1.0)
    np.testing.assert_allclose(params.psi.sum(1), 1.0)
    assert params.theta.shape == (3, 6) and params.lam.shape == (2, 7)
    again = model.sample(3, shape=(5, 4, 6, 7), total=40)[1]
    np.testing.assert_array_equal(X, again)
    _, X3 = dirichlet_tucker((2, 2, 3)).sample(0, shape=(4, 3, 5), total=9)
    assert (X3.sum(axis=2) == 9).all()
    totals = np.arange(20).reshape(5, 4)
    _, Xv = model.sample(0, shape=(5, 4, 6, 7), total=totals)
    np.testing.assert_array_equal(Xv.sum(axis=(2, 3)), totals)


# -- MAP-EM -----------------------------------------------------------------------------------
def test_log_posterior_never_decreases():
    _, X = planted(1.1)
    idata = bam.infer(dirichlet_tucker(PLANTED_RANKS, alpha=1.1), X, method="map", rng_key=0, tol=0.0, **FIT)
    trace = group(idata, "sample_stats")["log_posterior"].values[0]
    assert trace.shape == (251,)
    assert np.all(np.diff(trace) >= -1e-9 * np.abs(trace[1:]))
    assert trace[-1] > trace[0]


def test_squarem_never_lowers_the_log_posterior_and_outruns_em():
    """SQUAREM (three EM updates an iteration) keeps the trace monotone and, for the same number
    of EM updates, ends at a log posterior at least as high as plain EM's (at α = 1.1, where EM
    crawls); the held-out faces still take no part in the fit."""
    _, X = planted(1.1)
    model = dirichlet_tucker(PLANTED_RANKS, alpha=1.1)
    heldout = np.random.default_rng(0).random(X.shape[:2]) < 0.2
    plain = bam.infer(model, X, method="map", rng_key=0, tol=0.0, num_iters=150, heldout=heldout)
    fast = bam.infer(model, X, method="map", rng_key=0, tol=0.0, num_iters=50, heldout=heldout,
                     acceleration="squarem")
    trace = group(fast, "sample_stats")["log_posterior"].values[0]
    assert trace.shape == (51,) and fast.attrs["acceleration"] == "squarem"
    assert np.all(np.diff(trace) >= -1e-9 * np.abs(trace[1:]))
    assert trace[-1] >= group(plain, "sample_stats")["log_posterior"].values[0, -1]
    changed = X.copy()
    changed[heldout] = X[~heldout][: heldout.sum()]
    again = bam.infer(model, changed, method="map", rng_key=0, tol=0.0, num_iters=50, heldout=heldout,
                      acceleration="squarem")
    np.testing.assert_array_equal(group(again, "posterior")["psi"].values, group(fast, "posterior")["psi"].values)
    with pytest.raises(ValueError, match="acceleration"):
        bam.infer(model, X, method="map", acceleration="anderson")


def test_em_log_posterior_matches_paper_formula():
    _, X = planted()
    model = dirichlet_tucker(PLANTED_RANKS)
    idata = bam.infer(model, X, method="map", rng_key=0, num_iters=130, num_chains=2)
    est = DirichletTuckerParams.from_inference_data(idata)
    stats = group(idata, "sample_stats")
    np.testing.assert_allclose(stats["final_log_likelihood"].values[0], paper_log_likelihood(est, X), rtol=1e-9)
    rows = lambda x: np.sum(gammaln(1.1 * x.shape[-1]) - x.shape[-1] * gammaln(1.1) + 0.1 * np.log(x).sum(-1))  # noqa: E731
    prior = rows(est.psi) + rows(est.phi) + rows(est.theta) + rows(est.lam) + rows(est.core.reshape(6, -1))
    np.testing.assert_allclose(stats["log_posterior"].values[0, -1], paper_log_likelihood(est, X) + prior,
                               rtol=1e-9)


def test_recovers_planted_factors():
    truth, X = planted()
    idata = bam.infer(dirichlet_tucker(PLANTED_RANKS), X, method="map", rng_key=0, **FIT)
    corr = factor_correlations(truth, DirichletTuckerParams.from_inference_data(idata))
    assert np.mean(list(corr.values())) >= 0.9, corr
    assert min(corr.values()) >= 0.9, corr


@pytest.mark.slow
@pytest.mark.stats
def test_recovers_planted_factors_at_paper_alpha():
    """Planted from the fitted model itself (α = 1.1, less separated factors): slower EM, with
    local optima that recover one factor poorly (ψ correlation 0.48 from one of three restarts'
    best), so the best of more restarts is taken."""
    truth, X = planted(1.1)
    idata = bam.infer(dirichlet_tucker(PLANTED_RANKS), X, method="map", rng_key=1, num_iters=2000,
                      num_chains=8)
    corr = factor_correlations(truth, DirichletTuckerParams.from_inference_data(idata))
    assert np.mean(list(corr.values())) >= 0.9, corr


def test_heldout_faces_never_influence_the_fit():
    _, X = planted()
    rng = np.random.default_rng(0)
    heldout = rng.random(X.shape[:2]) < 0.15
    changed = X.copy()
    # Replace the held-out faces by unrelated counts with the same total.
    changed[heldout] = rng.multinomial(PLANTED_TOTAL, np.full(120, 1 / 120), heldout.sum()).reshape(-1, 10, 12)
    model = dirichlet_tucker(PLANTED_RANKS)
    fits = [bam.infer(model, data, method="map", rng_key=0, heldout=heldout, **FIT) for data in (X, changed)]
    first, second = (group(f, "posterior") for f in fits)
    for name in ("psi", "phi", "theta", "lambda", "core"):
        np.testing.assert_array_equal(first[name].values, second[name].values)
    traces = [group(f, "sample_stats")["log_posterior"].values for f in fits]
    np.testing.assert_array_equal(*traces)
    held = [group(f, "sample_stats")["heldout_log_likelihood"].values[0] for f in fits]
    assert held[0] != held[1]
    # Held-out faces may even break the equal-total rule: they are not fitted.
    changed[heldout.nonzero()[0][0], heldout.nonzero()[1][0]] = 0
    third = bam.infer(model, changed, method="map", rng_key=0, heldout=heldout, **FIT)
    np.testing.assert_array_equal(group(third, "posterior")["psi"].values, first["psi"].values)


def test_inference_data_contents():
    truth, X = planted()
    idata = bam.infer(dirichlet_tucker(PLANTED_RANKS), X, method="map", rng_key=0, num_iters=130, num_chains=2)
    post = group(idata, "posterior")
    assert post["psi"].dims == ("chain", "draw", "m", "i") and post["psi"].shape == (1, 1, 30, 3)
    assert post["core"].shape == (1, 1, 3, 2, 2, 3)
    assert post["lambda"].dims == ("chain", "draw", "l", "s")
    np.testing.assert_allclose(post["core"].values.sum(axis=(-2, -1)), 1.0)
    recon = post["reconstruction"].values[0, 0]
    np.testing.assert_allclose(recon.sum(axis=(2, 3)), PLANTED_TOTAL)
    for table in ("i", "j", "k", "l", "p", "s"):
        np.testing.assert_allclose(post[f"theta_{table}"].values.sum(-1), 1.0)
    attrs = attrs_of(idata)
    assert attrs["method"] == "map" and "single draw" in attrs["point_estimate"]
    assert "heldout_log_likelihood" not in group(idata, "sample_stats")
    np.testing.assert_array_equal(group(idata, "observed_data")["X"].values, X)


def test_restarts_and_keys_are_reproducible():
    _, X = planted()
    model = dirichlet_tucker(PLANTED_RANKS)
    a = bam.infer(model, X, method="map", rng_key=5, num_iters=130, num_chains=2)
    b = bam.infer(model, X, method="map", rng_key=5, num_iters=130, num_chains=2)
    np.testing.assert_array_equal(group(a, "posterior")["psi"].values, group(b, "posterior")["psi"].values)
    finals = group(a, "sample_stats")["restart_log_posterior"].values[0]
    assert group(a, "sample_stats")["log_posterior"].values[0, -1] == pytest.approx(finals.max())


def test_three_way_variant():
    model = dirichlet_tucker((2, 2, 3), alpha=0.3)
    truth, X = model.sample(0, shape=(20, 6, 15), total=300)
    idata = bam.infer(dirichlet_tucker((2, 2, 3)), X, method="map", rng_key=0, num_iters=300)
    post = group(idata, "posterior")
    assert "lambda" not in post and post["core"].dims == ("chain", "draw", "i", "j", "k")
    est = DirichletTuckerParams.from_inference_data(idata)
    assert est.lam is None
    # The face distributions (not every factor of a 3-way Tucker) are identifiable.
    corr = np.corrcoef(est.face_probabilities().reshape(-1), truth.face_probabilities().reshape(-1))[0, 1]
    assert corr > 0.95
    trace = group(idata, "sample_stats")["log_posterior"].values[0]
    assert np.all(np.diff(trace) >= -1e-9 * np.abs(trace[1:]))


# -- stochastic EM ----------------------------------------------------------------------------
def test_stochastic_em_approaches_full_batch_fit():
    truth, X = planted()
    model = dirichlet_tucker(PLANTED_RANKS)
    sem = bam.infer(model, X, method="sem", rng_key=0, num_iters=5000, batch_size=48)
    stats = group(sem, "sample_stats")
    assert stats["log_posterior_minibatch"].shape == (1, 5000)
    corr = factor_correlations(truth, DirichletTuckerParams.from_inference_data(sem))
    assert min(corr.values()) >= 0.9, corr
    full = bam.infer(model, X, method="map", rng_key=0, **FIT)
    best = group(full, "sample_stats")["log_posterior"].values[0, -1]
    # Within 1% of the full-batch optimum (the minibatch noise is not annealed to zero).
    assert stats["final_log_posterior"].values[0] > best - 1e-2 * abs(best)


def test_stochastic_em_ignores_heldout_faces():
    _, X = planted()
    heldout = np.zeros(X.shape[:2], dtype=bool)
    heldout[::4, ::3] = True
    changed = X.copy()
    changed[heldout] = np.roll(X[heldout], 1, axis=-1)
    model = dirichlet_tucker(PLANTED_RANKS)
    fits = [bam.infer(model, d, method="sem", rng_key=2, num_iters=20, batch_size=16, heldout=heldout)
            for d in (X, changed)]
    np.testing.assert_array_equal(group(fits[0], "posterior")["core"].values,
                                  group(fits[1], "posterior")["core"].values)


# -- errors -----------------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors():
    _, X = planted()
    model = dirichlet_tucker(PLANTED_RANKS)
    unequal = X.copy()
    unequal[0, 0, 0, 0] += 1
    with pytest.raises(ValueError, match="same total C"):
        bam.infer(model, unequal, method="map")
    negative = X.copy()
    negative[0, 0, 0, 0] = -1
    with pytest.raises(ValueError, match="negative"):
        bam.infer(model, negative, method="map")
    for alpha in (1.0, 0.5, {"core": 0.9}):
        with pytest.raises(ValueError, match="mode"):
            bam.infer(dirichlet_tucker(PLANTED_RANKS, alpha=alpha), X, method="map")
    with pytest.raises(ValueError, match="4 axes|4-way"):
        bam.infer(model, X[..., 0], method="map")
    with pytest.raises(ValueError, match="heldout"):
        bam.infer(model, X, method="map", heldout=np.ones((30, 8), bool))
    with pytest.raises(ValueError, match="heldout must have shape"):
        bam.infer(model, X, method="map", heldout=np.zeros((8, 30), bool))
    with pytest.raises(TypeError, match="num_iters"):
        bam.infer(model, X, method="map", num_iters=2.5)
    with pytest.raises(ValueError, match="step_power"):
        bam.infer(model, X, method="sem", step_power=0.5)
    with pytest.raises(ValueError, match="batch_size"):
        bam.infer(model, X, method="sem", batch_size=1000)
    with pytest.raises(ValueError, match="ranks"):
        dirichlet_tucker((2, 2))
    with pytest.raises(ValueError, match="K_M"):
        dirichlet_tucker((0, 2, 2, 2))
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_tucker((2, 2, 2, 2), alpha=-1.0)
    with pytest.raises(ValueError, match="total"):
        model.sample(0, shape=(3, 2, 2, 2), total=-3)


def test_dispatch_prefers_the_dirichlet_tucker_backend():
    from bam_ppl.families.dirichlet_tucker.em import dirichlet_tucker_map
    from bam_ppl.infer.registry import find

    assert find("map", dirichlet_tucker(PLANTED_RANKS)).fn is dirichlet_tucker_map
    assert isinstance(dirichlet_tucker(PLANTED_RANKS), DirichletTuckerModel)
