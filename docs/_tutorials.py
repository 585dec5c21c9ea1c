"""Turn ``tutorials/*.py`` (jupytext percent scripts) into executed notebooks for the docs.

Each tutorial is converted with jupytext and executed with nbclient in a fresh kernel, from the
repository root, with small settings (``BAM_PPL_SMALL=1``) and a per-cell timeout. A tutorial
that fails or times out does not fail the build: its page is rendered without outputs, with a
note saying it was not executed and why, and the tutorials index lists it.

Executed notebooks are cached under ``docs/_build/.tutorials`` by a hash of the tutorial and of
the package sources, so a rebuild re-runs only what changed. ``BAM_PPL_DOCS_EXECUTE=0`` skips
execution altogether (every tutorial rendered without outputs), ``BAM_PPL_DOCS_CELL_TIMEOUT``
sets the per-cell timeout in seconds (default 300), ``BAM_PPL_DOCS_JOBS`` the number of
tutorials executed at once (default 2), and ``BAM_PPL_DOCS_STRICT=1`` makes a tutorial that
fails an error of the build (for CI).

Run it alone with ``python docs/_tutorials.py``; ``conf.py`` runs it before every build.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
SOURCE = ROOT / "tutorials"
TARGET = DOCS / "tutorials"  # generated, ignored by git
CACHE = DOCS / "_build" / ".tutorials"
FIRST = ("quickstart",)

sys.path.insert(0, str(DOCS))
from _citations import cite  # noqa: E402


def _package_hash() -> str:
    digest = hashlib.sha256()
    for path in [*sorted((ROOT / "bam_ppl").rglob("*.py")), DOCS / "_tutorials.py", DOCS / "_citations.py"]:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _title(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def _environment(output: Path) -> None:
    """Environment variables every tutorial kernel inherits."""
    os.environ["BAM_PPL_SMALL"] = "1"
    os.environ["BAM_PPL_OUTPUT"] = str(output)
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend shows the figures
    shared = ROOT.parent / "shared" / "data"
    if "BAM_PPL_DATA" not in os.environ and shared.is_dir():
        os.environ["BAM_PPL_DATA"] = str(shared)


def _execute(nb, timeout: int):
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}})
    client.log.setLevel(logging.WARNING)  # no "Executing notebook" line per tutorial
    # the kernel process's own log (not the cells' output, which comes through the client)
    client.execute(stderr=subprocess.DEVNULL)
    return nb


def _not_executed_note(nbformat, reason: str, name: str):
    text = ("```{warning}\nThis tutorial was **not executed** when this documentation was built, "
            "so the page shows its code without outputs.\n\n"
            f"Reason: {reason}\n\nRun it yourself with `python tutorials/{name}.py` "
            "(`BAM_PPL_SMALL=1` for small settings).\n```")
    return nbformat.v4.new_markdown_cell(text)


def _notebook(source: str, path: Path):
    """The tutorial as a notebook, with a hidden first cell that defines ``__file__`` (as when
    the script runs) and citations in place of repository paths."""
    import jupytext
    import nbformat

    nb = jupytext.reads(cite(source), fmt="py:percent")
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata.pop("jupytext", None)
    setup = nbformat.v4.new_code_cell(
        f"__file__ = {str(path)!r}\n"
        "import warnings\n"
        "warnings.filterwarnings('ignore', message='IProgress not found')  # tqdm without widgets")
    setup.metadata["tags"] = ["remove-cell"]
    nb.cells.insert(0, setup)
    return nb


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _tidy_outputs(nb) -> None:
    """Warnings printed by the tutorials name files relative to the repository."""
    prefix = str(ROOT) + "/"
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("name") == "stderr":
                output["text"] = output["text"].replace(prefix, "")


def _one(path: Path, package_hash: str, timeout: int, execute: bool) -> dict:
    import nbformat

    source = path.read_text(encoding="utf-8")
    nb = _notebook(source, path)
    key = hashlib.sha256((source + package_hash + str(timeout)).encode()).hexdigest()[:20]
    # (package_hash covers this file and _citations.py too: see _package_hash)
    cached = CACHE / f"{path.stem}-{key}.ipynb"
    status = {"name": path.stem, "title": _title(nb) or path.stem, "executed": False,
              "seconds": None, "reason": ""}
    if not execute:
        status["reason"] = "execution switched off (BAM_PPL_DOCS_EXECUTE=0)"
    elif cached.exists():
        nb = nbformat.read(cached, as_version=4)
        status.update(executed=True, seconds=nb.metadata.get("bam_ppl_seconds"), cached=True)
    else:
        start = time.perf_counter()
        try:
            _execute(nb, timeout)
        except Exception as exc:  # a failing tutorial is reported, not fatal
            name = type(exc).__name__
            message = _ANSI.sub("", str(exc)).replace(str(ROOT) + "/", "").strip().splitlines()
            detail = next((line for line in reversed(message) if line.strip()), "") if message else ""
            if "Timeout" in name or "timed out" in str(exc):
                status["reason"] = f"a cell ran longer than the {timeout} s timeout"
            else:
                status["reason"] = f"{name}: {detail[:300]}"
            status["log"] = _ANSI.sub("", "".join(traceback.format_exception_only(type(exc), exc)))[-4000:]
            nb = _notebook(source, path)
        else:
            seconds = time.perf_counter() - start
            status.update(executed=True, seconds=round(seconds, 1))
            nb.metadata["bam_ppl_seconds"] = status["seconds"]
            CACHE.mkdir(parents=True, exist_ok=True)
            for old in CACHE.glob(f"{path.stem}-*.ipynb"):
                old.unlink()
            nbformat.write(nb, cached)
    _tidy_outputs(nb)
    if not status["executed"]:
        # insert the note right after the title cell
        position = 2 if len(nb.cells) > 1 and nb.cells[1].cell_type == "markdown" else 1
        nb.cells.insert(position, _not_executed_note(nbformat, status["reason"], path.stem))
    nb.metadata["mystnb"] = {"execution_mode": "off"}
    nbformat.write(nb, TARGET / f"{path.stem}.ipynb")
    return status


def _index(statuses: list[dict]) -> str:
    lines = [
        "# Tutorials",
        "",
        "The tutorials are the scripts `tutorials/*.py` of the repository (jupytext percent format), "
        "executed for this site with small settings (`BAM_PPL_SMALL=1`): fewer particles, "
        "sweeps and data than the full runs, so numbers differ from a full run "
        "(`python tutorials/<name>.py` without `BAM_PPL_SMALL`). Tutorials on real data sets read "
        "them from `$BAM_PPL_DATA`.",
        "",
        "| tutorial | executed for this build |",
        "|---|---|",
    ]
    for s in statuses:
        if s["executed"]:
            done = f"yes ({s['seconds']:.0f} s)" if s.get("seconds") is not None else "yes"
        else:
            done = "**no**: " + s["reason"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| [{s['title']}]({s['name']}.ipynb) | {done} |")
    lines += ["", "```{toctree}", ":maxdepth: 1", ":hidden:", ""]
    lines += [s["name"] for s in statuses]
    lines += ["```", ""]
    return "\n".join(lines)


def build() -> list[dict]:
    execute = os.environ.get("BAM_PPL_DOCS_EXECUTE", "1") != "0"
    timeout = int(os.environ.get("BAM_PPL_DOCS_CELL_TIMEOUT", "300"))
    jobs = max(1, int(os.environ.get("BAM_PPL_DOCS_JOBS", "2")))
    TARGET.mkdir(parents=True, exist_ok=True)
    # the quick start first, the others by name
    paths = sorted(SOURCE.glob("*.py"), key=lambda p: (p.stem not in FIRST, p.stem))
    for stale in TARGET.glob("*.ipynb"):
        if not (SOURCE / f"{stale.stem}.py").exists():
            stale.unlink()
    package_hash = _package_hash()
    saved = dict(os.environ)
    output = Path(tempfile.mkdtemp(prefix="bam_ppl_docs_"))
    _environment(output)
    start = time.perf_counter()
    try:
        # one process per tutorial at a time: each starts its own kernel
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            statuses = list(pool.map(partial(_one, package_hash=package_hash, timeout=timeout,
                                             execute=execute), paths))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    (TARGET / "index.md").write_text(_index(statuses), encoding="utf-8")
    (TARGET / "status.json").write_text(json.dumps(statuses, indent=1), encoding="utf-8")
    failed = [s for s in statuses if not s["executed"]]
    print(f"[bam_ppl docs] tutorials: {len(statuses) - len(failed)} of {len(statuses)} executed "
          f"in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    for s in failed if execute else []:
        print(f"[bam_ppl docs] NOT EXECUTED: {s['name']}: {s['reason']}", file=sys.stderr)
        if s.get("log"):  # the end of the traceback
            print("\n".join(s["log"].strip().splitlines()[-6:]), file=sys.stderr)
    if failed and execute and os.environ.get("BAM_PPL_DOCS_STRICT") == "1":
        raise RuntimeError(f"tutorials not executed: {[s['name'] for s in failed]} (BAM_PPL_DOCS_STRICT=1)")
    return statuses


if __name__ == "__main__":
    build()
