"""One NumPyro LDA function: NumPyro's NUTS (topics enumerated) against bam_ppl's collapsed Gibbs on it.

The LDA program is written as NumPyro's examples write it (Dirichlet φ in a topics plate,
Dirichlet θ in a documents plate, ``z ~ Categorical(θ)`` flagged ``infer={"enumerate":
"parallel"}`` and ``w ~ Categorical(φ[z])`` in a words plate inside it). NumPyro runs it with
``MCMC(NUTS(lda))``: every word's topic summed out (``funsor``), NUTS on φ and θ; the run is
compiled as one program with ``jax.jit`` (MCMC runs under JAX transforms), which compiles faster
than ``mcmc.run`` outside it (that compiles its initialisation operation by operation). bam_ppl reads the
same function with :func:`bam_ppl.from_numpyro` and runs ``method="gibbs"`` (φ and θ integrated
out, the topics sampled).

Quality is the mean held-out log-likelihood per word of the last words of every document, under
the posterior means of θ and φ. Each side is timed twice:

* **first call**: what a user waits for in a new process that has imported its libraries (JAX,
  NumPyro, ArviZ and bam_ppl are imported before either clock starts; the time ArviZ's import took
  is printed apart). NumPyro's first call compiles its
  sampler with JAX; bam_ppl compiles its sampler with numba (cached on disk, under
  ``NUMBA_CACHE_DIR``) and a few JAX functions (not cached). bam_ppl's first call is measured in
  two fresh processes that share a new, empty numba cache: the first compiles everything (cold),
  the second finds numba's compiled kernels on disk (cached), as every later run of a user does.
* **compiled**: a second call in the same process (sampling only): NumPyro's jitted run called
  again, bam_ppl's second call with the same number of sweeps.

bam_ppl runs at increasing numbers of sweeps; the speed-ups are at the fewest sweeps whose held-out
score reaches NumPyro's (within ``--tolerance``). Wall-clock and process CPU time are both reported
(CPU time is steadier on a shared machine; the first-call processes report the time of the call,
not of starting Python). One run, same machine.

Usage: ``python benchmarks/numpyro_lda.py [--docs 100] [--words 60] [--heldout 10] [--vocab 20]
[--topics 3] [--numpyro-draws 200] [--bam-sweeps 5 10 25 50 100 200] [--tolerance 0.01]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

import bam_ppl as bam
from bam_ppl.convert import group


def corpus(rng, docs, words, heldout, vocab, topics):
    """(training words, held-out words, true θ, true φ), words laid out (position, document)."""
    phi = rng.dirichlet(np.full(vocab, 0.2), size=topics)
    theta = rng.dirichlet(np.full(topics, 0.5), size=docs)
    z = np.stack([rng.choice(topics, size=words + heldout, p=theta[d]) for d in range(docs)], axis=1)
    w = np.vectorize(lambda k: rng.choice(vocab, p=phi[k]))(z)
    return w[:words], w[words:], theta, phi


def make_lda(topics, vocab):
    def lda(docs):
        with numpyro.plate("topics", topics):
            phi = numpyro.sample("phi", dist.Dirichlet(jnp.full(vocab, 0.1)))
        with numpyro.plate("documents", docs.shape[1]):
            theta = numpyro.sample("theta", dist.Dirichlet(jnp.full(topics, 0.5)))
            with numpyro.plate("words", docs.shape[0], dim=-2):
                z = numpyro.sample("z", dist.Categorical(theta), infer={"enumerate": "parallel"})
                numpyro.sample("w", dist.Categorical(phi[z]), obs=docs)

    return lda


def heldout_loglik(theta, phi, test):
    p = np.asarray(theta) @ np.asarray(phi)
    return float(np.mean(np.log(p[np.arange(p.shape[0])[None, :], test])))


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def numpyro_sampler(lda, train, draws):
    """NumPyro's NUTS on ``lda`` as one compiled function of the key."""
    @jax.jit
    def posterior(key):
        mcmc = MCMC(NUTS(lda), num_warmup=draws, num_samples=draws, progress_bar=False)
        mcmc.run(key, train)
        return mcmc.get_samples()

    def means():
        samples = jax.block_until_ready(posterior(jax.random.key(0)))
        return np.asarray(samples["theta"]).mean(0), np.asarray(samples["phi"]).mean(0)

    return means


def run_bam(model, data, sweeps):
    idata = bam.infer(model, data, method="gibbs", rng_key=0, num_samples=sweeps, num_warmup=sweeps,
                      num_chains=1)
    post = group(idata, "posterior")
    return post["theta_z"].values.mean((0, 1)), post["theta_w"].values.mean((0, 1))


