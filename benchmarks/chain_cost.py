"""CPU seconds of a reference chain's sweep, collapsed (a token at a time) and data augmentation (a cell at a
time), against the random numbers each draws, on the data of the evidence benchmarks.

The engine builds its references with the chain whose sweeps draw fewer random numbers, four data-augmentation
sweeps counting as one collapsed sweep (``references.augmented_chain_is_cheaper``). This script checks that proxy
against the time the sweeps take: per case, the draws and CPU ns per draw of each chain, the chain the engine
chooses, and the time of four data-augmentation sweeps over one collapsed sweep (above 1: the collapsed chain is
the cheaper one).

With ``--baseline REV`` the same sweeps of that revision (a git worktree, a subprocess importing its bam_ppl) run
beside, and the last column is this revision's CPU ns per collapsed draw over the baseline's: the reference chains'
kernels against a revision whose speed was measured (on Tucker rows, where no factorised sweep serves, the general
urn kernel runs). ``--cases`` keeps the cases whose label starts with one of its words.

    .venv/bin/python benchmarks/chain_cost.py
    .venv/bin/python benchmarks/chain_cost.py --cases icews abalone "NMF(4), T = 4000" --baseline 03ac931
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import jax
import numpy as np
from evidence_engine import CASE_CODE, TABLES
from evidence_keys import experiment_data, experiment_models
from peer_timing import revision, revision_trees, run_in_tree

from bam_ppl.infer.smc import mixture, references
from bam_ppl.infer.variational import vb

NAMESPACE: dict = {}
exec(CASE_CODE, NAMESPACE)  # the cases of evidence_engine.py, as it builds them


def cases():
    for tokens in (1000, 4000, 16000, 64000):
        yield f"NMF(4), T = {tokens}", *NAMESPACE["case"](f"nmf{tokens}", TABLES)
    for experiment, name in (("icews", "Tucker(4, 4, 1)"), ("letters", "NMF(4)"), ("abalone", "CP(8)")):
        rank = int(name.split("(")[1].split(",")[0].rstrip(")"))
        yield f"{experiment} {name}", dict(experiment_models(experiment, 1.0, [rank], small=False))[name], \
            experiment_data(experiment, small=False)
    for name in ("hair_eye", "titanic", "ucb"):
        yield name, *NAMESPACE["case"](name, TABLES)


def ns_per_sweep(tp, cells, draws: int) -> float:
    """CPU ns of one sweep of a chain from the all-zero configuration, over about 2·10⁷ draws."""
    chain = references.start_chain(tp, cells, np.zeros(tp.token_cell.shape[0], np.int64), np.array([1, 2], np.uint32))
    chain.sweep(2)  # compiled, and off the start
    sweeps = max(2, int(2e7 // draws))
    start = time.process_time()
    chain.sweep(sweeps)
    return (time.process_time() - start) / sweeps * 1e9


def measure(prefixes=None) -> list[dict]:
    """Per case (those whose label starts with one of ``prefixes``; all by default): the chain the engine
    chooses, the draws of each chain's sweep and its CPU ns per draw."""
    warnings.simplefilter("ignore")
    rows = []
    for label, model, X in cases():
        if prefixes and not any(label.startswith(prefix) for prefix in prefixes):
            continue
        problem, (bound, data, layout) = mixture.mixture_problem(model, X, 100_000)
        with jax.enable_x64(True):
            cells = mixture.host_problem(vb.build_problem(bound, data, layout))
        tokens, draws = problem.tp.token_cell.shape[0], references.augmented_sweep_draws(cells)
        rows.append(dict(label=label, chosen="augmented" if problem.cells is not None else "collapsed", tokens=tokens,
                         draws=int(draws), collapsed=ns_per_sweep(problem.tp, None, tokens) / tokens,
                         augmented=ns_per_sweep(problem.tp, cells, draws) / draws))
    return rows


def baseline(rev: str, prefixes) -> dict:
    """{label: row} of :func:`measure` run on revision ``rev``'s bam_ppl."""
    code = (f"import json, sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import chain_cost; print(json.dumps(chain_cost.measure({prefixes!r})))")
    with revision_trees([rev]) as trees:
        out = run_in_tree(trees[rev], code)
    return {row["label"]: row for row in json.loads(out.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=None, help="labels' first words, e.g. icews abalone")
    parser.add_argument("--baseline", default=None, help="git revision whose sweeps run beside (e.g. 03ac931)")
    args = parser.parse_args()
    base = baseline(args.baseline, args.cases) if args.baseline else {}
    factor = mixture.ENGINE.augmented_sweeps
    print(f"rev. {revision()}; baseline {args.baseline}")
    for row in measure(args.cases):
        tokens, draws, collapsed, augmented = row["tokens"], row["draws"], row["collapsed"], row["augmented"]
        line = (f"{row['label']}: chosen {row['chosen']}; collapsed {tokens} draws, {collapsed:.1f} ns each; "
                f"augmented {draws} draws, {augmented:.1f} ns each; {factor} augmented sweeps / 1 collapsed: draws "
                f"{factor * draws / tokens:.2f}, time {factor * augmented * draws / (collapsed * tokens):.2f}")
        if row["label"] in base:
            line += (f"; collapsed ns per draw against {args.baseline}: {collapsed:.1f} / "
                     f"{base[row['label']]['collapsed']:.1f} = {collapsed / base[row['label']]['collapsed']:.2f}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
