"""Where the test suite's time goes: the XLA and numba compilations of each test, module and program.

Runs pytest (the arguments after ``--``, default the suite as ``make test`` runs it) with a plugin
that turns on ``jax_log_compiles`` in every worker and writes each compilation, under the test that
triggered it, to a log per worker; then sums the seconds XLA reports ("Finished XLA compilation of
jit(f) in s sec"). Tracing and lowering are not counted, nor programs compiled in subprocesses.
numba kernels compiled in the workers (not read from numba's cache: run ``python -m bam_ppl.precompile``
first, as ``make test`` does) are timed from numba's compile events, each outermost compilation
with the kernels it compiles inside it. The totals are printed beside the suite's test-seconds: the
sum of the tests' times in pytest's junit report (setup, call and teardown, over every worker).

Usage: ``python benchmarks/suite_compile_time.py [--top 25] [-- pytest arguments]``
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOG_DIR = "BAM_PPL_COMPILE_LOG_DIR"
FINISHED = re.compile(r"Finished XLA compilation of (.*) in ([0-9.e-]+) sec")
NUMBA = re.compile(r"@@NUMBA (\S+) ([0-9.e-]+)$")


# -- the pytest plugin (imported by every worker as ``-p suite_compile_time``) ---------------------
_log = None


class _ToFile:
    """A filter on JAX's compile loggers: writes each message to this worker's log and stops it there,
    so that no handler (pytest's caplog included) sees it."""

    def filter(self, record):
        _log.write(record.getMessage() + "\n")
        return False


def _watch_numba() -> None:
    """Write each outermost numba compilation's kernel and seconds into the worker's log (numba's compile
    events; the kernels compiled inside it are in its time)."""
    try:
        from numba.core import event
    except ImportError:  # pragma: no cover
        return

    class Compiles(event.Listener):
        def __init__(self):
            self.began = []

        def on_start(self, e):
            self.began.append(time.perf_counter())

        def on_end(self, e):
            began = self.began.pop()
            if not self.began:
                _log.write(f"@@NUMBA {e.data['dispatcher'].py_func.__qualname__} {time.perf_counter() - began:.3f}\n")

    event.register("numba:compile", Compiles())


def pytest_configure(config):
    global _log
    import logging

    import jax

    _log = open(Path(os.environ[LOG_DIR]) / f"{os.getpid()}.log", "a", buffering=1)
    for name in ("jax._src.dispatch", "jax._src.interpreters.pxla", "jax._src.compiler"):
        logging.getLogger(name).addFilter(_ToFile())
    jax.config.update("jax_log_compiles", True)
    _watch_numba()


def pytest_runtest_setup(item):
    if _log is not None:
        _log.write(f"@@TEST {item.nodeid}\n")


# -- the summary -----------------------------------------------------------------------------------
def test_seconds(junit: Path) -> float:
    import xml.etree.ElementTree as ElementTree

    return sum(float(case.get("time", 0.0)) for case in ElementTree.parse(junit).iter("testcase"))


def summarise(log_dir: Path, top: int) -> None:
    """Compile seconds and programs per module, test and program, from the workers' logs in ``log_dir``."""
    titles = ("module", "test", "program")
    seconds = {(kind, title): collections.Counter() for kind in ("XLA", "numba") for title in titles}
    programs = {key: collections.Counter() for key in seconds}
    for path in log_dir.glob("*.log"):
        test = "(before the first test)"
        for line in path.read_text().splitlines():
            if line.startswith("@@TEST "):
                test = line.split(maxsplit=1)[1]
                continue
            for kind, pattern in (("XLA", FINISHED), ("numba", NUMBA)):
                match = pattern.match(line)
                if match:
                    for title, name in zip(titles, (test.split("::")[0], test, match.group(1))):
                        seconds[kind, title][name] += float(match.group(2))
                        programs[kind, title][name] += 1
    junit = log_dir / "junit.xml"
    total = f" of {test_seconds(junit):.0f} test-seconds" if junit.exists() else ""
    for kind in ("XLA", "numba"):
        print(f"{kind} compilation: {sum(seconds[kind, 'test'].values()):.0f} s in "
              f"{sum(programs[kind, 'test'].values())} programs{total}")
    for (kind, title), table in seconds.items():
        print(f"\n| {title} ({kind}) | compile s | programs |\n|---|---|---|")
        for name, s in table.most_common(top):
            print(f"| {name} | {s:.1f} | {programs[kind, title][name]} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25, help="rows per table (default 25)")
    parser.add_argument("--keep", type=Path, default=None, help="write the per-worker compile logs into this folder")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args()
    pytest_args = args.pytest_args or ["-q", "-n", "auto", "--maxprocesses=4", "--dist", "loadgroup"]
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix="bam-ppl-compile-log-") as scratch:
        log_dir = Path(scratch) if args.keep is None else args.keep.resolve()
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, LOG_DIR: str(log_dir),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")]))}
        run = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_compile_time", *pytest_args,
                              f"--junitxml={log_dir / 'junit.xml'}"],
                             cwd=here.parent, env=env)
        summarise(log_dir, args.top)
    sys.exit(run.returncode)


if __name__ == "__main__":
    main()
