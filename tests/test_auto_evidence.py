"""method="auto": the exact value where enumeration is cheap, otherwise the tempered SMC from a
mixture of references, within its stated error of exact values and high-effort references, and never
below its own sure lower bounds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from oracles import assert_honest_against_exact

import bam_ppl as bam
from bam_ppl.estimate import below_bound
from bam_ppl.infer import auto
from bam_ppl.infer.auto import choose_method
from bam_ppl.infer.info import AutoInfo, MixtureInfo
from bam_ppl.infer.smc import mixture

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
def test_auto_matches_a_high_effort_reference_on_dense_tables(name):
    # Few cells of many tokens each: the same engine as on sparse tables, no switch to another estimator.
    model, reference, reference_stderr = REFERENCES[name]
    X = _data(name)
    assert choose_method(model, X)[0] == "mixture"
    with warnings.catch_warnings():
        warnings.simplefilter("error", bam.EvidenceWarning)
        est = bam.log_evidence(model, X, rng_key=0)
    assert isinstance(est.info, AutoInfo) and isinstance(est.info.kept_info, MixtureInfo)
    assert est.method == "auto" and est.pipeline == "mixture" and "mixture of references" in est.details["reason"]
    combined = np.hypot(est.stderr, reference_stderr)
    assert abs(est.value - reference) <= 3 * combined, (est.value, est.stderr, reference)
    assert not below_bound(est.value, est.stderr, est.details["lower_bound"])


# 26 tokens in 19 cells: about 10^6.1 allocation tensors under NMF(2), beyond enumeration for
# "auto"; exact enumeration (method="exact", max_tensors=3_000_000) gives −43.024974.
MEDIUM = np.array([[3, 2, 0, 1], [2, 3, 1, 0], [0, 1, 3, 2], [1, 0, 2, 3], [1, 1, 0, 0]])
MEDIUM_EXACT = -43.024973764166496


AUTO_KEYS = range(6)


@pytest.fixture(scope="module")
def medium_estimates():
    model = bam.models.nmf(2, a=1.0)
    assert choose_method(model, MEDIUM)[0] == "mixture"
    with warnings.catch_warnings():
        warnings.simplefilter("error", bam.EvidenceWarning)
        return [bam.log_evidence(model, MEDIUM, rng_key=key) for key in AUTO_KEYS]


def test_auto_beyond_enumeration_lies_above_its_sure_bounds(medium_estimates):
    for est in medium_estimates:
        assert est.pipeline == "mixture" and len(est.details["run_log_evidence"]) == mixture.ENGINE.num_chains
        assert np.all(np.isfinite(est.details["search_log_evidence"]))  # each search alone
        # Every search found the basins the value rests on.
        assert est.details["single_search_share"] == est.info.kept_info.single_search_share < 0.5
        assert est.details["lower_bound"] <= MEDIUM_EXACT and est.details["vb_bound"] <= MEDIUM_EXACT
        assert not below_bound(est.value, est.stderr, est.details["lower_bound"])


def test_auto_stated_error_is_honest_across_keys(medium_estimates):
    """Independent calls against the exact value, both ways: Σ z² within the chi-square's upper tail
    after the Jensen allowance of the log scale (0.03 nats), and the stated errors no larger than
    twice the root-mean-square error plus 0.05 nats (not inflated)."""
    assert_honest_against_exact([est.value for est in medium_estimates], [est.stderr for est in medium_estimates],
                                MEDIUM_EXACT, floor=0.05, bias=0.03)


def test_the_same_engine_and_label_on_every_table_beyond_enumeration():
    # Sparse or dense, few tokens or many: one estimator, one label, whatever the key.
    model = bam.models.nmf(2)
    sparse = np.zeros((20, 30), int)
    sparse[np.arange(20), np.arange(20)] = 3  # 60 tokens, 3 per cell
    few = np.zeros((20, 30), int)
    few[np.arange(20), np.arange(20)] = 1  # 20 tokens
    assert {choose_method(model, X)[0] for X in (sparse, few, DENSE, MEDIUM)} == {"mixture"}
    assert choose_method(model, MEDIUM[:2])[0] == "exact"


def test_auto_passes_effort_and_the_engines_options_on():
    model = bam.models.nmf(2, a=1.0)
    est = bam.log_evidence(model, MEDIUM, rng_key=0, effort=0.5, num_chains=3, num_scouts=2, vb_restarts=4)
    engine = est.info.kept_info
    # Two scouts of each kind shared out among three runs: one each, rounded up; two of the four VB restarts each,
    # the best of which starts a reference (as many VB fits as scouts of each kind).
    assert (engine.effort, engine.num_runs, engine.num_scouts) == (0.5, 3, 3) and est.info.effort == 0.5
    assert [len(own) for own in engine.chain_sweeps] == [2 * 1 + 1] * 3
    assert engine.num_particles == mixture.particles_for(mixture.effort_sizes(0.5), 3 * (2 * 1 + 1) + 1)
    # Each run's estimate shared out among its references and the defensive component at the end.
    for shares, built in zip(engine.component_shares, engine.num_references):
        assert len(shares) == built + 1 and min(shares) >= 0.0 and abs(sum(shares) - 1.0) < 1e-5
    assert len(engine.final_ess) == 3 and all(1.0 - 1e-9 <= ess <= engine.num_particles + 1e-9 for ess in engine.final_ess)
    with pytest.raises(TypeError, match=r"unknown option.*\['start'\]"):
        bam.log_evidence(model, MEDIUM, start=None)


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


@pytest.mark.parametrize("method", ["auto", "exact"])
def test_a_bad_key_or_option_is_an_error_where_the_exact_value_needs_neither(x1, method):
    """On a table small enough to enumerate, auto computes the exact value, which draws nothing and runs
    no engine: a misspelt key or a bad engine option is still the user's error, not silently ignored."""
    with pytest.raises(TypeError, match="rng_key must be"):
        bam.log_evidence(bam.models.nmf(2), x1, method=method, rng_key="a")
    if method == "auto":
        with pytest.raises(ValueError, match="rho"):
            bam.log_evidence(bam.models.nmf(2), x1, rho=1.5)
        with pytest.raises(ValueError, match="vb_restarts"):
            bam.log_evidence(bam.models.nmf(2), x1, vb_restarts=-1)


