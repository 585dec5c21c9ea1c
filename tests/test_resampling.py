"""Resampling schemes: shapes, support, unbiased offspring counts and each scheme's guarantees."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bam_ppl.infer.smc.resampling import RESAMPLERS, effective_sample_size, weight_summary

WEIGHTS = np.array([0.05, 0.0, 0.4, 0.15, 0.3, 0.1])
NUM = 10


def offspring(name, num_keys=4000, num=NUM, weights=WEIGHTS):
    resampler = RESAMPLERS[name]
    log_weights = jnp.log(jnp.asarray(weights))
    keys = jax.random.split(jax.random.PRNGKey(0), num_keys)
    draws = jax.jit(jax.vmap(lambda k: resampler(k, log_weights, num)))(keys)
    draws = np.asarray(draws)
    return draws, np.stack([np.bincount(d, minlength=weights.size) for d in draws])


@pytest.mark.parametrize("name", sorted(RESAMPLERS))
def test_offspring_counts_are_unbiased_and_supported(name):
    draws, counts = offspring(name)
    assert draws.dtype == np.int32 and draws.shape == (4000, NUM)
    assert counts[:, 1].sum() == 0  # a zero-weight particle is never an ancestor
    assert (counts.sum(1) == NUM).all()
    expected = NUM * WEIGHTS
    error = counts.std(0, ddof=1) / np.sqrt(counts.shape[0])
    assert np.all(np.abs(counts.mean(0) - expected) <= 4 * error + 1e-9)


@pytest.mark.parametrize("name", ["systematic", "residual"])
def test_low_variance_schemes_keep_the_integer_part(name):
    _, counts = offspring(name, num_keys=500)
    # Normalising the weights in floating point may move NUM·w across an integer by one ulp.
    assert (counts >= np.floor(NUM * WEIGHTS - 1e-9)).all()
    if name == "systematic":
        assert (counts <= np.ceil(NUM * WEIGHTS + 1e-9)).all()


@pytest.mark.parametrize("name", sorted(RESAMPLERS))
def test_equal_weights_and_extreme_log_weights(name):
    resampler = RESAMPLERS[name]
    key = jax.random.PRNGKey(3)
    flat = np.asarray(resampler(key, jnp.zeros(8), 8))
    if name in ("systematic", "stratified", "residual"):
        np.testing.assert_array_equal(np.sort(flat), np.arange(8))
    # Log weights far below zero (long products of small urn probabilities) are handled.
    log_weights = jnp.array([-1e4, -1e4 + 2.0, -jnp.inf, -1e4 - 1.0])
    idx = np.asarray(resampler(key, log_weights, 100))
    assert idx.min() >= 0 and idx.max() <= 3 and not (idx == 2).any()


def test_effective_sample_size():
    assert float(effective_sample_size(jnp.zeros(5))) == pytest.approx(5.0)
    assert float(effective_sample_size(jnp.array([0.0, -jnp.inf, -jnp.inf]))) == pytest.approx(1.0)
    w = WEIGHTS / WEIGHTS.sum()
    assert float(effective_sample_size(jnp.log(jnp.asarray(WEIGHTS)))) == pytest.approx(1 / np.sum(w**2))


def test_weight_summary_equals_ess_and_log_mean():
    # float64, as in the SMC: large-magnitude log weights cost the two-logsumexp ESS digits in float32.
    with jax.enable_x64(True):
        # The last row spans more than the float64 range: weights below e^-700 are flushed to 0.
        log_weights = jnp.array([[-1e3, -1e3 + 0.5, -1e3 - 2.0, -jnp.inf], [0.0, 0.0, 0.0, 0.0],
                                 [0.0, -1.0, -710.0, -1e4]])
        ess, log_mean = weight_summary(log_weights)
        np.testing.assert_allclose(ess, effective_sample_size(log_weights), rtol=1e-9)
        np.testing.assert_allclose(log_mean, jax.nn.logsumexp(log_weights, axis=-1) - np.log(4), rtol=1e-12)
