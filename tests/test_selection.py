"""Rank selection by speckled held-out likelihood (papers/003 §3)."""

from __future__ import annotations

import functools

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import bam_ppl as bam  # noqa: E402
from bam_ppl.models.dirichlet_tucker import dirichlet_tucker  # noqa: E402
from bam_ppl.selection import (  # noqa: E402
    allocation_heldout_fit,
    plot_rank_selection,
    select_ranks,
    speckled_mask,
)

PLANTED = dict(K_M=3, K_N=2, K_P=2, K_S=3)
FIT = dict(num_iters=250, num_restarts=2)
# Larger ranks than planted fit the training faces almost as well, so the held-out differences
# beyond the planted rank are a few nats: the fits must be close to convergence to resolve them.
CONVERGED_FIT = dict(num_iters=600, num_restarts=2)


@functools.cache
def planted_tensor():
    _, X = dirichlet_tucker(tuple(PLANTED.values()), alpha=0.3).sample(0, shape=(30, 8, 10, 12), total=500)
    return X


def test_speckled_mask_fraction_and_coverage():
    mask = speckled_mask((30, 8), 0.1, rng_key=0)
    assert mask.dtype == bool and mask.shape == (30, 8)
    assert abs(mask.sum() - 24) <= 2
    np.testing.assert_array_equal(mask, speckled_mask((30, 8), 0.1, rng_key=0))
    assert not np.array_equal(mask, speckled_mask((30, 8), 0.1, rng_key=1))
    # Even at a high fraction every row and column keeps a fitted slice.
    dense = speckled_mask((5, 4), 0.9, rng_key=3)
    assert (~dense).any(axis=1).all() and (~dense).any(axis=0).all()
    with pytest.raises(ValueError, match="heldout_fraction"):
        speckled_mask((5, 4), 1.0)
    with pytest.raises(ValueError, match="heldout_fraction"):
        speckled_mask((5, 4), 0.0)


def test_select_ranks_finds_planted_mouse_rank():
    X = planted_tensor()
    fixed = {k: v for k, v in PLANTED.items() if k != "K_M"}
    table = select_ranks(dirichlet_tucker, X, grid={"K_M": [2, 3, 4]}, fixed=fixed, heldout_fraction=0.1,
                         rng_key=0, fit_options=FIT)
    assert list(table.columns[:4]) == ["K_M", "K_N", "K_P", "K_S"]
    assert len(table) == 3 and table["selected"].sum() == 1
    assert table.loc[table["selected"], "K_M"].item() == PLANTED["K_M"]
    assert np.isfinite(table["heldout_loglik"]).all() and (table["heldout_loglik_se"] >= 0).all()
    assert table.attrs["heldout"].shape == (30, 8)
    assert (table["heldout_loglik_se"] > 0).all()
    fig = plot_rank_selection(table)
    assert len(fig.axes) == 1
    assert bam.plot_rank_selection is plot_rank_selection
    # Error bars of ± heldout_loglik_se around every profile point, and the rule's threshold.
    (bars,) = fig.axes[0].containers
    segments = bars.lines[2][0].get_segments()
    np.testing.assert_allclose([seg[1, 1] - seg[0, 1] for seg in segments], 2 * table["heldout_loglik_se"])
    best = table["heldout_loglik"].idxmax()
    threshold = table.loc[best, "heldout_loglik"] - table.loc[best, "heldout_loglik_se"]
    assert any(np.allclose(line.get_ydata(), threshold) for line in fig.axes[0].lines)


def test_one_standard_error_rule_uses_the_best_rows_own_standard_error():
    """Planted K_S = 3: with short fits K_S = 4 scores a few nats higher; within one standard
    error of the best score, the rule must still pick the planted rank (the best row's standard
    error was the zero of its paired difference with itself, and the rule picked K_S = 4)."""
    X = planted_tensor()
    fixed = {k: v for k, v in PLANTED.items() if k != "K_S"}
    # rng_key=9: a split and restarts where the case arises (with most keys K_S = 3 scores best).
    table = select_ranks(dirichlet_tucker, X, grid={"K_S": [2, 3, 4]}, fixed=fixed, rng_key=9,
                         fit_options=FIT).set_index("K_S")
    best = table["heldout_loglik"].idxmax()
    assert best == 4  # the case that degenerated: the larger rank wins by less than its noise
    gap = table.loc[4, "heldout_loglik"] - table.loc[3, "heldout_loglik"]
    assert gap > table.loc[3, "heldout_loglik_diff_se"]  # the paired-difference rule would pick 4
    assert table.loc[best, "heldout_loglik_se"] > gap
    assert np.isnan(table.loc[best, "heldout_loglik_diff_se"])
    assert table.index[table["selected"]].tolist() == [PLANTED["K_S"]]


def test_selection_rule_on_given_per_slice_scores():
    rng = np.random.default_rng(0)
    base = rng.normal(-50.0, 5.0, size=40)  # heterogeneous slices, shared by every model
    scores = {1: base - 3.0 + rng.normal(0, 0.1, 40), 2: base + rng.normal(0, 0.1, 40),
              3: base + 0.05 + rng.normal(0, 0.1, 40)}

    def score(model, data, heldout, rng_key):
        return scores[model]

    table = select_ranks(lambda rank: rank, np.ones((4, 5, 2), int), grid={"rank": [1, 2, 3]}, score=score,
                         heldout_axes=0)
    se = np.sqrt(40) * np.std(np.stack(list(scores.values())), axis=1, ddof=1)
    np.testing.assert_allclose(table["heldout_loglik_se"], se)
    assert table["heldout_loglik"].idxmax() == 2  # rank 3 scores best ...
    assert table["heldout_loglik_se"][2] > 0  # the best row's own standard error (~32 nats)
    # Rank 2 lies within one standard error of the best, rank 1 (120 nats below) does not.
    assert table.loc[table["selected"], "rank"].item() == 2


