# %% [markdown]
# # Topics of Reuters news with VB, collapsed VB and collapsed Gibbs
#
# LDA is the allocation model `d -> k -> w` with every document's length fixed
# (Cemgil et al. 2019 §3.5): document d picks topic k, topic k picks word w. Its counts are a
# document × word matrix; only the nonzero cells are ever touched.
#
# We fit the 395 × 4258 Reuters matrix shipped with the `lda` package three ways:
#
# * `method="vb"`: mean-field VB (Cemgil et al. 2019 App. D), whose ELBO is a lower bound on the
#   evidence;
# * `method="cvb"`: collapsed VB (CVB0), which integrates the tables out;
# * `method="gibbs"`: collapsed Gibbs sampling over the token allocations.
#
# Then we compare the VB bound with the Pólya-urn SMC estimate of the evidence across the number
# of topics K on a subsample small enough for SMC.

# %%
import os
from pathlib import Path

import lda.datasets
import matplotlib.pyplot as plt
import numpy as np

import bam_ppl as bam

SMALL = os.environ.get("BAM_PPL_SMALL") == "1"
OUTPUT = Path(__file__).resolve().parent / "_output"
OUTPUT.mkdir(exist_ok=True)

X_full = lda.datasets.load_reuters()
vocab = np.array(lda.datasets.load_reuters_vocab())
print("documents × words:", X_full.shape, " tokens:", X_full.sum(), " nonzero cells:", (X_full > 0).sum())

# %% [markdown]
# With `BAM_PPL_SMALL=1` (as in CI) we keep the first documents and the most frequent words.

# %%
if SMALL:
    words = np.argsort(-X_full.sum(0))[:300]
    X = X_full[:60][:, words]
    vocab_used = vocab[words]
    K, ITERS, RESTARTS, WARMUP, SAMPLES = 5, 50, 2, 10, 10
else:
    X, vocab_used = X_full, vocab
    K, ITERS, RESTARTS, WARMUP, SAMPLES = 10, 500, 4, 300, 100
X = X[X.sum(1) > 0]
print("fitting", X.shape, "with", X.sum(), "tokens and K =", K)

# %% [markdown]
# ## The model
# Symmetric Dirichlet priors as in standard LDA: 0.1 on each document's topic proportions and
# 0.01 on each topic's word distribution. Conditioning on `d` fixes each document's length, so
# the model has no Gamma–Poisson total term.

# %%
def lda_model(topics):
    return bam.AllocationModel("d -> k -> w", latent={"k": topics}, observed=("d", "w"),
                               condition_on="d", priors={"k": 0.1, "w": 0.01})


model = lda_model(K)
fits = {
    "vb": bam.infer(model, X, method="vb", rng_key=0, num_iters=ITERS, num_chains=RESTARTS,
                    num_samples=50),
    "cvb": bam.infer(model, X, method="cvb", rng_key=0, num_iters=ITERS, num_chains=RESTARTS,
                     num_samples=50),
    "gibbs": bam.infer(model, X, method="gibbs", rng_key=0, num_warmup=WARMUP, num_samples=SAMPLES,
                       num_chains=2, progress_bar=False),
}

# %% [markdown]
# ## Top words per topic
# For VB and CVB0 the posterior draws come from the best restart. Gibbs chains may label the
# topics differently, so we read topics from the first chain.

# %%
def topic_words(idata, top=8):
    theta_w = idata.posterior["theta_w"].isel(chain=0).mean("draw").values  # (k, w)
    weights = idata.posterior["theta_k"].isel(chain=0).mean("draw").values.sum(0)
    order = np.argsort(-weights)
    return [" ".join(vocab_used[np.argsort(-theta_w[k])[:top]]) for k in order]


for method, idata in fits.items():
    print(f"--- {method}")
    for rank, words in enumerate(topic_words(idata)):
        print(f"  topic {rank}: {words}")

# %% [markdown]
# ## Training log-likelihood
# Σ X(d, w) log p̄(w | d) under the posterior-mean tables: VB and CVB0 report it per restart;
# for Gibbs we average the tables over each chain's draws.

