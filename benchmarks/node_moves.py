"""Do node moves (split–merge of two classes of a latent node) carry posterior chains to a better basin?

On a real data set and model of ``benchmarks/real_data_evidence.py``, the reference stage of the
default evidence in miniature: the best allocations of the eight scout runs of ``method="auto"``
(``auto.AUTO_SCOUTS``, with ``--scout-moves`` node moves per temperature), from each a search phase of ``--search`` collapsed-Gibbs sweeps, with
``--moves`` node moves (``tempered.posterior_block_moves``) after every four sweeps, then a
reference chain of ``auto.scout_sweeps(T)`` Gibbs sweeps (``tempered.chain_references``) and a
pilot run of the tempered SMC from it (``auto.AUTO_REFERENCE_PILOT``). Prints, per setting, the
log π(S) after the search, the accepted node moves, the eight pilots and the seconds taken. The
moves stay out of the reference chains themselves: a node move can swap two classes whole, and a
chain that switches labels averages the conditionals of several relabelled copies into q.

    .venv/bin/python benchmarks/node_moves.py icews "Tucker(4, 4, 1)" --key 2 --moves 0 8
"""

from __future__ import annotations

import argparse
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from real_data_evidence import experiment_model

from bam_ppl.infer import auto
from bam_ppl.infer.gibbs import collapsed_numba
from bam_ppl.infer.gibbs.chib import configs_of_allocation
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.smc import tempered


def log_joint(tp, config) -> float:
    """log π(S) of the allocation with token configurations ``config``."""
    prior, like = tempered.exact_log_terms(tp, tempered.counts_of_configs(tp, config))
    return tp.joint_constant + prior + like - tempered.log_multinomial(tp, config)


def search(tp, config, rng, num_sweeps: int, num_moves: int):
    """``num_sweeps`` Gibbs sweeps from ``config`` (a copy), ``num_moves`` node moves after every
    four; returns the end configuration and the accepted node moves."""
    config = np.array(config, np.int32)
    shifted = tp.concentration + tempered.counts_of_configs(tp, config)
    order = np.arange(config.size, dtype=np.int32)
    factorised = collapsed_numba.factorised_rows(tp.gibbs_rows, tp.concentration, config.size)
    accepted = 0
    for _ in range(num_sweeps // 4):
        collapsed_numba.gibbs_sweeps(rng, 4, True, shifted, config, order, tp.gibbs_rows, factorised)
        if num_moves:
            accepted += int(tempered.posterior_block_moves(tp, rng, shifted, config, num_moves)[2])
    return config, accepted


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=("abalone", "letters", "icews"))
    parser.add_argument("model")
    parser.add_argument("--key", type=int, default=2)
    parser.add_argument("--search", type=int, default=2000, help="sweeps of the search phase")
    parser.add_argument("--moves", type=int, nargs="+", default=[0, 8], help="node moves per four sweeps")
    parser.add_argument("--scout-moves", type=int, default=0, help="node moves per temperature in the scouts")
    args = parser.parse_args(argv)
    model, X = experiment_model(args.experiment, args.model)
    data, bound, layout, _ = prepare(model, X)
    tp = tempered.build_tempered_problem(bound, data, layout)
    sweeps = auto.scout_sweeps(data.total)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scouts = tempered.run_tempered(model, X, args.key, **auto.AUTO_SCOUTS, node_moves=args.scout_moves,
                                       progress_bar=False)
    starts = [configs_of_allocation(bound, data, layout, tp.token_cell, allocation, "start")
              for allocation in zip(scouts.run_best_cells, scouts.run_best_counts)]
    print(f"{args.experiment}, {args.model}, key {args.key}: T = {data.total}; scouts "
          f"{np.round(scouts.run_log_evidence, 1).tolist()} ({args.scout_moves} node moves per temperature, "
          f"{scouts.seconds:.1f} s); search {args.search} sweeps, chains {sweeps}", flush=True)
    for num_moves in args.moves:
        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            found = list(pool.map(lambda i, moves=num_moves: search(
                tp, starts[i], np.random.default_rng([args.key, i]), args.search, moves), range(len(starts))))
            keys = jax.random.split(jax.random.key_data(jax.random.key(args.key + 100)), len(starts))
            references = [tempered.Reference(log_q, sweeps)
                          for log_q in tempered.chain_references(tp, [c for c, _ in found], sweeps, keys, pool)]
        pilots = [tempered.run_tempered(model, X, 1000 + i, reference=reference, **auto.AUTO_REFERENCE_PILOT,
                                        progress_bar=False).log_evidence for i, reference in enumerate(references)]
        print(f"node moves {num_moves} per 4 sweeps: log π(S) after the search "
              f"{[round(log_joint(tp, c), 1) for c, _ in found]}, accepted {[a for _, a in found]}; pilots "
              f"{np.round(pilots, 1).tolist()}, best {max(pilots):.1f}; {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
