"""Loaders of the BAM papers' real data sets: shapes, totals, labels, determinism."""

import itertools

import numpy as np
import pytest

from bam_ppl import datasets
from bam_ppl.data import CountTensor
from bam_ppl.datasets import (
    ABALONE_MEASUREMENTS,
    ICEWS_QUAD_CLASSES,
    kmeans_1d,
    load_abalone,
    load_icews,
    load_letter_bigrams,
    load_letter_trigrams,
)


def _have_data() -> bool:
    try:
        datasets.data_home()
    except FileNotFoundError:
        return False
    return True


needs_data = pytest.mark.skipif(not _have_data(), reason="real data sets not found (set BAM_PPL_DATA)")


# -- 1-D k-means ----------------------------------------------------------------------------------

def _sse(x, labels):
    return sum(((x[labels == c] - x[labels == c].mean()) ** 2).sum() for c in np.unique(labels))


@pytest.mark.parametrize("seed", range(4))
def test_kmeans_1d_is_optimal(seed):
    rng = np.random.default_rng(seed)
    x = np.round(rng.gamma(2.0, size=9), 1)
    k = 3
    labels, edges = kmeans_1d(x, k)
    # brute force over every split of the sorted distinct values into k contiguous groups
    uniq = np.unique(x)
    best = min(
        _sse(x, np.searchsorted(uniq[list(cuts)], x, side="right"))
        for cuts in itertools.combinations(range(1, uniq.size), k - 1)
    )
    assert np.isclose(_sse(x, labels), best)
    assert set(labels) == set(range(k))
    means = [x[labels == c].mean() for c in range(k)]
    assert np.all(np.diff(means) > 0)  # clusters numbered in increasing order
    assert edges[0] == x.min() and edges[-1] == x.max() and np.all(np.diff(edges) >= 0)


def test_kmeans_1d_deterministic_and_weighted():
    x = np.array([0.0, 0.1, 0.2, 5.0, 5.1, 9.0, 9.0, 9.2])
    labels, _ = kmeans_1d(x, 3)
    assert labels.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert np.array_equal(kmeans_1d(x, 3)[0], labels)
    # repeating a value is the same as weighting it
    lab_w, _ = kmeans_1d(np.unique(x), 3, weights=[1, 1, 1, 1, 1, 2, 1])
    assert np.array_equal(lab_w[np.searchsorted(np.unique(x), x)], labels)
    assert kmeans_1d(x, 1)[0].tolist() == [0] * 8


def test_kmeans_1d_rejects_bad_input():
    with pytest.raises(ValueError, match="k = 4 exceeds"):
        kmeans_1d([1.0, 1.0, 2.0, 3.0], 4)
    with pytest.raises(ValueError, match="k must be"):
        kmeans_1d([1.0, 2.0], 0)
    with pytest.raises(ValueError, match="finite"):
        kmeans_1d([1.0, np.nan], 1)


# -- Abalone --------------------------------------------------------------------------------------

@needs_data
def test_abalone_shape_total_labels():
    X = load_abalone()
    assert isinstance(X, CountTensor)
    assert X.shape == (5,) * 7 and X.total == 4177
    assert X.dims == ABALONE_MEASUREMENTS
    for n, dim in enumerate(X.dims):
        labels = X.coords[dim]
        assert len(labels) == 5
        lows = [float(label.split("–")[0]) for label in labels]
        assert lows == sorted(lows)  # bins in increasing order of the measurement
        marginal = np.bincount(X.indices[:, n], weights=X.counts, minlength=5)
        assert np.all(marginal > 0)  # no empty bin
    assert X.coords["length"][0].startswith("0.075")  # the smallest length in the file


@needs_data
def test_abalone_bins_and_age_axis():
    X3 = load_abalone(bins=3)
    assert X3.shape == (3,) * 7 and X3.total == 4177
    X = load_abalone()
    X8 = load_abalone(include_age=True)
    assert X8.shape == (5,) * 7 + (29,) and X8.dims[-1] == "rings" and X8.total == 4177
    assert X8.coords["rings"][0] == "1" and X8.coords["rings"][-1] == "29"
    contracted = CountTensor(X8.indices[:, :7], X8.counts, X8.shape[:7])
    assert np.array_equal(contracted.indices, X.indices) and np.array_equal(contracted.counts, X.counts)
    with pytest.raises(ValueError, match="bins"):
        load_abalone(bins=0)


