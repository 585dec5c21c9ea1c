"""Chib-style evidence estimate (method="chib"): exact on tiny cases, a proper transition kernel,
label symmetries, the sure lower bound, option checks, and a realistic size (slow)."""

import functools
import itertools
import warnings

import jax
import numpy as np
import pytest
from conftest import X1, X2
from oracles import assert_errors_match_stated
from scipy.special import gammaln, logsumexp

import bam_ppl as bam
from bam_ppl.data import CountTensor
from bam_ppl.infer.gibbs import chib, chib_numba
from bam_ppl.infer.gibbs import collapsed as gibbs
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.smc import symmetry
from bam_ppl.types import numpy_generator

pytestmark = pytest.mark.skipif(not chib.HAVE_NUMBA, reason="method='chib' needs numba")

RNG = np.random.default_rng(3)
CASES = {
    "nmf_X1_K2": (bam.models.nmf(2, a=1.0), X1),
    "nmf_X1_K3": (bam.models.nmf(3, a=1.0), X1),
    "nmf_X2_K2": (bam.models.nmf(2, a=1.0), X2),  # two blocks: two label-switched modes
    "nmf_X2_K3_small_a": (bam.models.nmf(3, a=0.1), X2),
    "cp": (bam.models.cp(2, a=1.0), RNG.integers(0, 2, (2, 3, 2))),
    "lda_conditioned": (bam.models.lda(2, a=1.0), np.array([[2, 1, 0], [0, 1, 2]])),
    "symmetric_nmf_tied": (bam.models.symmetric_nmf(2, a=0.5), np.array([[2, 1, 0], [1, 0, 1], [0, 1, 2]])),
    "tucker": (bam.models.tucker((2, 2), a=1.0), np.array([[2, 0, 1], [0, 1, 1]])),
    "missing_entries": (
        bam.models.cp(2, a=1.0),
        CountTensor.from_samples(
            np.array([[0, 1, 0], [1, -1, 0], [0, 0, -1], [1, 1, 1], [-1, 0, 1], [0, 1, 0]]), shape=(2, 2, 2)),
    ),
}
FAST = dict(num_chains=8, num_search_sweeps=50, num_samples=300)
EXTRA = {"nmf_X2_K3_small_a": dict(num_samples=1000)}  # sticky (a = 0.1): heavier tails


def chib_estimate(model, X, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.evidence.EvidenceWarning)
        return bam.log_evidence(model, X, method="chib", **{**FAST, **options})


@functools.cache
def exact_case(name):
    """(estimate, exact) of one case; cached, so that the per-case tests and the test of the stated
    errors across cases share their runs."""
    model, X = CASES[name]
    return chib_estimate(model, X, rng_key=1, **EXTRA.get(name, {})), bam.log_evidence(model, X, method="exact").value


def test_stated_errors_match_the_errors_across_cases():
    """Σ z² over the exact cases within both tails of the chi-square: errors not larger than
    stated (after the log scale's Jensen allowance of 0.06 nats), stated errors not inflated."""
    cases = [exact_case(name) for name in sorted(CASES)]
    assert_errors_match_stated([e.value for e, _ in cases], [e.stderr for e, _ in cases], [x for _, x in cases],
                               bias=0.06)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_exact_enumeration(name):
    est, exact = exact_case(name)
    assert est.method == "chib" and est.kind == "estimate"
    assert len(est.details["run_log_evidence"]) == FAST["num_chains"]
    assert np.isfinite(est.stderr) and est.stderr >= 0
    # Unbiased for p(X); on the log scale a few hundredths low (Jensen, heavy right tail).
    assert abs(est.value - exact) <= 0.06 + 3 * est.stderr, (est, exact)
    assert est.details["lower_bound"] <= exact + 1e-9
    assert max(est.details["log_joint_star"]) <= est.details["lower_bound"] + 1e-9  # log p(X, z*) ≤ log π(S*)


