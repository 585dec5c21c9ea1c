"""method="auto" on small tables with many tokens per cell: within its stated error of a high-effort
reference, and never below its own sure lower bound."""

from __future__ import annotations

import warnings
from dataclasses import replace
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from oracles import assert_honest_against_exact

import bam_ppl as bam
from bam_ppl.estimate import below_bound, pool_runs
from bam_ppl.infer import auto
from bam_ppl.infer.auto import CONFIG, agree, choose_method, tempered_stage_options
from bam_ppl.infer.gibbs.chib import NO_SYMMETRIES
from bam_ppl.infer.info import AutoInfo
from bam_ppl.infer.smc import references as tempered_references

# High-effort references (`python benchmarks/high_effort_references.py`, rev. 24f99e3): the
# Pólya-urn SMC with 16 runs of 20 000 particles (key 123), cross-checked by the Chib-style
# estimator with 16 chains of 3000 sweeps (HairEyeColor CP(2): −129.738 ± 0.050; the dense NMF:
# −177.208 ± 1.089).
REFERENCES = {
    "hair_eye_color_cp2": (bam.models.cp(2), -129.679, 0.033),
    "dense_nmf2": (bam.models.nmf(2), -177.096, 0.423),
}
# 600 tokens in 6 × 8 cells, drawn from the BAM NMF(2) prior with a = 200 (key 0).
DENSE = np.array([[11, 15, 15, 16, 8, 11, 7, 15], [21, 20, 17, 10, 13, 12, 12, 20],
                  [9, 11, 13, 16, 14, 12, 15, 13], [8, 12, 19, 9, 11, 8, 7, 12],
                  [21, 13, 26, 15, 10, 10, 15, 10], [14, 7, 8, 11, 3, 6, 10, 9]])


def _data(name):
    return bam.datasets.load_hair_eye_color() if name.startswith("hair") else DENSE


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_auto_matches_a_high_effort_reference(name):
    model, reference, reference_stderr = REFERENCES[name]
    X = _data(name)
    assert choose_method(model, X)[0] == "smc"
    with warnings.catch_warnings():
        warnings.simplefilter("error", bam.EvidenceWarning)
        est = bam.log_evidence(model, X, rng_key=0)
    assert isinstance(est.info, AutoInfo) and "tokens each" in est.details["reason"]
    combined = np.hypot(est.stderr, reference_stderr)
    assert abs(est.value - reference) <= 3 * combined, (est.value, est.stderr, reference)
    assert not below_bound(est.value, est.stderr, est.details["lower_bound"])


