"""The shared EM loop (bam_ppl.infer.em_driver): trace, stopping rule, starts side by side or in turn."""

import jax
import jax.numpy as jnp
import numpy as np

from bam_ppl.infer import em_driver

TARGET = 3.0


def _objective(x):
    return -((x - TARGET) ** 2)


def _step(x):
    """Halve the distance to TARGET: the objective rises by a factor 4 closer each time."""
    return 0.5 * (x + TARGET), _objective(x)


def _run(start, num_iters=100, tol=1e-6):
    with jax.enable_x64(True):
        return em_driver.run(_step, _objective, jnp.asarray(start, jnp.float64), num_iters=num_iters, tol=tol,
                             capacity=em_driver.trace_capacity(num_iters))


def test_trace_holds_the_objective_after_each_update():
    state = _run(1.0, num_iters=5, tol=0.0)
    expected = [_objective(TARGET - 2.0 * 0.5 ** t) for t in range(6)]
    np.testing.assert_allclose(em_driver.trace_of(jax.tree.map(lambda a: a[None], state), 0),
                               expected, rtol=1e-12)
    assert int(state.iteration) == 5 and not bool(state.converged)
    assert np.isnan(np.asarray(state.trace)[6:]).all() and state.trace.shape == (64,)


def test_stops_once_an_update_gains_at_most_tol_and_keeps_that_update():
    tol = 1e-6
    state = _run(1.0, tol=tol)
    trace = np.asarray(state.trace)[: int(state.iteration) + 1]
    gains = np.diff(trace)
    # trace[-1] scores the kept converging update; the gain before it is the first within tol.
    assert gains[-2] <= tol * max(abs(trace[-2]), 1.0)
    assert np.all(gains[:-2] > tol * np.maximum(np.abs(trace[1:-2]), 1.0))
    np.testing.assert_allclose(float(state.params), TARGET - 2.0 * 0.5 ** int(state.iteration), rtol=1e-12)


def test_a_decrease_stops_the_loop():
    with jax.enable_x64(True):
        state = em_driver.run(lambda x: (x + 1.0, -x), lambda x: -x, jnp.asarray(0.0), num_iters=50, tol=0.0,
                              capacity=64)
    assert int(state.iteration) == 2 and bool(state.converged)


def test_starts_side_by_side_and_in_turn_agree_and_the_best_is_finite():
    starts = jnp.asarray([1.0, -5.0, 2.5])
    with jax.enable_x64(True):
        run_one = lambda x: em_driver.run(_step, _objective, x, num_iters=7, tol=0.0, capacity=64)  # noqa: E731
        side = em_driver.run_starts(run_one, starts.astype(jnp.float64))
        turn = em_driver.run_starts(run_one, starts.astype(jnp.float64), sequential=True)
    np.testing.assert_array_equal(np.asarray(side.trace), np.asarray(turn.trace))
    finals = em_driver.final_objectives(side)
    assert em_driver.best_start(finals) == 2
    assert em_driver.best_start(np.array([np.nan, -1.0, -np.inf])) == 1
