"""A new session's first PMF fits, this tree against a baseline revision, in the same run on the same machine.

Each side runs in a fresh process per method (``python -c`` with the tree on its path): a categorical table of
5000 samples of 5 variables with 6 categories, 30 % missing (``random_pmf(31, 3, 5, 6)``, ``sample_pmf(32, ...)``),
fitted by ``bam.infer(pmf_tensor(10), X, method=M)`` twice, keys 0 and 1. Prints the wall seconds of both calls
and the XLA programs compiled in each (JAX's compile log): the first call pays for compiling, the second shows
what a user comparing fits pays again. The sides alternate over ``--rounds``; each cell is the best.

    .venv/bin/python benchmarks/pmf_first_call.py --baseline 1412d2d --methods vb svb --rounds 2
"""

from __future__ import annotations

import argparse
import json

from peer_timing import REPOSITORY, revision, revision_trees, run_in_tree

CODE = r'''
import json, logging, re, time, warnings
warnings.simplefilter("ignore")
compiled = []
class Count(logging.Handler):
    def emit(self, record):
        if re.search(r"Finished XLA compilation", record.getMessage()):
            compiled.append(1)
logging.getLogger("jax").addHandler(Count())
logging.getLogger("jax").setLevel(logging.DEBUG)
logging.getLogger("jax").propagate = False
import jax
jax.config.update("jax_log_compiles", True)
import bam_ppl as bam
from bam_ppl.models.pmf import pmf_tensor, random_pmf, sample_pmf
weights, factors = random_pmf(31, 3, 5, 6)
X = sample_pmf(32, weights, factors, 5000, missing_prob=0.3)
out = []
for key in (0, 1):
    before, start = len(compiled), time.perf_counter()
    bam.infer(pmf_tensor(10), X, method=METHOD, rng_key=key, progress_bar=False, num_categories=6)
    out.append((time.perf_counter() - start, len(compiled) - before))
print(json.dumps(out))
'''


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--methods", nargs="+", default=["vb", "svb"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    best = {}
    with revision_trees([args.baseline]) as trees:
        sides = {revision(): str(REPOSITORY), args.baseline: trees[args.baseline]}
        for _ in range(args.rounds):
            for method in args.methods:
                for name, tree in sides.items():
                    calls = json.loads(run_in_tree(tree, CODE.replace("METHOD", repr(method))).strip().splitlines()[-1])
                    old = best.get((method, name))
                    best[(method, name)] = calls if old is None else [min(a, b) for a, b in zip(old, calls)]
    print("| method | revision | first call s (programs) | second call s (programs) |")
    print("|---|---|---|---|")
    for (method, name), calls in best.items():
        print(f"| {method} | {name} | " + " | ".join(f"{s:.1f} ({n})" for s, n in calls) + " |")


if __name__ == "__main__":
    main()
