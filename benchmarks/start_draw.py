"""How a mixture run's particles are drawn from their start, timed on one pinned core in one process.

A run of the default engine starts its particles from a mixture of product references. They used to
be drawn through the urn pass (``NumbaParticles._run`` in mode ``_URN``), which computes every token's
general weights. They are now drawn token by token from each reference on its own
(``NumbaParticles._draw_products``). Both draw from the same distribution (``tests/test_tempered.py``,
the β = 0 chi-square test). On NMF(4) at T tokens (``benchmarks/evidence_engine.py``'s ``nmf<T>``
counts), 276 particles (a T = 1000 run's) over seven random references and the uniform one, this
prints the CPU seconds of each way in turn over ``--repeats`` rounds, and one tempered sweep of the
same particles for scale.

    .venv/bin/python benchmarks/start_draw.py --tokens 1000 4000
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from engine_time_split import case

from bam_ppl.infer.smc import mixture, mixture_start, tempered_numba
from bam_ppl.infer.smc.references import uniform_reference


def cpu_seconds(fn, *args) -> float:
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def one_size(total: int, num_particles: int, repeats: int) -> tuple[float, float, float]:
    """Best CPU s of the urn pass and of the product draw, and of one sweep, at ``total`` tokens."""
    problem, _ = mixture.mixture_problem(*case(f"nmf{total}"), mixture.DEFAULT_MAX_CONFIGS)
    tp = problem.tp
    rng = np.random.default_rng(0)
    log_qs = [np.log(rng.dirichlet(np.ones(tp.num_configs), size=tp.cell_start.size - 1)) for _ in range(7)]
    start = mixture_start.uniform_start(log_qs + [uniform_reference(tp)])
    keys = np.arange(2 * mixture.NUM_BLOCKS, dtype=np.uint32).reshape(mixture.NUM_BLOCKS, 2)
    urn, product = np.inf, np.inf
    with ThreadPoolExecutor(2) as pool:
        for _ in range(repeats + 1):  # the first round compiles or reads the kernels
            particles = mixture_start.MixtureParticles(tp, num_particles, keys, pool, start)
            urn = min(urn, cpu_seconds(particles._run, tempered_numba._URN, 0.0, 1))
            particles = mixture_start.MixtureParticles(tp, num_particles, keys, pool, start)
            product = min(product, cpu_seconds(particles._draw_products))
        return urn, product, cpu_seconds(particles.move, 0.5, 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--particles", type=int, default=276)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--core", type=int, default=1, help="the core the process is pinned to")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    os.sched_setaffinity(0, {args.core})
    print("| T | urn pass (best CPU s) | product draw (best CPU s) | ratio | one sweep at β = 0.5 (CPU s) |")
    print("|---|---|---|---|---|")
    for total in args.tokens:
        urn, product, sweep = one_size(total, args.particles, args.repeats)
        print(f"| {total} | {urn:.3f} | {product:.3f} | {product / urn:.3f} | {sweep:.3f} |", flush=True)


if __name__ == "__main__":
    main()
