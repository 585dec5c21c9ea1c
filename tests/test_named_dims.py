"""Data with named axes are matched to the model's nodes by name, through every entry point."""

import itertools

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from conftest import NUMPYRO_X, NUTS_OPTIONS, SVI_OPTIONS, SVI_X

import bam_ppl as bam
from bam_ppl.convert import group
from bam_ppl.data import CountTensor

AGES, REGIONS, VOTES = ["young", "mid", "old"], ["N", "E", "S", "W"], ["yes", "no"]


@pytest.fixture(scope="module")
def survey():
    """A long table age × region × vote whose vote depends on age only."""
    rng = np.random.default_rng(3)
    p_vote = np.array([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9]])
    rows = []
    for a, r in itertools.product(range(3), range(4)):
        n = rng.poisson(12)
        yes = rng.binomial(n, p_vote[a, 0])
        rows += [dict(age=AGES[a], region=REGIONS[r], vote="yes", Freq=yes),
                 dict(age=AGES[a], region=REGIONS[r], vote="no", Freq=n - yes)]
    df = pd.DataFrame(rows)
    for col, cats in (("age", AGES), ("region", REGIONS), ("vote", VOTES)):
        df[col] = pd.Categorical(df[col], categories=cats)
    return df


MODEL = bam.AllocationModel("age -> vote; region", latent={})
ORDERS = [["age", "region", "vote"], ["vote", "age", "region"], ["region", "vote", "age"]]


def _tensor(df, order):
    return CountTensor.from_dataframe(df, dims=order, count="Freq")


def test_named_dims_give_the_graph_the_user_wrote(survey):
    canonical = bam.log_evidence(MODEL, _tensor(survey, ["age", "vote", "region"]), method="exact").value
    wrong_graph = bam.AllocationModel("age -> region; vote", latent={})
    wrong = bam.log_evidence(wrong_graph, _tensor(survey, ["age", "region", "vote"]), method="exact").value
    assert canonical > wrong + 5  # the data support age -> vote, not age -> region
    for order in ORDERS:
        ct = _tensor(survey, order)
        assert bam.log_evidence(MODEL, ct, method="exact").value == pytest.approx(canonical, abs=1e-9)
        dense = ct.to_dense()
        da = xr.DataArray(dense, dims=order, coords={d: ct.coords[d] for d in order})
        assert bam.log_evidence(MODEL, da, method="exact").value == pytest.approx(canonical, abs=1e-9)
    # A DataFrame with node-named columns in any order, and its count column.
    shuffled = survey[["Freq", "vote", "region", "age"]]
    assert bam.log_evidence(MODEL, shuffled, method="exact").value == pytest.approx(canonical, abs=1e-9)


def test_mismatched_names_raise_naming_both_lists(survey):
    ct = CountTensor.from_dataframe(survey.rename(columns={"vote": "ballot"}), dims=["age", "region", "ballot"],
                                    count="Freq")
    with pytest.raises(ValueError, match=r"\['age', 'region', 'ballot'\].*\['age', 'vote', 'region'\]"):
        bam.log_evidence(MODEL, ct, method="exact")
    with pytest.raises(ValueError, match="no column for node"):
        bam.log_evidence(MODEL, survey.rename(columns={"vote": "ballot"})[["age", "region", "Freq"]],
                         method="exact")
    with pytest.raises(ValueError, match="neither visible nodes"):
        bam.log_evidence(MODEL, survey.assign(extra=1), method="exact")
    # A wide table of counts (rows and columns the two axes) is not read as one: the error says how to pass it.
    wide = pd.DataFrame([[2, 1, 0], [0, 3, 1]], index=["r1", "r2"], columns=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"no column for node\(s\) \['i', 'j'\].*df\.to_numpy\(\)"):
        bam.log_evidence(bam.models.nmf(2), wide, method="exact")
    words = pd.DataFrame({"doc": ["d1", "d1", "d2"], "word": ["cat", "dog", "cat"]})  # a long table, other names
    with pytest.raises(ValueError, match=r"rename the columns .* to \['d', 'w'\]"):
        bam.log_evidence(bam.models.lda(2), words, method="exact")
    labelled = CountTensor.from_dense(wide.to_numpy(), dims=["i", "j"], coords={"i": list(wide.index),
                                                                              "j": list(wide.columns)})
    assert bam.log_evidence(bam.models.nmf(2), labelled, method="exact").value == pytest.approx(
        bam.log_evidence(bam.models.nmf(2), wide.to_numpy(), method="exact").value, abs=1e-12)


def test_unnamed_and_foreign_names_are_positional():
    X = np.arange(24).reshape(3, 2, 4) % 5  # axes in observed order: age, vote, region
    ref = bam.log_evidence(MODEL, X, method="exact").value
    other = CountTensor.from_dense(X, dims=("a", "b", "c"))
    assert bam.log_evidence(MODEL, other, method="exact").value == pytest.approx(ref, abs=1e-12)


