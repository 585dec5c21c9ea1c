"""Log marginal likelihood (evidence) of a model, and model comparison by evidence.

Every number says what it is (DESIGN §5): ``kind="exact"`` (enumeration or closed form),
``"estimate"`` (an unbiased estimator of the evidence such as SMC, reported on the log scale with
a standard error) or ``"lower_bound"`` (an ELBO). Estimators register themselves with
:func:`register_evidence`, next to the inference backends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .types import KeyLike

KINDS = ("exact", "estimate", "lower_bound")


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
        Estimator-specific extras (per-chain values, settings).
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


def log_evidence(model, data, method: str = "exact", rng_key: KeyLike = 0, **options) -> EvidenceEstimate:
    """log marginal likelihood of ``data`` under ``model``.

    Parameters
    ----------
    model : AllocationModel or another registered model
    data : array-like or CountTensor
    method : str
        "exact" (enumeration / closed form), "smc" (unbiased estimate with standard error), "vb"
        (best ELBO over restarts, a lower bound), or any registered estimator.
    rng_key : int or jax key
    **options
        Passed to the estimator (``num_particles``, ``num_chains``, ``num_restarts``, ...).
    """
    _load_backends()
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, got {type(method).__name__}")
    if method not in _EVIDENCE:
        raise ValueError(f"unknown evidence method {method!r}; registered: {sorted(_EVIDENCE)}")
    from .infer.registry import most_specific

    fn = most_specific(model, _EVIDENCE[method])
    if fn is not None:
        return fn(model, data, rng_key=rng_key, **options)
    accepted = [t.__name__ for types, _ in _EVIDENCE[method] for t in types]
    raise TypeError(f"evidence method {method!r} accepts {accepted}, not {type(model).__name__}")


def compare(models: Mapping, data, method: str | Mapping = "smc", rng_key: KeyLike = 0, **options):
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
        ``prob`` (posterior model probability under a uniform model prior) and ``rank``.
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
            m = method.get(name, "smc") if isinstance(method, Mapping) else method
            est = log_evidence(model, data, method=m, rng_key=rng_key, **options)
        rows.append(dict(model=str(name), log_evidence=est.value, stderr=est.stderr, kind=est.kind,
                         method=est.method))
    table = pd.DataFrame(rows).set_index("model")
    best = table["log_evidence"].max()
    table["delta"] = best - table["log_evidence"]
    table["log_bayes_factor"] = table["log_evidence"] - best
    w = np.exp(table["log_bayes_factor"].to_numpy())
    table["prob"] = w / w.sum()
    table["rank"] = table["log_evidence"].rank(ascending=False, method="min").astype(int)
    return table.sort_values("rank")
