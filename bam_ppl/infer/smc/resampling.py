"""Resampling schemes for sequential Monte Carlo (Cemgil et al. 2019 §4.2, Algorithm 3).

Every scheme is a pure function ``(key, log_weights, num) -> indices``: it takes unnormalised log
weights of shape ``(P,)`` and returns ``num`` ancestor indices (int32) drawn so that index p is
copied, in expectation, ``num · w_p`` times. Shapes are static, so the schemes run inside
``jit``, ``vmap`` and ``lax.scan``. They differ in variance (Douc, Cappé & Moulines 2005):
multinomial > stratified ≥ residual, systematic; systematic is the default of the backends.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...types import Array, PRNGKey


def _normalised_cdf(log_weights: Array) -> Array:
    """Cumulative normalised weights, last entry exactly 1 so every draw finds an ancestor."""
    weights = jnp.exp(log_weights - jnp.max(log_weights))
    cdf = jnp.cumsum(weights / jnp.sum(weights))
    return cdf.at[-1].set(1.0)


def _invert(cdf: Array, positions: Array) -> Array:
    """Ancestors of positions in [0, 1): the first p with cdf[p] > position."""
    idx = jnp.searchsorted(cdf, positions, side="right")
    return jnp.clip(idx, 0, cdf.shape[0] - 1).astype(jnp.int32)


def systematic(key: PRNGKey, log_weights: Array, num: int) -> Array:
    """One uniform shift of an evenly spaced grid: positions (k + u) / num."""
    cdf = _normalised_cdf(log_weights)
    positions = (jnp.arange(num, dtype=cdf.dtype) + jax.random.uniform(key, dtype=cdf.dtype)) / num
    return _invert(cdf, positions)


def stratified(key: PRNGKey, log_weights: Array, num: int) -> Array:
    """One uniform per stratum [k/num, (k+1)/num)."""
    cdf = _normalised_cdf(log_weights)
    positions = (jnp.arange(num, dtype=cdf.dtype) + jax.random.uniform(key, (num,), dtype=cdf.dtype)) / num
    return _invert(cdf, positions)


def multinomial(key: PRNGKey, log_weights: Array, num: int) -> Array:
    """Independent draws from the weights (uniforms inverted through the CDF, in draw order)."""
    cdf = _normalised_cdf(log_weights)
    return _invert(cdf, jax.random.uniform(key, (num,), dtype=cdf.dtype))


def residual(key: PRNGKey, log_weights: Array, num: int) -> Array:
    """floor(num · w_p) deterministic copies of p, the remainder drawn multinomially.

    The deterministic copies fill the first ``R = Σ_p floor(num · w_p)`` slots and the residual
    draws (weights ∝ num · w_p − floor(num · w_p)) the other ``num − R``; both parts are computed
    at full length ``num`` so the shape does not depend on R.
    """
    weights = jnp.exp(log_weights - jnp.max(log_weights))
    weights = weights / jnp.sum(weights)
    copies = jnp.floor(num * weights)
    slots = jnp.arange(num)
    copy_ends = jnp.cumsum(copies)
    deterministic = jnp.clip(jnp.searchsorted(copy_ends, slots, side="right"), 0, weights.shape[0] - 1)
    remainder = num * weights - copies
    # All-zero remainders happen only when every slot is deterministic; the draws are then unused.
    log_remainder = jnp.where(jnp.sum(remainder) > 0, jnp.log(remainder), jnp.zeros_like(remainder))
    drawn = multinomial(key, log_remainder, num)
    num_copies = copy_ends[-1]
    return jnp.where(slots < num_copies, deterministic, jnp.roll(drawn, num_copies.astype(jnp.int32))).astype(jnp.int32)


RESAMPLERS = {
    "systematic": systematic,
    "stratified": stratified,
    "multinomial": multinomial,
    "residual": residual,
}


def effective_sample_size(log_weights: Array) -> Array:
    """ESS = (Σ w)² / Σ w² of unnormalised log weights (Liu 2001), over the last axis."""
    lse = jax.nn.logsumexp(log_weights, axis=-1)
    lse2 = jax.nn.logsumexp(2.0 * log_weights, axis=-1)
    return jnp.exp(2.0 * lse - lse2)


def weight_summary(log_weights: Array) -> tuple[Array, Array]:
    """ESS and log mean weight of unnormalised log weights (last axis), from one pass of exp.

    Equal to ``effective_sample_size(log_weights)`` and ``logsumexp(log_weights) − log P``; the
    SMC needs both at every token, and sharing the shifted weights halves the exponentials.
    """
    peak = jnp.max(log_weights, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    # Weights below e^-700 of the largest are negligible in both sums; flushing them to zero
    # keeps the exponentials out of the (very slow) subnormal range once weights degenerate.
    shifted = log_weights - peak
    weights = jnp.where(shifted > -700.0, jnp.exp(shifted), 0.0)
    total = jnp.sum(weights, axis=-1)
    ess = total**2 / jnp.sum(weights**2, axis=-1)
    log_mean = peak[..., 0] + jnp.log(total) - jnp.log(log_weights.shape[-1])
    return ess, log_mean
