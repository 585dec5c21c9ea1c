"""Where a data file is read from: the user's folder, the package, or the download cache.

The order is fixed: the ``data_home`` argument, else ``$BAM_PPL_DATA``, else the copy bundled
with the package (small sets) or the user cache that :mod:`._fetch` fills on first use (larger
sets). A folder the user names is authoritative: a file missing there is an error, not a silent
fall-back to another copy. Nothing is looked up relative to the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "BAM_PPL_DATA"
BUNDLED = Path(__file__).resolve().parent / "_files"


@dataclass(frozen=True)
class DataFile:
    """One file of a data set: where it sits in a data folder, where it comes from, its format."""

    relative: str  # path inside a data folder, e.g. "abalone/abalone.data"
    source: str  # where to get it (URL and citation)
    format: str  # what the file holds, for the error message

    def missing(self, path: Path | str, why: str = "not found") -> FileNotFoundError:
        return FileNotFoundError(
            f"{path}: {why}. Source: {self.source}; format: {self.format}. Put the file at "
            f"<folder>/{self.relative} and pass data_home=<folder> or set {ENV_VAR}=<folder> "
            "(see bam_ppl/datasets/DATA.md)."
        )


def user_folder(data_home: str | os.PathLike | None = None) -> Path | None:
    """The folder the user named (the argument, else ``$BAM_PPL_DATA``), or None."""
    if data_home is not None:
        if not isinstance(data_home, (str, os.PathLike)):
            raise TypeError(f"data_home must be a path or None, got {type(data_home).__name__}")
        folder, origin = Path(data_home), "data_home"
    elif os.environ.get(ENV_VAR):
        folder, origin = Path(os.environ[ENV_VAR]), f"${ENV_VAR}"
    else:
        return None
    if not folder.is_dir():
        raise FileNotFoundError(f"{origin} = {str(folder)!r} is not a folder")
    return folder.resolve()


def data_home(data_home: str | os.PathLike | None = None) -> Path:
    """The data folder the user named: the ``data_home`` argument, else ``$BAM_PPL_DATA``.

    Raises ``FileNotFoundError`` when neither is set (then the loaders read the copies bundled
    with the package or fetch into the user cache, see :func:`bam_ppl.datasets.cache_dir`) or
    when the named folder does not exist. The working directory is never searched.
    """
    folder = user_folder(data_home)
    if folder is None:
        raise FileNotFoundError(
            f"no data folder named: pass data_home= or set {ENV_VAR} (the loaders need none: small "
            "sets ship with the package and larger ones are fetched into the user cache)"
        )
    return folder


def locate(spec: DataFile, data_home=None, *, bundled: str | None = None,
           fetch: Callable[[], Path] | None = None) -> Path:
    """Path of ``spec``: in the user's folder if one is named, else bundled, else fetched."""
    folder = user_folder(data_home)
    if folder is not None:
        path = folder / spec.relative
        if not path.is_file():
            raise spec.missing(path)
        return path
    if bundled is not None:
        path = BUNDLED / bundled
        if not path.is_file():  # an installation that lost its package data
            raise spec.missing(path, "the copy bundled with bam_ppl is missing (reinstall bam_ppl)")
        return path
    if fetch is None:
        raise spec.missing(spec.relative, "not bundled with bam_ppl")
    return fetch()
