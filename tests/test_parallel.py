"""executor=: the same tables and InferenceData as the serial run, on threads, processes and Dask."""

import concurrent.futures
import logging
import multiprocessing
import os
import signal
import sys

import numpy as np
import pandas as pd
import pytest

import bam_ppl as bam
from bam_ppl.infer.registry import register_evidence
from bam_ppl.parallel import TaskError, task_key

X2 = np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]])
MODELS = {f"nmf{rank}": bam.models.nmf(rank=rank) for rank in (1, 2, 3)}
SMC = dict(method="smc", num_particles=64, num_chains=2)
#: Runs on a Dask cluster, a process or thread pool or two forced host devices: `make test-integration`.
INTEGRATION = pytest.mark.integration


@pytest.fixture(scope="module")
def client():
    """Two single-threaded worker processes, shared by the module's tests."""
    distributed = pytest.importorskip("distributed")
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0",
                                  silence_logs=logging.ERROR) as cluster, distributed.Client(cluster) as dask_client:
        yield dask_client


@INTEGRATION
def test_compare_on_dask_equals_serial(client):
    serial = bam.compare(MODELS, X2, rng_key=3, **SMC)
    parallel = bam.compare(MODELS, X2, rng_key=3, executor=client, **SMC)
    pd.testing.assert_frame_equal(parallel, serial, check_exact=True)


@INTEGRATION
def test_compare_on_thread_and_process_pools_equals_serial():
    serial = bam.compare(MODELS, X2, rng_key=1, **SMC)
    with concurrent.futures.ThreadPoolExecutor(2) as threads:
        pd.testing.assert_frame_equal(bam.compare(MODELS, X2, rng_key=1, executor=threads, **SMC), serial,
                                      check_exact=True)
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as processes:
        pd.testing.assert_frame_equal(bam.compare(MODELS, X2, rng_key=1, executor=processes, **SMC), serial,
                                      check_exact=True)


@INTEGRATION
def test_target_stderr_rounds_equal_serial(client):
    options = dict(method="smc", num_particles=16, num_chains=2, target_stderr=0.05)
    serial = bam.log_evidence(MODELS["nmf2"], X2, rng_key=0, **options)
    parallel = bam.log_evidence(MODELS["nmf2"], X2, rng_key=0, executor=client, **options)
    assert parallel.details["num_calls"] == serial.details["num_calls"] > 1
    assert parallel.details["run_log_evidence"] == serial.details["run_log_evidence"]
    assert (parallel.value, parallel.stderr) == (serial.value, serial.stderr)
    # Call c has the key fold_in(rng_key, c), whatever ran it.
    second = bam.log_evidence(MODELS["nmf2"], X2, rng_key=task_key(0, 1), method="smc", num_particles=16,
                              num_chains=2)
    assert second.details["run_log_evidence"] == serial.details["run_log_evidence"][2:4]


def _noisy_heldout_score(model, X, heldout, rng_key):
    """A cheap stand-in for a fit: per held-out cell, a value that depends on the model and the key."""
    rng = np.random.default_rng(np.asarray(rng_key))
    cells = X.to_dense()[heldout]
    return -np.abs(cells - model.latent["k"]) + rng.normal(size=cells.shape)


@INTEGRATION
def test_select_ranks_on_dask_equals_serial(client):
    X = np.random.default_rng(0).poisson(3.0, size=(12, 10))
    options = dict(grid={"rank": [1, 2, 3]}, heldout_axes=(0, 1), rng_key=0, heldout_fraction=0.2)
    serial = bam.select_ranks(bam.models.nmf, X, score=_noisy_heldout_score, **options)
    parallel = bam.select_ranks(bam.models.nmf, X, score=_noisy_heldout_score, executor=client, **options)
    pd.testing.assert_frame_equal(parallel, serial, check_exact=True)
    np.testing.assert_array_equal(parallel.attrs["heldout"], serial.attrs["heldout"])


