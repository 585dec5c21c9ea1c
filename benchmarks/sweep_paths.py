"""What the factorised sweep of the tempered SMC buys over the general rows' sweep, on the same particles.

The numba kernel sweeps a token's configurations by one of two tabulated paths
(``bam_ppl.infer.smc.tempered_sweeps``): where a token's weights factorise (NMF, CP: each latent row
is read at one entry per configuration), ``_sweeps_tabulated`` caches the rows every token reads
alike; elsewhere (Tucker) ``_sweeps_rows_tabulated`` reads every row at every configuration. Both
give the same draws up to rounding. This script moves the same particles (NMF(4), a = 1, on the
50 × 70 counts of ``benchmarks/evidence_accuracy.py``'s generator, from a uniform reference) by each
path in turn and prints the best of ``--rounds`` wall times of two sweeps of ``--particles`` particles,
the ratio, and whether the log-likelihoods agree.

    .venv/bin/python benchmarks/sweep_paths.py --tokens 4000 16000 64000
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

import bam_ppl as bam
from bam_ppl.infer.smc import mixture
from bam_ppl.infer.smc.references import uniform_reference, with_reference
from bam_ppl.infer.smc.tempered_numba import NumbaParticles
from bam_ppl.models.allocation import DEFAULT_MAX_CONFIGS


def sweep_seconds(tp, num_particles: int, rounds: int, pool) -> tuple[float, np.ndarray]:
    """Best wall seconds of two sweeps at β = 0.6 of ``num_particles`` particles (after one untimed sweep),
    and their log-likelihoods after the last round."""
    seeds = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(1), 8))).astype(np.uint32)
    best = np.inf
    for _ in range(rounds):
        particles = NumbaParticles(tp, num_particles, seeds, pool)
        particles.initialise()
        particles.move(0.5, 1)
        start = time.perf_counter()
        particles.move(0.6, 2)
        best = min(best, time.perf_counter() - start)
    return best, particles.log_like.copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", nargs="+", type=int, default=[4000, 16000, 64000])
    parser.add_argument("--particles", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| T | factorised tables, s | general rows' tables, s | ratio | same log-likelihoods |")
    print("|---|---|---|---|---|")
    with ThreadPoolExecutor(2) as pool:
        for tokens in args.tokens:
            _, X = bam.models.nmf(4, a=200.0).sample(jax.random.key(0), shape=(50, 70), total=tokens)
            problem, _ = mixture.mixture_problem(bam.models.nmf(4), np.asarray(X), DEFAULT_MAX_CONFIGS)
            tp = with_reference(problem.tp, uniform_reference(problem.tp))
            general = tp._replace(factorised=tp.factorised._replace(usable=False))
            fast, fast_like = sweep_seconds(tp, args.particles, args.rounds, pool)
            slow, slow_like = sweep_seconds(general, args.particles, args.rounds, pool)
            print(f"| {tokens} | {fast:.3f} | {slow:.3f} | {slow / fast:.2f} | {np.allclose(fast_like, slow_like)} |",
                  flush=True)


if __name__ == "__main__":
    main()
