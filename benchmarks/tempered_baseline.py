"""The tempered SMC's kernel against older revisions, alternating in one run on one pinned core.

``bam.log_evidence(nmf(4), X, method="tempered", rng_key=0)`` on the T = 1000 counts of
``benchmarks/evidence_accuracy.py`` (``--tokens``: other totals drawn alike; 256 particles, 4 runs,
the default schedule; ``--method auto``:
the default engine, whose annealing, scouts and chains run the same kernels), timed in a fresh
process per revision and round, the revisions in turn (``git worktree`` of each, imported from its
own tree), each process pinned to one core (``taskset``) after a warm-up call that compiles the
kernels. Prints every call's CPU seconds, the best per revision and its ratio to this tree's, and
checks that every revision gives the same value (a change of speed, not of results).

    .venv/bin/python benchmarks/tempered_baseline.py --baselines 828272c 5dee45a abe19be 8ed57af 2241569 --rounds 3
    .venv/bin/python benchmarks/tempered_baseline.py --baselines 22a6457 --method auto
    .venv/bin/python benchmarks/tempered_baseline.py --baselines 7c39875 --method auto --tokens 4000 --calls 1 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import shutil

from peer_timing import revision_trees, run_in_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CALL = r"""
import sys, time, warnings
import jax, numpy as np
import bam_ppl as bam
warnings.simplefilter("ignore")
def data(T):
    _, X = bam.models.nmf(4, a=200.0).sample(jax.random.key(0), shape=(50, 70), total=T)
    return np.asarray(X)
model = bam.models.nmf(4)
bam.log_evidence(model, data(1200), method=METHOD, rng_key=99, num_particles=64)  # compiles the kernels
X = data(TOKENS)
for _ in range(CALLS):
    start = time.process_time()
    est = bam.log_evidence(model, X, method=METHOD, rng_key=0)
    print(repr(est.value), time.process_time() - start, flush=True)
"""


def timed(tree: str, core: int, method: str, tokens: int, calls: int) -> list[tuple[float, float]]:
    """(value, CPU seconds) of the timed calls in a fresh process importing bam_ppl from ``tree``."""
    code = CALL.replace("METHOD", repr(method)).replace("TOKENS", str(tokens)).replace("CALLS", str(calls))
    out = run_in_tree(tree, code, core if shutil.which("taskset") else None)
    return [tuple(float(x) for x in line.split()) for line in out.splitlines() if line.strip()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baselines", nargs="+", required=True, help="git revisions to time beside this tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--core", type=int, default=1, help="the core every process is pinned to")
    parser.add_argument("--method", default="tempered", help="the estimator timed (auto: the default engine)")
    parser.add_argument("--tokens", type=int, default=1000, help="the counts' total T")
    parser.add_argument("--calls", type=int, default=2, help="timed calls per process")
    args = parser.parse_args(argv)
    with revision_trees(args.baselines) as baselines:
        trees = {"this tree": ROOT, **baselines}
        seconds, values = {name: [] for name in trees}, {name: set() for name in trees}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                calls = timed(tree, args.core, args.method, args.tokens, args.calls)
                seconds[name] += [s for _, s in calls]
                values[name] |= {v for v, _ in calls}
                print(f"round {round_ + 1}, {name}: CPU s {[round(s, 2) for _, s in calls]}", flush=True)
    mine = min(seconds["this tree"])
    print("| revision | best CPU s | this tree / revision | value |")
    print("|---|---|---|---|")
    for name in trees:
        print(f"| {name} | {min(seconds[name]):.2f} | {mine / min(seconds[name]):.2f} | {sorted(values[name])} |")


if __name__ == "__main__":
    main()
