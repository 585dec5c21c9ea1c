# %% [markdown]
# # ICEWS: CP or Tucker, and which ranks?
#
# The model-selection experiment of Yıldırım, Kurutmaz, Barsbey, Şimşekli & Cemgil, "Bayesian
# allocation model: marginal likelihood-based model selection for count tensors" (IEEE Journal of
# Selected Topics in Signal Processing, 2021). Dyadic events of 2017 from the Integrated Crisis
# Early Warning System (ICEWS) between 20 countries form a sender × receiver × quad-class count
# tensor (20 × 20 × 4; quad classes: verbal / material cooperation / conflict). Two families of
# decompositions compete by their evidence:
#
# * **CP(R)**: one latent class r explains sender, receiver and event type together;
# * **Tucker(R₁, R₂, R₃)**: each axis has its own latent (sender group, receiver group, event
#   group), linked by a joint core p(r₁, r₂, r₃).

# %%
import os
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import bam_ppl as bam
from bam_ppl.datasets import load_icews

SMALL = os.environ.get("BAM_PPL_SMALL") == "1"
OUTPUT = Path(os.environ.get("BAM_PPL_OUTPUT", "tutorials/_output"))
OUTPUT.mkdir(parents=True, exist_ok=True)

# Small settings (CI): the 375-event set, a few ranks, few particles. Full: 3519 events
# (threshold 0.9), CP ranks 1..25 and a grid of Tucker ranks.
THRESHOLD = 0.99 if SMALL else 0.9
A = 1.0
CP_RANKS = range(1, 4) if SMALL else range(1, 26)
TUCKER_RANKS = [(2, 2, 1), (2, 2, 2)] if SMALL else \
    [(r, r, q) for r in (1, 2, 3, 4, 5, 6, 8) for q in (1, 2, 3, 4)]
# The tempered SMC's options: few particles in small mode; the package defaults otherwise.
TEMPERED = dict(num_particles=64, num_chains=2) if SMALL else {}

# %% [markdown]
# ## The data
#
# `load_icews(threshold)` reads one of the five event sets of the paper (a higher threshold
# keeps fewer events); axes are named and labelled (country names where the set ships its
# country dictionary).

# %%
X = load_icews(threshold=THRESHOLD)
print(X)
dense = X.to_dense()
print("events by quad class:", dict(zip(X.coords["quad_class"], dense.sum(axis=(0, 1)).tolist())))
busiest = np.argsort(dense.sum(axis=(1, 2)))[::-1][:5]
print("busiest senders:", [X.coords["sender"][c] for c in busiest])


# %% [markdown]
# ## Evidence of every decomposition
#
# Each estimate is the one `method="auto"` runs (the tempered SMC
# from a mixture of references here). Rank-1 models have a single allocation, scored exactly.

# %%
def estimate(model, data, rng_key=0):
    """``method="auto"``; the mixture engine's options reach it only where it runs. The compare
    table's ``below_bound`` column says what an EvidenceWarning would."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bam.EvidenceWarning)
        return bam.log_evidence(model, data, rng_key=rng_key, **TEMPERED)


def temperatures(estimate):
    """Fewest temperatures among the tempered runs (0 for other estimators): 1 means the adaptive
    schedule jumped from the prior straight to the posterior — then the value is not trustworthy."""
    return min(estimate.details.get("num_temperatures", [0]))


start = time.perf_counter()
estimates = {}
for R in CP_RANKS:
    estimates[f"CP({R})"] = estimate(bam.models.cp(R, a=A), X, rng_key=R)
for ranks in TUCKER_RANKS:
    estimates[f"Tucker{ranks}"] = estimate(bam.models.tucker(ranks, a=A), X, rng_key=100 + sum(ranks))
table = bam.compare(estimates, X)
table["family"] = [name.split("(")[0] for name in table.index]
table["temperatures"] = [temperatures(estimates[name]) for name in table.index]
columns = ["log_evidence", "stderr", "lower_bound", "method", "delta", "distinguishable", "below_bound",
           "temperatures"]
print(table[columns].round(2).to_string())
print(f"{time.perf_counter() - start:.1f} s")
table.to_csv(OUTPUT / "icews_compare.csv")

# %% [markdown]
# The best model of each family, and how confidently it is ahead: rows marked not
# `distinguishable` are within two combined standard errors of the best, and an estimate below
# its own sure lower bound (log p(X, S) of a visited allocation) needs more sampling effort.

# %%
for family in ("CP", "Tucker"):
    rows = table[table["family"] == family]
    best = rows.index[0]
    print(f"best {family}: {best}  log evidence {rows.loc[best, 'log_evidence']:.2f} ± "
          f"{rows.loc[best, 'stderr']:.2f} (sure lower bound {rows.loc[best, 'lower_bound']:.2f})")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), gridspec_kw={"width_ratios": [1, 1.4]})
cp = table[table["family"] == "CP"].copy()
cp["R"] = [int(name[3:-1]) for name in cp.index]
cp = cp.sort_values("R")
axes[0].errorbar(cp["R"], cp["log_evidence"], yerr=2 * cp["stderr"].fillna(0), fmt="o-", label="estimate")
axes[0].plot(cp["R"], cp["lower_bound"], "x", color="gray", label="sure lower bound")
axes[0].set_xlabel("CP rank R")
axes[0].xaxis.set_major_locator(plt.MaxNLocator(integer=True))
axes[0].set_ylabel("log evidence")
axes[0].legend(fontsize=8)
tucker = table[table["family"] == "Tucker"]
pos = np.arange(len(tucker))
axes[1].errorbar(pos, tucker["log_evidence"], yerr=2 * tucker["stderr"].fillna(0), fmt="s", label="estimate")
axes[1].plot(pos, tucker["lower_bound"], "x", color="gray")
axes[1].axhline(cp["log_evidence"].max(), color="C0", linestyle=":", label="best CP")
axes[1].set_xticks(pos, [name[6:] for name in tucker.index], rotation=90, fontsize=7)
axes[1].set_xlabel("Tucker ranks (best first)")
axes[1].legend(fontsize=8)
fig.suptitle(f"ICEWS 2017, {X.total} events, a = {A}")
fig.tight_layout()
fig.savefig(OUTPUT / "icews_evidence.png")
