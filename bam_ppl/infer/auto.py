"""``method="auto"``: the evidence estimator that suits the problem's size.

Exact where enumeration is cheap (no free nodes, or few allocation tensors), the Pólya-urn SMC
of Cemgil et al. 2019 §4.2 where it is accurate — small token counts, and small tables whose few
nonzero cells hold many tokens each — and otherwise estimators of different kinds: the
tempered SMC over allocations, the Chib-style estimator with the tempered SMC's best
allocation as a candidate for its z*, and from ``reference_min_tokens`` tokens on the tempered
SMC from a reference around the best allocation found (:func:`tempered_then_chib`). Its numbers
are the fields of :class:`AutoConfig` (the measurements behind them: benchmarks/README.md); the
estimate's ``method`` is ``"auto"``, its ``pipeline`` names the estimators whose runs make the value
(``"exact"``, ``"tempered+chib"``, ``"reference"``, …) and ``details["reason"]`` says why they were chosen.

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
from dataclasses import dataclass, replace
from typing import NamedTuple

import jax
import numpy as np

from ..estimate import EvidenceEstimate, pool_runs
from ..models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel
from ..types import as_key
from ..validation import check_choice, check_int, check_positive, renamed_options
from .exact import log_count_allocations
from .gibbs.chib import NO_SYMMETRIES
from .info import AutoInfo, ReferenceStage, TemperedStage
from .kernels import KERNELS
from .prepare import prepare
from .registry import find_evidence, option_names, register_evidence
from .smc.references import (
    REFERENCE_MIN_SWEEPS,
    allocation_near_counts,
    references_from_allocations,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoConfig:
    """The numbers of ``method="auto"``, each with the reason for it; :data:`CONFIG` is the one in use.

    Cheap runs (the tempered SMC's pilot, the scouts, the reference pilots) take ``pilot_particles``
    particles, the tempered SMC's default ``rho`` and one sweep: each samples one basin roughly.
    """

    #: Enumerating this many allocation tensors takes well under a second.
    exact_max_tensors: int = 20_000
    #: Up to this many tokens the Pólya-urn SMC's runs agree; beyond, they spread below the tempered SMC's.
    urn_max_tokens: int = 25
    #: Tables with at most this many nonzero cells ...
    urn_max_cells: int = 64
    #: ... of at least this many tokens each group tokens in whole cells, between which the tempered
    #: SMC's single-token moves do not carry its particles; the Pólya-urn SMC's draws do.
    urn_min_tokens_per_cell: float = 10.0
    #: The Pólya-urn SMC's particles there unless given (its runs' spread falls with more).
    urn_particles: int = 10_000
    #: Particles of each cheap run, and of the prior-started SMC where it is only the cross-check.
    pilot_particles: int = 16
    #: A pilot schedule of at most this many temperatures is one on which the tempered SMC's moves
    #: carry its particles, and its best allocations are Chib's best candidates for z* ...
    short_schedule: int = 40
    #: ... so it runs with this many particles; on longer ones (sparse CP) it lands low.
    tempered_particles: int = 256
    #: Particles of each run from a reference, and of the prior-started SMC once the reference part
    #: carries the estimate (``reference_carries_tokens``).
    reference_particles: int = 64
    #: Runs from references, spread over the candidates that pilot near the best, so that their
    #: spread, the stated error, includes how the choice of reference varies.
    reference_runs: int = 4
    #: Their schedule's conditional-ESS ratio (the path from a near-posterior reference is short,
    #: so finer steps cost little).
    reference_rho: float = 0.97
    #: Two estimates within this many combined standard errors agree (bam.compare's rule for
    #: indistinguishable rows) and their runs are pooled.
    agree_stderrs: float = 2.0
    #: From this many tokens the reference part runs; on tiny data it misses minor modes that the
    #: prior-started SMC finds.
    reference_min_tokens: int = 1000
    #: From this many tokens the reference part carries the estimate, and the prior-started SMC,
    #: until then a call's largest cost, runs with ``reference_particles``.
    reference_carries_tokens: int = 3000
    #: From this many tokens only the reference part runs, from the pilot's best allocation (the
    #: other parts fall behind it and cost more).
    samplers_max_tokens: int = 8000
    #: References built from the samplers' best allocation (chains settle in modes of different
    #: mass), and scouts per batch.
    reference_candidates: int = 8
    #: Pilots within this many nats of the best cannot be told apart by a cheap run.
    pilot_margin: float = 10.0
    #: Batches of scouts at most, another while a scout's candidate pilots best and fewer than
    #: ``reference_runs`` candidates pilot near it: one batch often has no start in a rare basin.
    scout_batches: int = 3
    #: VB restarts, a search for starts as well as the yardstick bound (the fit in the basin that
    #: carries the mass can be a rare optimum) ...
    vb_restarts: int = 100
    #: ... screened at this many iterations (vb's ``screen_iters``), so that many cost little.
    vb_screen_iters: int = 200
    #: References from VB's best fit rounded to an allocation (half of the candidates where its
    #: bound lies above the samplers' best allocation: they never reached its region).
    vb_references: int = 2
    #: A best basin that at most this many independent starts reached may be missed under another key ...
    fragile_starts: int = 2
    #: ... so that many independent calls are advised, pooled.
    fragile_calls: int = 3
    #: Sweeps per token of a scout's chain, which must carry its T tokens out of a poor basin ...
    scout_sweeps_per_token: float = 6.4
    #: ... and at most this many token moves, a cost that does not grow with T.
    scout_token_moves: int = 25_600_000


    def scaled(self, effort: float) -> AutoConfig:
        """This configuration at ``effort`` times the work where the work buys accuracy: the
        particles of every main run (more particles, less bias and spread: Del Moral, Doucet &
        Jasra 2006) and the breadth of the search for basins (reference candidates, scouts per
        batch, VB restarts). The thresholds, the pilots and the number of runs do not change, so
        the same stages run at every effort; ``effort=1`` is this configuration itself."""
        if effort == 1:
            return self

        def grow(size: int, least: int) -> int:
            return max(least, int(round(size * effort)))

        return replace(self, urn_particles=grow(self.urn_particles, 2), tempered_particles=grow(self.tempered_particles, 2),
                       reference_particles=grow(self.reference_particles, 2),
                       reference_candidates=grow(self.reference_candidates, 2), vb_restarts=grow(self.vb_restarts, 1))


#: The configuration ``method="auto"`` runs with (at ``effort=1``).
CONFIG = AutoConfig()
#: The estimators auto chooses among; Chib runs after the tempered SMC (:func:`tempered_then_chib`).
AUTO_CANDIDATES = ("exact", "smc", "tempered")


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
    if data.total <= config.urn_max_tokens:
        return "smc", f"T = {data.total} ≤ {config.urn_max_tokens} tokens: Pólya-urn SMC"
    per_cell = data.total / data.nnz
    if data.nnz <= config.urn_max_cells and per_cell >= config.urn_min_tokens_per_cell:
        return "smc", (f"{data.nnz} nonzero cells ≤ {config.urn_max_cells} with {per_cell:.1f} ≥ "
                       f"{config.urn_min_tokens_per_cell:g} tokens each: Pólya-urn SMC")
    size = f"T = {data.total} tokens, about 10^{log_count / np.log(10):.0f} allocations: "
    if data.total >= config.samplers_max_tokens:
        return "tempered", size + "the tempered SMC from the best of several references built by posterior chains"
    reference = ", the tempered SMC from a reference" if data.total >= config.reference_min_tokens else ""
    return "tempered", (size + f"tempered SMC, Chib from its best allocation{reference}; the highest kept, or "
                        "those that agree pooled")


@register_evidence("auto", models=(AllocationModel,))
# The old names of the options it hands to the estimators it runs (tempered, chib, smc, vb).
@renamed_options(num_runs="num_chains", num_restarts="num_chains", kernel="engine", num_warmup="num_search_sweeps",
                 num_steps="num_samples")
def auto_log_evidence(model, data, *, rng_key=0, effort: float = 1.0, max_configs: int = DEFAULT_MAX_CONFIGS,
                      **options):
    """Exact, Pólya-urn SMC or tempered SMC, whichever suits the size (see :func:`choose_method`).

    ``effort`` (> 0, default 1) scales the work that buys accuracy (:meth:`AutoConfig.scaled`):
    the particles of the samplers and the breadth of the search for basins; the same stages run
    at every effort. ``options`` go to the chosen estimator and win over ``effort`` (a given
    ``num_particles`` stays as given). Since the choice depends on the data, an option of another
    candidate (say ``num_particles`` where the exact value is computed) is not passed on; an
    option that no candidate takes is an error. On small tables with many tokens per cell the
    Pólya-urn SMC runs with ``urn_particles`` particles (:class:`AutoConfig`) unless
    ``num_particles`` is given.
    """
    check_auto_options(model, options)
    config = CONFIG.scaled(check_positive(effort, "effort"))
    began = time.perf_counter()
    method, reason = choose_method(model, data, max_configs, config)
    tokens = model.as_data(data).total
    if method == "smc" and tokens > config.urn_max_tokens and "num_particles" not in options:
        options = dict(options, num_particles=config.urn_particles)
        reason += f", {config.urn_particles} particles"
    options = dict(options, max_configs=max_configs)
    logger.info("auto evidence: %s (%s)", method, reason)
    if method == "tempered":
        est = tempered_then_chib(model, data, rng_key, options, config)
    else:
        fn = find_evidence(method, model)
        est = fn(model, data, rng_key=rng_key, **{k: v for k, v in options.items() if k in option_names(fn)})
    calls, why = advised_calls(est, tokens, config)
    if calls > 1:
        reason += f"; {why}: {calls} calls advised"
    if isinstance(est.info, AutoInfo):  # the tempered pipeline's parts
        info = est.info._replace(reason=reason, advised_calls=calls, effort=float(effort))
    else:
        info = AutoInfo(reason=reason, advised_calls=calls, kept_info=est.info, effort=float(effort))
    return replace(est, method="auto", pipeline=est.pipeline, seconds=time.perf_counter() - began, info=info)


#: Count options of the candidate estimators and the least value any of them accepts.
COUNT_OPTIONS = {"num_particles": 1, "num_chains": 1, "num_samples": 1, "num_sweeps": 1, "num_search_sweeps": 0}


def check_auto_options(model, options) -> None:
    """TypeError naming the options that no estimator ``method="auto"`` may choose takes."""
    fns = [find_evidence(name, model) for name in (*AUTO_CANDIDATES, "chib")]
    known = (set().union(*(option_names(fn) for fn in fns)) | {"max_configs", "effort"}) - {"start"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"bam.log_evidence(method='auto'): unknown option(s) {unknown}; valid options "
                        f"(of {', '.join(AUTO_CANDIDATES)} and chib): {sorted(known)}")
    # The stage auto chooses may not use an option (exact enumeration takes no num_particles),
    # so counts are checked here, before any work, by the weakest rule of the estimators.
    for name, minimum in COUNT_OPTIONS.items():
        if name in options:
            check_int(options[name], name, minimum=minimum)
    if "effort" in options:
        check_positive(options["effort"], "effort")
    if "engine" in options:  # the exact value takes no engine, but a misspelt one is still an error
        check_choice(options["engine"], "engine", KERNELS)


def advised_calls(est: EvidenceEstimate, num_tokens: int, config: AutoConfig | None = None) -> tuple[int, str | None]:
    """How many independent calls ``est``'s search asks for (``fragile_calls`` where at most
    ``fragile_starts`` independent starts reached the basin of the reported reference runs, else
    one), and why. :func:`bam_ppl.log_evidence` makes them unless ``min_calls`` is given."""
    config = config or CONFIG
    stage = est.info.reference_stage if isinstance(est.info, AutoInfo) else None
    if stage is None or num_tokens >= config.samplers_max_tokens or "reference" not in est.pipeline.split("+"):
        return 1, None
    reached, starts = stage.basin_starts, len(set(stage.starts))
    if reached <= config.fragile_starts:
        why = f"{reached} of {starts} independent starts reached the best basin"
    elif more_scouts(stage.starts, stage.pilots, config):  # the batches ran out while the rule asked for more
        why = (f"the scouts' {config.scout_batches} batches ended with a scout's basin best and {reached} of "
               f"{starts} independent starts in it")
    else:
        return 1, None
    return config.fragile_calls, why + ", so another key may end in another"


class Found(NamedTuple):
    """The best allocation any run visited: its log π(S) is the estimate's sure lower bound."""

    lower_bound: float
    best_cells: np.ndarray
    best_counts: np.ndarray

    @classmethod
    def of(cls, est: EvidenceEstimate) -> Found:
        return cls(est.details["lower_bound"], est.details["best_cells"], est.details["best_counts"])


