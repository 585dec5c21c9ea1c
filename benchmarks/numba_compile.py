"""How long compiling the numba kernels takes on a fresh installation: ``python -m bam_ppl.precompile``
(the first step of ``make test``) on an empty kernel cache, for this working tree and for a baseline
revision (a git worktree of it), alternately, in the same run on the same machine.

Each round removes the cached kernels (``*.nbi``, ``*.nbc`` under ``bam_ppl/``) of the side it is about
to time, so every timing compiles everything; the best and all wall seconds of each side are printed.

With ``--method M``, each timing is instead one fresh process's first ``bam.log_evidence(method=M)`` on
NMF(2) over a 3 × 4 table (imports excluded): what a user's first call of that estimator compiles.

Usage: ``python benchmarks/numba_compile.py --baseline 00fd913 --rounds 2`` (``--method chib``)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clear_kernels(tree: Path) -> None:
    for path in (tree / "bam_ppl").rglob("*"):
        if path.suffix in (".nbi", ".nbc"):
            path.unlink()


FIRST_CALL = """
import sys, time, warnings
warnings.simplefilter("ignore")
import numpy as np
import bam_ppl as bam
began = time.perf_counter()
bam.log_evidence(bam.models.nmf(2), np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]]), method=sys.argv[1])
print(time.perf_counter() - began)
"""


def compile_seconds(tree: Path, jobs: int, method: str | None = None) -> float:
    """Wall seconds of ``python -m bam_ppl.precompile`` run in ``tree`` (its package first on the path), or of
    a fresh process's first ``bam.log_evidence(method=method)`` there."""
    clear_kernels(tree)
    env = dict(os.environ, PYTHONPATH=str(tree))
    if method is not None:
        done = subprocess.run([sys.executable, "-c", FIRST_CALL, method], cwd=tree, env=env, check=True,
                              capture_output=True, text=True)
        return float(done.stdout.split()[-1])
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bam_ppl.precompile", "--jobs", str(jobs)], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2, help="processes of the precompile step (make test: 2)")
    parser.add_argument("--method", help="time a fresh process's first bam.log_evidence(method=...) instead")
    args = parser.parse_args()
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as folder:
        worktree = Path(folder) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.baseline], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            sides = {f"this tree ({revision})": ROOT, f"baseline ({args.baseline})": worktree}
            seconds = {name: [] for name in sides}
            for _ in range(args.rounds):
                for name, tree in sides.items():
                    seconds[name].append(compile_seconds(tree, args.jobs, args.method))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    what = (f"a first bam.log_evidence(method={args.method!r})" if args.method else
            f"python -m bam_ppl.precompile --jobs {args.jobs}")
    print(f"{what} on an empty kernel cache, {os.cpu_count()} cores")
    print("| side | best s | all s |\n|---|---|---|")
    for name, values in seconds.items():
        print(f"| {name} | {min(values):.0f} | {', '.join(f'{v:.0f}' for v in values)} |")


if __name__ == "__main__":
    main()
