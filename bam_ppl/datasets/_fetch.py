"""Fetch the larger binary matrices on first use, with checksums, into a user cache.

The matrices of Lumbreras, Filstroff & Févotte (2020) are R data files (``.rda``) in the authors'
repository, pinned here to one commit; each download is checked against its SHA-256 by
``pooch`` and converted once into the ``.npz`` layout the loaders read (``X``, ``rows``,
``cols``). The cache is ``$BAM_PPL_CACHE`` or the platform's user cache folder (for example
``~/.cache/bam_ppl`` on Linux).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np

CACHE_ENV = "BAM_PPL_CACHE"
OFFLINE_ENV = "BAM_PPL_OFFLINE"  # set to 1: use the cache only, never download (the tests set it)
NBMF_REPOSITORY = "https://github.com/alumbreras/NBMF"
NBMF_COMMIT = "2860d35fae902cac43faabeb326e46b678e0f000"
# Module-level so that a mirror (or a test's file:// folder) can stand in for the repository.
NBMF_BASE_URL = f"https://raw.githubusercontent.com/alumbreras/NBMF/{NBMF_COMMIT}/data/"
# SHA-256 of the files at NBMF_COMMIT (their conversions equal the reference .npz copies).
NBMF_REGISTRY = {
    "animals.rda": "067c1b72e3c353c48786423e3d1ad6f205b9ca7dc2a9c00585f296b24092c30c",
    "catalanparliament.rda": "94f5154979d42a99e8f8c4fa0ea6bd28653ccaf62e882bb6dde3d337b0f3ddff",
    "catalanparliament_labels.csv": "8e6e4204d3e9ca9dfbd0b2631e42d820f99f89b6f9f35690104192a467a0b409",
    "lastfm.rda": "78afe8472ffe6b95dc9f158245febd17f0eed79115596edb69980371c4af4e48",
    "nips.rda": "f3fb7cf880d101ae0d357db25192ea4e63bbe57ba2a26960630249847469d46d",
    "paleo.rda": "6519d89e7ef58c9e66806a50ebca0e2d5e93b9a52d5c1ad4ebfcf0d0f0b32fdb",
    "unvotes.rda": "eeacf525ea61116a6467fe4f955974fc0348687a1040ea0a7a467bef289c2dbc",
}


def cache_dir() -> Path:
    """Folder the fetched data sets are cached in: ``$BAM_PPL_CACHE`` or the user cache."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    import pooch

    return Path(pooch.os_cache("bam_ppl"))


def _download(url: str, output_file, pooch_obj, check_only: bool = False):
    """pooch downloader: plain copies for ``file://`` addresses (mirrors on a shared disk)."""
    import pooch

    if urlparse(url).scheme != "file":
        return pooch.HTTPDownloader(progressbar=False)(url, output_file, pooch_obj, check_only=check_only)
    source = Path(url2pathname(urlparse(url).path))
    if check_only:
        return source.is_file()
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist")
    if hasattr(output_file, "write"):
        output_file.write(source.read_bytes())
    else:
        shutil.copyfile(source, output_file)
    return None


def rda_to_npz(rda_path: str | os.PathLike, npz_path: str | os.PathLike) -> None:
    """Write the one matrix of an R data file as ``.npz`` with ``X`` (float64), ``rows``, ``cols``.

    Row and column names come from the matrix's dimnames (empty arrays when it has none); R's
    ``NA`` becomes NaN.
    """
    try:
        import rdata
    except ImportError as err:  # a core dependency; only a broken install lacks it
        raise ImportError("reading the R data files needs the 'rdata' package (pip install rdata)") from err
    objects = rdata.read_rda(str(rda_path), default_encoding="utf-8")
    if len(objects) != 1:
        raise ValueError(f"{rda_path} holds {len(objects)} objects, expected one matrix")
    matrix = next(iter(objects.values()))
    X = np.asarray(getattr(matrix, "values", matrix), dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"{rda_path} holds an array of shape {X.shape}, expected a matrix")
    names = []
    for dim in getattr(matrix, "dims", ())[:2] or (None, None):
        coords = getattr(matrix, "coords", {})
        names.append(np.asarray(coords[dim].values).astype(str) if dim in coords else np.array([], dtype=str))
    tmp = Path(npz_path).with_suffix(".tmp.npz")
    np.savez_compressed(tmp, X=X, rows=names[0], cols=names[1])
    os.replace(tmp, npz_path)


def _convert_once(fname: str, action: str, pooch_obj) -> str:
    """pooch processor: the ``.npz`` next to a fetched ``.rda``, converted after each download."""
    npz = Path(fname).with_suffix(".npz")
    if action in ("download", "update") or not npz.is_file():
        rda_to_npz(fname, npz)
    return str(npz)


def fetch_nbmf(filename: str, missing: FileNotFoundError) -> Path:
    """Path of ``filename`` of the NBMF repository in the cache (an ``.rda`` comes back as the
    converted ``.npz``), downloaded and checked first if needed; ``missing`` is raised (with
    the cause) when the download fails, e.g. offline."""
    import pooch

    if filename not in NBMF_REGISTRY:
        raise ValueError(f"no registered file {filename!r}; known: {sorted(NBMF_REGISTRY)}")
    url = NBMF_BASE_URL + filename
    if os.environ.get(OFFLINE_ENV, "") not in ("", "0"):
        cached = cache_dir() / "nbmf" / filename
        cached = cached.with_suffix(".npz") if filename.endswith(".rda") else cached
        if cached.is_file():
            return cached
        raise FileNotFoundError(f"{cached} is not cached and ${OFFLINE_ENV} forbids fetching {url}. {missing}")
    try:
        path = pooch.retrieve(url, known_hash=f"sha256:{NBMF_REGISTRY[filename]}", fname=filename,
                              path=cache_dir() / "nbmf", downloader=_download, progressbar=False,
                              processor=_convert_once if filename.endswith(".rda") else None)
    except OSError as err:  # offline, unreachable or a missing mirror file (requests' errors are OSErrors)
        raise FileNotFoundError(f"could not fetch {url} ({type(err).__name__}: {err}). {missing}") from err
    return Path(path)
