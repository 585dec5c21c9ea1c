"""What an evidence value is: :class:`EvidenceEstimate`, honest pooling of independent runs, and
the :class:`EvidenceWarning` raised when an estimate should not be trusted.

A leaf module: estimators (``bam_ppl.infer``) and the public API (:mod:`bam_ppl.evidence`) both
import it, and it imports neither.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.special import logsumexp, softmax

KINDS = ("exact", "estimate", "lower_bound", "upper_bound")
# Runs whose log estimates spread by more than this many nats (standard deviation) are in the
# regime where the pooled log-mean-exp is decided by one run: a warning says so.
DISAGREEING_RUNS_SD = 2.0
# An estimate further below a sure lower bound than this many standard errors is wrong.
BELOW_BOUND_STDERRS = 3.0


ADVICE = {
    "smc": "The token-by-token Pólya-urn SMC collapses on larger data, and a very small concentration makes "
           "the allocations that hold the mass too rare for it to find: use method='auto' (or more particles), "
           "and cross-check with method='chib'.",
    "tempered": "Raise the effort (num_sweeps=3, rho=0.99, num_particles=1024) until the estimate stops "
                "rising, and cross-check with method='chib' (and method='smc' on tables with few "
                "distinct cells and many tokens per cell, where single-token moves mix slowly).",
    "mixture": "Its runs found basins of different mass: raise effort= (more scouts, particles and longer "
               "chains) until the estimate stops rising, and cross-check with method='chib'.",
    "chib": "The search for a high-probability allocation may have stopped in a poorer mode (raise "
            "num_search_sweeps or num_searches), or, on cells of many tokens each, the chains around one labelling "
            "see a vanishing share of an allocation's many labellings: cross-check with method='auto'.",
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
    jackknife alone is the error of the value reported while the runs agree, but where their logs
    spread over many nats the log-mean-exp behaves like their maximum, whose error the jackknife
    states at half its size; the spread of the logs covers it, and overstates the error where one run
    alone missed the mass (``benchmarks/pooled_error.py``). The delta-method error
    sd(exp values) / (sqrt(R) · mean) cannot exceed about 1 nat however far the runs disagree. nan
    for a single run.
    """
    values = np.asarray(run_log_evidence, dtype=np.float64).reshape(-1)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError(f"run_log_evidence must be finite numbers, got {values.tolist()}")
    value = _log_mean_exp(values)
    if values.size < 2:
        return value, float("nan")
    return value, max(pooled_error_terms(values))