@functools.cache
def planted_counts():
    """A 40 × 30 Poisson matrix of rank 2 (KL-NMF with Gamma(1, 1) loadings)."""
    rng = np.random.default_rng(1)
    W, H = rng.gamma(1.0, 1.0, (40, 2)), rng.gamma(1.0, 1.0, (2, 30))
    return rng.poisson(3.0 * W @ H)


def test_select_ranks_nmf_holds_out_cells():
    X = planted_counts()
    table = select_ranks(bam.models.nmf, X, grid={"rank": [1, 2, 3]}, heldout_axes=(0, 1), rng_key=0,
                         heldout_fraction=0.2, fit_options=dict(num_iters=300, num_restarts=2))
    assert table.attrs["heldout"].shape == X.shape
    assert np.isfinite(table["heldout_loglik"]).all() and (table["heldout_loglik_se"] > 0).all()
    assert table.loc[table["selected"], "rank"].item() == 2
    assert table["heldout_loglik"].idxmax() == 1
    # The brief's call, with the default grid fit options.
    default = bam.select_ranks(bam.models.nmf, X[:20, :15], grid={"rank": [1, 2]}, heldout_axes=(0, 1))
    assert default["selected"].sum() == 1


def test_allocation_heldout_fit_treats_cells_as_missing():
    X = planted_counts()
    heldout = speckled_mask(X.shape, 0.2, rng_key=3)
    model = bam.models.nmf(2)
    fit = allocation_heldout_fit(model, X, heldout, (0, 1), rng_key=0, num_iters=300, num_restarts=2)
    # Changing the held-out cells changes the score but not the fit: they are missing, not zero.
    changed = X.copy()
    changed[heldout] = 0
    refit = allocation_heldout_fit(model, changed, heldout, (0, 1), rng_key=0, num_iters=300, num_restarts=2)
    np.testing.assert_allclose(refit["theta"], fit["theta"], rtol=1e-8)
    np.testing.assert_allclose(refit["cell_prob"], fit["cell_prob"], rtol=1e-8)
    assert refit["heldout_loglik"] != fit["heldout_loglik"]
    # One score per held-out cell: the Poisson log-likelihood under the fitted rate λ p(i, j).
    assert fit["pointwise"].shape == (heldout.sum(),)
    mean = fit["rate"] * fit["cell_prob"]
    observed = X[heldout]
    from scipy.stats import poisson

    np.testing.assert_allclose(fit["pointwise"], poisson.logpmf(observed, mean), rtol=1e-8)
    # The imputed rate is that of the whole matrix, not of the training cells alone.
    assert abs(mean.sum() - observed.sum()) < 0.2 * observed.sum()
    # A model that held out zeros instead would predict far fewer counts there.
    assert mean.sum() > 2 * (X.sum() - X[~heldout].sum()) / 4


def test_heldout_errors_name_the_remedy():
    X = planted_counts()
    with pytest.raises(ValueError, match="cannot hold out.*method=None.*score="):
        select_ranks(bam.models.nmf, X, grid={"rank": [1]}, heldout_axes=(0, 1), method="smc")
    with pytest.raises(ValueError, match="conditions on no totals"):
        select_ranks(bam.models.lda, X, grid={"topics": [2]})


@pytest.mark.slow
@pytest.mark.parametrize("name, values", [("K_N", [1, 2, 3]), ("K_P", [1, 2, 3]), ("K_S", [2, 3, 4])])
def test_select_ranks_finds_each_planted_rank(name, values):
    X = planted_tensor()
    fixed = {k: v for k, v in PLANTED.items() if k != name}
    table = select_ranks(dirichlet_tucker, X, grid={name: values}, fixed=fixed, rng_key=0,
                         fit_options=CONVERGED_FIT)
    assert table.loc[table["selected"], name].item() == PLANTED[name]


def test_custom_score_and_generic_factory():
    X = np.arange(24).reshape(2, 3, 4) % 5
    calls = []

    def factory(rank, alpha):
        return dict(rank=rank, alpha=alpha)

    def score(model, data, heldout, rng_key):
        calls.append((model["rank"], heldout.shape))
        return -abs(model["rank"] - 2) * float(model["alpha"])

    table = select_ranks(factory, X, grid={"rank": [1, 2, 3]}, score=score, heldout_axes=0, alpha=2.0)
    assert calls == [(1, (2,)), (2, (2,)), (3, (2,))]
    assert table.loc[table["selected"], "rank"].item() == 2
    assert "heldout_loglik_se" not in table
    assert list(table["heldout_loglik"]) == [-2.0, 0.0, -2.0]


def test_select_ranks_bad_arguments():
    X = planted_tensor()
    with pytest.raises(ValueError, match="grid"):
        select_ranks(dirichlet_tucker, X, grid={})
    with pytest.raises(ValueError, match="both grid and fixed"):
        select_ranks(dirichlet_tucker, X, grid={"K_M": [2]}, fixed={"K_M": 3, "K_N": 2, "K_P": 2})
    with pytest.raises(ValueError, match="heldout_fraction"):
        select_ranks(dirichlet_tucker, X, grid={"K_M": [2]}, fixed={"K_N": 2, "K_P": 2, "K_S": 3},
                     heldout_fraction=1.5)
    with pytest.raises(ValueError, match="heldout_axes is required"):
        select_ranks(lambda rank: bam.models.nmf(rank), X[:, :, 0, 0], grid={"rank": [1]})
    with pytest.raises(TypeError, match="score"):
        select_ranks(dirichlet_tucker, X, grid={"K_M": [2]}, fixed={"K_N": 2, "K_P": 2, "K_S": 3}, score=3)
