"""The one builder of ArviZ InferenceData from backend results (DESIGN §5).

Backends hand over plain arrays; this module names them, attaches dims and coords, and builds the
ArviZ object for the installed ArviZ: ``arviz.InferenceData`` for 0.x (Python 3.11) and
``xarray.DataTree`` for ArviZ ≥ 1 (Python ≥ 3.12). Nothing else in bam_ppl imports ArviZ's
constructors.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import xarray as xr

from .._version import __version__

SAMPLE_GROUPS = ("posterior", "sample_stats", "prior", "posterior_predictive", "log_likelihood")
DENSE_OBSERVED_LIMIT = 10_000_000
FLOAT64_GROUPS = ("posterior", "posterior_predictive", "log_likelihood")


def import_arviz():
    """Import ArviZ, silencing only its 0.23 'undergoing a major refactor' FutureWarning.

    ArviZ 0.23 writes a daily stamp file on import by renaming a temporary file of a fixed name; two processes
    that import it at once on a new day race for that rename and one fails with FileNotFoundError. The stamp
    exists by then, so a second import succeeds."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"\s*ArviZ is undergoing a major refactor", category=FutureWarning
        )
        try:
            import arviz as az
        except FileNotFoundError:
            import arviz as az
    return az


def _arviz_major() -> int:
    return int(import_arviz().__version__.split(".")[0])


def _dataset(variables: Mapping, coords: Mapping, group: str) -> xr.Dataset:
    data_vars = {}
    for name, spec in variables.items():
        dims, values = spec
        values = np.asarray(values)
        if group in FLOAT64_GROUPS and np.issubdtype(values.dtype, np.floating):
            values = values.astype(np.float64)  # one precision for every backend's draws
        dims = tuple(dims)
        if len(dims) != values.ndim:
            raise ValueError(f"{group}.{name}: {values.ndim}-d array with dims {dims}")
        data_vars[name] = (dims, values)
    ds = xr.Dataset(data_vars)
    used = {d: ds.sizes[d] for d in ds.dims}
    ds = ds.assign_coords({d: np.asarray(c) for d, c in coords.items() if d in used and len(c) == used[d]})
    missing = {d: np.arange(n) for d, n in used.items() if d not in ds.coords}
    return ds.assign_coords(missing)


def to_inference_data(groups: Mapping[str, Mapping], coords: Mapping | None = None,
                      attrs: Mapping | None = None):
    """Build InferenceData from ``{group: {name: (dims, array)}}``.

    Sample groups must lead with ``("chain", "draw")`` except variables that carry their own
    dims (a per-chain statistic has dims ``("chain",)``, a trace ``("chain", "iteration")``).
    """
    coords = dict(coords or {})
    attrs = {
        "inference_library": "bam_ppl",
        "inference_library_version": __version__,
        **{k: _attr(v) for k, v in (attrs or {}).items()},
    }
    datasets = {g: _dataset(v, coords, g) for g, v in groups.items() if v}
    for ds in datasets.values():
        ds.attrs.update(attrs)
    az = import_arviz()
    if _arviz_major() >= 1:
        tree = xr.DataTree.from_dict({"/": xr.Dataset(attrs=attrs), **datasets})
        return tree
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not.*supported.*group", category=UserWarning)
        idata = az.InferenceData(**datasets)
    idata.attrs = attrs if hasattr(idata, "attrs") else None
    return idata


def _attr(value):
    """Attribute values must be netCDF-serialisable scalars or strings."""
    if value is None:
        return "None"
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, float, str, np.integer, np.floating)):
        return value
    return str(value)


def observed_variables(data, names) -> tuple[dict, dict]:
    """``observed_data`` variables and coords of a CountTensor whose axes are ``names``."""
    coords = {}
    if data.dims:
        for name, dim in zip(names, data.dims):
            if dim in data.coords:
                coords[name] = data.coords[dim]
    if not data.has_missing and np.prod(data.shape, dtype=float) <= DENSE_OBSERVED_LIMIT:
        return {"X": (tuple(names), data.to_dense())}, coords
    return {
        "X_indices": (("cell", "axis"), data.indices),
        "X_counts": (("cell",), data.counts),
    }, {**coords, "axis": list(names)}


def allocation_inference_data(bound, data, *, theta: Mapping, total_rate=None, method: str,
                              sample_stats: Mapping | None = None, extra_groups: Mapping | None = None,
                              attrs: Mapping | None = None, log_likelihood: bool = True):
    """InferenceData for an allocation model.

    ``theta`` maps table names to draws of shape ``(chain, draw, *parents, child)``; they become
    ``theta_<table>`` with dims named after the nodes. ``total_rate`` has shape ``(chain, draw)``.
    ``sample_stats`` maps names to ``(dims, array)``.

    With ``log_likelihood`` (default) and draws of every table, the ``log_likelihood`` group holds
    the pointwise log-likelihood ``X`` of every draw, so ``az.loo``, ``az.waic`` and
    ``az.compare`` work: Poisson per cell (rate λ·p(cell)) when λ is sampled, the multinomial split
    over cells under ``condition_on`` (or when no λ is given); all cells up to
    :data:`bam_ppl.pointwise.DENSE_CELL_LIMIT`, else the nonzero cells plus one aggregated
    zero-cell entry. See :mod:`bam_ppl.pointwise` for the exact definitions and limits; when a
    fit exceeds them the group is left out and ``attrs["log_likelihood"]`` says why.
    """
    posterior = {}
    for table in bound.tables:
        if table.name in theta:
            posterior[f"theta_{table.name}"] = (("chain", "draw", *table.dims), theta[table.name])
    if total_rate is not None:
        posterior["total_rate"] = (("chain", "draw"), total_rate)
    observed, coords = observed_variables(data, bound.visible)
    for n in bound.latent:
        coords.setdefault(n, np.arange(bound.sizes[n]))
    groups = {"posterior": posterior, "sample_stats": dict(sample_stats or {}), "observed_data": observed}
    if log_likelihood:
        from ..pointwise import try_allocation_log_likelihood

        ll, reason = try_allocation_log_likelihood(bound, data, theta, total_rate)
        if ll is not None:
            groups["log_likelihood"] = ll
        else:
            attrs = {**(attrs or {}), "log_likelihood": reason}
    groups.update(extra_groups or {})
    model = bound.model
    base_attrs = {
        "method": method,
        "structure": str(model.dag),
        "latent": str(model.latent),
        "observed": ",".join(bound.visible),
        "a": bound.a,
        "b": bound.b,
        "total_tokens": bound.total,
    }
    if model.priors:
        base_attrs["priors"] = str(model.priors)
    if model.tie:
        base_attrs["tie"] = str([list(g) for g in model.tie])
    if model.condition_on:
        base_attrs["condition_on"] = ",".join(model.condition_on)
    base_attrs.update(attrs or {})
    return to_inference_data(groups, coords=coords, attrs=base_attrs)
