"""Every tutorial runs end to end with small settings (BAM_PPL_SMALL=1), as in CI."""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))

# The papers' real-data comparisons: the files each writes (under $BAM_PPL_OUTPUT) and a line
# of its printed output. Each takes 15-20 s with small settings on a shared 2-core machine.
REAL_DATA = {
    "abalone_structures": (["abalone_compare.csv", "abalone_evidence.png", "abalone_age_by_class.png"],
                           "best allocation: log p(X, S)"),
    "letter_bigrams": (["letter_bigrams_compare.csv", "letter_bigrams_evidence.png"], "NMF ahead at"),
    "icews_ranks": (["icews_compare.csv", "icews_evidence.png"], "best Tucker:"),
    "rank_confusion": (["rank_confusion_trials.csv", "rank_confusion_summary.csv", "rank_confusion.png"],
                       "exact rank recovery:"),
}


# Tutorials on data sets fetched on first use (not bundled): tests never download, so they run
# only where the reference copies are found ($BAM_PPL_DATA or ../shared/data).
FETCHED_DATA = {"nbmf_dictionary"}

# Tutorials that need an optional extra: the module it installs.
EXTRAS = {"parallel_sweep": "distributed"}

# Tutorials that need an interpreter of their own: parallel_sweep starts worker processes under its
# `if __name__ == "__main__":` guard, which must be the real main module. The others run inside
# the test process, which saves starting Python and importing JAX, NumPyro and ArviZ once each.
OWN_PROCESS = {"parallel_sweep"}


def _real_data_available() -> bool:
    from bam_ppl.datasets import data_home

    try:
        data_home()
    except FileNotFoundError:
        return False
    return True


def _run_in_own_process(path, env):
    """The tutorial as `python tutorials/NAME.py`: (return code, stdout, stderr)."""
    result = subprocess.run([sys.executable, str(path)], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                            text=True, timeout=600)
    return result.returncode, result.stdout, result.stderr


def _run_in_this_process(path, env, monkeypatch, capsys):
    """The tutorial as its own `__main__` module in this process, from the repository root."""
    import matplotlib
    import matplotlib.pyplot as plt

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [str(path)])
    monkeypatch.syspath_prepend(str(path.parent))  # as `python tutorials/NAME.py` would see it
    matplotlib.use("Agg")  # pyplot may already be imported with another backend
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        plt.close("all")
        _free_compiled_programs()
    captured = capsys.readouterr()
    return 0, captured.out, captured.err


def _free_compiled_programs():
    """Drop JAX's in-memory compiled programs, so that tutorials run one after another in a worker do
    not add up in its memory; the persistent compilation cache (tests/conftest.py) keeps them on disk."""
    import jax

    jax.clear_caches()


# Outside `make test` (a third of its CPU time on 2 cores): `make tutorials`, `make test-all` and CI run them.
@pytest.mark.tutorial
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path, tmp_path, monkeypatch, capsys):
    if (path.stem in REAL_DATA or path.stem in FETCHED_DATA) and not _real_data_available():
        pytest.skip("real data sets not found (set BAM_PPL_DATA)")
    if path.stem in EXTRAS:
        pytest.importorskip(EXTRAS[path.stem])
    env = {"BAM_PPL_SMALL": "1", "MPLBACKEND": "Agg", "BAM_PPL_OUTPUT": str(tmp_path)}
    if path.stem in OWN_PROCESS:
        returncode, stdout, stderr = _run_in_own_process(path, env)
    else:
        returncode, stdout, stderr = _run_in_this_process(path, env, monkeypatch, capsys)
    assert returncode == 0, f"{path.name} failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    if path.stem in REAL_DATA:
        files, line = REAL_DATA[path.stem]
        missing = [f for f in files if not (tmp_path / f).exists()]
        assert not missing, f"{path.name} did not write {missing}"
        assert line in stdout, stdout[-3000:]


def _readme_example() -> tuple[str, str]:
    """The README's example: its Python block and the output block that follows it."""
    section = (ROOT / "README.md").read_text().split("## Example", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    return code, shown


# With the tutorials (about 20 s): the README's example as a user copies it prints what the README shows,
# and the posterior it points to mixes as it says.
@pytest.mark.tutorial
def test_readme_example_prints_what_the_readme_shows(monkeypatch, capsys):
    import arviz as az

    import bam_ppl as bam

    code, shown = _readme_example()
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})  # noqa: S102 — the README's own code
    assert capsys.readouterr().out.strip() == shown.strip()
    idata = bam.relabel(bam.infer(bam.models.cp(2), bam.datasets.load_hair_eye_color(), method="gibbs",
                                  num_warmup=5000, num_samples=5000))
    assert float(az.summary(idata, var_names=["theta_r"])["r_hat"].max()) <= 1.05


def test_cli_methods_lists_backends():
    # A real subprocess: the `python -m bam_ppl.cli` entry point as a user starts it.
    result = subprocess.run([sys.executable, "-m", "bam_ppl.cli", "methods"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "nuts" in result.stdout and "svi" in result.stdout


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorials_use_only_the_public_api(path):
    """A tutorial imports bam_ppl itself, a module it exports (``bam_ppl.__all__``) or a model
    family's module (``bam_ppl.models.pmf``: its evaluation helpers), nothing deeper."""
    import ast

    import bam_ppl

    allowed = {"bam_ppl", *(f"bam_ppl.{name}" for name in bam_ppl.__all__)}
    for node in ast.walk(ast.parse(path.read_text())):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        for name in names:
            if name.split(".")[0] == "bam_ppl":
                family = name.rsplit(".", 1)[0] == "bam_ppl.models"
                assert name in allowed or family, f"{path.name} imports {name}, outside the public API"
            if isinstance(node, ast.ImportFrom) and name in allowed:
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"{path.name} imports the private names {private} from {name}"
