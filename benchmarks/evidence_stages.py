"""Where one default evidence call spends its time: the wall and CPU seconds of each stage of
``method="auto"`` (tempered SMC from the prior, Chib, VB, reference chains, pilots, main
reference runs, scouts), found by wrapping the stage functions that ``bam_ppl.infer.auto`` calls.

    .venv/bin/python benchmarks/evidence_stages.py --tokens 4000 --key 1
    .venv/bin/python benchmarks/evidence_stages.py --experiment icews --model "Tucker(4, 4, 1)" --key 1
    .venv/bin/python benchmarks/evidence_stages.py --experiment confusion --model "CP(8)" --true-rank 7
    .venv/bin/python benchmarks/evidence_stages.py --experiment abalone --model "CP(8)" --config pilot_particles=32

``--experiment confusion`` takes tensor 0 of ``--true-rank`` and the key of
``benchmarks/rank_confusion.py`` (``--key`` is ignored there).

A warm-up call on other data (NMF(4), T = 1200) comes first, so that numba's caches are loaded;
VB's JAX programs are still compiled for the timed call's data shape, as in a user's first call.
"""

from __future__ import annotations

import argparse
import collections
import re
import time
import warnings

import numpy as np
import rank_confusion as confusion
from evidence_accuracy import data_for
from evidence_keys import with_fields
from real_data_evidence import experiment_model

import bam_ppl as bam
from bam_ppl.infer import auto, registry


def stage_timer(spent: dict):
    """A wrapper that adds the wall and the process's CPU seconds of each call of ``fn`` to
    ``spent[label]`` (a NumPy pair: their ratio is the cores the stage kept busy)."""

    def timed(label, fn):
        def wrapper(*args, **kwargs):
            start = np.array([time.perf_counter(), time.process_time()])
            try:
                return fn(*args, **kwargs)
            finally:
                name = label
                if label == "tempered":
                    origin = "from references" if kwargs.get("reference") is not None else "from the prior"
                    runs = kwargs.get("num_chains") or "default"
                    name = f"tempered {origin}, {kwargs.get('num_particles')} particles, {runs} runs"
                spent[name] += np.array([time.perf_counter(), time.process_time()]) - start
        return wrapper

    return timed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4000, help="synthetic NMF(4) on 50 x 70 counts (default)")
    parser.add_argument("--experiment", choices=("abalone", "letters", "icews", "confusion"), help="real data instead")
    parser.add_argument("--model", default="NMF(4)", help='with --experiment: e.g. "Tucker(4, 4, 1)"')
    parser.add_argument("--key", type=int, default=1)
    parser.add_argument("--true-rank", type=int, default=7, help="with --experiment confusion")
    parser.add_argument("--config", nargs="+", default=[], metavar="FIELD=VALUE",
                        help="fields of AutoConfig (method='auto') for this call, e.g. pilot_particles=32")
    args = parser.parse_args(argv)
    auto.CONFIG = with_fields(auto.CONFIG, args.config)
    warnings.simplefilter("ignore")
    if args.experiment == "confusion":
        rank = int(re.findall(r"\d+", args.model)[0])
        model = bam.models.cp(rank, a=confusion.DEFAULT_A)
        _, X = bam.models.cp(args.true_rank, a=confusion.DEFAULT_A).sample(1000 * args.true_rank,
                                                                          shape=confusion.SHAPE, total=1000)
        args.key = 1000 * args.true_rank * 100 + rank
        label = f"confusion tensor 0 of true rank {args.true_rank}, {args.model}"
    elif args.experiment:
        model, X = experiment_model(args.experiment, args.model)
        label = f"{args.experiment}, {args.model}"
    else:
        model, X = bam.models.nmf(4), data_for(args.tokens, 50, 70, 4, seed=0)
        label = f"NMF(4), 50 x 70, T = {args.tokens}"
    spent = collections.defaultdict(lambda: np.zeros(2))
    timed = stage_timer(spent)
    find = registry.find_evidence
    auto.find_evidence = lambda name, m: timed(name, find(name, m))
    auto.references_from_allocations = timed("reference chains", auto.references_from_allocations)
    bam.log_evidence(bam.models.nmf(4), data_for(1200, 50, 70, 4, seed=1), rng_key=0)  # warm-up
    spent.clear()
    start, cpu = time.perf_counter(), time.process_time()
    est = bam.log_evidence(model, X, rng_key=args.key)
    total, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"{label}, key {args.key}: {est.value:.2f} ± {est.stderr:.2f} ({est.method}), "
          f"VB bound {est.details['vb_bound']:.1f}, {total:.1f} s ({cpu:.1f} CPU s)")
    for name, (seconds, cpu_seconds) in sorted(spent.items(), key=lambda item: -item[1][0]):
        print(f"  {name}: {seconds:.1f} s ({cpu_seconds:.1f} CPU s)")
    for name, part in est.details["parts"].items():
        print(f"  part {name}: {part['value']:.2f} ± {part['stderr']:.2f}, runs {np.round(part['run_log_evidence'], 1)}")


if __name__ == "__main__":
    main()
