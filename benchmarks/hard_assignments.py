"""Does the best *hard* assignment lead to the basin that carries the posterior mass?

A hard assignment makes every latent node a function of the value of its first visible child
(a class per sender and per receiver under Tucker, a topic per word under NMF): all tokens of a
sender share its class. Such allocations form a small discrete space that a greedy search covers
quickly: from random maps, each value of each child in turn moves to the class that raises log π(S)
most (eq. 3.11, the multinomial coefficient included), until no move raises it. The best maps of
``--restarts`` searches each start a reference chain and the default's pilot and main runs of the
tempered SMC from a reference (``auto.AUTO_REFERENCE_PILOT``, ``auto.AUTO_REFERENCE_OPTIONS``),
as the reference stage of ``method="auto"`` does with its own starts.

    .venv/bin/python benchmarks/hard_assignments.py icews "Tucker(4, 4, 1)" --key 2
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from node_moves import log_joint
from real_data_evidence import experiment_model

import bam_ppl as bam
from bam_ppl.infer import auto
from bam_ppl.infer.prepare import prepare
from bam_ppl.infer.smc import tempered


def config_of_maps(tp, child, maps) -> np.ndarray:
    """Token configurations with latent node n at ``maps[n][value of its child]`` (the others 0)."""
    config = np.zeros(child.shape[1], np.int64)
    for n, classes in enumerate(maps):
        config = tp.node_swap[n, config, classes[child[n]]]
    return config


def greedy(tp, child, maps, max_sweeps: int = 50) -> tuple[float, list]:
    """Moves of single child values between classes, the best for each in turn, until none helps."""
    current = log_joint(tp, config_of_maps(tp, child, maps))
    for _ in range(max_sweeps):
        improved = False
        for n, classes in enumerate(maps):
            for value in range(classes.size):
                kept = classes[value]
                for c in range(int(tp.node_size[n])):
                    if c == kept:
                        continue
                    classes[value] = c
                    trial = log_joint(tp, config_of_maps(tp, child, maps))
                    if trial > current + 1e-9:
                        current, kept, improved = trial, c, True
                classes[value] = kept
        if not improved:
            break
    return current, maps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=("abalone", "letters", "icews"))
    parser.add_argument("model")
    parser.add_argument("--key", type=int, default=2)
    parser.add_argument("--restarts", type=int, default=200)
    parser.add_argument("--evaluate", type=int, default=3, help="references from this many of the best maps")
    args = parser.parse_args(argv)
    model, X = experiment_model(args.experiment, args.model)
    data, bound, layout, _ = prepare(model, X)
    tp = tempered.build_tempered_problem(bound, data, layout)
    child = tp.node_child[:, tp.token_cell]  # (latent nodes, T): each token's value of each node's child
    if (child < 0).any():
        raise ValueError("every latent node needs a visible child observed at every cell")
    values = child.max(axis=1) + 1
    rng = np.random.default_rng(args.key)
    start = time.perf_counter()
    found = sorted((greedy(tp, child, [rng.integers(0, size, count) for size, count in zip(tp.node_size, values)])
                    for _ in range(args.restarts)), key=lambda pair: -pair[0])
    print(f"{args.experiment}, {args.model}, key {args.key}: T = {data.total}; {args.restarts} greedy searches "
          f"in {time.perf_counter() - start:.1f} s; best log π(S) {[round(v, 1) for v, _ in found[:10]]}", flush=True)
    for j, (value, maps) in enumerate(found[:args.evaluate]):
        start = time.perf_counter()
        allocation = tempered.best_allocation(bound, data, layout, tp, config_of_maps(tp, child, maps))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference, = tempered.references_from_allocations(model, X, [allocation], args.key + 100 + j)
            pilot = bam.log_evidence(model, X, method="tempered", rng_key=500 + j, reference=reference,
                                     progress_bar=False, **auto.AUTO_REFERENCE_PILOT)
            est = bam.log_evidence(model, X, method="tempered", rng_key=1000 + j, reference=reference,
                                   progress_bar=False, **auto.AUTO_REFERENCE_OPTIONS)
        print(f"hard map {j} (log π(S) {value:.1f}): pilot {pilot.value:.2f}, main runs {est.value:.2f} ± "
              f"{est.stderr:.2f} ({np.round(est.details['run_log_evidence'], 1).tolist()}), "
              f"{time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
