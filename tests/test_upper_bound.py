"""The reverse-annealing upper bound (bidirectional Monte Carlo, Grosse, Ghahramani & Adams 2015):
above the exact evidence within its error on small cases, unbiased for 1/p(X) on the natural
scale over exact posterior draws, above the forward estimate at realistic size, and bad options
rejected before any sampling."""

import itertools

import jax
import numpy as np
import pytest
from scipy.special import logsumexp

import bam_ppl as bam
from bam_ppl.infer.prepare import configs_of_allocation, prepare
from bam_ppl.infer.smc import reverse
from bam_ppl.infer.smc.mixture import MixtureStart
from bam_ppl.infer.smc.references import (
    references_from_allocations,
    uniform_reference,
    with_reference,
)
from bam_ppl.infer.smc.symmetry import label_symmetries_of
from bam_ppl.infer.smc.tempered_problem import build_tempered_problem

SMALL_CASES = {
    "nmf2": (bam.models.nmf(2), (3, 4), 12),
    "cp2": (bam.models.cp(2), (2, 2, 3), 10),
}


def _small(name):
    model, shape, total = SMALL_CASES[name]
    S, X = model.sample(jax.random.key(3), shape=shape, total=total)
    return model, S, X


def _posterior_allocations(model, X):
    """Every allocation (cells, counts) consistent with X and its log p(X, S), by enumeration."""
    data, bound, layout, _ = prepare(model, X)
    full = bound.full_cells(data, layout).reshape(-1, len(bound.nodes))
    per_cell = [[np.bincount(c, minlength=layout.num_configs) for c in
                 itertools.combinations_with_replacement(range(layout.num_configs), int(n))] for n in data.counts]
    allocations, log_joint = [], []
    for choice in itertools.product(*per_cell):
        counts = np.concatenate(choice)
        keep = counts > 0
        allocations.append((full[keep], counts[keep]))
        log_joint.append(bound.log_prob_cells(full[keep], counts[keep]))
    return allocations, np.array(log_joint)


@pytest.mark.parametrize("name, path", [("nmf2", "urn"), ("cp2", "urn"), ("nmf2", "reference"), ("cp2", "search")])
def test_bound_lies_above_the_exact_value_within_its_error(name, path):
    model, S, X = _small(name)
    exact = bam.log_evidence(model, X, method="exact").value
    reference = "search" if path == "search" else None
    if path == "reference":  # found without S: the most probable allocation
        allocations, log_joint = _posterior_allocations(model, X)
        reference = allocations[int(np.argmax(log_joint))]
    est = bam.evidence_upper_bound(model, X, S, rng_key=0, num_chains=32, num_temperatures=100, reference=reference)
    assert est.kind == "upper_bound" and est.method == "reverse"
    assert est.details["referenced"] == (reference is not None)
    assert est.value >= exact - 3 * est.stderr, (est, exact)
    assert est.value <= exact + 0.5, (est, exact)  # tight at 100 temperatures on a dozen tokens
    assert est.details["lower_bound"] <= exact
    runs = np.asarray(est.details["run_upper_bound"])
    assert runs.shape == (32,) and est.run_values == tuple(runs) and est.num_runs == 32
    assert est.lower_bound == est.details["lower_bound"]
    assert est.value == pytest.approx(-bam.evidence.pool_runs(-runs)[0])


@pytest.mark.parametrize("swapped", [False, True])
def test_bound_is_tight_from_either_labelling_of_many_tokens(swapped):
    """Two cells of 300 and 200 tokens under NMF(2), a = 1: the posterior puts half its mass on each
    labelling of one allocation, so either is an exact draw. From the labels the reference does not cover,
    a run loses weight at every temperature until a relabelling move carries it over (about 1 nat here with
    moves evenly spaced over the path); with a move wherever 1 − β grows by 5 %, the bound is within 0.5 nats
    of the exact value from either labelling."""
    model = bam.models.nmf(2, a=1.0)
    X = np.array([[300, 0, 0], [0, 200, 0]])
    exact = bam.log_evidence(model, X, method="exact").value
    S = np.zeros((2, 2, 3), np.int64)  # axes (k, i, j)
    S[0, 0, 0], S[1, 1, 1] = 300, 200
    reference = (np.array([[1, 0, 0], [0, 1, 1]]), np.array([300, 200]))  # the other labelling of S
    est = bam.evidence_upper_bound(model, X, S[::-1] if swapped else S, rng_key=0, reference=reference)
    assert np.exp(est.lower_bound - exact) == pytest.approx(0.5, abs=1e-3)
    assert exact - 3 * est.stderr <= est.value <= exact + 0.5, (est, exact)


