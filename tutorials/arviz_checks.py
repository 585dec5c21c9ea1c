# %% [markdown]
# # Evidence and LOO side by side, posterior predictive checks, relabelled summaries
#
# Every sampling backend (`smc`, `gibbs`, `nuts`, `svi`, NBMF `gibbs`, ...) writes a pointwise
# `log_likelihood` group, so ArviZ's `az.loo`, `az.waic` and `az.compare` work on its output;
# `bam.posterior_predictive` adds replicated data for `az.plot_ppc`; `bam.relabel` removes label
# switching before `az.summary`.

# %%
import os
import warnings
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import bam_ppl as bam  # noqa: E402
from bam_ppl.datasets import load_hair_eye_color  # noqa: E402

warnings.filterwarnings("ignore", message=r"\s*ArviZ is undergoing a major refactor", category=FutureWarning)
import arviz as az  # noqa: E402

AZ_MAJOR = int(az.__version__.split(".")[0])
SMALL = os.environ.get("BAM_PPL_SMALL") == "1"
OUTPUT = Path(os.environ.get("BAM_PPL_OUTPUT", "tutorials/_output"))
OUTPUT.mkdir(parents=True, exist_ok=True)
n = 200 if SMALL else 1000

# %% [markdown]
# ## The same structures, two yardsticks
# `bam.compare` ranks structures by their **evidence** log p(X | structure): the prior predictive
# probability of the whole table. `az.compare` ranks them by **PSIS-LOO**: the posterior
# predictive probability of each cell given all the others (elpd_loo). Both are computed here on
# the hair × eye × sex table (592 students).

# %%
X = load_hair_eye_color()
dims = ("hair", "eye", "sex")
models = {
    "independence": bam.AllocationModel("hair; eye; sex", observed=dims),
    "hair -> eye; sex": bam.AllocationModel("hair -> eye; sex", observed=dims),
    "complete graph": bam.AllocationModel("hair -> eye; (hair, eye) -> sex", observed=dims),
    "latent class R=3": bam.AllocationModel("r -> hair, eye, sex", latent={"r": 3}, observed=dims),
}
evidence = bam.compare(models, X, rng_key=0)
fits = {name: bam.infer(m, X, method="gibbs", rng_key=0, num_warmup=n, num_samples=n, num_chains=2,
                        progress_bar=False)
        for name, m in models.items()}
loo = az.compare(fits)
side = evidence[["log_evidence", "stderr"]].join(loo[["elpd_loo" if AZ_MAJOR < 1 else "elpd", "p_loo" if AZ_MAJOR < 1 else "p", "warning" if "warning" in loo else loo.columns[-1]]])
print(side.round(2).to_string())

# %% [markdown]
# **When they disagree, and why.**
#
# * The evidence pays for every parameter through the prior (an Occam factor): a structure with
#   many free table entries (the complete graph: 4·4·2 − 1 cells' worth) must fit much better to
#   win. LOO judges predictions made *after* fitting, so extra parameters cost only through
#   p_loo; with plenty of data per cell LOO leans towards richer structures sooner.
# * The units differ. The evidence is one number for the whole table; LOO's observations are
#   the 32 cells (each a Poisson count with rate λ·p(cell), zero cells included). A cell holding
#   many tokens is influential: Pareto k̂ > 0.7 (printed as a warning) means that cell's LOO
#   value is unreliable, and `az.compare` then is too.
# * Under `condition_on` (LDA, Dirichlet Tucker) the evidence and LOO both condition on the
#   totals; the multinomial coefficient is split over cells in proportion to their counts
#   (see `bam_ppl.pointwise`), which does not change any comparison on the same data.
#
# Use the evidence for structure selection as in the papers; use LOO as a posterior predictive
# check of the winner and to spot influential cells.

# %% [markdown]
# ## Posterior predictive check
# `bam.posterior_predictive` draws one replicate table per chain and draw (Poisson(λ p(cell)) for
# these models) and returns the InferenceData with `posterior_predictive` and `observed_data`.

# %%
best = "hair -> eye; sex"
checked = bam.posterior_predictive(models[best], fits[best], rng_key=1)
rep = checked.posterior_predictive["X"]
print("replicated totals:", float(rep.sum(dims).mean()), "observed:", int(X.total))
if AZ_MAJOR >= 1:
    az.plot_ppc_dist(checked, backend="matplotlib")
else:
    az.plot_ppc(checked, num_pp_samples=50)
plt.savefig(OUTPUT / "arviz_checks_ppc.png")
plt.close("all")

# %% [markdown]
# ## Label switching and `bam.relabel`
# The components of an NMF (or the classes of a latent-class model) are exchangeable: chains
# settle on different labellings, so R̂ of `theta_i` is large although every chain has converged.
# `bam.relabel` aligns every chain and draw to one reference by Hungarian matching of the
# component tables. Label-invariant quantities (evidence, p(cell), total_rate, LOO, predictive
# draws) need no relabelling. Here: a 12 × 9 count matrix with three planted blocks.

# %%
rng = np.random.default_rng(0)
rows, cols = np.zeros((3, 12)), np.zeros((3, 9))
for k in range(3):
    rows[k, 4 * k:4 * k + 4], cols[k, 3 * k:3 * k + 3] = 0.25, 1 / 3
blocks = rng.multinomial(900, np.einsum("ki,kj->ij", rows, cols).ravel() / 3).reshape(12, 9)
nmf = bam.infer(bam.models.nmf(3), blocks, method="gibbs", rng_key=3, num_warmup=100, num_samples=n,
                num_chains=4, progress_bar=False)
names = ["theta_k", "theta_i", "theta_j"]
before = az.rhat(nmf, var_names=names)
aligned = bam.relabel(nmf)
after = az.rhat(aligned, var_names=names)
for name in names:
    print(f"{name:8s} max R-hat before {float(before[name].max()):.3f}  after {float(after[name].max()):.3f}")
print(az.summary(aligned, var_names=["theta_k"], kind="diagnostics"))

# %% [markdown]
# Relabelling removes permutations only. If R̂ stays large afterwards, the chains sit in
# genuinely different modes — as latent-class models on the hair × eye × sex table do (with
# R = 2, some chains give the classes weights 0.2 / 0.8 and others 0.5 / 0.5): run longer
# chains, or compare the modes by their `log_joint`.
