"""Tempered SMC over token allocations: exact on tiny data, unbiased with a fixed schedule, moves that
leave π_β invariant, a sure lower bound that is log π(S) of a returned allocation."""

from __future__ import annotations

import collections
import functools
import itertools
import warnings
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import pytest
from oracles import assert_errors_match_stated
from scipy.special import logsumexp
from scipy.stats import chi2

import bam_ppl as bam
from bam_ppl.data import CountTensor
from bam_ppl.infer.exact import exact_log_evidence
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.smc import references, tempered, tempered_jax, tempered_numba, tempered_problem
from bam_ppl.infer.smc import symmetry as symmetries
from bam_ppl.infer.smc.mixture import ENGINE

X1 = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])
X2 = np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]])
RNG = np.random.default_rng(7)
MISSING = CountTensor.from_samples(
    np.array([[0, 1, 0], [1, -1, 0], [0, 0, -1], [1, 1, 1], [-1, 0, 1], [0, 1, 0]]), shape=(2, 2, 2))
CASES = {
    "nmf_X1": (bam.models.nmf(2, a=1.0), X1),
    "nmf_X2": (bam.models.nmf(2, a=1.0), X2),
    "nmf3_X1_small_a": (bam.models.nmf(3, a=0.1), X1),
    "cp": (bam.models.cp(2, a=1.0), RNG.integers(0, 2, (2, 3, 2))),
    "lda_conditioned": (bam.models.lda(2, a=1.0), np.array([[2, 1, 0], [0, 1, 2]])),
    "missing_entries": (bam.models.cp(2, a=1.0), MISSING),
    "symmetric_nmf_tied": (bam.models.symmetric_nmf(2, a=0.5), np.array([[2, 1, 0], [1, 0, 1], [0, 1, 2]])),
    "chain_latent_middle": (bam.AllocationModel("i -> k; k -> j", latent={"k": 3}, observed=("i", "j"), a=1.0),
                            np.array([[3, 1, 0], [0, 2, 2]])),
}
# Tiny data at a ≤ 0.5 trigger the small-concentration warning (tested on its own below).
pytestmark = pytest.mark.filterwarnings("ignore:tempered SMC. most particles:UserWarning")
# An adaptive schedule leaves a small bias (a few hundredths of a nat on these cases).
ADAPTIVE_BIAS = 0.03


def assert_matches_exact(result, exact):
    assert np.isfinite(result.stderr) and result.stderr > 0
    assert abs(result.log_evidence - exact) <= ADAPTIVE_BIAS + 4 * result.stderr, (result.log_evidence, exact,
                                                                                 result.stderr)


@functools.cache
def numba_case(name):
    """(result, exact) of one case; cached, so that the per-case tests and the test of the stated
    errors across cases share their runs."""
    model, X = CASES[name]
    return tempered.run_tempered(model, X, 0, num_particles=256, num_chains=8, engine="numba"), \
        exact_log_evidence(model, X)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_exact_numba(name):
    assert_matches_exact(*numba_case(name))


def test_stated_errors_match_the_errors_across_cases():
    """Σ z² over the exact cases within both tails of the chi-square: errors not larger than
    stated (after the adaptive schedule's bias), stated errors not inflated."""
    cases = [numba_case(name) for name in sorted(CASES)]
    assert_errors_match_stated([r.log_evidence for r, _ in cases], [r.stderr for r, _ in cases],
                               [x for _, x in cases], bias=ADAPTIVE_BIAS)


@pytest.mark.parametrize("name", ["missing_entries", pytest.param("symmetric_nmf_tied", marks=[pytest.mark.slow, pytest.mark.stats])])
def test_matches_exact_jax(name):
    model, X = CASES[name]
    result = tempered.run_tempered(model, X, 0, num_particles=128, num_chains=4, engine="jax")
    assert_matches_exact(result, exact_log_evidence(model, X))


def test_latent_free_model_is_exact():
    # No latent node and no missing entry: one allocation, L is a constant, one temperature.
    model = bam.models.complete_graph(3, a=1.0)
    X = np.random.default_rng(3).integers(0, 5, (2, 3, 2))
    result = tempered.run_tempered(model, X, 0, num_particles=4, num_chains=2)
    np.testing.assert_allclose(result.run_log_evidence, exact_log_evidence(model, X), atol=1e-9)
    assert list(result.num_temperatures) == [1, 1]
    assert result.lower_bound == pytest.approx(exact_log_evidence(model, X), abs=1e-9)


@pytest.mark.parametrize("kernel", ["numba", pytest.param("jax", marks=[pytest.mark.slow, pytest.mark.stats])])
def test_fixed_schedule_is_unbiased(kernel):
    # With a fixed schedule every run's exp(estimate) is an unbiased estimate of p(X): the
    # natural-scale mean of many runs matches the exact evidence within its Monte Carlo error.
    model, X = bam.models.nmf(2, a=1.0), np.array([[2, 1], [0, 2]])
    runs = 1000 if kernel == "numba" else 120
    result = tempered.run_tempered(model, X, 5, num_particles=8, num_chains=runs, schedule=[0.1, 0.4, 1.0],
                                   engine=kernel)
    ratios = np.exp(result.run_log_evidence - exact_log_evidence(model, X))
    assert abs(ratios.mean() - 1.0) <= 4 * ratios.std(ddof=1) / np.sqrt(ratios.size)
    assert list(result.num_temperatures) == [3] * runs


