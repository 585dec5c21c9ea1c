"""What each evidence estimator reports about its own run: the typed ``info`` of an
:class:`~bam_ppl.EvidenceEstimate`.

Every estimate carries the fields all estimators share (``value``, ``stderr``, ``lower_bound``,
``run_values``, ``num_runs``, ``seconds``, ``warnings``); its ``info`` holds the diagnostics of
the estimator that made it, one NamedTuple per estimator (BlackJAX's ``SMCInfo`` and
``NUTSInfo`` have the same role). ``EvidenceEstimate.details`` is built from it: its fields, and
the allocation behind the sure lower bound (``best_cells``, ``best_counts``) and each run's
value (``run_log_evidence``) where the estimator reports them. Lists stand where an estimator
has one entry per run.
"""
from __future__ import annotations

from typing import NamedTuple


class ExactInfo(NamedTuple):
    """``method="exact"``: enumeration of the allocation tensors (no runs, no error)."""

    #: The most allocation tensors the enumeration was allowed.
    max_tensors: int


class PolyaUrnInfo(NamedTuple):
    """``method="smc"``: the Pólya-urn SMC, one entry per chain where a list."""

    #: Particles per chain.
    num_particles: int
    #: Independent chains (each one run of ``run_values``).
    num_chains: int
    #: The smallest effective sample size over the chains' tokens.
    min_ess: float
    #: Resampling steps of each chain.
    num_resamplings: list
    #: The ESS fraction below which the particles were resampled.
    ess_threshold: float
    #: The resampling scheme.
    resampling: str
    #: Fraction of token steps that resampled.
    resampling_rate: float
    #: The best ELBO of the call's VB restarts, a second sure lower bound (-inf without restarts).
    vb_bound: float = float("-inf")


class TemperedInfo(NamedTuple):
    """``method="tempered"``: the tempered SMC over token allocations, one entry per run where a list."""

    #: Particles per run.
    num_particles: int
    #: Independent runs (each one of ``run_values``).
    num_runs: int
    #: Temperatures of each run's schedule.
    num_temperatures: list
    #: Resampling steps of each run.
    num_resamplings: list
    #: The smallest effective sample size of any run.
    min_ess: float
    #: Each run's temperatures.
    schedule: list
    #: The adaptive schedule's target ratio of successive ESS (None for a given schedule).
    rho: float | None
    #: Gibbs sweeps per temperature.
    num_sweeps: int
    #: The kernel the moves ran on ("numba" or "jax").
    kernel: str
    #: The Dirichlet concentration the tempering started from, or None for the model's own.
    start_a: float | None
    #: Whether the runs started from a reference distribution rather than the prior urn.
    referenced: bool
    #: Sweeps of the chains that built the references (None without one).
    reference_sweeps: object
    #: The cells of the best allocation each run visited (as ``best_cells``).
    run_best_cells: list
    #: Their counts (as ``best_counts``).
    run_best_counts: list


class ChibInfo(NamedTuple):
    """``method="chib"``: the Chib-style estimate at a high-posterior allocation z*, one entry per run where a list."""

    #: log p(X, z*) of each run's z*.
    log_joint_star: list
    #: log p(X, z) of the allocation each search ended at.
    search_log_joint: list
    #: log p(X, z) of each given start allocation.
    start_log_joint: list
    #: The estimate of log p(z* | X) of each run.
    log_posterior_star: list
    #: Iterated-conditional-modes passes of each search and start.
    icm_passes: list
    #: Label permutations averaged over (the model's label symmetries).
    num_relabellings: int
    #: Gibbs sweeps of each run (``num_samples``).
    num_steps: int
    #: Search sweeps of each search chain (``num_search_sweeps``).
    num_warmup: int
    #: Independent runs (``num_chains``).
    num_runs: int
    #: Search chains (``num_searches``).
    num_searches: int
    #: The kernel the sweeps ran on.
    kernel: str


class VBInfo(NamedTuple):
    """``method="vb"``: the collapsed-free variational bound, best of its restarts and starts."""

    #: The ELBO each random restart reached.
    elbo_per_restart: list
    #: Which restart reached the best ELBO.
    best_restart: int
    #: Iterations of each restart and start.
    iterations: list
    #: Whether each restart and start converged.
    converged: list
    #: The ELBO of each fit from a given start allocation.
    start_elbo: list
    #: Which start reached the reported ELBO, or None where a random restart did.
    best_start: int | None
    #: Posterior expected counts of the best fit (its Dirichlet parameters less the prior's), after the moves.
    expected_counts: object
    #: The ELBO of the best fit after its merge-and-birth moves (``num_moves``), or None without them.
    moved_elbo: float | None = None


