"""Merge-and-birth moves of VB fits (bam_ppl.infer.variational.split_merge)."""

import warnings

import jax
import numpy as np

import bam_ppl as bam
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.variational import split_merge, vb


def blocks(size: int = 8, count: int = 6) -> np.ndarray:
    """Three disjoint blocks of rows and columns, ``count`` tokens in each of their cells."""
    X = np.zeros((3 * size, 3 * size), np.int64)
    for b in range(3):
        X[b * size:(b + 1) * size, b * size:(b + 1) * size] = count
    return X


def move_problem(X, rank=3):
    data, bound, layout, _ = prepare(bam.models.nmf(rank), X)
    with jax.enable_x64(True):
        problem = vb.build_problem(bound, data, layout)
    return split_merge.move_problem(bound, data, layout, problem), data


def test_a_move_keeps_each_cells_responsibilities_a_distribution():
    mp, _ = move_problem(blocks())
    rng = np.random.default_rng(0)
    phi = rng.dirichlet(np.ones(3), size=mp.host.counts.size)
    for _ in range(20):
        moved = split_merge.merge_and_birth(mp, phi, rng)
        assert np.all(moved >= 0.0)
        np.testing.assert_allclose(moved.sum(axis=1), 1.0)


def test_the_states_from_responsibilities_are_vbs_own():
    mp, _ = move_problem(blocks())
    phi = np.random.default_rng(1).dirichlet(np.ones(3), size=mp.host.counts.size)
    with jax.enable_x64(True):
        expected = vb.init_from_responsibilities(mp.problem, phi)
    state = split_merge.states_from(mp.host, [phi])
    np.testing.assert_allclose(state.alpha_hat[0], np.asarray(expected.alpha_hat), rtol=1e-12)
    np.testing.assert_allclose(state.log_weights[0], np.asarray(expected.log_weights), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(split_merge.responsibilities(mp.host, state.log_weights[0]).sum(axis=1), 1.0)


def merged_fit(mp, data):
    """α̂ of the local optimum where blocks 0 and 1 share value 0 and block 2 is spread over values 1 and 2."""
    block = data.indices[:, 0] // 8
    rng = np.random.default_rng(2)
    phi = np.zeros((block.size, 3))
    phi[block < 2, 0] = 1.0
    half = rng.random(block.size) < 0.5
    phi[(block == 2) & half, 1] = 1.0
    phi[(block == 2) & ~half, 2] = 1.0
    return split_merge.states_from(mp.host, [phi]).alpha_hat[0]


def test_moves_leave_an_optimum_that_merges_two_groups_and_splits_a_third():
    mp, data = move_problem(blocks())
    start = merged_fit(mp, data)
    with jax.enable_x64(True):
        _, stuck = split_merge.improve(mp, start, np.random.default_rng(3), 0, 50)
        alpha_hat, moved = split_merge.improve(mp, start, np.random.default_rng(3), 25, 50)
    assert moved > stuck + 10.0
    phi = split_merge.responsibilities(mp.host, split_merge.fresh_states(mp.host, alpha_hat[None]).log_weights[0])
    value = phi.argmax(axis=1)
    block = data.indices[:, 0] // 8
    assert sorted({int(value[block == b][0]) for b in range(3)}) == [0, 1, 2]
    assert all(np.all(value[block == b] == value[block == b][0]) for b in range(3))


def test_improve_never_lowers_the_elbo():
    mp, data = move_problem(bam.models.nmf(3, a=1.0).sample(jax.random.key(4), shape=(12, 15), total=600)[1])
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        for _ in range(3):
            start = split_merge.states_from(mp.host, [rng.dirichlet(np.ones(3), size=mp.host.counts.size)]).alpha_hat[0]
            _, converged = split_merge.improve(mp, start, rng, 0, 50)
            alpha_hat, moved = split_merge.improve(mp, start, rng, 10, 50)
            assert moved >= converged - 1e-9 * abs(converged)
            again = vb.run_from(split_merge.fresh_states(mp.host, alpha_hat[None]), mp.problem, num_iters=5, tol=0.0,
                                engine="numba")
            np.testing.assert_allclose(again.elbo[0], moved, rtol=1e-6)


def test_vb_evidence_moves_lift_its_bound_and_keep_it_a_bound():
    # method="vb" moves its best restart (num_moves, default 10): never below the restarts' best, never above the
    # exact value; on the blocks a restart stuck with two blocks on one value reaches one value per block. A bad num_moves is named first.
    from bam_ppl.infer.exact import exact_log_evidence

    X, model = np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]]), bam.models.nmf(2, a=1.0)
    plain = bam.log_evidence(model, X, method="vb", rng_key=0, num_chains=3, num_moves=0)
    moved = bam.log_evidence(model, X, method="vb", rng_key=0, num_chains=3)
    assert plain.info.moved_elbo is None and abs(moved.info.moved_elbo - moved.value) < 1e-9
    assert plain.value - 1e-9 <= moved.value <= exact_log_evidence(model, X) + 1e-9
    # From a start allocation too (the best fit may be a start's; the moves draw from a stream of their own).
    with warnings.catch_warnings():  # a cheap sampler, only for its allocation
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        found = bam.log_evidence(model, X, method="tempered", num_particles=16, num_chains=1, rng_key=1)
    started = bam.log_evidence(model, X, method="vb", rng_key=0, num_chains=1,
                               start=(found.details["best_cells"], found.details["best_counts"]))
    assert started.info.moved_elbo is not None and started.value <= exact_log_evidence(model, X) + 1e-9
    one = dict(method="vb", rng_key=3, num_chains=1)  # a restart that ends with two blocks on one value
    stuck, lifted = (bam.log_evidence(bam.models.nmf(3), blocks(), num_moves=n, **one) for n in (0, 10))
    assert lifted.value > stuck.value + 10.0, (stuck.value, lifted.value)
    try:
        bam.log_evidence(model, X, method="vb", num_moves=-1)
    except ValueError as error:
        assert "num_moves" in str(error)
    else:
        raise AssertionError("num_moves=-1 was taken")


def test_vb_inference_moves_each_restart_as_its_executor_tasks_do():
    # bam.infer(method="vb") moves every restart (num_moves, default 10), each from a stream of its own, so that a
    # restart stuck with two blocks on one value reaches one value per block, and the restarts run as tasks give
    # the serial result.
    from concurrent.futures import ThreadPoolExecutor

    from bam_ppl.convert import group

    model, X = bam.models.nmf(3), blocks()
    fit = dict(method="vb", rng_key=3, num_chains=2, num_samples=5)
    stuck = group(bam.infer(model, X, num_moves=0, **fit), "sample_stats")["final_elbo"].values
    serial = bam.infer(model, X, **fit)
    lifted = group(serial, "sample_stats")["final_elbo"].values
    assert stuck[0] < lifted[0] - 10.0 and np.all(lifted >= stuck - 1e-9), (stuck, lifted)
    assert serial.attrs["best_elbo"] == lifted.max() and serial.attrs["num_moves"] == 10
    with ThreadPoolExecutor(2) as threads:
        tasks = bam.infer(model, X, executor=threads, **fit)
    np.testing.assert_array_equal(group(tasks, "sample_stats")["final_elbo"].values, lifted)
    np.testing.assert_array_equal(group(tasks, "posterior")["theta_k"].values, group(serial, "posterior")["theta_k"].values)
