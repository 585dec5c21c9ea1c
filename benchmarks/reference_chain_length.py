"""How long a reference's chain must run: the tempered SMC from one chain's reference, against the chain's sweeps.

For NMF(4) on ``evidence_engine.py``'s 50 × 70 counts at T tokens: one VB fit (best of 8 restarts)
rounded to an allocation starts a collapsed-Gibbs chain of S sweeps whose last half averages into a
reference (``references.reference_from_chain``, as the default engine builds each of its references);
then ``--reps`` tempered SMC runs of ``--particles`` particles anneal from that reference to the
posterior (adaptive temperatures, rho = 0.97). Each row: S (as a multiple of T and in sweeps), the
runs' log evidence (mean and spread; one reference covers one basin and one labelling of it, so the
values lie below log p(X): compare rows of one T), their temperatures, and the CPU seconds of the
chain and wall seconds of a run. Where the runs' value still rises with S, the reference was not yet
averaged over the basin's posterior; the S where it stops rising grows with T.

    .venv/bin/python benchmarks/reference_chain_length.py --tokens 1000 4000 16000
"""

from __future__ import annotations

import argparse
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from engine_time_split import case

from bam_ppl.infer.smc import mixture, mixture_start, references
from bam_ppl.infer.smc.tempered import PathOptions, _one_run


def vb_start(problem, prepared):
    """Token configurations of the best of 8 VB restarts, rounded to an allocation."""
    options = mixture.effort_sizes(1.0)._replace(vb_restarts=8, num_scouts=1)  # one VB fit
    with jax.enable_x64(True):
        configs, _ = mixture.vb_start_configs(prepared, problem.tp, jax.random.PRNGKey(0), options)
    return configs[0]


def anneal(tp, log_q, num_particles: int, rep: int, pool) -> tuple[float, int, float]:
    """One tempered SMC run from the reference ``log_q``: log evidence, temperatures, wall seconds."""
    start = mixture_start.uniform_start([log_q])
    particles = mixture_start.MixtureParticles(tp, num_particles, np.array([[5, 6 + rep], [7, 8 + rep]], np.uint32),
                                         pool, start)
    began = time.perf_counter()
    run = _one_run(particles, references.with_reference(tp, log_q), np.random.default_rng(rep), PathOptions(0.97),
                   initial_log_w=particles.initial_log_weights())
    return run.log_evidence, run.schedule.size, time.perf_counter() - began


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1000, 4000, 16000])
    parser.add_argument("--sweeps-per-token", type=float, nargs="*", default=[0.05, 0.2, 0.8, 3.2])
    parser.add_argument("--reps", type=int, default=2, help="tempered runs from each reference")
    parser.add_argument("--particles", type=int, default=64)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    print("| T | S / T | S | log evidence: mean (spread) | temperatures | chain CPU s | run s |")
    print("|---|---|---|---|---|---|---|")
    with ThreadPoolExecutor(2) as pool:
        for total in args.tokens:
            problem, prepared = mixture.mixture_problem(*case(f"nmf{total}"), 10**6)
            config = vb_start(problem, prepared)
            for ratio in args.sweeps_per_token:
                sweeps = max(1, int(round(ratio * total)))
                began = time.process_time()
                log_q = references.reference_from_chain(problem.tp, config, sweeps, np.array([3, 4], np.uint32),
                                                        skip=sweeps // 2)
                chain_seconds = time.process_time() - began
                runs = [anneal(problem.tp, log_q, args.particles, rep, pool) for rep in range(args.reps)]
                values = np.array([value for value, _, _ in runs])
                print(f"| {total} | {ratio:g} | {sweeps} | {values.mean():.2f} ({np.ptp(values):.2f}) | "
                      f"{np.mean([n for _, n, _ in runs]):.0f} | {chain_seconds:.1f} | "
                      f"{np.mean([s for _, _, s in runs]):.1f} |", flush=True)


if __name__ == "__main__":
    main()
