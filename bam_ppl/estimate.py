"""What an evidence value is: :class:`EvidenceEstimate`, honest pooling of independent runs, and
the :class:`EvidenceWarning` raised when an estimate should not be trusted.

A leaf module: estimators (``bam_ppl.infer``) and the public API (:mod:`bam_ppl.evidence`) both
import it, and it imports neither.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

KINDS = ("exact", "estimate", "lower_bound")
# Runs whose log estimates spread by more than this many nats (standard deviation) are in the
# regime where the pooled log-mean-exp is decided by one run: a warning says so.
DISAGREEING_RUNS_SD = 2.0
# An estimate further below a sure lower bound than this many standard errors is wrong.
BELOW_BOUND_STDERRS = 3.0


ADVICE = {
    "smc": "The token-by-token Pólya-urn SMC collapses on larger data: use more particles, "
           "method='tempered' (or 'auto'), and cross-check with method='chib'.",
    "tempered": "Raise the effort (num_sweeps=3, rho=0.99, num_particles=1024) until the estimate stops "
                "rising, and cross-check with method='chib' (and method='smc' on tables with few "
                "distinct cells and many tokens per cell, where single-token moves mix slowly).",
    "chib": "The search for a high-probability allocation may have stopped in a poorer mode: raise "
            "num_warmup or num_searches, and cross-check with method='tempered'.",
    "default": "Use more particles, runs or sweeps, target_stderr= to add runs, and cross-check with an "
               "estimator of another kind (method='tempered', 'chib').",
    # Several calls pooled (min_calls, target_stderr) whose values differ: they found different basins.
    "calls": "The calls found different basins (details['call_values']): the pooled value rests on the "
             "highest, and a basin that no call reached may be higher still. More calls (min_calls=) "
             "make missing the best basin less likely; the stated error includes the calls' spread.",
}


class EvidenceWarning(UserWarning):
    """An evidence estimate that should not be trusted as it stands (runs disagree, it rests on a
    basin that one secondary start reached, or it lies below a sure lower bound); the message
    says what to do."""


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


def pool_calls(call_runs) -> tuple[float, float]:
    """Pool the runs of independent calls of an estimator (a list of each call's run values).

    The value is the log-mean-exp of all runs, as :func:`pool_runs`. The runs of one call share
    what the call found on its way (``method="auto"``: the references of one search), so they can
    agree closely in a basin that another call misses; the calls, not the runs, are then the
    independent units. The error is the larger of :func:`pool_runs`'s over all runs and the
    jackknife over calls (leave one call's runs out), which grows with the calls' disagreement.
    """
    calls = [np.asarray(runs, dtype=np.float64).reshape(-1) for runs in call_runs]
    value, stderr = pool_runs(np.concatenate(calls))
    C = len(calls)
    if C < 2:
        return value, stderr
    leave_one_out = np.array([_log_mean_exp(np.concatenate(calls[:c] + calls[c + 1:])) for c in range(C)])
    jackknife = np.sqrt((C - 1) / C * np.sum((leave_one_out - leave_one_out.mean()) ** 2))
    return value, float(max(stderr, jackknife))


def _log_mean_exp(values: np.ndarray) -> float:
    peak = values.max()
    return float(peak + np.log(np.mean(np.exp(values - peak))))


def below_bound(value, stderr, bound) -> bool:
    """Whether an estimate lies more than BELOW_BOUND_STDERRS standard errors below a sure lower
    bound (an estimate equal to its bound, one allocation dominating, is not below it)."""
    if bound is None or not np.isfinite(bound):
        return False
    slack = BELOW_BOUND_STDERRS * (stderr if np.isfinite(stderr) else 0.0) + 1e-9 * max(1.0, abs(bound))
    return bool(value < bound - slack)


def check_estimate(estimate: EvidenceEstimate, *, stacklevel: int = 3) -> EvidenceEstimate:
    """Warn (:class:`EvidenceWarning`) when an estimate's runs disagree, when it rests on a basin
    that only one start other than the samplers' best allocation reached (``method="auto"``'s
    reference stage, ``basin_starts``), or when it lies below a sure lower bound; returns the estimate unchanged."""
    if estimate.kind != "estimate":
        return estimate
    details = estimate.details
    runs = np.asarray(details.get("run_log_evidence", []), dtype=np.float64)
    bound, what = details.get("lower_bound"), "log p(X, S) of an allocation S the run visited"
    vb_bound = details.get("vb_bound")
    if vb_bound is not None and np.isfinite(vb_bound) and (bound is None or vb_bound > bound):
        bound, what = vb_bound, "the VB bound, the best ELBO of its runs"
    calls = np.asarray(details.get("call_values", []), dtype=np.float64)
    if calls.size > 1 and calls.max() - calls.min() > DISAGREEING_RUNS_SD:
        advice = ADVICE["calls"]
    else:
        advice = ADVICE.get(estimate.method, ADVICE["default"])
    if runs.size > 1 and runs.std(ddof=1) > DISAGREEING_RUNS_SD:
        warnings.warn(
            f"{estimate.method} evidence runs disagree: values {np.round(runs, 1).tolist()} "
            f"(sd {runs.std(ddof=1):.3g} nats); the pooled value {estimate.value:.6g} ± "
            f"{estimate.stderr:.3g} is decided by the best run and may be far too low. {advice}",
            EvidenceWarning, stacklevel=stacklevel)
    stage = details.get("reference_stage") or {}
    # Several calls (min_calls, target_stderr) show the spread between basins themselves.
    if "reference" in estimate.method.split("+") and stage.get("basin_starts") == 1 and details.get("num_calls", 1) == 1:
        start = stage["starts"][stage["chosen"][0]]
        if start != "sampled":  # the samplers' search missed the basin, and one other start found it
            warnings.warn(
                f"{estimate.method} evidence {estimate.value:.6g} ± {estimate.stderr:.3g} rests on one basin, "
                f"reached from one of {len(set(stage['starts']))} independent starts ({start!r}) and not from "
                "the samplers' best allocation: where the best basin is one that few starts reach, another "
                "rng_key may find a higher one, and the stated error cannot show that. Repeat with a few "
                "rng_key values and keep the highest, or leave min_calls unset (method='auto' then pools the "
                "three calls it advises) or pass min_calls=3: calls with keys of their own, pooled, whose "
                "spread the stated error then includes.",
                EvidenceWarning, stacklevel=stacklevel)
    if below_bound(estimate.value, estimate.stderr, bound):
        warnings.warn(
            f"{estimate.method} evidence {estimate.value:.6g} ± {estimate.stderr:.3g} lies "
            f"{bound - estimate.value:.4g} nats below the sure lower bound {bound:.6g} "
            f"({what}): the estimate is too low. {advice}",
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
        runs visited, since L_X = Σ_S p(X, S)), ``vb_bound`` (where computed: the VB lower bound),
        diagnostics and settings.
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
