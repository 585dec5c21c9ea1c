"""ArviZ and NumPyro as a user meets them: LOO/WAIC/compare, posterior predictive, relabelling."""

from __future__ import annotations

import functools

import jax
import matplotlib
import numpy as np
import pytest
from conftest import NUMPYRO_X, NUTS_OPTIONS
from numpyro.infer import Predictive
from numpyro.infer import log_likelihood as numpyro_log_likelihood
from scipy.stats import multinomial, poisson

import bam_ppl as bam
from bam_ppl import pointwise
from bam_ppl.convert import attrs_of, group, import_arviz, with_groups

matplotlib.use("Agg")
az = import_arviz()
AZ_MAJOR = int(az.__version__.split(".")[0])

X_SMALL = NUMPYRO_X
NMF = bam.models.nmf(2, a=2.0)
FAST = {
    "smc": dict(num_particles=200, num_chains=2),
    "gibbs": dict(num_warmup=100, num_samples=200, num_chains=2),
    "vb": dict(num_samples=200),
    "nuts": NUTS_OPTIONS,
}


@functools.cache
def fit(method, structure="nmf"):
    model = NMF if structure == "nmf" else bam.models.independence(2) if structure == "indep" else structure
    options = {**FAST[method]}
    if method == "gibbs":
        options["progress_bar"] = False
    return bam.infer(model, X_SMALL, method=method, rng_key=0, **options)


def _plot_ppc(idata):
    """az.plot_ppc (ArviZ 0.x) or its 1.x successor az.plot_ppc_dist."""
    import matplotlib.pyplot as plt

    if hasattr(az, "plot_ppc_dist") and AZ_MAJOR >= 1:
        az.plot_ppc_dist(idata, backend="matplotlib")
    else:
        az.plot_ppc(idata)
    plt.close("all")


def _loo(idata):
    result = az.loo(idata)
    return float(result.elpd_loo if AZ_MAJOR < 1 else result.elpd)


# -- point 3: pointwise log-likelihood, LOO, WAIC, compare ------------------------------------------
@pytest.mark.parametrize("method", ["smc", "gibbs", "nuts"])
def test_sampling_backends_write_pointwise_log_likelihood(method):
    idata = fit(method)
    ll = group(idata, "log_likelihood")["X"]
    obs = group(idata, "observed_data")["X"]
    assert ll.dims == ("chain", "draw", *obs.dims)
    assert ll.shape[2:] == X_SMALL.shape  # dense: zero cells are observations too
    assert np.isfinite(ll.values).all()
    assert np.isfinite(_loo(idata))
    if hasattr(az, "waic"):
        assert np.isfinite(float(az.waic(idata).elpd_waic))


def test_pointwise_values_are_poisson_cells_with_rate_times_p():
    idata = fit("gibbs")
    post = group(idata, "posterior")
    p = np.einsum("cdk,cdki,cdkj->cdij", *(post[f"theta_{n}"].values.astype(float) for n in "kij"))
    rate = post["total_rate"].values.astype(float)[..., None, None]
    expected = poisson.logpmf(X_SMALL, rate * p)
    np.testing.assert_allclose(group(idata, "log_likelihood")["X"].values, expected, rtol=1e-6, atol=1e-9)


def test_pointwise_sum_matches_numpyro_program_log_likelihood():
    # NUTS draws through the (sparse) NumPyro program: its X and X_zero_cells sites sum to ours.
    idata = fit("nuts")
    post = group(idata, "posterior")
    samples = {k: post[k].values[0] for k in ("total_rate", "theta_k", "theta_i", "theta_j")}
    ref = numpyro_log_likelihood(NMF.numpyro_model(), samples, X_SMALL, dense=False)
    total = np.asarray(ref["X"]).sum(-1) + np.asarray(ref["X_zero_cells"])
    ours = group(idata, "log_likelihood")["X"].values[0].sum((-2, -1))
    np.testing.assert_allclose(ours, total, rtol=1e-4)


def test_condition_on_pointwise_sums_to_the_multinomial():
    model = bam.models.lda(2, a=2.0)
    idata = bam.infer(model, X_SMALL, method="gibbs", rng_key=0, num_warmup=20, num_samples=30,
                      num_chains=2, progress_bar=False)
    post = group(idata, "posterior")
    theta_k, theta_w = post["theta_k"].values.astype(float), post["theta_w"].values.astype(float)
    ll = group(idata, "log_likelihood")["X"]
    assert ll.dims == ("chain", "draw", "d", "w")
    for c, t in [(0, 0), (1, 17)]:
        p = theta_k[c, t] @ theta_w[c, t]
        exact = sum(multinomial.logpmf(X_SMALL[d], X_SMALL[d].sum(), p[d] / p[d].sum()) for d in range(3))
        assert ll.values[c, t].sum() == pytest.approx(exact, rel=1e-6)
    # the coefficient is apportioned by counts: a zero cell contributes exactly 0
    assert np.all(ll.values[:, :, X_SMALL == 0] == 0.0)


