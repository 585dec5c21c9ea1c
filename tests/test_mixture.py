"""The tempered SMC from a mixture of references: unbiased on the natural scale with a fixed
schedule (exact enumeration), its last reweighting counts every basin and relabelled copy once,
and the estimator matches exact values on tiny data."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import pytest
from scipy.special import logsumexp

import bam_ppl as bam
from bam_ppl.data import CountTensor
from bam_ppl.infer.exact import exact_log_evidence
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.smc import mixture, mixture_start, references, tempered, tempered_problem
from bam_ppl.infer.smc import symmetry as symmetries


def _problem(model, X):
    data, bound, layout, _ = prepare(model, X)
    return tempered_problem.build_tempered_problem(bound, data, layout), symmetries.label_symmetries_of(bound, data, layout)


def _random_log_q(tp, seed, concentration=1.0):
    q = np.random.default_rng(seed).dirichlet(np.full(tp.num_configs, concentration), size=tp.cell_start.size - 1)
    return np.log(q)


def _start(tp, seeds, weights):
    log_q = np.stack([_random_log_q(tp, s, 0.3) for s in seeds])
    log_w = np.log(np.asarray(weights, np.float64) / np.sum(weights))
    return mixture_start.MixtureStart(log_q, log_w)


def test_component_sizes_and_start_weights_draw_the_mixture():
    start = mixture_start.MixtureStart(np.zeros((3, 1, 1)), np.log(np.array([0.5, 0.3, 0.2])))
    sizes = mixture_start.component_sizes(start.log_weights, 7)
    assert sizes.sum() == 7 and list(sizes) == [4, 2, 1]
    log_w = mixture_start.initial_log_weights(start, sizes)
    # Each component carries its weight w_b whatever its number of particles.
    np.testing.assert_allclose([np.exp(log_w[:4]).sum(), np.exp(log_w[4:6]).sum(), np.exp(log_w[6:]).sum()],
                               [0.5, 0.3, 0.2])
    # A component with no particle leaves the mixture; the others share its weight.
    sizes = mixture_start.component_sizes(start.log_weights, 2)
    assert list(sizes) == [1, 1, 0]
    np.testing.assert_allclose(np.exp(mixture_start.initial_log_weights(start, sizes)), [0.625, 0.375])


def test_last_weights_share_every_basin_and_relabelling_exactly_once():
    # Σ_b w_b Σ_h f(b, h(z)) = |G| for every z: the identity behind E[f] = 1 under w_b p(z | X).
    model, X = bam.models.nmf(3, a=1.0), np.array([[2, 1, 0], [0, 1, 3], [1, 0, 1]])
    tp, symmetry = _problem(model, X)
    start = _start(tp, [1, 2, 2], [0.5, 0.2, 0.3])  # the same reference twice: one basin, shared
    relabellings = symmetry.relabellings
    z = np.random.default_rng(3).integers(0, tp.num_configs, (20, tp.token_cell.size))
    orbits = np.stack([relabellings[h][z] for h in range(relabellings.shape[0])], 1).reshape(-1, z.shape[1])
    total = np.zeros(orbits.shape[0])
    for b, w in enumerate(np.exp(start.log_weights)):
        total += w * np.exp(mixture_start.mixture_log_weights(tp, start, symmetry, orbits, np.full(orbits.shape[0], b)))
    np.testing.assert_allclose(total.reshape(20, -1).sum(1), relabellings.shape[0], rtol=1e-10)


def test_a_reference_covers_its_chains_region_and_its_relabellings_not_another_basin():
    # A start whose chain lies where a reference's own chain went (up to relabelling) stops and adds its weight to
    # that reference; an allocation far from every state the chain visited is not covered.
    model = bam.models.nmf(2, a=1.0)
    X = np.kron(np.eye(2, dtype=np.int64), np.full((2, 2), 20))  # two blocks: one basin, two relabelled copies
    problem, _ = mixture.mixture_problem(model, X, 10**6)
    problem = problem._replace(augmented=False)  # collapsed chains, which covering applies to
    tp = problem.tp
    config = np.random.default_rng(0).integers(0, tp.num_configs, tp.token_cell.size)
    chain = references.start_chain(tp, None, config, np.array([1, 2], np.uint32))
    chain.sweep(100)
    found = [references.drive(mixture.finish(problem, mixture.Started(chain, np.nan, config, 200)))]
    assert mixture.covered_by(problem, [], chain.config()) == -1
    assert np.isfinite(found[0].floor) and found[0].log_q is not None
    assert mixture.covered_by(problem, found, chain.config()) == 0  # its last state: the least covered is the floor
    swapped = problem.symmetry.relabellings[1][chain.config()]
    assert not np.array_equal(swapped, chain.config()) and mixture.covered_by(problem, found, swapped) == 0
    assert mixture.covered_by(problem, found, np.zeros_like(config)) == -1  # every token in one class


def test_a_start_stops_where_a_reference_covers_it_and_a_mode_is_not_covered():
    # Checks after 0, 1, 2, 4, ... sweeps up to halfway (collapsed chains), halfway only for data augmentation; a
    # start whose state lies within a reference's range stops at once, a state scoring above every state the
    # reference's chain visited (a mode) is not covered, and with nothing found a start builds a reference.
    problem, _ = mixture.mixture_problem(bam.models.nmf(2, a=1.0), np.kron(np.eye(2, dtype=np.int64),
                                                                          np.full((2, 2), 20)), 10**6)
    collapsed = problem._replace(augmented=False)
    np.testing.assert_array_equal(mixture.check_marks(collapsed, 200), [0, 1, 2, 4, 8, 16, 32, 64, 100])
    assert mixture.check_marks(collapsed._replace(augmented=True), 200).tolist() == [100]
    options = mixture.effort_sizes(1.0)._replace(reference_sweeps=40, sweeps_per_token=0.0)
    seeds = np.array([[1, 2], [3, 4]], np.uint32)
    config = np.random.default_rng(0).integers(0, collapsed.tp.num_configs, collapsed.tp.token_cell.size)
    built = references.drive(mixture.scout(collapsed, options, seeds, config, []))
    assert built.log_q is not None and built.sweeps == 40 and built.floor <= built.ceiling
    chain = references.start_chain(collapsed.tp, None, config, seeds[1])
    chain.sweep(40)
    score = symmetries.orbit_log_sums(collapsed.tp, built.log_q, chain.config()[None], collapsed.symmetry)[1][0]
    inside = references.drive(mixture.scout(collapsed, options, seeds, chain.config(),
                                            [built._replace(floor=score - 1.0, ceiling=score + 1.0)]))
    assert (inside.log_q, inside.covered_by, inside.sweeps) == (None, 0, 0)
    above = built._replace(ceiling=score - 1.0, floor=score - 2.0)
    assert mixture.covered_by(collapsed, [above], chain.config()) == -1
    assert mixture.covered_by(collapsed, [above._replace(ceiling=score + 1.0)], chain.config()) == 0


def test_a_search_keeps_one_reference_per_region_its_starts_reach(monkeypatch):
    # Every start stops where an earlier reference of its search covers it, the first of each kind (VB fit, annealed
    # scout, draw) too: a second reference of one basin would only spread the last reweighting.
    problem, _ = mixture.mixture_problem(bam.models.nmf(2, a=1.0), np.kron(np.eye(2, dtype=np.int64),
                                                                          np.full((2, 2), 5)), 10**6)
    collapsed = problem._replace(augmented=False)
    monkeypatch.setattr(mixture, "covered_by", lambda problem, found, config: 0 if found else -1)
    options = mixture.effort_sizes(1.0)._replace(reference_sweeps=10, sweeps_per_token=0.0)
    config = np.random.default_rng(0).integers(0, collapsed.tp.num_configs, collapsed.tp.token_cell.size)
    seeds = np.arange(12, dtype=np.uint32).reshape(3, 2, 2)
    found = references.drive(mixture.run_search(collapsed, options, seeds, [config, "annealed", "drawn"]))
    assert found[0].log_q is not None and found[0].covered_by == -1
    assert [(f.log_q, f.covered_by, f.sweeps) for f in found[1:]] == [(None, 0, 0), (None, 0, 0)]


def test_the_climb_statistic_is_the_likelihood_at_the_tables_posterior_mean():
    # references.mean_table_log_likelihood: Σ_u X_u log Σ_l Π_m θ̄_m[f_m(u, l)], θ̄ = (α + n) / column sums, n the
    # allocation's table counts (posterior_concentration, the data-augmentation chain's), summed here cell by cell.
    from bam_ppl.infer.gibbs.augmented_numba import posterior_concentration

    X = np.array([[5, 0, 2], [1, 7, 0], [0, 3, 4]])
    problem, _ = mixture.mixture_problem(bam.models.nmf(2, a=0.7), X, 10**6)
    tp = problem.tp
    host = problem.host
    config = np.random.default_rng(3).integers(0, tp.num_configs, tp.token_cell.size)
    split = np.zeros(host.valid.shape, np.int64)
    np.add.at(split, (tp.token_cell, config), 1)
    concentration = np.empty(host.alpha.shape[0])
    posterior_concentration(split, host, concentration)
    theta = concentration / np.bincount(host.column_of, concentration)[host.column_of]
    expected = sum(host.counts[u] * np.log(sum(np.prod([theta[host.cell_flat[m, u] + host.config_flat[m, l]]
                                                        for m in range(host.cell_flat.shape[0])])
                                               for l in range(host.valid.shape[1]) if host.valid[u, l]))
                   for u in range(host.counts.size))
    assert references.mean_table_log_likelihood(tp.token_cell, host, config) == pytest.approx(
        expected, rel=1e-12)


@pytest.mark.parametrize("values, climbing", [
    (np.arange(16.0), True),  # a steady rise
    (np.r_[np.zeros(8), np.ones(8)] + np.tile([0.1, -0.1], 8), True),  # a step up, far beyond the noise
    (np.tile([1.0, -1.0], 8), False),  # noise about one level
    (np.arange(16.0)[::-1], False),  # a fall from a mode into a basin's bulk
])
def test_a_chain_still_climbing_over_its_average_averages_once_more(values, climbing, monkeypatch):
    # still_climbing: the later half of the recorded states' statistic above the earlier by two standard errors;
    # finish() then averages the chain's next half afresh and counts its sweeps.
    problem, _ = mixture.mixture_problem(bam.models.nmf(2, a=1.0), np.kron(np.eye(2, dtype=np.int64),
                                                                          np.full((2, 2), 20)), 10**6)
    problem = problem._replace(augmented=False)
    sequence = iter(values)
    monkeypatch.setattr(mixture, "mean_table_log_likelihood", lambda *_: next(sequence))
    assert mixture.still_climbing(problem, np.zeros((16, problem.tp.token_cell.size), np.int64)) is climbing
    monkeypatch.setattr(mixture, "still_climbing", lambda *_: climbing)
    config = np.zeros(problem.tp.token_cell.size, np.int64)
    chain = references.start_chain(problem.tp, None, config, np.array([1, 2], np.uint32))
    found = references.drive(mixture.finish(problem, mixture.Started(chain, np.nan, config, 40)))
    assert found.sweeps == (60 if climbing else 40) and found.log_q is not None


def test_two_searches_driven_together_make_the_draws_each_makes_alone():
    # drive_pair sweeps two collapsed chains in one kernel where both wait on sweeps: each chain's states, reference
    # and recorded states are those it reaches driven alone, whatever the requests' lengths; a data-augmentation
    # chain (a dense table's) goes in turn with a collapsed one.
    X = np.kron(np.eye(2, dtype=np.int64), np.full((2, 2), 20))
    problem, _ = mixture.mixture_problem(bam.models.nmf(2, a=1.0), X, 10**6)
    tp = problem.tp
    assert problem.cells is not None
    configs = np.random.default_rng(5).integers(0, tp.num_configs, (2, tp.token_cell.size))

    def steps(k, cells=None):
        chain = references.start_chain(tp, cells, configs[k], np.array([7, k], np.uint32))
        yield chain, 3 + 5 * k  # unequal requests: the pair sweeps their common part, the rest alone
        reference = yield from references.averaged_reference_steps(chain, 37 + 4 * k)
        return chain.config(), reference

    def check(together, alone):
        for (config, reference), (config_alone, reference_alone) in zip(together, alone):
            np.testing.assert_array_equal(config, config_alone)
            np.testing.assert_array_equal(reference.log_q, reference_alone.log_q)
            np.testing.assert_array_equal(reference.states, reference_alone.states)

    first, second = (references.start_chain(tp, None, configs[k], np.array([1, k], np.uint32)) for k in range(2))
    assert references._Chain.pairable(first, second)
    check(references.drive_pair(steps(0), steps(1)), [references.drive(steps(k)) for k in range(2)])
    check(references.drive_pair(steps(0, problem.cells), steps(1)),
          [references.drive(steps(0, problem.cells)), references.drive(steps(1))])


def test_the_start_weighs_each_reference_by_the_starts_it_carries():
    # Two references, the first covering two later starts: weights 3 : 1, and the defensive component one start's.
    tp, _ = _problem(bam.models.nmf(2, a=1.0), np.array([[2, 1], [0, 2]]))
    log_q = _random_log_q(tp, 1)
    found = [mixture.Scouted(log_q, np.nan, None, 10, 0.0), mixture.Scouted(None, np.nan, None, 5, covered_by=0),
             mixture.Scouted(log_q, np.nan, None, 10, 0.0), mixture.Scouted(None, np.nan, None, 5, covered_by=0)]
    start = mixture.defended_start(found, tp)
    assert start.log_q.shape[0] == 3
    np.testing.assert_allclose(np.exp(start.log_weights), [0.6, 0.2, 0.2])
    options = mixture.effort_sizes(1.0)._replace(min_particles=1)
    assert mixture.call_particles(options, len(found)) == options.particles_per_reference * 5


def _mixture_runs(model, X, start_seeds, weights, num_runs, schedule, num_particles=12, call=None):
    tp, symmetry = _problem(model, X)
    start = _start(tp, start_seeds, weights)
    values = []
    with ThreadPoolExecutor(2) as pool:
        for r in range(num_runs):
            keys = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(r), tempered.NUM_BLOCKS + 1)))
            particles = mixture_start.MixtureParticles(tp, num_particles, keys[:-1].astype(np.uint32), pool, start)
            run = tempered._one_run(
                particles, references.with_reference(tp, particles.start.log_q[0]),
                np.random.default_rng(keys[-1].astype(np.uint32)),
                tempered.PathOptions(0.9, 1, schedule), initial_log_w=particles.initial_log_weights(),
                final_log_weights=lambda ps: mixture_start.mixture_log_weights(
                    tp, ps.start if call is None else call.start, symmetry, np.asarray(ps.config),
                    ps.component + (0 if call is None else call.first)))
            assert np.all(np.diff(particles.component) >= 0)  # components stay contiguous through resampling
            values.append(run.log_evidence + run.log_relabelled)
    return np.array(values)


@pytest.mark.parametrize("weights, num_particles", [([1, 1, 1], 12), ([0.6, 0.3, 0.1], 12), ([0.9, 0.05, 0.05], 4),
                                                    ([0.05, 0.05, 0.9], 4)])
def test_mixture_start_with_a_fixed_schedule_is_unbiased(weights, num_particles):
    # exp of every run is unbiased for p(X) on the natural scale, whatever the references and weights,
    # also where components get no particle and leave the mixture (sizes 4, 0, 0 and 0, 0, 4: then the
    # first particle belongs to the last component).
    model, X = bam.models.nmf(2, a=1.0), np.array([[2, 1], [0, 2]])
    values = _mixture_runs(model, X, [3, 4, 5], weights, 300, [0.3, 0.6, 1.0], num_particles)
    ratios = np.exp(values - exact_log_evidence(model, X))
    assert abs(ratios.mean() - 1.0) <= 4 * ratios.std(ddof=1) / np.sqrt(ratios.size), ratios.mean()


def test_runs_from_their_own_starts_reweighted_by_the_calls_start_are_unbiased_together():
    # Two runs from different starts, each reweighted at the end by q̄ = (q_1 + q_2) / 2 (the balance heuristic):
    # the mean of their exps is unbiased for p(X), though each alone need not be.
    model, X = bam.models.nmf(2, a=1.0), np.array([[2, 1], [0, 2]])
    tp, _ = _problem(model, X)
    own = [([3, 4], [0.7, 0.3]), ([5], [1.0])]
    calls = mixture_start.call_starts([_start(tp, *seeds) for seeds in own], 12)
    assert [call.first for call in calls] == [0, 2] and calls[0].run_of.tolist() == [0, 0, 1]
    first, second = (_mixture_runs(model, X, *seeds, 300, [0.3, 0.6, 1.0], call=call) for seeds, call in zip(own, calls))
    ratios = (np.exp(first - exact_log_evidence(model, X)) + np.exp(second - exact_log_evidence(model, X))) / 2
    assert abs(ratios.mean() - 1.0) <= 4 * ratios.std(ddof=1) / np.sqrt(ratios.size), ratios.mean()


def test_the_searches_shares_give_the_rest_of_the_calls_start_and_each_searchs_own():
    # The log shares of the searches' starts in the call's reweight a run by any part of the call's start: without
    # search 1's components (weights rescaled) the rest of the call's start; with search 0's alone, its own.
    model, X = bam.models.nmf(2, a=1.0), np.array([[2, 1, 0], [0, 2, 1]])
    tp, symmetry = _problem(model, X)
    starts = [_start(tp, [3, 4], [0.7, 0.3]), _start(tp, [5], [1.0]), _start(tp, [6], [1.0])]
    call = mixture_start.call_starts(starts, 12)[0]
    config = np.random.default_rng(0).integers(0, tp.num_configs, (5, tp.token_cell.shape[0])).astype(np.int32)
    component = np.array([0, 1, 0, 1, 1])
    full, shares = mixture_start.mixture_log_weights(tp, call.start, symmetry, config, component, call.run_of)
    np.testing.assert_allclose(full, mixture_start.mixture_log_weights(tp, call.start, symmetry, config, component))
    np.testing.assert_allclose(logsumexp(shares, axis=0), 0.0, atol=1e-12)
    kept = call.run_of != 1
    rest = mixture_start.MixtureStart(call.start.log_q[kept], call.start.log_weights[kept] + np.log(1.5))
    without = full - logsumexp(shares[[0, 2]], axis=0) - np.log(1.5)
    np.testing.assert_allclose(without, mixture_start.mixture_log_weights(tp, rest, symmetry, config, component))
    own = mixture_start.kept_start(starts[0], 12)[0]
    np.testing.assert_allclose(full - shares[0] - np.log(3.0),
                               mixture_start.mixture_log_weights(tp, own, symmetry, config, component))


MISSING = CountTensor.from_samples(
    np.array([[0, 1, 0], [1, -1, 0], [0, 0, -1], [1, 1, 1], [-1, 0, 1], [0, 1, 0]]), shape=(2, 2, 2))
CASES = {
    "nmf": (bam.models.nmf(2, a=1.0), np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])),
    "nmf3_small_a": (bam.models.nmf(3, a=0.1), np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])),
    "cp": (bam.models.cp(2, a=1.0), np.random.default_rng(7).integers(0, 2, (2, 3, 2))),
    "missing_entries": (bam.models.cp(2, a=1.0), MISSING),
    "symmetric_nmf_tied": (bam.models.symmetric_nmf(2, a=0.5), np.array([[2, 1, 0], [1, 0, 1], [0, 1, 2]])),
    "chain_latent_middle": (bam.AllocationModel("i -> k; k -> j", latent={"k": 3}, observed=("i", "j"), a=1.0),
                            np.array([[3, 1, 0], [0, 2, 2]])),
    # Many tokens per cell: the references' chains are data-augmentation chains (a cell at a time).
    "dense_nmf": (bam.models.nmf(2, a=1.0), np.array([[60, 8], [6, 50]])),
}


def test_every_run_has_a_search_of_its_own_with_its_share_of_the_vb_fits():
    # Each run's starts: its share of the VB fits, then of the annealed and drawn scouts; runs anneal from their own.
    model, X = CASES["nmf"]
    est = bam.log_evidence(model, X, method="mixture", rng_key=2, num_chains=2, num_scouts=4, num_particles=16,
                           vb_restarts=8)
    info = est.info
    assert info.num_scouts == 4 and len(info.scout_log_evidence) == len(info.chain_sweeps) == 2
    for values in info.scout_log_evidence:  # two VB fits, two annealed and two drawn scouts
        assert len(values) == 2 + 2 * 2
        assert np.all(np.isfinite(values[2::2])) and np.all(np.isnan(values[:2] + values[3::2]))
    # The VB bound: the best restart's ELBO over the runs, below log p(X); each run's restarts its own.
    exact = exact_log_evidence(model, X)
    assert est.details["vb_bound"] <= exact
    share = mixture.run_share(mixture.effort_sizes(1.0)._replace(num_scouts=4, vb_restarts=8), 2)
    assert (share.num_scouts, share.vb_restarts, mixture.vb_fits(share)) == (2, 4, 2)
    keys = mixture.call_seeds(jax.random.PRNGKey(2), 2, 6).vb
    data, bound, layout, _ = prepare(model, X)
    tp = tempered_problem.build_tempered_problem(bound, data, layout)
    fits = [mixture.vb_start_configs((bound, data, layout), tp, key, share) for key in keys]
    assert max(elbo for _, elbo in fits) == est.details["vb_bound"]
    assert [len(configs) for configs, _ in fits] == [2, 2]
    for config in [config for configs, _ in fits for config in configs]:  # allocations of X: every token configured
        assert config.shape == tp.token_cell.shape and config.min() >= 0 and config.max() < tp.num_configs
    # Without VB restarts the searches have only their scouts, and no VB bound.
    plain = bam.log_evidence(model, X, method="mixture", rng_key=2, num_chains=2, num_scouts=3, num_particles=16,
                             vb_restarts=0)
    assert [len(own) for own in plain.info.chain_sweeps] == [4, 4] and plain.details["vb_bound"] == -np.inf


def test_runs_anneal_as_their_searches_end_and_a_failed_search_ends_the_call(monkeypatch):
    # A run anneals as soon as its own search ends and waits for the call's start only at its last reweighting:
    # the value does not depend on which search ends first; a search that raises ends the call with its error.
    model, X = CASES["nmf"]
    options = dict(method="mixture", rng_key=3, num_chains=3, num_scouts=3, num_particles=16, vb_restarts=4)
    first = bam.log_evidence(model, X, **options)
    searched_group = mixture.searched_group

    def first_search_last(problem, plan, prepared, group):
        if 0 in group:
            time.sleep(1.0)
        return searched_group(problem, plan, prepared, group)

    monkeypatch.setattr(mixture, "searched_group", first_search_last)
    assert bam.log_evidence(model, X, **options).run_values == first.run_values

    def failing(problem, plan, prepared, group):
        if 1 in group:
            raise ArithmeticError("search 1 failed")
        return searched_group(problem, plan, prepared, group)

    monkeypatch.setattr(mixture, "searched_group", failing)
    with pytest.raises(ArithmeticError, match="search 1 failed"):
        bam.log_evidence(model, X, **options)
    calls = mixture_start.PendingCallStarts(2, 16)
    calls.add(0, _start(_problem(model, X)[0], [1], [1.0]))
    calls.fail()
    with pytest.raises(RuntimeError, match="search failed"):
        calls.waiter(0)()


@pytest.mark.parametrize("name", sorted(CASES))
def test_mixture_estimate_matches_exact(name):
    model, X = CASES[name]
    est = bam.log_evidence(model, X, method="mixture", rng_key=1, num_chains=6)
    exact = exact_log_evidence(model, X)
    assert est.method == "mixture" and len(est.run_values) == 6
    assert est.info.chain == ("augmented" if name == "dense_nmf" else "collapsed")
    assert abs(est.value - exact) <= 4 * est.stderr + 0.05, (est.value, est.stderr, exact)
    assert est.lower_bound <= exact + 1e-9


@pytest.mark.parametrize("option, value, error", [
    ("effort", 0.0, ValueError), ("effort", "high", TypeError), ("num_chains", 0, ValueError),
    ("num_particles", 1, ValueError), ("num_scouts", 0, ValueError), ("rho", 1.0, ValueError),
    ("reference_sweeps", -1, ValueError), ("vb_restarts", -1, ValueError), ("vb_restarts", 1.5, TypeError),
])
def test_bad_options_are_refused_before_any_work(option, value, error, monkeypatch):
    monkeypatch.setattr(mixture, "prepare", lambda *a, **k: pytest.fail("prepared before checking the options"))
    with pytest.raises(error, match=option):
        mixture.mixture_log_evidence(bam.models.nmf(2), np.array([[2, 1], [0, 2]]), **{option: value})


def test_fewer_particles_than_references_keep_a_mixture_of_some():
    # Components without a particle leave the mixture (the start is then the mixture of the others).
    model, X = CASES["nmf"]
    est = bam.log_evidence(model, X, method="mixture", rng_key=0, num_particles=4, num_scouts=16, vb_restarts=0)
    assert est.info.num_particles == 4 and [len(own) for own in est.info.chain_sweeps] == [8] * 4  # 9 components
    assert np.isfinite(est.value)


def test_search_sizes_follow_the_tokens_within_the_budgets():
    # Chains of 0.8 T sweeps (at least 200, at most the budget); fewer scouts where their chains exceed the
    # search's budget, never none; two particles per reference, at least 32; a number given is used as it is.
    options = mixture.effort_sizes(1.0)
    assert [mixture.chain_sweeps(options, T) for T in (100, 1000, 16_000, 64_000)] == [200, 800, 12_800, 3200]
    scouts = [mixture.scouts_per_kind(options, T) for T in (1000, 4000, 8000, 16_000, 64_000)]
    assert scouts == [20, 20, 20, 5, 5]  # from 16 000 tokens on, chains of the budget (three kinds share it)
    # A data-augmentation chain is charged the draws of its sweeps, not one per token.
    assert mixture.scouts_per_kind(options, 16_000, draws_per_sweep=1600) == 20
    assert [mixture.particles_for(options, B) for B in (4, 68)] == [32, 136]
    given = mixture._options(1.0, 100, 8, 0.9, 50, None)
    assert (mixture.scouts_per_kind(given, 64_000), mixture.chain_sweeps(given, 64_000),
            mixture.particles_for(given, 68)) == (8, 50, 100)
    assert mixture.scouts_per_kind(mixture.effort_sizes(2.0), 16_000) == 10  # effort widens the search


def test_effort_spreads_the_annealing_between_particles_and_temperatures():
    # The particles grow as the starts (two each, at least 32 · effort); each step's conditional χ² shrinks as
    # 1/effort²; at effort 1 the engine's own rho, to the bit; a rho given is used as it is.
    for effort in (0.25, 0.5, 1.0, 2.0, 4.0):
        options = mixture.effort_sizes(effort)
        assert options.particles_per_reference == mixture.ENGINE.particles_per_reference
        assert options.min_particles == max(16, round(32 * effort))
        assert 1.0 / options.rho - 1.0 == pytest.approx((1.0 / mixture.ENGINE.rho - 1.0) / effort ** 2)
    assert mixture.effort_sizes(1.0).rho == mixture.ENGINE.rho
    assert mixture._options(4.0, None, None, 0.9, None, None).rho == 0.9
    assert mixture._options(4.0, None, None, None, None, None).rho == mixture.effort_sizes(4.0).rho


@pytest.mark.parametrize("model", [bam.models.nmf(2, a=2.0), bam.models.cp(3, a=0.5), bam.models.symmetric_nmf(2, a=0.5)],
                         ids=["nmf", "cp", "symmetric_nmf"])
def test_the_chains_factorised_sweep_draws_as_the_general_kernel(model):
    # A token that stays writes nothing: its own configuration reads its counts less one. The draws are
    # those of the general kernel, which takes every token out and puts it back. Under nmf(2, a=2) the
    # column totals' concentration is 1: "one fewer" is zero at a configuration that holds no token.
    X = np.array([[5, 0, 1], [0, 4, 0], [2, 0, 3]]) if len(model.observed) == 2 else \
        np.random.default_rng(1).integers(0, 3, (3, 4, 2))
    tp, _ = _problem(model, X)
    chains = [references._Chain.start(tp, np.zeros(tp.token_cell.shape[0], np.int64), np.array([7, 1], np.uint32))
              for _ in range(2)]
    assert chains[0].factorised is not None
    chains[1] = chains[1]._replace(factorised=None)
    for chain in chains:
        chain.sweep(25)
    np.testing.assert_array_equal(chains[0].state, chains[1].state)
    np.testing.assert_allclose(chains[0].shifted, chains[1].shifted, atol=1e-9)
