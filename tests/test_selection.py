"""Rank selection by speckled held-out likelihood (papers/003 §3)."""

from __future__ import annotations

import functools

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import bam_ppl as bam  # noqa: E402
from bam_ppl.models.dirichlet_tucker import dirichlet_tucker  # noqa: E402
from bam_ppl.selection import (  # noqa: E402
    allocation_heldout_fit,
    plot_rank_selection,
    select_ranks,
    speckled_folds,
    speckled_mask,
)

PLANTED = dict(K_M=3, K_N=2, K_P=2, K_S=3)
FIT = dict(num_iters=250, num_chains=2)
# Larger ranks than planted fit the training faces almost as well, so the held-out differences
# beyond the planted rank are a few nats: the fits must be close to convergence to resolve them.
CONVERGED_FIT = dict(num_iters=600, num_chains=2)


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


def test_speckled_folds_split_every_slice_once():
    folds = speckled_folds((30, 8), 3, rng_key=0)
    assert folds.shape == (30, 8) and set(np.unique(folds)) == {0, 1, 2}
    assert np.bincount(folds.ravel()).tolist() == [80, 80, 80]
    for f in range(3):  # holding out any fold leaves every mouse and every epoch a fitted face
        assert (folds != f).any(axis=1).all() and (folds != f).any(axis=0).all()
    np.testing.assert_array_equal(folds, speckled_folds((30, 8), 3, rng_key=0))
    # Small shapes where dealing alone would leave a row inside one fold are repaired.
    for key in range(20):
        small = speckled_folds((6, 2), 3, rng_key=key)
        assert (small[:, :1] != small[:, 1:]).all() and np.bincount(small.ravel()).tolist() == [4, 4, 4]
    assert set(speckled_folds((5,), 5, rng_key=0)) == set(range(5))
    with pytest.raises(ValueError, match="folds"):
        speckled_folds((3, 2), 7)
    with pytest.raises(ValueError, match="folds"):
        speckled_folds((3, 2), 1)


def test_speckled_mask_of_one_axis_holds_out_slices():
    assert speckled_mask((10,), 0.3, rng_key=0).sum() == 3


def test_select_ranks_table_counts_parameters_and_plots_the_rule():
    """The table of a Dirichlet-Tucker sweep (a small tensor, short fits: its layout, not its choice,
    which ``test_select_ranks_finds_planted_mouse_rank`` checks)."""
    _, X = dirichlet_tucker((2, 2, 2, 2), alpha=0.3).sample(0, shape=(10, 4, 5, 6), total=200)
    table = select_ranks(dirichlet_tucker, X, grid={"K_M": [1, 2]}, fixed={"K_N": 2, "K_P": 2, "K_S": 2},
                         heldout_fraction=0.1, rng_key=0, num_iters=30, num_chains=1)
    assert list(table.columns[:4]) == ["K_M", "K_N", "K_P", "K_S"]
    assert len(table) == 2 and table["selected"].sum() == 1
    assert np.isfinite(table["heldout_loglik"]).all() and (table["heldout_loglik_se"] > 0).all()
    assert table.attrs["heldout"].shape == (10, 4) and table.attrs["heldout"].sum() == 4
    # The paper's free parameters: M(K_M - 1) + N(K_N - 1) + K_P(P - 1) + K_S(S - 1) + K_M K_N (K_P K_S - 1).
    expected = [10 * (k - 1) + 4 * 1 + 2 * 4 + 2 * 5 + k * 2 * (2 * 2 - 1) for k in (1, 2)]
    assert table["num_parameters"].tolist() == expected
    fig = plot_rank_selection(table)
    assert len(fig.axes) == 1
    assert bam.plot_rank_selection is plot_rank_selection
    # Error bars of ± heldout_loglik_diff_se around every profile point (none on the best), and the best score.
    (bars,) = fig.axes[0].containers
    segments = bars.lines[2][0].get_segments()
    np.testing.assert_allclose([seg[1, 1] - seg[0, 1] for seg in segments],
                               2 * table["heldout_loglik_diff_se"].fillna(0.0))
    best = table["heldout_loglik"].max()
    assert any(np.allclose(line.get_ydata(), best) for line in fig.axes[0].lines)


@pytest.mark.slow
@pytest.mark.stats
def test_select_ranks_finds_planted_mouse_rank():
    X = planted_tensor()
    fixed = {k: v for k, v in PLANTED.items() if k != "K_M"}
    table = select_ranks(dirichlet_tucker, X, grid={"K_M": [2, 3, 4]}, fixed=fixed, heldout_fraction=0.1,
                         rng_key=0, **FIT)
    assert table.loc[table["selected"], "K_M"].item() == PLANTED["K_M"]
    assert table.attrs["heldout"].shape == (30, 8) and abs(table.attrs["heldout"].sum() - 24) <= 2


