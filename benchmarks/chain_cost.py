"""CPU seconds of a reference chain's sweep, collapsed (a token at a time) and data augmentation (a cell at a
time), against the random numbers each draws, on the data of the evidence benchmarks.

The engine builds its references with the chain whose sweeps draw fewer random numbers, four data-augmentation
sweeps counting as one collapsed sweep (``references.augmented_chain_is_cheaper``). This script checks that proxy
against the time the sweeps take: per case, the draws and CPU ns per draw of each chain, the chain the engine
chooses, and the time of four data-augmentation sweeps over one collapsed sweep (above 1: the collapsed chain is
the cheaper one).

    .venv/bin/python benchmarks/chain_cost.py
"""

from __future__ import annotations

import time
import warnings

import jax
import numpy as np
from evidence_engine import CASE_CODE, TABLES
from evidence_keys import experiment_data, experiment_models

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


def main() -> None:
    warnings.simplefilter("ignore")
    for label, model, X in cases():
        problem, (bound, data, layout) = mixture.mixture_problem(model, X, 100_000)
        with jax.enable_x64(True):
            cells = mixture.host_problem(vb.build_problem(bound, data, layout))
        tokens, draws = problem.tp.token_cell.shape[0], references.augmented_sweep_draws(cells)
        collapsed, augmented = ns_per_sweep(problem.tp, None, tokens), ns_per_sweep(problem.tp, cells, draws)
        factor = mixture.ENGINE.augmented_sweeps
        print(f"{label}: chosen {'augmented' if problem.cells is not None else 'collapsed'}; collapsed {tokens} draws, "
              f"{collapsed / tokens:.1f} ns each; augmented {draws} draws, {augmented / draws:.1f} ns each; "
              f"{factor} augmented sweeps / 1 collapsed: draws {factor * draws / tokens:.2f}, "
              f"time {factor * augmented / collapsed:.2f}", flush=True)


if __name__ == "__main__":
    main()