@INTEGRATION
def test_failing_task_names_the_model(client):
    models = {"small": MODELS["nmf1"], "too_many": MODELS["nmf3"]}
    with pytest.raises(TaskError, match="model 'too_many'.*max_tensors") as raised:
        bam.compare(models, X2, method="exact", max_tensors=2, executor=client)
    assert isinstance(raised.value.__cause__, ValueError)
    with concurrent.futures.ThreadPoolExecutor(1) as threads, pytest.raises(TaskError, match="too_many"):
        bam.compare(models, X2, method="exact", max_tensors=2, executor=threads)


def test_bad_executor_is_a_type_error():
    with pytest.raises(TypeError, match="executor must be .*got int"):
        bam.compare(MODELS, X2, executor=2)
    with pytest.raises(TypeError, match="executor must be .*got str"):
        bam.log_evidence(MODELS["nmf1"], X2, executor="dask")
    with pytest.raises(TypeError, match="executor must be"):
        bam.select_ranks(bam.models.nmf, X2, grid={"rank": [1]}, heldout_axes=(0, 1), executor=object())


def _smc_killing_its_worker_once(model, data, *, rng_key=0, marker, **options):
    """The Pólya-urn SMC, after killing the worker process that runs it the first time."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return bam.log_evidence(model, data, method="smc", rng_key=rng_key, **options)


@INTEGRATION
def test_lost_worker_is_retried(client, tmp_path):
    register_evidence("smc_killing_its_worker_once")(_smc_killing_its_worker_once)
    options = dict(num_particles=64, num_chains=2)
    serial = bam.compare(MODELS, X2, rng_key=2, method="smc", **options)
    parallel = bam.compare(MODELS, X2, rng_key=2, method="smc_killing_its_worker_once", executor=client,
                           marker=str(tmp_path / "killed"), **options)
    assert (tmp_path / "killed").exists()
    pd.testing.assert_frame_equal(parallel, serial, check_exact=True)


def _sum_killing_its_worker_once(shared, i, marker):
    if i == 0 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return float(np.sum(shared)) + i


@INTEGRATION
def test_tasks_cancelled_with_their_scattered_data_run_again(tmp_path):
    """One worker holds the only copy of the scattered data and dies: the scheduler cancels the tasks
    that read it ("already forgotten", dask/distributed#3149); they are submitted again."""
    distributed = pytest.importorskip("distributed")
    import cloudpickle

    from bam_ppl.parallel import Task, run_tasks

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file

    tasks = [Task(f"task {i}", (i, str(tmp_path / "killed"))) for i in range(3)]
    with distributed.LocalCluster(processes=True, n_workers=1, threads_per_worker=1, dashboard_address=":0",
                                  silence_logs=logging.ERROR) as cluster, distributed.Client(cluster) as one_worker:
        assert run_tasks(one_worker, _sum_killing_its_worker_once, tasks, np.ones(10)) == [10.0, 11.0, 12.0]
    assert (tmp_path / "killed").exists()


def test_forking_process_pool_is_refused():
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool, \
            pytest.raises(ValueError, match="spawn"):
        bam.compare(MODELS, X2, executor=pool)


CHAINS = dict(method="smc", num_chains=3, num_particles=32)


def assert_same_inference_data(actual, expected):
    """Every group with chains, bit for bit (values, dims, coordinates), and the root attributes."""
    from bam_ppl.convert import attrs_of, group
    from bam_ppl.parallel import group_names

    assert group_names(actual) == group_names(expected)
    for name in group_names(expected):
        got, want = group(actual, name), group(expected, name)
        if "chain" not in want.dims:
            continue
        assert set(got.data_vars) == set(want.data_vars), name
        for var in want.data_vars:
            assert got[var].dims == want[var].dims, (name, var)
            np.testing.assert_array_equal(got[var].values, want[var].values, err_msg=f"{name}.{var}")
        for coord in want.coords:
            np.testing.assert_array_equal(got[coord].values, want[coord].values, err_msg=f"{name} {coord}")
    stamp = {"created_at"}  # ArviZ's creation time, the only attribute allowed to differ
    assert {k: v for k, v in attrs_of(actual).items() if k not in stamp} == \
        {k: v for k, v in attrs_of(expected).items() if k not in stamp}


@INTEGRATION
def test_infer_chains_on_dask_equal_serial(client):
    model = MODELS["nmf2"]
    serial = bam.infer(model, X2, rng_key=4, **CHAINS)
    parallel = bam.infer(model, X2, rng_key=4, executor=client, **CHAINS)
    assert_same_inference_data(parallel, serial)
    # Chain c is the one-chain run with the same key and _first_chain=c.
    from bam_ppl.convert import group

    alone = bam.infer(model, X2, rng_key=4, **{**CHAINS, "num_chains": 1, "_first_chain": 2})
    np.testing.assert_array_equal(group(serial, "posterior").isel(chain=2)["theta_k"].values,
                                  group(alone, "posterior").isel(chain=0)["theta_k"].values)


@INTEGRATION
def test_infer_restarts_keep_the_best():
    from bam_ppl.convert import attrs_of

    model = MODELS["nmf3"]
    options = dict(method="vb", num_iters=30, num_chains=3)
    with concurrent.futures.ThreadPoolExecutor(2) as threads:
        best = bam.infer(model, X2, rng_key=0, executor=threads, **options)
    elbos = [attrs_of(bam.infer(model, X2, rng_key=0, **{**options, "num_chains": 1, "_first_chain": r}))
             ["best_elbo"] for r in range(3)]
    assert attrs_of(best)["best_elbo"] == max(elbos)
    assert attrs_of(best)["best_restart"] == int(np.argmax(elbos)) and attrs_of(best)["num_restarts"] == 3


_EM_MODEL = bam.AllocationModel("k -> i; k -> j", latent={"k": 2}, observed=("i", "j"),
                                priors={"k": 1.5, "i": 1.2, "j": 1.2})
_BINARY = np.random.default_rng(0).binomial(1, 0.4, size=(6, 5)).astype(float)
_NBMF = bam.models.nbmf(3, prior="beta-dir")
_GIBBS = dict(method="gibbs", num_chains=2, num_warmup=5, num_samples=4)
_NUTS = dict(method="nuts", num_chains=2, num_warmup=10, num_samples=5)
_NBMF_VB = dict(num_chains=3, num_iters=20, num_samples=3)
#: (model, data, options) of every backend with chains or restarts (and SVI, a single task); the
#: tol of vb and cvb lets their restarts stop at different iterations.
EVERY_BACKEND = {
    "gibbs-jax": (MODELS["nmf2"], X2, {**_GIBBS, "engine": "jax"}),
    "gibbs-numba": (MODELS["nmf2"], X2, {**_GIBBS, "engine": "numba"}),
    "smc": (MODELS["nmf2"], X2, dict(method="smc", num_chains=2, num_particles=16)),
    "nuts": (MODELS["nmf2"], X2, _NUTS),
    "svi": (MODELS["nmf2"], X2, dict(method="svi", num_steps=10, num_samples=5)),
    "vb": (MODELS["nmf3"], X2, dict(method="vb", num_chains=3, num_iters=30, tol=1e-3)),
    "cvb": (MODELS["nmf3"], X2, dict(method="cvb", num_chains=3, num_iters=30, tol=1e-4, num_samples=5)),
    "map": (_EM_MODEL, X2, dict(method="map", num_chains=3, num_iters=30)),
    "nbmf-gibbs": (_NBMF, _BINARY, {**_GIBBS, "init": "random"}),
    "nbmf-vb": (_NBMF, _BINARY, dict(method="vb", **_NBMF_VB)),
    "nbmf-cvb": (_NBMF, _BINARY, dict(method="cvb", **_NBMF_VB)),
    "nbmf-nuts": (_NBMF, _BINARY, _NUTS),
    "dirichlet-tucker-map": (bam.models.dirichlet_tucker((2, 2, 2, 2), alpha=1.1),
                             np.random.default_rng(1).multinomial(9, np.full(8, 1 / 8), size=(4, 3)).reshape(4, 3, 2, 4),
                             dict(method="map", num_chains=3, num_iters=30)),
}


#: NumPyro's runners and the JAX Gibbs kernel compile for a long time; they run with ``make test-all``
#: (the numba Gibbs kernel derives its chain keys in the same place as the JAX one).
_SLOW_CASES = ("gibbs-jax", "nuts", "svi", "nbmf-nuts")


@INTEGRATION
@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.slow) if case in _SLOW_CASES else case
                                  for case in EVERY_BACKEND])