@pytest.mark.slow
@pytest.mark.stats
def test_select_ranks_recovers_planted_ranks_over_seeds():
    """The default protocol (five speckled folds, SQUAREM-accelerated fits, the paired
    one-standard-error rule stepping back to nested models) on a smaller version of
    benchmarks/dtucker_ranks.py: tensors (20, 6, 10, 12), C = 500, drawn from
    dirichlet_tucker((3, 2, 2, 3), alpha=1.1) with the first three seeds, K_S swept. A draw can
    plant two nearly equal components, which no held-out score resolves, so 2 of 3 are required."""
    recovered = []
    for seed in (0, 1, 2):
        _, X = dirichlet_tucker((3, 2, 2, 3), alpha=1.1).sample(seed, shape=(20, 6, 10, 12), total=500)
        # One EM start per fit (the default takes the better of two) keeps the test short.
        table = select_ranks(dirichlet_tucker, X, grid={"K_S": [2, 3, 4]}, fixed={"K_M": 3, "K_N": 2, "K_P": 2},
                             rng_key=seed, num_chains=1)
        assert sorted(np.unique(table.attrs["folds"])) == list(range(5))  # every face held out once
        recovered.append(table.loc[table["selected"], "K_S"].item() == 3)
    assert sum(recovered) >= 2, recovered


def _given_scores(scores, grid_values, **options):
    """select_ranks on fixed per-slice scores, one array per grid value: the rule alone, no fit."""

    def score(rank, data, heldout, rng_key):
        return scores[rank]

    return select_ranks(lambda rank: rank, np.ones((40, 2), int), grid={"rank": grid_values}, score=score,
                        heldout_axes=0, heldout_fraction=0.25, **options)


def test_one_standard_error_rule_compares_models_slice_by_slice():
    """Slices differ by tens of nats from one another, models by a few on every slice. The rule
    must judge a difference by the spread of its per-slice differences, not by the spread of
    the slices: a model worse on every slice is rejected however heterogeneous the slices are,
    and one whose deficit is within its paired standard error is kept because it is smaller."""
    slices = np.linspace(-80.0, -20.0, 40)  # heterogeneous slices shared by every model
    wiggle = np.tile([1.0, -1.0], 20)  # zero-mean per-slice disagreement, sd ~1
    scores = {
        1: slices - 0.5,  # worse by 0.5 on every slice: total -20, paired se 0
        2: slices + 0.04 * wiggle - 0.01,  # total -0.4, paired se sqrt(40) * 0.04
        3: slices,  # the best
        4: slices + wiggle - 0.05,  # total -2, paired se sqrt(40) * 1.0
    }
    table = _given_scores(scores, [1, 2, 3, 4]).set_index("rank")
    assert table["heldout_loglik"].idxmax() == 3
    np.testing.assert_allclose(table["heldout_loglik"], [s.sum() for s in scores.values()])
    own = np.sqrt(40) * np.std(slices, ddof=1)
    np.testing.assert_allclose(table["heldout_loglik_se"], [own, own, own, own], rtol=1e-3)
    np.testing.assert_allclose(table.loc[[1, 2, 4], "heldout_loglik_diff_se"],
                               np.sqrt(40) * np.array([0.0, np.std(0.04 * wiggle, ddof=1), np.std(wiggle, ddof=1)]))
    assert np.isnan(table.loc[3, "heldout_loglik_diff_se"])
    # Rank 1 is 20 nats below the best, far inside the slices' own spread (~110 nats) but below
    # on every slice; rank 2 is 0.4 below with a paired se of 0.25: both rejected, rank 3 kept.
    assert table.index[table["selected"]].tolist() == [3]
    # Where rank 2's deficit is within its paired se, the smaller rank 2 is selected.
    scores[2] = slices + 0.04 * wiggle - 0.005  # total -0.2, paired se 0.25
    table = _given_scores(scores, [1, 2, 3, 4]).set_index("rank")
    assert table.index[table["selected"]].tolist() == [2]


def test_one_standard_error_rule_steps_back_to_nested_models_with_fewer_parameters():
    """Between models nested below the best (no swept size larger) and within one paired se of
    it, the one with fewer free parameters wins, whatever the sum of the swept sizes (grid order
    breaks remaining ties). A model larger than the best in some size is never selected, however
    few its parameters: the best already predicts better than it."""
    slices = np.linspace(-60.0, -30.0, 40)
    wiggle = np.tile([1.0, -1.0], 20)
    scores = {(3, 4): slices, (2, 4): slices + wiggle - 0.02, (3, 3): slices + wiggle - 0.02,
              (4, 2): slices + wiggle - 0.02, (2, 2): slices - 1.0}
    from bam_ppl import selection

    def select(complexity):
        table = pd.DataFrame([dict(K_M=m, K_S=s, heldout_loglik=scores[m, s].sum()) for m, s in scores])
        selection._mark_selection(table, list(scores.values()), ["K_M", "K_S"], complexity=complexity)
        return table.loc[table["selected"], ["K_M", "K_S"]].values.tolist()

    # (4, 2) has the fewest parameters of those within one se but is not nested below (3, 4);
    # (2, 2) is nested but 40 nats worse on every slice.
    assert select([172, 128, 149, 100, 90]) == [[2, 4]]
    assert select([172, 150, 149, 100, 90]) == [[3, 3]]
    # Without parameter counts: the least sum of sizes, (2, 4) and (3, 3) tie at 6; grid order.
    assert select(None) == [[2, 4]]


