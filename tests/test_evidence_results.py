"""Evidence results a user can keep: typed fields, a JSON round trip, a comparison table in the
columns of ``arviz.compare``, and an estimate stored in (and read back from) an InferenceData."""

import json
import math
import warnings
from dataclasses import replace

import numpy as np
import pytest

import bam_ppl as bam
from bam_ppl.convert import group, import_arviz, to_inference_data
from bam_ppl.evidence import EvidenceEstimate, check_estimate, evidence_methods, pool_runs
from bam_ppl.infer import info
from bam_ppl.infer.registry import register_evidence

# Each estimator at the smallest settings that still run every stage.
SETTINGS = {
    "exact": {},
    "smc": dict(num_particles=50, num_chains=3, progress_bar=False),
    "tempered": dict(num_particles=32, num_chains=2, progress_bar=False),
    "mixture": dict(num_particles=16, num_scouts=2, num_chains=2, progress_bar=False),
    "chib": dict(num_chains=2, num_searches=2, num_search_sweeps=5, num_samples=10, progress_bar=False),
    "vb": dict(num_chains=3),
}
INFO_TYPES = {"exact": info.ExactInfo, "smc": info.PolyaUrnInfo, "tempered": info.TemperedInfo,
              "mixture": info.MixtureInfo, "chib": info.ChibInfo, "vb": info.VBInfo}


# 26 tokens in 19 cells: beyond enumeration for method="auto".
MEDIUM = np.array([[3, 2, 0, 1], [2, 3, 1, 0], [0, 1, 3, 2], [1, 0, 2, 3], [1, 1, 0, 0]])


@pytest.fixture(scope="module")
def auto_estimate():
    """method="auto" beyond enumeration: the mixture engine's estimate, its info nested in auto's."""
    return bam.log_evidence(bam.models.nmf(2), MEDIUM, rng_key=0, num_particles=16, num_scouts=2, num_chains=2,
                            vb_restarts=2)


@pytest.fixture(scope="module")
def estimates():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        return {method: bam.log_evidence(bam.models.nmf(2), np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]]),
                                         method=method, rng_key=0, **options)
                for method, options in SETTINGS.items()}


def test_every_estimator_fills_the_typed_fields(estimates):
    for method, est in estimates.items():
        assert est.method == est.pipeline == method and est.method in evidence_methods()
        assert est.seconds > 0 and math.isfinite(est.seconds), method
        assert est.warnings == ()
        assert est.num_runs == len(est.run_values) and all(isinstance(run, float) for run in est.run_values)
    exact = estimates["exact"].value
    assert estimates["exact"].num_runs == 0 and math.isnan(estimates["exact"].lower_bound)
    for method in ("smc", "tempered", "mixture", "chib"):
        est = estimates[method]
        assert est.num_runs == SETTINGS[method]["num_chains"]
        assert est.run_values == tuple(est.details["run_log_evidence"])
        assert est.value == pytest.approx(pool_runs(est.run_values)[0])
        assert est.lower_bound == est.details["lower_bound"] <= exact + 1e-9
    vb = estimates["vb"]
    assert vb.lower_bound == vb.value == max(*vb.run_values, vb.info.moved_elbo) <= exact + 1e-9 and vb.num_runs == 3


def test_every_estimator_reports_its_own_typed_info(estimates):
    for method, est in estimates.items():
        assert type(est.info) is INFO_TYPES[method], method
        assert {name: est.details[name] for name in est.info._fields} == est.info._asdict(), method
    assert estimates["tempered"].info.num_runs == len(estimates["tempered"].info.num_temperatures) == 2
    assert estimates["vb"].info.best_start is None and len(estimates["vb"].info.elbo_per_restart) == 3
    # method="auto" says why it chose, with the info of the estimate it kept.
    est = bam.log_evidence(bam.models.nmf(2), np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]]))
    assert isinstance(est.info, info.AutoInfo) and isinstance(est.info.kept_info, info.ExactInfo)
    assert est.info.reason and est.info.effort == 1.0


