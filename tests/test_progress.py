"""One progress-bar behaviour for every backend (bam_ppl.progress)."""

import io
import sys

import numpy as np
import pytest

import bam_ppl as bam
from bam_ppl.progress import progress, resolve_progress

X = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])


def test_resolve_progress():
    assert resolve_progress(True, long_run=False) and not resolve_progress(False)
    assert not resolve_progress(None, long_run=True)  # pytest's stderr is not a terminal
    with pytest.raises(TypeError, match="progress_bar must be True, False or None"):
        resolve_progress("yes")


def test_bar_is_filled_and_closed(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with progress(100, "vb", True) as bar:
        bar.update(43)  # a run that converged early
    assert "100/100" in err.getvalue().splitlines()[-1].split("\r")[-1]
    with pytest.raises(RuntimeError), progress(10, "x", True) as bar:
        raise RuntimeError("boom")
    assert bar.disable or bar.n == 0  # closed without being filled


@pytest.mark.parametrize("method, options", [
    ("smc", dict(num_particles=20, num_chains=2)),
    ("gibbs", dict(num_warmup=2, num_samples=2, num_chains=1)),
    ("vb", dict(num_iters=5)),
    ("map", dict(num_iters=5)),
])
def test_default_writes_no_bar_to_a_log_file(capfd, method, options):
    model = bam.models.nmf(2, a=10.0)
    bam.infer(model, X, method=method, rng_key=0, **options)
    assert "\r" not in capfd.readouterr().err


def test_every_backend_accepts_progress_bar():
    model = bam.models.nmf(2, a=10.0)
    for method, options in (("map", dict(num_iters=3)), ("vb", dict(num_iters=3)), ("cvb", dict(num_iters=3))):
        bam.infer(model, X, method=method, rng_key=0, progress_bar=False, **options)
    dt = bam.models.dirichlet_tucker((2, 2, 2, 2))
    faces = np.random.default_rng(0).multinomial(20, np.full(12, 1 / 12), size=(4, 3)).reshape(4, 3, 3, 4)
    bam.infer(dt, faces, method="map", num_iters=3, progress_bar=False)
    bam.infer(dt, faces, method="sem", num_iters=3, batch_size=2, progress_bar=False)
