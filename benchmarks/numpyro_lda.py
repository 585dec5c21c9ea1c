"""One NumPyro LDA function: NumPyro's HMC-in-Gibbs against bam_ppl's collapsed Gibbs on it.

The LDA program is written as NumPyro's examples write it (Dirichlet φ in a topics plate,
Dirichlet θ in a documents plate, `z ~ Categorical(θ)` and `w ~ Categorical(φ[z])` in a words
plate inside it). NumPyro runs it with ``DiscreteHMCGibbs(NUTS(lda))`` (NUTS on φ and θ, Gibbs
on the topics; enumerating them under NUTS needs ``funsor``). bam_ppl reads the same function with
:func:`bam_ppl.from_numpyro` and runs ``method="gibbs"`` (φ and θ integrated out).

Quality is the mean held-out log-likelihood per word of the last words of every document, under
the posterior means of θ and φ. bam_ppl is timed cold (with compilation), then compiled (the
second call of each number of sweeps) at increasing numbers of sweeps; the speed-up is NumPyro's time over bam_ppl's warm time at the fewest sweeps
whose held-out score reaches NumPyro's (within ``--tolerance``). Wall-clock and process CPU time
are both reported (CPU time is steadier on a shared machine). One run, same machine.

Usage: ``python benchmarks/numpyro_lda.py [--docs 20] [--words 30] [--heldout 10] [--vocab 20]
[--topics 3] [--numpyro-draws 300] [--tolerance 0.01]``
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS, DiscreteHMCGibbs

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
                z = numpyro.sample("z", dist.Categorical(theta))
                numpyro.sample("w", dist.Categorical(phi[z]), obs=docs)

    return lda


def heldout_loglik(theta, phi, test):
    p = np.asarray(theta) @ np.asarray(phi)
    return float(np.mean(np.log(p[np.arange(p.shape[0])[None, :], test])))


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def run_numpyro(lda, train, draws):
    mcmc = MCMC(DiscreteHMCGibbs(NUTS(lda)), num_warmup=draws, num_samples=draws, progress_bar=False)
    mcmc.run(jax.random.key(0), train)
    samples = mcmc.get_samples()
    return np.asarray(samples["theta"]).mean(0), np.asarray(samples["phi"]).mean(0)


def run_bam(model, data, sweeps):
    idata = bam.infer(model, data, method="gibbs", rng_key=0, num_samples=sweeps, num_warmup=sweeps,
                      num_chains=1)
    post = group(idata, "posterior")
    return post["theta_z"].values.mean((0, 1)), post["theta_w"].values.mean((0, 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20)
    parser.add_argument("--words", type=int, default=30)
    parser.add_argument("--heldout", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=20)
    parser.add_argument("--topics", type=int, default=3)
    parser.add_argument("--numpyro-draws", type=int, default=300, help="NumPyro warm-up = samples")
    parser.add_argument("--bam-sweeps", type=int, nargs="+", default=[5, 10, 25, 100, 300])
    parser.add_argument("--tolerance", type=float, default=0.01)
    args = parser.parse_args()

    train, test, theta, phi = corpus(np.random.default_rng(0), args.docs, args.words, args.heldout,
                                     args.vocab, args.topics)
    lda = make_lda(args.topics, args.vocab)
    print(f"LDA: {args.docs} documents × {args.words} words ({train.size} tokens), vocabulary "
          f"{args.vocab}, {args.topics} topics; {test.size} held-out words")

    (np_theta, np_phi), np_wall, np_cpu = timed(lambda: run_numpyro(lda, train, args.numpyro_draws))
    np_score = heldout_loglik(np_theta, np_phi, test)
    (model, data), read_wall, _ = timed(lambda: bam.from_numpyro(lda, train))
    (_, _), cold_wall, cold_cpu = timed(lambda: run_bam(model, data, args.bam_sweeps[0]))

    rows = [("NumPyro DiscreteHMCGibbs(NUTS)", args.numpyro_draws, np_wall, np_cpu, np_score)]
    reached = None
    for sweeps in args.bam_sweeps:
        run_bam(model, data, sweeps)  # a new number of sweeps is a new static shape: compiled here
        (b_theta, b_phi), wall, cpu = timed(lambda s=sweeps: run_bam(model, data, s))
        score = heldout_loglik(b_theta, b_phi, test)
        rows.append(("bam_ppl gibbs (compiled)", sweeps, wall, cpu, score))
        if reached is None and score >= np_score - args.tolerance:
            reached = (sweeps, wall, cpu)
    print(f"from_numpyro: {read_wall:.2f} s; bam_ppl first call (with compilation, "
          f"{args.bam_sweeps[0]} sweeps): {cold_wall:.2f} s wall, {cold_cpu:.2f} s CPU")
    print(f"{'method':<32}{'draws':>7}{'wall s':>9}{'CPU s':>9}{'held-out/word':>15}")
    for name, n, wall, cpu, score in rows:
        print(f"{name:<32}{n:>7}{wall:>9.2f}{cpu:>9.2f}{score:>15.3f}")
    print(f"{'true θ, φ':<32}{'':>7}{'':>9}{'':>9}{heldout_loglik(theta, phi, test):>15.3f}")
    if reached is None:
        print(f"bam_ppl did not reach NumPyro's held-out score within {args.tolerance} at "
              f"{args.bam_sweeps[-1]} sweeps")
    else:
        sweeps, wall, cpu = reached
        print(f"bam_ppl reaches NumPyro's held-out score (within {args.tolerance}) at {sweeps} sweeps: "
              f"{np_wall / wall:.0f}× less wall time, {np_cpu / cpu:.0f}× less CPU time")


if __name__ == "__main__":
    main()
