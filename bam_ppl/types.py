"""Type aliases shared across bam_ppl."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

Array = jax.Array
ArrayLike = jax.Array | np.ndarray | float | int
PRNGKey = jax.Array
KeyLike = int | jax.Array
PyTree = Any


def as_key(rng_key: KeyLike) -> PRNGKey:
    """Turn an int seed or a JAX key into a JAX PRNG key.

    Raises ``TypeError`` for anything else, so a wrong ``rng_key`` fails before compilation.
    """
    if isinstance(rng_key, (bool, np.bool_)):
        raise TypeError(f"rng_key must be an int or a JAX PRNG key, got {type(rng_key).__name__}")
    if isinstance(rng_key, (int, np.integer)):
        if rng_key < 0:
            raise ValueError(f"rng_key must be a nonnegative int seed, got {rng_key}")
        return jax.random.PRNGKey(int(rng_key))
    if isinstance(rng_key, jax.Array):
        if jax.dtypes.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(rng_key)
        if rng_key.shape == (2,) and rng_key.dtype == np.uint32:
            return rng_key
    raise TypeError(
        "rng_key must be an int seed or a JAX PRNG key (jax.random.key / jax.random.PRNGKey), "
        f"got {type(rng_key).__name__}"
    )


def numpy_generator(rng_key: KeyLike) -> np.random.Generator:
    """A NumPy Generator seeded from an int seed or a JAX key (the same key gives the same draws).

    Host-side draws (generative samples, restarts' starting values, posterior Dirichlet draws)
    use it where eager JAX would compile anew for every array shape.
    """
    return np.random.default_rng(np.asarray(as_key(rng_key), dtype=np.uint32))
