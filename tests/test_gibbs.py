"""Collapsed Gibbs (method="gibbs"), JAX and numba kernels: exact posterior means by enumeration,
R-hat, log π(S), options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import gammaln

import bam_ppl as bam
from bam_ppl.convert import attrs_of, group, import_arviz
from bam_ppl.data import CountTensor, as_count_tensor
from bam_ppl.infer import kernels
from bam_ppl.infer.exact import exact_posterior_mean, expected_cell_probabilities
from bam_ppl.infer.gibbs import collapsed as gibbs_core
from bam_ppl.infer.gibbs import collapsed_numba as gibbs_numba
from bam_ppl.models.program import _all_cells, cell_probabilities

X1 = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])  # papers/000 Example 3.3
NUM_CHAINS, NUM_SAMPLES = 4, 1500
# |mean − exact| / MCSE is approximately standard normal; 4.5 keeps the family of 12 cells (and
# the statistics below) from failing by chance.
Z = 4.5
KERNELS = ("jax", "numba")


def _grid(bound, shape):
    return bound.cell_layout(_all_cells(shape))


def _draw_cell_probabilities(idata, bound, grid):
    """p(i_V | Θ) for every draw and every cell of the grid: (chain, draw, cells)."""
    post = group(idata, "posterior")
    shape = (post.sizes["chain"], post.sizes["draw"], -1)
    flat = np.concatenate([post[f"theta_{t.name}"].values.reshape(shape) for t in bound.tables], axis=-1)
    return np.asarray(jax.vmap(jax.vmap(lambda th: cell_probabilities(th, grid)))(jnp.asarray(flat)))


def _mcse_and_rhat(draws):
    """Per-cell MCSE of the mean and rank-normalised R-hat of (chain, draw, cells) draws."""
    az = import_arviz()
    mcse = np.array([np.asarray(az.mcse(draws[..., c])).item() for c in range(draws.shape[-1])])
    rhat = np.array([np.asarray(az.rhat(draws[..., c])).item() for c in range(draws.shape[-1])])
    return mcse, rhat


@pytest.fixture(scope="module")
def nmf_runs():
    """NMF on X1 with each kernel: {kernel: (model, idata)}."""
    model = bam.models.nmf(2, a=1.0)
    return {kernel: (model, bam.infer(model, X1, method="gibbs", rng_key=0, num_warmup=200,
                                      num_samples=NUM_SAMPLES, num_chains=NUM_CHAINS, engine=kernel,
                                      progress_bar=False))
            for kernel in KERNELS}


@pytest.mark.parametrize("kernel", KERNELS)
def test_cell_probabilities_match_enumeration(nmf_runs, kernel):
    model, idata = nmf_runs[kernel]
    bound = model.bind(X1)
    grid = _grid(bound, X1.shape)
    exact = exact_posterior_mean(model, X1, lambda c: expected_cell_probabilities(bound, c, grid))
    draws = _draw_cell_probabilities(idata, bound, grid)
    mcse, _ = _mcse_and_rhat(draws)
    error = np.abs(draws.mean((0, 1)) - exact)
    assert np.all(error < Z * mcse), (error / mcse).max()


@pytest.mark.parametrize("kernel", KERNELS)
def test_rhat_of_label_invariant_quantities(nmf_runs, kernel):
    model, idata = nmf_runs[kernel]
    bound = model.bind(X1)
    draws = _draw_cell_probabilities(idata, bound, _grid(bound, X1.shape))
    _, rhat = _mcse_and_rhat(draws)
    assert rhat.max() < 1.01, rhat
    az = import_arviz()
    assert float(az.rhat(group(idata, "sample_stats")["log_joint"].values)) < 1.01


@pytest.mark.parametrize("kernel", KERNELS)
def test_output_layout(nmf_runs, kernel):
    model, idata = nmf_runs[kernel]
    post = group(idata, "posterior")
    assert post["theta_i"].dims == ("chain", "draw", "k", "i")
    np.testing.assert_allclose(post["theta_i"].values.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(post["theta_k"].values.sum(-1), 1.0, rtol=1e-5)
    assert post["total_rate"].shape == (NUM_CHAINS, NUM_SAMPLES)
    # λ | S ~ Gamma(a + T, b + 1) (eq. 3.10): mean (1 + 9) / (1/9 + 1) = 9.
    assert abs(post["total_rate"].values.mean() - 9.0) < 0.1
    stats = group(idata, "sample_stats")
    assert stats["log_joint"].dims == ("chain", "draw")
    assert attrs_of(idata)["method"] == "gibbs"
    assert attrs_of(idata)["kernel"] == kernel


def _run_core(model, data, record, num_samples, kernel, rng_key=1, num_chains=4):
    data = as_count_tensor(data)
    bound = model.bind(data)
    layout = bound.cell_layout(data)
    spec, problem = gibbs_core.build_problem(bound, data, layout)
    run = gibbs_core.run_numba if kernel == "numba" else gibbs_core.run
    with jax.enable_x64(True):
        states, records = run(rng_key, spec, problem, num_chains=num_chains, num_warmup=100,
                              num_samples=num_samples, record=record)
        return (bound, layout, spec, problem, jax.tree.map(np.asarray, (states, records)))


def _counts_and_log_joint(spec, problem, key, state):
    return state.counts[: spec.num_table_entries], gibbs_core.log_joint(spec, problem, state)


def _check_log_joint(bound, data, layout, problem, states, log_joints):
    """log_joint of each chain's final state equals log π(S) of its allocation (eq. 3.11).

    With missing entries tokens are told apart by their observed pattern too: the multinomial
    term counts tokens per (pattern, configuration), as exact enumeration does.
    """
    cells = bound.full_cells(data, layout)
    for chain, config in enumerate(states.config):
        full, counts = np.unique(cells[problem.token_cell, config], axis=0, return_counts=True)
        _, pattern_counts = np.unique(problem.token_cell * layout.num_configs + config, return_counts=True)
        expected = (bound.log_prob_cells(full, counts) + gammaln(counts + 1.0).sum()
                    - gammaln(pattern_counts + 1.0).sum())
        np.testing.assert_allclose(log_joints[-1, chain], expected, rtol=1e-10)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name, model, data", [
    ("symmetric NMF (tied tables)", bam.models.symmetric_nmf(2, a=1.0), np.array([[3, 1, 0], [1, 0, 1], [0, 1, 2]])),
    ("CP with missing entries", bam.models.cp(2, order=3, a=2.0),
     CountTensor.from_samples(np.array([[0, 1, -1], [1, 1, 0], [0, -1, 1], [1, 0, 0], [0, 1, 1]]),
                              shape=(2, 2, 2))),
])
def test_allocation_statistics_match_enumeration(name, model, data, kernel):
    """Label-invariant functions of the allocation: E[p(i_V) | S] and Σ_r S_r² (co-allocation)."""
    data = as_count_tensor(data)
    bound, layout, spec, problem, (states, (counts, log_joints)) = _run_core(
        model, data, _counts_and_log_joint, num_samples=2000, kernel=kernel)
    _check_log_joint(bound, data, layout, problem, states, log_joints)
    grid = _grid(bound, data.shape)
    root = [t.name for t in bound.tables].index("r")
    start, stop = bound.table_starts[root], bound.table_starts[root + 1]

    def statistic(flat):
        flat = np.asarray(flat, float)
        return np.concatenate([expected_cell_probabilities(bound, flat, grid),
                               (flat[:, start:stop] ** 2).sum(-1, keepdims=True)], axis=-1)

    exact = exact_posterior_mean(model, data, statistic)
    draws = np.swapaxes(statistic(counts.reshape(-1, counts.shape[-1])).reshape(*counts.shape[:2], -1), 0, 1)
    mcse, _ = _mcse_and_rhat(draws)
    error = np.abs(draws.mean((0, 1)) - exact)
    assert np.all(error < Z * mcse + 1e-9), (name, (error / mcse).max())


@pytest.mark.parametrize("kernel", KERNELS)
def test_log_joint_under_conditioned_totals(kernel):
    data = as_count_tensor(X1)
    bound, layout, spec, problem, (states, (_, log_joints)) = _run_core(
        bam.models.lda(3, a=0.5), data, _counts_and_log_joint, num_samples=3, kernel=kernel, num_chains=2)
    _check_log_joint(bound, data, layout, problem, states, log_joints)


def test_the_numba_kernels_host_log_joint_is_log_pi_of_the_kept_allocation():
    # The default record of the numba kernel computes log π(S) with NumPy, missing entries included.
    data = CountTensor.from_samples(np.array([[0, 1, -1], [1, 1, 0], [0, -1, 1], [1, 0, 0], [0, 1, 1]]),
                                    shape=(2, 2, 2))
    bound, layout, spec, problem, (states, draws) = _run_core(
        bam.models.cp(2, order=3, a=2.0), data, gibbs_core.draw, num_samples=3, kernel="numba", num_chains=2)
    _check_log_joint(bound, as_count_tensor(data), layout, problem, states, draws.log_joint)


def test_log_space_and_direct_products_draw_the_same_allocations():
    """The float32 product form (used when it cannot under- or overflow) matches the log form."""
    data = CountTensor.from_samples(np.array([[0, 1, -1], [1, 1, 0], [0, -1, 1], [1, 0, 0], [0, 1, 1]]),
                                    shape=(2, 2, 2))
    bound = bam.models.cp(3, order=3, a=2.0).bind(data)
    spec, problem = gibbs_core.build_problem(bound, data, bound.cell_layout(data))
    assert not spec.log_space
    assert gibbs_core.build_problem(bam.models.cp(3, order=3, a=1e-12).bind(data), data,
                                    bound.cell_layout(data))[0].log_space
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    configs = []
    for log_space in (False, True):
        variant = spec._replace(log_space=log_space)
        states = gibbs_core._init_chains(variant, problem, keys, "uniform")
        configs.append(np.asarray(gibbs_core._advance(variant, problem, keys, states, 0, 10).config))
    np.testing.assert_array_equal(*configs)


@pytest.mark.parametrize("kernel", KERNELS)
def test_same_key_same_result(nmf_runs, kernel):
    model, idata = nmf_runs[kernel]
    kwargs = dict(method="gibbs", num_warmup=200, num_samples=NUM_SAMPLES, num_chains=NUM_CHAINS,
                  engine=kernel, progress_bar=False)  # the fixture's settings: no new compilation
    first = group(idata, "posterior")["theta_i"].values
    again, other = (group(bam.infer(model, X1, rng_key=key, **kwargs), "posterior")["theta_i"].values
                    for key in (0, 4))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize("kernel", KERNELS)
def test_sequential_chains_draw_the_same_as_vectorized(nmf_runs, kernel):
    model, idata = nmf_runs[kernel]
    sequential = bam.infer(model, X1, method="gibbs", rng_key=0, num_warmup=200, num_samples=NUM_SAMPLES,
                           num_chains=NUM_CHAINS, chain_method="sequential", engine=kernel,
                           progress_bar=False)
    np.testing.assert_array_equal(group(sequential, "posterior")["theta_i"].values,
                                  group(idata, "posterior")["theta_i"].values)


@pytest.mark.slow
def test_progress_bar_does_not_change_draws():
    model = bam.models.nmf(2, a=1.0)
    kwargs = dict(method="gibbs", rng_key=3, num_warmup=20, num_samples=20, num_chains=2)
    a, b = (group(bam.infer(model, X1, progress_bar=bar, **kwargs), "posterior")["theta_i"].values
            for bar in (False, True))
    np.testing.assert_array_equal(a, b)


def test_progress_bar_chunks_share_one_program_and_change_no_draw(nmf_runs):
    """On the JAX kernel, a bar whose chunks straddle the end of the warmup (85 sweeps each: a chunk
    of 30 warmup sweeps and 55 kept samples) draws what one chunk draws, and compiles one sampling
    program of 85 samples and no other program."""
    from bam_ppl.infer.gibbs import collapsed

    model, idata = nmf_runs["jax"]
    compiled = collapsed._init_chains._cache_size(), collapsed._advance._cache_size(), collapsed._sample._cache_size()
    barred = bam.infer(model, X1, method="gibbs", rng_key=0, num_warmup=200, num_samples=NUM_SAMPLES,
                       num_chains=NUM_CHAINS, engine="jax", progress_bar=True)
    np.testing.assert_array_equal(group(barred, "posterior")["theta_i"].values,
                                  group(idata, "posterior")["theta_i"].values)
    now = collapsed._init_chains._cache_size(), collapsed._advance._cache_size(), collapsed._sample._cache_size()
    assert now == (compiled[0], compiled[1], compiled[2] + 1)


@pytest.mark.parametrize("num_warmup, num_samples, progress_bar", [(13, 11, True), (0, 5, True), (7, 3, False)])
def test_warmup_then_samples_visits_every_sweep_and_draw_once_in_order(num_warmup, num_samples, progress_bar):
    """The chunked driver of both kernels: warmup sweeps, then kept draws, each once and in order,
    also when a chunk of the bar spans the end of the warmup; without a bar one call of each."""
    calls = []

    def step(phase):
        def advance(carry, first, count):
            calls.append((phase, first, count))
            return carry + count
        return advance

    done = gibbs_core._warmup_then_samples(step("warmup"), step("draw"), 0, num_warmup=num_warmup,
                                           num_samples=num_samples, progress_bar=progress_bar)
    assert done == num_warmup + num_samples
    for phase, total in (("warmup", num_warmup), ("draw", num_samples)):
        visited = [i for name, first, count in calls if name == phase for i in range(first, first + count)]
        assert visited == list(range(total))
    assert [name for name, _, _ in calls] == sorted((name for name, _, _ in calls), key="warmup draw".split().index)
    if not progress_bar:
        assert len(calls) == 2


@pytest.mark.parametrize("options, error", [
    (dict(num_samples=0), ValueError),
    (dict(num_warmup=-1), ValueError),
    (dict(num_chains=0), ValueError),
    (dict(thinning=0), ValueError),
    (dict(num_samples=2.5), TypeError),
    (dict(init="kmeans"), ValueError),
    (dict(token_order="reverse"), ValueError),
    (dict(chain_method="parallel"), ValueError),
    (dict(engine="cuda"), ValueError),
    (dict(progress_bar="yes"), TypeError),
    (dict(rng_key="seed"), TypeError),
])
def test_bad_options_raise_before_compiling(options, error):
    name = next(iter(options))
    with pytest.raises(error, match=name):
        bam.infer(bam.models.nmf(2), X1, method="gibbs", **options)


def test_too_many_configurations_raises():
    with pytest.raises(ValueError, match="max_configs"):
        bam.infer(bam.models.nmf(50), X1, method="gibbs", max_configs=10)


def test_numba_kernel_needs_numba(monkeypatch):
    monkeypatch.setattr(kernels, "HAVE_NUMBA", False)
    with pytest.raises(ImportError, match="numba"):
        bam.infer(bam.models.nmf(2), X1, method="gibbs", engine="numba")
    with pytest.warns(UserWarning, match="other results than an install with numba"):
        assert gibbs_core.resolve_kernel("auto") == "jax"


def test_auto_kernel_is_numba_on_cpu():
    assert gibbs_core.resolve_kernel("auto") == ("numba" if jax.default_backend() == "cpu" else "jax")


def _missing_cp_problem(log_space_rate):
    data = CountTensor.from_samples(np.array([[0, 1, -1], [1, 1, 0], [0, -1, 1], [1, 0, 0], [0, 1, 1]] * 3),
                                    shape=(2, 2, 2))
    bound = bam.models.cp(3, order=3, a=log_space_rate).bind(data)
    return gibbs_core.build_problem(bound, data, bound.cell_layout(data))


def _recount(spec, problem, config):
    """Counts implied by every token's configuration, from scratch."""
    moved = np.asarray(spec.moved)
    index = problem.row_base[moved][:, problem.token_cell] + problem.row_offset[moved][:, config]
    return problem.fixed_counts + np.bincount(index.reshape(-1), minlength=problem.fixed_counts.size)