@functools.cache
def planted_counts():
    """A 40 × 30 Poisson matrix of rank 2 (KL-NMF with Gamma(1, 1) loadings)."""
    rng = np.random.default_rng(1)
    W, H = rng.gamma(1.0, 1.0, (40, 2)), rng.gamma(1.0, 1.0, (2, 30))
    return rng.poisson(3.0 * W @ H)


@pytest.mark.slow
@pytest.mark.stats
def test_select_ranks_nmf_holds_out_cells():
    X = planted_counts()
    table = select_ranks(bam.models.nmf, X, grid={"rank": [1, 2, 3]}, heldout_axes=(0, 1), rng_key=0,
                         heldout_fraction=0.2, num_iters=300, num_chains=2)
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
    fit = allocation_heldout_fit(model, X, heldout, (0, 1), rng_key=0, num_iters=300, num_chains=2)
    # Changing the held-out cells changes the score but not the fit: they are missing, not zero.
    changed = X.copy()
    changed[heldout] = 0
    refit = allocation_heldout_fit(model, changed, heldout, (0, 1), rng_key=0, num_iters=300, num_chains=2)
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
                         **CONVERGED_FIT)
    assert table.loc[table["selected"], name].item() == PLANTED[name]


def test_custom_score_and_generic_factory():
    X = np.arange(24).reshape(2, 3, 4) % 5
    calls = []

    def factory(rank, alpha):
        return dict(rank=rank, alpha=alpha)

    def score(model, data, heldout, rng_key):
        calls.append((model["rank"], heldout.shape))
        return -abs(model["rank"] - 2) * float(model["alpha"])

    table = select_ranks(factory, X, grid={"rank": [1, 2, 3]}, score=score, heldout_axes=0, alpha=2.0, folds=2)
    assert calls == [(1, (2,)), (1, (2,)), (2, (2,)), (2, (2,)), (3, (2,)), (3, (2,))]  # a fit per fold
    assert table.loc[table["selected"], "rank"].item() == 2
    assert "heldout_loglik_se" not in table and "num_parameters" not in table
    assert list(table["heldout_loglik"]) == [-4.0, 0.0, -4.0]  # summed over the folds
    assert sorted(table.attrs["folds"]) == [0, 1] and table.attrs["heldout"].all()


def test_select_ranks_bad_arguments():
    X = planted_tensor()
    with pytest.raises(ValueError, match="grid"):
        select_ranks(dirichlet_tucker, X, grid={})
    with pytest.raises(ValueError, match="both grid and fixed"):
        select_ranks(dirichlet_tucker, X, grid={"K_M": [2]}, fixed={"K_M": 3, "K_N": 2, "K_P": 2})
    with pytest.raises(ValueError, match="heldout_fraction"):
        select_ranks(dirichlet_tucker, X, grid={"K_M": [2]}, fixed={"K_N": 2, "K_P": 2, "K_S": 3},
                     heldout_fraction=1.5)
    with pytest.raises(ValueError, match="folds"):
        select_ranks(dirichlet_tucker, X, grid={"K_M": [2]}, fixed={"K_N": 2, "K_P": 2, "K_S": 3}, folds=0)
    with pytest.raises(ValueError, match="folds"):
        select_ranks(dirichlet_tucker, X, grid={"K_M": [2]}, fixed={"K_N": 2, "K_P": 2, "K_S": 3}, folds=2.5)
    with pytest.raises(ValueError, match="heldout_fraction.*folds"):
        select_ranks(dirichlet_tucker, X, grid={"K_M": [2]}, fixed={"K_N": 2, "K_P": 2, "K_S": 3}, folds=5,
                     heldout_fraction=0.2)
    with pytest.raises(ValueError, match="folds must be at most"):
        select_ranks(dirichlet_tucker, X[:2, :1], grid={"K_M": [2]}, fixed={"K_N": 1, "K_P": 2, "K_S": 3})
    with pytest.raises(ValueError, match="heldout_axes is required"):
        select_ranks(lambda rank: bam.models.nmf(rank), X[:, :, 0, 0], grid={"rank": [1]})
    with pytest.raises(TypeError, match="score"):
        select_ranks(dirichlet_tucker, X, grid={"K_M": [2]}, fixed={"K_N": 2, "K_P": 2, "K_S": 3}, score=3)
