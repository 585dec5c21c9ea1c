"""Collapsed Gibbs throughput: bam_ppl ``method="gibbs"`` against tomotopy's ``LDAModel``.

Both samplers run LDA with the same symmetric priors (document–topic α, topic–word η) and the same
number of topics on the Reuters document–word matrix shipped by the ``lda`` package (395 × 4258,
84 010 tokens), tomotopy with one worker. Tokens per second = tokens × sweeps / seconds, measured
side by side in one run after each sampler's warm-up (compilation for bam_ppl), as the best of
several interleaved timings, both in wall-clock time and in CPU time of the process (the latter is
steadier on a shared machine; for multithreaded samplers it sums the threads). bam_ppl runs with
each sweep kernel: ``jax`` (a ``lax.scan`` over tokens; several chains vmapped, "vectorized", or
one after another, "sequential"), ``numba`` (a compiled loop; several chains in parallel
threads or one after another; for LDA the factorised sweep) and ``numba-general`` (the numba
loop every model can use, for comparison).
Several chains are reported as token updates per second over all chains.

bam_ppl visits the tokens in a fresh random order every sweep (``token_order="random"``, the
default of ``method="gibbs"``) or in data order (``"fixed"``: document by document, as tomotopy).

Usage: ``python benchmarks/gibbs_vs_tomotopy.py [--topics 20] [--kernels jax numba]
[--token-order random] [--sweeps 10] [--reference-sweeps 200] [--chains 1 4] [--repeats 3]``
(tomotopy is timed over more sweeps because each of its sweeps is short).
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
from bam_ppl.infer.gibbs import collapsed as gibbs_core
from bam_ppl.infer.gibbs import collapsed_numba as gibbs_numba


def _timed(advance):
    """(wall seconds, process CPU seconds) of ``advance()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    advance()
    return time.perf_counter() - wall, time.process_time() - cpu


def _lda_problem(data, topics, alpha, eta, token_order):
    model = bam.AllocationModel("d -> k -> w", latent={"k": topics}, observed=("d", "w"),
                                condition_on="d", priors={"k": alpha, "w": eta})
    bound = model.bind(data)
    return gibbs_core.build_problem(bound, data, bound.cell_layout(data), token_order)


class BamSampler:
    """Compiled bam_ppl JAX sweeps of ``chains`` chains of LDA on ``data``."""

    def __init__(self, data, topics, alpha, eta, token_order, sweeps, chains, chain_method):
        self.spec, self.problem = _lda_problem(data, topics, alpha, eta, token_order)
        self.tokens, self.sweeps, self.chains = data.total, sweeps, chains
        self.chain_method = chain_method
        with jax.enable_x64(True):
            self.keys = jax.random.split(jax.random.PRNGKey(0), chains)
            self.states = gibbs_core._init_chains(self.spec, self.problem, self.keys, "uniform")
            self.done = 0
            self.tokens_per_second()  # compiles

    def tokens_per_second(self):
        """(wall, CPU) token updates per second over all chains."""

        def advance():
            self.states = jax.block_until_ready(gibbs_core._advance(
                self.spec, self.problem, self.keys, self.states, self.done, self.sweeps, self.chain_method))

        with jax.enable_x64(True):
            seconds = _timed(advance)
        self.done += self.sweeps
        return tuple(self.tokens * self.sweeps * self.chains / s for s in seconds)


class NumbaSampler:
    """bam_ppl numba sweeps of ``chains`` chains of LDA on ``data``, in threads if ``parallel``."""

    def __init__(self, data, topics, alpha, eta, token_order, sweeps, chains, parallel, factorised=True):
        spec, problem = _lda_problem(data, topics, alpha, eta, token_order)
        keys = np.asarray(jax.random.split(jax.random.PRNGKey(0), chains))
        self.chains = gibbs_numba.NumbaChains(spec, problem, keys, keys, "uniform", parallel=parallel,
                                              factorised=factorised)
        self.tokens, self.sweeps, self.num_chains = data.total, sweeps, chains
        self.chains.advance(1)  # compiles (or loads numba's cache)

    def tokens_per_second(self):
        """(wall, CPU) token updates per second over all chains."""
        seconds = _timed(lambda: self.chains.advance(self.sweeps))
        return tuple(self.tokens * self.sweeps * self.num_chains / s for s in seconds)


