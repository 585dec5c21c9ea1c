"""Log marginal likelihood (evidence) of a model, and model comparison by evidence.

Every number says what it is (DESIGN §5): ``kind="exact"`` (enumeration or closed form),
``"estimate"`` (an unbiased estimator of the evidence such as SMC, reported on the log scale with
a standard error) or ``"lower_bound"`` (an ELBO). Estimators register themselves with
:func:`register_evidence`, next to the inference backends.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from .types import KeyLike

KINDS = ("exact", "estimate", "lower_bound")
# Runs whose log estimates spread by more than this many nats (standard deviation) are in the
# regime where the pooled log-mean-exp is decided by one run: a warning says so.
DISAGREEING_RUNS_SD = 2.0
# An estimate further below a sure lower bound than this many standard errors is wrong.
BELOW_BOUND_STDERRS = 3.0


class EvidenceWarning(UserWarning):
    """An evidence estimate that should not be trusted as it stands (runs disagree, or it lies
    below a sure lower bound); the message says what to do."""


def pool_runs(run_log_evidence) -> tuple[float, float]:
    """Pool independent runs' log estimates: log-mean-exp and an honest standard error.

    Each run's exp(value) is an unbiased estimate of the evidence, so their mean is too. Its
    standard error is taken from the spread of the runs themselves: the larger of the jackknife
    standard error of the pooled log-mean-exp (leave one run out) and sd(values) / sqrt(R). The
    delta-method error sd(exp values) / (sqrt(R) · mean) cannot exceed about 1 nat however far
    the runs disagree (it saturates when one run dominates the mean); these two grow with the
    disagreement. nan for a single run.
    """
    values = np.asarray(run_log_evidence, dtype=np.float64).reshape(-1)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError(f"run_log_evidence must be finite numbers, got {values.tolist()}")
    value = _log_mean_exp(values)
    R = values.size
    if R < 2:
        return value, float("nan")
    leave_one_out = np.array([_log_mean_exp(np.delete(values, r)) for r in range(R)])
    jackknife = np.sqrt((R - 1) / R * np.sum((leave_one_out - leave_one_out.mean()) ** 2))
    return value, float(max(jackknife, values.std(ddof=1) / np.sqrt(R)))


def _log_mean_exp(values: np.ndarray) -> float:
    peak = values.max()
    return float(peak + np.log(np.mean(np.exp(values - peak))))


def check_estimate(estimate: EvidenceEstimate, *, stacklevel: int = 3) -> EvidenceEstimate:
    """Warn (:class:`EvidenceWarning`) when an estimate's runs disagree or it lies below a sure
    lower bound; returns the estimate unchanged."""
    if estimate.kind != "estimate":
        return estimate
    details = estimate.details
    runs = np.asarray(details.get("run_log_evidence", []), dtype=np.float64)
    bound = details.get("lower_bound")
    advice = ("Use method='tempered' (or 'auto'), more particles or runs, or target_stderr= to add "
              "runs until the error is small.")
    if runs.size > 1 and runs.std(ddof=1) > DISAGREEING_RUNS_SD:
        warnings.warn(
            f"{estimate.method} evidence runs disagree: values {np.round(runs, 1).tolist()} "
            f"(sd {runs.std(ddof=1):.3g} nats); the pooled value {estimate.value:.6g} ± "
            f"{estimate.stderr:.3g} is decided by the best run and may be far too low. {advice}",
            EvidenceWarning, stacklevel=stacklevel)
    if bound is not None and np.isfinite(bound):
        # Rounding: an estimate equal to the bound (one allocation dominates) is not below it.
        slack = BELOW_BOUND_STDERRS * (estimate.stderr if np.isfinite(estimate.stderr) else 0.0) \
            + 1e-9 * max(1.0, abs(bound))
        if estimate.value < bound - slack:
            warnings.warn(
                f"{estimate.method} evidence {estimate.value:.6g} ± {estimate.stderr:.3g} lies "
                f"{bound - estimate.value:.4g} nats below the sure lower bound {bound:.6g} "
                f"(log p(X, S) of an allocation S the run visited): the estimate is too low. {advice}",
                EvidenceWarning, stacklevel=stacklevel)
    return estimate


@dataclass(frozen=True)
class EvidenceEstimate:
    """A log-evidence value with its provenance.

    Attributes
    ----------
    value : float
        log L_X in nats (full BAM evidence including log p(T) unless totals are conditioned on).
    stderr : float
        Standard error of ``value`` (0 for exact values; nan when unknown).
    method : str
        The estimator that produced it ("exact", "smc", "vb", ...).
    kind : str
        "exact", "estimate" or "lower_bound".
    details : dict
        Estimator-specific extras: ``run_log_evidence`` (each independent run's log estimate),
        ``lower_bound`` (a sure lower bound on log L_X: log p(X, S) of the best allocation S the
        runs visited, since L_X = Σ_S p(X, S)), diagnostics and settings.
    """

    value: float
    stderr: float
    method: str
    kind: str
    details: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    def __float__(self) -> float:
        return float(self.value)

    def __repr__(self) -> str:
        err = "" if self.kind == "exact" else f" ± {self.stderr:.4g}"
        return f"EvidenceEstimate({self.value:.6g}{err}, method={self.method!r}, kind={self.kind!r})"


_EVIDENCE: dict[str, list[tuple[tuple[type, ...], object]]] = {}


def register_evidence(name: str, models: tuple[type, ...] = (object,)):
    """Decorator registering ``fn(model, data, *, rng_key, **options) -> EvidenceEstimate``."""
    if not isinstance(name, str) or not name:
        raise ValueError("register_evidence: name must be a non-empty string")

    def deco(fn):
        entries = _EVIDENCE.setdefault(name, [])
        entries[:] = [(m, f) for m, f in entries if m != tuple(models)]
        entries.append((tuple(models), fn))
        return fn

    return deco


def evidence_methods() -> list[str]:
    """Names of the registered evidence estimators."""
    _load_backends()
    return sorted(_EVIDENCE)


def _load_backends() -> None:
    from . import infer  # noqa: F401  (importing registers every backend)


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
    fn = _estimator(model, method)
    from .infer.registry import check_options

    check_options(fn, options, f"bam.log_evidence(method={method!r})")
    if target_stderr is None and max_time is None:
        return check_estimate(fn(model, data, rng_key=rng_key, **options))
    return _until_precise(fn, model, data, rng_key, target_stderr, max_time, options)


def _estimator(model, method):
    _load_backends()
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, got {type(method).__name__}")
    if method not in _EVIDENCE:
        raise ValueError(f"unknown evidence method {method!r}; registered: {sorted(_EVIDENCE)}")
    from .infer.registry import most_specific

    fn = most_specific(model, _EVIDENCE[method])
    if fn is None:
        accepted = [t.__name__ for types, _ in _EVIDENCE[method] for t in types]
        raise TypeError(f"evidence method {method!r} accepts {accepted}, not {type(model).__name__}")
    return fn


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
    return check_estimate(replace(est, value=value, stderr=stderr, details=details), stacklevel=4)


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
        ``lower_bound`` holds each estimate's sure lower bound where it reports one.
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
            est = log_evidence(model, data, method=m, rng_key=rng_key, **options)
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
    return table
