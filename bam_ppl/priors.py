"""Dirichlet concentrations of the conditional probability tables (Cemgil et al. 2019 §3.2, §3.6).

The default prior is BDeu: every table's concentration is a contraction of one base measure
α(i_1..N) = a / ∏_n I_n (eq. 3.3), so a family's table holds the constant a / ∏_{u ∈ fa(n)} I_u
and α itself is never materialised. Markov-equivalent DAGs then give the same evidence
(Remark 3.2). Explicit symmetric concentrations per node (Chege et al. 2024, Zhang & Linderman) override it.
"""

from __future__ import annotations

import math

import numpy as np


def bdeu_concentration(a: float, family_sizes: tuple[int, ...]) -> float:
    """The BDeu pseudo-count of one cell of a family table: a / ∏ I_u over the family."""
    return float(a) / math.prod(family_sizes)


def table_concentration(
    a: float,
    members: list[tuple[int, ...]],
    explicit: float | None,
) -> np.ndarray:
    """Concentration array of one table, laid out as (*parent sizes, child size).

    ``members`` lists the family sizes (child first) of every node sharing the table. Under BDeu
    a tied table collects the pseudo-counts of all its members (Cemgil et al. 2019 App. E: α(i, r) =
    2a / (I R) for symmetric NMF); an explicit value is the concentration of the shared table.
    """
    child, *parents = members[0]
    shape = (*parents, child)
    if explicit is not None:
        return np.full(shape, float(explicit))
    value = sum(bdeu_concentration(a, fam) for fam in members)
    return np.full(shape, value)


def log_beta(concentration: np.ndarray) -> float:
    """log B(z) summed over the columns of a table (last axis = child)."""
    from scipy.special import gammaln

    z = np.asarray(concentration, dtype=np.float64)
    return float(gammaln(z).sum() - gammaln(z.sum(axis=-1)).sum())
