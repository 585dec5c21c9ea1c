"""Independent tasks on an executor: model sweeps, evidence runs, chains and restarts.

``bam.compare``, ``bam.log_evidence``, ``bam.infer`` and ``bam.select_ranks`` take
``executor=``: any :class:`concurrent.futures.Executor`, or a ``dask.distributed.Client``
passed as it is. Their work splits into independent tasks (one model, one evidence call, one
chain or restart, one grid point). This module holds what every one of them shares:

* **keys** — a task's key derives from ``rng_key`` and the task's identity only, never from
  the number of workers or the order in which they finish, so a result is the same on any
  executor and any cluster: every model of a comparison and every grid point gets ``rng_key``
  itself (as in the serial call), evidence call ``c`` gets ``jax.random.fold_in(rng_key, c)``
  (:func:`task_key`); chain (restart) ``c`` of every built-in backend draws from that key
  alone, vectorised beside other chains or not (:func:`chain_keys`);
* **data** — what every task reads is sent to each Dask worker once
  (``client.scatter(..., broadcast=True)``), not once per task;
* **errors** — a task that raises surfaces as a :class:`TaskError` that names the task (the
  model's name, the chain); a Dask worker lost mid-sweep is not an error: the scheduler runs
  its tasks again on another worker, and tasks it cancels because the scattered data went with
  the worker are submitted again (:data:`DASK_RESUBMISSIONS`);
* **merging** — results come back in task order; chains are concatenated into one
  InferenceData (:func:`concat_chains`), attributes that pool the chains recomputed
  (:func:`chain_summary`); restarts merge as the backend keeps them (:func:`restart_layout`).

Without an executor (``executor=None``) ``compare``, ``log_evidence`` and ``select_ranks`` run
the same tasks one after another in the calling process, so their results do not depend on
the executor at all. ``infer`` without an executor runs every chain in one call (vectorised);
with an executor it runs chain ``c`` as its own task (the backend with one chain and the
private option ``_first_chain=c``), and the merged InferenceData is the vectorised call's, bit
for bit (NUTS with ``chain_method="sequential"``, its default). A backend registered without
``_first_chain`` gets the key ``fold_in(rng_key, c)`` instead: the same result on every
executor, not the serial one.

:func:`shard_axis` splits the particles of the Pólya-urn and tempered SMC JAX kernels and the
chains of collapsed Gibbs across ``jax.devices()`` (a no-op on one device).
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
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


def chain_keys(rng_key: KeyLike, num_chains: int, first: int = 0, parts: int = 1):
    """The keys of chains (or restarts) ``first .. first + num_chains - 1`` of a run keyed by ``rng_key``.

    Chain ``c`` has the key ``fold_in(rng_key, c)`` (:func:`task_key`), whatever the number of
    chains run beside it, so chain ``c`` run alone (``num_chains=1``, ``first=c``) draws what it
    draws in a vectorised run. ``parts > 1`` splits each chain's key into that many streams and
    returns them as a tuple of ``parts`` arrays of shape (num_chains, 2); ``parts=1`` returns the
    (num_chains, 2) array itself.
    """
    import jax
    import jax.numpy as jnp

    key = as_key(rng_key)
    if num_chains > EAGER_KEYS_MAX_CHAINS:
        keys = _folded_keys()(key, num_chains, np.uint32(first), parts)
    else:
        one = [jax.random.fold_in(key, first + c) for c in range(num_chains)]
        keys = jnp.asarray(np.stack([np.asarray(k if parts == 1 else jax.random.split(k, parts)) for k in one]))
    return keys if parts == 1 else tuple(keys[:, p] for p in range(parts))


# Up to this many chains their keys are folded one by one: the two ops compile once per process
# for any number of chains (about 0.5 ms a chain after that), where the vectorised program
# compiles anew for each number (about 0.3 s on a CPU).
EAGER_KEYS_MAX_CHAINS = 512


@functools.cache
def _folded_keys():
    """``chain_keys``'s arithmetic as one program compiled per (num_chains, parts): traced op by op
    it cost a few milliseconds per call."""
    import jax
    import jax.numpy as jnp

    def folded(key, num_chains, first, parts):
        keys = jax.vmap(lambda c: jax.random.fold_in(key, c))(jnp.arange(num_chains, dtype=jnp.uint32) + first)
        return keys if parts == 1 else jax.vmap(lambda k: jax.random.split(k, parts))(keys)

    return jax.jit(folded, static_argnums=(1, 3))


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
    return _dask_tasks(executor, fn, tasks, shared)


# Scattered data does not survive the loss of a worker that holds a replica: the scheduler may
# forget it and cancel the tasks that read it, though it was broadcast (dask/distributed#3149;
# a worker killed mid-task, then another task: cancelled nearly every time). Such tasks are
# submitted again, with the data scattered again, up to this many times.
DASK_RESUBMISSIONS = 3
_LOST = object()  # what _gather gives for a task cancelled with its data


def _dask_tasks(client, fn: Callable, tasks: Sequence[Task], shared) -> list:
    results, pending = [None] * len(tasks), list(range(len(tasks)))
    for attempt in range(DASK_RESUBMISSIONS + 1):
        if attempt:
            client.wait_for_workers(1)
        # A list around ``shared`` keeps scatter from splitting a list or dict of data into parts.
        [remote] = client.scatter([shared], broadcast=True, hash=False)
        token = uuid.uuid4().hex[:8]
        futures = [client.submit(fn, remote, *tasks[i].args, pure=False, key=f"{tasks[i].label}-{token}-{i}")
                   for i in pending]
        done = _gather(futures, [tasks[i] for i in pending], cancel=functools.partial(client.cancel, futures),
                       lost=concurrent.futures.CancelledError)
        for i, result in zip(pending, done):
            if result is not _LOST:
                results[i] = result
        pending = [i for i, result in zip(pending, done) if result is _LOST]
        if not pending:
            return results
    label = tasks[pending[0]].label
    raise TaskError(label, RuntimeError(f"cancelled by the Dask scheduler {DASK_RESUBMISSIONS + 1} times (its data "
                                        "was lost with a worker each time)"))


def _gather(futures, tasks: Sequence[Task], cancel, lost=()) -> list:
    """The results in task order; a task that raises ``lost`` gives ``_LOST`` (to be submitted
    again), any other error stops the others and is raised as a TaskError naming the task."""
    results = []
    for future, task in zip(futures, tasks):
        try:
            results.append(future.result())
        except lost:
            results.append(_LOST)
        except Exception as error:
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


# -- chains and restarts of one backend ---------------------------------------------------------

#: The option that counts independent chains, runs or restarts, in every backend. A backend
#: declared with :func:`restart_layout` runs restarts (the best is kept); otherwise chains
#: (merged by concatenation).
CHAIN_OPTION = "num_chains"
#: The root attribute in which optimisers record their number of restarts (kept for readers of
#: saved results), and the option name of backends registered before ``num_chains`` meant it.
RESTART_OPTION = "num_restarts"
#: The private option, set by :func:`split_backend` only, that names the index of a run's first
#: chain (restart): chain c of a run keyed by ``rng_key`` is the run with one chain, that option c
#: and the same ``rng_key``. Not a user option: it is no part of the option vocabulary.
FIRST_OPTION = "_first_chain"
#: Root attributes by which a restart is judged, higher is better, in order of preference.
RESTART_OBJECTIVES = ("best_elbo", "log_posterior")


def split_backend(backend, model, data, rng_key, options: dict, executor, label: str):
    """Run an inference backend as one task per chain (or restart) on ``executor``.

    A backend that takes ``_first_chain`` keys chain ``c`` by ``rng_key`` and ``c`` alone
    (:func:`chain_keys`); task ``c`` runs it with one chain and ``_first_chain=c``, so the merged
    result is the one of ``executor=None``, bit for bit. Another backend gets one chain and the
    key ``fold_in(rng_key, c)`` (the same result on every executor, not the serial one). The
    chains are concatenated in order; restarts (a backend declared with :func:`restart_layout`,
    or one whose option is still ``num_restarts``) merge as the backend keeps them, else the one
    with the best objective is kept, the first of equals. A backend without ``num_chains`` runs
    as a single task.
    """
    params = inspect.signature(backend).parameters
    option = next((name for name in (CHAIN_OPTION, RESTART_OPTION) if name in params), None)
    if option is None:
        return run_tasks(executor, backend_task, [Task(label, (backend, rng_key, options))], (model, data))[0]
    restarts = option == RESTART_OPTION or getattr(backend, "restart_layout", None) is not None
    count = int(options.get(option, params[option].default))
    if count < 1:
        raise ValueError(f"{option} must be a positive integer, got {count}")
    offset = int(options.get(FIRST_OPTION, 0))
    kind = "restart" if restarts else "chain"
    tasks = [Task(f"{label} {kind} {c}", (backend, *_one_of(params, option, rng_key, options, c)))
             for c in range(offset, offset + count)]
    parts = run_tasks(executor, backend_task, tasks, (model, data))
    if not restarts:
        merged = concat_chains(parts, attrs={CHAIN_OPTION: count})
        summarise = getattr(backend, "chain_summary", None)
        return merged if summarise is None else with_attrs(merged, summarise(merged))
    layout = getattr(backend, "restart_layout", None)
    if layout is None:
        return best_restart(parts, label)
    if layout.dim is None:
        return concat_chains(parts, attrs={RESTART_OPTION: count})
    return merge_restarts(parts, layout, first=offset)


def _one_of(params, option: str, rng_key, options: dict, index: int) -> tuple:
    """(rng_key, options) of the task that runs chain (restart) ``index`` alone."""
    if FIRST_OPTION in params:
        return rng_key, {**options, option: 1, FIRST_OPTION: index}
    return task_key(rng_key, index), {**options, option: 1}


def chain_summary(summarise: Callable):
    """Decorator naming ``summarise(idata) -> dict``: the root attributes of a backend that pool
    its chains (an evidence estimate over runs, say), recomputed when ``bam.infer`` merges chains
    run as tasks."""

    def deco(fn):
        fn.chain_summary = summarise
        return fn

    return deco


class RestartLayout(NamedTuple):
    """Where a backend's result keeps its restarts (:func:`restart_layout`)."""

    dim: str | None
    objective: str | None


