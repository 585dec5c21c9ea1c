"""The one EM loop: iterate an update until the objective stops rising, over several starts.

The EM backends run here: MAP-EM for allocation models (:mod:`bam_ppl.infer.em`), ML EM over
the candidate ranks of the PMF model (:mod:`bam_ppl.families.pmf.em`) and the Dirichlet Tucker
MAP-EM with its collapsed E-step (:mod:`bam_ppl.families.dirichlet_tucker.em`). A model
supplies two functions of its parameters (any pytree):

* ``step(params) -> (updated params, objective(params))``: one E-step and M-step. The E-step
  yields the objective of the *incoming* parameters at no extra cost (the normalisers of the
  responsibilities are the cell probabilities), so the loop never evaluates it separately;
* ``objective(params)``: the same objective alone, to score the final parameters.

Convergence (Dempster et al. 1977): EM never lowers its objective, so the loop stops once an
update gains at most ``tol · max(|objective|, 1)``; a decrease can only be rounding and stops it
too. The update of the converging iteration is kept. ``trace[t]`` is the objective after ``t``
updates (``t = 0``: the start), in a buffer of static length ``capacity`` (nan past the end),
so that a ``lax.while_loop`` stops converged runs early with static shapes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class EMState(NamedTuple):
    params: Any            # the parameters after ``iteration`` updates
    iteration: jax.Array   # () updates done
    converged: jax.Array   # () whether the last update gained at most tol · max(|objective|, 1)
    trace: jax.Array       # (capacity,) objective after t updates at entry t, nan beyond


def trace_capacity(num_iters: int) -> int:
    """A power of two above ``num_iters``: nearby ``num_iters`` values share one compiled program."""
    return max(64, 1 << int(num_iters).bit_length())


def start(objective, params, capacity: int) -> EMState:
    """The state before the first update (the trace's dtype is the objective's)."""
    dtype = jax.eval_shape(objective, params).dtype
    return EMState(params, jnp.zeros((), jnp.int32), jnp.zeros((), bool), jnp.full((capacity,), jnp.nan, dtype))


def advance(step, state: EMState, *, until, tol) -> EMState:
    """Updates until ``until`` have been done in all or the run converged (a ``lax.while_loop``)."""

    def not_done(state: EMState):
        return (state.iteration < until) & ~state.converged

    def body(state: EMState):
        updated, current = step(state.params)
        previous = jnp.where(state.iteration > 0, state.trace[state.iteration - 1], -jnp.inf)
        converged = current - previous <= tol * jnp.maximum(jnp.abs(current), 1.0)
        return EMState(updated, state.iteration + 1, converged, state.trace.at[state.iteration].set(current))

    return jax.lax.while_loop(not_done, body, state)


def finish(objective, state: EMState) -> EMState:
    """Record the objective of the final parameters at ``trace[iteration]``."""
    return state._replace(trace=state.trace.at[state.iteration].set(objective(state.params)))


def run(step, objective, params, *, num_iters, tol, capacity: int) -> EMState:
    """EM from ``params``: at most ``num_iters`` updates, then the final objective recorded."""
    state = advance(step, start(objective, params, capacity), until=num_iters, tol=tol)
    return finish(objective, state)


def run_starts(run_one, starts, *, sequential: bool = False):
    """``run_one`` on every start (leading axis of the pytree ``starts``): side by side
    (``jax.vmap``), or one after another (``lax.map``: the memory of a single run)."""
    return jax.lax.map(run_one, starts) if sequential else jax.vmap(run_one)(starts)


def final_objectives(states: EMState) -> np.ndarray:
    """The objective of every start's final parameters, ``(starts,)`` on the host."""
    iterations = np.asarray(states.iteration)
    return np.asarray(states.trace)[np.arange(iterations.shape[0]), iterations]


def best_start(finals: np.ndarray) -> int:
    """The start with the highest final objective (a non-finite one never wins)."""
    return int(np.argmax(np.where(np.isfinite(finals), finals, -np.inf)))


def trace_of(states: EMState, index: int, *, first: int = 0) -> np.ndarray:
    """The trace of start ``index`` from entry ``first`` to its final parameters."""
    return np.asarray(states.trace[index])[first: int(states.iteration[index]) + 1]
