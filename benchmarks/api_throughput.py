"""Throughput of three backends through the public API, for the bam_ppl source tree at ``--root``.

Used to compare two revisions in the same run on the same machine: ``git worktree add /tmp/before
REV``, then ``--against /tmp/before`` runs this script for ``--root`` and for the other tree
alternately (``--rounds`` rounds, each process pinned to core ``--cpu`` with ``taskset``), keeps
each figure's best over the rounds and prints the speed-ups (``--root`` against ``--against``):

* collapsed Gibbs (numba kernel): LDA with 20 topics on the Reuters matrix of the ``lda`` package
  (395 × 4258, 84 010 tokens), one chain; token updates per CPU second from t(15 sweeps) − t(5);
* Pólya-urn SMC (numba kernel): NMF rank 10 (a = 10) on 1000 tokens of a 30 × 40 table, 10 000
  particles, one run; CPU seconds of ``bam.log_evidence(method="smc")``;
* VB: NMF rank 10 on the Reuters matrix; iterations per CPU second from t(100) − t(50), tol = 0.

Each figure is the best of ``--repeats`` timings in process CPU time (steadier than wall time on
a shared machine), after a warm-up call (compilation). Prints one JSON line.

Usage: ``python benchmarks/api_throughput.py --root /tmp/before`` (one tree, one JSON line), or
``python benchmarks/api_throughput.py --against /tmp/before --rounds 3`` (both trees, interleaved).
"""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path


def cpu_seconds(call, repeats: int) -> float:
    """Best process CPU time of ``call()`` over ``repeats`` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        call()
        best = min(best, time.process_time() - start)
    return best


# figure: True where larger is faster
FIGURES = {"gibbs_tokens_per_cpu_s": True, "smc_cpu_s": False, "vb_iters_per_cpu_s": True}


def compare(args):
    """Both trees in alternating pinned processes; each figure's best over the rounds, and the ratio."""
    trees = {"root": str(Path(args.root).resolve()), "against": str(Path(args.against).resolve())}
    results = {side: [] for side in trees}
    for round_ in range(args.rounds):
        for side, tree in trees.items():
            command = [sys.executable, __file__, "--root", tree, "--repeats", str(args.repeats)]
            if args.cpu >= 0:
                command = ["taskset", "-c", str(args.cpu), *command]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            results[side].append(json.loads(out.strip().splitlines()[-1]))
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    print(f"| figure | {trees['root']} | {trees['against']} | speed-up |")
    print("|---|---|---|---|")
    for key, larger_faster in FIGURES.items():
        pick = max if larger_faster else min
        best = {side: pick(r[key] for r in results[side]) for side in trees}
        speed_up = best["root"] / best["against"] if larger_faster else best["against"] / best["root"]
        print(f"| {key} | {best['root']:.4g} | {best['against']:.4g} | {speed_up:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent),
                        help="source tree whose bam_ppl is timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", default=None, help="a second source tree, timed alternately with --root")
    parser.add_argument("--rounds", type=int, default=3, help="with --against: alternations of the two trees")
    parser.add_argument("--cpu", type=int, default=0, help="with --against: core to pin to (-1: not pinned)")
    args = parser.parse_args()
    if args.against:
        return compare(args)
    root = str(Path(args.root).resolve())
    sys.path.insert(0, root)
    warnings.filterwarnings("ignore")
    import lda
    import numpy as np

    import bam_ppl as bam

    if not bam.__file__.startswith(root):
        raise SystemExit(f"imported bam_ppl from {bam.__file__}, not from {root}")
    X = lda.datasets.load_reuters()
    out = {"root": root}

    lda_model = bam.AllocationModel("d -> k -> w", latent={"k": 20}, observed=("d", "w"), condition_on="d",
                                    priors={"k": 0.1, "w": 0.01})

    def gibbs(sweeps):
        bam.infer(lda_model, X, method="gibbs", num_warmup=sweeps, num_samples=1, num_chains=1,
                  progress_bar=False)

    gibbs(1)
    seconds = cpu_seconds(lambda: gibbs(15), args.repeats) - cpu_seconds(lambda: gibbs(5), args.repeats)
    out["gibbs_tokens_per_cpu_s"] = float(X.sum()) * 10 / seconds

    rng = np.random.default_rng(0)
    Y = rng.multinomial(1000, rng.dirichlet(np.ones(30 * 40))).reshape(30, 40)

    def smc():
        bam.log_evidence(bam.models.nmf(10, a=10.0), Y, method="smc", num_particles=10_000, num_chains=1,
                         progress_bar=False)

    smc()
    out["smc_cpu_s"] = cpu_seconds(smc, args.repeats)

    # Iterations alone: no merge-and-birth moves after them, where the tree has them.
    try:
        from bam_ppl.infer.variational.vb import vb as vb_backend
    except ImportError:  # an older tree's layout, without the moves
        moves = {}
    else:
        moves = {"num_moves": 0} if "num_moves" in inspect.signature(vb_backend).parameters else {}

    def vb(iterations):
        bam.infer(bam.models.nmf(10), X, method="vb", num_iters=iterations, tol=0.0, num_samples=1,
                  progress_bar=False, **moves)

    for iterations in (25, 50, 100):
        vb(iterations)  # compiles the chunk sizes used below
    seconds = cpu_seconds(lambda: vb(100), args.repeats) - cpu_seconds(lambda: vb(50), args.repeats)
    out["vb_iters_per_cpu_s"] = 50 / seconds
    print(json.dumps(out))


if __name__ == "__main__":
    main()