def restart_layout(dim: str | None = None, objective: str | None = None):
    """Decorator declaring how the restarts of a backend merge when ``bam.infer`` runs them as tasks.

    ``dim=None``: every restart is kept, as a chain, and they merge like chains. Otherwise the
    posterior is the best restart's, the one with the highest finite ``objective`` (a
    ``sample_stats`` variable along ``dim``; the first of equals), and the ``sample_stats``
    variables along ``dim`` hold every restart (:func:`merge_restarts`).
    """
    if (dim is None) != (objective is None):
        raise ValueError("restart_layout: give both dim and objective, or neither (restarts kept as chains)")

    def deco(fn):
        fn.restart_layout = RestartLayout(dim, objective)
        return fn

    return deco


def best_index(values) -> int:
    """Index of the highest value, non-finite values never winning, the first of equals."""
    values = np.asarray(values, dtype=np.float64)
    return int(np.argmax(np.where(np.isfinite(values), values, -np.inf)))


def merge_restarts(parts: Sequence, layout: RestartLayout, first: int = 0):
    """One result from single-restart results ``first, first + 1, ...``, as one vectorised run gives it.

    The posterior and the other groups are the best restart's; ``sample_stats`` variables along
    ``layout.dim`` are concatenated over the restarts. A restart that stopped iterating early
    holds its last value up to the longest trace, as a converged restart does in a vectorised run.
    """
    import xarray as xr

    from .convert import group, with_groups

    stats = [group(p, "sample_stats") for p in parts]
    per_restart = [name for name, var in stats[0].data_vars.items() if layout.dim in var.dims]
    longest = max(s.sizes.get("iteration", 0) for s in stats)
    joined = xr.concat([_hold_last(s[per_restart], "iteration", longest) for s in stats], dim=layout.dim,
                       join="override", coords="minimal", compat="override", combine_attrs="override")
    if layout.dim in joined.coords:
        joined = joined.assign_coords({layout.dim: np.arange(joined.sizes[layout.dim])})
    objective = joined[layout.objective].transpose(layout.dim, ...).values.reshape(len(parts), -1)[:, 0]
    best = best_index(objective)
    kept = stats[best]
    merged = xr.Dataset({name: joined[name] if name in per_restart else kept[name] for name in kept.data_vars},
                        attrs=kept.attrs)
    out = with_groups(parts[best], {"sample_stats": merged})
    return with_attrs(out, {RESTART_OPTION: len(parts), "best_restart": first + best})


