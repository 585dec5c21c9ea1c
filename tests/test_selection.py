"""Rank selection by speckled held-out likelihood (papers/003 §3)."""

from __future__ import annotations

import functools

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import bam_ppl as bam  # noqa: E402
from bam_ppl.models.dirichlet_tucker import dirichlet_tucker  # noqa: E402
from bam_ppl.selection import plot_rank_selection, select_ranks, speckled_mask  # noqa: E402

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
    fig = plot_rank_selection(table)
    assert len(fig.axes) == 1


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