def tempered_then_chib(model, data, rng_key, options, config: AutoConfig | None = None) -> EvidenceEstimate:
    """The tempered SMC and Chib from its best allocations (:func:`_samplers_stage`), then from
    ``reference_min_tokens`` tokens on the tempered SMC from references (:func:`reference_stage`);
    the highest estimate is reported, or the runs of those within ``agree_stderrs`` combined
    standard errors of it pooled where that lowers the error (why several: the module docstring).
    From ``samplers_max_tokens`` tokens on only the reference part runs.

    ``options`` go to the estimator that takes them (``max_configs`` to all, ``engine`` to the
    tempered SMC only: Chib runs on the numba CPU kernel); the tempered SMC's particles follow a
    pilot run (:func:`tempered_stage_options`) unless ``num_particles`` is given. The estimate's
    ``method`` is ``"auto"``, its ``pipeline`` names the parts kept or pooled, ``lower_bound`` is
    the largest of the parts' and the pilot's sure lower bounds, and ``info`` an
    :class:`~bam_ppl.infer.info.AutoInfo` (the parts, the VB bound, the stages, the part kept).
    """
    config = config or CONFIG
    tempered_fn, chib_fn = find_evidence("tempered", model), find_evidence("chib", model)
    key = as_key(rng_key)
    tempered_key, chib_key = jax.random.split(key)
    pilot_key, vb_key, reference_key = (jax.random.fold_in(key, i) for i in (1, 2, 3))
    mine = lambda fn: {k: v for k, v in options.items() if k in option_names(fn)}  # noqa: E731
    tokens = model.as_data(data).total
    logger.info("auto evidence: pilot run of the tempered SMC (%d particles)", config.pilot_particles)
    tempered_options, stage, pilot = tempered_stage_options(model, data, pilot_key, mine(tempered_fn), config)
    parts, chib_warnings = {}, []
    if tokens < config.samplers_max_tokens:
        chib_options = {k: v for k, v in mine(chib_fn).items() if k != "engine"}  # Chib runs on the CPU (numba)
        parts, chib_warnings = _samplers_stage(model, data, (tempered_key, chib_key), stage, tempered_options,
                                               chib_options)
    # A further, deterministic yardstick at little cost: an estimate below the VB bound is wrong, and
    # EvidenceWarning says so. VB runs from the best allocation of every part too, climbing to its basin's optimum.
    vb_fn = find_evidence("vb", model)
    visited = lambda: [Found.of(est) for est in [*parts.values(), pilot]]  # noqa: E731
    from_visited = lambda: [(found.best_cells, found.best_counts) for found in visited()]  # noqa: E731
    references = None
    if tokens >= config.reference_min_tokens:
        # Random restarts alone first: their best fit starts references of its own (vb_references).
        logger.info("auto evidence: VB, %d restarts (the yardstick and a search for starts)", config.vb_restarts)
        vb = vb_fn(model, data, rng_key=vb_key, num_chains=config.vb_restarts, screen_iters=config.vb_screen_iters)
        best = max(visited(), key=lambda found: found.lower_bound)
        parts["reference"], references = reference_stage(model, data, reference_key, best, vb, tempered_options,
                                                         config)
        from_found = vb_fn(model, data, rng_key=vb_key, num_chains=1, start=from_visited())
        vb_bound = max(vb.value, from_found.value)
    else:
        vb_bound = vb_fn(model, data, rng_key=vb_key, start=from_visited()).value
    found = max(visited(), key=lambda found: found.lower_bound)
    info = AutoInfo(reason="", advised_calls=1, parts={name: summary(est) for name, est in parts.items()},
                    vb_bound=vb_bound, tempered_stage=stage, reference_stage=references)
    est = combine(parts, found, info, config)
    est = replace(est, info=est.info._replace(caveat=single_basin_caveat(est.pipeline, references, config)))
    logger.info("auto evidence: %.2f ± %.2f from %s", est.value, est.stderr, est.pipeline)
    for caught in chib_warnings:
        # Chib's "averages over none of the symmetries" says nothing about an estimate it is no part
        # of: the reference-started SMC kept alone sums over them.
        if "chib" in est.pipeline.split("+") or NO_SYMMETRIES not in str(caught.message):
            warnings.warn(caught.message, caught.category, stacklevel=3)
    return est


