"""Which basins the engine's searches reach: every reference of a default call, annealed alone.

For NMF(4) on ``evidence_engine.py``'s 50 × 70 counts at T tokens and a key: the searches of the
default call (``method="mixture"``, the same random streams); each run's value below is its annealing from its
own search's mixture alone, reweighted by that mixture (the call reweights by every search's). Each reference its search built is then the only start of a tempered
SMC run of ``--particles`` particles (adaptive temperatures, the engine's rho), whose last
reweighting sums over the label symmetries: that reference's own estimate of log p(X), which falls
short by about the log mass of the basins it does not cover. A run's mixture holds the mass of the
best basin among its references, so a run falls short where all of its references do.

Each row: a run, each reference's start kind (a VB fit, an annealed or a drawn scout; "covered":
its chain stopped where an earlier reference covers, so it built none) and value alone, and the
run's value. The last line counts the references within 10 nats of the best of the call, and the
runs with none: a start reaches the mass basin with that frequency, and a run with n starts misses
it with about (1 − frequency)^n.

    .venv/bin/python benchmarks/basin_census.py --tokens 16000 --keys 0 1 2
    .venv/bin/python benchmarks/basin_census.py --tokens 16000 --keys 0 1 2 --config search_draws=6553600000
"""

from __future__ import annotations

import argparse
import warnings
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from engine_time_split import case
from evidence_keys import with_fields

from bam_ppl.infer.smc import mixture, mixture_start, references
from bam_ppl.infer.smc.tempered import NUM_BLOCKS, PathOptions, _one_run

#: A reference within this many nats of the call's best reaches the basin that holds the mass: at 16 000 tokens
#: the other basins lie 20 nats and more below it, and a reference's run of 64 particles alone spreads by a few.
NEAR = 10.0


def alone(problem, log_q, num_particles: int, seeds) -> float:
    """log p(X) estimated by a tempered SMC run from the reference ``log_q`` alone (label symmetries summed)."""
    tp, start = problem.tp, mixture_start.uniform_start([log_q])
    particles = mixture_start.MixtureParticles(tp, num_particles, seeds[:NUM_BLOCKS], mixture._Inline(), start,
                                         problem.cells)

    def last(ps):
        return mixture_start.mixture_log_weights(tp, start, problem.symmetry, np.asarray(ps.config), ps.component)

    run = _one_run(particles, references.with_reference(tp, log_q), np.random.default_rng(seeds[NUM_BLOCKS]),
                   PathOptions(mixture.ENGINE.rho), initial_log_w=particles.initial_log_weights(),
                   final_log_weights=last)
    return run.log_evidence + run.log_relabelled


def census_run(problem, prepared, plan, r: int, alone_particles: int):
    """Run ``r`` of the call: its starts' kinds, each reference's value alone (nan: covered), the run's value."""
    [(found, _)] = mixture.searched_group(problem, plan, prepared, [r])
    run = mixture.run_mixture(problem, plan.share, plan.seeds.runs[r], mixture._Inline(),
                              mixture.defended_start(found, problem.tp), plan.num_particles)
    names = ["vb"] * (len(found) - 2 * plan.share.num_scouts) + ["annealed", "drawn"] * plan.share.num_scouts
    values = [alone(problem, f.log_q, alone_particles, plan.seeds.runs[r]) if f.log_q is not None else np.nan
              for f in found]
    return names, values, run.log_evidence


def census(total: int, key: int, num_runs: int, alone_particles: int, pool) -> tuple[int, int, int, int]:
    """Print one call's rows; return (references near the best, references, runs with none, runs)."""
    problem, prepared = mixture.mixture_problem(*case(f"nmf{total}"), 10**6)
    plan = mixture.call_plan(problem, mixture.effort_sizes(1.0), jax.random.key(key), num_runs, total)
    rows = list(pool.map(lambda r: census_run(problem, prepared, plan, r, alone_particles), range(num_runs)))
    best = np.nanmax([np.nanmax(values) for _, values, _ in rows])
    near = misses = built = 0
    for r, (names, values, value) in enumerate(rows):
        cells = [f"{name} {v:.2f}" for name, v in zip(names, values) if np.isfinite(v)]
        covered = sum(1 for v in values if not np.isfinite(v))
        close = sum(1 for v in values if np.isfinite(v) and v >= best - NEAR)
        near, built, misses = near + close, built + len(cells), misses + (close == 0)
        print(f"| {total} | {key} | {r} | {', '.join(cells)}{f'; {covered} covered' if covered else ''} | "
              f"{value:.2f} |", flush=True)
    return near, built, misses, num_runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="*", default=[16000])
    parser.add_argument("--keys", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--runs", type=int, default=mixture.ENGINE.num_chains)
    parser.add_argument("--particles", type=int, default=64, help="particles of each reference's run alone")
    parser.add_argument("--config", nargs="+", default=[], metavar="FIELD=VALUE",
                        help="fields of the engine's EngineConfig for the searches, e.g. search_draws=6553600000")
    args = parser.parse_args(argv)
    mixture.ENGINE = with_fields(mixture.ENGINE, args.config)
    warnings.simplefilter("ignore")
    print("| T | key | run | each reference alone (start kind, log evidence) | the run's mixture |")
    print("|---|---|---|---|---|")
    counts = np.zeros(4, np.int64)
    with ThreadPoolExecutor(2) as pool:
        for total in args.tokens:
            for key in args.keys:
                counts += census(total, key, args.runs, args.particles, pool)
    near, built, misses, runs = counts
    print(f"\nreferences within {NEAR:g} nats of their call's best: {near} of {built}; runs with none: {misses} of {runs}")


if __name__ == "__main__":
    main()
