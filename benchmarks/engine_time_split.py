"""Where one call of the default evidence engine spends its time, on NMF(4) at T tokens and on other cases.

Seconds of each run's three steps (its VB fits, its search, its annealing: the functions of
``bam_ppl.infer.smc.mixture`` timed where the call makes them, by the wall clock of the thread that runs the
run, summed over the runs: the runs share out the cores, so the three add up to about the call's wall seconds
times the threads that run them) and the CPU seconds of the searches' three
parts (the annealed scouts, every start's chain until an earlier reference covers it or halfway, the second
halves of the chains that build references), summed over the threads that run them; then the annealing's
moves by kind (the wall seconds of each move of the particles, the Gibbs sweeps and the moves of whole cells'
splits, summed over the runs). Data and model: ``benchmarks/evidence_engine.py``'s cases (``nmf<T>``, NMF(4) on 50 × 70 counts,
and ``--data`` names such as ``titanic``), or with ``--model`` a constructor of ``bam.models`` on a table it simulates
(``model.sample(key(0), shape=--shape, total=--total)``, as ``benchmarks/sandwich.py`` does); a warm-up call on other
data first, outside the timings. The last column: each run's temperatures.

    .venv/bin/python benchmarks/engine_time_split.py --tokens 1000 4000 --data hair_eye titanic ucb
    .venv/bin/python benchmarks/engine_time_split.py --tokens --model "tucker((3, 3), a=20.0)" --shape 15 15 --total 3000
"""

from __future__ import annotations

import argparse
import collections
import threading
import time
import warnings

import jax
from evidence_engine import CASE_CODE, TABLES
from sandwich import model_from_text

import bam_ppl as bam
from bam_ppl.infer.smc import mixture
from bam_ppl.infer.smc.mixture_start import MixtureParticles

SECONDS = collections.Counter()
_LOCK = threading.Lock()


def timed(name, fn, clock):
    def wrapper(*args, **kwargs):
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            with _LOCK:
                SECONDS[name] += clock() - start
    return wrapper


def timed_steps(name, steps, clock):
    """:func:`timed` for a generator function (the engine's steps, ``bam_ppl.infer.smc.references.drive``): the
    clock from its first step to its return, in the thread that drives it."""
    def wrapper(*args, **kwargs):
        start = clock()
        try:
            return (yield from steps(*args, **kwargs))
        finally:
            with _LOCK:
                SECONDS[name] += clock() - start
    return wrapper


def instrument():
    """Wrap the engine's steps in place: wall clock for the steps, each thread's CPU clock for the searches' parts.
    A thread's two runs are driven one after the other, their chains swept apart, so that no other run's steps
    fall within a timed one."""
    mixture.drive_pair = lambda first, second: [mixture.drive(first), mixture.drive(second)]
    mixture.vb_start_configs = timed("VB fits (s)", mixture.vb_start_configs, time.perf_counter)
    mixture.run_search = timed_steps("searches (s)", mixture.run_search, time.perf_counter)
    mixture.run_mixture = timed("annealing (s)", mixture.run_mixture, time.perf_counter)
    mixture.scout = timed_steps("starts (CPU s)", mixture.scout, time.thread_time)
    mixture.averaged_reference_steps = timed_steps("chains' second halves (CPU s)", mixture.averaged_reference_steps,
                                                   time.thread_time)
    one_run = mixture._one_run

    def scout_or_run(particles, *args, **kwargs):
        if particles.num_particles > mixture.ENGINE.scout_particles:  # a run: its moves run in other threads
            return one_run(particles, *args, **kwargs)
        return timed("annealed scouts (CPU s)", one_run, time.thread_time)(particles, *args, **kwargs)

    mixture._one_run = scout_or_run
    move = MixtureParticles.move

    def move_by_kind(particles, beta, num_sweeps):
        if particles.num_particles <= mixture.ENGINE.scout_particles:  # a scout's, timed with the searches
            return move(particles, beta, num_sweeps)
        cells = particles.split_problem is not None and particles.num_moves % 2 == 0  # the next move's kind
        column = "cell moves (s)" if cells else "sweeps (s)"
        return timed(column, move, time.perf_counter)(particles, beta, num_sweeps)

    MixtureParticles.move = move_by_kind


COLUMNS = ("VB fits (s)", "searches (s)", "annealing (s)", "annealed scouts (CPU s)",
           "chains until covered or halfway (CPU s)", "chains' second halves (CPU s)", "sweeps (s)", "cell moves (s)")


def case(name: str):
    """(model, X) of ``evidence_engine.py``'s case ``name`` (``nmf<T>``, ``hair_eye``, ``titanic``, ``ucb``)."""
    namespace = {}
    exec(CASE_CODE, namespace)  # noqa: S102 — the cases evidence_engine.py times
    return namespace["case"](name, TABLES)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1000, 4000], help="NMF(4) at these T")
    parser.add_argument("--data", nargs="*", default=[], help="other cases of evidence_engine.py, e.g. titanic ucb")
    parser.add_argument("--key", type=int, default=0)
    parser.add_argument("--model", nargs="*", default=[], help="constructors of bam.models, e.g. \"tucker((3, 3))\"")
    parser.add_argument("--shape", type=int, nargs="+", default=[50, 70], help="the shape of --model's simulated table")
    parser.add_argument("--total", type=int, default=3000, help="the tokens of --model's simulated table")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    bam.log_evidence(*case("nmf1200"), rng_key=99)  # warm-up: the kernels compiled or read from numba's cache
    instrument()
    print("| data | value | wall s | " + " | ".join(COLUMNS) + " | temperatures |")
    print("|---|---|---|" + "---|" * (len(COLUMNS) + 1))
    for name in [f"nmf{total}" for total in args.tokens] + args.data + args.model:
        SECONDS.clear()
        if name in args.model:
            model = model_from_text(name)
            _, X = model.sample(jax.random.key(0), shape=tuple(args.shape), total=args.total)
            model_and_data = (model, X)
        else:
            model_and_data = case(name)
        start = time.perf_counter()
        est = bam.log_evidence(*model_and_data, rng_key=args.key)
        wall = time.perf_counter() - start
        SECONDS["chains until covered or halfway (CPU s)"] = (SECONDS["starts (CPU s)"] - SECONDS["annealed scouts (CPU s)"]
                                                            - SECONDS["chains' second halves (CPU s)"])
        parts = [SECONDS[column] for column in COLUMNS]
        temperatures = "–".join(map(str, sorted({min(est.info.kept_info.num_temperatures),
                                                  max(est.info.kept_info.num_temperatures)})))
        print(f"| {name} | {est.value:.2f} ± {est.stderr:.2f} | {wall:.1f} | " + " | ".join(f"{p:.1f}" for p in parts)
              + f" | {temperatures} |", flush=True)


if __name__ == "__main__":
    main()
