"""SMC throughput in particle-token updates per second (CP on a 20×25×30 tensor, T tokens).

Compile time (first call) is reported separately from the steady-state rate, which is the best of
``--repeats`` calls in wall-clock and in process CPU time (the CPU time is the steadier figure
on a shared machine). For each kernel of ``--kernels`` (numba, jax) two variants are timed:
``<kernel>-ev`` (``keep_particles=False``, what ``bam.log_evidence`` runs) and ``<kernel>-full``
(also the final resampled particles, what ``bam.infer`` needs for the posterior).
``--baseline REV`` also times ``bam_ppl/infer/smc/polya_urn.py``
as it was at git revision REV, interleaved with the current code on the same data, and prints
the speed-up (CPU time of the baseline / CPU time of each version). ``--baseline-tree REV``
does the same for any older revision, including those before the ``infer/smc/`` layout: the
whole ``bam_ppl`` package of REV (``git archive``) runs in a worker process that times its own
``run_smc`` calls on the same data, interleaved call by call with the current code.

The process (and the worker) is pinned to one core (``--cpu``, default 0; ``--cpu -1`` leaves
it unpinned) before JAX and numba start, and every figure is the best of ``--repeats`` calls.

    python benchmarks/smc_throughput.py --ranks 5 10 50 --particles 100 1000 10000 --tokens 1000
    python benchmarks/smc_throughput.py --ranks 10 --particles 1000 --baseline 33781ca
    python benchmarks/smc_throughput.py --ranks 10 --particles 1000 --repeats 5 --kernels numba --baseline-tree acceb04
"""

from __future__ import annotations

from peer_timing import cpu_from_argv, pin_process

pin_process(cpu_from_argv())

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from peer_timing import machine, revision  # noqa: E402

import bam_ppl as bam  # noqa: E402
import bam_ppl.evidence  # noqa: E402
from bam_ppl.infer.smc import polya_urn as smc  # noqa: E402

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


# The worker of --baseline-tree: bam_ppl of an older revision, imported from its own tree.
WORKER = r"""
import inspect, json, sys, time
import numpy as np
import bam_ppl as bam
try:
    from bam_ppl.infer.smc.polya_urn import run_smc
except ImportError:
    from bam_ppl.infer.smc import run_smc
accepted = set(inspect.signature(run_smc).parameters)
print(json.dumps({"ready": bam.__file__}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    X = np.load(request["data"])
    model = bam.models.cp(request["rank"], a=request["a"])
    options = {k: v for k, v in request["options"].items() if k in accepted}
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_smc(model, X, request["key"], **options)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"wall": wall, "cpu": cpu, "resampled": float(np.mean(result.resampled)),
                      "log_z": float(np.mean(result.chain_log_evidence))}), flush=True)
"""

# CP models handed to a tree worker, by id: the worker builds its own from (rank, a).
MODEL_SPECS: dict[int, dict] = {}


