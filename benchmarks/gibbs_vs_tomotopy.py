"""Collapsed Gibbs throughput: bam_ppl ``method="gibbs"`` against tomotopy's ``LDAModel``.

Both samplers run LDA with the same symmetric priors (document–topic α, topic–word η) and the same
number of topics on the Reuters document–word matrix shipped by the ``lda`` package (395 × 4258,
84 010 tokens), tomotopy with one worker. Tokens per second = tokens × sweeps / seconds, measured
side by side in one run after each sampler's warm-up (compilation for bam_ppl). bam_ppl is also
timed with several vmapped chains, reported as token updates per second over all chains.

Usage: ``python benchmarks/gibbs_vs_tomotopy.py [--topics 20] [--sweeps 10] [--reference-sweeps 200]
[--chains 1 4]`` (tomotopy is timed over more sweeps because each of its sweeps is short).
"""

from __future__ import annotations

import argparse
import time

import jax
import lda
import numpy as np
import tomotopy

import bam_ppl as bam
from bam_ppl.data import as_count_tensor
from bam_ppl.infer import gibbs as gibbs_core


def bam_tokens_per_second(data, topics, alpha, eta, sweeps, chains):
    model = bam.AllocationModel("d -> k -> w", latent={"k": topics}, observed=("d", "w"),
                                condition_on="d", priors={"k": alpha, "w": eta})
    bound = model.bind(data)
    spec, problem = gibbs_core.build_problem(bound, data, bound.cell_layout(data))
    with jax.enable_x64(True):
        keys = jax.random.split(jax.random.PRNGKey(0), chains)
        states = gibbs_core._init_chains(spec, problem, keys, "uniform")
        # The first call compiles; the timed call reuses the compiled sweeps.
        jax.block_until_ready(gibbs_core._advance(spec, problem, keys, states, 0, sweeps))
        start = time.perf_counter()
        states = gibbs_core._advance(spec, problem, keys, states, sweeps, sweeps)
        jax.block_until_ready(states)
        seconds = time.perf_counter() - start
    return data.total * sweeps * chains / seconds


def tomotopy_tokens_per_second(X, topics, alpha, eta, sweeps):
    model = tomotopy.LDAModel(k=topics, alpha=alpha, eta=eta, seed=0)
    for row in X:
        words = np.repeat(np.arange(X.shape[1]), row)
        model.add_doc([str(w) for w in words])
    model.optim_interval = 0
    model.train(1, workers=1)  # builds the corpus and initialises the chain
    start = time.perf_counter()
    model.train(sweeps, workers=1, parallel=tomotopy.ParallelScheme.NONE)
    seconds = time.perf_counter() - start
    return int(X.sum()) * sweeps / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, nargs="+", default=[20])
    parser.add_argument("--sweeps", type=int, default=10)
    parser.add_argument("--reference-sweeps", type=int, default=200)
    parser.add_argument("--chains", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--eta", type=float, default=0.01)
    args = parser.parse_args()
    X = lda.datasets.load_reuters()
    data = as_count_tensor(X)
    print(f"Reuters {X.shape[0]}x{X.shape[1]}, {data.total} tokens, {data.nnz} nonzero cells, "
          f"{args.sweeps} sweeps (tomotopy {args.reference_sweeps}), alpha={args.alpha}, eta={args.eta}")
    header = f"{'K':>4} {'sampler':<24} {'tokens/s':>12} {'ratio to tomotopy':>18}"
    print(header)
    print("-" * len(header))
    for topics in args.topics:
        reference = tomotopy_tokens_per_second(X, topics, args.alpha, args.eta, args.reference_sweeps)
        print(f"{topics:>4} {'tomotopy (1 worker)':<24} {reference:>12.4g} {1.0:>18.3f}")
        for chains in args.chains:
            rate = bam_tokens_per_second(data, topics, args.alpha, args.eta, args.sweeps, chains)
            label = f"bam_ppl gibbs x{chains} chain" + ("s" if chains > 1 else "")
            print(f"{topics:>4} {label:<24} {rate:>12.4g} {rate / reference:>18.3f}")


if __name__ == "__main__":
    main()