def _samplers_stage(model, data, keys, stage: TemperedStage, tempered_options, chib_options):
    """The tempered SMC, then Chib with tempered run r's best allocation as a candidate for the z*
    of Chib run r (so that the Chib runs stay independent and their spread honest); returns the
    two estimates by name and Chib's warnings (:func:`tempered_then_chib` passes on those that
    concern its result)."""
    tempered_key, chib_key = keys
    logger.info("auto evidence: tempered SMC, %d particles (the pilot's schedule: %d temperatures)",
                stage.num_particles, stage.pilot_temperatures)
    tempered = find_evidence("tempered", model)(model, data, rng_key=tempered_key, **tempered_options)
    logger.info("auto evidence: tempered SMC %.2f ± %.2f", tempered.value, tempered.stderr)
    start = list(zip(tempered.details["run_best_cells"], tempered.details["run_best_counts"]))
    logger.info("auto evidence: Chib-style estimate from the tempered SMC's best allocations")
    with warnings.catch_warnings(record=True) as chib_warnings:
        warnings.simplefilter("always")
        chib = find_evidence("chib", model)(model, data, rng_key=chib_key, **chib_options, start=start)
    logger.info("auto evidence: Chib %.2f ± %.2f", chib.value, chib.stderr)
    return {"tempered": tempered, "chib": chib}, list(chib_warnings)


