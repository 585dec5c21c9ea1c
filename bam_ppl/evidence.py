"""Log marginal likelihood (evidence) of a model, and model comparison by evidence.

Every number says what it is (DESIGN §5): ``kind="exact"`` (enumeration or closed form),
``"estimate"`` (an unbiased estimator of the evidence such as SMC, reported on the log scale with
a standard error) or ``"lower_bound"`` (an ELBO). Estimators register themselves with
:func:`register_evidence` in the one registry of :mod:`bam_ppl.infer.registry`, next to the
inference backends; :mod:`bam_ppl.estimate` says what an estimate holds.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from .estimate import (  # noqa: F401  (re-exported: the public names of evidence values)
    KINDS,
    EvidenceEstimate,
    EvidenceWarning,
    below_bound,
    check_estimate,
    pool_runs,
)
from .infer.registry import check_options, evidence_methods, find_evidence, register_evidence  # noqa: F401
from .types import KeyLike


def log_evidence(model, data, method: str = "auto", rng_key: KeyLike = 0, *,
                 target_stderr: float | None = None, max_time: float | None = None,
                 **options) -> EvidenceEstimate:
    """log marginal likelihood of ``data`` under ``model``.

    Parameters
    ----------
    model : AllocationModel or another registered model
    data : array-like or CountTensor
    method : str
        "auto" (default: exact where enumeration is cheap, else the tempered SMC; the estimate's
        ``method`` names the one that ran), "exact" (enumeration / closed form), "tempered"
        (tempered SMC over allocations), "smc" (the Pólya-urn SMC of the BAM paper: accurate on
        small data, collapses at thousands of tokens), "chib" (Chib-style estimate from
        collapsed Gibbs, a cross-check), "vb" (best ELBO over restarts, a lower bound), or any
        registered estimator (:func:`evidence_methods`).
    rng_key : int or jax key
    target_stderr : float, optional
        For estimators that report independent runs (``details["run_log_evidence"]``): repeat
        the call with fresh keys, pooling all runs, until the standard error (from the spread of
        the runs, :func:`pool_runs`) is at most this many nats.
    max_time : float, optional
        Seconds after which the repetitions for ``target_stderr`` stop; the estimate so far is
        returned with an :class:`EvidenceWarning`. Default: no limit.
    **options
        Passed to the estimator (``num_particles``, ``num_chains``, ``num_restarts``, ...).

    Warns
    -----
    EvidenceWarning
        When the runs of an estimate disagree, or it lies below the sure lower bound of the
        allocations the runs visited.
    """
    return _log_evidence(model, data, method, rng_key, target_stderr, max_time, options)


def _log_evidence(model, data, method, rng_key, target_stderr, max_time, options):
    """:func:`log_evidence` for it and :func:`compare`: both call it from the user's frame, so that
    an EvidenceWarning (``stacklevel``) points at the user's line."""
    fn = find_evidence(method, model)
    check_options(fn, options, f"bam.log_evidence(method={method!r})")
    if target_stderr is None and max_time is None:
        return check_estimate(fn(model, data, rng_key=rng_key, **options), stacklevel=4)
    return _until_precise(fn, model, data, rng_key, target_stderr, max_time, options)


def _until_precise(fn, model, data, rng_key, target_stderr, max_time, options) -> EvidenceEstimate:
    """Repeat an estimator with keys fold_in(key, 0, 1, …) until the pooled error meets the target."""
    import jax

    from .types import as_key
    from .validation import check_positive

    if target_stderr is not None:
        check_positive(target_stderr, "target_stderr")
    if max_time is not None:
        check_positive(max_time, "max_time")
    key = as_key(rng_key)
    start = time.perf_counter()
    runs, bounds, calls = [], [], 0
    while True:
        est = fn(model, data, rng_key=jax.random.fold_in(key, calls), **options)
        calls += 1
        if est.kind != "estimate" or "run_log_evidence" not in est.details:
            return est  # exact values and bounds have nothing to add up
        runs.extend(est.details["run_log_evidence"])
        bounds.append(est.details.get("lower_bound", -np.inf))
        value, stderr = pool_runs(runs)
        elapsed = time.perf_counter() - start
        if target_stderr is not None and stderr <= target_stderr and len(runs) > 1:
            break
        if max_time is not None and elapsed >= max_time:
            if target_stderr is not None:
                warnings.warn(
                    f"{est.method} evidence stopped after {elapsed:.1f} s (max_time={max_time}) at "
                    f"± {stderr:.3g} nats, above target_stderr={target_stderr}; raise max_time or "
                    "use a more efficient method (method='tempered')", EvidenceWarning, stacklevel=3)
            break
    details = {**est.details, "run_log_evidence": list(map(float, runs)), "lower_bound": float(max(bounds)),
               "num_calls": calls, "seconds": elapsed}
    return check_estimate(replace(est, value=value, stderr=stderr, details=details), stacklevel=5)


def compare(models: Mapping, data, method: str | Mapping = "auto", rng_key: KeyLike = 0, **options):
    """Rank models by their log evidence.

    Parameters
    ----------
    models : dict
        name -> model, or name -> an already computed :class:`EvidenceEstimate`.
    method : str or dict
        Estimator for every model, or a dict name -> method.
    **options
        Passed to every estimator call.

    Returns
    -------
    pandas.DataFrame
        Indexed by model name, sorted best first, with columns ``log_evidence``, ``stderr``,
        ``kind``, ``method``, ``delta`` (best − this, ≥ 0), ``log_bayes_factor`` (this − best),
        ``prob`` (posterior model probability under a uniform model prior), ``rank``, and
        ``distinguishable``: False for rows within two combined standard errors of the best
        (sqrt(stderr_best² + stderr²)), whose order the estimates do not settle, and for the best
        row itself unless every other row is distinguishable from it.
        ``lower_bound`` holds each estimate's sure lower bound where it reports one, and
        ``below_bound`` flags estimates that lie below it beyond their error (not converged).
        A lower bound is not an evidence value: compare such rows with care (their ``kind`` says so).
    """
    import pandas as pd

    if not isinstance(models, Mapping) or not models:
        raise ValueError("models must be a non-empty dict of name -> model")
    rows = []
    for name, model in models.items():
        if isinstance(model, EvidenceEstimate):
            est = model
        else:
            m = method.get(name, "auto") if isinstance(method, Mapping) else method
            est = _log_evidence(model, data, m, rng_key, None, None, options)
        rows.append(dict(model=str(name), log_evidence=est.value, stderr=est.stderr, kind=est.kind,
                         method=est.method, lower_bound=est.details.get("lower_bound", np.nan)))
    table = pd.DataFrame(rows).set_index("model")
    best = table["log_evidence"].max()
    table["delta"] = best - table["log_evidence"]
    table["log_bayes_factor"] = table["log_evidence"] - best
    w = np.exp(table["log_bayes_factor"].to_numpy())
    table["prob"] = w / w.sum()
    table["rank"] = table["log_evidence"].rank(ascending=False, method="min").astype(int)
    table = table.sort_values("rank")
    errors = np.nan_to_num(table["stderr"].to_numpy(dtype=float), nan=0.0)
    combined = np.sqrt(errors[0] ** 2 + errors ** 2)
    settled = table["delta"].to_numpy() > 2.0 * combined
    settled[0] = settled[1:].all()  # the best row is settled when every other row is
    table["distinguishable"] = settled
    table["below_bound"] = [below_bound(v, e, b) for v, e, b in
                            zip(table["log_evidence"], table["stderr"], table["lower_bound"])]
    return table