def pool_searches(run_log_evidence, final_log_weights, search_log_shares) -> tuple[float, float]:
    """Pool R runs whose estimates share their searches: log-mean-exp and the bootstrap error over the searches.

    Run r anneals from its own search's start and reweights by the start of all R searches, q̄ = (1/R) Σ_s q_s
    (the balance heuristic), so the runs' mean is unbiased but the runs are not alike: a basin that one search
    found counts in full in the call. ``final_log_weights`` (R arrays (P_r,)) holds each run's normalised last
    weights and ``search_log_shares`` (R arrays (R, P_r)) log (q_s / R q̄) at each of its particles. A call whose
    searches were drawn again, search s m_s times (Σ m_s = R), would have reweighted run r's particles by
    Σ_s m_s q_s / R, weighting run r m_r times: the error is the sd of that call's value over the multinomial
    resamples m (the nonparametric bootstrap with the searches as units; Efron & Tibshirani 1993, ch. 6), scaled
    by √(R / (R − 1)) so that runs alike get the error of their mean. Where the value rests on a basin that few
    searches found, the resamples without them fall by its gap; where most found it, few do. nan for one run.
    """
    values = np.asarray(run_log_evidence, dtype=np.float64).reshape(-1)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError(f"run_log_evidence must be finite numbers, got {values.tolist()}")
    R = values.size
    if R < 2:
        return _log_mean_exp(values), float("nan")
    if len(final_log_weights) != R or len(search_log_shares) != R:
        raise ValueError(f"final_log_weights and search_log_shares need one entry per run ({R})")
    for log_w, shares in zip(final_log_weights, search_log_shares):
        if np.shape(shares) != (R, np.size(log_w)):
            raise ValueError(f"search_log_shares: each run's must be (R, P) = ({R}, {np.size(log_w)}), got "
                             f"{np.shape(shares)}")
    counts, prob = search_resamples(R)
    with np.errstate(divide="ignore"):
        log_counts = np.log(counts)  # (M, R)
    resampled = np.full(counts.shape, -np.inf)
    for r in range(R):
        log_w, shares = np.asarray(final_log_weights[r], np.float64), np.asarray(search_log_shares[r], np.float64)
        kept = np.flatnonzero(counts[:, r] > 0)
        for rows in np.array_split(kept, max(1, -(-kept.size * shares.size // CHUNK_ELEMENTS))):  # (rows, R, P_r) at a time
            denominator = logsumexp(shares[None] + log_counts[rows][:, :, None], axis=1)
            resampled[rows, r] = log_counts[rows, r] + values[r] + logsumexp(log_w[None] - denominator, axis=1)
    theta = logsumexp(resampled, axis=1) - np.log(R)
    mean = np.sum(prob * theta)
    return _log_mean_exp(values), float(np.sqrt(np.sum(prob * (theta - mean) ** 2) * R / (R - 1)))


def single_search_share(run_log_evidence, final_log_weights, search_log_shares) -> float:
    """The share of a call's estimate that rests on basins one search alone found (runs as :func:`pool_searches`).

    Without search s, run r ≠ s reweights by q̄₋ₛ = (R q̄ − q_s) / (R − 1), so its particles by
    (R − 1) / (R (1 − share_s)), with 1 − share_s = Σ_{s' ≠ s} q_s' / (R q̄); the call keeps Ẑ₋ₛ, the mean of those
    R − 1 runs. A basin that two searches or more found stays in Ẑ₋ₛ in full; one that only s found leaves with it. So
    Σ_s (Ẑ − Ẑ₋ₛ) / Ẑ is the share of Ẑ on basins found once: the singletons of Good (1953) on the scale of mass, as
    the jackknife over the searches sees them, the runs' noise included. Near 1, every search ended in basins of its
    own, and the searches say nothing of the basins none of them reached. Measured (benchmarks/README.md): −0.8 to
    0.6 on calls whose searches find the same basins, 0.6 to 1 where each ends in basins of its own; too noisy for a
    warning. nan for one run.
    """
    values = np.asarray(run_log_evidence, dtype=np.float64).reshape(-1)
    R = values.size
    if R < 2:
        return float("nan")
    total = _log_mean_exp(values)
    lost = 0.0
    for s in range(R):
        kept = []
        for r in range(R):
            if r != s:
                log_shares = np.asarray(search_log_shares[r], np.float64)
                others = logsumexp(np.delete(log_shares, s, axis=0), axis=0)  # log (1 − share_s)
                kept.append(values[r] + logsumexp(np.asarray(final_log_weights[r], np.float64) - others)
                            + np.log((R - 1) / R))
        lost += 1.0 - np.exp(_log_mean_exp(np.array(kept)) - total)
    return float(lost)


# Enumerate every multiset of R searches up to this many of them (R ≤ 6); beyond, draw as many resamples.
MAX_RESAMPLES = 512
# Resamples × searches × particles reweighted at once: 32 MiB of float64.
CHUNK_ELEMENTS = 1 << 22


def search_resamples(num_searches: int) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap resamples of :func:`pool_searches`: multiplicities (M, R) and their probabilities (M,), every
    multiset where there are at most MAX_RESAMPLES, else as many multinomial draws from a fixed seed (the error
    is then a function of the runs alone)."""
    R = num_searches
    if math.comb(2 * R - 1, R) <= MAX_RESAMPLES:
        counts = np.array([np.bincount(c, minlength=R) for c in itertools.combinations_with_replacement(range(R), R)])
        log_prob = math.lgamma(R + 1) - np.sum([[math.lgamma(m + 1) for m in row] for row in counts], axis=1)
        return counts, np.exp(log_prob - R * np.log(R))
    draws = np.random.default_rng(0).multinomial(R, np.full(R, 1.0 / R), size=MAX_RESAMPLES)
    counts, times = np.unique(draws, axis=0, return_counts=True)
    return counts, times / times.sum()


def pooled_error_terms(values: np.ndarray) -> tuple[float, float]:
    """The two terms of :func:`pool_runs`' error for R ≥ 2 finite run values: the jackknife error of
    their log-mean-exp, and sd(values) / sqrt(R)."""
    R = values.size
    leave_one_out = np.array([_log_mean_exp(np.delete(values, r)) for r in range(R)])
    return _jackknife(leave_one_out), float(values.std(ddof=1) / np.sqrt(R))


def pool_calls(call_runs, call_stderrs=None) -> tuple[float, float]:
    """Pool the runs of independent calls of an estimator (a list of each call's run values).

    The value is the log-mean-exp of all runs, as :func:`pool_runs`. The runs of one call can share
    what the call found on its way (``method="tempered"``: the allocation its references start
    from; the default engine's runs: their searches' starts), so they can agree closely in a basin that another
    call misses, or one can fall short where the others found the basin; the calls, not the runs, are then the
    independent units. The error is the larger of the jackknife over calls (leave one call's runs out), which grows
    with the calls' disagreement, and either :func:`pool_runs`'s over all runs or, given each call's own stated
    error ``call_stderrs``, the error of the calls' mean on the natural scale by the delta method,
    √Σ_c (w_c σ_c)² with w_c a call's share of the pooled value.
    """
    calls = [np.asarray(runs, dtype=np.float64).reshape(-1) for runs in call_runs]
    value, stderr = pool_runs(np.concatenate(calls))
    if call_stderrs is not None:
        errors = np.asarray(call_stderrs, dtype=np.float64).reshape(-1)
        if errors.size != len(calls):
            raise ValueError(f"call_stderrs: one per call ({len(calls)}), got {errors.size}")
        if np.all(np.isfinite(errors)):
            shares = softmax([_log_mean_exp(runs) + np.log(runs.size) for runs in calls])  # w_c
            stderr = float(np.sqrt(np.sum((shares * errors) ** 2)))
    C = len(calls)
    if C < 2:
        return value, stderr
    leave_one_out = np.array([_log_mean_exp(np.concatenate(calls[:c] + calls[c + 1:])) for c in range(C)])
    return value, float(max(stderr, _jackknife(leave_one_out)))


def _jackknife(leave_one_out: np.ndarray) -> float:
    """The jackknife standard error from a statistic's leave-one-out values (Efron & Stein 1981)."""
    n = leave_one_out.size
    return float(np.sqrt((n - 1) / n * np.sum((leave_one_out - leave_one_out.mean()) ** 2)))


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
    """Warn (:class:`EvidenceWarning`) when an estimate's runs disagree or when it lies below a sure
    lower bound (of a visited allocation, or ``details["vb_bound"]``); returns the estimate
    with the warnings' messages added to its ``warnings``."""
    if not isinstance(estimate, EvidenceEstimate):
        raise TypeError(f"estimate must be an EvidenceEstimate, got {type(estimate).__name__}")
    if estimate.kind != "estimate":
        return estimate
    details = estimate.details
    runs = np.asarray(estimate.run_values, dtype=np.float64)
    bound, what = estimate.lower_bound, "log p(X, S) of an allocation S the run visited"
    vb_bound = details.get("vb_bound")
    if vb_bound is not None and np.isfinite(vb_bound) and not (bound >= vb_bound):
        bound, what = vb_bound, "the VB bound, the best ELBO of its runs"
    calls = np.asarray(details.get("call_values", []), dtype=np.float64)
    if calls.size > 1 and calls.max() - calls.min() > DISAGREEING_RUNS_SD:
        advice = ADVICE["calls"]
    else:
        advice = ADVICE.get(estimate.pipeline, ADVICE["default"])
    name = estimate.method if estimate.pipeline == estimate.method else f"{estimate.method} ({estimate.pipeline})"
    messages = []
    if runs.size > 1 and runs.std(ddof=1) > DISAGREEING_RUNS_SD:
        messages.append(
            f"{name} evidence runs disagree: values {np.round(runs, 1).tolist()} "
            f"(sd {runs.std(ddof=1):.3g} nats); the pooled value {estimate.value:.6g} ± "
            f"{estimate.stderr:.3g} is decided by the best run and may be far too low. {advice}")
    if below_bound(estimate.value, estimate.stderr, bound):
        messages.append(
            f"{name} evidence {estimate.value:.6g} ± {estimate.stderr:.3g} lies "
            f"{bound - estimate.value:.4g} nats below the sure lower bound {bound:.6g} "
            f"({what}): the estimate is too low. {advice}")
    for message in messages:
        warnings.warn(message, EvidenceWarning, stacklevel=stacklevel)
    return with_warnings(estimate, messages)


def with_warnings(estimate: EvidenceEstimate, messages) -> EvidenceEstimate:
    """``estimate`` with ``messages`` added to its ``warnings`` (each message once, in order)."""
    added = tuple(m for m in dict.fromkeys(str(m) for m in messages) if m not in estimate.warnings)
    return replace(estimate, warnings=estimate.warnings + added) if added else estimate


def _is_info(value) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _info_fields(info) -> dict:
    """An info's fields as ``details`` shows them: an info nested in it (``AutoInfo.kept_info``) by its own
    fields, the outer ones winning, so that ``details`` stays one flat dict of diagnostics."""
    fields = {}
    for key, value in info._asdict().items():
        if _is_info(value):
            fields = {**_info_fields(value), **fields}
        else:
            fields[key] = value
    return fields


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
        The estimator asked for, a name ``bam.log_evidence(method=...)`` accepts ("auto",
        "exact", "smc", "tempered", "chib", "vb", ...).
    kind : str
        "exact", "estimate" or "lower_bound".
    details : dict
        Diagnostics by name, as JSON types once :meth:`to_dict` writes them: the fields of
        ``info``, the allocation behind ``lower_bound`` (``best_cells``, ``best_counts``) and each
        run's value (``run_log_evidence``) where the estimator reports them. The typed fields
        below are the part every estimator shares.
    lower_bound : float
        A sure lower bound on log L_X where the estimator reports one, else nan: log p(X, S) of
        the best allocation S the runs visited (L_X = Σ_S p(X, S) ≥ p(X, S)), or for ``kind=
        "lower_bound"`` the bound itself.
    num_runs : int
        Independent runs behind ``value`` (0 for exact values).
    run_values : tuple of float
        Each run's value: each run's log estimate for ``kind="estimate"`` (``value`` is their
        log-mean-exp), each restart's ELBO for ``"vb"`` (``value`` is the best).
    seconds : float
        Wall-clock seconds the estimate took (nan when not measured).
    warnings : tuple of str
        The messages of the :class:`EvidenceWarning` raised about this estimate (empty when none).
    pipeline : str
        What ran: ``method`` itself, except for ``"auto"``, where it names the estimator that
        made ``value`` (``"exact"`` or ``"mixture"``).
    info : NamedTuple or None
        The estimator's own diagnostics, typed: :class:`~bam_ppl.infer.info.TemperedInfo` for
        ``"tempered"``, :class:`~bam_ppl.infer.info.AutoInfo` for ``"auto"`` and so on
        (:mod:`bam_ppl.infer.info`); None for an estimate made without one. Its fields are also
        in ``details`` (those of an info nested in it, as ``AutoInfo.kept_info``, one by one), and
        they win there: to change one, ``replace`` the info.
    """

    value: float
    stderr: float
    method: str
    kind: str
    details: dict = field(default_factory=dict, compare=False)
    lower_bound: float = field(default=math.nan, compare=False)
    num_runs: int | None = field(default=None, compare=False)
    run_values: tuple = field(default=None, compare=False)
    seconds: float = field(default=math.nan, compare=False)
    warnings: tuple = field(default=(), compare=False)
    pipeline: str | None = field(default=None, compare=False)
    info: tuple | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.method, str) or not self.method:
            raise TypeError(f"method must be a non-empty str, got {self.method!r}")
        if not isinstance(self.details, Mapping):
            raise TypeError(f"details must be a dict, got {type(self.details).__name__}")
        if self.info is not None:
            if not _is_info(self.info):
                raise TypeError(f"info must be an estimator's info NamedTuple, got {type(self.info).__name__}")
            # The info's own fields win: details built from the typed result, whatever ``replace`` passed.
            fields = _info_fields(self.info)
            merged = {key: value for key, value in self.details.items() if key not in fields}
            object.__setattr__(self, "details", {**merged, **fields})
        details = self.details
        # Estimators that fill only ``details`` (as before the typed fields) still give typed results.
        runs = self.run_values if self.run_values is not None else details.get("run_log_evidence", ())
        bound = self.lower_bound
        if _is_nan(bound) and details.get("lower_bound") is not None:
            bound = details["lower_bound"]
        seconds = self.seconds
        if _is_nan(seconds) and details.get("seconds") is not None:
            seconds = details["seconds"]
        typed = dict(value=_real(self.value, "value"), stderr=_real(self.stderr, "stderr"),
                     lower_bound=_real(bound, "lower_bound"), seconds=_real(seconds, "seconds"),
                     run_values=tuple(_real(run, "run_values") for run in np.asarray(runs, dtype=object).reshape(-1)),
                     pipeline=self.method if self.pipeline is None else self.pipeline)
        if isinstance(self.warnings, str):
            raise TypeError("warnings must be a sequence of messages, not one str")
        typed["warnings"] = tuple(str(message) for message in self.warnings)
        typed["num_runs"] = len(typed["run_values"]) if self.num_runs is None else self.num_runs
        if isinstance(typed["num_runs"], bool) or not isinstance(typed["num_runs"], (int, np.integer)) \
                or typed["num_runs"] < 0:
            raise TypeError(f"num_runs must be a non-negative int, got {self.num_runs!r}")
        typed["num_runs"] = int(typed["num_runs"])
        if not isinstance(typed["pipeline"], str):
            raise TypeError(f"pipeline must be a str, got {self.pipeline!r}")
        for name, value in typed.items():
            object.__setattr__(self, name, value)

    def __float__(self) -> float:
        return float(self.value)

    def __repr__(self) -> str:
        err = "" if self.kind == "exact" else f" ± {self.stderr:.4g}"
        what = "" if self.pipeline == self.method else f", pipeline={self.pipeline!r}"
        return f"EvidenceEstimate({self.value:.6g}{err}, method={self.method!r}{what}, kind={self.kind!r})"

    def to_dict(self) -> dict:
        """The estimate as JSON types (``json.dumps`` writes it as it is): the typed fields, and
        ``details`` with arrays as (nested) lists and numpy scalars as Python numbers. Non-finite
        numbers (a nan stderr, say) become None. :meth:`from_dict` reads it back."""
        out = {name: _jsonable(getattr(self, name)) for name in FIELDS}
        own = () if self.info is None else _info_fields(self.info)
        out["details"] = _jsonable({key: value for key, value in self.details.items() if key not in own})
        out["info"] = None if self.info is None else _info_json(self.info)
        return out

    @classmethod
    def from_dict(cls, data) -> EvidenceEstimate:
        """The estimate :meth:`to_dict` wrote (also after a JSON round trip): the typed fields as
        they were (None back to nan), ``details`` and ``info`` with lists where there were arrays."""
        if not isinstance(data, Mapping):
            raise TypeError(f"data must be a dict as EvidenceEstimate.to_dict() writes, got {type(data).__name__}")
        missing = [name for name in ("value", "stderr", "method", "kind") if name not in data]
        if missing:
            raise ValueError(f"data lacks {missing}: not a dict written by EvidenceEstimate.to_dict()")
        fields = {name: data[name] for name in FIELDS if name in data}
        for name in ("value", "stderr", "lower_bound", "seconds"):
            if name in fields and fields[name] is None:
                fields[name] = math.nan
        if fields.get("run_values") is not None:
            fields["run_values"] = tuple(math.nan if run is None else run for run in fields["run_values"])
        info = data.get("info")
        if info is not None:
            from .infer.info import info_from_json  # the estimators' types, loaded with bam_ppl
            info = info_from_json(info)
        return cls(**fields, details=dict(data.get("details") or {}), info=info)


# The fields :meth:`EvidenceEstimate.to_dict` writes besides ``details``, in their order.
FIELDS = ("value", "stderr", "method", "kind", "pipeline", "lower_bound", "num_runs", "run_values", "seconds",
          "warnings")


def _is_nan(x) -> bool:
    return isinstance(x, (float, np.floating)) and math.isnan(x)


def _real(x, name: str) -> float:
    """``x`` as a Python float, or a TypeError naming the field."""
    if isinstance(x, (bool, np.bool_, str, bytes)):
        raise TypeError(f"{name} must be a real number, got {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {x!r}") from None


def _info_json(info) -> dict:
    """An estimator's info (a NamedTuple) as ``{"type": its class name, "fields": {...}}`` in JSON types."""
    return {"type": type(info).__name__, "fields": {name: _jsonable(value) for name, value in info._asdict().items()}}


def _jsonable(x):
    """``x`` in JSON types: dicts with str keys, lists, str, int, float (finite) and None."""
    if _is_info(x):  # a nested info
        return _info_json(x)
    if isinstance(x, Mapping):
        return {str(key): _jsonable(value) for key, value in x.items()}
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(value) for value in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if x is None or isinstance(x, str):
        return x
    if hasattr(x, "__array__"):  # a jax array
        return _jsonable(np.asarray(x))
    return repr(x)  # an object JSON has no type for (a reference distribution, say): what it was