def test_large_tables_get_the_aggregated_zero_cell_entry(monkeypatch):
    idata_dense = fit("gibbs")
    monkeypatch.setattr(pointwise, "DENSE_CELL_LIMIT", 5)  # the module limit, read at call time
    bound = NMF.bind(X_SMALL)
    post = group(idata_dense, "posterior")
    theta = {n: post[f"theta_{n}"].values for n in "kij"}
    variables, _ = pointwise.allocation_log_likelihood(
        bound, NMF.as_data(X_SMALL), theta, post["total_rate"].values)
    dims, values = variables["X"]
    assert dims == ("chain", "draw", "X_cell")
    assert values.shape[-1] == np.count_nonzero(X_SMALL) + 1
    dense = group(idata_dense, "log_likelihood")["X"].values.sum((-2, -1))
    np.testing.assert_allclose(values.sum(-1), dense, rtol=1e-6)
    with pytest.raises(ValueError, match="max_elements"):
        pointwise.allocation_log_likelihood(bound, NMF.as_data(X_SMALL), theta, post["total_rate"].values,
                                            max_elements=10)


def test_fit_too_large_for_a_pointwise_log_likelihood_says_why(monkeypatch):
    monkeypatch.setattr(pointwise, "MAX_WORK", 10)
    idata = bam.infer(NMF, X_SMALL, method="gibbs", rng_key=0, num_warmup=5, num_samples=5,
                      progress_bar=False)
    assert "log_likelihood" not in (list(idata.children) if AZ_MAJOR >= 1 else idata.groups())
    assert "max_work" in attrs_of(idata)["log_likelihood"]


def test_az_compare_of_two_structures():
    fits = {"nmf": fit("gibbs"), "independence": fit("gibbs", "indep")}
    table = az.compare(fits)
    assert set(table.index) == {"nmf", "independence"}
    assert np.isfinite(table.iloc[:, :3].to_numpy(dtype=float)).all()


V_NBMF = (np.random.default_rng(1).random((7, 6)) < 0.4).astype(float)
V_NBMF[2, 3] = np.nan


@functools.cache
def fit_nbmf(prior):
    return bam.infer(bam.models.nbmf(2, prior=prior), V_NBMF, method="gibbs", rng_key=0, num_warmup=20,
                     num_samples=20, num_chains=2, thinning=1, progress_bar=False)


def test_nbmf_writes_bernoulli_log_likelihood():
    idata = fit_nbmf("dir-beta")
    ll = group(idata, "log_likelihood")["V"]
    observed = ~np.isnan(V_NBMF)
    assert ll.dims == ("chain", "draw", "observed_entry") and ll.shape[-1] == observed.sum()
    post = group(idata, "posterior")
    p = np.einsum("cdfk,cdkn->cdfn", post["W"].values.astype(float), post["H"].values.astype(float))
    v = V_NBMF[observed]
    np.testing.assert_allclose(ll.values, v * np.log(p[:, :, observed]) + (1 - v) * np.log1p(-p[:, :, observed]),
                               rtol=1e-5)
    assert np.isfinite(_loo(idata))
    # fully observed data keep the (row, col) dims of observed_data
    full = pointwise.bernoulli_log_likelihood(post["W"].values, post["H"].values, np.nan_to_num(V_NBMF),
                                              np.ones(V_NBMF.shape, bool))
    assert full["V"][0] == ("chain", "draw", "row", "col")


def test_dirichlet_tucker_log_likelihood_stat_renamed():
    rng = np.random.default_rng(0)
    X = rng.multinomial(20, np.full(12, 1 / 12), size=(3, 2)).reshape(3, 2, 4, 3)
    model = bam.models.dirichlet_tucker((2, 2, 2, 2), alpha=1.1)
    idata = bam.infer(model, X, method="map", rng_key=0, num_iters=5, num_chains=1)
    stats = group(idata, "sample_stats")
    assert "log_likelihood" not in stats and stats["final_log_likelihood"].dims == ("chain",)


@pytest.mark.integration  # NumPyro's MCMC driver initialises op by op: ~380 programs
def test_raw_program_gives_one_log_likelihood_array_to_arviz():
    from numpyro.infer import MCMC, NUTS

    program = NMF.numpyro_model()
    # Trees of at most 2^5 steps: the conversion is what is checked, and early warmup on this
    # program runs to the default depth's 1023 steps (17 s instead of 4).
    mcmc = MCMC(NUTS(program, max_tree_depth=5), num_warmup=20, num_samples=20, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X_SMALL)
    ll = group(az.from_numpyro(mcmc, log_likelihood=True), "log_likelihood")
    assert list(ll.data_vars) == ["X"] and ll["X"].shape[2:] == X_SMALL.shape