# The other tests here run Gibbs with these options too, so that JAX compiles each program once for the
# module (after the canonical reordering every column order gives the same arrays).
GIBBS = dict(num_warmup=5, num_samples=5, num_chains=2, progress_bar=False)


@pytest.mark.parametrize("method, options", [
    ("smc", dict(num_particles=50, num_chains=2)),
    ("gibbs", GIBBS),
    ("gibbs", {**GIBBS, "engine": "jax"}),
    ("vb", dict(num_iters=20)),
    ("cvb", dict(num_iters=20)),
    ("map", dict(num_iters=20)),
])
def test_infer_labels_tables_by_name(survey, method, options):
    """Every backend fits age -> vote and labels theta_vote with votes, whatever the column order."""
    model = MODEL.replace(a=30.0) if method == "map" else MODEL  # MAP needs concentrations >= 1
    results = []
    for order in (ORDERS[0], ORDERS[2]):
        idata = bam.infer(model, _tensor(survey, order), method=method, rng_key=1, **options)
        theta = group(idata, "posterior")["theta_vote"]
        assert theta.dims[-2:] == ("age", "vote")
        assert list(theta.coords["vote"].values) == VOTES
        assert list(theta.coords["age"].values) == AGES
        results.append(np.asarray(theta))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("method, X, options", [("nuts", NUMPYRO_X, NUTS_OPTIONS), ("svi", SVI_X, SVI_OPTIONS)])
def test_numpyro_backends_label_tables_by_name(method, X, options):
    """NUTS and SVI label theta_i and theta_j by the table's names, whatever its axis order (on the runs of
    test_arviz_user and test_numpyro: after the canonical reordering, their programs)."""
    rows, cols = [f"r{n}" for n in range(X.shape[0])], [f"c{n}" for n in range(X.shape[1])]
    model = bam.models.nmf(2, a=2.0)
    results = []
    for dims, counts in ((("i", "j"), X), (("j", "i"), X.T)):
        table = CountTensor.from_dense(counts, dims=dims, coords={"i": rows, "j": cols})
        posterior = group(bam.infer(model, table, method=method, rng_key=0, progress_bar=False, **options),
                          "posterior")
        assert posterior["theta_i"].dims[-1] == "i" and list(posterior["theta_i"].coords["i"].values) == rows
        assert posterior["theta_j"].dims[-1] == "j" and list(posterior["theta_j"].coords["j"].values) == cols
        assert all(posterior[name].dtype == np.float64 for name in posterior.data_vars)
        results.append(np.asarray(posterior["theta_j"]))
    np.testing.assert_array_equal(results[0], results[1])


def test_latent_free_gibbs_runs_on_both_kernels(survey):
    for kernel in ("numba", "jax"):
        idata = bam.infer(MODEL, _tensor(survey, ORDERS[1]), method="gibbs", rng_key=0, engine=kernel, **GIBBS)
        theta = group(idata, "posterior")["theta_vote"]
        assert theta.shape == (2, 5, 3, 2)
        np.testing.assert_allclose(theta.sum("vote"), 1.0, rtol=1e-5)


def test_compare_and_select_ranks_match_names(survey):
    models = {"age -> vote": MODEL, "independence": bam.AllocationModel("age; region; vote", latent={})}
    tables = [bam.compare(models, _tensor(survey, order), method="exact") for order in ORDERS]
    for table in tables[1:]:
        pd.testing.assert_frame_equal(table, tables[0])
    assert tables[0].index[0] == "age -> vote"

    def factory(rank):
        return bam.AllocationModel("r -> age; r -> region; r -> vote", latent={"r": rank})

    def score(model, X, heldout, rng_key):  # the data reach the score in the model's node order
        assert X.dims == model.observed
        return bam.log_evidence(model, X, method="vb", rng_key=rng_key, num_iters=30).value

    scores = [bam.select_ranks(factory, _tensor(survey, order), grid={"rank": [1, 2]}, rng_key=0,
                               heldout_axes=("age", "region"), score=score)["heldout_loglik"].to_numpy()
              for order in (ORDERS[0], ORDERS[1])]
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-6)


@pytest.mark.parametrize("method, options", [("gibbs", {**GIBBS, "engine": "jax"})])
def test_posterior_draws_are_float64_from_every_backend(survey, method, options):
    idata = bam.infer(MODEL, _tensor(survey, ORDERS[0]), method=method, rng_key=0, **options)
    posterior = group(idata, "posterior")
    assert all(posterior[name].dtype == np.float64 for name in posterior.data_vars)