def first_call(args, sweeps, cache_dir):
    """bam_ppl's first call in a fresh process whose numba cache is ``cache_dir``: (wall, CPU,
    wall seconds of the import of ArviZ before it)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    cmd = [sys.executable, __file__, "--first-call", str(sweeps)] + [
        f"--{k}={getattr(args, k)}" for k in ("docs", "words", "heldout", "vocab", "topics")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["wall"], result["cpu"], result["arviz_import"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--words", type=int, default=60)
    parser.add_argument("--heldout", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=20)
    parser.add_argument("--topics", type=int, default=3)
    parser.add_argument("--numpyro-draws", type=int, default=200, help="NumPyro warm-up = samples")
    parser.add_argument("--bam-sweeps", type=int, nargs="+", default=[5, 10, 25, 50, 100, 200])
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--first-call", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    train, test, theta, phi = corpus(np.random.default_rng(0), args.docs, args.words, args.heldout,
                                     args.vocab, args.topics)
    lda = make_lda(args.topics, args.vocab)
    if args.first_call is not None:  # a child process: bam_ppl's first call, timed alone
        model, data = bam.from_numpyro(lda, train)
        _, arviz_wall, _ = timed(lambda: __import__("arviz"))
        _, wall, cpu = timed(lambda: run_bam(model, data, args.first_call))
        print(json.dumps({"wall": wall, "cpu": cpu, "arviz_import": arviz_wall}))
        return

    print(f"LDA: {args.docs} documents × {args.words} words ({train.size} tokens), vocabulary "
          f"{args.vocab}, {args.topics} topics; {test.size} held-out words", flush=True)
    numpyro_means = numpyro_sampler(lda, train, args.numpyro_draws)
    _, np_first_wall, np_first_cpu = timed(numpyro_means)
    (np_theta, np_phi), np_wall, np_cpu = timed(numpyro_means)
    np_score = heldout_loglik(np_theta, np_phi, test)
    (model, data), read_wall, _ = timed(lambda: bam.from_numpyro(lda, train))

    rows = []
    reached = None
    for sweeps in args.bam_sweeps:
        run_bam(model, data, sweeps)  # a new number of sweeps is a new static shape: compiled here
        (b_theta, b_phi), wall, cpu = timed(lambda s=sweeps: run_bam(model, data, s))
        score = heldout_loglik(b_theta, b_phi, test)
        rows.append((sweeps, wall, cpu, score))
        if reached is None and score >= np_score - args.tolerance:
            reached = (sweeps, wall, cpu)
    at = reached[0] if reached else args.bam_sweeps[-1]
    with tempfile.TemporaryDirectory(prefix="bam-ppl-numba-cache-") as cache_dir:
        cold = first_call(args, at, cache_dir)    # empty numba cache: compiles everything
        cached = first_call(args, at, cache_dir)  # numba's kernels found on disk

    print(f"from_numpyro (reading the program): {read_wall:.2f} s")
    head = f"{'method':<34}{'draws':>7}{'first wall':>12}{'first CPU':>11}{'compiled wall':>15}{'compiled CPU':>14}{'held-out/word':>15}"
    print(head)
    print(f"{'NumPyro NUTS (jit), z enumerated':<34}{args.numpyro_draws:>7}{np_first_wall:>12.2f}{np_first_cpu:>11.2f}"
          f"{np_wall:>15.2f}{np_cpu:>14.2f}{np_score:>15.3f}")
    for sweeps, wall, cpu, score in rows:
        first = ""
        if sweeps == at:
            first = f"{cold[0]:>12.2f}{cold[1]:>11.2f}"
        print(f"{'bam_ppl gibbs':<34}{sweeps:>7}{first or '':>23}{wall:>15.2f}{cpu:>14.2f}{score:>15.3f}")
    print(f"{'bam_ppl gibbs, numba cache warm':<34}{at:>7}{cached[0]:>12.2f}{cached[1]:>11.2f}")
    print(f"  before the first calls' clocks, importing ArviZ took {cold[2]:.2f} s (cache empty), {cached[2]:.2f} s (warm)")
    print(f"{'true θ, φ':<34}{'':>7}{'':>12}{'':>11}{'':>15}{'':>14}{heldout_loglik(theta, phi, test):>15.3f}")
    print("draws: NumPyro's warm-up = samples; bam_ppl's sweeps of warm-up = kept sweeps. first: a new "
          "process's first call (bam_ppl: an empty numba cache; 'numba cache warm': the next process).")
    if reached is None:
        print(f"bam_ppl did not reach NumPyro's held-out score within {args.tolerance} at "
              f"{args.bam_sweeps[-1]} sweeps")
        return
    sweeps, wall, cpu = reached
    print(f"bam_ppl reaches NumPyro's held-out score (within {args.tolerance}) at {sweeps} sweeps. "
          f"NumPyro's time over bam_ppl's (wall / CPU):")
    print(f"  compiled against compiled:                        {np_wall / wall:6.0f}× / {np_cpu / cpu:.0f}×")
    print(f"  first call against first call, numba cache empty: {np_first_wall / cold[0]:6.0f}× / "
          f"{np_first_cpu / cold[1]:.0f}×")
    print(f"  first call against first call, numba cache warm:  {np_first_wall / cached[0]:6.0f}× / "
          f"{np_first_cpu / cached[1]:.0f}×")


if __name__ == "__main__":
    main()
