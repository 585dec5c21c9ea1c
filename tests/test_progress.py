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


def _value(idata):
    stats = idata.sample_stats
    return {name: np.asarray(stats[name]) for name in stats.data_vars}


@pytest.mark.parametrize("method, model, data, options", [
    ("map", "nmf", X, dict(num_iters=3)),
    ("vb", "nmf", X, dict(num_iters=3)),
    ("cvb", "nmf", X, dict(num_iters=3)),
    ("map", "dt", None, dict(num_iters=3)),
    ("sem", "dt", None, dict(num_iters=3, batch_size=2)),
])
def test_every_backend_draws_its_bar_only_when_asked(capfd, method, model, data, options):
    """progress_bar=True draws a bar on stderr, False draws nothing, and neither changes the fit."""
    if model == "dt":
        model = bam.models.dirichlet_tucker((2, 2, 2, 2))
        data = np.random.default_rng(0).multinomial(20, np.full(12, 1 / 12), size=(4, 3)).reshape(4, 3, 3, 4)
    else:
        model = bam.models.nmf(2, a=10.0)
    capfd.readouterr()
    quiet = bam.infer(model, data, method=method, rng_key=0, progress_bar=False, **options)
    assert capfd.readouterr().err == ""
    shown = bam.infer(model, data, method=method, rng_key=0, progress_bar=True, **options)
    assert "100%|" in capfd.readouterr().err  # tqdm's filled bar
    for name, values in _value(quiet).items():
        np.testing.assert_array_equal(values, _value(shown)[name], err_msg=name)