def test_the_info_wins_over_details_of_the_same_name(estimates):
    # details are built from the typed result: a replace that passes stale details cannot undo it.
    est = estimates["smc"]
    changed = replace(est, info=est.info._replace(min_ess=1.0))
    assert changed.details["min_ess"] == changed.info.min_ess == 1.0
    assert replace(changed, details={**changed.details, "min_ess": 7.0}).details["min_ess"] == 1.0
    with pytest.raises(TypeError, match="info must be"):
        EvidenceEstimate(-1.0, 0.1, "smc", "estimate", info={"min_ess": 1.0})


def test_auto_reports_method_auto_and_what_ran_in_its_pipeline(x1, auto_estimate):
    est = bam.log_evidence(bam.models.nmf(2), x1)
    assert (est.method, est.pipeline, est.kind) == ("auto", "exact", "exact")
    assert "pipeline='exact'" in repr(est)
    est = auto_estimate
    assert (est.method, est.pipeline, est.kind) == ("auto", "mixture", "estimate") and est.num_runs == 2
    assert isinstance(est.info.kept_info, info.MixtureInfo) and est.details["num_scouts"] == 2
    # details: one flat dict, the engine's fields one by one beside auto's own
    assert "kept_info" not in est.details and est.details["reason"] == est.info.reason
    assert all(est.details[key] is value for key, value in est.info.kept_info._asdict().items() if key != "effort")


def test_estimates_built_from_details_alone_get_typed_fields():
    # Third-party estimators that fill only details, as before the typed fields.
    est = EvidenceEstimate(-10.0, 0.2, "smc", "estimate",
                           {"run_log_evidence": np.array([-10.1, -9.9]), "lower_bound": -12.0, "seconds": 1.5})
    assert est.run_values == (-10.1, -9.9) and est.num_runs == 2
    assert est.lower_bound == -12.0 and est.seconds == 1.5 and est.pipeline == "smc"
    plain = EvidenceEstimate(-5.0, 0.0, "exact", "exact")
    assert plain.run_values == () and math.isnan(plain.lower_bound) and plain.warnings == ()


def test_json_round_trip(estimates, auto_estimate):
    combined = auto_estimate
    for est in [*estimates.values(), combined]:
        text = json.dumps(est.to_dict(), allow_nan=False)  # strict JSON: no NaN
        back = EvidenceEstimate.from_dict(json.loads(text))
        assert back == est  # value, stderr, method, kind
        for name in ("lower_bound", "seconds", "stderr"):
            a, b = getattr(back, name), getattr(est, name)
            assert (math.isnan(a) and math.isnan(b)) or a == b, name
        assert (back.num_runs, back.pipeline, back.warnings) == (est.num_runs, est.pipeline, est.warnings)
        np.testing.assert_array_equal(back.run_values, est.run_values)
        assert json.dumps(back.to_dict(), allow_nan=False) == text  # details: lists where arrays were
        assert type(back.info) is type(est.info) and back.info._fields == est.info._fields
    back = EvidenceEstimate.from_dict(json.loads(json.dumps(combined.to_dict(), allow_nan=False)))
    assert type(back.info.kept_info) is info.MixtureInfo  # the nested info, typed again
    assert back.info.kept_info.chain_sweeps == list(combined.info.kept_info.chain_sweeps)
    with pytest.raises(ValueError, match="info must name one of"):
        EvidenceEstimate.from_dict(dict(combined.to_dict(), info={"type": "NoSuchInfo", "fields": {}}))
    tempered = estimates["tempered"].to_dict()["details"]
    assert tempered["best_cells"] == estimates["tempered"].details["best_cells"].tolist()


@pytest.mark.parametrize("bad, error, match", [
    ([1, 2], TypeError, "data must be a dict"),
    ({"value": 1.0, "stderr": 0.0, "method": "smc"}, ValueError, r"lacks \['kind'\]"),
    ({"value": "high", "stderr": 0.0, "method": "smc", "kind": "estimate"}, TypeError, "value"),
    ({"value": 1.0, "stderr": 0.0, "method": "smc", "kind": "guess"}, ValueError, "kind"),
])
def test_from_dict_names_what_is_wrong(bad, error, match):
    with pytest.raises(error, match=match):
        EvidenceEstimate.from_dict(bad)