@pytest.mark.slow
@pytest.mark.stats
def test_fixed_schedule_is_unbiased_precisely():
    model, X = CASES["cp"]
    result = tempered.run_tempered(model, X, 9, num_particles=16, num_chains=20000, schedule=[0.25, 0.5, 1.0])
    ratios = np.exp(result.run_log_evidence - exact_log_evidence(model, X))
    assert abs(ratios.mean() - 1.0) <= 4 * ratios.std(ddof=1) / np.sqrt(ratios.size)


def _enumerate_tempered(model, X, beta, start_scale=1.0, reference_seed=None):
    """Every token-level allocation z of a tiny case and π_β(z) ∝ π₀(z) L(z)^β, by enumeration
    (with a tilted start q: π_β ∝ q^(1−β) (π₀ L)^β; a random per-cell reference q when
    ``reference_seed`` is given)."""
    data, bound, layout, _ = prepare(model, X)
    tp = tempered_problem.build_tempered_problem(bound, data, layout, start_scale)
    if reference_seed is not None:
        tp = references.with_reference(tp, _random_reference(tp, reference_seed))
    T, L = tp.token_cell.size, tp.num_configs
    zs = np.array(list(itertools.product(range(L), repeat=T)))
    ok = tp.valid[tp.token_cell[None, :], zs].all(1) if tp.has_valid else np.ones(len(zs), bool)
    zs = zs[ok]
    counts = [tempered_problem.counts_of_configs(tp, z) for z in zs]
    terms = np.array([tempered_problem.exact_log_terms(tp, c) for c in counts])
    log_p = terms[:, 0] + beta * terms[:, 1]
    if tp.tilted:
        start = np.array([tempered_problem.exact_log_start(tp, c, z) for c, z in zip(counts, zs)])
        log_p = (1 - beta) * start + beta * (terms[:, 0] + terms[:, 1])
    return tp, zs, np.exp(log_p - logsumexp(log_p)), terms


def _random_reference(tp, seed):
    """log q (U, L) of a random per-cell reference over the configurations each cell allows."""
    q = np.random.default_rng(seed).dirichlet(np.ones(tp.num_configs), size=tp.cell_start.size - 1)
    allowed = tp.valid if tp.has_valid else np.ones_like(q, bool)
    q = np.where(allowed, q, 0.0)
    return np.where(allowed, np.log(np.where(allowed, q / q.sum(1, keepdims=True), 1.0)), 0.0)


def _particles(kernel, tp, num, seed):
    if kernel == "numba":
        pool = ThreadPoolExecutor(2)
        seeds = np.asarray(jax.random.split(jax.random.PRNGKey(seed), tempered.NUM_BLOCKS))
        return tempered_numba.NumbaParticles(tp, num, seeds, pool)
    return tempered_jax.JaxParticles(tp, num, jax.random.key(seed))


def _chi2_statistic(zs, probs, config, L):
    codes = {tuple(z): i for i, z in enumerate(zs)}
    found = np.bincount([codes[tuple(c)] for c in np.asarray(config)], minlength=len(zs))
    expected = probs * config.shape[0]
    return ((found - expected) ** 2 / expected).sum(), len(zs) - 1


TINY = {
    "nmf": (bam.models.nmf(2, a=1.0), np.array([[2, 1], [0, 2]])),
    "missing": (bam.models.cp(2, a=1.0), CountTensor.from_samples(
        np.array([[0, 1, 0], [1, -1, 0], [1, 1, 1], [0, 0, -1]]), shape=(2, 2, 2))),
    "tied": (bam.models.symmetric_nmf(2, a=0.5), np.array([[2, 1], [1, 0]])),
}
START_SCALES = {"nmf": 1.0, "missing": 3.0, "tied": 2.0}


@pytest.mark.parametrize("referenced", [False, pytest.param(True, marks=[pytest.mark.slow, pytest.mark.stats])])
@pytest.mark.parametrize("kernel, beta", [("numba", 0.0), ("numba", 0.5), pytest.param("jax", 0.0, marks=[pytest.mark.slow, pytest.mark.stats]),
                                          ("jax", 0.5)])
@pytest.mark.parametrize("name", sorted(TINY))
def test_moves_leave_the_tempered_target_invariant(name, beta, kernel, referenced):
    # β = 0: the urn initialisation draws π₀ exactly. β > 0: exact draws from π_β, one sweep
    # at β, and the histogram is still π_β (chi-square test over every allocation).
    # "missing" and "tied" start from a tilted urn (larger latent concentrations); ``referenced``
    # from a random per-cell reference q instead.
    model, X = TINY[name]
    tp, zs, probs, terms = _enumerate_tempered(model, X, beta, START_SCALES[name], 11 if referenced else None)
    assert tp.tilted == (START_SCALES[name] != 1.0 or referenced)
    num = 20_000
    with jax.enable_x64(True):
        particles = _particles(kernel, tp, num, seed=3)
        if beta == 0.0:
            particles.initialise()
        else:
            start = np.random.default_rng(4).choice(len(zs), size=num, p=probs)
            particles.set_configs(zs[start])
            particles.move(beta, 1)
        statistic, df = _chi2_statistic(zs, probs, np.asarray(particles.config), tp.num_configs)
        assert statistic < chi2.ppf(0.999, df), (statistic, df)
        # the carried log π₀ and log L differ from the closed forms by a constant (the rows that
        # no configuration changes); after set_configs they are the closed forms.
        exact = np.array([(*tempered_problem.exact_log_terms(tp, particles.counts(p)),
                           tempered_problem.exact_log_start(tp, particles.counts(p), np.asarray(particles.config[p])))
                          for p in range(50)])
        carried = np.stack([np.asarray(particles.log_prior)[:50], np.asarray(particles.log_like)[:50],
                            np.asarray(particles.log_start)[:50]], 1)
        if not tp.tilted:
            exact, carried = exact[:, :2], carried[:, :2]
        offset = carried - exact
        np.testing.assert_allclose(offset - offset[:1], 0.0, atol=1e-9)
        if beta > 0:
            np.testing.assert_allclose(offset, 0.0, atol=1e-9)


