"""JAX kernel of the tempered SMC (:mod:`bam_ppl.infer.smc.tempered`, ``engine="jax"``): ``vmap``
over particles, ``lax.scan`` over tokens, jitted once with β as an argument."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...parallel import shard_axis
from .tempered_problem import (
    TemperedProblem,
    counts_of_configs,
    exact_log_start,
    exact_log_terms,
)


class _JaxRows(NamedTuple):
    """Static structure of the JAX kernel (hashable)."""

    latent_numerators: tuple
    latent_denominators: tuple
    visible_numerators: tuple
    visible_denominators: tuple
    ties: tuple
    moved: tuple
    has_valid: bool
    tilted: bool
    referenced: bool


def _jax_token(rows: _JaxRows, arrays, counts, cell, old, uniform, beta, remove: bool):
    """Remove one token (if ``remove``) and redraw it from π_β's conditional.

    Returns the counts, the new configuration and the changes of (log π₀, log L, log start).
    """
    row_base, row_offset, valid, concentration, shift, log_reference = arrays
    index = row_base[:, cell][:, None] + row_offset  # (R, L)
    moved = jnp.asarray(rows.moved, jnp.int32)
    value = counts[index]
    if remove:
        old_index = index[moved, old]
        value = value - jnp.sum(index[:, :, None] == old_index, axis=-1, dtype=value.dtype)
    value = concentration[index] + value.astype(concentration.dtype)
    for row, earlier in rows.ties:
        value = value.at[row].add((index[earlier] == index[row]).astype(value.dtype))

    def total(logs, group):
        if not group:
            return jnp.zeros(index.shape[1], logs.dtype)
        return jnp.sum(logs[jnp.asarray(group, jnp.int32)], axis=0)

    logs = jnp.log(value)
    log_lat = total(logs, rows.latent_numerators) - total(logs, rows.latent_denominators)
    log_vis = total(logs, rows.visible_numerators) - total(logs, rows.visible_denominators)
    if rows.referenced:
        log_start = log_reference[cell]
        logit = log_start + beta * (log_lat + log_vis - log_start)
    elif rows.tilted:
        logs_start = jnp.log(value + shift[index])
        log_start = total(logs_start, rows.latent_numerators) - total(logs_start, rows.latent_denominators)
        logit = log_start + beta * (log_lat + log_vis - log_start)
    else:
        log_start = jnp.zeros_like(log_lat)
        logit = log_lat + beta * log_vis
    if rows.has_valid:
        logit = jnp.where(valid[cell], logit, -jnp.inf)
    weight = jnp.exp(logit - logit.max())
    cdf = jnp.cumsum(weight)
    new = jnp.minimum(jnp.sum(cdf <= uniform * cdf[-1]), index.shape[1] - 1).astype(jnp.int32)
    new_index = index[moved, new]
    if remove:
        step = jnp.concatenate([jnp.full(moved.shape, -1, counts.dtype), jnp.ones(moved.shape, counts.dtype)])
        counts = counts.at[jnp.concatenate([old_index, new_index])].add(step)
        delta = jnp.stack([log_lat[new] - log_lat[old], log_vis[new] - log_vis[old], log_start[new] - log_start[old]])
    else:
        counts = counts.at[new_index].add(1)
        delta = jnp.stack([log_lat[new], log_vis[new], log_start[new]])
    return counts, new, delta


def _jax_pass(rows, arrays, token_cell, key, config, counts, beta, remove: bool):
    key_order, key_draw = jax.random.split(key)
    order = jax.random.permutation(key_order, token_cell.shape[0]).astype(jnp.int32)
    uniforms = jax.random.uniform(key_draw, order.shape, beta.dtype)

    def step(carry, token):
        counts, total = carry
        cell, old, uniform = token
        counts, new, delta = _jax_token(rows, arrays, counts, cell, old, uniform, beta, remove)
        return (counts, total + delta), new

    (counts, total), new = jax.lax.scan(step, (counts, jnp.zeros(3, beta.dtype)),
                                        (token_cell[order], config[order], uniforms))
    return config.at[order].set(new), counts, total


class JaxParticleState(NamedTuple):
    """Every particle's token configurations ``config`` (P, T), table counts ``counts`` (P, F + C)
    and ``logs`` (P, 3): log π₀, log L and log start."""

    config: jax.Array
    counts: jax.Array
    logs: jax.Array


@functools.partial(jax.jit, static_argnames=("rows", "num_sweeps", "remove"))
def _jax_moves(rows, arrays, token_cell, keys, state: JaxParticleState, beta, num_sweeps, remove) -> JaxParticleState:
    """``num_sweeps`` passes of every particle (``remove=False``: the urn initialisation)."""

    def one(key, config, counts):
        def body(carry, s):
            config, counts, total = carry
            config, counts, delta = _jax_pass(rows, arrays, token_cell, jax.random.fold_in(key, s), config,
                                              counts, beta, remove)
            return (config, counts, total + delta), None

        (config, counts, total), _ = jax.lax.scan(body, (config, counts, jnp.zeros(3, beta.dtype)),
                                                  jnp.arange(num_sweeps))
        return config, counts, total

    config, counts, delta = jax.vmap(one)(keys, state.config, state.counts)
    return JaxParticleState(config, counts, state.logs + delta)


@jax.jit
def _jax_log_multinomial(token_cell, config, num_configs):
    def one(conf):
        keys = jnp.sort(token_cell.astype(jnp.int64) * num_configs + conf)
        position = jnp.arange(keys.shape[0])
        starts = jnp.concatenate([jnp.ones(1, bool), keys[1:] != keys[:-1]])
        rank = position - jax.lax.cummax(jnp.where(starts, position, 0)) + 1
        return jnp.sum(jnp.log(rank.astype(jnp.float64)))

    return jax.vmap(one)(config)


class JaxParticles:
    """P particles on the default JAX device, moved by a jitted ``vmap`` of ``lax.scan`` sweeps."""

    def __init__(self, tp: TemperedProblem, num_particles: int, key):
        self.tp = tp
        self.num_particles = num_particles
        self.rows = _JaxRows(*(tuple(int(r) for r in g) for g in (
            tp.latent_numerators, tp.latent_denominators, tp.visible_numerators, tp.visible_denominators)),
            ties=tuple(zip(tp.tie_rows.tolist(), tp.tie_earlier.tolist())),
            moved=tuple(int(m) for m in tp.moved), has_valid=tp.has_valid, tilted=tp.tilted,
            referenced=tp.referenced)
        self.arrays = (jnp.asarray(tp.row_base, jnp.int32), jnp.asarray(tp.row_offset, jnp.int32),
                       jnp.asarray(tp.valid), jnp.asarray(tp.concentration, jnp.float64),
                       jnp.asarray(tp.shift, jnp.float64), jnp.asarray(tp.log_reference, jnp.float64))
        self.token_cell = jnp.asarray(tp.token_cell)
        self.key = key
        self.calls = 0
        self.config = jnp.zeros((num_particles, tp.token_cell.shape[0]), jnp.int32)
        self.counts_ = jnp.tile(jnp.asarray(tp.fixed_counts, jnp.int32), (num_particles, 1))
        self.logs = jnp.zeros((num_particles, 3), jnp.float64)  # log π₀, log L, log start

    log_prior = property(lambda self: np.asarray(self.logs[:, 0]))
    log_like = property(lambda self: np.asarray(self.logs[:, 1]))
    log_start = property(lambda self: np.asarray(self.logs[:, 2]))

    def add_offsets(self, prior: float, like: float, start: float) -> None:
        self.logs = self.logs + jnp.asarray([prior, like, start])

    def _run(self, beta, num_sweeps, remove):
        keys = jax.random.split(jax.random.fold_in(self.key, self.calls), self.num_particles)
        self.calls += 1
        # Particles split across jax.devices() (resampling and set_configs make arrays anew).
        keys, state = shard_axis((keys, JaxParticleState(self.config, self.counts_, self.logs)), self.num_particles,
                                 0, "particles")
        self.config, self.counts_, self.logs = _jax_moves(self.rows, self.arrays, self.token_cell, keys, state,
                                                          jnp.asarray(beta, jnp.float64), num_sweeps, remove)

    def initialise(self) -> None:
        self._run(0.0, 1, False)

    def move(self, beta: float, num_sweeps: int) -> None:
        self._run(beta, num_sweeps, True)

    def set_configs(self, config: np.ndarray) -> None:
        config = np.asarray(config, np.int32)
        counts = np.stack([counts_of_configs(self.tp, c) for c in config])
        logs = np.array([(*exact_log_terms(self.tp, c), exact_log_start(self.tp, c, z)) for c, z in zip(counts, config)])
        self.config, self.counts_ = jnp.asarray(config), jnp.asarray(counts, jnp.int32)
        self.logs = jnp.asarray(logs.reshape(-1, 3))

    def counts(self, p: int) -> np.ndarray:
        return np.asarray(self.counts_[p], np.int64)

    def resample(self, ancestors: np.ndarray) -> None:
        ancestors = jnp.asarray(ancestors)
        self.config, self.counts_, self.logs = self.config[ancestors], self.counts_[ancestors], self.logs[ancestors]

    def log_multinomial(self) -> np.ndarray:
        return np.asarray(_jax_log_multinomial(self.token_cell, self.config, self.tp.num_configs))