# -- point 4: posterior predictive ---------------------------------------------------------------
@pytest.mark.parametrize("method", ["smc", "gibbs", "vb", "nuts"])
def test_posterior_predictive_and_plot_ppc(method):
    idata = fit(method)
    out = bam.posterior_predictive(NMF, idata, rng_key=1)
    rep = group(out, "posterior_predictive")["X"]
    obs = group(out, "observed_data")["X"]
    post = group(idata, "posterior")
    assert rep.dims == ("chain", "draw", *obs.dims)
    assert rep.shape[:2] == (post.sizes["chain"], post.sizes["draw"])
    # Replicates scatter around the data: the total's posterior mean is (a + T)/(1 + b) = T at
    # b = a/T, and each replicate total is Poisson around a Gamma(a + T, 1 + b) rate, so its
    # spread is about sqrt(2T); the mean over the draws lies within 4 Monte Carlo standard errors
    # of T (ArviZ's effective sample size: MCMC draws are correlated).
    totals = rep.sum(obs.dims).values
    T = X_SMALL.sum()
    mcse = totals.std() / np.sqrt(float(np.asarray(az.ess(totals))))
    assert abs(totals.mean() - T) <= 4 * mcse + 0.05
    assert 0.5 * np.sqrt(2 * T) <= totals.std() <= 2 * np.sqrt(2 * T)
    # the same key gives the same replicates
    again = group(bam.posterior_predictive(NMF, idata, rng_key=1), "posterior_predictive")["X"]
    np.testing.assert_array_equal(rep.values, again.values)
    _plot_ppc(out)


def test_posterior_predictive_conditioned_totals_and_nbmf():
    model = bam.models.lda(2, a=2.0)
    idata = bam.infer(model, X_SMALL, method="gibbs", rng_key=0, num_warmup=20, num_samples=20,
                      num_chains=2, progress_bar=False)
    rep = group(bam.posterior_predictive(model, idata, rng_key=0), "posterior_predictive")["X"]
    np.testing.assert_array_equal(rep.sum("w").values, np.broadcast_to(X_SMALL.sum(1), (2, 20, 3)))
    nbmf = bam.models.nbmf(2, prior="dir-beta")
    out = bam.posterior_predictive(nbmf, fit_nbmf("dir-beta"), rng_key=0)
    rep = group(out, "posterior_predictive")["V"]
    assert rep.dims == ("chain", "draw", "row", "col") and np.isnan(rep.values[:, :, 2, 3]).all()
    assert set(np.unique(rep.values[~np.isnan(rep.values)])) <= {0.0, 1.0}
    _plot_ppc(out)


def test_predictive_on_the_program_mentions_total():
    program = NMF.numpyro_model()
    post = group(fit("gibbs"), "posterior")
    draws = {k: post[k].values[0, :10] for k in ("total_rate", "theta_k", "theta_i", "theta_j")}
    with pytest.raises(ValueError, match="total="):
        Predictive(program, posterior_samples=draws)(jax.random.PRNGKey(0), shape=X_SMALL.shape)
    ppc = Predictive(program, posterior_samples=draws)(jax.random.PRNGKey(0), shape=X_SMALL.shape,
                                                       total=int(X_SMALL.sum()))
    assert ppc["X"].shape == (10, *X_SMALL.shape)


@pytest.mark.parametrize("prior", ["dir-dir", "dir-beta"])
def test_nbmf_predictive_uses_posterior_H(prior):
    model = bam.models.nbmf(2, prior=prior)
    idata = fit_nbmf(prior)
    post = group(idata, "posterior")
    samples = {k: post[k].values[0] for k in post.data_vars}
    assert "H_columns" in samples
    out = Predictive(model.numpyro_model(), posterior_samples=samples, return_sites=["H"])(
        jax.random.PRNGKey(0), shape=V_NBMF.shape)
    np.testing.assert_allclose(np.asarray(out["H"]), post["H"].values[0], rtol=1e-5)