def problem_of(model, X):
    data, bound, layout, _ = prepare(model, X)
    return chib._Problem(bound, data, layout, True, symmetry.MAX_RELABELLINGS), data, bound, layout


def state_of(problem, config):
    """(shifted counts, config) of a token labelling."""
    config = np.asarray(config, np.int32)
    return problem.shifted_counts(config), config


def all_labellings(problem):
    valid = problem.structure.valid
    cells = problem.structure.token_cell
    choices = [np.flatnonzero(valid[cell]) if problem.structure.has_valid else range(problem.num_configs)
               for cell in cells]
    return [np.array(z, np.int32) for z in itertools.product(*choices)]


@pytest.mark.parametrize("name", ["nmf_small", "symmetric_nmf_tied", "missing_small"])
def test_transition_probabilities_form_a_stationary_kernel(name):
    model, X = {
        "nmf_small": (bam.models.nmf(2, a=1.0), np.array([[2, 1], [0, 1]])),
        "symmetric_nmf_tied": (bam.models.symmetric_nmf(2, a=0.5), np.array([[1, 1], [0, 1]])),
        "missing_small": (bam.models.cp(2, a=1.0),
                          CountTensor.from_samples(np.array([[0, 1, 0], [1, -1, 0], [0, 0, -1]]), shape=(2, 2, 2))),
    }[name]
    problem, data, bound, layout = problem_of(model, X)
    labellings = all_labellings(problem)
    identity = np.arange(problem.num_configs)
    log_joint = np.array([problem.log_joint(state_of(problem, z)[0]) for z in labellings])
    # Σ_z p(X, z) over token labellings is the evidence.
    assert logsumexp(log_joint) == pytest.approx(bam.log_evidence(model, X, method="exact").value, abs=1e-9)
    posterior = np.exp(log_joint - logsumexp(log_joint))
    kernel = np.empty((len(labellings), len(labellings)))
    for i, z in enumerate(labellings):
        shifted, config = state_of(problem, z)
        before = shifted.copy()
        for j, target in enumerate(labellings):
            kernel[i, j] = np.exp(chib_numba._log_transition(shifted, config, target, identity, -np.inf,
                                                           problem.structure, problem.fast)[0])
        np.testing.assert_allclose(shifted, before, atol=1e-9)  # the state is restored
    np.testing.assert_allclose(kernel.sum(axis=1), 1.0, atol=1e-12)  # a distribution over z*
    np.testing.assert_allclose(posterior @ kernel, posterior, atol=1e-12)  # p(z | X) is stationary


@pytest.mark.parametrize("model", [bam.models.cp(4, a=0.5), bam.models.tucker((2, 3, 2), a=1.0)],
                         ids=["cp4", "tucker"])
