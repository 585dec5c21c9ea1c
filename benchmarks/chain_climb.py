"""How far a reference's chain has climbed: the log-likelihood of the data at the posterior mean of the tables
given the chain's allocation, every few sweeps, for each start of one run's search.

A reference averages the second half of its chain (``mixture.finish``), and one half more where the chain still climbed
there (``mixture.still_climbing``): a reference over the way up covers the basin it reaches poorly. The statistic
Σ_u X_u log Σ_l Π_m θ̄_m[f_m(u, l)], θ̄ the posterior mean of the tables given the allocation, rises while a chain
climbs and levels off, noisy, within a basin. Per start (the run's VB fits, an annealed scout, a drawn one, as
``mixture.run_search`` orders them): its value at the start, then after every ``--every`` sweeps of the engine's
chain (data-augmentation sweeps where the engine takes that chain), to ``--lengths`` times the engine's length.

    .venv/bin/python benchmarks/chain_climb.py --tokens 64000 --key 0
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from evidence_accuracy import data_for

import bam_ppl as bam
from bam_ppl.infer.smc import mixture
from bam_ppl.infer.smc.references import mean_table_log_likelihood


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64000)
    parser.add_argument("--key", type=int, default=0)
    parser.add_argument("--lengths", type=float, default=2.0, help="sweeps, in units of the engine's chain length")
    parser.add_argument("--every", type=int, default=8, help="values per engine chain length")
    args = parser.parse_args(argv)
    X, model = data_for(args.tokens, 50, 70, 4, seed=0), bam.models.nmf(4)
    problem, prepared = mixture.mixture_problem(model, X, 100_000)
    plan = mixture.call_plan(problem, mixture.effort_sizes(1.0), jax.random.key(args.key), mixture.ENGINE.num_chains,
                             args.tokens)
    configs, _ = mixture.vb_start_configs(prepared, problem.tp, plan.seeds.vb[0], plan.share)
    kinds = mixture.search_kinds(configs, plan.share)[:len(configs) + 2]
    for i, kind in enumerate(kinds):
        began = time.perf_counter()
        started = mixture.start(problem, plan.share, plan.seeds.starts[0][i], kind)
        step = max(1, started.sweeps // args.every)
        values = [mean_table_log_likelihood(problem.tp.token_cell, problem.host, started.chain.config())]
        for _ in range(int(round(args.lengths * args.every))):
            started.chain.sweep(step)
            values.append(mean_table_log_likelihood(problem.tp.token_cell, problem.host, started.chain.config()))
        name = "VB fit" if isinstance(kind, np.ndarray) else kind
        print(f"{name}: chain of {started.sweeps} sweeps ({'augmented' if problem.cells is not None else 'collapsed'}),"
              f" every {step}: " + " ".join(f"{v:.0f}" for v in values) + f"  ({time.perf_counter() - began:.1f} s)",
              flush=True)


if __name__ == "__main__":
    main()