def test_infer_on_an_executor_equals_serial(case):
    model, data, options = EVERY_BACKEND[case]
    serial = bam.infer(model, data, rng_key=7, **options)
    # Two threads: NumPyro's runs take turns on its global handler stack (numpyro_backends.TRACING).
    with concurrent.futures.ThreadPoolExecutor(2) as threads:
        parallel = bam.infer(model, data, rng_key=7, executor=threads, **options)
    assert_same_inference_data(parallel, serial)


SHARDED_RUNS = """
import sys
from unittest import mock

import jax
import numpy as np
import bam_ppl as bam
from bam_ppl.convert import group
from bam_ppl.infer.smc.polya_urn import run_smc
from bam_ppl.parallel import shard_axis


# The smallest model with a latent node, and Gibbs without warmup (_sample runs the same sweeps as
# _advance): each kernel is compiled twice, once per device count, and compiling is the cost here.
def run(out):
    model = bam.models.nmf(2)
    _, X = model.sample(0, shape=(5, 4), total=40)
    smc = run_smc(model, X, rng_key=1, num_particles=16, num_chains=2, engine="jax")
    gibbs = bam.infer(model, X, method="gibbs", rng_key=1, num_chains=2, num_warmup=0, num_samples=5, engine="jax")
    tempered = bam.log_evidence(model, X, method="tempered", rng_key=1, num_particles=16, num_chains=1, engine="jax")
    np.savez(out, devices=len(jax.devices()), smc_log_evidence=smc.chain_log_evidence, smc_counts=smc.counts,
             smc_best=smc.best_log_prob, gibbs_theta=group(gibbs, "posterior")["theta_k"].values,
             tempered=tempered.details["run_log_evidence"])


# One device first: jax.devices() narrowed to the first, as a one-device process sees it, so that
# shard_axis leaves every array as it is.
first = jax.devices()[:1]
with mock.patch.object(jax, "devices", lambda *args, **kwargs: first):
    zeros = np.zeros((2, 16))
    assert shard_axis(zeros, 16, -1, "particles") is zeros
    run(sys.argv[1])
split = shard_axis(np.zeros((2, 16)), 16, -1, "particles")
assert split.addressable_shards[0].data.shape == (2, 16 // len(jax.devices()))
run(sys.argv[2])
"""


@INTEGRATION
def test_sharded_kernels_equal_one_device(tmp_path):
    """The kernels on one device and on two forced host devices, in one interpreter (one import of JAX)."""
    import subprocess

    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()}
    paths = [tmp_path / "devices1.npz", tmp_path / "devices2.npz"]
    run = subprocess.run([sys.executable, "-c", SHARDED_RUNS, *map(str, paths)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    one, two = (np.load(path) for path in paths)
    assert (int(one["devices"]), int(two["devices"])) == (1, 2)
    # Particles (Pólya-urn and tempered SMC) and chains (Gibbs) split over two devices: the same draws; sums over the
    # particles may round in another order, hence the float tolerance.
    np.testing.assert_array_equal(two["smc_counts"], one["smc_counts"])
    np.testing.assert_allclose(two["smc_log_evidence"], one["smc_log_evidence"], rtol=1e-12)
    np.testing.assert_allclose(two["smc_best"], one["smc_best"], rtol=1e-12)
    np.testing.assert_array_equal(two["gibbs_theta"], one["gibbs_theta"])
    np.testing.assert_allclose(two["tempered"], one["tempered"], rtol=1e-12)