def reference_stage(model, data, key, found: Found, vb: EvidenceEstimate, tempered_options,
                    config: AutoConfig | None = None) -> tuple[EvidenceEstimate, ReferenceStage]:
    """The tempered SMC from a reference (:func:`bam_ppl.infer.smc.tempered.run_tempered`) built
    by posterior chains from good and from poor allocations, and what was tried on the way.

    The start allocations: ``found`` (the best allocation the samplers visited); the VB fit's
    expected counts rounded (``vb_references`` references; half of ``reference_candidates`` when
    the VB bound lies above ``found``'s log π(S): the samplers never reached VB's region); and the
    best allocations of cheap runs of the tempered SMC from the prior (scouts), whose chains find
    basins the good starts' chains do not reach. References are built from the good starts and one
    from each scout by independent chains
    (:func:`bam_ppl.infer.smc.references.references_from_allocations`), each tried by a cheap pilot
    run; while the best pilot is a scout's and few pilots lie near it, another batch of scouts is
    sent (:func:`more_scouts`). The main estimate runs from the candidates whose pilots lie within
    ``pilot_margin`` nats of the best, in turn (:func:`runs_from_pilots`), so that the runs'
    spread, the stated error, includes how the choice varies. The pilots and scouts have keys of
    their own, so the main runs stay unbiased.
    """
    config = config or CONFIG
    shared = {k: v for k, v in tempered_options.items() if k in ("engine", "max_configs")}
    build_key, pilot_key = jax.random.split(jax.random.fold_in(key, 1))
    candidates = _start_candidates(model, data, found, vb, build_key, shared, config)
    with warnings.catch_warnings():  # the scouts' and pilots' own warnings say nothing about the estimate
        warnings.simplefilter("ignore")
        candidates, pilots, scout_estimates = _scouts_and_pilots(
            model, data, candidates, (pilot_key, *jax.random.split(jax.random.fold_in(key, 2))), shared, config)
    names = [name for name, _ in candidates]
    chosen = runs_from_pilots(pilots, config.reference_runs, config)
    logger.info("auto evidence: tempered SMC from %d of %d references (their pilots within %g nats of the best)",
                len(set(chosen)), len(candidates), config.pilot_margin)
    estimate = find_evidence("tempered", model)(
        model, data, rng_key=key, reference=[candidates[i][1] for i in chosen], num_particles=config.reference_particles,
        num_chains=config.reference_runs, rho=config.reference_rho, num_sweeps=1, **shared)
    return estimate, ReferenceStage(
        start_lower_bound=found.lower_bound, vb_restarts=vb.value, starts=names, pilots=pilots, chosen=chosen,
        basin_starts=basin_starts(names, pilots, config), reference_sweeps=[candidates[i][1].num_sweeps for i in chosen],
        scout_estimates=scout_estimates)