def test_effort_is_checked_before_any_work_and_recorded(x1, monkeypatch):
    monkeypatch.setattr(auto, "choose_method", lambda *args: pytest.fail("ran before checking effort"))
    with pytest.raises(ValueError, match="effort must be > 0"):
        bam.log_evidence(bam.models.nmf(2), MEDIUM, effort=0)
    with pytest.raises(TypeError, match="effort must be a number"):
        bam.log_evidence(bam.models.nmf(2), MEDIUM, effort="high")
    monkeypatch.undo()
    est = bam.log_evidence(bam.models.nmf(2), x1, effort=2)
    assert est.pipeline == "exact" and est.details["effort"] == 2.0 and est.info.effort == 2.0


@pytest.mark.slow
@pytest.mark.stats
def test_default_evidence_recovers_the_parafac_rank():
    """papers/000 §5.1.2: 20 × 25 × 30 tensors from CP with R = 5, T = 500, a = 30; the default evidence at a quarter
    of its effort puts the highest value within one of the planted rank on at least four of five tensors. (The
    Pólya-urn SMC of the paper's experiment, at 1000 or 10 000 particles, spreads its values over tens of nats
    between neighbouring ranks there: which rank wins is the draw's, not the data's.)"""
    ranks = range(2, 9)
    hits = 0
    for seed in range(5):
        _, X = bam.models.cp(5, a=30.0).sample(seed, shape=(20, 25, 30), total=500)
        values = [bam.log_evidence(bam.models.cp(r, a=30.0), X, rng_key=seed, effort=0.25).value for r in ranks]
        hits += abs(ranks[int(np.argmax(values))] - 5) <= 1
    assert hits >= 4
