"""How long compiling the numba kernels takes on a fresh installation: ``python -m bam_ppl.precompile``
(the first step of ``make test``) on an empty kernel cache, for this working tree and for a baseline
revision (a git worktree of it), alternately, in the same run on the same machine.

Each round removes the cached kernels (``*.nbi``, ``*.nbc`` under ``bam_ppl/``) of the side it is about
to time, so every timing compiles everything; the best and all wall seconds of each side are printed.

Usage: ``python benchmarks/numba_compile.py --baseline 00fd913 --rounds 2``
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


def compile_seconds(tree: Path, jobs: int) -> float:
    """Wall seconds of ``python -m bam_ppl.precompile`` run in ``tree`` (its package first on the path)."""
    clear_kernels(tree)
    env = dict(os.environ, PYTHONPATH=str(tree))
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bam_ppl.precompile", "--jobs", str(jobs)], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git revision to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2, help="processes of the precompile step (make test: 2)")
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
                    seconds[name].append(compile_seconds(tree, args.jobs))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    print(f"python -m bam_ppl.precompile --jobs {args.jobs} on an empty kernel cache, {os.cpu_count()} cores")
    print("| side | best s | all s |\n|---|---|---|")
    for name, values in seconds.items():
        print(f"| {name} | {min(values):.0f} | {', '.join(f'{v:.0f}' for v in values)} |")


if __name__ == "__main__":
    main()
