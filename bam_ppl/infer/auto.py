"""``method="auto"``: the evidence estimator that suits the problem's size.

Exact where enumeration is cheap (no free nodes, or few allocation tensors), the Pólya-urn SMC
of Cemgil et al. 2019 §4.2 where it is accurate — small token counts, and small tables whose few
nonzero cells hold many tokens each — and otherwise estimators of different kinds: the
tempered SMC over allocations, the Chib-style estimator with the tempered SMC's best
allocation as a candidate for its z*, and from AUTO_REFERENCE_MIN_TOKENS tokens on the tempered
SMC from a reference around the best allocation found (:func:`tempered_then_chib`). The thresholds come from
the benchmarks in benchmarks/README.md; the estimate's ``method`` is ``"auto"``, its ``pipeline``
names the estimators whose runs make the value (``"exact"``, ``"tempered+chib"``, ``"reference"``,
…) and ``details["reason"]`` says why they were chosen.

Why several estimators. Each is a stochastic lower bound of log p(X) — exp of each is an unbiased
(the tempered SMC: nearly, with its adaptive schedule) estimate of p(X), so its log exceeds
log p(X) + b with probability at most e^(−b) — and each fails low in its own way: the tempered SMC
from the prior when its single-token moves lag behind the tempered targets (on sparse CP tensors,
for instance), Chib when its z* lies in a poorer mode than the posterior's bulk or its transition
probabilities spread over many orders of magnitude (large T), the reference-started SMC when the
posterior has modes away from its reference. The highest of k exceeds log p(X) + b with
probability at most k e^(−b), so keeping it costs at most log k of that guarantee and gains the
best estimator's accuracy. Runs of estimators that agree with the highest are pooled: a mean of
unbiased estimates, with the guarantee e^(−b).
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import replace

import jax
import numpy as np

from ..estimate import EvidenceEstimate, pool_runs
from ..models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel
from ..types import as_key
from ..validation import check_int, renamed_options
from .exact import log_count_allocations
from .gibbs.chib import NO_SYMMETRIES
from .info import AutoInfo
from .prepare import prepare
from .registry import find_evidence, option_names, register_evidence
from .smc.references import (
    REFERENCE_MIN_SWEEPS,
    allocation_near_counts,
    references_from_allocations,
)

logger = logging.getLogger(__name__)

# Exact enumeration of up to this many allocation tensors takes well under a second.
AUTO_MAX_TENSORS = 20_000
# Beyond a few dozen tokens the Pólya-urn SMC's runs spread and fall below the tempered estimate.
AUTO_SMC_MAX_TOKENS = 25
# Few nonzero cells holding many tokens each (HairEyeColor): the tempered SMC's moves do not carry
# the particles between groupings of whole cells, the Pólya-urn SMC stays accurate
# (benchmarks/README.md, "Which estimator on small tables with many tokens per cell").
AUTO_SMC_MIN_TOKENS_PER_CELL = 10.0
AUTO_SMC_MAX_CELLS = 64
# Particles of the Pólya-urn SMC on such tables unless given: more particles narrow its runs' spread.
AUTO_DENSE_SMC_PARTICLES = 10_000
AUTO_CANDIDATES = ("exact", "smc", "tempered")
# The tempered SMC's particles in tempered_then_chib, unless given, from the length of its
# adaptive schedule in a cheap pilot run (AUTO_PILOT_PARTICLES particles, one run). A short
# schedule is the regime where its single-token moves carry the particles and its best
# allocations are Chib's best candidates for z* (AUTO_TEMPERED_PARTICLES). A long one (CP on
# sparse three-way tensors, Abalone) is where it lands far low and Chib's own search finds better
# z*; there it is only the cross-check, run with AUTO_LONG_SCHEDULE_PARTICLES.
AUTO_PILOT_PARTICLES = 16
AUTO_SHORT_SCHEDULE = 40
AUTO_TEMPERED_PARTICLES = 256
# From AUTO_REFERENCE_CARRIES_TOKENS tokens on the reference part carries the estimate, so the
# prior-started SMC, until then a call's largest cost, runs with AUTO_CARRIED_PARTICLES.
AUTO_REFERENCE_CARRIES_TOKENS = 3000
AUTO_CARRIED_PARTICLES = 64
AUTO_LONG_SCHEDULE_PARTICLES = 16
# tempered_then_chib pools the runs of both estimators when they agree within this many combined
# standard errors (the rule by which bam.compare calls two rows indistinguishable) and the pooled
# error is the smaller, and keeps the higher one otherwise.
AGREE_STDERRS = 2.0
# From this many tokens on, a third estimate: the tempered SMC from a reference built by long
# posterior chains from the best allocation the first two found (run_tempered's ``reference``),
# whose path from a product distribution near the posterior stays short as T grows; on tiny data
# it misses minor modes the prior-started SMC finds, so it starts here.
AUTO_REFERENCE_MIN_TOKENS = 1000
# From this many tokens on only the reference part runs, from the best allocation of a pilot of
# the prior-started SMC: the other two parts fall behind it at that size and cost more.
AUTO_SAMPLERS_MAX_TOKENS = 8000
# References built (one chain each from the start allocations), each tried by a pilot run; the
# main runs start from those whose pilots lie within AUTO_REFERENCE_PILOT_MARGIN of the best
# pilot, in turn. Chains settle in modes of different mass, so references differ, and the runs
# replicate the choice among those the pilots cannot tell apart.
AUTO_REFERENCE_CANDIDATES = 8
AUTO_REFERENCE_PILOT_MARGIN = 10.0
AUTO_REFERENCE_PILOT = dict(num_particles=16, num_chains=1, rho=0.9, num_sweeps=1)
AUTO_REFERENCE_OPTIONS = dict(num_particles=64, num_chains=4, rho=0.97, num_sweeps=1)
# Further references from poor starts: the best allocations of AUTO_SCOUTS cheap runs of the
# tempered SMC from the prior (scouts), one chain from each (:func:`scout_sweeps` long), tried by
# pilots beside the others. The basin that carries the posterior mass need not hold the highest
# peak, and chains stay in the basin they start in.
AUTO_SCOUTS = dict(num_particles=16, num_chains=8, rho=0.9, num_sweeps=1)
# Another batch of scouts (up to AUTO_SCOUT_BATCHES in all) while the best pilot is a scout's and
# fewer than AUTO_SCOUT_CLOSE candidates pilot within AUTO_REFERENCE_PILOT_MARGIN of it: where the
# best basin is one that few starts reach, one batch of eight often has no start in it.
AUTO_SCOUT_BATCHES = 3
AUTO_SCOUT_CLOSE = 4
# The VB fit whose bound is the yardstick (details["vb_bound"]) is also a search for starts: from
# AUTO_REFERENCE_MIN_TOKENS tokens on it has AUTO_VB_RESTARTS restarts, and its best fit, rounded
# to an allocation, always starts AUTO_VB_REFERENCES references (half of the candidates where its
# bound lies above the samplers' best allocation): the fit in the basin that carries the mass can
# be a rare optimum. The restarts are screened (vb's screen_iters), so that many cost little.
AUTO_VB_RESTARTS = 100
AUTO_VB_SCREEN = dict(screen_iters=200, screen_keep=10)
AUTO_VB_REFERENCES = 2
# The VB bound (details["vb_bound"]) is the best of those restarts and of VB runs from every part's
# best allocation (vb's ``start``), which climb to their basin's optimum: a bound that bites.

# A search whose best basin at most AUTO_FRAGILE_STARTS independent starts reached (``basin_starts``),
# or whose scout batches ran out while their rule still asked for more, may end in another basin under
# another key, which the runs of one call cannot show: bam.log_evidence then pools AUTO_FRAGILE_CALLS
# calls with keys of their own (details["advised_calls"], bam_ppl.estimate.pool_calls). Not from
# AUTO_SAMPLERS_MAX_TOKENS tokens on, where the samplers' start is reliable and calls are long.
AUTO_FRAGILE_STARTS = 2
AUTO_FRAGILE_CALLS = 3
AUTO_SCOUT_SWEEPS_PER_TOKEN = 6.4
AUTO_SCOUT_TOKEN_MOVES = 25_600_000  # at most, per chain, so that scout chains stay cheap at large T

def choose_method(model, data, max_configs: int = DEFAULT_MAX_CONFIGS) -> tuple[str, str]:
    """The estimator ``method="auto"`` runs for ``data`` under ``model``, and why."""
    data, _, layout, _ = prepare(model, data, max_configs=max_configs, algorithm="evidence estimation")
    if not layout.free:
        return "exact", "no free nodes: closed form"
    log_count = log_count_allocations(data, layout)
    if log_count <= np.log(AUTO_MAX_TENSORS):
        return "exact", f"{int(round(np.exp(log_count)))} allocation tensors: enumeration"
    if data.total <= AUTO_SMC_MAX_TOKENS:
        return "smc", f"T = {data.total} ≤ {AUTO_SMC_MAX_TOKENS} tokens: Pólya-urn SMC"
    per_cell = data.total / data.nnz
    if data.nnz <= AUTO_SMC_MAX_CELLS and per_cell >= AUTO_SMC_MIN_TOKENS_PER_CELL:
        return "smc", (f"{data.nnz} nonzero cells ≤ {AUTO_SMC_MAX_CELLS} with {per_cell:.1f} ≥ "
                       f"{AUTO_SMC_MIN_TOKENS_PER_CELL:g} tokens each: Pólya-urn SMC")
    size = f"T = {data.total} tokens, about 10^{log_count / np.log(10):.0f} allocations: "
    if data.total >= AUTO_SAMPLERS_MAX_TOKENS:
        return "tempered", size + "the tempered SMC from the best of several references built by posterior chains"
    reference = ", the tempered SMC from a reference" if data.total >= AUTO_REFERENCE_MIN_TOKENS else ""
    return "tempered", (size + f"tempered SMC, Chib from its best allocation{reference}; the highest kept, or "
                        "those that agree pooled")


@register_evidence("auto", models=(AllocationModel,))
# The old names of the options it hands to the estimators it runs (tempered, chib, smc, vb).
@renamed_options(num_runs="num_chains", num_restarts="num_chains", kernel="engine", num_warmup="num_search_sweeps",
                 num_steps="num_samples")
def auto_log_evidence(model, data, *, rng_key=0, max_configs: int = DEFAULT_MAX_CONFIGS, **options):
    """Exact, Pólya-urn SMC or tempered SMC, whichever suits the size (see :func:`choose_method`).

    ``options`` go to the chosen estimator. Since the choice depends on the data, an option of
    another candidate (say ``num_particles`` where the exact value is computed) is not passed
    on; an option that no candidate takes is an error. On small tables with many tokens per cell
    the Pólya-urn SMC runs with AUTO_DENSE_SMC_PARTICLES particles unless ``num_particles`` is given.
    """
    check_auto_options(model, options)
    candidates = {name: find_evidence(name, model) for name in AUTO_CANDIDATES}
    began = time.perf_counter()
    method, reason = choose_method(model, data, max_configs)
    fn = candidates[method]
    dense_table = method == "smc" and model.as_data(data).total > AUTO_SMC_MAX_TOKENS
    if dense_table and "num_particles" not in options:
        options = dict(options, num_particles=AUTO_DENSE_SMC_PARTICLES)
        reason += f", {AUTO_DENSE_SMC_PARTICLES} particles"
    options = dict(options, max_configs=max_configs)
    logger.info("auto evidence: %s (%s)", method, reason)
    if method == "tempered":
        est = tempered_then_chib(model, data, rng_key, options)
    else:
        est = fn(model, data, rng_key=rng_key, **{k: v for k, v in options.items() if k in option_names(fn)})
    calls, why = advised_calls(est, model.as_data(data).total)
    if calls > 1:
        reason += f"; {why}: {calls} calls advised"
    if isinstance(est.info, AutoInfo):  # the tempered pipeline's parts
        info = est.info._replace(reason=reason, advised_calls=calls)
    else:
        info = AutoInfo(reason=reason, advised_calls=calls, kept_info=est.info)
    return replace(est, method="auto", pipeline=est.pipeline, seconds=time.perf_counter() - began, info=info)


#: Count options of the candidate estimators and the least value any of them accepts.
COUNT_OPTIONS = {"num_particles": 1, "num_chains": 1, "num_samples": 1, "num_sweeps": 1, "num_search_sweeps": 0}


def check_auto_options(model, options) -> None:
    """TypeError naming the options that no estimator ``method="auto"`` may choose takes."""
    # Chib runs after the tempered SMC (tempered_then_chib), which chooses its start allocations.
    fns = [find_evidence(name, model) for name in (*AUTO_CANDIDATES, "chib")]
    known = (set().union(*(option_names(fn) for fn in fns)) | {"max_configs"}) - {"start"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"bam.log_evidence(method='auto'): unknown option(s) {unknown}; valid options "
                        f"(of {', '.join(AUTO_CANDIDATES)} and chib): {sorted(known)}")
    # The stage auto chooses may not use an option (exact enumeration takes no num_particles),
    # so counts are checked here, before any work, by the weakest rule of the estimators.
    for name, minimum in COUNT_OPTIONS.items():
        if name in options:
            check_int(options[name], name, minimum=minimum)


def advised_calls(est: EvidenceEstimate, num_tokens: int) -> tuple[int, str | None]:
    """How many independent calls ``est``'s search asks for (AUTO_FRAGILE_CALLS where at most
    AUTO_FRAGILE_STARTS independent starts reached the basin of the reported reference runs, else
    one), and why. :func:`bam_ppl.log_evidence` makes them unless ``min_calls`` is given."""
    stage = (est.info.reference_stage if isinstance(est.info, AutoInfo) else None) or {}
    if not stage or num_tokens >= AUTO_SAMPLERS_MAX_TOKENS or "reference" not in est.pipeline.split("+"):
        return 1, None
    reached, starts = stage["basin_starts"], len(set(stage["starts"]))
    if reached <= AUTO_FRAGILE_STARTS:
        why = f"{reached} of {starts} independent starts reached the best basin"
    elif more_scouts(stage["starts"], stage["pilots"]):  # the batches ran out while the rule asked for more
        why = (f"the scouts' {AUTO_SCOUT_BATCHES} batches ended with a scout's basin best and {reached} of {starts} "
               "independent starts in it")
    else:
        return 1, None
    return AUTO_FRAGILE_CALLS, why + ", so another key may end in another"


def tempered_then_chib(model, data, rng_key, options) -> EvidenceEstimate:
    """The tempered SMC and Chib from its best allocations (:func:`_samplers_stage`), then from
    AUTO_REFERENCE_MIN_TOKENS tokens on the tempered SMC from references (:func:`reference_stage`);
    the highest estimate is reported, or the runs of those within AGREE_STDERRS combined standard
    errors of it pooled where that lowers the error (why several: the module docstring). From
    AUTO_SAMPLERS_MAX_TOKENS tokens on only the reference part runs.

    ``options`` go to the estimator that takes them (``max_configs`` to all, ``engine`` to the
    tempered SMC only: Chib runs on the numba CPU kernel); the tempered SMC's particles follow a
    pilot run (:func:`tempered_stage_options`) unless ``num_particles`` is given. The estimate's
    ``method`` is ``"auto"``, its ``pipeline`` names the parts kept or pooled, ``lower_bound`` is
    the largest of the parts' and the pilot's sure lower bounds, and ``info`` an
    :class:`~bam_ppl.infer.info.AutoInfo` (the parts, the VB bound, the stages, the part kept).
    """
    tempered_fn, chib_fn = find_evidence("tempered", model), find_evidence("chib", model)
    key = as_key(rng_key)
    tempered_key, chib_key = jax.random.split(key)
    pilot_key, vb_key, reference_key = (jax.random.fold_in(key, i) for i in (1, 2, 3))
    mine = lambda fn: {k: v for k, v in options.items() if k in option_names(fn)}  # noqa: E731
    tokens = model.as_data(data).total
    logger.info("auto evidence: pilot run of the tempered SMC (%d particles)", AUTO_PILOT_PARTICLES)
    tempered_options, stage, pilot = tempered_stage_options(model, data, pilot_key, mine(tempered_fn))
    parts, chib_warnings = {}, []
    if tokens < AUTO_SAMPLERS_MAX_TOKENS:
        chib_options = {k: v for k, v in mine(chib_fn).items() if k != "engine"}  # Chib runs on the CPU (numba)
        parts, chib_warnings = _samplers_stage(model, data, (tempered_key, chib_key), stage, tempered_options,
                                               chib_options)
    # A further, deterministic yardstick at little cost: an estimate below the VB bound is wrong, and
    # EvidenceWarning says so. VB runs from the best allocation of every part too (see AUTO_VB_REFERENCES).
    vb_fn = find_evidence("vb", model)
    found_allocations = lambda: [(est.details["best_cells"], est.details["best_counts"]) for est in [*parts.values(), pilot]]  # noqa: E731
    references = {}
    best_visited = lambda: max([*parts.values(), pilot], key=lambda est: est.details["lower_bound"])  # noqa: E731
    if tokens >= AUTO_REFERENCE_MIN_TOKENS:
        # Random restarts alone first: their best fit starts references of its own (AUTO_VB_RESTARTS).
        logger.info("auto evidence: VB, %d restarts (the yardstick and a search for starts)", AUTO_VB_RESTARTS)
        vb = vb_fn(model, data, rng_key=vb_key, num_chains=AUTO_VB_RESTARTS, **AUTO_VB_SCREEN)
        parts["reference"], references = reference_stage(model, data, reference_key, best_visited(), vb,
                                                         tempered_options)
        from_found = vb_fn(model, data, rng_key=vb_key, num_chains=1, start=found_allocations())
        vb_bound = max(vb.value, from_found.value)
    else:
        vb_bound = vb_fn(model, data, rng_key=vb_key, start=found_allocations()).value
    best = best_visited()
    found = {"lower_bound": best.details["lower_bound"], "best_cells": best.details["best_cells"],
             "best_counts": best.details["best_counts"]}
    info = AutoInfo(reason="", advised_calls=1, parts={name: summary(est) for name, est in parts.items()},
                    vb_bound=vb_bound, tempered_stage=stage, reference_stage=references)
    est = combine(parts, found, info)
    logger.info("auto evidence: %.2f ± %.2f from %s", est.value, est.stderr, est.pipeline)
    for caught in chib_warnings:
        # Chib's "averages over none of the symmetries" says nothing about an estimate it is no part
        # of: the reference-started SMC kept alone sums over them.
        if "chib" in est.pipeline.split("+") or NO_SYMMETRIES not in str(caught.message):
            warnings.warn(caught.message, caught.category, stacklevel=3)
    return est


def _samplers_stage(model, data, keys, stage, tempered_options, chib_options):
    """The tempered SMC, then Chib with tempered run r's best allocation as a candidate for the z*
    of Chib run r (so that the Chib runs stay independent and their spread honest); returns the
    two estimates by name and Chib's warnings (:func:`tempered_then_chib` passes on those that
    concern its result)."""
    tempered_key, chib_key = keys
    logger.info("auto evidence: tempered SMC, %d particles (the pilot's schedule: %d temperatures)",
                stage["num_particles"], stage["pilot_temperatures"])
    tempered = find_evidence("tempered", model)(model, data, rng_key=tempered_key, **tempered_options)
    logger.info("auto evidence: tempered SMC %.2f ± %.2f", tempered.value, tempered.stderr)
    start = list(zip(tempered.details["run_best_cells"], tempered.details["run_best_counts"]))
    logger.info("auto evidence: Chib-style estimate from the tempered SMC's best allocations")
    with warnings.catch_warnings(record=True) as chib_warnings:
        warnings.simplefilter("always")
        chib = find_evidence("chib", model)(model, data, rng_key=chib_key, **chib_options, start=start)
    logger.info("auto evidence: Chib %.2f ± %.2f", chib.value, chib.stderr)
    return {"tempered": tempered, "chib": chib}, list(chib_warnings)


def reference_stage(model, data, key, found, vb, tempered_options):
    """The tempered SMC from a reference (:func:`bam_ppl.infer.smc.tempered.run_tempered`) built
    by posterior chains from good and from poor allocations, and what was tried on the way.

    The start allocations: the one of ``found`` (the estimate whose sure lower bound is highest);
    the VB fit's expected counts rounded (AUTO_VB_REFERENCES references; half of
    AUTO_REFERENCE_CANDIDATES when the VB bound lies above the log π(S) of ``found``: the samplers
    never reached VB's region); and the best allocations of AUTO_SCOUTS cheap runs of the tempered
    SMC from the prior, whose chains find basins the good starts' chains do not reach.
    References are built from the good starts and one from each scout by independent chains
    (:func:`bam_ppl.infer.smc.references.references_from_allocations`), each tried by a pilot run
    (AUTO_REFERENCE_PILOT); while the best pilot is a scout's and fewer than AUTO_SCOUT_CLOSE pilots
    lie near it, another batch of scouts is sent (:func:`more_scouts`). The main estimate
    (AUTO_REFERENCE_OPTIONS) runs from the candidates whose pilots lie within
    AUTO_REFERENCE_PILOT_MARGIN nats of the best, in turn (:func:`runs_from_pilots`), so that the
    runs' spread, the stated error, includes how the choice varies. The pilots and scouts have keys
    of their own, so the main runs stay unbiased.
    """
    tempered_fn = find_evidence("tempered", model)
    shared = {k: v for k, v in tempered_options.items() if k in ("engine", "max_configs")}
    max_configs = shared.get("max_configs", DEFAULT_MAX_CONFIGS)
    starts = {"sampled": (found.details["best_cells"], found.details["best_counts"]),
              "vb": allocation_near_counts(model, data, vb.details["expected_counts"], max_configs)}
    build_key, pilot_key = jax.random.split(jax.random.fold_in(key, 1))
    if vb.value > found.details["lower_bound"]:  # the samplers never reached VB's region
        per_start = dict(sampled=AUTO_REFERENCE_CANDIDATES // 2, vb=AUTO_REFERENCE_CANDIDATES // 2)
    else:
        per_start = dict(sampled=AUTO_REFERENCE_CANDIDATES, vb=AUTO_VB_REFERENCES)
    names = [name for name in starts for _ in range(per_start[name])]
    candidates = list(zip(names, references_from_allocations(model, data, [starts[name] for name in names], build_key,
                                                             max_configs=max_configs)))
    pilots, scout_estimates = [], []
    scout_keys = jax.random.split(jax.random.fold_in(key, 2))
    with warnings.catch_warnings():  # the scouts' and pilots' own warnings say nothing about the estimate
        warnings.simplefilter("ignore")
        for batch in range(AUTO_SCOUT_BATCHES):
            logger.info("auto evidence: reference stage, scouts batch %d of at most %d", batch + 1, AUTO_SCOUT_BATCHES)
            # Batch 0 from the stage's own keys, the others from keys folded from them.
            scout_key, scout_build_key = (jax.random.fold_in(k, batch) if batch else k for k in scout_keys)
            scouts = tempered_fn(model, data, rng_key=scout_key, **AUTO_SCOUTS, **shared, progress_bar=False)
            scout_bests = list(zip(scouts.details["run_best_cells"], scouts.details["run_best_counts"]))
            first = len(scout_estimates)
            scout_estimates += list(scouts.details["run_log_evidence"])
            candidates += [(f"scout {first + i}", ref) for i, ref in enumerate(references_from_allocations(
                model, data, scout_bests, scout_build_key, scout_sweeps(model.as_data(data).total), max_configs))]
            pilots += [tempered_fn(model, data, rng_key=jax.random.fold_in(pilot_key, i), reference=ref,
                                   **AUTO_REFERENCE_PILOT, **shared).value
                       for i, (_, ref) in enumerate(candidates) if i >= len(pilots)]
            if not more_scouts([name for name, _ in candidates], pilots):
                break
    names = [name for name, _ in candidates]
    chosen = runs_from_pilots(pilots, AUTO_REFERENCE_OPTIONS["num_chains"])
    logger.info("auto evidence: tempered SMC from %d of %d references (their pilots within %g nats of the best)",
                len(set(chosen)), len(candidates), AUTO_REFERENCE_PILOT_MARGIN)
    estimate = tempered_fn(model, data, rng_key=key, reference=[candidates[i][1] for i in chosen],
                           **AUTO_REFERENCE_OPTIONS, **shared)
    return estimate, dict(start_lower_bound=found.details["lower_bound"], vb_restarts=vb.value,
                          starts=names, pilots=pilots, chosen=chosen, basin_starts=basin_starts(names, pilots),
                          reference_sweeps=[candidates[i][1].num_sweeps for i in chosen],
                          scout_estimates=scout_estimates)


def scout_sweeps(num_tokens: int) -> int:
    """Length of a scout's chain: AUTO_SCOUT_SWEEPS_PER_TOKEN × T sweeps (the chain must carry its
    T tokens out of a poor basin), at most AUTO_SCOUT_TOKEN_MOVES token moves (a cost that does not
    grow with T), at least REFERENCE_MIN_SWEEPS."""
    per_token = int(round(AUTO_SCOUT_SWEEPS_PER_TOKEN * num_tokens))
    return max(REFERENCE_MIN_SWEEPS, min(per_token, AUTO_SCOUT_TOKEN_MOVES // num_tokens))


def more_scouts(starts, pilots) -> bool:
    """Whether to send another batch of scouts: the best pilot is a scout's, and fewer than
    AUTO_SCOUT_CLOSE pilots lie near it (see AUTO_SCOUT_BATCHES)."""
    return starts[int(np.argmax(pilots))].startswith("scout") and close_to_best(pilots) < AUTO_SCOUT_CLOSE


def near_best(pilots) -> np.ndarray:
    """Which pilots lie within AUTO_REFERENCE_PILOT_MARGIN of the best (a boolean mask)."""
    pilots = np.asarray(pilots, np.float64)
    return pilots >= pilots.max() - AUTO_REFERENCE_PILOT_MARGIN


def close_to_best(pilots) -> int:
    """How many pilots lie within AUTO_REFERENCE_PILOT_MARGIN of the best."""
    return int(np.sum(near_best(pilots)))


def basin_starts(starts, pilots) -> int:
    """How many independent starts (``"sampled"``, ``"vb"``, each scout) have a reference piloting
    within AUTO_REFERENCE_PILOT_MARGIN of the best: one other than the samplers' (``"sampled"``)
    means their search missed the best basin and one other start found it, so another key may find
    a better one (EvidenceWarning)."""
    return len({start for start, near in zip(starts, near_best(pilots)) if near})


def runs_from_pilots(pilots, num_runs: int) -> list[int]:
    """The candidate of each of ``num_runs`` runs: those whose pilot value lies within
    AUTO_REFERENCE_PILOT_MARGIN of the best, best first, taken in turn."""
    pilots = np.asarray(pilots, np.float64)
    order = np.argsort(-pilots, kind="stable")
    close = order[near_best(pilots)[order]]
    return [int(close[r % close.size]) for r in range(num_runs)]


def summary(est: EvidenceEstimate) -> dict:
    """One part of :func:`tempered_then_chib`: value, stderr, lower bound, runs and own details."""
    return dict(method=est.method, value=est.value, stderr=est.stderr, lower_bound=est.details["lower_bound"],
                run_log_evidence=list(est.details["run_log_evidence"]), details=est.details)


def combine(parts: dict, found: dict, info: AutoInfo) -> EvidenceEstimate:
    """The highest of the ``parts``' estimates, or the runs of every part that agrees with it
    pooled (:func:`agree`) where that lowers the standard error, as ``method="auto"`` with the
    parts in its ``pipeline``; ``found`` (the sure lower bound and its allocation) joins the
    details, and ``info`` the kept part's name, info and ``cross_check`` (the highest of the
    others) when one part is kept."""
    ranked = sorted(parts, key=lambda name: parts[name].value, reverse=True)
    best = parts[ranked[0]]
    # Pooled only where it helps: a much noisier estimate "agrees" with anything, and pooling with
    # it would only widen the error.
    group = [name for name in ranked if agree(parts[name], best)]
    lower_bound = found.get("lower_bound", max(part.lower_bound for part in parts.values()))
    if len(group) > 1:
        runs = [run for name in group for run in parts[name].details["run_log_evidence"]]
        value, stderr = pool_runs(runs)
        if stderr < best.stderr:
            return EvidenceEstimate(value=value, stderr=stderr, method="auto", kind="estimate",
                                    pipeline="+".join(sorted(group, key=list(parts).index)), lower_bound=lower_bound,
                                    run_values=tuple(runs), details=dict(run_log_evidence=runs, **found), info=info)
    # Both named by their part: the reference-started runs call themselves "tempered".
    cross_check = None
    if len(ranked) > 1:
        other = info.parts[ranked[1]]
        cross_check = dict({k: other[k] for k in ("value", "stderr", "lower_bound")}, method=ranked[1])
    return replace(best, method="auto", pipeline=ranked[0], lower_bound=lower_bound, details={**best.details, **found},
                   info=info._replace(kept_info=best.info, kept=ranked[0], cross_check=cross_check))


def agree(a: EvidenceEstimate, b: EvidenceEstimate) -> bool:
    """Whether two estimates lie within AGREE_STDERRS combined standard errors of each other."""
    return bool(abs(a.value - b.value) <= AGREE_STDERRS * np.hypot(a.stderr, b.stderr))


def tempered_stage_options(model, data, pilot_key, options) -> tuple[dict, dict, EvidenceEstimate]:
    """A pilot run of the tempered SMC (AUTO_PILOT_PARTICLES particles, one run) and its options in
    :func:`tempered_then_chib`: ``num_particles``, unless given, from the pilot's number of
    temperatures (see AUTO_SHORT_SCHEDULE) and the number of tokens (AUTO_REFERENCE_CARRIES_TOKENS).
    Returns the options, what was decided (for the estimate's details) and the pilot, whose best
    allocation can start the reference part."""
    pilot_options = dict(options, num_particles=AUTO_PILOT_PARTICLES, num_chains=1, progress_bar=False)
    with warnings.catch_warnings():  # the pilot's own warnings say nothing about the estimate
        warnings.simplefilter("ignore")
        pilot = find_evidence("tempered", model)(model, data, rng_key=pilot_key, **pilot_options)
    temperatures = int(pilot.details["num_temperatures"][0])
    if "num_particles" in options:
        particles = options["num_particles"]
    else:
        particles = AUTO_TEMPERED_PARTICLES if temperatures <= AUTO_SHORT_SCHEDULE else AUTO_LONG_SCHEDULE_PARTICLES
        if model.as_data(data).total >= AUTO_REFERENCE_CARRIES_TOKENS:
            particles = min(particles, AUTO_CARRIED_PARTICLES)
    return dict(options, num_particles=particles), dict(num_particles=particles, pilot_temperatures=temperatures), pilot