@pytest.mark.parametrize("field, bad, match", [
    ("method", 3, "method"), ("num_runs", -1, "num_runs"), ("warnings", "runs disagree", "warnings"),
    ("lower_bound", "low", "lower_bound"), ("details", [1], "details"),
])
def test_bad_fields_are_named(field, bad, match):
    with pytest.raises(TypeError, match=match):
        EvidenceEstimate(**{**dict(value=-1.0, stderr=0.1, method="smc", kind="estimate"), field: bad})


def _estimate(runs, bound=None, method="smc"):
    value, stderr = pool_runs(runs)
    details = {"run_log_evidence": list(runs)}
    if bound is not None:
        details["lower_bound"] = bound
    return EvidenceEstimate(value, stderr, method, "estimate", details)


@register_evidence("runs_that_disagree")
def _runs_that_disagree(model, data, *, rng_key=0):
    return _estimate([-3300.0, -3400.0, -3350.0], method="runs_that_disagree")


def test_evidence_warnings_stay_with_the_estimate(x2):
    assert check_estimate(_estimate([-10.0, -10.2])).warnings == ()
    with pytest.warns(bam.EvidenceWarning, match="disagree"):
        flagged = check_estimate(_runs_that_disagree(None, None))
    assert len(flagged.warnings) == 1 and "runs disagree" in flagged.warnings[0]
    # Kept even where a filter hides the warning, and raised as before where none does.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        quiet = bam.log_evidence(bam.models.nmf(2), x2, method="runs_that_disagree")
    assert quiet.warnings == flagged.warnings
    with pytest.warns(bam.EvidenceWarning, match="disagree") as caught:
        bam.log_evidence(bam.models.nmf(2), x2, method="runs_that_disagree")
    assert caught[0].filename == __file__  # the user's line, not bam_ppl's
    with warnings.catch_warnings():
        warnings.simplefilter("error", bam.EvidenceWarning)
        with pytest.raises(bam.EvidenceWarning):
            bam.log_evidence(bam.models.nmf(2), x2, method="runs_that_disagree")


def test_compare_has_the_columns_of_arviz_compare(x2):
    with pytest.warns(bam.EvidenceWarning, match="disagree"):
        table = bam.compare({"exact": bam.models.nmf(1), "two": bam.models.nmf(2), "bad": bam.models.nmf(2)}, x2,
                            method={"exact": "exact", "two": "exact", "bad": "runs_that_disagree"})
    assert list(table.columns[:9]) == ["rank", "log_evidence", "se", "dse", "weight", "warning", "kind", "method",
                                       "lower_bound"]
    assert table["rank"].tolist() == [1, 2, 3] and table.index[-1] == "bad"
    assert table["warning"].tolist() == [False, False, True]
    assert table["weight"].sum() == pytest.approx(1.0)
    assert table["weight"].iloc[0] / table["weight"].iloc[1] == pytest.approx(
        math.exp(table["log_evidence"].iloc[0] - table["log_evidence"].iloc[1]))
    assert table["dse"].iloc[0] == 0.0 and table["dse"].iloc[1] == 0.0  # two exact values
    np.testing.assert_allclose(table["log_bayes_factor"], table["log_evidence"] - table["log_evidence"].max())
    # Deprecated names, kept for one release.
    np.testing.assert_allclose(table["delta"], -table["log_bayes_factor"])
    assert table["stderr"].equals(table["se"]) and table["prob"].equals(table["weight"])