def _hold_last(ds, dim: str, length: int):
    """``ds`` extended along ``dim`` to ``length`` by repeating its last entry."""
    size = ds.sizes.get(dim, length)
    if size == length:
        return ds
    padded = ds.pad({dim: (0, length - size)}, mode="edge")
    return padded.assign_coords({dim: np.arange(length)}) if dim in ds.coords else padded


def best_restart(parts: Sequence, label: str):
    """The restart with the highest objective (``RESTART_OBJECTIVES`` of its root attributes)."""
    from .convert import attrs_of

    attrs = [attrs_of(p) for p in parts]
    objective = next((name for name in RESTART_OBJECTIVES if name in attrs[0]), None)
    if objective is None:
        raise ValueError(f"{label}: its result names no objective ({' or '.join(RESTART_OBJECTIVES)} in attrs) "
                         "by which to keep the best restart; run it without an executor")
    best = best_index([a[objective] for a in attrs])
    return with_attrs(parts[best], {RESTART_OPTION: len(parts), "best_restart": best})


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
    as are the root attributes; those of ``attrs`` that it holds are updated (a backend that
    records its number of chains records the total).
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
    held = attrs_of(first)
    return with_attrs(with_groups(first, merged), {k: v for k, v in (attrs or {}).items() if k in held})