def _moved_particles(problem):
    """Eight particles from the same streams, drawn from the start and moved at three temperatures."""
    with ThreadPoolExecutor(1) as pool:
        particles = tempered_numba.NumbaParticles(problem, 8, [[1, 2], [3, 4]], pool)
        particles.initialise()
        for beta in (0.3, 0.7, 1.0):
            particles.move(beta, 2)
    return particles


@pytest.mark.parametrize("referenced", [False, True])
@pytest.mark.parametrize("model", [bam.models.nmf(3, a=1.0), bam.models.cp(2, a=0.5)], ids=["nmf", "cp"])
def test_factorised_sweeps_follow_the_general_kernel(model, referenced):
    # The fast paths of the sweeps (FactorisedTempered: factors read from tables over the counts, or
    # computed) draw as the general kernel does, from the same random stream: the same
    # configurations and the same carried log terms.
    X = RNG.integers(0, 4, (4, 5)) if model.latent == {"k": 3} else RNG.integers(0, 3, (3, 4, 3))
    data, bound, layout, _ = prepare(model, X, algorithm="test")
    tp = tempered_problem.build_tempered_problem(bound, data, layout)
    assert tp.factorised.usable and tp.factorised.tabulated
    if referenced:
        log_q = np.log(np.random.default_rng(5).dirichlet(np.ones(tp.num_configs), size=data.nnz))
        tp = references.with_reference(tp, log_q)
    computed = tp._replace(factorised=tp.factorised._replace(tabulated=False))
    general = tp._replace(factorised=tp.factorised._replace(usable=False))
    runs = [_moved_particles(problem) for problem in (tp, computed, general)]
    fast, _, slow = runs
    for run in runs[:2]:
        np.testing.assert_array_equal(run.config, slow.config)
        for name in ("log_prior", "log_like", "log_start", "shifted"):
            np.testing.assert_allclose(getattr(run, name), getattr(slow, name), rtol=1e-12, atol=1e-9)
    # and the cells' conditionals that a reference averages
    probabilities = []
    for problem in (tp, general):
        out = np.empty((data.nnz, tp.num_configs))
        tempered_numba._cell_probabilities(fast.shifted[0], tempered_numba.kernel_tables(problem, False),
                                           problem.cell_start, problem.factorised, out)
        probabilities.append(out)
    np.testing.assert_allclose(*probabilities, rtol=1e-12)
    np.testing.assert_allclose(probabilities[0].sum(1), 1.0)


@pytest.mark.parametrize("referenced", [False, True])
@pytest.mark.parametrize("case", ["tucker", "missing_entries", "symmetric_nmf_tied"])
def test_tabulated_rows_follow_the_general_kernel(case, referenced):
    # Where the weights do not factorise (Tucker's rows of one latent node, cells that restrict the
    # configurations, tied members: a token's two visible rows read one table, the second one more at
    # the first one's entry), the factors read from tables over the counts draw as the computed ones do.
    model, X = (bam.models.tucker((2, 3, 2)), RNG.integers(0, 3, (3, 4, 3))) if case == "tucker" else CASES[case]
    data, bound, layout, _ = prepare(model, X, algorithm="test")
    tp = tempered_problem.build_tempered_problem(bound, data, layout)
    assert not tp.factorised.usable and np.isfinite(tp.row_value).all()
    if referenced:
        log_q = np.log(np.random.default_rng(5).dirichlet(np.ones(tp.num_configs), size=data.nnz))
        tp = references.with_reference(tp, log_q)
    tabulated, computed = (_moved_particles(problem)
                           for problem in (tp, tp._replace(row_value=np.full_like(tp.row_value, np.nan))))
    np.testing.assert_array_equal(tabulated.config, computed.config)
    for name in ("log_prior", "log_like", "log_start", "shifted"):
        np.testing.assert_allclose(getattr(tabulated, name), getattr(computed, name), rtol=1e-12, atol=1e-9)


def test_factorised_sweeps_are_not_used_where_they_do_not_apply():
    # a cell restricts the configurations; tied members; configurations sharing a constant row's entries
    cases = [CASES["missing_entries"], CASES["symmetric_nmf_tied"], (bam.models.tucker((2, 3, 1)), CASES["cp"][1])]
    for model, X in cases:
        data, bound, layout, _ = prepare(model, X, algorithm="test")
        assert not tempered_problem.build_tempered_problem(bound, data, layout).factorised.usable


def test_decomposition_sums_to_the_evidence():
    # p(X) = exp(C + log Z₀) Σ_z π₀(z) L(z): the pieces of the estimator against enumeration.
    for model, X in TINY.values():
        tp, zs, _, terms = _enumerate_tempered(model, X, 0.0)
        assert tp.constant + logsumexp(terms.sum(1)) == pytest.approx(exact_log_evidence(model, X), abs=1e-9)
        assert logsumexp(terms[:, 0]) == pytest.approx(tp.log_z0, abs=1e-9)