@pytest.mark.parametrize("path", ["urn", "reference", "mixture"])
def test_inverse_evidence_is_unbiased_on_the_natural_scale(path):
    """One reverse run from each of N exact posterior draws (drawn by enumeration): exp(−value)
    has expectation 1/p(X), so mean(p(X) exp(−value)) = 1 within its standard error. The test fails
    beyond 4 standard errors (a false alarm once in 16 000 runs). Four temperatures only: the
    log-scale values then lie well above log p(X), so a weight of the wrong form would show. From a
    reference (built from the most probable allocation, not from the draws), with a relabelling
    move at every temperature: the moves must leave every tempered target invariant. From a mixture of
    two such references and the uniform one, unequally weighted, with a move of the component and the labels
    at every temperature: the extended targets' normaliser is 1 at β = 0."""
    model, _, X = _small("nmf2")
    allocations, log_joint = _posterior_allocations(model, X)
    exact = bam.log_evidence(model, X, method="exact").value
    assert logsumexp(log_joint) == pytest.approx(exact, abs=1e-9)
    N = 4000
    draws = np.random.default_rng(0).choice(len(allocations), size=N, p=np.exp(log_joint - exact))
    data, bound, layout, _ = prepare(model, X)
    tp = build_tempered_problem(bound, data, layout)
    relabellings, start = None, None
    if path != "urn":
        ranked = np.argsort(-log_joint)
        q, other = references_from_allocations(model, X, [allocations[ranked[0]], allocations[ranked[len(ranked) // 2]]],
                                               0, reference_sweeps=20)
        relabellings = label_symmetries_of(bound, data, layout).relabellings
        assert relabellings.shape[0] == 2
        if path == "reference":
            tp = with_reference(tp, q.log_q)
        else:
            log_q = np.stack([q.log_q, other.log_q, uniform_reference(tp)])
            start = MixtureStart(log_q, np.log([0.5, 0.3, 0.2]))
    configs = np.stack([configs_of_allocation(bound, data, layout, tp.token_cell, allocations[d], "allocation")
                        for d in draws])
    values = reverse.reverse_upper_bounds(tp, configs, reverse.fixed_schedule(4), 1, "numba", 1, relabellings, start)
    ratio = np.exp(exact - values)
    z = (ratio.mean() - 1.0) / (ratio.std(ddof=1) / np.sqrt(N))
    assert abs(z) < 4.0, (ratio.mean(), z)
    assert values.mean() > exact + 0.1  # Jensen's gap at four temperatures: the test has power


def test_jax_kernel_gives_a_bound_too():
    model, S, X = _small("nmf2")
    exact = bam.log_evidence(model, X, method="exact").value
    est = bam.evidence_upper_bound(model, X, S, rng_key=0, num_chains=8, num_temperatures=50, engine="jax")
    assert est.details["kernel"] == "jax"
    assert exact - 3 * est.stderr <= est.value <= exact + 1.0, (est, exact)


@pytest.mark.parametrize("options, error, name", [
    (dict(num_chains=1), ValueError, "num_chains"),
    (dict(num_chains=4.0), TypeError, "num_chains"),
    (dict(num_temperatures=0), ValueError, "num_temperatures"),
    (dict(num_temperatures="10"), TypeError, "num_temperatures"),
    (dict(num_sweeps=0), ValueError, "num_sweeps"),
    (dict(engine="gpu"), ValueError, "engine"),
    (dict(engine=1), TypeError, "engine"),
    (dict(start_a=-1.0), ValueError, "start_a"),
    (dict(max_configs=0), ValueError, "max_configs"),
    (dict(rng_key=-1), ValueError, "rng_key"),
    (dict(rng_key="0"), TypeError, "rng_key"),
    (dict(reference="S"), ValueError, "reference"),
    (dict(reference=1), TypeError, "reference"),
    (dict(reference="search", engine="jax"), ValueError, "engine"),
    (dict(reference_sweeps=-1), ValueError, "reference_sweeps"),
])
def test_bad_options_raise_before_sampling(monkeypatch, options, error, name):
    monkeypatch.setattr(reverse, "reverse_upper_bounds", _never)
    monkeypatch.setattr(reverse, "_reference_path", _never)
    model, S, X = _small("nmf2")
    with pytest.raises(error, match=name):
        bam.evidence_upper_bound(model, X, S, **options)


def test_an_allocation_that_does_not_give_X_raises(monkeypatch):
    monkeypatch.setattr(reverse, "reverse_upper_bounds", _never)
    monkeypatch.setattr(reverse, "_reference_path", _never)
    model, S, X = _small("nmf2")
    other, _ = model.sample(jax.random.key(4), shape=(3, 4), total=12)
    with pytest.raises(ValueError, match="allocation"):
        bam.evidence_upper_bound(model, X, other)
    with pytest.raises(ValueError, match="allocation must have shape"):
        bam.evidence_upper_bound(model, X, S[:1])
    with pytest.raises(ValueError, match="allocation"):
        bam.evidence_upper_bound(model, X, -S)
    with pytest.raises(TypeError, match="allocation"):
        bam.evidence_upper_bound(model, X, "S")
    cells = np.argwhere(other > 0)
    with pytest.raises(ValueError, match="reference"):
        bam.evidence_upper_bound(model, X, S, reference=(cells, other[tuple(cells.T)]))


def _never(*args, **kwargs):
    raise AssertionError("sampling started before the options were checked")


def test_a_bound_below_the_allocation_s_joint_warns(monkeypatch):
    """Below log p(X, S) of its own allocation the value bounds nothing: S was not a posterior draw."""
    model, S, X = _small("nmf2")
    monkeypatch.setattr(reverse, "reverse_upper_bounds", lambda *args: np.full(4, -1e3))
    with pytest.warns(bam.EvidenceWarning, match="not a draw of this model's posterior"):
        est = bam.evidence_upper_bound(model, X, S, num_chains=4)
    assert len(est.warnings) == 1


def test_compare_and_plot_keep_an_upper_bound_apart():
    """An upper bound is a row of its own kind in compare and an open downward marker in a plot;
    pooling never adds it to estimates (log_evidence pools only kind "estimate")."""
    import matplotlib

    matplotlib.use("Agg")
    model, S, X = _small("nmf2")
    upper = bam.evidence_upper_bound(model, X, S, num_chains=4, num_temperatures=20)
    exact = bam.log_evidence(model, X, method="exact")
    table = bam.compare({"exact 2": exact, "reverse 2": upper}, data=None)
    assert table.loc["reverse 2", "kind"] == "upper_bound"
    assert not table.loc["reverse 2", "below_bound"]
    ax = bam.plot_evidence(table)
    labels = ax.get_legend_handles_labels()[1]
    assert any("upper bound" in label for label in labels), labels


@pytest.mark.slow
@pytest.mark.stats
def test_the_sandwich_at_realistic_size():
    """NMF(4) on 50 × 70 counts of T = 1000 tokens simulated from the model itself: the reverse
    bound, annealed back to the mixture of a default call's searches (``reference="search"``), lies
    above the default forward estimate within their combined error (3 of them), and at most 2 nats (the goal of
    benchmarks/README.md) above it beyond that error; the width of the sandwich is reported."""
    model = bam.models.nmf(4, a=200.0)
    S, X = model.sample(jax.random.key(0), shape=(50, 70), total=1000)
    forward = bam.log_evidence(model, X, rng_key=0)
    upper = bam.evidence_upper_bound(model, X, S, rng_key=0, reference="search")
    combined = np.hypot(forward.stderr, upper.stderr)
    width = upper.value - forward.value
    print(f"forward {forward.value:.2f} ± {forward.stderr:.2f}, upper bound {upper.value:.2f} ± "
          f"{upper.stderr:.2f}: sandwich width {width:.2f} nats")
    assert -3 * combined <= width <= 2.0 + 3 * combined, (forward, upper)
