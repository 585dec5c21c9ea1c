"""The NumPyro program of an allocation model under NUTS, SVI, Predictive and render_model."""

import functools
import io
import sys

import jax
import numpy as np
import pytest
from conftest import SVI_OPTIONS, SVI_X
from numpyro.infer import Predictive

import bam_ppl as bam
from bam_ppl.convert import attrs_of, group, import_arviz
from bam_ppl.data import CountTensor
from bam_ppl.infer import numpyro_backends
from bam_ppl.infer.exact import exact_posterior_mean, expected_cell_probabilities
from bam_ppl.models.program import _all_cells

az = import_arviz()


def _ess(posterior, name):
    """Effective sample size of one variable, per element, on ArviZ 0.x and 1.x alike.

    ``az.ess`` of a DataArray returns a Dataset on ArviZ 0.x and a DataArray on 1.x; of a
    one-variable Dataset it returns a Dataset on both.
    """
    return np.asarray(az.ess(posterior[[name]])[name])


def _cell_probs_from_draws(idata, X_shape):
    post = group(idata, "posterior")
    tk, ti, tj = (post[f"theta_{n}"].values for n in ("k", "i", "j"))
    return np.einsum("cdk,cdki,cdkj->cdij", tk, ti, tj)


@pytest.mark.slow
@pytest.mark.stats
def test_nuts_cell_probabilities_match_enumeration():
    X = np.array([[2, 1], [0, 2]])
    model = bam.models.nmf(2, a=4.0)
    bound = model.bind(X)
    grid = bound.cell_layout(_all_cells(X.shape))
    exact = exact_posterior_mean(model, X, lambda c: expected_cell_probabilities(bound, c, grid))
    idata = bam.infer(model, X, method="nuts", rng_key=1, num_warmup=300, num_samples=800, num_chains=2)
    p = _cell_probs_from_draws(idata, X.shape).reshape(2, 800, -1)
    for cell in range(p.shape[-1]):
        draws = p[..., cell]
        mcse = draws.std() / np.sqrt(float(az.ess(draws)))
        assert abs(draws.mean() - exact[cell]) < 4 * mcse + 1e-3, (cell, draws.mean(), exact[cell], mcse)
    assert attrs_of(idata)["method"] == "nuts"
    assert int(group(idata, "sample_stats")["diverging"].sum()) < 20


LATENT_FREE_X = np.array([[3, 0, 1], [1, 4, 2]])
LATENT_FREE = bam.AllocationModel("i -> j", a=3.0)


@pytest.fixture(scope="module")
def latent_free_nuts():
    """One NUTS run of a latent-free model, shared by the posterior and the sample_stats tests.

    progress_bar is left at None while stderr is not a terminal; returns the InferenceData, the
    progress_bar values NumPyro's MCMC received and what was written to stderr.
    """
    seen = []
    real_mcmc = numpyro_backends.MCMC

    def spy(*args, **kwargs):
        seen.append(kwargs["progress_bar"])
        return real_mcmc(*args, **kwargs)

    stderr = _Stream(tty=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(numpyro_backends, "MCMC", spy)
        patch.setattr(sys, "stderr", stderr)
        idata = bam.infer(LATENT_FREE, LATENT_FREE_X, method="nuts", rng_key=0, num_warmup=200,
                          num_samples=500, num_chains=2)
    return idata, seen, stderr.getvalue()


def test_nuts_latent_free_matches_conjugate_posterior(latent_free_nuts):
    X, model = LATENT_FREE_X, LATENT_FREE
    idata = latent_free_nuts[0]
    post = group(idata, "posterior")
    conc = {t.name: t.concentration for t in model.bind(X).tables}
    counts = {"i": X.sum(1), "j": X}
    for name in ("i", "j"):
        alpha = conc[name] + counts[name]
        expected = alpha / alpha.sum(-1, keepdims=True)
        draws = post[f"theta_{name}"].values
        sd = draws.std(axis=(0, 1))
        ess = _ess(post, f"theta_{name}")
        np.testing.assert_array_less(np.abs(draws.mean((0, 1)) - expected), 4 * sd / np.sqrt(ess) + 1e-3)
    # the total rate: Gamma(a + T, b + 1)
    T, a = X.sum(), 3.0
    rate = post["total_rate"].values
    assert abs(rate.mean() - (a + T) / (a / T + 1)) < 4 * rate.std() / np.sqrt(float(az.ess(rate)))


SVI_FIT = dict(method="svi", rng_key=0, **SVI_OPTIONS)


@pytest.mark.parametrize("guide", ["normal", "delta"])
def test_svi_runs_and_fits(guide):
    X = SVI_X
    idata = bam.infer(bam.models.nmf(2, a=2.0), X, guide=guide, **SVI_FIT)
    loss = group(idata, "sample_stats")["loss"].values[0]
    assert loss[-100:].mean() < loss[:100].mean()
    post = group(idata, "posterior")
    p = np.einsum("cdk,cdki,cdkj->cdij", *(post[f"theta_{n}"].values for n in "kij")).mean((0, 1))
    # the fitted cell probabilities follow the data's proportions
    assert np.corrcoef(p.ravel(), (X / X.sum()).ravel())[0, 1] > 0.8


def test_program_with_predictive_and_render():
    model = bam.models.nmf(2, a=2.0, b=0.2)
    program = model.numpyro_model()
    prior = Predictive(program, num_samples=7)(jax.random.PRNGKey(0), shape=(3, 4))
    assert prior["X"].shape == (7, 3, 4)
    assert prior["theta_i"].shape == (7, 2, 3)
    np.testing.assert_allclose(prior["theta_i"].sum(-1), 1.0, rtol=1e-5)
    X = np.array([[1, 0, 2, 0], [0, 3, 0, 1], [2, 0, 0, 1]])
    # any parameter draws serve as "posterior" samples for posterior-predictive draws
    draws = {k: v for k, v in prior.items() if k != "X"}
    ppc = Predictive(program, posterior_samples=draws)(jax.random.PRNGKey(1), shape=X.shape)
    assert ppc["X"].shape == (7, 3, 4)
    pytest.importorskip("graphviz")
    import numpyro

    graph = numpyro.render_model(functools.partial(program, X), render_distributions=True)
    assert "theta_k" in graph.source and "Dirichlet" in graph.source


def test_conditioned_program_is_multinomial():
    # Under condition_on, the program's log density equals the multinomial of each document.
    import jax.numpy as jnp
    from numpyro.infer.util import log_density
    from scipy.stats import multinomial

    model = bam.models.lda(2, a=2.0)
    X = np.array([[2, 1, 0], [0, 1, 3]])
    program = model.numpyro_model()
    theta = {"theta_k": jnp.array([[0.3, 0.7], [0.6, 0.4]]),
             "theta_w": jnp.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])}
    ld, trace = log_density(program, (X,), {}, theta)
    prior = sum(float(site["fn"].log_prob(site["value"]).sum()) for name, site in trace.items()
                if name.startswith("theta"))
    p = np.asarray(theta["theta_k"]) @ np.asarray(theta["theta_w"])
    expected = sum(multinomial.logpmf(X[d], X[d].sum(), p[d]) for d in range(2))
    assert float(ld) - prior == pytest.approx(expected, rel=1e-5)