# %%
def gibbs_log_likelihood(idata):
    post = idata.posterior
    theta_k = post["theta_k"].isel(chain=0).mean("draw").values  # (d, k)
    theta_w = post["theta_w"].isel(chain=0).mean("draw").values  # (k, w)
    rows, cols = np.nonzero(X)
    return float(np.sum(X[rows, cols] * np.log(np.einsum("uk,ku->u", theta_k[rows], theta_w[:, cols]))))


loglik = {
    method: float(fits[method].sample_stats["final_training_log_likelihood"].values[
        fits[method].attrs["best_restart"]])
    for method in ("vb", "cvb")
}
loglik["gibbs"] = gibbs_log_likelihood(fits["gibbs"])
for method, value in loglik.items():
    print(f"{method:>6}: training log-likelihood {value:12.1f}  ({value / X.sum():.3f} per token)")

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for method in ("vb", "cvb"):
    stats = fits[method].sample_stats
    best = fits[method].attrs["best_restart"]
    axes[0].plot(stats["elbo"].values[best], label=method)
axes[0].set(xlabel="iteration", ylabel="ELBO (eq. D.1)", title="bound at each iteration")
axes[0].legend()
cvb_trace = fits["cvb"].sample_stats["training_log_likelihood"].values
axes[1].plot(cvb_trace.T, color="C1", alpha=0.7)
axes[1].set(xlabel="sweep", ylabel="training log-likelihood", title="CVB0 restarts")
fig.tight_layout()
fig.savefig(OUTPUT / "topics_reuters_traces.png", dpi=100)

# %% [markdown]
# CVB0 does not maximise the ELBO, but its Φ still defines one (any q(S) does), so the two
# bounds can be compared: VB's is higher by construction once it has converged to a good
# optimum.
#
# ## Evidence against the number of topics
# SMC's cost grows with the number of tokens, so we take a subsample: a few documents and the
# most frequent words. The VB bound (best of restarts) lies below the SMC estimate; where the
# gap changes with K the bound can rank models differently from the evidence (Cemgil et al. 2019
# §5.1).

# %%
if SMALL:
    docs, num_words, ranks, particles, chains, restarts = 8, 20, (1, 2, 3), 250, 4, 5
else:
    docs, num_words, ranks, particles, chains, restarts = 30, 60, (1, 2, 3, 4, 5, 6), 2000, 4, 30
sub_words = np.argsort(-X_full[:docs].sum(0))[:num_words]
X_sub = X_full[:docs][:, sub_words]
X_sub = X_sub[X_sub.sum(1) > 0]
print("subsample", X_sub.shape, "tokens", X_sub.sum())

curve = {"vb": [], "smc": [], "smc_se": []}
for k in ranks:
    m = lda_model(k)
    curve["vb"].append(bam.log_evidence(m, X_sub, method="vb", rng_key=1, num_chains=restarts).value)
    est = bam.log_evidence(m, X_sub, method="smc", rng_key=1, num_particles=particles, num_chains=chains)
    curve["smc"].append(est.value)
    curve["smc_se"].append(est.stderr)
    print(f"K={k}: VB bound {curve['vb'][-1]:10.2f}   SMC {est.value:10.2f} ± {est.stderr:.2f}")
    if est.value + 2 * est.stderr + 1e-6 < curve["vb"][-1]:
        # log L_X ≥ ELBO always; an SMC estimate this far below means too few particles
        # (the log of an unbiased estimate is biased downwards when its variance is large).
        print("   SMC estimate below the bound: increase num_particles")

# %%
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.errorbar(ranks, curve["smc"], yerr=2 * np.asarray(curve["smc_se"]), marker="o", label="SMC estimate")
ax.plot(ranks, curve["vb"], marker="s", label="VB lower bound")
ax.set(xlabel="number of topics K", ylabel="log evidence", title="Reuters subsample")
ax.legend()
fig.tight_layout()
fig.savefig(OUTPUT / "topics_reuters_evidence.png", dpi=100)
print("best K by SMC:", ranks[int(np.argmax(curve["smc"]))], " by the VB bound:",
      ranks[int(np.argmax(curve["vb"]))])