@pytest.mark.parametrize("init", ["urn", "uniform"])
def test_numba_counts_follow_allocations(init):
    """After initialisation and after sweeps the kernel's counts are those its allocation implies,
    and every token's configuration is one its cell allows."""
    spec, problem = _missing_cp_problem(2.0)
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(2), 3))
    chains = gibbs_numba.NumbaChains(spec, problem, keys, keys[::-1], init)
    for _ in range(2):
        for chain in range(3):
            np.testing.assert_array_equal(chains.counts[chain], _recount(spec, problem, chains.config[chain]))
            assert problem.valid[problem.token_cell, chains.config[chain]].all()
        chains.advance(5)
    chains.close()


def test_numba_log_space_and_direct_products_draw_the_same_allocations():
    spec, problem = _missing_cp_problem(2.0)
    assert not spec.log_space
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(5), 2))
    configs = []
    for log_space in (False, True):
        chains = gibbs_numba.NumbaChains(spec._replace(log_space=log_space), problem, keys, keys, "urn")
        chains.advance(10)
        chains.close()
        configs.append(chains.config)
    np.testing.assert_array_equal(*configs)


def test_relabelling_makes_each_token_read_consecutive_entries():
    """For LDA the topic–word entries of a word are a vocabulary apart in the table layout; after
    the relabelling every row reads consecutive entries, and the counts map back unchanged."""
    data = as_count_tensor(X1)
    bound = bam.models.lda(3, a=0.5).bind(data)
    spec, problem = gibbs_core.build_problem(bound, data, bound.cell_layout(data))
    new_of_old, row_base, row_offset = gibbs_numba.contiguous_relabelling(
        problem.row_base.astype(np.int64), problem.row_offset.astype(np.int64), problem.concentration.size)
    np.testing.assert_array_equal(np.sort(new_of_old), np.arange(problem.concentration.size))
    for offsets in row_offset:
        assert np.all(np.diff(offsets) == 1) or np.all(offsets == offsets[0]), offsets
    np.testing.assert_array_equal(new_of_old[problem.row_base[:, :, None] + problem.row_offset[:, None, :]],
                                  row_base[:, :, None] + row_offset[:, None, :])
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(1), 2))
    chains = gibbs_numba.NumbaChains(spec, problem, keys, keys, "urn")
    chains.close()
    for chain in range(2):
        np.testing.assert_array_equal(chains.counts[chain], _recount(spec, problem, chains.config[chain]))


