"""Log marginal likelihood (evidence) of a model, and model comparison by evidence.

Every number says what it is (DESIGN §5): ``kind="exact"`` (enumeration or closed form),
``"estimate"`` (an unbiased estimator of the evidence such as SMC, reported on the log scale with
a standard error) or ``"lower_bound"`` (an ELBO). Estimators register themselves with
:func:`register_evidence` in the one registry of :mod:`bam_ppl.infer.registry`, next to the
inference backends; :mod:`bam_ppl.estimate` says what an estimate holds.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from .estimate import (  # noqa: F401  (re-exported: the public names of evidence values)
    KINDS,
    EvidenceEstimate,
    EvidenceWarning,
    below_bound,
    check_estimate,
    pool_calls,
    pool_runs,
    with_warnings,
)
from .infer.registry import (  # noqa: F401
    check_options,
    evidence_methods,
    find_evidence,
    register_evidence,
    resolve_options,
)
from .parallel import Task, check_executor, evidence_task, run_tasks, task_key
from .types import KeyLike, as_key
from .validation import check_int, check_positive

logger = logging.getLogger(__name__)

# Independent calls of an estimator under target_stderr run in rounds; a round at most doubles
# the calls made so far, so the calls never overshoot the projected need by more than twice.
ROUND_GROWTH = 2
# A standard error estimated from R runs is itself uncertain (chi-square with R − 1 degrees of
# freedom): the rounds stop once the error is below target_stderr with this confidence.
STOP_CONFIDENCE = 0.95


def log_evidence(model, data, method: str = "auto", rng_key: KeyLike = 0, *,
                 target_stderr: float | None = None, max_time: float | None = None,
                 min_calls: int | None = None, executor=None, idata=None, **options) -> EvidenceEstimate:
    """log marginal likelihood of ``data`` under ``model``.

    Parameters
    ----------
    model : AllocationModel or another registered model
    data : array-like or CountTensor
    method : str
        "auto" (default: exact where enumeration is cheap, else the tempered SMC from a mixture of
        references, "mixture"; the estimate's ``pipeline`` names what ran, :mod:`bam_ppl.infer.auto`),
        "exact" (enumeration / closed form), "tempered"
        (tempered SMC over allocations), "smc" (the Pólya-urn SMC of the BAM paper: accurate on
        small data, collapses at thousands of tokens), "chib" (Chib-style estimate from
        collapsed Gibbs, a cross-check), "vb" (best ELBO over restarts, a lower bound), or any
        registered estimator (:func:`evidence_methods`).
    rng_key : int or jax key
    target_stderr : float, optional
        For estimators that report independent runs (``details["run_log_evidence"]``): repeat
        the call with fresh keys, pooling all runs, until the standard error (from the calls'
        own stated errors and their spread, :func:`pool_calls`) is at most this many nats with 95 %
        confidence (:func:`error_upper_bound`): a few runs that happen to agree do not stop it.
    max_time : float, optional
        Seconds within which the repetitions for ``target_stderr`` stop: no round of calls starts
        that would end later at the pace of the calls so far (the first call always runs); the
        estimate so far is returned with an :class:`EvidenceWarning`. Default: no limit.
    min_calls : int, optional
        Make at least this many independent calls (keys ``fold_in(rng_key, c)``) and pool all
        their runs, as ``target_stderr`` does; on its own, exactly this many. Where the posterior
        has several basins and one call finds one of them (docs/evidence_methods.md), a call's
        runs agree within their own error,
        whichever basin it found: only calls with keys of their own show the spread between
        basins, and then the stated error does too (:func:`pool_calls`), and
        :class:`EvidenceWarning` says that the runs disagree. Default (None): one call.
    executor : concurrent.futures.Executor or dask.distributed.Client, optional
        Runs the estimator there (:mod:`bam_ppl.parallel`). Under ``target_stderr`` the repeated
        calls of a round run at once; call ``c`` always has the key ``fold_in(rng_key, c)`` and
        the rounds depend only on the runs' values, so the estimate is the same as without an
        executor, on any number of workers.
    idata : arviz.InferenceData or xarray.DataTree, optional
        Also store the estimate in it (:func:`add_evidence`).
    **options
        Passed to the estimator (``num_particles``, ``num_chains``, ``engine``, ...).

    Warns
    -----
    EvidenceWarning
        When the runs of an estimate disagree, or it lies below the sure lower bound of the
        allocations the runs visited.
    """
    if idata is not None:
        _check_idata(idata)  # before the work, not after it
    est = _log_evidence(model, data, method, rng_key, options, target_stderr=target_stderr, max_time=max_time,
                        executor=executor, min_calls=min_calls)
    if idata is not None:
        add_evidence(idata, est)
    return est


def _log_evidence(model, data, method, rng_key, options, *, target_stderr=None, max_time=None, executor=None,
                  min_calls=None):
    """:func:`log_evidence` for it and :func:`compare`: both call it from the user's frame, so that
    an EvidenceWarning (``stacklevel``) points at the user's line. The EvidenceWarnings raised on
    the way are kept in the estimate's ``warnings`` (:func:`_recording`)."""
    fn = find_evidence(method, model)
    options = resolve_options(fn, options, f"bam.log_evidence(method={method!r})", stacklevel=5)
    as_key(rng_key)  # a bad key is an error for every method, the exact ones that draw nothing included
    check_executor(executor)
    if min_calls is not None:
        check_int(min_calls, "min_calls", minimum=1)
    logger.debug("log_evidence(method=%r) on %s: started", method, type(model).__name__)
    began = time.perf_counter()
    with _recording() as caught:
        if target_stderr is None and max_time is None and (min_calls or 1) == 1:
            if executor is None:
                est = fn(model, data, rng_key=rng_key, **options)
            else:
                [est] = run_tasks(executor, evidence_task,
                                  [Task(_label(model, f'method={method!r}'), (fn, model, rng_key, options))], data)
            est = check_estimate(est, stacklevel=4)
        else:
            est = _until_precise(fn, model, data, rng_key, options, target_stderr=target_stderr, max_time=max_time,
                                 executor=executor, min_calls=min_calls)
    logger.debug("log_evidence(method=%r) on %s: %.2f ± %.2f (%s) in %.1f s", method, type(model).__name__,
                 est.value, est.stderr, est.kind, time.perf_counter() - began)
    return with_warnings(est, _evidence_messages(caught))


@contextmanager
def _recording():
    """Record the warnings raised inside, every EvidenceWarning even where a filter ignores it, and
    raise them again on the way out, at the places they were raised (where the filters apply as
    before): the EvidenceWarnings' messages go into the estimate, so that a saved comparison keeps them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EvidenceWarning)
        yield caught
    for w in caught:
        # As warnings.warn would: the raising module's name (filters such as Python's
        # default::DeprecationWarning:__main__ match it) and its registry ("once per location").
        module = next((m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == w.filename), None)
        if module is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        else:
            # No module_globals: its loader may not serve source (``python -`` reads __main__ from stdin).
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, module=module.__name__,
                                   registry=vars(module).setdefault("__warningregistry__", {}), source=w.source)


def _evidence_messages(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, EvidenceWarning)]


def _calls(executor, fn, model, data, rng_key, options, calls) -> list:
    """The estimator's calls ``calls`` (on ``executor`` when given), call ``c`` with the key ``fold_in(rng_key, c)``."""
    tasks = [Task(_label(model, fn.__name__, call), (fn, model, task_key(rng_key, call), options)) for call in calls]
    return run_tasks(executor, evidence_task, tasks, data)


def _label(model, estimator: str, call: int | None = None) -> str:
    """How an error of a task on an executor names it."""
    return f"{type(model).__name__} evidence ({estimator}" + ("" if call is None else f", call {call}") + ")"


def _next_round(calls: int, stderr: float, target_stderr: float | None) -> int:
    """Calls of the next round: the projected need (the error falls as 1/sqrt(calls)), at least
    one, at most ROUND_GROWTH − 1 times the calls so far. Depends on values, never on workers."""
    if target_stderr is None or not np.isfinite(stderr):
        return 1
    needed = int(np.ceil(calls * (stderr / target_stderr) ** 2))
    return int(np.clip(needed - calls, 1, (ROUND_GROWTH - 1) * calls))


def error_upper_bound(stderr: float, num_runs: int, confidence: float = STOP_CONFIDENCE) -> float:
    """An upper confidence bound on the standard error ``stderr`` estimated from ``num_runs``
    runs: s · sqrt((R − 1) / χ²_(1−c)(R − 1)), (R − 1) s² / σ² being chi-square with R − 1 degrees
    of freedom for roughly normal run values; inf for fewer than two runs."""
    from scipy.stats import chi2

    if num_runs < 2 or not np.isfinite(stderr):
        return float("inf")
    df = num_runs - 1
    return float(stderr * np.sqrt(df / chi2.ppf(1.0 - confidence, df)))


def _until_precise(fn, model, data, rng_key, options, *, target_stderr, max_time, executor,
                   min_calls: int | None = None) -> EvidenceEstimate:
    """Repeat an estimator with keys fold_in(key, 0, 1, …), a round of calls at a time (on
    ``executor`` when given), until the pooled error meets the target; the first round makes
    ``min_calls`` calls (without a target or a time limit, the only round)."""
    if target_stderr is not None:
        check_positive(target_stderr, "target_stderr")
    if max_time is not None:
        check_positive(max_time, "max_time")
    start = time.perf_counter()
    made, calls, size = [], 0, min_calls or 1
    while True:
        logger.info("evidence: calls %d..%d of %s", calls, calls + size - 1, fn.__name__)
        estimates = _calls(executor, fn, model, data, rng_key, options, range(calls, calls + size))
        calls += size
        for est in estimates:
            if est.kind != "estimate" or "run_log_evidence" not in est.details:
                return est  # exact values and bounds have nothing to add up
            made.append(est)
        _, stderr = pool_calls([est.details["run_log_evidence"] for est in made], [est.stderr for est in made])
        elapsed = time.perf_counter() - start
        logger.info("evidence: %d calls in %.1f s, pooled standard error %.3g (target %s)", calls, elapsed, stderr,
                    target_stderr)
        if target_stderr is None and max_time is None:
            break  # min_calls alone: its calls are all there is to make
        size = _next_round(calls, stderr, target_stderr)
        num_runs = sum(len(est.details["run_log_evidence"]) for est in made)
        if target_stderr is not None and error_upper_bound(stderr, num_runs) <= target_stderr:
            break
        if max_time is not None:
            # No round that would end past max_time at the pace so far: a round finishes once
            # started, and calls of a real-data estimate take minutes each.
            size = min(size, int((max_time - elapsed) // max(elapsed / calls, 1e-9)))
        if max_time is not None and size < 1:
            if target_stderr is not None:
                warnings.warn(
                    f"{est.method} evidence stopped after {elapsed:.1f} s (max_time={max_time}) at "
                    f"± {stderr:.3g} nats, above target_stderr={target_stderr}; raise max_time or "
                    "use a more efficient method (method='tempered')", EvidenceWarning, stacklevel=4)
            break
    return check_estimate(_pooled(made, elapsed), stacklevel=5)


def _pooled(made: list, elapsed: float) -> EvidenceEstimate:
    """Independent calls' estimates as one (:func:`pool_calls`): the details of the highest call (it
    dominates the pooled value), the sure bound and its allocation from the call that visited the
    best one, each call's value (``call_values``), their number and the seconds they took."""
    value, stderr = pool_calls([est.details["run_log_evidence"] for est in made], [est.stderr for est in made])
    top = max(made, key=lambda est: est.value)
    bounded = max(made, key=lambda est: est.details.get("lower_bound", -np.inf))
    runs = [float(run) for est in made for run in est.details["run_log_evidence"]]
    details = {**top.details, "run_log_evidence": runs, "num_calls": len(made),
               "call_values": [float(est.value) for est in made], "seconds": elapsed,
               **{name: bounded.details[name] for name in ("lower_bound", "best_cells", "best_counts")
                  if name in bounded.details}}
    return replace(top, value=value, stderr=stderr, details=details, run_values=tuple(runs), num_runs=len(runs),
                   lower_bound=float(np.fmax.reduce([est.lower_bound for est in made])), seconds=elapsed,
                   warnings=tuple(dict.fromkeys(message for est in made for message in est.warnings)))


def compare(models: Mapping, data, method: str | Mapping = "auto", rng_key: KeyLike = 0, *, executor=None,
            min_calls: int | None = None, **options):
    """Rank models by their log evidence.

    Parameters
    ----------
    models : dict
        name -> model, or name -> an already computed :class:`EvidenceEstimate`.
    method : str or dict
        Estimator for every model, or a dict name -> method.
    rng_key : int or jax key
        Every model's estimator gets this key, so a row equals
        ``log_evidence(model, data, method, rng_key, min_calls=min_calls)``.
    executor : concurrent.futures.Executor or dask.distributed.Client, optional
        Runs one task per model there (:mod:`bam_ppl.parallel`), the data sent to each worker
        once; the table is the same as without an executor. A model whose estimator raises
        surfaces as a :class:`~bam_ppl.parallel.TaskError` naming the model. With ``min_calls``,
        the models run one after another, each model's calls at once there.
    min_calls : int, optional
        Independent calls pooled per model (:func:`log_evidence`): where a posterior has several
        basins, only their spread shows it in a row's ``stderr``. Default (None): one call.
    **options
        Passed to every estimator call.

    Returns
    -------
    pandas.DataFrame
        Indexed by model name, best first, with the columns of ``arviz.compare`` on the evidence
        scale:

        ``rank``
            1 for the highest log evidence (ties share the lower rank).
        ``log_evidence``, ``se``
            The estimate and its standard error (0 for exact values, nan when unknown).
        ``dse``
            Standard error of the difference to the best row, sqrt(se_best² + se²), the estimates
            being independent; 0 for the best row.
        ``weight``
            Posterior model probability under equal prior odds: exp(log_evidence) normalised.
        ``warning``
            True where an :class:`EvidenceWarning` was raised about the estimate (its messages are
            in the estimate's ``warnings``); the table keeps it once saved.
        ``kind``, ``method``
            "exact", "estimate" or "lower_bound", and the estimator asked for.
        ``lower_bound``
            The estimate's sure lower bound on the log evidence where it reports one.
        ``log_bayes_factor``
            log_evidence − best log_evidence (≤ 0).
        ``distinguishable``
            False for rows within two ``dse`` of the best (nan errors counted as 0), whose order the
            estimates do not settle, and for the best row itself unless every other row is
            distinguishable from it.
        ``below_bound``
            The estimate lies below its sure lower bound beyond its error (not converged).

        A lower bound is not an evidence value: compare such rows with care (their ``kind`` says
        so). Deprecated columns, kept for this release only: ``stderr`` (use ``se``), ``prob``
        (use ``weight``) and ``delta`` (use ``-log_bayes_factor``).
    """
    if not isinstance(models, Mapping) or not models:
        raise ValueError("models must be a non-empty dict of name -> model")
    if not isinstance(method, (str, Mapping)):
        raise TypeError(f"method must be a str or a dict name -> method, got {type(method).__name__}")
    check_executor(executor)
    if min_calls is not None:
        check_int(min_calls, "min_calls", minimum=1)
    pooled = (min_calls or 1) > 1
    remote = {} if executor is None or pooled else _remote_estimates(models, data, method, rng_key, options, executor)
    estimates = {}
    for number, (name, model) in enumerate(models.items(), 1):
        if not isinstance(model, EvidenceEstimate):
            logger.info("compare: model %d of %d, %r", number, len(models), str(name))
        if isinstance(model, EvidenceEstimate):
            est = model
        elif name in remote:
            with _recording() as caught:
                est = check_estimate(remote[name], stacklevel=3)
            est = with_warnings(est, _evidence_messages(caught))
        else:
            est = _log_evidence(model, data, _method_of(method, name), rng_key, options,
                                executor=executor if pooled else None, min_calls=min_calls)
        estimates[str(name)] = est
    return _table(estimates)


def _table(estimates: dict):
    """The table of :func:`compare` from the estimates made (name -> EvidenceEstimate)."""
    import pandas as pd

    table = pd.DataFrame(
        [dict(model=str(name), log_evidence=est.value, se=est.stderr, kind=est.kind, method=est.method,
              lower_bound=est.lower_bound, warning=bool(est.warnings)) for name, est in estimates.items()]
    ).set_index("model")
    table["rank"] = table["log_evidence"].rank(ascending=False, method="min").astype(int)
    table = table.sort_values("rank", kind="stable")
    values, errors = table["log_evidence"].to_numpy(float), table["se"].to_numpy(float)
    log_bayes_factor = values - values[0]
    weight = np.exp(log_bayes_factor)
    table["weight"] = weight / weight.sum()
    dse = np.sqrt(errors[0] ** 2 + errors ** 2)
    dse[0] = 0.0
    table["dse"] = dse
    table["log_bayes_factor"] = log_bayes_factor
    known = np.nan_to_num(errors, nan=0.0)
    settled = -log_bayes_factor > 2.0 * np.sqrt(known[0] ** 2 + known ** 2)
    settled[0] = settled[1:].all()  # the best row is settled when every other row is
    table["distinguishable"] = settled
    table["below_bound"] = [below_bound(v, e, b) for v, e, b in zip(values, errors, table["lower_bound"])]
    # Deprecated names, one release: stderr (se), prob (weight), delta (-log_bayes_factor).
    table["stderr"], table["prob"], table["delta"] = table["se"], table["weight"], -log_bayes_factor
    columns = ["rank", "log_evidence", "se", "dse", "weight", "warning", "kind", "method", "lower_bound",
               "log_bayes_factor", "distinguishable", "below_bound", "stderr", "prob", "delta"]
    return table[columns]


def _method_of(method, name) -> str:
    return method.get(name, "auto") if isinstance(method, Mapping) else method


def _remote_estimates(models: Mapping, data, method, rng_key, options, executor) -> dict:
    """Every model's estimate computed on ``executor``, one task per model, keyed by name."""
    tasks, names = [], []
    for name, model in models.items():
        if isinstance(model, EvidenceEstimate):
            continue
        chosen = _method_of(method, name)
        fn = find_evidence(chosen, model)
        mapped = resolve_options(fn, options, f"bam.compare(method={chosen!r})", stacklevel=5)
        tasks.append(Task(f"model {str(name)!r} (method={chosen!r})", (fn, model, rng_key, mapped)))
        names.append(name)
    return dict(zip(names, run_tasks(executor, evidence_task, tasks, data)))


# Where an InferenceData keeps an estimate: the variable PyMC's SMC names the log evidence, in
# sample_stats, and the whole estimate (EvidenceEstimate.to_dict as JSON) in that group's attrs.
EVIDENCE_VARIABLE = "log_marginal_likelihood"
EVIDENCE_ATTR = "bam_ppl_evidence"


def add_evidence(idata, estimate: EvidenceEstimate):
    """Store ``estimate`` in ``idata`` (in place), where it survives ``to_netcdf`` and
    ``arviz.from_netcdf``; :func:`read_evidence` reads it back.

    ``sample_stats`` (created if absent) gets the scalar variable ``log_marginal_likelihood``, as
    PyMC's SMC names it, with attrs ``stderr``, ``kind``, ``method`` and ``pipeline``, and its
    attrs ``bam_ppl_evidence``: the whole estimate as JSON (:meth:`EvidenceEstimate.to_dict`).
    A previous estimate there is replaced.

    Parameters
    ----------
    idata : arviz.InferenceData (ArviZ 0.x) or xarray.DataTree (ArviZ ≥ 1)
    estimate : EvidenceEstimate

    Returns
    -------
    The same ``idata``.
    """
    import xarray as xr

    _check_idata(idata)
    if not isinstance(estimate, EvidenceEstimate):
        raise TypeError(f"estimate must be an EvidenceEstimate, got {type(estimate).__name__}")
    variable = xr.DataArray(np.float64(estimate.value), attrs=dict(
        stderr=float(estimate.stderr), kind=estimate.kind, method=estimate.method, pipeline=estimate.pipeline))
    stored = json.dumps(estimate.to_dict(), allow_nan=False)
    stats = _sample_stats(idata)
    if stats is None:
        new = xr.Dataset({EVIDENCE_VARIABLE: variable}, attrs={EVIDENCE_ATTR: stored})
        if isinstance(idata, xr.DataTree):
            idata["sample_stats"] = xr.DataTree(new)
        else:
            idata.add_groups({"sample_stats": new})
        return idata
    stats[EVIDENCE_VARIABLE] = variable
    stats.attrs[EVIDENCE_ATTR] = stored
    return idata


def read_evidence(idata) -> EvidenceEstimate:
    """The :class:`EvidenceEstimate` that :func:`add_evidence` stored in ``idata`` (also after
    ``to_netcdf`` and ``arviz.from_netcdf``); details hold lists where there were arrays."""
    _check_idata(idata)
    stats = _sample_stats(idata)
    if stats is None or EVIDENCE_ATTR not in stats.attrs:
        raise ValueError(f"idata holds no evidence estimate (no {EVIDENCE_ATTR!r} in sample_stats attrs): "
                         "store one with bam.add_evidence(idata, estimate) or bam.log_evidence(..., idata=idata)")
    return EvidenceEstimate.from_dict(json.loads(stats.attrs[EVIDENCE_ATTR]))


def _sample_stats(idata):
    import xarray as xr

    if isinstance(idata, xr.DataTree):
        return idata["sample_stats"] if "sample_stats" in idata.children else None
    return idata.sample_stats if "sample_stats" in idata.groups() else None


def _check_idata(idata) -> None:
    import xarray as xr

    if isinstance(idata, xr.DataTree) or (hasattr(idata, "groups") and hasattr(idata, "add_groups")):
        return
    raise TypeError(f"idata must be an arviz.InferenceData or xarray.DataTree, got {type(idata).__name__}")