def _start_candidates(model, data, found: Found, vb: EvidenceEstimate, build_key, shared, config: AutoConfig) -> list:
    """(start name, reference) of the good starts, ``found`` and VB's fit rounded (:func:`reference_stage`)."""
    max_configs = shared.get("max_configs", DEFAULT_MAX_CONFIGS)
    starts = {"sampled": (found.best_cells, found.best_counts),
              "vb": allocation_near_counts(model, data, vb.details["expected_counts"], max_configs)}
    half = config.reference_candidates // 2
    if vb.value > found.lower_bound:  # the samplers never reached VB's region
        per_start = dict(sampled=half, vb=half)
    else:
        per_start = dict(sampled=config.reference_candidates, vb=config.vb_references)
    names = [name for name in starts for _ in range(per_start[name])]
    return list(zip(names, references_from_allocations(model, data, [starts[name] for name in names], build_key,
                                                       max_configs=max_configs)))


def _scouts_and_pilots(model, data, candidates, keys, shared, config: AutoConfig) -> tuple[list, list, list]:
    """A cheap pilot run from each candidate reference, and batches of scouts (their references
    piloted too) while :func:`more_scouts` asks for them: the candidates, their pilots' log
    evidence and the scouts' log evidence."""
    tempered_fn = find_evidence("tempered", model)
    pilot_key, *scout_keys = keys
    tokens = model.as_data(data).total
    cheap = dict(num_particles=config.pilot_particles, num_sweeps=1, **shared)
    pilots, scout_estimates = [], []
    for batch in range(config.scout_batches):
        logger.info("auto evidence: reference stage, scouts batch %d of at most %d", batch + 1, config.scout_batches)
        # Batch 0 from the stage's own keys, the others from keys folded from them.
        scout_key, build_key = (jax.random.fold_in(k, batch) if batch else k for k in scout_keys)
        scouts = tempered_fn(model, data, rng_key=scout_key, num_chains=config.reference_candidates, **cheap,
                             progress_bar=False)
        bests = list(zip(scouts.details["run_best_cells"], scouts.details["run_best_counts"]))
        first = len(scout_estimates)
        scout_estimates += list(scouts.details["run_log_evidence"])
        references = references_from_allocations(model, data, bests, build_key, scout_sweeps(tokens, config),
                                                 shared.get("max_configs", DEFAULT_MAX_CONFIGS))
        candidates = candidates + [(f"scout {first + i}", ref) for i, ref in enumerate(references)]
        pilots += [tempered_fn(model, data, rng_key=jax.random.fold_in(pilot_key, i), reference=ref, num_chains=1,
                               **cheap).value
                   for i, (_, ref) in enumerate(candidates) if i >= len(pilots)]
        if not more_scouts([name for name, _ in candidates], pilots, config):
            break
    return candidates, pilots, scout_estimates


