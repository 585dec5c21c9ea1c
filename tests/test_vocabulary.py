"""One option vocabulary: every registered backend and evidence estimator names the same idea the
same way (bam_ppl.infer.registry's module docstring), and the old names warn, then work."""

import inspect
import warnings

import numpy as np
import pytest

import bam_ppl as bam
from bam_ppl.infer import registry
from bam_ppl.infer.variational.vb import vb as vb_backend

X = np.array([[3, 0, 1], [0, 2, 1]])
OLD_NAMES = {"num_runs", "num_restarts", "kernel"}
# Backends and estimators that run independent chains, runs or restarts.
CHAIN_BACKENDS = {"gibbs", "nuts", "smc", "vb", "cvb", "map"}
CHAIN_ESTIMATORS = {"smc", "tempered", "chib", "vb"}
SAMPLERS = {"gibbs", "nuts"}  # MCMC: 4 chains, so that R-hat and ESS have several to compare
ENGINES = {("inference", "gibbs"), ("inference", "smc"), ("evidence", "smc"), ("evidence", "tempered"),
           ("evidence", "chib")}


def registered():
    """(kind, method, model types, fn) of every backend and evidence estimator."""
    for name, backends in registry._BACKENDS.items():
        for backend in backends:
            yield "inference", name, backend.models, backend.fn
    for name, entries in registry._EVIDENCE.items():
        for models, fn in entries:
            yield "evidence", name, models, fn


def label(kind, name, models):
    return f"{kind} {name!r} for {[m.__name__ for m in models]}"


def test_methods_lists_every_registered_function():
    listed = set(bam.methods()["method"]) | set(bam.methods("evidence")["method"])
    assert listed == {name for _, name, _, _ in registered()}


def test_no_public_signature_holds_an_old_or_internal_name():
    for kind, name, models, fn in registered():
        params = inspect.signature(fn).parameters
        assert not OLD_NAMES & set(params), label(kind, name, models)
        # first_chain / first_restart are set by the executor code only, as the private _first_chain.
        assert not [p for p in params if p.startswith("first_")], label(kind, name, models)


def test_every_backend_with_independent_runs_takes_num_chains_with_one_default_per_kind():
    for kind, name, models, fn in registered():
        params = inspect.signature(fn).parameters
        named = name in (CHAIN_BACKENDS if kind == "inference" else CHAIN_ESTIMATORS)
        # PMF's vb is one deterministic fit from a fixed start: nothing to run independently.
        if "_first_chain" in params or named and "PMFTensorModel" not in [m.__name__ for m in models]:
            assert "num_chains" in params, label(kind, name, models)
        if kind == "inference" and name in SAMPLERS or kind == "evidence" and name in {"smc", "tempered", "chib"}:
            assert params["num_chains"].default == 4, label(kind, name, models)


def test_steps_warmup_and_engine_mean_one_thing():
    for kind, name, models, fn in registered():
        params = inspect.signature(fn).parameters
        if "num_steps" in params:  # optimiser steps
            assert name == "svi", label(kind, name, models)
        if "num_warmup" in params:  # discarded sweeps of an MCMC sampler
            assert kind == "inference" and name in SAMPLERS, label(kind, name, models)
        if (kind, name) in ENGINES and "AllocationModel" in [m.__name__ for m in models]:
            assert "engine" in params, label(kind, name, models)


def test_every_renamed_option_maps_an_old_name_to_a_name_of_the_signature():
    for kind, name, models, fn in registered():
        renames = getattr(fn, "renamed_options", {})
        params = inspect.signature(fn).parameters
        # "auto" hands **options on to the estimators it runs, which take the new names.
        passes_on = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        for old, new in renames.items():
            assert (passes_on or new in params) and old not in params, (label(kind, name, models), old, new)


def test_old_names_warn_then_run_as_the_new_ones():
    model = bam.models.nmf(2)
    with pytest.warns(FutureWarning, match="'num_restarts' is deprecated.*use 'num_chains'"):
        old = bam.infer(model, X, method="vb", rng_key=0, num_restarts=2, num_iters=5, num_samples=3)
    new = bam.infer(model, X, method="vb", rng_key=0, num_chains=2, num_iters=5, num_samples=3)
    np.testing.assert_array_equal(old.posterior["theta_i"].values, new.posterior["theta_i"].values)
    assert old.attrs["num_restarts"] == 2  # the result's attribute keeps its name
    # The backend function itself accepts the old name too.
    with pytest.warns(FutureWarning, match="num_chains"):
        direct = vb_backend(model, X, rng_key=0, num_restarts=2, num_iters=5, num_samples=3)
    np.testing.assert_array_equal(direct.posterior["theta_i"].values, new.posterior["theta_i"].values)


def test_old_evidence_names_warn_then_run_as_the_new_ones():
    model = bam.models.nmf(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        with pytest.warns(FutureWarning, match="'num_runs'.*'num_chains'"):
            old = bam.log_evidence(model, X, method="tempered", rng_key=0, num_runs=2, num_particles=8)
        new = bam.log_evidence(model, X, method="tempered", rng_key=0, num_chains=2, num_particles=8)
        assert old.run_values == new.run_values and old.num_runs == 2
        with pytest.warns(FutureWarning) as caught:
            chib = bam.log_evidence(model, X, method="chib", rng_key=0, num_runs=2, num_searches=2, num_warmup=7,
                                    num_steps=9, kernel="auto")
    said = " ".join(str(w.message) for w in caught)
    for new_name in ("num_chains", "num_search_sweeps", "num_samples", "engine"):
        assert f"use {new_name!r}" in said
    assert chib.details["num_runs"] == 2 and chib.details["num_warmup"] == 7 and chib.details["num_steps"] == 9


@pytest.mark.parametrize("call", [
    lambda: bam.infer(bam.models.nmf(2), X, method="map", num_restarts=2, num_chains=2),
    lambda: bam.log_evidence(bam.models.nmf(2), X, method="smc", kernel="jax", engine="jax"),
    lambda: vb_backend(bam.models.nmf(2), X, num_restarts=2, num_chains=2),
])
def test_old_and_new_name_together_are_an_error_naming_both(call):
    with pytest.raises(ValueError, match=r"'(num_restarts|kernel)' and '(num_chains|engine)'"):
        call()


def test_allocation_models_default_to_collapsed_gibbs():
    assert bam.models.nmf(2).default_method == "gibbs"
    idata = bam.infer(bam.models.nmf(2), X, num_warmup=2, num_samples=3, num_chains=1, progress_bar=False)
    assert idata.attrs["num_warmup"] == 2 and "log_joint" in idata.sample_stats


def test_select_ranks_takes_fit_options_as_keywords():
    options = dict(grid={"rank": [1, 2]}, heldout_axes=(0, 1), heldout_fraction=0.3, folds=1, rng_key=0)
    data = np.array([[3, 0, 1, 2], [0, 2, 1, 0], [2, 1, 0, 3]])
    keywords = bam.select_ranks(bam.models.nmf, data, num_iters=20, num_chains=1, **options)
    with pytest.warns(FutureWarning, match="fit_options"):
        old = bam.select_ranks(bam.models.nmf, data, fit_options=dict(num_iters=20, num_chains=1), **options)
    np.testing.assert_array_equal(keywords["heldout_loglik"].values, old["heldout_loglik"].values)
    # A keyword the model factory names still goes to it (nmf's a).
    assert len(bam.select_ranks(bam.models.nmf, data, num_iters=20, num_chains=1, a=2.0, **options)) == 2