def test_dse_is_the_error_of_the_difference_to_the_best():
    a, b, c = _estimate([-100.0, -100.5, -99.5]), _estimate([-103.0, -103.3]), _estimate([-150.0, -150.4, -150.2])
    table = bam.compare({"c": c, "a": a, "b": b}, data=None)
    assert list(table.index) == ["a", "b", "c"]
    assert table.loc["b", "dse"] == pytest.approx(math.hypot(a.stderr, b.stderr))
    assert table.loc["c", "dse"] == pytest.approx(math.hypot(a.stderr, c.stderr))
    assert table.loc["a", "lower_bound"] != table.loc["a", "lower_bound"]  # nan: none reported
    assert not table["warning"].any()


def test_plot_evidence_reads_the_new_and_the_old_columns():
    import matplotlib

    matplotlib.use("Agg")
    table = bam.compare({"R=1": _estimate([-10.0, -10.4]), "R=2": _estimate([-9.0, -9.2])}, data=None)
    for columns in (table.drop(columns=["stderr"]), table.drop(columns=["se"])):
        ax = bam.plot_evidence(columns)
        assert any(len(line.get_xdata()) for line in ax.get_lines())


def _idata():
    draws = np.random.default_rng(0).normal(size=(2, 5))
    return to_inference_data({"posterior": {"theta": (("chain", "draw"), draws)},
                              "sample_stats": {"log_joint": (("chain", "draw"), draws)}})


@pytest.mark.parametrize("with_stats", [True, False])
def test_evidence_in_an_inference_data_survives_netcdf(tmp_path, estimates, with_stats):
    az = import_arviz()
    idata = _idata()
    if not with_stats:
        idata = to_inference_data({"posterior": {"theta": (("chain", "draw"), np.zeros((1, 3)))}})
    est = estimates["tempered"]
    assert bam.add_evidence(idata, est) is idata
    path = tmp_path / "fit.nc"
    idata.to_netcdf(str(path))
    loaded = az.from_netcdf(str(path))
    back = bam.read_evidence(loaded)
    assert back == est and back.run_values == est.run_values and back.lower_bound == est.lower_bound
    stats = group(loaded, "sample_stats")
    assert float(stats["log_marginal_likelihood"]) == est.value  # where PyMC's SMC keeps it
    assert stats["log_marginal_likelihood"].attrs["method"] == "tempered"
    if with_stats:
        assert stats["log_joint"].shape == (2, 5)


def test_log_evidence_stores_into_idata_and_bad_input_is_named(x1):
    idata = _idata()
    est = bam.log_evidence(bam.models.nmf(2), x1, idata=idata)
    assert bam.read_evidence(idata) == est and bam.read_evidence(idata).pipeline == "exact"
    with pytest.raises(TypeError, match="idata"):
        bam.log_evidence(bam.models.nmf(2), x1, idata={"posterior": None})
    with pytest.raises(TypeError, match="estimate"):
        bam.add_evidence(_idata(), -3.0)
    with pytest.raises(ValueError, match="no evidence estimate"):
        bam.read_evidence(_idata())


def test_the_demo_prints_a_narrow_table_and_the_classes():
    import xarray as xr

    from bam_ppl.cli import _class_profiles, _demo_table

    table = bam.compare({"2 latent classes": _estimate([-129.9, -130.0]), "independence": EvidenceEstimate(
        -180.18, 0.0, "auto", "exact", pipeline="exact")}, data=None)
    lines = _demo_table(table).splitlines()
    assert len(lines) == 3 and max(map(len, lines)) < 60
    assert lines[1].split()[-2:] == ["0.05", "1.000"] and lines[2].split()[-3:] == ["exact", "<", "0.001"]
    posterior = xr.Dataset({
        "theta_r": (("chain", "draw", "r"), np.full((1, 2, 2), [0.7, 0.3])),
        "theta_hair": (("chain", "draw", "r", "hair"), np.broadcast_to([[0.9, 0.1], [0.2, 0.8]], (1, 2, 2, 2))),
    }, coords={"hair": ["Black", "Blond"]})
    assert _class_profiles(posterior, ("hair",)).splitlines()[1:] == ["  0        0.70  Black 0.90",
                                                                      "  1        0.30  Blond 0.80"]
