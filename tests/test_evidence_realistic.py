"""The default evidence at a realistic size, where no enumeration exists: above the sure lower bound
and the variational bound, and honest across independent calls in both directions (the spread is
no larger than the stated errors claim, and the stated errors are not inflated).

These run in CI (`make test-stats`), not in `make test`.
"""

import jax
import numpy as np
import pytest
from oracles import assert_honest_spread

import bam_ppl as bam

pytestmark = [pytest.mark.slow, pytest.mark.stats]


def test_default_at_one_thousand_tokens_is_above_its_bounds_and_honest_across_keys():
    # NMF(4), a = 1, on a 50 × 70 matrix of T = 1000 tokens drawn from a concentrated prior.
    _, X = bam.models.nmf(4, a=200).sample(jax.random.key(0), shape=(50, 70), total=1000)
    model = bam.models.nmf(4, a=1.0)
    vb = bam.log_evidence(model, X, method="vb").value
    estimates = [bam.log_evidence(model, X, rng_key=key) for key in range(4)]
    values = np.array([e.value for e in estimates])
    stderrs = np.array([e.stderr for e in estimates])
    for est in estimates:
        assert est.value >= est.details["lower_bound"] - 3 * est.stderr, est
        assert est.value > vb, (est, vb)
        assert est.stderr <= 1.0, est  # the precision the default states at this size
    # 0.25 nats: the spread four calls can miss where the stated errors are a few tenths.
    assert_honest_spread(values, stderrs, floor=0.25)
