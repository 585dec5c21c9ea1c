"""Pólya-urn SMC against exact enumeration, closed forms and known invariances (papers/000 §4.2)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from oracles import assert_errors_match_stated

import bam_ppl as bam
from bam_ppl.convert import attrs_of, group
from bam_ppl.data import CountTensor
from bam_ppl.infer.exact import exact_log_evidence, exact_posterior_mean
from bam_ppl.infer.smc import polya_urn as smc_module

# papers/000 §5.1.1 (notes/bam_digest.md §14).
X1 = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])
X2 = np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]])


@pytest.fixture(params=["jax", "numba"])
def kernel(request):
    """Both SMC kernels: the JAX core and the numba CPU kernel (lineage rows)."""
    return request.param


@pytest.fixture(params=["numba", pytest.param("jax", marks=[pytest.mark.slow, pytest.mark.stats])])
def exact_kernel(request):
    """The kernels for the checks against exact values: the numba kernel (what a CPU runs) in make
    test, the JAX kernel (what an accelerator runs; each case compiles a program of its own) in make
    test-stats. The JAX kernel meets an exact case in make test too (test_posterior_matches_...)."""
    return request.param


def smc_estimate(model, X, rng_key=0, **options):
    options = {"num_particles": 2000, "num_chains": 8, **options}
    return bam.log_evidence(model, X, method="smc", rng_key=rng_key, **options)


def assert_matches_exact(estimate, exact):
    tolerance = max(0.05, 3 * estimate.stderr)
    assert abs(estimate.value - exact) <= tolerance, (estimate, exact)


@functools.cache
def rank_two_case(name, a, kernel):
    """(estimate, exact) of NMF(2) on X1 or X2; cached, so that the per-case tests and the test of
    the stated errors across cases share their runs."""
    model, X = bam.models.nmf(2, a=a), {"X1": X1, "X2": X2}[name]
    return smc_estimate(model, X, engine=kernel), exact_log_evidence(model, X)


@pytest.mark.parametrize("name", ["X1", "X2"])
@pytest.mark.parametrize("a", [1e-3, 1.0, 10.0])
def test_nmf_matches_exact_rank_two(name, a, exact_kernel):
    assert_matches_exact(*rank_two_case(name, a, exact_kernel))


def test_stated_errors_match_the_errors_across_cases(exact_kernel):
    """Σ z² over the exact cases, z = (value − exact) / stderr, within both tails of the chi-square:
    errors are not larger than stated, and stated errors are not inflated."""
    cases = [rank_two_case(name, a, exact_kernel) for name in ("X1", "X2") for a in (1e-3, 1.0, 10.0)]
    cases += [other_case(name, exact_kernel) for name in sorted(OTHER_MODELS)]
    assert_errors_match_stated([e.value for e, _ in cases], [e.stderr for e, _ in cases], [x for _, x in cases])


@pytest.mark.slow
@pytest.mark.stats
@pytest.mark.parametrize("name, X", [("X1", X1), ("X2", X2)])
@pytest.mark.parametrize("a", [1e-3, 1.0, 10.0])
@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_nmf_matches_exact_all_ranks(name, X, a, rank):
    model = bam.models.nmf(rank, a=a)
    assert_matches_exact(smc_estimate(model, X), exact_log_evidence(model, X))


def test_reference_values_of_the_paper():
    # Exact values of notes/bam_digest.md §14 (X(1), a = 1): the SMC reproduces them.
    for rank, reference in [(2, -19.811), (3, -20.093)]:
        estimate = smc_estimate(bam.models.nmf(rank, a=1.0), X1)
        assert abs(estimate.value - reference) <= max(0.05, 3 * estimate.stderr)


RNG = np.random.default_rng(7)
OTHER_MODELS = {
    "nmf_random": (bam.models.nmf(2, a=0.5), RNG.integers(0, 3, (3, 3))),
    "cp_random": (bam.models.cp(2, a=1.0), RNG.integers(0, 2, (2, 3, 2))),
    "tucker": (bam.models.tucker((2, 2), a=1.0), np.array([[2, 0, 1], [0, 1, 1]])),
    "symmetric_nmf_tied": (bam.models.symmetric_nmf(2, a=0.5), np.array([[2, 1, 0], [1, 0, 1], [0, 1, 2]])),
    "lda_conditioned": (bam.models.lda(2, a=1.0), np.array([[2, 1, 0], [0, 1, 2]])),
    "explicit_priors": (
        bam.AllocationModel("k -> i; k -> j", latent={"k": 2}, a=1.0, b=0.3, priors={"i": 0.7, "k": 0.2}),
        np.array([[2, 1], [0, 3]]),
    ),
    "missing_entries": (
        bam.models.cp(2, a=1.0),
        CountTensor.from_samples(
            np.array([[0, 1, 0], [1, -1, 0], [0, 0, -1], [1, 1, 1], [-1, 0, 1], [0, 1, 0]]), shape=(2, 2, 2)
        ),
    ),
}


@functools.cache
def other_case(name, kernel):
    model, X = OTHER_MODELS[name]
    return smc_estimate(model, X, engine=kernel), exact_log_evidence(model, X)


@pytest.mark.parametrize("name", sorted(OTHER_MODELS))
def test_other_models_match_exact(name, exact_kernel):
    assert_matches_exact(*other_case(name, exact_kernel))


@pytest.mark.parametrize("model", [bam.models.complete_graph(3, a=1.0), bam.models.independence(3, a=2.0)],
                         ids=["complete", "independence"])
def test_latent_free_models_equal_closed_form(model, exact_kernel):
    X = np.random.default_rng(3).integers(0, 5, (2, 3, 2))
    estimate = smc_estimate(model, X, num_particles=10, num_chains=2, engine=exact_kernel)
    assert abs(estimate.value - exact_log_evidence(model, X)) < 1e-8


def test_markov_equivalent_structures_agree():
    # k -> i; k -> j and i -> k -> j are Markov equivalent: same evidence under BDeu (Remark 3.2).
    X = np.array([[3, 1, 0], [0, 2, 2]])
    star = bam.AllocationModel("k -> i; k -> j", latent={"k": 3}, observed=("i", "j"), a=1.0)
    chain = bam.AllocationModel("i -> k; k -> j", latent={"k": 3}, observed=("i", "j"), a=1.0)
    assert exact_log_evidence(star, X) == pytest.approx(exact_log_evidence(chain, X), abs=1e-9)
    first, second = smc_estimate(star, X, rng_key=1), smc_estimate(chain, X, rng_key=2)
    combined = np.hypot(first.stderr, second.stderr)
    assert abs(first.value - second.value) <= max(0.05, 3 * combined)


def test_plain_sis_is_unbiased(exact_kernel):
    # Without resampling every run is an unbiased estimate of L_X: the natural-scale mean of many
    # independent runs matches the exact evidence within its Monte Carlo error.
    model, X = bam.models.nmf(2, a=1.0), np.array([[2, 1], [0, 2]])
    result = smc_module.run_smc(model, X, 5, num_particles=4, num_chains=4000, ess_threshold=0.0, engine=exact_kernel)
    assert not result.resampled.any()
    ratios = np.exp(result.chain_log_evidence - exact_log_evidence(model, X))
    assert abs(ratios.mean() - 1.0) <= 3 * ratios.std(ddof=1) / np.sqrt(ratios.size)


def test_posterior_matches_exact_expected_counts(kernel):
    # Label-invariant statistic: the visible node's marginal counts, which are random only through
    # the missing entries (free visible indices).
    model, X = OTHER_MODELS["missing_entries"]
    bound = model.bind(X)
    start = bound.table_starts[[t.name for t in bound.tables].index("i")]
    table_i = next(t for t in bound.tables if t.name == "i")

    def marginal(flat):
        return flat[:, start:start + table_i.size].reshape(-1, *table_i.shape).sum(1)

    exact = exact_posterior_mean(model, X, marginal)
    result = smc_module.run_smc(model, X, 3, num_particles=2000, num_chains=8, engine=kernel)
    per_chain = marginal(result.counts.reshape(-1, result.counts.shape[-1])).reshape(8, 2000, -1).mean(1)
    error = per_chain.std(0, ddof=1) / np.sqrt(8)
    assert np.all(np.abs(per_chain.mean(0) - exact) <= np.maximum(4 * error, 0.02))


def test_inference_data_layout():
    model = bam.models.nmf(2, a=1.0)
    idata = bam.infer(model, X1, method="smc", rng_key=0, num_particles=50, num_chains=3)
    posterior, stats = group(idata, "posterior"), group(idata, "sample_stats")
    assert posterior["theta_i"].dims == ("chain", "draw", "k", "i")
    assert posterior["theta_i"].shape == (3, 50, 2, 3)
    np.testing.assert_allclose(posterior["theta_j"].sum("j"), 1.0, rtol=1e-9)
    assert (posterior["total_rate"] > 0).all()
    assert stats["log_marginal_likelihood"].dims == ("chain",)
    assert stats["ess"].dims == ("chain", "token") and stats["ess"].shape == (3, X1.sum())
    assert stats["resampled"].dtype == bool
    best_root = stats["best_particle_counts_k"]
    assert best_root.dims == ("chain", "k") and (best_root.sum("k") == X1.sum()).all()
    np.testing.assert_array_equal(stats["best_particle_counts_i"].sum("k"), np.tile(X1.sum(1), (3, 1)))
    attrs = attrs_of(idata)
    assert attrs["method"] == "smc" and attrs["num_particles"] == 50


def test_same_key_same_result_and_no_retracing(kernel):
    model = bam.models.nmf(2, a=1.0)
    options = dict(method="smc", num_particles=64, num_chains=2, engine=kernel)
    first = bam.log_evidence(model, X1, rng_key=11, **options)
    traced = smc_module.run_tokens._cache_size()
    again = bam.log_evidence(model, X1, rng_key=11, **options)
    other_values = X1[::-1].copy()  # same shapes, other counts: no new compilation
    bam.log_evidence(model, other_values, rng_key=12, **options)
    assert smc_module.run_tokens._cache_size() == traced
    assert again.details["chain_log_evidence"] == first.details["chain_log_evidence"]
    import jax

    with_jax_key = bam.log_evidence(model, X1, rng_key=jax.random.key(11), **options)
    assert with_jax_key.details["chain_log_evidence"] == first.details["chain_log_evidence"]


def test_compare_table_ranks_models():
    models = {f"K={k}": bam.models.nmf(k, a=1.0) for k in (1, 2)}
    table = bam.compare(models, X2, method="smc", num_particles=500, num_chains=4)
    assert list(table.index) == ["K=2", "K=1"]
    assert set(table["kind"]) == {"estimate"}
    assert table["prob"].sum() == pytest.approx(1.0)


def test_rescaled_probability_products_give_the_same_estimate(monkeypatch, kernel):
    # With extreme concentrations the per-token product over members is rescaled after every
    # member; forcing that path on ordinary data must leave the estimate unchanged.
    model, X = OTHER_MODELS["tucker"]
    plain = smc_module.run_smc(model, X, 6, num_particles=64, num_chains=2, engine=kernel)
    assert smc_module.rescale_interval(model.bind(X), int(X.sum())) == len(model.bind(X).members)
    monkeypatch.setattr(smc_module, "rescale_interval", lambda bound, num_tokens: 1)
    rescaled = smc_module.run_smc(model, X, 6, num_particles=64, num_chains=2, engine=kernel)
    np.testing.assert_allclose(rescaled.chain_log_evidence, plain.chain_log_evidence, rtol=0, atol=1e-9)


def test_tiny_concentrations_match_exact(exact_kernel):
    # a = 1e-150: the product of a token's factors would underflow without rescaling.
    model = bam.models.nmf(2, a=1e-150)
    assert smc_module.rescale_interval(model.bind(X2), int(X2.sum())) < len(model.bind(X2).members)
    estimate = smc_estimate(model, X2, num_particles=500, num_chains=4, engine=exact_kernel)
    assert_matches_exact(estimate, exact_log_evidence(model, X2))


def test_progress_bar_blocks_give_the_same_estimate(kernel):
    # The bar splits the scan into blocks of tokens; the random stream does not depend on it.
    model, X = bam.models.nmf(2, a=1.0), np.array([[200, 100], [50, 3]])
    options = dict(num_particles=16, num_chains=2, engine=kernel)
    quiet = smc_module.run_smc(model, X, 4, progress_bar=False, **options)
    shown = smc_module.run_smc(model, X, 4, progress_bar=True, **options)
    np.testing.assert_allclose(quiet.chain_log_evidence, shown.chain_log_evidence, rtol=0, atol=1e-9)


@pytest.mark.parametrize("options, error, match", [
    (dict(num_particles=0), ValueError, "num_particles"),
    (dict(num_particles=2.5), TypeError, "num_particles"),
    (dict(num_chains=0), ValueError, "num_chains"),
    (dict(ess_threshold=1.5), ValueError, "ess_threshold"),
    (dict(ess_threshold="half"), TypeError, "ess_threshold"),
    (dict(resampling="lottery"), ValueError, "resampling"),
    (dict(progress_bar="yes"), TypeError, "progress_bar"),
    (dict(rng_key=-1), ValueError, "rng_key"),
    (dict(rng_key="seed"), TypeError, "rng_key"),
    (dict(max_configs=2), ValueError, "max_configs"),
    (dict(engine="cuda"), ValueError, "engine"),
])
def test_bad_options_raise_before_compiling(options, error, match):
    before = smc_module.run_tokens._cache_size()
    with pytest.raises(error, match=match):
        bam.log_evidence(bam.models.nmf(3), X1, method="smc", **options)
    assert smc_module.run_tokens._cache_size() == before


def test_bad_data_raise():
    with pytest.raises(ValueError, match="T = 0"):
        bam.log_evidence(bam.models.nmf(2, b=1.0), np.zeros((2, 2)), method="smc")
    with pytest.raises(ValueError, match="negative"):
        bam.log_evidence(bam.models.nmf(2), np.array([[1, -1]]), method="smc")
    with pytest.raises(ValueError, match="axes"):
        bam.log_evidence(bam.models.cp(2), X1, method="smc")


@pytest.mark.slow
@pytest.mark.stats
@pytest.mark.parametrize("resampling", ["systematic", "stratified", "multinomial", "residual"])
def test_every_resampling_scheme_matches_exact(resampling, kernel):
    model = bam.models.nmf(2, a=1.0)
    estimate = smc_estimate(model, X1, resampling=resampling, engine=kernel)
    assert_matches_exact(estimate, exact_log_evidence(model, X1))


@pytest.mark.parametrize("name", ["symmetric_nmf_tied", "missing_entries", "tucker"])
def test_best_particle_log_prob_is_the_urn_probability(name, kernel):
    # Each particle's log urn probability is accumulated token by token (eq. 4.1); by
    # exchangeability it equals Σ_tables Σ lnΓ(α + S) − lnΓ(α) − Σ_columns lnΓ(α_c + S_c) − lnΓ(α_c).
    from scipy.special import gammaln

    model, X = OTHER_MODELS[name]
    bound = model.bind(model.as_data(X))
    # The particles and chains of test_rescaled_probability_products_...: the Tucker case reuses its program.
    result = smc_module.run_smc(model, X, 2, num_particles=64, num_chains=2, engine=kernel)
    for counts, log_prob in zip(result.best_counts, result.best_log_prob):
        closed_form = 0.0
        for table in bound.tables:
            S = bound.split_flat(counts)[table.name]
            alpha = table.concentration
            closed_form += np.sum(gammaln(alpha + S) - gammaln(alpha))
            closed_form -= np.sum(gammaln(alpha.sum(-1) + S.sum(-1)) - gammaln(alpha.sum(-1)))
        assert log_prob == pytest.approx(closed_form, abs=1e-9)
    assert result.counts.shape[:2] == (2, 64)
    evidence_only = smc_module.run_smc(model, X, 2, num_particles=64, num_chains=2, keep_particles=False,
                                       engine=kernel)
    assert evidence_only.counts is None
    np.testing.assert_array_equal(evidence_only.chain_log_evidence, result.chain_log_evidence)


def test_configuration_draw_is_the_exact_inverse_cdf():
    # Cumulative masses [0, 3, 3, 4, 8, 8] of 8: level u · 8 picks the first l with mass above
    # it; configurations of probability zero are never drawn, even at levels on a boundary.
    import jax
    import jax.numpy as jnp

    probabilities = np.array([0.0, 3.0, 0.0, 1.0, 4.0, 0.0])
    uniforms = np.arange(64) / 64.0
    with jax.enable_x64(True):
        columns = jnp.asarray(np.tile(probabilities[:, None] * 2.0**-40, (1, uniforms.size)))
        chosen = np.asarray(smc_module._draw_configuration(columns, jnp.asarray(uniforms)))
        empty = smc_module._draw_configuration(jnp.zeros((6, 2)), jnp.asarray([0.0, 0.5]))
    cumulative = np.cumsum(probabilities)
    expected = [int(np.argmax(cumulative > u * cumulative[-1])) for u in uniforms]
    np.testing.assert_array_equal(chosen, expected)
    assert set(chosen) == {1, 3, 4}
    np.testing.assert_array_equal(empty, [0, 0])
    # Many configurations over 60 orders of magnitude, a third of them impossible.
    rng = np.random.default_rng(3)
    probabilities = rng.random((100, 500)) * 10.0 ** rng.integers(-30, 30, (100, 500))
    probabilities[rng.random((100, 500)) < 0.3] = 0.0
    uniforms = rng.random(500)
    with jax.enable_x64(True):
        chosen = np.asarray(smc_module._draw_configuration(jnp.asarray(probabilities), jnp.asarray(uniforms)))
    particles = np.arange(500)
    assert np.all(probabilities[chosen, particles] > 0)
    cumulative = np.cumsum(probabilities, axis=0)
    level = uniforms * cumulative[-1]
    before = np.where(chosen > 0, cumulative[chosen - 1, particles], 0.0)
    assert np.all(before <= level * (1 + 1e-12)) and np.all(cumulative[chosen, particles] >= level * (1 - 1e-12))


def test_numba_lineage_rows_equal_copying_at_every_resampling(monkeypatch):
    # The numba kernel reads rows through the ancestor maps of the generation that wrote them and
    # re-indexes every LINEAGE_DEPTH resamplings; a depth of 1 re-indexes at every resampling,
    # i.e. copies the particles' counts as the JAX kernel does. Same draws, same results.
    from bam_ppl.infer.smc import polya_urn_numba as smc_numba

    model, X = bam.models.cp(3, a=2.0), np.random.default_rng(5).integers(0, 3, (4, 5, 3))
    options = dict(num_particles=40, num_chains=2, engine="numba")
    monkeypatch.setattr(smc_numba, "LINEAGE_DEPTH", 3)
    lazy = smc_module.run_smc(model, X, 8, **options)
    assert lazy.resampled.sum(axis=1).min() > 2 * smc_numba.LINEAGE_DEPTH  # rows several generations old
    monkeypatch.setattr(smc_numba, "LINEAGE_DEPTH", 1)
    eager = smc_module.run_smc(model, X, 8, **options)
    np.testing.assert_array_equal(lazy.resampled, eager.resampled)
    np.testing.assert_allclose(lazy.chain_log_evidence, eager.chain_log_evidence, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(lazy.counts, eager.counts)
    np.testing.assert_array_equal(lazy.best_counts, eager.best_counts)


@pytest.mark.parametrize("resampling", ["systematic", "stratified", "multinomial", "residual"])
def test_numba_resampling_schemes_copy_each_particle_in_proportion(resampling):
    from bam_ppl.infer.smc import polya_urn_numba as smc_numba

    weights = np.array([0.05, 0.0, 0.4, 0.15, 0.3, 0.1])
    rng = np.random.default_rng(0)
    ancestors, scratch = np.empty(6, np.int64), np.empty(6)
    offspring = []
    for _ in range(4000):
        smc_numba._resample(rng, smc_numba.SCHEMES.index(resampling), weights, ancestors, scratch)
        offspring.append(np.bincount(ancestors, minlength=6))
    offspring = np.array(offspring)
    error = offspring.std(0, ddof=1) / np.sqrt(offspring.shape[0])
    assert np.all(np.abs(offspring.mean(0) - 6 * weights) <= 4 * error + 1e-12)
    assert offspring[:, 1].max() == 0  # a particle of weight zero is never copied


def test_numba_counts_beyond_16_bits():
    # The numba kernel stores counts in 16 bits up to 32 767 tokens and in 32 bits above; with a
    # single latent class the urn is deterministic and the estimate exact.
    model, X = bam.models.nmf(1, a=1.0), np.array([[20_000, 15_000], [0, 5_000]])
    estimate = smc_estimate(model, X, num_particles=4, num_chains=1, engine="numba")
    assert estimate.value == pytest.approx(exact_log_evidence(model, X), abs=1e-6)
    result = smc_module.run_smc(model, X, 0, num_particles=4, num_chains=1, engine="numba")
    assert result.best_counts.max() == 40_000


def test_a_filter_that_misses_the_mass_of_a_sparse_prior_is_caught_by_the_vb_bound():
    # Two clusters under the Dirichlet(1e-6) prior on the mixing weights of pmf_tensor: the urn opens the
    # second component with vanishing probability, so every run agrees on a value far below the exact one.
    X = np.array([[0, 0, 0]] * 30 + [[1, 1, 1]] * 30)
    model = bam.models.pmf_tensor(2)
    exact = exact_log_evidence(model, X)
    with pytest.warns(bam.EvidenceWarning, match=r"below the sure lower bound .*\(the VB bound"):
        est = bam.log_evidence(model, X, method="smc", num_particles=200)
    assert est.value < exact - 10 and est.info.vb_bound <= exact  # the bound stays below the exact value
    assert est.details["vb_bound"] == est.info.vb_bound
    blind = bam.log_evidence(model, X, method="smc", num_particles=200, vb_restarts=0)
    assert blind.info.vb_bound == -np.inf and blind.value == est.value  # the restarts draw from a stream of their own
    with pytest.raises(ValueError, match="vb_restarts"):
        bam.log_evidence(model, X, method="smc", vb_restarts=-1)
