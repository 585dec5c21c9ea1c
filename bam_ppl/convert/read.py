"""Reading InferenceData back: groups, root attributes and added groups, for both ArviZ
generations (``arviz.InferenceData`` 0.x, ``xarray.DataTree`` for ArviZ ≥ 1)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import xarray as xr

from .build import import_arviz


def group(idata, name: str) -> xr.Dataset:
    """A group of InferenceData (0.x) or DataTree (1.x) as an ``xarray.Dataset``."""
    if isinstance(idata, xr.DataTree):
        return idata[name].to_dataset()
    return getattr(idata, name)


def attrs_of(idata) -> dict:
    """Root attributes for both ArviZ generations."""
    if isinstance(idata, xr.DataTree):
        return dict(idata.attrs)
    return dict(idata.attrs or {})


def with_groups(idata, datasets: Mapping[str, xr.Dataset]):
    """A copy of ``idata`` with groups added or replaced (InferenceData 0.x or DataTree 1.x)."""
    if isinstance(idata, xr.DataTree):
        out = idata.copy()
        for name, ds in datasets.items():
            out[name] = xr.DataTree(ds)
        return out
    az = import_arviz()
    groups = {g: getattr(idata, g) for g in idata.groups() if g not in datasets}
    groups.update(datasets)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not.*supported.*group", category=UserWarning)
        out = az.InferenceData(**groups)
    out.attrs = dict(idata.attrs or {})
    return out
