# %% [markdown]
# # One NumPyro LDA, two inferences: NumPyro's sampler and bam_ppl's collapsed Gibbs
#
# LDA written the way NumPyro's and Pyro's examples write it: topics φ and document mixtures θ are
# Dirichlet tables, every word has a latent topic `z ~ Categorical(θ_d)` and is drawn from
# `Categorical(φ_z)`. NumPyro runs it as it stands; `bam.from_numpyro` reads the very same
# function as the allocation model `documents -> z -> w` with each document's length fixed
# (Cemgil et al. 2019 §3.5), integrates φ and θ out, and runs collapsed Gibbs and evidence on it.
#
# The two integrate out opposite things. NumPyro enumerates the topics: the flag
# `infer={"enumerate": "parallel"}` on `z` (NumPyro's examples write it so, or wrap the program in
# `numpyro.contrib.funsor.config_enumerate`; it needs `funsor`) sums every word's topic out, and
# NUTS samples φ and θ from `p(w | θ_d, φ) = Σ_k θ_dk φ_kw`. bam_ppl integrates φ and θ out
# and samples the topics. The flag is read by NumPyro only; `bam.from_numpyro` reads the program
# the same with or without it. We compare time and the held-out log-likelihood of words hidden
# from every document.

# %%
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

import bam_ppl as bam

SMALL = os.environ.get("BAM_PPL_SMALL") == "1"

# %% [markdown]
# ## A corpus with known topics
# Documents × words drawn from LDA itself, so the true topics are known; the last words of every
# document are held out.

# %%
rng = np.random.default_rng(0)
D, N, HELD, V, K = (8, 12, 4, 10, 2) if SMALL else (20, 30, 10, 20, 3)
phi_true = rng.dirichlet(np.full(V, 0.2), size=K)
theta_true = rng.dirichlet(np.full(K, 0.5), size=D)
z_true = np.stack([rng.choice(K, size=N + HELD, p=theta_true[d]) for d in range(D)], axis=1)
words = np.vectorize(lambda k: rng.choice(V, p=phi_true[k]))(z_true)
train, test = words[:N], words[N:]  # (words, documents), as in NumPyro's examples
print("documents:", D, " training words per document:", N, " held out:", HELD, " vocabulary:", V)


# %% [markdown]
# ## The program

# %%
def lda(docs, num_topics=K, vocab=V):
    with numpyro.plate("topics", num_topics):
        phi = numpyro.sample("phi", dist.Dirichlet(jnp.full(vocab, 0.1)))
    with numpyro.plate("documents", docs.shape[1]):
        theta = numpyro.sample("theta", dist.Dirichlet(jnp.full(num_topics, 0.5)))
        with numpyro.plate("words", docs.shape[0], dim=-2):
            z = numpyro.sample("z", dist.Categorical(theta), infer={"enumerate": "parallel"})
            numpyro.sample("w", dist.Categorical(phi[z]), obs=docs)


def heldout_loglik(theta, phi):
    """Mean log p(w | θ_d, φ) of the held-out words, θ and φ the posterior means."""
    p = np.asarray(theta) @ np.asarray(phi)
    return float(np.mean(np.log(p[np.arange(D)[None, :], test])))


# %% [markdown]
# ## NumPyro's inference on the function
# NUTS on φ and θ, every word's topic enumerated. The run is compiled as one program with
# `jax.jit` (NumPyro's MCMC runs under JAX transforms): that compiles in a third of the time that
# `mcmc.run` outside it spends compiling its initialisation operation by operation.

# %%
draws = 30 if SMALL else 400


@jax.jit
def numpyro_posterior(key):
    mcmc = MCMC(NUTS(lda), num_warmup=draws, num_samples=draws, progress_bar=False)
    mcmc.run(key, train)
    return mcmc.get_samples()


start = time.perf_counter()
samples = jax.block_until_ready(numpyro_posterior(jax.random.key(0)))
numpyro_seconds = time.perf_counter() - start
numpyro_score = heldout_loglik(samples["theta"].mean(0), samples["phi"].mean(0))

# %% [markdown]
# ## bam_ppl on the same function
# `from_numpyro` traces the program and reads its sites: φ and θ are tables, `z` a latent index,
# `w` an observed one, the documents plate a node whose totals are fixed.

# %%
model, data = bam.from_numpyro(lda, train)
print(model)
print(data)
start = time.perf_counter()
idata = bam.infer(model, data, method="gibbs", rng_key=0, num_samples=draws, num_warmup=draws, num_chains=1)
bam_seconds = time.perf_counter() - start
posterior = idata.posterior
bam_score = heldout_loglik(posterior["theta_z"].values.mean((0, 1)), posterior["theta_w"].values.mean((0, 1)))

print(f"{'':<24} {'seconds':>8} {'held-out log-lik / word':>24}")
print(f"{'NumPyro NUTS, z summed':<24} {numpyro_seconds:8.2f} {numpyro_score:24.3f}")
print(f"{'bam_ppl collapsed Gibbs':<24} {bam_seconds:8.2f} {bam_score:24.3f}")
print(f"{'true θ, φ':<24} {'':>8} {heldout_loglik(theta_true, phi_true):24.3f}")

# %% [markdown]
# Both times are first calls: NumPyro's includes compiling its sampler with JAX, bam_ppl's
# compiling its sampler with numba (unless numba's cache on disk holds it from an earlier run).
# `benchmarks/numpyro_lda.py` times first and compiled calls of both at several thousand words.
# The posterior means reach the same held-out likelihood.
#
# ## Evidence: how many topics?
# The evidence is the probability of the document × word count table given the document lengths
# (no Gamma–Poisson term: the program fixes the number of words). The program's token sequence
# differs from it by the multinomial coefficient `model.program_info.log_sequence_offset`.

# %%
models = {f"K={k}": bam.from_numpyro(lda, train, num_topics=k)[0] for k in (1, 2, 3)}
table = bam.compare(models, data, method="vb")  # a lower bound per model, cheap at any size
print(table[["log_evidence"]].round(2))
print("log multinomial coefficient of the counts:", round(model.program_info.log_sequence_offset, 3))
