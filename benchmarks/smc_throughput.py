"""SMC throughput in particle-token updates per second (CP on a 20×25×30 tensor, T tokens).

Compile time (first call) is reported separately from the steady-state rate, which is the best of
``--repeats`` calls in wall-clock and in process CPU time (the CPU time is the steadier figure
on a shared machine). For each kernel of ``--kernels`` (numba, jax) two variants are timed:
``<kernel>-ev`` (``keep_particles=False``, what ``bam.log_evidence`` runs) and ``<kernel>-full``
(also the final resampled particles, what ``bam.infer`` needs for the posterior).
``--baseline REV`` also times ``bam_ppl/infer/smc/polya_urn.py``
as it was at git revision REV, interleaved with the current code on the same data, and prints
the speed-up.

    python benchmarks/smc_throughput.py --ranks 5 10 50 --particles 100 1000 10000 --tokens 1000
    python benchmarks/smc_throughput.py --ranks 10 --particles 1000 --baseline 33781ca
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from functools import partial
from pathlib import Path

import bam_ppl as bam
import bam_ppl.evidence
from bam_ppl.infer.smc import polya_urn as smc

REPOSITORY = Path(__file__).resolve().parent.parent
MODULE_PATH = "bam_ppl/infer/smc/polya_urn.py"


def load_revision(revision: str) -> types.ModuleType:
    """``bam_ppl.infer.smc.polya_urn`` as it was at git ``revision``, loaded beside the current module.

    Its backends are not registered again (the registry keeps the current ones). The revision must
    have the module at the same path, with the same sibling modules (for revisions before the
    ``infer/smc/`` layout, time a ``git worktree`` of that revision instead).
    """
    source = subprocess.run(["git", "show", f"{revision}:{MODULE_PATH}"], cwd=REPOSITORY,
                            capture_output=True, text=True, check=True).stdout
    name = "bam_ppl.infer.smc._polya_urn_at_" + revision.replace("^", "_").replace("~", "_")
    module = types.ModuleType(name)
    module.__package__ = "bam_ppl.infer.smc"
    sys.modules[name] = module
    registry = sys.modules["bam_ppl.infer.registry"]
    saved = registry.register, bam_ppl.evidence.register_evidence
    registry.register = bam_ppl.evidence.register_evidence = lambda *args, **kwargs: (lambda fn: fn)
    try:
        exec(compile(source, f"{revision}:{MODULE_PATH}", "exec"), module.__dict__)
    finally:
        registry.register, bam_ppl.evidence.register_evidence = saved
    return module


def time_versions(versions, model, X, repeats, options):
    """Per version: (compile s, best wall s, best CPU s, fraction resampled).

    Every version is compiled first; the steady-state calls then alternate between versions so
    that a change in the machine's load affects all of them alike.
    """
    first, walls, cpus, resampled = {}, {}, {}, {}
    for name, run_smc in versions.items():
        t0 = time.perf_counter()
        run_smc(model, X, 0, **options)
        first[name] = time.perf_counter() - t0
        walls[name], cpus[name] = [], []
    for rep in range(repeats):
        for name, run_smc in versions.items():
            t0, c0 = time.perf_counter(), time.process_time()
            result = run_smc(model, X, rep + 1, **options)
            walls[name].append(time.perf_counter() - t0)
            cpus[name].append(time.process_time() - c0)
            resampled[name] = float(result.resampled.mean())
    return {name: (first[name] - min(walls[name]), min(walls[name]), min(cpus[name]), resampled[name])
            for name in versions}


def timed_versions(baseline: str | None, kernels=("numba", "jax")) -> dict:
    """``run_smc`` variants to time, per kernel: the evidence path (what ``bam.log_evidence``
    runs) and the full run that also returns the final particles for the posterior; optionally
    ``baseline``'s (which always returns them)."""
    versions = {}
    for kernel in kernels:
        versions[f"{kernel}-ev"] = partial(smc.run_smc, keep_particles=False, kernel=kernel)
        versions[f"{kernel}-full"] = partial(smc.run_smc, kernel=kernel)
    if baseline:
        versions[baseline] = load_revision(baseline).run_smc
    return versions


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[5, 10, 50])
    parser.add_argument("--particles", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=1)
    parser.add_argument("--a", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="git revision of smc.py to compare against")
    parser.add_argument("--kernels", nargs="+", default=["numba", "jax"], choices=["numba", "jax"])
    args = parser.parse_args()
    versions = timed_versions(args.baseline, args.kernels)
    print(f"{'R':>3} {'P':>6} {'version':>10} {'compile s':>10} {'wall s':>7} {'cpu s':>7} "
          f"{'upd/s wall':>10} {'upd/s cpu':>10} {'resampled':>9} {'speed-up cpu':>12}")
    for rank in args.ranks:
        model = bam.models.cp(rank, a=args.a)
        _, X = model.sample(0, shape=(20, 25, 30), total=args.tokens)
        for particles in args.particles:
            options = dict(num_particles=particles, num_chains=args.chains, progress_bar=False)
            updates = args.tokens * particles * args.chains
            rows = time_versions(versions, model, X, args.repeats, options)
            for name, (compile_s, wall, cpu, resampled) in rows.items():
                ratio = rows[args.baseline][2] / cpu if args.baseline else float("nan")
                print(f"{rank:>3} {particles:>6} {name:>10} {compile_s:>10.2f} {wall:>7.3f} {cpu:>7.3f} "
                      f"{updates / wall:>10.3g} {updates / cpu:>10.3g} {resampled:>9.3f} {ratio:>12.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