class TreeWorker:
    """``run_smc`` of bam_ppl at git ``revision``, in a worker process over its own exported tree.

    Called like ``run_smc(model, X, key, **options)``; the worker times the call itself, so the
    result carries ``timing`` = (wall s, CPU s) and the parent's clocks are not used.
    """

    def __init__(self, revision: str):
        self.revision = revision
        self._dir = tempfile.TemporaryDirectory(prefix="bam_ppl_at_")
        tree = Path(self._dir.name)
        archive = subprocess.run(["git", "archive", revision, "bam_ppl"], cwd=REPOSITORY,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        self._data, self._data_id = tree / "X.npy", None
        env = dict(os.environ, PYTHONPATH=str(tree))
        self._process = subprocess.Popen([sys.executable, "-u", "-c", WORKER], cwd=tree, env=env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        where = self._reply()["ready"]
        if not Path(where).resolve().is_relative_to(tree.resolve()):
            raise RuntimeError(f"the worker imported bam_ppl from {where}, not from {tree}")

    def _reply(self) -> dict:
        for line in self._process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"the worker for {self.revision} ended (exit {self._process.wait()})")

    def __call__(self, model, X, key, **options):
        if self._data_id is not X:
            np.save(self._data, np.asarray(X))
            self._data_id = X
        request = dict(data=str(self._data), key=int(key), options=options, **MODEL_SPECS[id(model)])
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        reply = self._reply()
        return types.SimpleNamespace(resampled=np.asarray(reply["resampled"]), timing=(reply["wall"], reply["cpu"]),
                                     chain_log_evidence=np.asarray([reply["log_z"]]))


def time_versions(versions, model, X, repeats, options):
    """Per version: (compile s, best wall s, best CPU s, fraction resampled).

    Every version is compiled first; the steady-state calls then alternate between versions so
    that a change in the machine's load affects all of them alike.
    """
    first, walls, cpus, resampled = {}, {}, {}, {}
    for name, run_smc in versions.items():
        _, first[name], _ = timed_call(run_smc, model, X, 0, options)
        walls[name], cpus[name] = [], []
    for rep in range(repeats):
        for name, run_smc in versions.items():
            result, wall, cpu = timed_call(run_smc, model, X, rep + 1, options)
            walls[name].append(wall)
            cpus[name].append(cpu)
            resampled[name] = float(result.resampled.mean())
    return {name: (first[name] - min(walls[name]), min(walls[name]), min(cpus[name]), resampled[name])
            for name in versions}


def timed_call(run_smc, model, X, key, options):
    """(result, wall s, CPU s) of one call; a worker's own timing where it reports one."""
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_smc(model, X, key, **options)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return (result, *getattr(result, "timing", (wall, cpu)))


def timed_versions(baseline: str | None, kernels=("numba", "jax"), baseline_tree: str | None = None) -> dict:
    """``run_smc`` variants to time, per kernel: the evidence path (what ``bam.log_evidence``
    runs) and the full run that also returns the final particles for the posterior; optionally
    ``baseline``'s (which always returns them)."""
    versions = {}
    for kernel in kernels:
        versions[f"{kernel}-ev"] = partial(smc.run_smc, keep_particles=False, engine=kernel)
        versions[f"{kernel}-full"] = partial(smc.run_smc, engine=kernel)
    if baseline:
        versions[baseline] = load_revision(baseline).run_smc
    if baseline_tree:
        # the older code with the same options as the current evidence path, where it takes them
        worker = TreeWorker(baseline_tree)
        versions[f"{baseline_tree}-ev"] = partial(worker, keep_particles=False, kernel=kernels[0])
    return versions


def baseline_name(args) -> str | None:
    """The version the speed-up column divides by."""
    if args.baseline:
        return args.baseline
    return f"{args.baseline_tree}-ev" if args.baseline_tree else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[5, 10, 50])
    parser.add_argument("--particles", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=1)
    parser.add_argument("--a", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="git revision of smc.py to compare against")
    parser.add_argument("--baseline-tree", default=None,
                        help="git revision of the whole package to compare against, run in a worker process")
    parser.add_argument("--kernels", nargs="+", default=["numba", "jax"], choices=["numba", "jax"])
    parser.add_argument("--cpu", type=int, default=0, help="core to pin to (-1: not pinned)")
    args = parser.parse_args()
    versions = timed_versions(args.baseline, args.kernels, args.baseline_tree)
    base = baseline_name(args)
    print(f"bam_ppl {revision()}; machine: {machine()}; best of {args.repeats}")
    print(f"{'R':>3} {'P':>6} {'version':>10} {'compile s':>10} {'wall s':>7} {'cpu s':>7} "
          f"{'upd/s wall':>10} {'upd/s cpu':>10} {'resampled':>9} {'speed-up cpu':>12}")
    for rank in args.ranks:
        model = bam.models.cp(rank, a=args.a)
        MODEL_SPECS[id(model)] = dict(rank=rank, a=args.a)
        _, X = model.sample(0, shape=(20, 25, 30), total=args.tokens)
        for particles in args.particles:
            options = dict(num_particles=particles, num_chains=args.chains, progress_bar=False)
            updates = args.tokens * particles * args.chains
            rows = time_versions(versions, model, X, args.repeats, options)
            for name, (compile_s, wall, cpu, resampled) in rows.items():
                ratio = rows[base][2] / cpu if base else float("nan")
                print(f"{rank:>3} {particles:>6} {name:>10} {compile_s:>10.2f} {wall:>7.3f} {cpu:>7.3f} "
                      f"{updates / wall:>10.3g} {updates / cpu:>10.3g} {resampled:>9.3f} {ratio:>12.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