@pytest.mark.parametrize("model, data", [
    (bam.models.nmf(2, a=1.0), X1),
    (bam.models.lda(3, a=0.5), X1),
    (bam.models.cp(3, order=3, a=0.7), np.random.default_rng(0).poisson(1.0, (3, 4, 2))),
    (bam.models.symmetric_nmf(3, a=0.5), np.array([[3, 1, 0, 2], [1, 4, 1, 0], [0, 1, 2, 1], [2, 0, 1, 3]])),
])
def test_factorised_sweep_draws_what_the_general_sweep_draws(model, data):
    """One free node: the factorised numba sweep applies and, from the same keys, gives the
    allocations and counts of the general sweep (symmetric NMF: tied members, whose diagonal cells
    read one table entry twice)."""
    data = as_count_tensor(data)
    bound = model.bind(data)
    spec, problem = gibbs_core.build_problem(bound, data, bound.cell_layout(data))
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(5), 3))
    results = []
    for factorised in (True, False):
        chains = gibbs_numba.NumbaChains(spec, problem, keys, keys[::-1], "urn", factorised=factorised)
        assert (chains._factorised is not None) == factorised
        chains.advance(20)
        chains.close()
        results.append((chains.config, chains.counts))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][1][0], _recount(spec, problem, results[0][0][0]))


