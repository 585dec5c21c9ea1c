"""method="auto": exact where enumeration is cheap, else the tempered SMC from a mixture of
references, on sparse and dense tables alike; within its stated error of high-effort references and
exact values, never below its own sure lower bound, honest across keys."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from oracles import assert_honest_against_exact

import bam_ppl as bam
from bam_ppl.estimate import below_bound
from bam_ppl.infer import auto
from bam_ppl.infer.auto import choose_method

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
    # Few cells holding many tokens each: the same engine as on sparse tables.
    model, reference, reference_stderr = REFERENCES[name]
    X = _data(name)
    assert choose_method(model, X).method == "mixture"
    with warnings.catch_warnings():
        warnings.simplefilter("error", bam.EvidenceWarning)
        est = bam.log_evidence(model, X, rng_key=0)
    assert est.method == "auto" and est.pipeline == "mixture" and est.details["selected_by"] == "auto"
    combined = np.hypot(est.stderr, reference_stderr)
    assert abs(est.value - reference) <= 3 * combined, (est.value, est.stderr, reference)
    assert not below_bound(est.value, est.stderr, est.details["lower_bound"])


def test_auto_enumerates_where_cheap_and_runs_the_mixture_beyond():
    model = bam.models.nmf(2)
    tiny = np.array([[2, 1], [0, 2]])
    assert choose_method(model, tiny).method == "exact"
    est = bam.log_evidence(model, tiny)
    assert est.kind == "exact" and est.pipeline == "exact" and "enumeration" in est.details["reason"]
    assert choose_method(bam.AllocationModel("i; j", observed=("i", "j")), DENSE) == ("exact", "no free nodes: closed form")
    sparse = np.zeros((20, 30), int)
    sparse[np.arange(20), np.arange(20)] = 3  # 60 tokens, 3 per cell
    assert choose_method(model, sparse).method == "mixture"


# 26 tokens in 19 cells: about 10^6.1 allocation tensors under NMF(2), so "auto" runs the mixture;
# exact enumeration (method="exact", max_tensors=3_000_000) gives −43.024974.
MEDIUM = np.array([[3, 2, 0, 1], [2, 3, 1, 0], [0, 1, 3, 2], [1, 0, 2, 3], [1, 1, 0, 0]])
MEDIUM_EXACT = -43.024973764166496


AUTO_KEYS = range(6)


@pytest.fixture(scope="module")
def medium_estimates():
    model = bam.models.nmf(2, a=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bam.EvidenceWarning)
        return [bam.log_evidence(model, MEDIUM, rng_key=key) for key in AUTO_KEYS]


def test_auto_beyond_enumeration_matches_the_exact_value(medium_estimates):
    for est in medium_estimates:
        assert est.pipeline == "mixture"  # the same label for every key
        assert est.details["lower_bound"] <= MEDIUM_EXACT
        # A stochastic lower bound: a few hundredths of a nat low on the log scale (Jensen).
        assert abs(est.value - MEDIUM_EXACT) <= 0.06 + 3 * est.stderr, est


def test_auto_stated_error_is_honest_across_keys(medium_estimates):
    """Independent calls against the exact value, both ways: Σ z² within the chi-square's upper tail
    after the Jensen allowance of the log scale (0.03 nats), and the stated errors no larger than
    twice the root-mean-square error plus 0.05 nats (not inflated)."""
    assert_honest_against_exact([est.value for est in medium_estimates], [est.stderr for est in medium_estimates],
                                MEDIUM_EXACT, floor=0.05, bias=0.03)


def test_effort_and_options_reach_the_engine_and_are_checked_before_any_work(monkeypatch):
    model = bam.models.nmf(2, a=1.0)
    est = bam.log_evidence(model, MEDIUM, rng_key=0, effort=0.5, num_chains=3)
    assert est.details["effort"] == 0.5 and len(est.run_values) == 3
    assert est.details["num_particles"] == 32 and est.details["num_scouts"] == 4
    monkeypatch.setattr(auto, "choose_method", lambda *a, **k: pytest.fail("worked before checking the options"))
    with pytest.raises(TypeError, match="num_sweepz"):
        bam.log_evidence(model, MEDIUM, num_sweepz=2)
    with pytest.raises(ValueError, match="effort"):
        bam.log_evidence(model, MEDIUM, effort=-1.0)
    with pytest.raises(ValueError, match="num_particles"):
        bam.log_evidence(model, MEDIUM, num_particles=1)
    # Exact enumeration takes no particles, yet a bad count is refused there too.
    with pytest.raises(ValueError, match="num_chains"):
        bam.log_evidence(model, np.array([[2, 1], [0, 2]]), num_chains=0)


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