@pytest.mark.parametrize("name", ["nmf_X1", "missing_entries", "lda_conditioned", "symmetric_nmf_tied"])
def test_sure_lower_bound_is_log_prob_of_the_returned_allocation(name):
    model, X = CASES[name]
    result = tempered.run_tempered(model, X, 1, num_particles=64, num_chains=2)
    bound = model.bind(X)
    assert result.lower_bound <= exact_log_evidence(model, X)
    assert bound.log_prob_cells(result.best_cells, result.best_counts) == pytest.approx(result.lower_bound,
                                                                                         abs=1e-8)
    assert result.lower_bound == pytest.approx(result.run_lower_bound.max(), abs=1e-8)
    assert result.best_counts.sum() == model.as_data(X).total
    assert result.best_config.shape == (model.as_data(X).total,)


def test_evidence_registry_and_details():
    model = bam.models.nmf(2, a=1.0)
    estimate = bam.log_evidence(model, X1, method="tempered", rng_key=2, num_particles=64, num_chains=3)
    assert estimate.method == "tempered" and estimate.kind == "estimate"
    details = estimate.details
    for key in ("run_log_evidence", "lower_bound", "num_temperatures", "num_resamplings", "min_ess",
                "schedule", "num_particles", "num_runs", "rho", "num_sweeps"):
        assert key in details
    assert len(details["run_log_evidence"]) == 3 and len(details["schedule"]) == 3
    assert all(s[-1] == 1.0 for s in details["schedule"])
    assert details["lower_bound"] <= estimate.value + 4 * estimate.stderr
    # a pilot's schedule can be fixed for later runs
    fixed = bam.log_evidence(model, X1, method="tempered", rng_key=3, num_particles=64, num_chains=2,
                             schedule=details["schedule"][0])
    assert fixed.details["num_temperatures"] == [len(details["schedule"][0])] * 2


def test_same_key_same_result_other_key_other_result():
    model = bam.models.nmf(2, a=1.0)
    first = tempered.run_tempered(model, X2, 4, num_particles=32, num_chains=2)
    again = tempered.run_tempered(model, X2, jax.random.key(4), num_particles=32, num_chains=2)
    other = tempered.run_tempered(model, X2, 5, num_particles=32, num_chains=2)
    np.testing.assert_array_equal(first.run_log_evidence, again.run_log_evidence)
    assert not np.array_equal(first.run_log_evidence, other.run_log_evidence)


def test_one_run_has_no_stderr():
    result = tempered.run_tempered(bam.models.nmf(2, a=1.0), X1, 0, num_particles=16, num_chains=1)
    assert np.isnan(result.stderr)


@pytest.mark.parametrize("options, error, word", [
    (dict(num_particles=1), ValueError, "num_particles"),
    (dict(num_particles=2.5), TypeError, "num_particles"),
    (dict(num_chains=0), ValueError, "num_chains"),
    (dict(rho=1.0), ValueError, "rho"),
    (dict(rho=0.0), ValueError, "rho"),
    (dict(rho="high"), TypeError, "rho"),
    (dict(num_sweeps=0), ValueError, "num_sweeps"),
    (dict(schedule=[0.5, 0.9]), ValueError, "schedule"),
    (dict(schedule=[0.5, 0.4, 1.0]), ValueError, "schedule"),
    (dict(schedule=[-0.5, 1.0]), ValueError, "schedule"),
    (dict(schedule="linear"), TypeError, "schedule"),
    (dict(schedule=[[0.5, 1.0]]), ValueError, "schedule"),
    (dict(engine="cuda"), ValueError, "engine"),
    (dict(engine=1), TypeError, "engine"),
    (dict(progress_bar="yes"), TypeError, "progress_bar"),
    (dict(max_configs=0), ValueError, "max_configs"),
    (dict(start_a=0.0), ValueError, "start_a"),
    (dict(start_a="flat"), TypeError, "start_a"),
])
def test_bad_options_raise(options, error, word):
    with pytest.raises(error, match=word):
        bam.log_evidence(bam.models.nmf(2, a=1.0), X1, method="tempered", **options)


def test_tie_across_latent_and_visible_nodes_is_rejected():
    model = bam.AllocationModel("r -> k; k -> i; r -> j", latent={"r": 2, "k": 2}, a=1.0, tie=[("k", "i")])
    with pytest.raises(ValueError, match="ties latent and visible"):
        tempered.run_tempered(model, np.array([[1, 2], [0, 1]]), 0, num_particles=4, num_chains=1)


def test_small_concentrations_warn_without_a_tilted_start():
    # a = 0.01: nearly every draw from the latent prior puts all tokens in one component; the
    # posterior's allocations are rare under it and the estimate falls far short: a warning.
    model = bam.models.nmf(2, a=0.01)
    with pytest.warns(UserWarning, match="most particles drawn from the start distribution"):
        tempered.run_tempered(model, X2, 0, num_particles=64, num_chains=2, start_a=None)


@pytest.mark.parametrize("a", [1e-6, 0.01, 0.1])
def test_small_concentrations_exact_with_the_default_tilted_start(a):
    model = bam.models.nmf(2, a=a)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        result = tempered.run_tempered(model, X2, 0, num_particles=256, num_chains=8)
    assert_matches_exact(result, exact_log_evidence(model, X2))


