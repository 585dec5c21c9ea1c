"""Every tutorial runs end to end with small settings (BAM_PPL_SMALL=1), as in CI."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path):
    env = {**os.environ, "BAM_PPL_SMALL": "1", "MPLBACKEND": "Agg"}
    result = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"{path.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"


def test_cli_methods_lists_backends():
    result = subprocess.run([sys.executable, "-m", "bam_ppl.cli", "methods"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "nuts" in result.stdout and "svi" in result.stdout
