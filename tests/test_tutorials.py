"""Every tutorial runs end to end with small settings (BAM_PPL_SMALL=1), as in CI."""

import os
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


# Tutorials that need an optional extra: the module it installs.
EXTRAS = {"parallel_sweep": "distributed"}


def _real_data_available() -> bool:
    from bam_ppl.datasets import data_home

    try:
        data_home()
    except FileNotFoundError:
        return False
    return True


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path, tmp_path):
    if path.stem in REAL_DATA and not _real_data_available():
        pytest.skip("real data sets not found (set BAM_PPL_DATA)")
    if path.stem in EXTRAS:
        pytest.importorskip(EXTRAS[path.stem])
    env = {**os.environ, "BAM_PPL_SMALL": "1", "MPLBACKEND": "Agg", "BAM_PPL_OUTPUT": str(tmp_path)}
    result = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"{path.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    if path.stem in REAL_DATA:
        files, line = REAL_DATA[path.stem]
        missing = [f for f in files if not (tmp_path / f).exists()]
        assert not missing, f"{path.name} did not write {missing}"
        assert line in result.stdout, result.stdout[-3000:]


def test_cli_methods_lists_backends():
    result = subprocess.run([sys.executable, "-m", "bam_ppl.cli", "methods"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "nuts" in result.stdout and "svi" in result.stdout