class TomotopySampler:
    """tomotopy ``LDAModel`` with one worker on the same documents."""

    def __init__(self, X, topics, alpha, eta, sweeps):
        self.model = tomotopy.LDAModel(k=topics, alpha=alpha, eta=eta, seed=0)
        for row in X:
            self.model.add_doc([str(w) for w in np.repeat(np.arange(X.shape[1]), row)])
        self.model.optim_interval = 0
        self.model.train(1, workers=1)  # builds the corpus and initialises the chain
        self.tokens, self.sweeps = int(X.sum()), sweeps

    def tokens_per_second(self):
        """(wall, CPU) tokens per second."""
        seconds = _timed(lambda: self.model.train(self.sweeps, workers=1, parallel=tomotopy.ParallelScheme.NONE))
        return tuple(self.tokens * self.sweeps / s for s in seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, nargs="+", default=[20])
    parser.add_argument("--kernels", nargs="+", choices=("jax", "numba", "numba-general"),
                        default=["jax", "numba"])
    parser.add_argument("--token-order", choices=("random", "fixed"), default="random")
    parser.add_argument("--sweeps", type=int, default=10)
    parser.add_argument("--reference-sweeps", type=int, default=200)
    parser.add_argument("--chains", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--eta", type=float, default=0.01)
    args = parser.parse_args()
    X = lda.datasets.load_reuters()
    data = as_count_tensor(X)
    print(f"Reuters {X.shape[0]}x{X.shape[1]}, {data.total} tokens, {data.nnz} nonzero cells; "
          f"{args.sweeps} sweeps per timing (tomotopy {args.reference_sweeps}), best of "
          f"{args.repeats} interleaved timings; alpha={args.alpha}, eta={args.eta}; bam_ppl token order "
          f"{args.token_order}")
    header = (f"{'K':>4} {'sampler':<30} {'tokens/s':>10} {'ratio':>7} {'CPU tokens/s':>13} {'CPU ratio':>10}")
    print(header)
    print("-" * len(header))
    for topics in args.topics:
        samplers = {"tomotopy (1 worker)": TomotopySampler(X, topics, args.alpha, args.eta,
                                                           args.reference_sweeps)}
        for chains in args.chains:
            for kernel in ("numba", "numba-general"):
                if kernel not in args.kernels:
                    continue
                for parallel in (True,) if chains == 1 else (True, False):
                    label = f"bam_ppl {kernel} x{chains}" + ("" if chains == 1 else " threads" if parallel
                                                             else " sequential")
                    samplers[label] = NumbaSampler(data, topics, args.alpha, args.eta, args.token_order,
                                                   args.sweeps, chains, parallel, kernel == "numba")
            if "jax" in args.kernels:
                for method in ("vectorized",) if chains == 1 else ("vectorized", "sequential"):
                    label = f"bam_ppl jax x{chains}" + (f" {method}" if chains > 1 else "")
                    samplers[label] = BamSampler(data, topics, args.alpha, args.eta, args.token_order,
                                                args.sweeps, chains, method)
        # Interleaving the timings spreads the load of a shared machine over all samplers.
        best = {label: (0.0, 0.0) for label in samplers}
        for _ in range(args.repeats):
            for label, sampler in samplers.items():
                best[label] = tuple(map(max, best[label], sampler.tokens_per_second()))
        wall_reference, cpu_reference = best["tomotopy (1 worker)"]
        for label, (wall, cpu) in best.items():
            print(f"{topics:>4} {label:<30} {wall:>10.3g} {wall / wall_reference:>7.3f} {cpu:>13.3g} "
                  f"{cpu / cpu_reference:>10.3f}")
        for sampler in samplers.values():
            if isinstance(sampler, NumbaSampler):
                sampler.chains.close()


if __name__ == "__main__":
    main()
