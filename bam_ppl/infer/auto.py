"""``method="auto"``: the exact evidence where enumeration is cheap, else the tempered SMC from a
mixture of references (:mod:`bam_ppl.infer.smc.mixture`).

One engine serves every table beyond enumeration, sparse or dense, small or large: its search
finds basins, its importance weights decide how much each carries, and ``effort`` is its one cost
knob. The estimate's ``method`` is ``"auto"``, its ``pipeline`` the estimator that ran
(``"exact"`` or ``"mixture"``) and ``details["reason"]`` says why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel
from ..validation import check_int, check_positive, renamed_options
from .exact import log_count_allocations
from .prepare import prepare
from .registry import find_evidence, option_names, register_evidence

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoConfig:
    """The one number ``method="auto"`` decides by; the engine's own sizes come from ``effort``
    (:class:`bam_ppl.infer.smc.mixture.EngineConfig`)."""

    # Exact enumeration of up to this many allocation tensors takes well under a second.
    max_tensors: int = 20_000


AUTO = AutoConfig()
CANDIDATES = ("exact", "mixture")


class Choice(NamedTuple):
    """What ``method="auto"`` runs for a problem, and why."""

    method: str
    reason: str


def choose_method(model, data, max_configs: int = DEFAULT_MAX_CONFIGS, config: AutoConfig = AUTO) -> Choice:
    """The estimator ``method="auto"`` runs for ``data`` under ``model``, and why."""
    data, _, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="evidence estimation")
    if not layout.free:
        return Choice("exact", "no free nodes: closed form")
    log_count = log_count_allocations(data, layout)
    if log_count <= np.log(config.max_tensors):
        return Choice("exact", f"{int(round(np.exp(log_count)))} allocation tensors: enumeration")
    return Choice("mixture", f"T = {data.total} tokens, about 10^{log_count / np.log(10):.0f} allocations: the "
                             "tempered SMC from a mixture of references")


@register_evidence("auto", models=(AllocationModel,))
# The old names of the options it hands to the estimators it runs.
@renamed_options(num_runs="num_chains")
def auto_log_evidence(model, data, *, rng_key=0, max_configs: int = DEFAULT_MAX_CONFIGS, effort: float = 1.0,
                      **options):
    """Exact where enumeration is cheap, else the tempered SMC from a mixture of references
    (:func:`~bam_ppl.infer.smc.mixture.mixture_log_evidence`, see :func:`choose_method`).

    ``effort`` scales the engine's cost (particles, scouts, chain lengths: more effort never
    makes the answer worse); ``options`` go to the engine (``num_chains``, ``num_particles``, …)
    and are checked before any work; exact enumeration takes none of them.
    """
    check_auto_options(model, options)
    check_positive(effort, "effort")
    began = time.perf_counter()
    choice = choose_method(model, data, max_configs)
    logger.info("auto evidence: %s (%s)", choice.method, choice.reason)
    fn = find_evidence(choice.method, model)
    given = dict(options, max_configs=max_configs, effort=effort)
    est = fn(model, data, rng_key=rng_key, **{k: v for k, v in given.items() if k in option_names(fn)})
    return replace(est, method="auto", pipeline=choice.method, seconds=time.perf_counter() - began,
                   details={**est.details, "selected_by": "auto", "reason": choice.reason})


#: Count options of the engine and the least value each accepts.
COUNT_OPTIONS = {"num_particles": 2, "num_chains": 1, "num_scouts": 1, "reference_sweeps": 0}


def check_auto_options(model, options) -> None:
    """TypeError naming the options that no estimator ``method="auto"`` may choose takes, and the
    count options checked, before any work (exact enumeration takes none of them)."""
    known = set().union(*(option_names(find_evidence(name, model)) for name in CANDIDATES)) | {"max_configs"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"bam.log_evidence(method='auto'): unknown option(s) {unknown}; valid options "
                        f"(of {', '.join(CANDIDATES)}): {sorted(known | {'effort'})}")
    for name, minimum in COUNT_OPTIONS.items():
        if name in options:
            check_int(options[name], name, minimum=minimum)
