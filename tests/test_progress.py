"""One progress-bar behaviour for every backend (bam_ppl.progress)."""

import io
import logging
import sys
import types

import numpy as np
import pytest
from conftest import NUMPYRO_X, NUTS_OPTIONS, SVI_OPTIONS, SVI_X

import bam_ppl as bam
from bam_ppl import progress as progress_module
from bam_ppl.infer.numpyro_backends import show_progress
from bam_ppl.progress import AUTOMATIC, interactive, make_bar, progress, resolve_progress

X = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])


def test_resolve_progress():
    assert resolve_progress(True, long_run=False) and not resolve_progress(False)
    assert resolve_progress(None, long_run=True) is AUTOMATIC and not resolve_progress(None, long_run=False)
    assert not interactive()  # pytest's stderr is not a terminal, nor is this a Jupyter kernel
    assert not show_progress(None) and show_progress(True)  # NumPyro's own bar: only where someone watches
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
    # NumPyro's samplers on the runs of test_arviz_user and test_numpyro: the programs they compile.
    ("nuts", "nmf-a2", NUMPYRO_X, NUTS_OPTIONS),
    ("svi", "nmf-a2", SVI_X, SVI_OPTIONS),
])
def test_every_backend_draws_its_bar_only_when_asked(capfd, method, model, data, options):
    """progress_bar=True draws a bar on stderr, False draws nothing, and neither changes the fit."""
    if model == "dt":
        model = bam.models.dirichlet_tucker((2, 2, 2, 2))
        data = np.random.default_rng(0).multinomial(20, np.full(12, 1 / 12), size=(4, 3)).reshape(4, 3, 3, 4)
    else:
        model = bam.models.nmf(2, a=2.0 if model == "nmf-a2" else 10.0)
    capfd.readouterr()
    quiet = bam.infer(model, data, method=method, rng_key=0, progress_bar=False, **options)
    assert capfd.readouterr().err == ""
    shown = bam.infer(model, data, method=method, rng_key=0, progress_bar=True, **options)
    assert "100%|" in capfd.readouterr().err  # tqdm's filled bar
    for name, values in _value(quiet).items():
        np.testing.assert_array_equal(values, _value(shown)[name], err_msg=name)


def test_a_jupyter_kernel_gets_a_live_bar(monkeypatch):
    kernel_shell = types.SimpleNamespace(kernel=object(), config={})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: kernel_shell))
    assert interactive() and show_progress(None)
    terminal_shell = types.SimpleNamespace(config={"TerminalIPythonApp": {}})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: terminal_shell))
    assert not interactive()  # plain IPython in a pipe: its stderr decides


def test_a_log_file_gets_plain_lines(tmp_path, monkeypatch):
    """A bar into a file is written as whole lines, never as carriage-return frames."""
    log = tmp_path / "run.log"
    monkeypatch.setattr(progress_module, "PLAIN_INTERVAL", 0.0)  # every update a line
    with open(log, "w") as stream:
        monkeypatch.setattr(sys, "stderr", stream)
        with progress(5, "gibbs", True, unit="sweep") as bar:
            for _ in range(5):
                bar.update(1)
        bam.infer(bam.models.nmf(2, a=10.0), X, method="vb", rng_key=0, num_iters=5, progress_bar=True)
    text = log.read_text()
    assert "\r" not in text and "5/5" in text and "100%|" in text
    assert all(line.strip() for line in text.splitlines())


def test_automatic_bar_is_silent_for_short_runs_in_a_plain_stream(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with progress(10, "vb", resolve_progress(None)) as bar:
        bar.update(10)
    assert err.getvalue() == ""  # shorter than PLAIN_INTERVAL: nothing
    monkeypatch.setattr(progress_module, "PLAIN_INTERVAL", 0.0)
    with progress(10, "vb", resolve_progress(None)) as bar:
        bar.update(10)
    assert "10/10" in err.getvalue() and "\r" not in err.getvalue()
    assert make_bar(3, "x", False).disable


def test_logger_reports_stages(caplog):
    """Stages of long calls at INFO, backends' start and end at DEBUG, under "bam_ppl"; the library
    itself adds no handler but a NullHandler."""
    root = logging.getLogger("bam_ppl")
    assert all(isinstance(handler, logging.NullHandler) for handler in root.handlers)
    caplog.set_level(logging.DEBUG, logger="bam_ppl")
    model = bam.models.nmf(2, a=10.0)
    bam.log_evidence(model, X, method="auto")
    bam.log_evidence(model, X, method="vb", min_calls=2, num_iters=5)
    bam.infer(model, X, method="vb", num_iters=5)
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert all(name.startswith("bam_ppl") for name, _, _ in records)
    info = [message for _, level, message in records if level == logging.INFO]
    debug = [message for _, level, message in records if level == logging.DEBUG]
    assert any(message.startswith("auto evidence: exact") for message in info)
    assert any(message.startswith("evidence: calls 0..1") for message in info)
    assert any("log_evidence(method='auto')" in message and "started" in message for message in debug)
    assert any("infer(method='vb')" in message and "done in" in message for message in debug)
