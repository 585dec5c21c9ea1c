"""MAP-EM (method="map"): monotone log posterior, the right objective, a local maximum, options."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import log_density

import bam_ppl as bam
from bam_ppl.convert import attrs_of, group
from bam_ppl.data import CountTensor, as_count_tensor
from bam_ppl.infer import em as em_core

X1 = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])
NMF = bam.AllocationModel("k -> i; k -> j", latent={"k": 2}, observed=("i", "j"),
                          priors={"k": 1.5, "i": 1.2, "j": 1.1})

MODELS = {
    "nmf": (NMF, X1),
    "lda (conditioned totals)": (
        bam.AllocationModel("d -> k -> w", latent={"k": 3}, observed=("d", "w"), condition_on="d",
                            priors={"k": 1.1, "w": 1.05}), X1),
    "symmetric nmf (tied)": (
        bam.AllocationModel("r -> i; r -> j", latent={"r": 2}, tie=[("i", "j")], priors={"r": 1.2, "i": 1.3, "j": 1.3}),
        np.array([[3, 1, 0], [1, 0, 1], [0, 1, 2]])),
    "cp with missing entries": (
        bam.AllocationModel("r -> i; r -> j; r -> k", latent={"r": 2}, a=40.0),
        CountTensor.from_samples(np.array([[0, 1, -1], [1, 1, 0], [0, -1, 1], [1, 0, 0], [0, 1, 1]]),
                                 shape=(2, 2, 2))),
}


@functools.cache
def _fit(name):
    """Fits shared by the tests: run to an exact fixed point (tol=0) or 3000 iterations."""
    model, data = MODELS[name]
    return bam.infer(model, data, method="map", rng_key=0, num_chains=4, num_iters=3000, tol=0.0)


@pytest.mark.parametrize("name", list(MODELS))
def test_log_posterior_never_decreases(name):
    idata = _fit(name)
    trace = group(idata, "sample_stats")["log_posterior"].values[0]
    assert 2 <= trace.size <= 3000 and np.all(np.isfinite(trace))
    assert np.all(np.diff(trace) >= -1e-10 * np.abs(trace[1:])), np.diff(trace).min()
    restarts = group(idata, "sample_stats")["restart_log_posterior"].values[0]
    assert restarts.shape == (4,) and trace[-1] == restarts.max()


def _numpyro_log_joint(model, data, idata):
    """log p(X, Θ, λ) of the model's NumPyro program at the MAP point."""
    post = group(idata, "posterior")
    params = {name: jnp.asarray(post[name].values[0, 0]) for name in post.data_vars}
    with jax.enable_x64(True):
        params = {k: v.astype(jnp.float64) for k, v in params.items()}
        value, _ = log_density(model.numpyro_model(), (data,), {}, params)
        return float(value)


@pytest.mark.parametrize("name", ["nmf", "lda (conditioned totals)"])
def test_objective_is_the_programs_log_joint(name):
    model, data = MODELS[name]
    idata = _fit(name)
    recorded = attrs_of(idata)["log_posterior"]
    np.testing.assert_allclose(_numpyro_log_joint(model, data, idata), recorded, rtol=1e-6)


def test_map_point_is_a_local_maximum():
    model, data = MODELS["nmf"]
    idata = _fit("nmf")
    data = as_count_tensor(data)
    bound = model.bind(data)
    layout = bound.cell_layout(data)
    problem = em_core.build_problem(bound, data, layout)
    post = group(idata, "posterior")
    theta = np.concatenate([post[f"theta_{t.name}"].values[0, 0].reshape(-1) for t in bound.tables])
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        best = float(em_core.log_posterior(problem, jnp.asarray(theta), False))
        for _ in range(20):
            direction = np.asarray(em_core.init(problem, jax.random.PRNGKey(rng.integers(1 << 30)), "random"))
            moved = 0.99 * theta + 0.01 * direction  # stays on every column's simplex
            assert float(em_core.log_posterior(problem, jnp.asarray(moved), False)) < best


def test_output_is_a_labelled_point_estimate():
    idata = _fit("nmf")
    post = group(idata, "posterior")
    assert post["theta_i"].dims == ("chain", "draw", "k", "i")
    assert post["theta_i"].shape[:2] == (1, 1)
    np.testing.assert_allclose(post["theta_j"].values.sum(-1), 1.0)
    # λ* = (a + T − 1) / (b + 1) with a = 1, T = 9, b = a / T.
    np.testing.assert_allclose(post["total_rate"].values, 9.0 / (1.0 / 9.0 + 1.0))
    attrs = attrs_of(idata)
    assert attrs["method"] == "map" and attrs["point_estimate"].startswith("MAP")
    assert group(idata, "sample_stats")["log_posterior"].dims == ("chain", "iteration")


def test_concentration_below_one_names_the_table():
    with pytest.raises(ValueError, match=r"table 'k'.*>= 1"):
        bam.infer(bam.models.nmf(2, a=1.0), X1, method="map")


@pytest.mark.parametrize("options, error", [
    (dict(num_iters=0), ValueError),
    (dict(num_iters=1.5), TypeError),
    (dict(tol=-1e-3), ValueError),
    (dict(num_chains=0), ValueError),
    (dict(init="kmeans"), ValueError),
])
def test_bad_options_raise_before_compiling(options, error):
    with pytest.raises(error, match=next(iter(options))):
        bam.infer(NMF, X1, method="map", **options)
