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