@pytest.mark.parametrize("name", ["nmf_X1", "missing_entries", "lda_conditioned"])
def test_tilted_start_matches_exact(name):
    model, X = CASES[name]
    result = tempered.run_tempered(model, X, 0, num_particles=256, num_chains=8, start_a=4.0 * model.a)
    assert_matches_exact(result, exact_log_evidence(model, X))


@pytest.mark.slow
@pytest.mark.stats
def test_small_concentrations_converge_with_effort_from_the_prior():
    model = bam.models.nmf(2, a=0.1)
    with pytest.warns(UserWarning, match="most particles"):
        result = tempered.run_tempered(model, X2, 0, num_particles=1024, num_chains=8, rho=0.99, num_sweeps=5,
                                       start_a=None)
    assert_matches_exact(result, exact_log_evidence(model, X2))


@pytest.mark.slow
@pytest.mark.stats
def test_realistic_nmf_above_bounds_and_consistent_across_keys():
    # NMF(4), a = 1, on a 50 × 70 matrix of T = 1000 tokens drawn from a concentrated prior:
    # the estimate lies above its own sure lower bound and above the VB bound, and runs with
    # different keys agree within a few stated standard errors.
    _, X = bam.models.nmf(4, a=200).sample(jax.random.key(0), shape=(50, 70), total=1000)
    model = bam.models.nmf(4, a=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bam.evidence.EvidenceWarning)  # runs agree, above the bound
        first = bam.log_evidence(model, X, method="tempered", rng_key=1)
        second = bam.log_evidence(model, X, method="tempered", rng_key=2)
    vb = bam.log_evidence(model, X, method="vb")
    for estimate in (first, second):
        assert estimate.value >= estimate.details["lower_bound"]
        assert estimate.value >= vb.value
        assert estimate.stderr < 2.0
    combined = np.hypot(first.stderr, second.stderr)
    assert abs(first.value - second.value) <= max(4 * combined, 1.0)
    # Not inflated either (0.5 nats: the spread two calls can miss).
    assert combined <= 2 * abs(first.value - second.value) + 0.5


def test_moves_leave_the_reference_tempered_target_invariant():
    # The fast suite's case of the above with a per-cell reference (all of them: make test-all).
    test_moves_leave_the_tempered_target_invariant("missing", 0.5, "numba", True)


# -- the reference-started path -------------------------------------------------------------------
def test_too_many_symmetries_warning_names_the_tempered_smc(monkeypatch):
    monkeypatch.setattr(symmetries, "MAX_RELABELLINGS", 5)
    monkeypatch.setattr(symmetries, "PERMANENT_MAX_OUTER", 1)
    # Two symmetric latent nodes, 2! · 3! relabellings: too many to enumerate, and too many
    # relabellings of the smaller node to sum a permanent of the larger for each.
    data, bound, layout, _ = prepare(bam.models.tucker((2, 3), a=1.0), np.array([[2, 1, 0], [0, 1, 3]]))
    with pytest.warns(UserWarning, match="the tempered SMC from a reference averages over none"):
        symmetry = symmetries.label_symmetries_of(bound, data, layout)
    assert symmetry.relabellings.shape[0] == 1 and symmetry.log_order == 0.0 and symmetry.swap is None


def _brute_log_permanent(M):
    K = M.shape[0]
    return logsumexp([M[np.arange(K), list(g)].sum() for g in itertools.permutations(range(K))])


def test_log_permanent_matches_the_sum_over_every_permutation():
    rng = np.random.default_rng(0)
    for trial in range(20):
        K = int(rng.integers(2, 7))
        M = rng.normal(0.0, [0.5, 5.0, 50.0][trial % 3], (K, K))
        occupied = rng.random(K) < 0.7
        M[~occupied] = 0.0  # rows of values no token takes
        value = symmetries._log_permanent(M, occupied, symmetries.PERMANENT_DROP_NATS, 10**6)
        assert value == pytest.approx(_brute_log_permanent(M), abs=1e-9)
    assert np.isnan(symmetries._log_permanent(rng.normal(0.0, 0.1, (7, 7)), np.ones(7, bool), 40.0, 10))


def test_log_permanent_by_subsets_matches_the_sum_over_every_permutation():
    rng = np.random.default_rng(1)
    # Up to entries thousands of nats apart (thousands of tokens per value), where exp of them underflows.
    for trial in range(30):
        K = int(rng.integers(2, 7))
        M = rng.normal(0.0, [0.5, 5.0, 50.0, 500.0, 5000.0][trial % 5], (K, K))
        M[rng.random(K) < 0.3] = 0.0  # rows of values no token takes
        assert symmetries._log_permanent_by_subsets(M) == pytest.approx(_brute_log_permanent(M), rel=1e-10, abs=1e-9)