def test_auto_gives_the_urn_smc_more_particles_on_dense_tables_unless_told():
    model = bam.models.nmf(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        told = bam.log_evidence(model, DENSE, rng_key=1, num_particles=100)
    assert told.method == "auto" and told.pipeline == "smc" and told.details["num_particles"] == 100
    assert "particles" not in told.details["reason"].split(":")[-1]
    sparse = np.zeros((20, 30), int)
    sparse[np.arange(20), np.arange(20)] = 3  # 60 tokens, 3 per cell: the tempered SMC
    assert choose_method(model, sparse)[0] == "tempered"


# 26 tokens in 19 cells: about 10^6.1 allocation tensors under NMF(2), so "auto" runs the tempered
# SMC and then Chib; exact enumeration (method="exact", max_tensors=3_000_000) gives −43.024974.
MEDIUM = np.array([[3, 2, 0, 1], [2, 3, 1, 0], [0, 1, 3, 2], [1, 0, 2, 3], [1, 1, 0, 0]])
MEDIUM_EXACT = -43.024973764166496


AUTO_KEYS = range(6)


@pytest.fixture(scope="module")
def medium_estimates():
    model = bam.models.nmf(2, a=1.0)
    assert choose_method(model, MEDIUM)[0] == "tempered"
    with warnings.catch_warnings():
        warnings.simplefilter("error", bam.EvidenceWarning)
        return [bam.log_evidence(model, MEDIUM, rng_key=key) for key in AUTO_KEYS]


def test_auto_beyond_enumeration_pools_tempered_and_chib_or_keeps_the_higher(medium_estimates):
    for est in medium_estimates:
        assert est.details["lower_bound"] <= MEDIUM_EXACT
        assert est.details["vb_bound"] <= MEDIUM_EXACT
        parts = est.details["parts"]
        assert set(parts) == {"tempered", "chib"}  # below reference_min_tokens: no reference part
        assert est.details["lower_bound"] == max(p["lower_bound"] for p in parts.values())
        if est.pipeline == "tempered+chib":  # the two agree: the runs of both, pooled
            assert agree(*(SimpleNamespace(**p) for p in parts.values()))
            assert est.stderr < max(parts.values(), key=lambda p: p["value"])["stderr"]  # pooling helped
            runs = parts["tempered"]["run_log_evidence"] + parts["chib"]["run_log_evidence"]
            assert est.details["run_log_evidence"] == runs and est.value == pytest.approx(pool_runs(runs)[0])
            others = list(parts.values())
        else:  # they disagree: the higher one
            other = est.details["cross_check"]
            assert {est.pipeline, other["method"]} == {"tempered", "chib"}
            assert est.value >= other["value"] and est.details["lower_bound"] >= other["lower_bound"]
            others = [other]
        # Stochastic lower bounds all; a few hundredths of a nat low on the log scale (Jensen).
        assert abs(est.value - MEDIUM_EXACT) <= 0.06 + 3 * est.stderr, est
        for other in others:
            assert abs(other["value"] - MEDIUM_EXACT) <= 0.06 + 3 * other["stderr"], (est, other)


def test_auto_stated_error_is_honest_across_keys(medium_estimates):
    """Independent calls against the exact value, both ways: Σ z² within the chi-square's upper tail
    after the Jensen allowance of the log scale (0.03 nats), and the stated errors no larger than
    twice the root-mean-square error plus 0.05 nats (not inflated)."""
    assert_honest_against_exact([est.value for est in medium_estimates], [est.stderr for est in medium_estimates],
                                MEDIUM_EXACT, floor=0.05, bias=0.03)


def test_chib_takes_a_start_allocation_and_rejects_one_inconsistent_with_X():
    model = bam.models.nmf(2, a=1.0)
    tempered = bam.log_evidence(model, MEDIUM, method="tempered", rng_key=0, num_chains=2)
    cells, counts = tempered.details["best_cells"], tempered.details["best_counts"]
    assert counts.sum() == MEDIUM.sum()
    est = bam.log_evidence(model, MEDIUM, method="chib", rng_key=0, start=(cells, counts))
    assert est.details["start_log_joint"][0] <= min(est.details["log_joint_star"]) + 1e-9
    assert est.details["lower_bound"] >= tempered.details["lower_bound"] - 1e-9
    bad = counts.copy()
    bad[0] += 1
    with pytest.raises(ValueError, match="start"):
        bam.log_evidence(model, MEDIUM, method="chib", start=(cells, bad))
    with pytest.raises(ValueError, match="start"):
        bam.log_evidence(model, MEDIUM, method="chib", start=(cells[:, :2], counts))
    with pytest.raises(TypeError, match="start"):
        bam.log_evidence(model, MEDIUM, method="chib", start=5)


def test_the_tempered_stage_sizes_its_particles_by_a_pilot_schedule(medium_estimates):
    # A short schedule (MEDIUM: a few temperatures): the tempered SMC is the search for z*, 256 particles.
    stage = medium_estimates[0].details["tempered_stage"]
    assert stage.num_particles == CONFIG.tempered_particles
    assert stage.pilot_temperatures <= CONFIG.short_schedule
    # A long one (CP(3) on a sparse three-way tensor, many small clusters): only the cross-check, 16.
    _, X = bam.models.cp(3, a=10.0).sample(3000, shape=(20, 25, 30), total=1000)
    options, stage, pilot = tempered_stage_options(bam.models.cp(3, a=10.0), X, jax.random.key(0), {"rho": 0.9})
    assert stage.pilot_temperatures > CONFIG.short_schedule
    assert options == {"rho": 0.9, "num_particles": CONFIG.pilot_particles}
    assert pilot.details["num_runs"] == 1 and pilot.details["num_temperatures"] == [stage.pilot_temperatures]
    # Told: the given particles; a fixed schedule: the pilot runs on it.
    model = bam.models.nmf(2, a=1.0)
    assert tempered_stage_options(model, MEDIUM, 0, {"num_particles": 8})[1].num_particles == 8
    _, stage, _ = tempered_stage_options(model, MEDIUM, 0, {"schedule": np.linspace(0.02, 1, 50)})
    assert stage == (CONFIG.pilot_particles, 50)
    # Many tokens: the reference part carries the estimate, fewer particles.
    _, X = model.sample(5, shape=(6, 8), total=CONFIG.reference_carries_tokens)
    _, stage, _ = tempered_stage_options(model, X, 0, {})
    assert stage.pilot_temperatures <= CONFIG.short_schedule
    assert stage.num_particles == CONFIG.reference_particles < CONFIG.tempered_particles


def test_auto_passes_chib_its_options_but_chooses_its_start_itself():
    model = bam.models.nmf(2, a=1.0)
    est = bam.log_evidence(model, MEDIUM, rng_key=0, num_search_sweeps=200, num_samples=100, num_searches=2)
    chib = est.details if est.pipeline == "chib" else est.details["parts"]["chib"]["details"]
    assert chib["num_steps"] == 100 and chib["num_warmup"] == 200
    with pytest.raises(TypeError, match=r"unknown option.*\['start'\]"):
        bam.log_evidence(model, MEDIUM, start=None)


def test_auto_adds_the_reference_started_sampler_from_enough_tokens(monkeypatch):
    # From reference_min_tokens tokens on (lowered here to run on MEDIUM): a third part, the
    # tempered SMC from the best (by pilot runs) of references built by chains from the samplers'
    # best allocation, the rounded VB fit (half of the references where VB's bound lies above the
    # samplers' best) and the best allocations of cheap scouting runs; the highest estimate kept,
    # or those agreeing pooled.
    monkeypatch.setattr(auto, "CONFIG", replace(CONFIG, reference_min_tokens=20))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        est = bam.log_evidence(bam.models.nmf(2, a=1.0), MEDIUM, rng_key=3)
    parts = est.details["parts"]
    assert set(parts) == {"tempered", "chib", "reference"}
    stage = est.details["reference_stage"]
    scouts = CONFIG.reference_candidates
    vb_above = stage.vb_restarts > stage.start_lower_bound
    good = CONFIG.reference_candidates + (0 if vb_above else CONFIG.vb_references)
    assert len(stage.pilots) == len(stage.starts) == good + scouts
    assert stage.starts[-scouts:] == [f"scout {i}" for i in range(scouts)] and len(stage.scout_estimates) == scouts
    pilots, chosen = np.asarray(stage.pilots), stage.chosen
    assert len(chosen) == CONFIG.reference_runs and chosen[0] == int(np.argmax(pilots))
    assert all(pilots[i] >= pilots.max() - CONFIG.pilot_margin for i in chosen)
    assert stage.reference_sweeps == [auto.scout_sweeps(MEDIUM.sum()) if stage.starts[i].startswith("scout")
                                         else tempered_references.default_reference_sweeps(MEDIUM.sum()) for i in chosen]
    assert "sampled" in stage.starts
    assert stage.start_lower_bound >= max(parts["tempered"]["lower_bound"], parts["chib"]["lower_bound"])
    vb_references = CONFIG.reference_candidates // 2 if vb_above else CONFIG.vb_references
    assert stage.starts.count("vb") == vb_references
    # The VB fit there is a search over vb_restarts screened restarts (its key: fold_in(key, 2));
    # the VB bound is the best of it and of VB from the parts' and the pilot's best allocations.
    vb = bam.log_evidence(bam.models.nmf(2, a=1.0), MEDIUM, method="vb", num_chains=CONFIG.vb_restarts,
                          screen_iters=CONFIG.vb_screen_iters, rng_key=jax.random.fold_in(jax.random.PRNGKey(3), 2))
    assert stage.vb_restarts == pytest.approx(vb.value, abs=1e-9)
    found = [(part["details"]["best_cells"], part["details"]["best_counts"]) for part in parts.values()]
    from_found = bam.log_evidence(bam.models.nmf(2, a=1.0), MEDIUM, method="vb", start=found, num_chains=1)
    assert est.details["vb_bound"] >= max(vb.value, from_found.value) - 1e-9
    assert est.details["vb_bound"] <= MEDIUM_EXACT + 1e-9
    # The best allocation any part visited comes with the estimate, pooled or not: its log π(S) is the sure bound.
    bound = bam.models.nmf(2, a=1.0).bind(MEDIUM)
    assert bound.log_prob_cells(est.details["best_cells"], est.details["best_counts"]) == pytest.approx(
        est.details["lower_bound"], abs=1e-6)
    reference = parts["reference"]["details"]
    assert reference["referenced"] and reference["num_particles"] == CONFIG.reference_particles
    assert parts["reference"]["value"] <= MEDIUM_EXACT + 3 * parts["reference"]["stderr"] + 0.03
    highest = max(parts, key=lambda name: parts[name]["value"])
    if "+" in est.pipeline:
        pooled_parts = est.pipeline.split("+")
        assert highest in pooled_parts and len(est.details["run_log_evidence"]) == sum(
            len(parts[name]["run_log_evidence"]) for name in pooled_parts)
    else:
        assert est.details["kept"] == highest and est.value == parts[highest]["value"]
    assert abs(est.value - MEDIUM_EXACT) <= 0.2 + 3 * est.stderr


def test_auto_runs_the_reference_part_alone_from_many_tokens(monkeypatch):
    # From samplers_max_tokens tokens on (lowered here): only the tempered SMC from the best of
    # several references, built by chains from the pilot's best allocation.
    monkeypatch.setattr(auto, "CONFIG", replace(CONFIG, reference_min_tokens=20, samplers_max_tokens=20))
    model = bam.models.nmf(2, a=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        est = bam.log_evidence(model, MEDIUM, rng_key=4)
    assert set(est.details["parts"]) == {"reference"} and est.method == "auto" and est.pipeline == "reference"
    assert est.details["kept"] == "reference" and est.details["cross_check"] is None
    assert "references" in est.details["reason"]
    stage = est.details["reference_stage"]
    assert est.details["lower_bound"] >= stage.start_lower_bound
    assert len(stage.reference_sweeps) == CONFIG.reference_runs
    assert abs(est.value - MEDIUM_EXACT) <= 0.2 + 3 * est.stderr


def test_scout_chains_grow_with_the_tokens_up_to_a_fixed_cost():
    # 6.4 sweeps per token (12 800 at T = 2000, the letter bigrams' measurement), at most 25.6
    # million token moves per chain.
    assert [auto.scout_sweeps(T) for T in (10, 1000, 2000, 4000, 16_000)] == [100, 6400, 12_800, 6400, 1600]


def test_more_scouts_while_few_references_pilot_near_the_best(monkeypatch):
    # Another batch of scouts while a scout pilots best and fewer than reference_runs pilots
    # lie near it (forced here: no count is enough, any start counts as a scout); batch 0 is what a
    # call without batches runs.
    monkeypatch.setattr(auto, "CONFIG", replace(CONFIG, reference_min_tokens=20))
    model, scouts = bam.models.nmf(2, a=1.0), CONFIG.reference_candidates

    def stage(batches, close):
        monkeypatch.setattr(auto, "CONFIG", replace(CONFIG, reference_min_tokens=20, scout_batches=batches))
        monkeypatch.setattr(auto, "more_scouts", lambda starts, pilots, config: auto.close_to_best(pilots) < close)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bam.EvidenceWarning)
            return bam.log_evidence(model, MEDIUM, rng_key=3).details["reference_stage"]

    one, two = stage(1, 10**6), stage(2, 10**6)
    assert len(two.scout_estimates) == 2 * scouts and len(two.pilots) == len(two.starts)
    assert two.starts[-2 * scouts:] == [f"scout {i}" for i in range(2 * scouts)]
    assert two.scout_estimates[:scouts] == one.scout_estimates
    assert two.pilots[:len(one.pilots)] == one.pilots
    # Enough pilots near the best after batch 0: no second batch (and the rule, as forced, asks for
    # none, where after one batch it still asked for more).
    settled = stage(2, 1)
    assert not auto.close_to_best(settled.pilots) < 1 and auto.close_to_best(one.pilots) < 10**6
    assert settled == one
    assert two.basin_starts == auto.basin_starts(two.starts, two.pilots) >= 1


def test_basin_starts_counts_independent_starts_near_the_best_pilot():
    starts = ["sampled", "sampled", "vb", "scout 0", "scout 1"]
    assert auto.basin_starts(starts, [-1.0, -2.0, -30.0, -40.0, -50.0]) == 1
    assert auto.basin_starts(starts, [-1.0, -2.0, -5.0, -40.0, -9.0]) == 3
    assert auto.close_to_best([-1.0, -2.0, -30.0, -11.5]) == 2
    # More scouts only where a scout pilots best and few others come near it.
    assert auto.more_scouts(starts, [-20.0, -30.0, -40.0, -1.0, -50.0])
    assert not auto.more_scouts(starts, [-1.0, -30.0, -40.0, -2.0, -50.0])  # the samplers' start leads
    assert not auto.more_scouts(starts, [-3.0, -2.0, -5.0, -1.0, -50.0])  # four near the best


def test_runs_start_in_turn_from_the_references_the_pilots_cannot_tell_apart():
    assert auto.runs_from_pilots([-30.0, -1.0, -5.0, -2.0], 4) == [1, 3, 2, 1]
    assert auto.runs_from_pilots([-30.0, -1.0, -50.0], 4) == [1, 1, 1, 1]
    assert auto.runs_from_pilots([-3.0] * 6, 4) == [0, 1, 2, 3]


def test_the_kept_part_and_its_cross_check_are_named_by_part():
    # The reference-started runs report method "tempered" themselves; the combined estimate names
    # both the kept part and the cross-check by part, so that the two tempered SMCs stay apart.
    def part(method, value):
        return bam.EvidenceEstimate(value=value, stderr=0.1, method=method, kind="estimate",
                                    details=dict(lower_bound=-15.0, run_log_evidence=[value] * 4))

    parts = {"tempered": part("tempered", -14.0), "chib": part("chib", -10.0), "reference": part("tempered", -12.5)}
    info = AutoInfo(reason="", advised_calls=1, parts={name: auto.summary(p) for name, p in parts.items()})
    est = auto.combine(parts, auto.Found(-15.0, np.zeros((1, 2), np.int32), np.ones(1, np.int32)), info)
    assert est.method == "auto" and est.pipeline == est.info.kept == est.details["kept"] == "chib"
    assert est.value == -10.0
    assert est.info.cross_check == dict(method="reference", value=-12.5, stderr=0.1, lower_bound=-15.0)


@pytest.mark.parametrize("key", [3, 4])
def test_chib_symmetry_warning_only_when_chib_is_reported(monkeypatch, key):
    # Chib averaging over none of the relabellings (more than MAX_RELABELLINGS) says nothing about
    # an estimate it is no part of: the reference-started SMC sums over them (as a permanent here).
    # Key 3 reports tempered+reference, key 4 pools Chib in.
    from bam_ppl.infer.gibbs import chib

    monkeypatch.setattr(auto, "CONFIG", replace(CONFIG, reference_min_tokens=20))
    monkeypatch.setattr(chib, "MAX_RELABELLINGS", 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = bam.log_evidence(bam.models.nmf(2, a=1.0), MEDIUM, rng_key=key)
    symmetry = [w for w in caught if NO_SYMMETRIES in str(w.message) and "Chib" in str(w.message)]
    assert bool(symmetry) == ("chib" in est.pipeline.split("+")), (est.pipeline, [str(w.message) for w in caught])
    assert est.value <= MEDIUM_EXACT + 3 * est.stderr + 0.03


def test_effort_scales_the_work_that_buys_accuracy_and_nothing_else():
    assert CONFIG.scaled(1.0) is CONFIG
    doubled = CONFIG.scaled(2.0)
    grown = ("urn_particles", "tempered_particles", "reference_particles", "reference_candidates", "vb_restarts")
    for name in grown:
        assert getattr(doubled, name) == 2 * getattr(CONFIG, name), name
    same = [name for name in CONFIG.__dataclass_fields__ if name not in grown]
    assert [getattr(doubled, name) for name in same] == [getattr(CONFIG, name) for name in same]
    least = CONFIG.scaled(1e-6)  # a search of two candidates, particles enough to resample
    assert (least.reference_candidates, least.tempered_particles, least.vb_restarts) == (2, 2, 1)


@pytest.mark.parametrize("method", ["auto", "exact"])
def test_a_bad_key_or_engine_is_an_error_where_the_exact_value_needs_neither(x1, method):
    """On a table small enough to enumerate, auto computes the exact value, which draws nothing and runs
    no kernel: a misspelt key or engine is still the user's error, not silently ignored."""
    with pytest.raises(TypeError, match="rng_key must be"):
        bam.log_evidence(bam.models.nmf(2), x1, method=method, rng_key="a")
    if method == "auto":
        with pytest.raises(ValueError, match="engine must be one of"):
            bam.log_evidence(bam.models.nmf(2), x1, engine="cuda")


def test_effort_is_checked_before_any_work_and_recorded(x1, monkeypatch):
    monkeypatch.setattr(auto, "choose_method", lambda *args: pytest.fail("ran before checking effort"))
    with pytest.raises(ValueError, match="effort must be > 0"):
        bam.log_evidence(bam.models.nmf(2), MEDIUM, effort=0)
    with pytest.raises(TypeError, match="effort must be a number"):
        bam.log_evidence(bam.models.nmf(2), MEDIUM, effort="high")
    monkeypatch.undo()
    est = bam.log_evidence(bam.models.nmf(2), x1, effort=2)
    assert est.pipeline == "exact" and est.details["effort"] == 2.0 and est.info.effort == 2.0
