"""``method="auto"``: the evidence estimator that suits the problem's size.

Exact where enumeration is cheap (no free nodes, or few allocation tensors), the Pólya-urn SMC
of Cemgil et al. 2019 §4.2 on small token counts where it is accurate, the tempered SMC over allocations
otherwise. The thresholds come from measurements recorded in benchmarks/README.md ("Choosing an
evidence method"); the estimate's ``method`` names the estimator that ran and
``details["selected_by"]`` says it was chosen automatically, with the reason.
"""

from __future__ import annotations

import numpy as np

from ..models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel
from .exact import log_count_allocations
from .registry import find_evidence, option_names, register_evidence
from .smc.polya_urn import prepare

# Exact enumeration of up to this many allocation tensors takes well under a second.
AUTO_MAX_TENSORS = 20_000
# The Pólya-urn SMC (default options) agrees with the tempered SMC within its error up to this
# many tokens on structured NMF data (benchmarks/README.md); from about 50 tokens on its runs
# spread by nats and fall below the tempered estimate, and at 400 tokens they are 5-100 nats low.
AUTO_SMC_MAX_TOKENS = 25
AUTO_CANDIDATES = ("exact", "smc", "tempered")


def choose_method(model, data, max_configs: int = DEFAULT_MAX_CONFIGS) -> tuple[str, str]:
    """The estimator ``method="auto"`` runs for ``data`` under ``model``, and why."""
    data, bound, layout = prepare(model, data, max_configs)
    if not layout.free:
        return "exact", "no free nodes: closed form"
    log_count = log_count_allocations(data, layout)
    if log_count <= np.log(AUTO_MAX_TENSORS):
        return "exact", f"{int(round(np.exp(log_count)))} allocation tensors: enumeration"
    if data.total <= AUTO_SMC_MAX_TOKENS:
        return "smc", f"T = {data.total} ≤ {AUTO_SMC_MAX_TOKENS} tokens: Pólya-urn SMC"
    return "tempered", f"T = {data.total} tokens, about 10^{log_count / np.log(10):.0f} allocations: tempered SMC"


@register_evidence("auto", models=(AllocationModel,))
def auto_log_evidence(model, data, *, rng_key=0, max_configs: int = DEFAULT_MAX_CONFIGS, **options):
    """Exact, Pólya-urn SMC or tempered SMC, whichever suits the size (see :func:`choose_method`).

    ``options`` go to the chosen estimator. Since the choice depends on the data, an option of
    another candidate (say ``num_particles`` where the exact value is computed) is not passed
    on; an option that no candidate takes is an error.
    """
    candidates = {name: find_evidence(name, model) for name in AUTO_CANDIDATES}
    known = set().union(*(option_names(fn) for fn in candidates.values())) | {"max_configs"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"bam.log_evidence(method='auto'): unknown option(s) {unknown}; valid options "
                        f"(of {', '.join(AUTO_CANDIDATES)}): {sorted(known)}")
    method, reason = choose_method(model, data, max_configs)
    fn = candidates[method]
    options = dict(options, max_configs=max_configs)
    options = {k: v for k, v in options.items() if k in option_names(fn)}
    est = fn(model, data, rng_key=rng_key, **options)
    return type(est)(est.value, est.stderr, est.method, est.kind,
                     {**est.details, "selected_by": "auto", "reason": reason})