class MixtureInfo(NamedTuple):
    """``method="mixture"``: the tempered SMC from a mixture of references, each run's found by a search of its own."""

    #: Temperatures of each run's schedule.
    num_temperatures: list
    #: For each run, the log evidence of each start of its search, in order (an annealed scout's run; nan for a drawn
    #: scout or a VB fit).
    scout_log_evidence: list
    #: For each run, the sweeps of each start's chain, in the order of the starts (at most half the length for a
    #: chain that stopped where an earlier reference covers).
    chain_sweeps: list
    #: Particles per run.
    num_particles: int
    #: Scouts of each kind in the call (all runs' searches).
    num_scouts: int
    #: Independent runs.
    num_runs: int
    #: The cost knob the call ran at.
    effort: float
    #: Which chains built the references, "collapsed" (a token at a time) or "augmented" (data augmentation, a
    #: cell at a time), whichever draws fewer random numbers on these data.
    chain: str = "collapsed"
    #: Accepted share of the moves of whole cells' splits in the annealing, the data-augmentation proposals and the
    #: reference's draws (nan, nan where none ran: with collapsed chains).
    split_move_acceptance: tuple = (float("nan"), float("nan"))
    #: For each run, the references its search built (one per basin region its starts reached; the other starts
    #: stopped where one of them covers).
    num_references: list = ()
    #: For each run, the share of its estimate that each component of its start carries at β = 1, its references
    #: in the order its search built them and the defensive component last (nan where the last reweighting could
    #: not be summed). Resampling moves particles between components, so one share near 1 says that the run
    #: counted the basin of that one reference.
    component_shares: list = ()
    #: The share of the estimate on basins that one search alone found (:func:`~bam_ppl.estimate.single_search_share`;
    #: nan for one run): near 0 where each basin the value rests on was found more than once, near 1 where every
    #: search ended in basins of its own and more lie beyond them (noisy: −0.8 to 0.6 where the searches agree).
    single_search_share: float = float("nan")
    #: For each run, the effective sample size of its particles' weights after the last reweighting (1 / Σ w², nan
    #: where it could not be summed): near 1, the run's value rests on one particle.
    final_ess: list = ()


class UpperBoundInfo(NamedTuple):
    """:func:`bam_ppl.evidence_upper_bound`: reverse annealing from a given allocation."""

    #: Each run's stochastic upper bound log Z_0 − log w_r.
    run_upper_bound: list
    #: The temperatures, from 0 to 1; the runs take them from β = 1 down.
    schedule: list
    #: Steps between them.
    num_temperatures: int
    #: Gibbs sweeps per temperature.
    num_sweeps: int
    #: The kernel the moves ran on.
    kernel: str
    #: Whether the runs ended at a reference distribution rather than the prior urn.
    referenced: bool


class AutoInfo(NamedTuple):
    """``method="auto"``: what it chose and why (``EvidenceEstimate.pipeline`` names the estimator that ran)."""

    #: Why this estimator, in words.
    reason: str
    #: The ``info`` of the estimator that ran.
    kept_info: NamedTuple | None = None
    #: The cost knob the call ran at (:class:`bam_ppl.infer.smc.mixture.EngineConfig`).
    effort: float = 1.0


#: Every info type by name, as :meth:`bam_ppl.EvidenceEstimate.from_dict` reads them.
INFO_TYPES = {cls.__name__: cls for cls in (ExactInfo, PolyaUrnInfo, TemperedInfo, ChibInfo, VBInfo, MixtureInfo,
                                            UpperBoundInfo, AutoInfo)}


def info_from_json(data: dict):
    """The info :meth:`bam_ppl.EvidenceEstimate.to_dict` wrote, ``{"type": name, "fields": {...}}``: lists
    stand where arrays were, None where a float was not finite."""
    name = data.get("type") if isinstance(data, dict) else None
    if name not in INFO_TYPES:
        raise ValueError(f"info must name one of {sorted(INFO_TYPES)}, got {name!r}")
    fields = {key: (info_from_json(value) if isinstance(value, dict) and value.get("type") in INFO_TYPES
                    and set(value) == {"type", "fields"} else value)
              for key, value in dict(data.get("fields") or {}).items()}
    return INFO_TYPES[name](**fields)