def test_factorised_sweep_does_not_apply_to_missing_entries():
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(1), 1))
    for spec, problem in (_missing_cp_problem(2.0),):
        chains = gibbs_numba.NumbaChains(spec, problem, keys, keys, "urn")
        chains.close()
        assert chains._factorised is None


@pytest.mark.parametrize("a", [0.3, 1e-200])
def test_host_draws_are_dirichlet(a):
    """Θ drawn on the host for the numba kernel: column means (α + S) / Σ(α + S) within Monte
    Carlo error; columns sum to one even when α is far below the float64 range of a Gamma draw."""
    data = as_count_tensor(X1)
    bound = bam.models.nmf(2, a=a).bind(data)
    spec, problem = gibbs_core.build_problem(bound, data, bound.cell_layout(data))
    F = spec.num_table_entries
    counts = np.random.default_rng(0).integers(0, 4, F)
    draws = gibbs_core.HostDraws(spec, problem, np.asarray(jax.random.split(jax.random.PRNGKey(0), 1)))
    theta = np.array([draws(0, counts)[0] for _ in range(4000)], np.float64)
    assert np.isfinite(theta).all()
    column_of = np.asarray(problem.column_of)
    sums = np.zeros((theta.shape[0], column_of.max() + 1))
    np.add.at(sums.T, column_of, theta.T)
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)
    shape = np.asarray(problem.concentration[:F]) + counts
    total = np.bincount(column_of, weights=shape)[column_of]
    mean = shape / total
    standard_error = np.sqrt(mean * (1 - mean) / (total + 1) / theta.shape[0])
    assert np.all(np.abs(theta.mean(0) - mean) <= Z * standard_error + 1e-6)