def with_attrs(idata, updates: dict):
    """``idata`` with ``updates`` in its root attributes and in every group's attributes that
    already hold the key (backends repeat settings such as ``num_chains`` there)."""
    from .convert import attrs_of, group, with_groups

    groups = {}
    for name in group_names(idata):
        ds = group(idata, name)
        if any(key in ds.attrs for key in updates):
            groups[name] = ds.assign_attrs({k: v for k, v in updates.items() if k in ds.attrs})
    out = with_groups(idata, groups) if groups else idata
    out.attrs = {**attrs_of(idata), **updates}
    return out


# -- sharding across jax.devices() -----------------------------------------------------------------

def device_mesh(axis_name: str):
    """A one-axis :class:`jax.sharding.Mesh` over every device, or None on a single device."""
    import jax
    from jax.sharding import Mesh

    devices = jax.devices()
    return Mesh(np.asarray(devices), (axis_name,)) if len(devices) > 1 else None


def shard_axis(tree, size: int, axis: int, axis_name: str):
    """Split every array of ``tree`` whose ``axis`` has length ``size`` across ``jax.devices()``.

    The arrays are placed with a :class:`~jax.sharding.NamedSharding` that splits that axis
    (particles, chains), the other arrays replicated; jitted kernels then run partitioned, each
    device on its share. Unchanged on one device, or when ``size`` is not a multiple of the
    number of devices (an uneven split would pad every step).
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = device_mesh(axis_name)
    if mesh is None or size % mesh.size:
        return tree

    def place(x):
        spec = [None] * np.ndim(x)
        if np.ndim(x) and x.shape[axis] == size:
            spec[axis] = axis_name
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec(*spec)))

    return jax.tree.map(place, tree)