def test_relabelling_average_resumes_shared_prefixes_exactly(model):
    # The sweeps of the relabellings resume from the prefix they share with the one before: the
    # average equals the one of independent sweeps from z, and the state is left as it was.
    X = np.random.default_rng(4).integers(0, 3, (3, 3, 2))
    problem = problem_of(model, X)[0]
    assert problem.relabellings.shape[0] > 6 and not problem.structure.has_valid
    rng = np.random.default_rng(0)
    num_tokens = problem.structure.token_cell.size
    for _ in range(5):
        star = rng.integers(0, problem.num_configs, num_tokens).astype(np.int32)
        star[: num_tokens // 2] = star[0]  # a large class, as a searched z* has
        z = rng.integers(0, problem.num_configs, num_tokens).astype(np.int32)
        shifted, config = state_of(problem, z)
        one_by_one = [chib_numba._log_transition(shifted, config, star, relabel, -np.inf, problem.structure,
                                           problem.fast)[0] for relabel in problem.relabellings]
        expected = logsumexp(one_by_one) - np.log(len(one_by_one))
        before = shifted.copy()
        ordered = chib._ordered_relabellings(problem.relabellings, star)
        value, best = chib_numba._transition_into_star(shifted, config, star, ordered, -np.inf, problem.structure,
                                                 problem.fast)
        assert value == pytest.approx(expected, abs=1e-9)
        assert best == pytest.approx(max(one_by_one), abs=1e-9)
        np.testing.assert_allclose(shifted, before, atol=1e-9)


@pytest.mark.parametrize("model", [bam.models.nmf(3, a=1.0), bam.models.cp(2, a=0.5)], ids=["nmf", "cp"])
def test_factorised_rows_give_the_same_estimate_as_the_general_kernel(model, monkeypatch):
    # The fast reading of the rows (every token's own entries, TokenRows) draws and sums as
    # the general kernel does: with it and without it the same key gives the same runs.
    X = np.random.default_rng(3).integers(0, 4, (5, 6) if model.latent == {"k": 3} else (3, 4, 3))
    assert problem_of(model, X)[0].fast.usable
    options = dict(rng_key=2, num_chains=2, num_searches=2, num_search_sweeps=30, num_samples=20)
    fast = bam.log_evidence(model, X, method="chib", **options)
    monkeypatch.setattr(chib, "MAX_TOKEN_ROW_ENTRIES", 0)
    assert not problem_of(model, X)[0].fast.usable
    general = bam.log_evidence(model, X, method="chib", **options)
    np.testing.assert_allclose(fast.details["run_log_evidence"], general.details["run_log_evidence"], rtol=1e-12)
    np.testing.assert_allclose(fast.details["search_log_joint"], general.details["search_log_joint"], rtol=1e-12)


def test_log_joint_matches_the_gibbs_sampler_and_the_closed_form():
    model, X = bam.models.lda(2, a=0.7), np.array([[2, 1, 0], [0, 1, 3]])
    problem, data, bound, layout = problem_of(model, X)
    spec, gproblem = gibbs.build_problem(bound, data, layout, token_order="fixed")
    config = numpy_generator(0).integers(0, problem.num_configs, problem.num_tokens).astype(np.int32)
    shifted, config = state_of(problem, config)
    counts = np.rint(shifted - problem.concentration).astype(np.int32)
    with jax.enable_x64(True):
        gibbs_value = float(gibbs.log_joint(spec, gproblem, gibbs.GibbsState(config, counts)))
    # log π(S) with its multinomial coefficient is the Gibbs sampler's log joint ...
    assert problem.log_prob_allocation(shifted, config) == pytest.approx(gibbs_value, abs=1e-9)
    # ... and log p(X, z) = C + Σ_tables [log B(α + S) − log B(α)] differs by the coefficient.
    groups = np.bincount(problem.structure.token_cell * problem.num_configs + config)
    coefficient = gammaln(data.counts + 1.0).sum() - gammaln(groups + 1.0).sum()
    assert problem.log_joint(shifted) == pytest.approx(gibbs_value - coefficient, abs=1e-9)
    assert problem.constant == bound.log_data_constant(data)


def test_label_symmetries():
    for model, X, expected in [
        (bam.models.nmf(3, a=1.0), X1, 6),
        (bam.models.tucker((2, 2), a=1.0), np.array([[2, 0, 1], [0, 1, 1]]), 4),
        (bam.models.symmetric_nmf(2, a=0.5), np.array([[1, 1], [0, 1]]), 2),
        (bam.models.complete_graph(2, a=1.0), X1, 1),  # no latent node
    ]:
        problem = problem_of(model, X)[0]
        relabellings = problem.relabellings
        assert relabellings.shape == (expected, problem.num_configs)
        np.testing.assert_array_equal(relabellings[0], np.arange(problem.num_configs))
        assert len({tuple(r) for r in relabellings}) == expected
        for relabel in relabellings:  # each leaves p(X, z) unchanged
            z = numpy_generator(1).integers(0, problem.num_configs, problem.num_tokens)
            assert problem.log_joint(state_of(problem, relabel[z])[0]) == pytest.approx(
                problem.log_joint(state_of(problem, z)[0]), abs=1e-9)


def test_asymmetric_concentrations_are_not_symmetries():
    model, X = bam.models.nmf(3, a=1.0), X1
    problem, data, bound, layout = problem_of(model, X)
    concentration = problem.concentration.copy()
    concentration[0] *= 2.0  # α of p(k = 0) no longer equal to the others
    relabellings = symmetry.label_symmetries(bound, layout, problem.structure, concentration, problem.fixed_counts,
                                             problem.num_entries, symmetry.MAX_RELABELLINGS)
    assert relabellings.shape == (1, problem.num_configs)
    swap = next(r for r in problem.relabellings if r[0] != 0)  # moves k = 0
    assert symmetry.relabelling_is_symmetry(swap, problem.structure, problem.concentration, problem.fixed_counts,
                                            problem.num_entries)
    assert not symmetry.relabelling_is_symmetry(swap, problem.structure, concentration, problem.fixed_counts,
                                                problem.num_entries)


def test_too_many_symmetries_warn_and_are_not_averaged(monkeypatch):
    monkeypatch.setattr(symmetry, "MAX_RELABELLINGS", 5)
    with pytest.warns(UserWarning, match="symmetries"):
        est = chib_estimate(bam.models.nmf(3, a=1.0), X1, num_chains=2, num_samples=20)
    assert est.details["num_relabellings"] == 1


def test_model_without_free_nodes_is_exact():
    model = bam.models.complete_graph(2, a=1.0)
    est = chib_estimate(model, X1, num_chains=2, num_samples=5)
    assert est.value == pytest.approx(bam.log_evidence(model, X1, method="exact").value, abs=1e-9)
    assert est.stderr == pytest.approx(0.0, abs=1e-9)


def test_without_label_symmetry_two_modes_cost_log_two():
    # X2 has two blocks: at K = 2 the posterior has two label-switched modes the chain never
    # crosses; without averaging over relabellings the estimate falls short by log 2.
    model = bam.models.nmf(2, a=1.0)
    exact = bam.log_evidence(model, X2, method="exact").value
    plain = chib_estimate(model, X2, rng_key=0, label_symmetry=False)
    assert plain.details["num_relabellings"] == 1
    assert plain.value == pytest.approx(exact - np.log(2), abs=0.05)
    symmetric = chib_estimate(model, X2, rng_key=0)
    assert symmetric.details["num_relabellings"] == 2
    assert symmetric.value == pytest.approx(exact, abs=0.05)


def test_same_key_same_result_and_details():
    model, X = CASES["nmf_X1_K2"]
    a = chib_estimate(model, X, rng_key=5, num_chains=3, num_samples=50)
    b = chib_estimate(model, X, rng_key=5, num_chains=3, num_samples=50)
    assert a.details["run_log_evidence"] == b.details["run_log_evidence"]
    assert a.details["num_steps"] == 50 and a.details["num_warmup"] == FAST["num_search_sweeps"]
    assert len(a.details["search_log_joint"]) == chib.DEFAULT_NUM_SEARCHES
    assert len(a.details["log_posterior_star"]) == 3
    assert max(a.details["log_joint_star"]) == max(a.details["search_log_joint"])
    assert len(a.details["log_joint_star"]) == 3  # one z* per run
    one = chib_estimate(model, X, rng_key=5, num_chains=1, num_samples=50)
    assert np.isnan(one.stderr) and np.isfinite(one.value)
    default = chib_estimate(model, X, rng_key=5, num_chains=2, num_samples=50, num_search_sweeps=None)
    assert default.details["num_warmup"] == chib.DEFAULT_NUM_WARMUP  # two sweeps per token, at least 2000


@pytest.mark.parametrize("options, error", [
    (dict(num_chains=0), ValueError),
    (dict(num_chains=2.0), TypeError),
    (dict(num_searches=0), ValueError),
    (dict(num_searches=None), TypeError),
    (dict(num_search_sweeps=-1), ValueError),
    (dict(num_search_sweeps=10.0), TypeError),
    (dict(num_samples=0), ValueError),
    (dict(num_samples="10"), TypeError),
    (dict(engine="jax"), ValueError),
    (dict(engine="gpu"), ValueError),
    (dict(engine=1), TypeError),
    (dict(max_configs=0), ValueError),
    (dict(label_symmetry="yes"), TypeError),
    (dict(progress_bar=1), TypeError),
    (dict(rng_key="seven"), TypeError),
])
def test_bad_options_raise(options, error):
    with pytest.raises(error, match=next(iter(options))):
        bam.log_evidence(bam.models.nmf(2), X1, method="chib", **options)


def test_bad_data_and_model_raise():
    with pytest.raises(ValueError, match="no tokens"):
        bam.log_evidence(bam.models.nmf(2), np.zeros((2, 2), int), method="chib")
    with pytest.raises(ValueError, match="max_configs"):
        bam.log_evidence(bam.models.nmf(5), X1, method="chib", max_configs=4)
    with pytest.raises(TypeError, match="evidence method 'chib' accepts .*, not object"):
        bam.log_evidence(object(), X1, method="chib")


@pytest.mark.slow
@pytest.mark.stats
def test_realistic_size_beats_the_variational_bound():
    # NMF(4), a = 1, on a 50 × 70 matrix of T = 1000 tokens drawn from the prior with a = 200.
    X = bam.models.nmf(4, a=200).sample(jax.random.key(0), shape=(50, 70), total=1000)[1]
    model = bam.models.nmf(4, a=1.0)
    vb = bam.log_evidence(model, X, method="vb", num_moves=0).value  # the restarts' bound, without moves
    estimates = [chib_estimate(model, X, rng_key=k, num_search_sweeps=None, num_samples=1000, num_chains=4)
                 for k in range(3)]
    values = np.array([e.value for e in estimates])
    stderrs = np.array([e.stderr for e in estimates])
    for e in estimates:
        assert e.value > vb + 100  # far above the mean-field bound
        assert e.value >= e.details["lower_bound"]  # above the sure bound
        assert e.details["num_relabellings"] == 24
    # Independent estimates agree within their stated errors, and the errors are not inflated
    # (0.5 nats: the spread three calls can miss).
    assert values.max() - values.min() <= 4 * np.sqrt(np.sum(stderrs**2)) + 0.5
    assert stderrs.mean() <= 2 * values.std(ddof=1) + 0.5


def test_sure_bound_keeps_a_start_that_iterated_conditional_modes_lowers():
    # Cells of many tokens (Caithness hair and eye colours, an eighth of the counts): ICM climbs p(X, z) of one
    # labelling, which splits a cell's tokens unevenly, while π(S) counts every labelling of S. The sure bound keeps
    # the started allocation (the default's best), and Chib's value, far below it on such cells, warns.
    model = bam.models.nmf(2, a=1.0)
    X = np.array([[326, 38, 241, 110, 3], [688, 116, 584, 188, 4], [343, 84, 909, 412, 26],
                  [98, 48, 403, 681, 85]]) // 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.evidence.EvidenceWarning)
        # a short search (a quarter of the default's, rho and particles given) whose best allocation ICM lowers
        best = bam.log_evidence(model, X, rng_key=0, effort=0.25, rho=0.97, num_particles=25)
    start = (best.details["best_cells"], best.details["best_counts"])
    with pytest.warns(bam.evidence.EvidenceWarning, match="below the sure lower bound"):
        est = bam.log_evidence(model, X, method="chib", rng_key=0, num_chains=2, num_searches=1, num_search_sweeps=0,
                               num_samples=50, start=start)
    assert est.lower_bound >= model.bind(X).log_prob_cells(*start) - 1e-9
