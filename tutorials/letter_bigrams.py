# %% [markdown]
# # Letter bigrams: NMF or symmetric NMF?
#
# The letter-transition comparison of Cemgil, Kurutmaz, Yıldırım, Barsbey & Şimşekli, "Bayesian
# allocation model: inference by sequential Monte Carlo for nonnegative tensor factorizations
# and topic models using Pólya urns" (2019), §5.3. From Peter Norvig's English letter-bigram
# counts (about 2.8 × 10¹² transitions) we draw a noisy sample of 2000 bigrams and ask which
# structure explains it better:
#
# * **NMF(K)**, `k -> i; k -> j`: a hidden state k emits the first letter i and the second letter
#   j from two different tables, X ≈ W H;
# * **symmetric NMF(K)**, `r -> i; r -> j` with the two tables tied, X ≈ W diag(λ) Wᵀ: half the
#   parameters.
#
# The paper found NMF ahead at every order for a = 1, and symmetric NMF ahead at almost every
# order for a = 0.001, where weak priors favour the smaller model.

# %%
import os
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import bam_ppl as bam
from bam_ppl.datasets import load_letter_bigrams

SMALL = os.environ.get("BAM_PPL_SMALL") == "1"
OUTPUT = Path(os.environ.get("BAM_PPL_OUTPUT", "tutorials/_output"))
OUTPUT.mkdir(parents=True, exist_ok=True)

# Small settings (CI): 400 tokens, orders 1..3, few particles. Full: the paper's setting.
TOTAL = 400 if SMALL else 2000
ORDERS = range(1, 4) if SMALL else range(1, 51)
A_VALUES = (1.0, 0.001)
# The tempered SMC's options: few particles in small mode; the package defaults otherwise.
TEMPERED = dict(num_particles=64, num_chains=2) if SMALL else {}

# %% [markdown]
# ## The data
#
# `load_letter_bigrams(total, rng_key)` normalises the counts and draws `total` bigrams from
# that multinomial (the same key gives the same table); rows are the first letter, columns the
# letter that follows.

# %%
X = load_letter_bigrams(total=TOTAL, rng_key=0)
print(X)
dense = X.to_dense()
top = np.argsort(dense.ravel())[::-1][:8]
print("most frequent bigrams:", [X.coords["first"][c // 26] + X.coords["second"][c % 26] for c in top])


# %% [markdown]
# ## Evidence of every structure and order
#
# Each estimate is what `method="auto"` runs: here the tempered SMC
# from a mixture of references, whose particle numbers we set. Order 1 has a single allocation, scored
# exactly (stderr 0).

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


tables, start = {}, time.perf_counter()
for a in A_VALUES:
    estimates = {}
    for K in ORDERS:
        estimates[f"NMF({K})"] = estimate(bam.models.nmf(K, a=a), X, rng_key=K)
        estimates[f"sNMF({K})"] = estimate(bam.models.symmetric_nmf(K, a=a), X, rng_key=1000 + K)
    table = bam.compare(estimates, X)
    table["structure"] = [name.split("(")[0] for name in table.index]
    table["K"] = [int(name.split("(")[1][:-1]) for name in table.index]
    table["temperatures"] = [temperatures(estimates[name]) for name in table.index]
    tables[a] = table
    print(f"\na = {a}:")
    print(table[["log_evidence", "stderr", "lower_bound", "delta", "distinguishable", "below_bound",
                 "temperatures"]].round(2).to_string())
print(f"\n{time.perf_counter() - start:.1f} s")
pd.concat(tables, names=["a"]).to_csv(OUTPUT / "letter_bigrams_compare.csv")

# %% [markdown]
# Which structure wins at each order? The verdict compares the two estimates. It is only as good
# as they are: an estimate below its own sure lower bound, or from a single temperature, may be
# far too low, and no sampler gives an upper bound that would make a verdict certain.

# %%
for a, table in tables.items():
    wide = table.pivot(index="K", columns="structure", values="log_evidence")
    temps = table.pivot(index="K", columns="structure", values="temperatures")
    wide["winner"] = np.where(wide["NMF"] > wide["sNMF"], "NMF", "sNMF")
    wide["NMF temperatures"], wide["sNMF temperatures"] = temps["NMF"], temps["sNMF"]
    print(f"a = {a}: NMF ahead at {int((wide['winner'] == 'NMF').sum())} of {len(wide)} orders")
    print(wide.round(2).to_string())

fig, axes = plt.subplots(1, len(A_VALUES) + 1, figsize=(4.5 * (len(A_VALUES) + 1), 3.5))
axes[0].imshow(dense, cmap="Greys")
axes[0].set_xticks(range(26), X.coords["second"], fontsize=6)
axes[0].set_yticks(range(26), X.coords["first"], fontsize=6)
axes[0].set_title(f"{TOTAL} sampled bigrams")
for ax, a in zip(axes[1:], A_VALUES):
    table = tables[a]
    for name, marker in [("NMF", "o-"), ("sNMF", "s-")]:
        rows = table[table["structure"] == name].sort_values("K")
        ax.errorbar(rows["K"], rows["log_evidence"], yerr=2 * rows["stderr"].fillna(0), fmt=marker, label=name)
    ax.set_xlabel("order K")
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.set_title(f"a = {a}")
    ax.legend()
axes[1].set_ylabel("log evidence")
fig.tight_layout()
fig.savefig(OUTPUT / "letter_bigrams_evidence.png")