def test_log_permanents_of_sixteen_values_whatever_the_column_order():
    # K = 16: one permutation far above the others, off the diagonal (depth first, the order of the
    # columns must not matter), and rows that all prefer one column, where the depth-first sum
    # cannot prune and the sum over subsets takes over.
    rng = np.random.default_rng(2)
    K, occupied = 16, np.ones(16, bool)
    args = (occupied, symmetries.PERMANENT_DROP_NATS, symmetries.PERMANENT_MAX_NODES, symmetries.PERMANENT_SUBSET_MAX)
    dominant = -rng.uniform(5.0, 25.0, (K, K))
    dominant[np.arange(K), rng.permutation(K)] = 0.0
    shuffled = dominant[:, rng.permutation(K)]
    values = symmetries._log_permanents(np.stack([dominant, shuffled]), *args)
    assert 0.0 <= values[0] < 0.01 and values[1] == pytest.approx(values[0], abs=1e-9)
    assert values[0] == pytest.approx(symmetries._log_permanent_by_subsets(dominant), abs=1e-6)
    crowded = -rng.uniform(1.0, 5.0, (K, K))
    crowded[:, 3] += 60.0
    assert np.isnan(symmetries._log_permanent(crowded, occupied, symmetries.PERMANENT_DROP_NATS, 1 << K))
    value = symmetries._log_permanents(crowded[None], *args)[0]
    reordered = np.ascontiguousarray(crowded[:, ::-1])  # the layout the engine passes: one compilation
    assert np.isfinite(value) and value == pytest.approx(symmetries._log_permanent_by_subsets(reordered), abs=1e-9)
    # Beyond PERMANENT_SUBSET_MAX values nothing takes over: nan, from which runs count no relabelling.
    assert np.isnan(symmetries._log_permanents(crowded[None], occupied, 30.0, 1000, 10)[0])


def test_runs_count_the_relabellings_all_or_none():
    # Runs corrected by log |G| and runs not would pool to nothing meaningful: where one run cannot
    # sum the relabellings, none counts them, with a warning.
    Run = collections.namedtuple("Run", "log_relabelled")
    symmetry = symmetries.LabelSymmetry(np.zeros((1, 1), np.int64), log_order=np.log(3628800.0))
    np.testing.assert_array_equal(tempered.relabelled_terms([Run(15.0), Run(14.5)], symmetry), [15.0, 14.5])
    with pytest.warns(bam.EvidenceWarning, match="1 of 2 runs.*up to 15.1 nats"):
        terms = tempered.relabelled_terms([Run(15.0), Run(np.nan)], symmetry)
    np.testing.assert_array_equal(terms, [0.0, 0.0])


def test_one_node_symmetry_weights_equal_the_enumerated_ones(monkeypatch):
    # Beyond MAX_RELABELLINGS the sum over one node's K! relabellings is a permanent: the same
    # weights as the enumeration, on states with every class used and with empty classes.
    model, X = bam.models.nmf(4, a=1.0), np.array([[2, 1, 0], [0, 1, 3], [1, 0, 1]])
    data, bound, layout, _ = prepare(model, X)
    tp = tempered_problem.build_tempered_problem(bound, data, layout)
    tp = references.with_reference(tp, _random_reference(tp, 7))
    enumerated = symmetries.label_symmetries_of(bound, data, layout)
    assert enumerated.swap is None and enumerated.relabellings.shape[0] == 24
    monkeypatch.setattr(symmetries, "MAX_RELABELLINGS", 5)
    permanent = symmetries.label_symmetries_of(bound, data, layout)
    assert permanent.swap is not None and permanent.log_order == pytest.approx(np.log(24))
    z = np.random.default_rng(3).integers(0, tp.num_configs, (30, tp.token_cell.size))
    z[:10] %= 2  # two classes empty
    z[10] = 0
    np.testing.assert_allclose(symmetries.symmetric_log_weights(tp, z, permanent),
                               symmetries.symmetric_log_weights(tp, z, enumerated), atol=1e-9)


def test_several_symmetric_nodes_sum_a_permanent_per_relabelling_of_the_others(monkeypatch):
    # Tucker((2, 3)): a permanent over the three values of one node for each of the 2! relabellings
    # of the other, against the 12 relabellings enumerated.
    data, bound, layout, _ = prepare(bam.models.tucker((2, 3), a=1.0), np.array([[2, 1, 0], [0, 1, 3]]))
    tp = tempered_problem.build_tempered_problem(bound, data, layout)
    tp = references.with_reference(tp, _random_reference(tp, 9))
    enumerated = symmetries.label_symmetries_of(bound, data, layout)
    assert enumerated.swap is None and enumerated.relabellings.shape[0] == 12
    monkeypatch.setattr(symmetries, "MAX_RELABELLINGS", 5)
    nested = symmetries.label_symmetries_of(bound, data, layout)
    assert nested.relabellings.shape[0] == 2 and nested.swap.shape == (tp.num_configs, 3)
    assert nested.log_order == pytest.approx(np.log(12))
    z = np.random.default_rng(4).integers(0, tp.num_configs, (30, tp.token_cell.size))
    z[:8] = nested.swap[z[:8], 0]  # the permanent's node at one value only
    np.testing.assert_allclose(symmetries.symmetric_log_weights(tp, z, nested),
                               symmetries.symmetric_log_weights(tp, z, enumerated), atol=1e-9)


def test_label_symmetry_weights_share_every_orbit_exactly_once():
    # Σ_h w(h(z)) = 1 over the relabellings h, for every z: what makes Σ_z p(X, z) |G| w(z) = p(X).
    model, X = bam.models.nmf(3, a=1.0), np.array([[2, 1, 0], [0, 1, 3], [1, 0, 1]])
    data, bound, layout, _ = prepare(model, X)
    tp = references.with_reference(tempered_problem.build_tempered_problem(bound, data, layout), _random_reference(
        tempered_problem.build_tempered_problem(bound, data, layout), 5))
    symmetry = symmetries.label_symmetries_of(bound, data, layout)
    relabellings = symmetry.relabellings
    assert relabellings.shape[0] == 6 and np.array_equal(relabellings[0], np.arange(tp.num_configs))
    z = np.random.default_rng(2).integers(0, tp.num_configs, (40, tp.token_cell.size))
    z[0] = 0  # a state that relabellings map to itself
    orbits = np.stack([relabellings[h][z] for h in range(6)], 1)  # (40, G, T)
    log_w = symmetries.symmetric_log_weights(tp, orbits.reshape(-1, z.shape[1]), symmetry).reshape(40, 6)
    np.testing.assert_allclose(np.exp(log_w).sum(1) / 6, 1.0, atol=1e-12)


