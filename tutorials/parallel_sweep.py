# %% [markdown]
# # A rank × structure sweep on a Dask cluster
#
# Model selection by evidence means many independent computations: one evidence estimate per
# structure and rank (Yıldırım et al. 2021 compare CP and Tucker decompositions of every rank this
# way). `bam.compare`, `bam.log_evidence`, `bam.infer` and `bam.select_ranks` take
# `executor=`: any `concurrent.futures.Executor`, or a `dask.distributed.Client`. The work then
# runs as independent tasks (one per model, evidence call, chain or grid point) with
#
# * **the same result as the serial run**: a task's key derives from `rng_key` and the task's
#   identity (its model, its call or chain number), never from the number of workers or the order
#   they finish in;
# * **the data sent once** to each worker (`client.scatter(..., broadcast=True)`);
# * **errors that name the model** (`bam_ppl.parallel.TaskError`), and tasks of a lost worker run
#   again on another.
#
# This tutorial runs the sweep on a `LocalCluster` of two worker processes (install the extra:
# `pip install "bam-ppl[distributed]"`); the last section shows how to point the same code at a
# real cluster.

# %%
import logging
import os
import time
import warnings

import pandas as pd
from distributed import Client, LocalCluster

import bam_ppl as bam

SMALL = os.environ.get("BAM_PPL_SMALL") == "1"
RANKS = range(1, 3) if SMALL else range(1, 6)
TEMPERED = dict(num_particles=64, num_chains=2) if SMALL else dict(num_particles=256, num_chains=4)

# %% [markdown]
# ## Data and the sweep
#
# A 10 × 8 × 4 count tensor drawn from a CP(2) model; the candidates are CP(R) (one latent class
# explains all three axes) and Tucker(R, R, 2) (a class per axis, linked by a core).

# %%
_, X = bam.models.cp(2, a=50.0).sample(0, shape=(10, 8, 4), total=120 if SMALL else 300)
X = bam.CountTensor.from_dense(X)
models = {}
for rank in RANKS:
    models[f"CP({rank})"] = bam.models.cp(rank)
    models[f"Tucker({rank},{rank},2)"] = bam.models.tucker((rank, rank, 2))
if __name__ == "__main__":  # not again in every worker process (see below)
    print(X, f"\n{len(models)} models: {list(models)}")

# %% [markdown]
# ## Serial, then on a local cluster
#
# `LocalCluster(processes=True)` starts worker processes on this machine; one thread each, since
# the numba kernels of the estimators run their own threads. The worker processes import this
# file as a module (Python's "spawn" start), so the sweep runs only under
# `if __name__ == "__main__":` — the guard every script that starts worker processes needs. The
# first sweep on the cluster also compiles the kernels in every worker; the table is identical to
# the serial one, to the last bit.


# %%
def sweep(executor=None):
    return bam.compare(models, X, method="tempered", rng_key=0, executor=executor, **TEMPERED)


if __name__ == "__main__":
    warnings.simplefilter("ignore", bam.EvidenceWarning)  # few particles: the rows' stderr says how rough
    start = time.perf_counter()
    serial = sweep()
    serial_s = time.perf_counter() - start
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        start = time.perf_counter()
        table = sweep(client)
        dask_s = time.perf_counter() - start
        # The chains of one model as tasks: chain c draws from fold_in(rng_key, c) alone, however
        # many chains run beside it, so the InferenceData is the serial call's, bit for bit.
        gibbs = dict(method="gibbs", rng_key=0, num_chains=2, num_warmup=50, num_samples=50)
        idata = bam.infer(models["CP(2)"], X, executor=client, **gibbs)
    pd.testing.assert_frame_equal(table, serial, check_exact=True)
    serial_idata = bam.infer(models["CP(2)"], X, **gibbs)
    assert all((idata.posterior[name].values == serial_idata.posterior[name].values).all()
               for name in serial_idata.posterior.data_vars)
    print(f"serial {serial_s:.1f} s, 2 workers {dask_s:.1f} s (the cluster's first run includes compilation)")
    print(table[["log_evidence", "stderr", "delta", "rank"]].round(2))
    print("chains:", idata.posterior.sizes["chain"], "draws:", idata.posterior.sizes["draw"])
    print(f"best structure: {table.index[0]}, ahead of {table.index[1]} by {table['delta'].iloc[1]:.1f} nats")

# %% [markdown]
# ## A lost worker, a failing model
#
# If a worker dies mid-sweep (a node preempted, out of memory), the Dask scheduler runs its tasks
# again on another worker; the table is unchanged. A model whose estimator raises stops the sweep
# with a `TaskError` naming the model, its original error attached as `__cause__`.

# %% [markdown]
# ## On a real cluster
#
# Only the `Client` changes. Connect to a running scheduler:
#
# ```python
# from distributed import Client
# client = Client("tcp://scheduler:8786")
# table = bam.compare(models, X, method="tempered", executor=client)
# ```
#
# Start the workers as batch jobs with [dask-jobqueue](https://jobqueue.dask.org) on SLURM or
# PBS (one single-threaded worker per job, the kernels' threads on the job's cores):
#
# ```python
# from dask_jobqueue import SLURMCluster   # or PBSCluster
# cluster = SLURMCluster(cores=4, processes=1, memory="16GB", walltime="02:00:00",
#                        job_extra_directives=["--partition=compute"])
# cluster.scale(jobs=20)                   # or cluster.adapt(maximum_jobs=50)
# client = Client(cluster)
# ```
#
# or on Kubernetes with [dask-kubernetes](https://kubernetes.dask.org):
#
# ```python
# from dask_kubernetes.operator import KubeCluster
# cluster = KubeCluster(name="bam-sweep", image="ghcr.io/dask/dask:latest", n_workers=20)
# client = Client(cluster)
# ```
#
# The workers need `bam_ppl` installed in the same version as the client (the same image or
# environment), and the data are shipped from the client once per worker. A
# `concurrent.futures.ProcessPoolExecutor` works too on one machine, created with
# `mp_context=multiprocessing.get_context("spawn")` (a forked child of a process running JAX can
# deadlock).
