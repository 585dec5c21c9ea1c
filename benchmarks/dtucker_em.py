"""Dirichlet Tucker MAP-EM: collapsed contractions against a naive EM that materialises Z.

Two tables:

1. ``collapsed`` (bam_ppl's ``method="map"`` step, Zhang & Linderman §2.3) against ``naive`` (the E-step
   tensor E[z_mnpsijkl] built in full, then summed for each M-step): EM iterations per second
   and XLA's peak temporary memory of one compiled iteration, on sizes where Z fits.
2. Scaling of the collapsed step with the number of cells M·N·P·S up to 1e6, all ranks = 8.

Peak memory is the ``temp_size_in_bytes`` of the compiled iteration (XLA's buffer assignment),
which does not depend on machine load; timings are wall-clock medians.

Usage::

    python benchmarks/dtucker_em.py [--repeats 3] [--iters 5] [--max-cells 1000000] [--dtype float64]
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from bam_ppl.families.dirichlet_tucker.em import (
    DirichletTuckerParams,
    Statistics,
    _concentrations,
    _face_arrays,
    em_step,
    init_params,
    log_prior,
    m_step,
)
from bam_ppl.models.dirichlet_tucker import dirichlet_tucker


def naive_em_step(params: DirichletTuckerParams, X, alpha, weight):
    """EM step of Zhang & Linderman §2.1–2.2 written literally: π and E[z] with all eight axes."""
    rate = jnp.einsum("mi,nj,ijkl,kp,ls->mnpsijkl", params.psi, params.phi, params.core, params.theta,
                      params.lam)
    total = rate.sum(axis=(4, 5, 6, 7), keepdims=True)
    z = (weight[:, :, None, None] * X)[..., None, None, None, None] * rate / total   # E[z] (8-way)
    stats = Statistics(z.sum(axis=(1, 2, 3, 5, 6, 7)), z.sum(axis=(0, 2, 3, 4, 6, 7)),
                       z.sum(axis=(0, 1, 3, 4, 5, 7)).T, z.sum(axis=(0, 1, 2, 4, 5, 6)).T,
                       z.sum(axis=(0, 1, 2, 3)))
    probs = total[..., 0, 0, 0, 0]
    loglik = jnp.sum(jnp.where(X > 0, X * jnp.log(jnp.where(X > 0, probs, 1.0)), 0.0))
    return m_step(stats, alpha), loglik + log_prior(params, alpha)


def problem(shape, ranks, dtype):
    model = dirichlet_tucker(ranks)
    _, X = dirichlet_tucker(ranks, alpha=0.5).sample(0, shape=shape, total=200)
    fitted = np.ones(shape[:2], dtype=bool)
    params = DirichletTuckerParams(*(jnp.asarray(p[0], dtype) for p in init_params(np.random.default_rng(0), ranks, shape, 1)))
    return model, X, fitted, params


def measure(step, args, iters, repeats):
    """(iterations per second, peak temporary bytes) of ``iters`` jitted steps in a fori_loop."""

    def run(params, *rest):
        return jax.lax.fori_loop(0, iters, lambda _, p: step(p, *rest)[0], params)

    compiled = jax.jit(run).lower(*args).compile()
    memory = compiled.memory_analysis().temp_size_in_bytes
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return iters / float(np.median(times)), memory


def compare(shapes, ranks, iters, repeats, dtype):
    print(f"\n## collapsed vs naive (ranks {ranks}, {iters} iterations per timing, median of {repeats})")
    print(f"{'shape':>18} {'cells':>8} {'Z entries':>10} | {'collapsed it/s':>14} {'naive it/s':>11} "
          f"{'speed-up':>8} | {'collapsed MiB':>13} {'naive MiB':>10} {'mem ratio':>9}")
    for shape in shapes:
        model, X, fitted, params = problem(shape, ranks, dtype)
        faces = _face_arrays(X, fitted, dtype)
        alpha = _concentrations(model, dtype)
        M, N = shape[:2]
        ours = measure(functools.partial(em_step, num_mice=M, num_epochs=N), (params, faces, alpha), iters,
                       repeats)
        naive = measure(naive_em_step, (params, jnp.asarray(X, dtype), alpha, jnp.ones((M, N), dtype)),
                        iters, repeats)
        cells = int(np.prod(shape))
        print(f"{str(shape):>18} {cells:>8} {cells * int(np.prod(ranks)):>10} | {ours[0]:>14.1f} "
              f"{naive[0]:>11.1f} {ours[0] / naive[0]:>8.1f} | {ours[1] / 2**20:>13.2f} "
              f"{naive[1] / 2**20:>10.2f} {naive[1] / max(ours[1], 1):>9.1f}")


def scaling(shapes, ranks, iters, repeats, dtype):
    print(f"\n## collapsed EM scaling (ranks {ranks}, median of {repeats})")
    print(f"{'shape':>20} {'cells':>9} | {'it/s':>8} {'s/iter':>8} {'peak MiB':>9} {'MiB per 1e6 cells':>18}")
    for shape in shapes:
        model, X, fitted, params = problem(shape, ranks, dtype)
        faces = _face_arrays(X, fitted, dtype)
        alpha = _concentrations(model, dtype)
        M, N = shape[:2]
        rate, memory = measure(functools.partial(em_step, num_mice=M, num_epochs=N), (params, faces, alpha),
                               iters, repeats)
        cells = int(np.prod(shape))
        print(f"{str(shape):>20} {cells:>9} | {rate:>8.2f} {1 / rate:>8.3f} {memory / 2**20:>9.1f} "
              f"{memory / 2**20 / cells * 1e6:>18.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--max-cells", type=int, default=1_000_000)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    args = parser.parse_args()
    with jax.enable_x64(args.dtype == "float64"):
        dtype = jnp.float64 if args.dtype == "float64" else jnp.float32
        compare([(10, 4, 6, 8), (20, 8, 10, 12), (30, 8, 16, 16)], (4, 4, 4, 4), args.iters, args.repeats, dtype)
        shapes = [(10, 10, 10, 10), (20, 20, 16, 16), (40, 25, 25, 40), (50, 20, 25, 40), (40, 25, 40, 25)]
        shapes = [s for s in shapes if np.prod(s) <= args.max_cells]
        scaling(shapes, (8, 8, 8, 8), args.iters, args.repeats, dtype)


if __name__ == "__main__":
    main()