@pytest.mark.parametrize("kernel", ["numba", pytest.param("jax", marks=[pytest.mark.slow, pytest.mark.stats])])
def test_reference_start_with_a_fixed_schedule_is_unbiased(kernel):
    # Each run's exp(estimate) is unbiased for p(X), relabelled copies of the modes included.
    model, X = bam.models.nmf(2, a=1.0), np.array([[2, 1], [0, 2]])
    exact = exact_log_evidence(model, X)
    best = tempered.run_tempered(model, X, 0, num_particles=16, num_chains=1)
    runs = 400 if kernel == "numba" else 100
    result = tempered.run_tempered(model, X, 5, num_particles=32, num_chains=runs, schedule=[0.3, 0.6, 1.0],
                                   engine=kernel, reference=(best.best_cells, best.best_counts), reference_sweeps=2)
    ratios = np.exp(result.run_log_evidence - exact)
    assert abs(ratios.mean() - 1.0) <= 4 * ratios.std(ddof=1) / np.sqrt(ratios.size)


@pytest.mark.parametrize("name", ["nmf_X1", "missing_entries", pytest.param("cp", marks=[pytest.mark.slow, pytest.mark.stats]),
                                  pytest.param("symmetric_nmf_tied", marks=[pytest.mark.slow, pytest.mark.stats])])
def test_reference_start_matches_exact(name):
    model, X = CASES[name]
    best = tempered.run_tempered(model, X, 0, num_particles=16, num_chains=1)
    result = tempered.run_tempered(model, X, 1, num_particles=128, num_chains=8, num_sweeps=2,
                                   schedule=np.linspace(0.05, 1.0, 20), reference=(best.best_cells, best.best_counts))
    assert abs(result.log_evidence - exact_log_evidence(model, X)) <= 4 * result.stderr + 0.02, result


def test_a_shared_reference_matches_exact_and_is_checked():
    # A Reference built once (what method="auto" picks by pilot runs) and shared by every run.
    model, X = CASES["nmf_X1"]
    best = tempered.run_tempered(model, X, 0, num_particles=16, num_chains=1)
    # Chains long enough to visit every mode of the tiny posterior: a one-chain reference of 20
    # sweeps sat in one and came out 0.06 nats low (stderr 0.007; see run_tempered, reference).
    refs = references.build_references(model, X, (best.best_cells, best.best_counts), 2, num=2, reference_sweeps=200)
    assert len(refs) == 2 and not np.allclose(refs[0].log_q, refs[1].log_q)  # chains of their own
    result = tempered.run_tempered(model, X, 1, num_particles=128, num_chains=8, num_sweeps=2,
                                   schedule=np.linspace(0.05, 1.0, 20), reference=refs[0])
    assert result.reference_sweeps == 200
    assert abs(result.log_evidence - exact_log_evidence(model, X)) <= 4 * result.stderr + 0.02, result
    # One Reference per run: still unbiased, each run from its own q.
    per_run = tempered.run_tempered(model, X, 1, num_particles=128, num_chains=8, num_sweeps=2,
                                    schedule=np.linspace(0.05, 1.0, 20), reference=refs * 4)
    assert abs(per_run.log_evidence - exact_log_evidence(model, X)) <= 4 * per_run.stderr + 0.02, per_run
    with pytest.raises(ValueError, match="one Reference per run"):
        tempered.run_tempered(model, X, 1, num_chains=3, reference=refs)
    with pytest.raises(ValueError, match="reference: a Reference"):
        tempered.run_tempered(model, X, 1, reference=references.Reference(refs[0].log_q[:, :1], 20))
    with pytest.raises(ValueError, match="reference_sweeps"):
        tempered.run_tempered(model, X, 1, reference=refs[0], reference_sweeps=5)
    with pytest.raises(ValueError, match="num"):
        references.build_references(model, X, (best.best_cells, best.best_counts), num=0)
    assert references.default_reference_sweeps(16_000) == 12_800
    # One reference from each of several allocations (what method="auto" builds from its scouts):
    # with no sweeps, each is its own allocation's conditionals, as build_references makes it.
    other = tempered.run_tempered(model, X, 5, num_particles=4, num_chains=1)
    starts = [(best.best_cells, best.best_counts), (other.best_cells, other.best_counts)]
    each = references.references_from_allocations(model, X, starts, 0, reference_sweeps=0)
    assert [ref.num_sweeps for ref in each] == [0, 0]
    for start, ref in zip(starts, each):
        np.testing.assert_allclose(ref.log_q, references.build_references(model, X, start, 9, reference_sweeps=0)[0].log_q)
    assert references.default_reference_sweeps(10) == ENGINE.reference_sweeps
    assert references.default_reference_sweeps(1_000_000) == ENGINE.chain_token_moves // 1_000_000


@pytest.mark.parametrize("reference, error", [
    ("vb", TypeError), ((np.zeros((2, 2)), np.ones(2)), ValueError), (([[0, 0, 0]], [99]), ValueError)])