def scout_sweeps(num_tokens: int, config: AutoConfig | None = None) -> int:
    """Length of a scout's chain: ``scout_sweeps_per_token`` × T sweeps, at most
    ``scout_token_moves`` token moves, at least REFERENCE_MIN_SWEEPS."""
    config = config or CONFIG
    per_token = int(round(config.scout_sweeps_per_token * num_tokens))
    return max(REFERENCE_MIN_SWEEPS, min(per_token, config.scout_token_moves // num_tokens))


def more_scouts(starts, pilots, config: AutoConfig | None = None) -> bool:
    """Whether to send another batch of scouts: the best pilot is a scout's, and fewer than
    ``reference_runs`` pilots lie near it (so that not every main run has a candidate of its own)."""
    config = config or CONFIG
    return (starts[int(np.argmax(pilots))].startswith("scout")
            and close_to_best(pilots, config) < config.reference_runs)


def near_best(pilots, config: AutoConfig | None = None) -> np.ndarray:
    """Which pilots lie within ``pilot_margin`` of the best (a boolean mask)."""
    pilots = np.asarray(pilots, np.float64)
    return pilots >= pilots.max() - (config or CONFIG).pilot_margin


def close_to_best(pilots, config: AutoConfig | None = None) -> int:
    """How many pilots lie within ``pilot_margin`` of the best."""
    return int(np.sum(near_best(pilots, config)))


def basin_starts(starts, pilots, config: AutoConfig | None = None) -> int:
    """How many independent starts (``"sampled"``, ``"vb"``, each scout) have a reference piloting
    within ``pilot_margin`` of the best: one other than the samplers' (``"sampled"``) means their
    search missed the best basin and one other start found it, so another key may find a better
    one (:func:`single_basin_caveat`)."""
    return len({start for start, near in zip(starts, near_best(pilots, config)) if near})


def single_basin_caveat(pipeline: str, stage: ReferenceStage | None, config: AutoConfig | None = None) -> str | None:
    """What one call cannot show where the reference runs rest on a basin that one start other
    than the samplers' best allocation reached (None otherwise): said with the estimate unless
    several calls were pooled."""
    if stage is None or "reference" not in pipeline.split("+") or stage.basin_starts != 1:
        return None
    calls = (config or CONFIG).fragile_calls
    start = stage.starts[stage.chosen[0]]
    if start == "sampled":
        return None
    return (f"rests on one basin, reached from one of {len(set(stage.starts))} independent starts ({start!r}) and "
            "not from the samplers' best allocation: where the best basin is one that few starts reach, another "
            "rng_key may find a higher one, and the stated error cannot show that. Repeat with a few rng_key "
            f"values and keep the highest, or leave min_calls unset (method='auto' then pools the {calls} calls it "
            f"advises) or pass min_calls={calls}: calls with keys of their own, pooled, whose spread the stated error "
            "then includes.")


def runs_from_pilots(pilots, num_runs: int, config: AutoConfig | None = None) -> list[int]:
    """The candidate of each of ``num_runs`` runs: those whose pilot value lies within
    ``pilot_margin`` of the best, best first, taken in turn."""
    pilots = np.asarray(pilots, np.float64)
    order = np.argsort(-pilots, kind="stable")
    close = order[near_best(pilots, config)[order]]
    return [int(close[r % close.size]) for r in range(num_runs)]


def summary(est: EvidenceEstimate) -> dict:
    """One part of :func:`tempered_then_chib`: value, stderr, lower bound, runs and own details."""
    return dict(method=est.method, value=est.value, stderr=est.stderr, lower_bound=est.details["lower_bound"],
                run_log_evidence=list(est.details["run_log_evidence"]), details=est.details)


def combine(parts: dict, found: Found, info: AutoInfo, config: AutoConfig | None = None) -> EvidenceEstimate:
    """The highest of the ``parts``' estimates, or the runs of every part that agrees with it
    pooled (:func:`agree`) where that lowers the standard error, as ``method="auto"`` with the
    parts in its ``pipeline``; ``found`` (the sure lower bound and its allocation) joins the
    details, and ``info`` the kept part's name, info and ``cross_check`` (the highest of the
    others) when one part is kept."""
    ranked = sorted(parts, key=lambda name: parts[name].value, reverse=True)
    best = parts[ranked[0]]
    found = found._asdict()
    # Pooled only where it helps: a much noisier estimate "agrees" with anything, and pooling with
    # it would only widen the error.
    group = [name for name in ranked if agree(parts[name], best, config)]
    if len(group) > 1:
        runs = [run for name in group for run in parts[name].details["run_log_evidence"]]
        value, stderr = pool_runs(runs)
        if stderr < best.stderr:
            return EvidenceEstimate(value=value, stderr=stderr, method="auto", kind="estimate",
                                    pipeline="+".join(sorted(group, key=list(parts).index)),
                                    lower_bound=found["lower_bound"], run_values=tuple(runs),
                                    details=dict(run_log_evidence=runs, **found), info=info)
    # Both named by their part: the reference-started runs call themselves "tempered".
    cross_check = None
    if len(ranked) > 1:
        other = info.parts[ranked[1]]
        cross_check = dict({k: other[k] for k in ("value", "stderr", "lower_bound")}, method=ranked[1])
    return replace(best, method="auto", pipeline=ranked[0], lower_bound=found["lower_bound"],
                   details={**best.details, **found},
                   info=info._replace(kept_info=best.info, kept=ranked[0], cross_check=cross_check))


def agree(a: EvidenceEstimate, b: EvidenceEstimate, config: AutoConfig | None = None) -> bool:
    """Whether two estimates lie within ``agree_stderrs`` combined standard errors of each other."""
    return bool(abs(a.value - b.value) <= (config or CONFIG).agree_stderrs * np.hypot(a.stderr, b.stderr))


def tempered_stage_options(model, data, pilot_key, options, config: AutoConfig | None = None
                           ) -> tuple[dict, TemperedStage, EvidenceEstimate]:
    """A pilot run of the tempered SMC (``pilot_particles`` particles, one run) and its options in
    :func:`tempered_then_chib`: ``num_particles``, unless given, from the pilot's number of
    temperatures (``short_schedule``) and the number of tokens (``reference_carries_tokens``).
    Returns the options, what was decided and the pilot, whose best allocation can start the
    reference part."""
    config = config or CONFIG
    pilot_options = dict(options, num_particles=config.pilot_particles, num_chains=1, progress_bar=False)
    with warnings.catch_warnings():  # the pilot's own warnings say nothing about the estimate
        warnings.simplefilter("ignore")
        pilot = find_evidence("tempered", model)(model, data, rng_key=pilot_key, **pilot_options)
    temperatures = int(pilot.details["num_temperatures"][0])
    if "num_particles" in options:
        particles = options["num_particles"]
    else:
        particles = config.tempered_particles if temperatures <= config.short_schedule else config.pilot_particles
        if model.as_data(data).total >= config.reference_carries_tokens:
            particles = min(particles, config.reference_particles)
    stage = TemperedStage(num_particles=particles, pilot_temperatures=temperatures)
    return dict(options, num_particles=particles), stage, pilot
