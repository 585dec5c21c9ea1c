"""``method="auto"``: the exact value where enumeration is cheap, otherwise the tempered SMC from a
mixture of references (:mod:`bam_ppl.infer.smc.mixture`).

One engine serves every table beyond enumeration, sparse or dense, a few tokens or many: a search
finds basins, one start distribution covers them all, and the importance weights decide how much
each carries, so that exp of every run is an unbiased estimate of p(X) (the mixture module's
docstring). The estimate's ``method`` is ``"auto"``, its ``pipeline`` the estimator that ran
(``"exact"`` or ``"mixture"``) and ``details["reason"]`` says why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from ..models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel
from ..validation import check_positive, renamed_options
from .exact import log_count_allocations
from .info import AutoInfo
from .prepare import prepare
from .registry import find_evidence, option_names, register_evidence

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoConfig:
    """The number of ``method="auto"`` beyond the engine's (:class:`~bam_ppl.infer.smc.mixture.EngineConfig`)."""

    #: Enumerating this many allocation tensors takes well under a second.
    exact_max_tensors: int = 20_000


#: The configuration ``method="auto"`` runs with.
CONFIG = AutoConfig()
#: The estimators auto chooses between.
AUTO_CANDIDATES = ("exact", "mixture")


def choose_method(model, data, max_configs: int = DEFAULT_MAX_CONFIGS, config: AutoConfig | None = None
                  ) -> tuple[str, str]:
    """The estimator ``method="auto"`` runs for ``data`` under ``model``, and why."""
    config = config or CONFIG
    data, _, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="evidence estimation")
    if not layout.free:
        return "exact", "no free nodes: closed form"
    log_count = log_count_allocations(data, layout)
    if log_count <= np.log(config.exact_max_tensors):
        return "exact", f"{int(round(np.exp(log_count)))} allocation tensors: enumeration"
    return "mixture", (f"T = {data.total} tokens, about 10^{log_count / np.log(10):.0f} allocations: the tempered SMC "
                       "from a mixture of references around the basins a search finds")


@register_evidence("auto", models=(AllocationModel,))
# Old names of the engine's options.
@renamed_options(num_runs="num_chains")
def auto_log_evidence(model, data, *, rng_key=0, effort: float = 1.0, max_configs: int = DEFAULT_MAX_CONFIGS,
                      **options):
    """The exact value or the tempered SMC from a mixture of references (see :func:`choose_method`).

    ``effort`` (> 0, default 1) scales the engine's work (particles, scouts, chains, VB restarts:
    :class:`~bam_ppl.infer.smc.mixture.EngineConfig`; the particles and the temperatures each grow about as effort,
    the time between effort and effort² times the default's); ``options`` go to the engine (``num_chains``,
    ``num_particles``, ``num_scouts``, ``rho``, ``reference_sweeps``, ``vb_restarts``,
    ``progress_bar``) or to enumeration (``max_tensors``), and are checked whichever runs.
    """
    check_auto_options(model, options)
    check_positive(effort, "effort")
    began = time.perf_counter()
    method, reason = choose_method(model, data, max_configs)
    logger.info("auto evidence: %s (%s)", method, reason)
    fn = find_evidence(method, model)
    mine = {k: v for k, v in options.items() if k in option_names(fn)}
    if method == "mixture":
        mine.update(effort=effort, max_configs=max_configs)
    est = fn(model, data, rng_key=rng_key, **mine)
    info = AutoInfo(reason=reason, kept_info=est.info, effort=float(effort))
    return replace(est, method="auto", pipeline=method, seconds=time.perf_counter() - began, info=info)


def check_auto_options(model, options) -> None:
    """The options given to ``method="auto"``, checked before any work whichever estimator runs: a
    TypeError naming those that neither takes, and the engine's own checks of the rest."""
    from .smc.mixture import check_options

    fns = [find_evidence(name, model) for name in AUTO_CANDIDATES]
    known = set().union(*(option_names(fn) for fn in fns)) | {"max_configs", "effort"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"bam.log_evidence(method='auto'): unknown option(s) {unknown}; valid options "
                        f"(of {' and '.join(AUTO_CANDIDATES)}): {sorted(known)}")
    check_options({k: v for k, v in options.items() if k in option_names(fns[1]) or k == "effort"})


__all__ = ["AUTO_CANDIDATES", "CONFIG", "AutoConfig", "auto_log_evidence", "check_auto_options",
           "choose_method"]