def test_bad_reference_raises(reference, error):
    with pytest.raises(error, match="reference"):
        bam.log_evidence(bam.models.nmf(2, a=1.0), X1, method="tempered", reference=reference)
    with pytest.raises(ValueError, match="reference_sweeps"):
        bam.log_evidence(bam.models.nmf(2, a=1.0), X1, method="tempered", reference_sweeps=-1)


def test_allocation_near_expected_counts_adds_up_to_the_data():
    # What the mixture engine starts a reference from where a VB fit ended: a valid allocation of X whose
    # tokens follow each cell's conditional given the (non-integer) expected table counts.
    model, X = CASES["missing_entries"]
    data, bound, layout, _ = prepare(model, X)
    tp = tempered_problem.build_tempered_problem(bound, data, layout)
    visited = tempered.run_tempered(model, X, 0, num_particles=16, num_chains=1)
    entries = np.concatenate([np.ravel(c) for c in bound.table_counts(visited.best_cells, visited.best_counts)])
    expected = 0.7 * entries + 0.3 * np.random.default_rng(1).random(entries.size)
    config = references.configs_from_counts(tp, references.kernel_counts(tp, expected, bound.column_of))
    assert config.shape == tp.token_cell.shape and 0 <= config.min() and config.max() < tp.num_configs
    cells, counts = tempered_problem.best_allocation(bound, data, layout, tp, config)
    assert counts.sum() == model.as_data(X).total and (counts > 0).all()
    assert bound.log_prob_cells(cells, counts) <= exact_log_evidence(model, X)
    result = tempered.run_tempered(model, X, 0, num_particles=16, num_chains=2, reference=(cells, counts))
    assert np.isfinite(result.run_log_evidence).all()


class _FixedParticles:
    """Particles whose log-likelihoods stay as given: moves do nothing, resampling reorders them."""

    def __init__(self, log_like):
        self.log_like = np.asarray(log_like, np.float64)
        self.moved_at = []

    def resample(self, ancestors):
        self.log_like = self.log_like[ancestors]

    def move(self, beta):
        self.moved_at.append(beta)


def test_step_reweights_resamples_and_moves_as_a_tempered_smc_step():
    """One step from β to β' adds log Σ W L^(β'−β) to log Ẑ, resamples below half the ESS, then moves at β'."""
    log_like = np.array([0.0, -1.0, -30.0, -2.0])
    particles = _FixedParticles(log_like)
    solve = tempered.scheduled_temperature(np.array([0.25, 1.0]))
    state = tempered.TemperedState(np.full(4, -np.log(4)), 0.0, 0.0)
    ratio = lambda ps: ps.log_like  # noqa: E731
    rng = np.random.default_rng(0)
    state, info = tempered.step(rng, state, particles, ratio, solve, _FixedParticles.move)
    assert state.beta == info.beta == 0.25 and state.log_z == pytest.approx(logsumexp(0.25 * log_like) - np.log(4))
    assert not info.resampled and info.ess == pytest.approx(np.exp(2 * logsumexp(0.25 * log_like) - logsumexp(0.5 * log_like)))
    before = state
    state, info = tempered.step(rng, state, particles, ratio, solve, _FixedParticles.move)
    assert state.beta == 1.0 and particles.moved_at == [0.25, 1.0]
    assert state.log_z == pytest.approx(before.log_z + logsumexp(before.log_w + 0.75 * log_like))
    assert info.resampled and np.allclose(state.log_w, -np.log(4))  # the ESS fell to 1.95 of 4
    # the adaptive solver picks the largest β' whose conditional ESS fraction stays at rho
    adaptive = tempered.adaptive_temperature(0.9)(tempered.TemperedState(np.full(4, -np.log(4)), 0.0, 0.0), log_like)
    assert 0.0 < adaptive < 1.0
    assert tempered.conditional_ess(np.full(4, -np.log(4)), log_like, adaptive) == pytest.approx(0.9, abs=1e-6)



class _KeptParticles(_FixedParticles):
    """Particles that a move leaves where they are (it keeps all of the last push)."""

    def move(self, beta, num_sweeps=1):
        self.moved_at.append(beta)


class _RedrawnParticles(_FixedParticles):
    """Particles whose log-likelihoods a move deals out afresh (it keeps little of the last push)."""

    def move(self, beta, num_sweeps=1):
        self.moved_at.append(beta)
        self.log_like = np.random.default_rng(len(self.moved_at)).permutation(self.log_like)


def test_following_moves_shrink_the_steps_by_what_a_move_keeps():
    """After a move that keeps the particles where they were (c = 1, taken as MAX_KEPT) the next step's conditional
    χ² is (1/rho − 1)(1 − MAX_KEPT); after one that deals them out afresh (c near 0) nearly rho's own."""
    log_like = -np.arange(64, dtype=np.float64) ** 1.5
    state = tempered.TemperedState(np.full(64, -np.log(64)), 0.0, 0.0)
    ratio = lambda ps: ps.log_like  # noqa: E731
    for particles, kept, tolerance in ((_KeptParticles(log_like), tempered.MAX_KEPT, 1e-6),
                                       (_RedrawnParticles(log_like), 0.0, 0.3)):
        solve, move = tempered.following_moves(tempered.PathOptions(0.9, follow_moves=True), ratio)
        for share in (1.0, 1.0 - kept):  # before any move the steps are rho's own
            beta = solve(state, ratio(particles))
            chi2 = 1.0 / tempered.conditional_ess(state.log_w, particles.log_like, beta) - 1.0
            assert chi2 == pytest.approx((1 / 0.9 - 1) * share, rel=tolerance)
            move(particles, beta)