def test_observed_as_count_tensor_with_coords():
    # The data and fit of test_svi_runs_and_fits[normal]: the same program, compiled once.
    X = CountTensor.from_dense(SVI_X, dims=("i", "j"), coords={"i": ["x", "y", "z"], "j": ["u", "v", "w"]})
    idata = bam.infer(bam.models.nmf(2, a=2.0), X, **SVI_FIT)
    obs = group(idata, "observed_data")["X"]
    assert obs.dims == ("i", "j") and list(obs.coords["i"].values) == ["x", "y", "z"]
    post = group(idata, "posterior")["theta_j"]
    assert post.dims == ("chain", "draw", "k", "j") and list(post.coords["j"].values) == ["u", "v", "w"]


def test_nbmf_runs_under_nuts_and_svi_through_the_registry():
    V = (np.random.default_rng(0).random((6, 5)) < 0.4).astype(float)
    V[0, 0] = np.nan
    model = bam.models.nbmf(2)
    for method, options in [("nuts", dict(num_warmup=50, num_samples=50, num_chains=1)),
                            ("svi", dict(num_steps=100, num_samples=20))]:
        idata = bam.infer(model, V, method=method, rng_key=0, **options)
        post = group(idata, "posterior")
        assert post["W"].dims == ("chain", "draw", "row", "component")
        assert post["H"].dims == ("chain", "draw", "component", "col")
        mean = model.expected_mean(idata)
        assert mean.shape == (6, 5) and np.all((mean > 0) & (mean < 1))
        assert attrs_of(idata)["method"] == method


class _Stream(io.StringIO):
    """A stand-in for sys.stderr that says whether it is a terminal."""

    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_nuts_writes_energy_for_bfmi_and_no_progress_bar_off_a_terminal(latent_free_nuts):
    idata, seen, written = latent_free_nuts  # progress_bar left at None
    assert seen == [False]  # stderr is not a terminal: no bar, no carriage-return frames
    assert "\r" not in written
    energy = group(idata, "sample_stats")["energy"]
    assert energy.dims == ("chain", "draw") and energy.shape == (2, 500)
    assert np.isfinite(energy.values).all()
    bfmi = az.bfmi(idata)  # an array on ArviZ 0.x, the sample_stats DataTree on 1.x
    bfmi = np.asarray(bfmi["energy"] if not isinstance(bfmi, np.ndarray) else bfmi)
    assert bfmi.shape == (2,) and np.all((bfmi > 0) & np.isfinite(bfmi))


def test_progress_bar_option_is_resolved_like_numpyro(monkeypatch):
    for tty in (False, True):
        monkeypatch.setattr(sys, "stderr", _Stream(tty))
        assert numpyro_backends.show_progress(None) is tty
        assert numpyro_backends.show_progress(True) is True
        assert numpyro_backends.show_progress(False) is False
    with pytest.raises(TypeError, match="progress_bar"):
        numpyro_backends.show_progress("yes")
