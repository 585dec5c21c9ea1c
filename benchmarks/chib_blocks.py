"""Is Chib's shortfall on letter bigrams the spread of p̂(z* | X), or where its chains go?

``method="chib"`` estimates p(z* | X) by the average of one-sweep transition probabilities into
z* (Murray & Salakhutdinov 2009), a product over all T tokens whose spread grows with T; its log
is low by the Jensen gap of that spread. Chib's own remedy is to split the state into blocks
(Chib 1995, §2.2; Chib & Jeliazkov 2001): with the tokens in B contiguous blocks z_1..z_B,

    p(z* | X) = Π_b p(z*_b | z*_<b, X),   p(z*_b | z*_<b, X) = E[K_b(z → z*_b)],

the expectation over the reduced posterior p(z_≥b | z*_<b, X), sampled by collapsed-Gibbs sweeps
over the tokens from block b on (those before it fixed at z*), and K_b the probability that a
sweep over block b alone lands on z*_b (the first block's averaged over the label symmetries, as
in ``method="chib"``). Each factor's average has a far smaller spread than the whole product. The
chains start at z* (the default call's best allocation) and make ``--warmup`` sweeps before
``--steps`` sweeps are averaged. Not a stochastic lower bound: a factor estimated low (a chain
far from z*, where the transitions into it are rare) makes the log evidence high.

    .venv/bin/python benchmarks/chib_blocks.py letters "NMF(4)" --key 2 --blocks 1 4 16 --warmup 100 3000
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import jax
import numpy as np
from real_data_evidence import experiment_model
from scipy.special import logsumexp

import bam_ppl as bam
from bam_ppl.infer.gibbs import chib, chib_numba
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.smc import symmetry


def block_factor(problem, shifted, config, star, lo: int, hi: int, relabellings) -> float:
    """log of K_b(z → g(z*)_b) averaged over the relabellings g: tokens lo..hi − 1 moved to their
    targets in turn (those before lo are there already), then all moved back."""
    terms = []
    partial = np.zeros(config.size + 1)
    for relabel in relabellings:
        chib_numba._advance(shifted, config, star, relabel, partial, np.int64(lo), -np.inf, problem.structure,
                      problem.fast)
        terms.append(partial[hi] - partial[lo])
        chib_numba._retreat(shifted, config, star, relabel, np.int64(lo), np.int64(config.size), problem.structure)
    return float(logsumexp(terms) - math.log(len(terms)))


def blocked_log_posterior(problem, star, blocks: int, warmup: int, steps: int, rng) -> float:
    """Σ_b log p̂(z*_b | z*_<b, X) over ``blocks`` contiguous blocks of tokens."""
    edges = np.linspace(0, star.size, blocks + 1).astype(np.int64)
    identity = np.arange(problem.num_configs, dtype=np.int64)[None, :]
    star_shifted = problem.shifted_counts(star)
    total = 0.0
    for b in range(blocks):
        shifted, config = star_shifted.copy(), star.copy()
        free = np.arange(edges[b], star.size, dtype=np.int64)
        for _ in range(warmup):
            chib_numba._pass(rng, chib_numba.DRAW, 1.0, shifted, config, free, problem.structure, problem.fast)
        relabellings = problem.relabellings if b == 0 else identity
        factors = []
        for _ in range(steps):
            chib_numba._pass(rng, chib_numba.DRAW, 1.0, shifted, config, free, problem.structure, problem.fast)
            factors.append(block_factor(problem, shifted, config, star, edges[b], edges[b + 1],
                                        relabellings))
        total += float(logsumexp(factors) - math.log(steps))
    return total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=("abalone", "letters", "icews"))
    parser.add_argument("model")
    parser.add_argument("--key", type=int, default=2)
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--warmup", type=int, nargs="+", default=[100, 3000])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    model, X = experiment_model(args.experiment, args.model)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        est = bam.log_evidence(model, X, rng_key=args.key)
        best = (est.details["best_cells"], est.details["best_counts"])
        check = bam.log_evidence(model, X, method="chib", rng_key=jax.random.fold_in(jax.random.PRNGKey(args.key), 4),
                                 num_search_sweeps=0, num_searches=1, start=best)
    print(f"{args.experiment}, {args.model}, key {args.key}: default {est.value:.2f} ± {est.stderr:.2f}; "
          f"method='chib' from its best allocation {check.value:.2f} ± {check.stderr:.2f} "
          f"({time.perf_counter() - start:.1f} s)", flush=True)
    data, bound, layout, _ = prepare(model, X)
    problem = chib._Problem(bound, data, layout, True, symmetry.MAX_RELABELLINGS)
    star = problem.configs_of_allocation(bound, data, layout, best)
    log_joint = problem.log_joint(problem.shifted_counts(star))
    for warmup in args.warmup:
        for blocks in args.blocks:
            start = time.perf_counter()
            values = [log_joint - blocked_log_posterior(problem, star, blocks, warmup, args.steps,
                                                        np.random.default_rng([args.key, blocks, warmup, r]))
                      for r in range(args.repeats)]
            print(f"warm-up {warmup}, {blocks} blocks: {np.round(values, 2).tolist()} "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
