"""Independent tasks on an executor: model sweeps, evidence runs, chains and restarts.

``bam.compare``, ``bam.log_evidence``, ``bam.infer`` and ``bam.select_ranks`` take
``executor=``: any :class:`concurrent.futures.Executor`, or a ``dask.distributed.Client``
passed as it is. Their work splits into independent tasks (one model, one evidence call, one
chain or restart, one grid point). This module holds what every one of them shares:

* **keys** — a task's key derives from ``rng_key`` and the task's identity (its model, its
  call or chain number) by :func:`jax.random.fold_in`, never from the number of workers or the
  order in which they finish, so a result is the same on any executor and any cluster;
* **data** — what every task reads is sent to each Dask worker once
  (``client.scatter(..., broadcast=True)``), not once per task;
* **errors** — a task that raises surfaces as a :class:`TaskError` that names the task (the
  model's name, the chain); a Dask worker lost mid-sweep is not an error: the scheduler runs
  its tasks again on another worker;
* **merging** — results come back in task order; chains are concatenated into one
  InferenceData (:func:`concat_chains`).

Without an executor (``executor=None``) the same tasks run one after another in the calling
process.
"""

from __future__ import annotations

import concurrent.futures
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from .types import KeyLike, as_key


class TaskError(RuntimeError):
    """A task run on an executor raised; ``task`` names it and ``__cause__`` is the original error."""

    def __init__(self, task: str, error: BaseException):
        super().__init__(f"{task} failed: {type(error).__name__}: {error}")
        self.task = task


class Task(NamedTuple):
    """One unit of work: ``fn(shared, *args)``, named by ``label`` in errors and on the Dask dashboard."""

    label: str
    args: tuple


def dask_client_type():
    """``distributed.Client`` when dask.distributed is imported, else None (a Client cannot exist then)."""
    module = sys.modules.get("distributed")
    return getattr(module, "Client", None)


def check_executor(executor, argument: str = "executor") -> None:
    """TypeError unless ``executor`` is None, a concurrent.futures.Executor or a dask Client."""
    if isinstance(executor, concurrent.futures.ProcessPoolExecutor) and _forks(executor):
        # A forked child of a process running JAX's threads can deadlock (JAX warns of it).
        raise ValueError(f"{argument}: a ProcessPoolExecutor that forks can deadlock under JAX; create it with "
                         "mp_context=multiprocessing.get_context('spawn')")
    if executor is None or isinstance(executor, concurrent.futures.Executor):
        return
    client = dask_client_type()
    if client is not None and isinstance(executor, client):
        return
    raise TypeError(
        f"{argument} must be a concurrent.futures.Executor (ThreadPoolExecutor, ProcessPoolExecutor) "
        f"or a dask.distributed.Client, got {type(executor).__name__}")


def _forks(pool: concurrent.futures.ProcessPoolExecutor) -> bool:
    context = getattr(pool, "_mp_context", None)
    return context is not None and context.get_start_method() == "fork"


def task_key(rng_key: KeyLike, *identity: int):
    """The key of a task: ``rng_key`` folded with each number of the task's identity in turn."""
    import jax

    key = as_key(rng_key)
    for number in identity:
        key = jax.random.fold_in(key, int(number))
    return key


def run_tasks(executor, fn: Callable, tasks: Sequence[Task], shared=None) -> list:
    """``[fn(shared, *task.args) for task in tasks]``, on ``executor`` when one is given.

    Results are in task order, whatever order the workers finish in. On a Dask client
    ``shared`` is scattered to every worker once; a concurrent.futures executor receives it
    with every task (threads share it; a process pool pickles it per task).
    """
    check_executor(executor)
    if executor is None:
        return [fn(shared, *task.args) for task in tasks]
    if isinstance(executor, concurrent.futures.Executor):
        futures = [executor.submit(fn, shared, *task.args) for task in tasks]
        return _gather(futures, tasks, cancel=lambda: [f.cancel() for f in futures])
    # A list around ``shared`` keeps scatter from splitting a list or dict of data into parts.
    [remote] = executor.scatter([shared], broadcast=True, hash=False)
    token = uuid.uuid4().hex[:8]
    futures = [executor.submit(fn, remote, *task.args, pure=False, key=f"{task.label}-{token}-{i}")
               for i, task in enumerate(tasks)]
    return _gather(futures, tasks, cancel=lambda: executor.cancel(futures))


def _gather(futures, tasks: Sequence[Task], cancel) -> list:
    results = []
    for future, task in zip(futures, tasks):
        try:
            results.append(future.result())
        except Exception as error:  # any task error: stop the others and name the task
            cancel()
            raise TaskError(task.label, error) from error
    return results


# -- task bodies (module-level so that both pickle and cloudpickle send them by reference) ----------

def evidence_task(data, estimator, model, rng_key, options):
    """One call of an evidence estimator."""
    return estimator(model, data, rng_key=rng_key, **options)


def backend_task(shared, backend, rng_key, options):
    """One call of an inference backend on ``shared = (model, data)``."""
    model, data = shared
    return backend(model, data, rng_key=rng_key, **options)


def score_task(data, score, model, heldout, rng_key):
    """One grid point of a held-out score."""
    return score(model, data, heldout, rng_key)


# -- merging --------------------------------------------------------------------------------------

def group_names(idata) -> list[str]:
    """The groups of InferenceData (ArviZ 0.x) or DataTree (1.x)."""
    import xarray as xr

    if isinstance(idata, xr.DataTree):
        return list(idata.children)
    return list(idata.groups())


def concat_chains(parts: Sequence, attrs: dict | None = None):
    """One InferenceData from several whose groups have a ``chain`` dimension, chains in order.

    Groups without a chain dimension (observed data, constants) are taken from the first part,
    as are the root attributes, updated by ``attrs``.
    """
    import xarray as xr

    from .convert import attrs_of, group, with_groups

    first = parts[0]
    merged = {}
    for name in group_names(first):
        datasets = [group(p, name) for p in parts]
        if "chain" not in datasets[0].dims:
            continue
        joined = xr.concat(datasets, dim="chain", join="override", combine_attrs="override")
        merged[name] = joined.assign_coords(chain=np.arange(joined.sizes["chain"]))
    out = with_groups(first, merged)
    out.attrs = {**attrs_of(first), **(attrs or {})}
    return out