@needs_data
def test_abalone_quantile_binning():
    X = load_abalone(binning="quantile")
    assert X.shape == (5,) * 7 and X.total == 4177
    for n, dim in enumerate(X.dims):
        marginal = np.bincount(X.indices[:, n], weights=X.counts, minlength=5)
        assert marginal.min() >= 0.15 * 4177  # about a fifth each: equal frequencies up to tied values
        lows = [float(label.split("–")[0]) for label in X.coords[dim]]
        assert lows == sorted(lows)
    assert not np.array_equal(X.indices, load_abalone().indices)  # another cut than the k-means one
    with pytest.raises(ValueError, match="binning"):
        load_abalone(binning="uniform")
    with pytest.raises(ValueError, match="distinct quantiles"):
        load_abalone(bins=400, binning="quantile")


@needs_data
def test_abalone_subsample_deterministic():
    A = load_abalone(num_records=300, rng_key=1)
    B = load_abalone(num_records=300, rng_key=1)
    C = load_abalone(num_records=300, rng_key=2)
    assert A.total == 300
    assert np.array_equal(A.indices, B.indices) and np.array_equal(A.counts, B.counts)
    assert not (np.array_equal(A.indices, C.indices) and np.array_equal(A.counts, C.counts))
    assert A.coords == load_abalone().coords  # bins come from all records
    with pytest.raises(ValueError, match="num_records"):
        load_abalone(num_records=5000)


# -- letters --------------------------------------------------------------------------------------

@needs_data
def test_letter_bigrams_draw():
    X = load_letter_bigrams(total=2000, rng_key=0)
    assert X.shape == (26, 26) and X.total == 2000
    assert X.dims == ("first", "second")
    assert X.coords["first"][0] == "a" and X.coords["second"][-1] == "z"
    Y = load_letter_bigrams(total=2000, rng_key=0)
    Z = load_letter_bigrams(total=2000, rng_key=1)
    assert np.array_equal(X.to_dense(), Y.to_dense())
    assert not np.array_equal(X.to_dense(), Z.to_dense())
    dense = X.to_dense()
    assert dense[19, 7] == dense.max()  # "th" is the commonest bigram
    with pytest.raises(ValueError, match="total"):
        load_letter_bigrams(total=0)


@needs_data
def test_letter_raw_counts_and_trigrams():
    raw = load_letter_bigrams(total=None)
    assert raw.counts.dtype == np.int64
    assert 2.7e12 < raw.total < 2.9e12
    tri = load_letter_trigrams(total=500, rng_key=3)
    assert tri.shape == (26, 26, 26) and tri.total == 500 and tri.dims == ("first", "second", "third")
    assert np.array_equal(tri.to_dense(), load_letter_trigrams(total=500, rng_key=3).to_dense())


# -- ICEWS ----------------------------------------------------------------------------------------

@needs_data
@pytest.mark.parametrize("threshold, total", [(0.5, 12314), (0.75, 7850), (0.9, 3519), (0.95, 1773),
                                              (0.99, 375)])
def test_icews_totals(threshold, total):
    X = load_icews(threshold)
    assert X.shape == (20, 20, 4) and X.total == total
    assert X.dims == ("sender", "receiver", "quad_class")
    assert X.coords["quad_class"] == list(ICEWS_QUAD_CLASSES)
    assert len(X.coords["sender"]) == 20 and X.coords["sender"] == X.coords["receiver"]
    assert np.all(X.indices[:, 0] != X.indices[:, 1])  # no country sends events to itself


@needs_data
def test_icews_country_names():
    X = load_icews(0.99)
    assert X.coords["sender"][0] == "United States" and X.coords["sender"][1] == "Russian Federation"
    assert load_icews(0.9).coords["sender"][0] == "country 0"  # no dictionary ships for this set
    with pytest.raises(ValueError, match="threshold"):
        load_icews(0.8)


# -- data directory -------------------------------------------------------------------------------

def test_missing_data_names_the_source(tmp_path, monkeypatch):
    monkeypatch.setenv("BAM_PPL_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="archive.ics.uci.edu"):
        load_abalone()
    with pytest.raises(FileNotFoundError, match="norvig"):
        load_letter_bigrams()
    with pytest.raises(FileNotFoundError, match="icews"):
        load_icews()


def test_data_home_argument(tmp_path):
    folder = tmp_path / "letters"
    folder.mkdir()
    counts = np.zeros((26, 26))
    counts[0, 1] = 5.0
    np.save(folder / "transitions_2L.npy", counts)
    X = load_letter_bigrams(total=10, data_home=tmp_path)
    assert X.to_dense()[0, 1] == 10 and X.total == 10
