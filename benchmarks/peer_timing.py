"""Shared helpers of the same-run speed comparisons (``peer_smc.py``, ``peer_nbmf.py``,
``smc_throughput.py --baseline-tree``, ``api_throughput.py --compare``, and the older revisions of
``tempered_baseline.py`` and ``evidence_engine.py --baseline``).

A speed ratio is only printed for timings taken in the same run on the same machine: each
side is pinned to the same core (``taskset -c CPU`` for subprocesses, the whole benchmark
process re-executed under ``taskset`` before JAX or numba start their threads), the sides'
timed calls alternate, and each side's figure is its best of N calls.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
_PINNED_ENV = "BAM_PPL_BENCH_PINNED"


def cpu_from_argv(default: int | None = 0) -> int | None:
    """The ``--cpu`` option, read before argparse (pinning must precede importing JAX/numba);
    ``--cpu -1`` means not pinned."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--cpu" and i + 1 < len(argv):
            value = int(argv[i + 1])
            return None if value < 0 else value
        if arg.startswith("--cpu="):
            value = int(arg.split("=", 1)[1])
            return None if value < 0 else value
    return default


def pin_process(cpu: int | None) -> None:
    """Run this process, and every thread and subprocess it starts, on core ``cpu`` only.

    Re-executes the script under ``taskset -c cpu`` (so threads started by imports are pinned
    too); without ``taskset``, sets the affinity of the calling thread, which later threads inherit.
    Call it before importing ``bam_ppl``.
    """
    if cpu is None:
        return
    if os.sched_getaffinity(0) == {cpu}:
        return
    if shutil.which("taskset") and os.environ.get(_PINNED_ENV) != str(cpu):
        os.environ[_PINNED_ENV] = str(cpu)
        os.execvp("taskset", ["taskset", "-c", str(cpu), sys.executable, *sys.argv])
    os.sched_setaffinity(0, {cpu})


def pinned(command: list[str], cpu: int | None) -> list[str]:
    """``command`` prefixed with ``taskset -c cpu`` (unchanged when ``cpu`` is None)."""
    if cpu is None:
        return list(command)
    return ["taskset", "-c", str(cpu), *command]


@contextlib.contextmanager
def revision_trees(revisions):
    """{revision: path} of a ``git worktree`` of each revision in a temporary folder, removed on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        try:
            for rev in revisions:
                trees[rev] = os.path.join(tmp, rev.replace("/", "_"))
                subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "add", "--detach", trees[rev], rev],
                               check=True, capture_output=True)
            yield trees
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPOSITORY), "worktree", "remove", "--force", tree], check=False,
                               capture_output=True)


def run_in_tree(tree, code: str, cpu: int | None = None) -> str:
    """stdout of ``python -c code`` importing bam_ppl from the source tree ``tree`` (pinned to ``cpu``)."""
    return subprocess.run(pinned([sys.executable, "-c", code], cpu), cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                          check=True, capture_output=True, text=True).stdout


def revision() -> str:
    """Short hash of HEAD, with ``+dirty`` when ``bam_ppl/`` has uncommitted changes."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "bam_ppl")
    return head + ("+dirty" if dirty else "")


def machine() -> str:
    """CPU model and core count, as the benchmark tables name the machine."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, affinity {sorted(os.sched_getaffinity(0))}"


def tool_version(command: list[str]) -> str:
    """First line of ``command`` (e.g. ``octave-cli --version``), or 'not found'."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "unknown"