# -- point 5: label switching --------------------------------------------------------------------
def _planted_nmf(seed=0, K=3, size=(12, 9), total=900):
    rng = np.random.default_rng(seed)
    I, J = size
    rows = np.zeros((K, I))
    cols = np.zeros((K, J))
    for k in range(K):
        rows[k, k * I // K:(k + 1) * I // K] = 1.0
        cols[k, k * J // K:(k + 1) * J // K] = 1.0
    rows /= rows.sum(1, keepdims=True)
    cols /= cols.sum(1, keepdims=True)
    p = np.einsum("k,ki,kj->ij", np.full(K, 1 / K), rows, cols)
    return rng.multinomial(total, p.ravel()).reshape(size)


def test_relabel_aligns_gibbs_chains():
    X = _planted_nmf()
    model = bam.models.nmf(3)
    with pytest.warns(bam.LabelSwitchingWarning, match="bam.relabel"):
        idata = bam.infer(model, X, method="gibbs", rng_key=3, num_warmup=100, num_samples=200,
                          num_chains=4, progress_bar=False)
    names = ["theta_k", "theta_i", "theta_j"]
    assert bam.switched_chains(idata)["k"]

    def max_rhat(data):
        r = az.rhat(group(data, "posterior")[names])
        return max(float(np.nanmax(np.asarray(r[n]))) for n in names)

    before = max_rhat(idata)
    aligned = bam.relabel(idata)
    after = max_rhat(aligned)
    assert before > 1.5, before
    assert after < 1.05, after
    # label-invariant quantities are unchanged: p(cell) of every draw and the total rate
    def cells(data):
        post = group(data, "posterior")
        return np.einsum("cdk,cdki,cdkj->cdij", *(post[n].values for n in names))

    np.testing.assert_allclose(cells(aligned), cells(idata), rtol=1e-5)
    np.testing.assert_array_equal(group(aligned, "posterior")["total_rate"].values,
                                  group(idata, "posterior")["total_rate"].values)
    assert group(aligned, "posterior").attrs["relabelled"] == "k"
    assert bam.switched_chains(aligned) == {}


def _with_chains(idata, tables):
    """``idata`` whose posterior ``theta_k`` is ``tables`` (chain, draw, k) and has no other latent variable."""
    post = group(idata, "posterior")[["theta_k"]].isel(chain=[0] * tables.shape[0], draw=slice(0, tables.shape[1]))
    post = post.assign_coords(chain=np.arange(tables.shape[0]))
    post["theta_k"] = post["theta_k"].copy(data=tables)
    return with_groups(idata, {"posterior": post})


def test_switched_chains_tells_permuted_labels_from_noise():
    """A chain whose classes are chain 0's permuted is found; chains that differ by noise, with classes of nearly
    equal weight, or a single chain are not."""
    idata = fit("gibbs")
    rng = np.random.default_rng(0)
    K = group(idata, "posterior").sizes["k"]
    weights = np.sort(rng.dirichlet(np.ones(K) * 5))
    noisy = weights + 0.01 * rng.standard_normal((3, 50, K))
    assert bam.switched_chains(_with_chains(idata, noisy)) == {}
    switched = noisy.copy()
    switched[2] = switched[2][:, ::-1]
    assert bam.switched_chains(_with_chains(idata, switched)) == {"k": [2]}
    even = 1.0 / K + 0.01 * rng.standard_normal((3, 50, K))  # any matching is as close as any other
    assert bam.switched_chains(_with_chains(idata, even)) == {}
    assert bam.switched_chains(_with_chains(idata, switched[2:])) == {}


def test_relabel_rejects_unknown_dims_and_leaves_latent_free_fits_alone():
    with pytest.raises(ValueError, match="not dims of the posterior"):
        bam.relabel(fit("gibbs"), dims="topic")
    free = fit("gibbs", "indep")
    same = bam.relabel(free)
    post = group(free, "posterior")
    for name in post.data_vars:
        np.testing.assert_array_equal(group(same, "posterior")[name].values, post[name].values)


RACED_IMPORT = """
import pathlib
replace = pathlib.Path.replace
calls = []


def raced(self, target):  # another process renames the shared temporary file first
    calls.append(target)
    if len(calls) == 1:
        replace(self, target)
        raise FileNotFoundError(str(self))
    return replace(self, target)


pathlib.Path.replace = raced
from bam_ppl.convert import import_arviz
print(import_arviz().summary.__name__, len(calls))
"""


def test_import_arviz_survives_the_daily_stamp_race(tmp_path):
    # ArviZ 0.23 renames a temporary file of a fixed name on each day's first import; of two processes importing
    # it at once, one finds the file gone (seen on parallel test workers just after midnight).
    import os
    import subprocess
    import sys

    stamp = tmp_path / "arviz" / "daily_warning"
    stamp.parent.mkdir()
    stamp.write_text("2000-01-01")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", RACED_IMPORT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    if AZ_MAJOR == 0 and stamp.read_text() != "2000-01-01":  # ArviZ 0.23 wrote its stamp: the race was run
        assert done.stdout.split() == ["summary", "1"]
