"""Count data: dense or sparse tensors of nonnegative integers, and samples with missing entries.

Every backend reads data through :class:`CountTensor`, a COO representation (unique cells and
their counts), so costs scale with the number of nonzero cells or tokens, never with the dense
size. A cell index of ``-1`` on an axis means that coordinate is missing for those tokens
(categorical samples with missing values, Chege et al. 2024).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

MISSING = -1


def _as_int_array(values, name: str) -> np.ndarray:
    """Validate that ``values`` holds nonnegative integers (any numeric dtype) and return int64."""
    try:
        arr = np.asarray(values)
    except Exception as err:  # ragged lists and the like
        raise TypeError(f"{name} must be array-like of numbers: {err}") from None
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)
    ):
        raise TypeError(f"{name} must hold numbers (nonnegative integer counts), got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise TypeError(f"{name} must hold real nonnegative integer counts, got complex values")
    if np.issubdtype(arr.dtype, np.floating):
        if np.isnan(arr).any():
            raise ValueError(f"{name} contains NaN; counts must be nonnegative integers")
        if np.isinf(arr).any():
            raise ValueError(f"{name} contains inf; counts must be finite nonnegative integers")
        if (arr != np.round(arr)).any():
            raise ValueError(f"{name} contains non-integer values; counts must be nonnegative integers")
    if (arr < 0).any():
        raise ValueError(f"{name} contains negative values; counts must be nonnegative integers")
    return arr.astype(np.int64)


class CountTensor:
    """A count tensor stored as unique cells and their counts (COO).

    Parameters
    ----------
    indices : array of int, shape (nnz, ndim)
        Cell coordinates; ``-1`` marks a missing coordinate (that token's value on that axis is
        unobserved). Duplicate rows are merged.
    counts : array of int, shape (nnz,)
        Positive counts of each cell (zeros are dropped).
    shape : tuple of int
        Sizes of the axes.
    dims : sequence of str, optional
        Axis names (used as xarray dims in InferenceData).
    coords : dict, optional
        Labels per named axis.

    Use the constructors :meth:`from_dense`, :meth:`from_tokens`, :meth:`from_dataframe`,
    :meth:`from_sparse` and :meth:`from_samples` rather than this initialiser.
    """

    def __init__(self, indices, counts, shape, dims=None, coords=None):
        shape = tuple(int(s) for s in shape)
        if not shape:
            raise ValueError("shape must have at least one axis")
        if any(s < 1 for s in shape):
            raise ValueError(f"shape must have positive sizes, got {shape}")
        indices = self._indices(indices, shape)
        counts = _as_int_array(counts, "counts").reshape(-1)
        if counts.shape[0] != indices.shape[0]:
            raise ValueError(
                f"counts has {counts.shape[0]} entries but indices has {indices.shape[0]} rows"
            )
        keep = counts > 0
        indices, counts = indices[keep], counts[keep]
        if indices.shape[0]:
            uniq, inverse = np.unique(indices, axis=0, return_inverse=True)
            summed = np.zeros(uniq.shape[0], dtype=np.int64)
            np.add.at(summed, inverse.reshape(-1), counts)
            indices, counts = uniq, summed
        self.indices = indices
        self.counts = counts
        self.shape = shape
        self.dims = self._check_dims(dims, len(shape))
        self.coords = self._check_coords(coords, self.dims, shape)

    @staticmethod
    def _indices(indices, shape) -> np.ndarray:
        arr = np.asarray(indices)
        if arr.size == 0:
            return np.zeros((0, len(shape)), dtype=np.int64)
        if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
            raise TypeError(f"indices must be integers, got dtype {arr.dtype}")
        if np.issubdtype(arr.dtype, np.floating):
            if np.isnan(arr).any() or (arr != np.round(arr)).any():
                raise ValueError("indices must be integers (use -1 for a missing coordinate)")
        arr = arr.astype(np.int64)
        if arr.ndim != 2 or arr.shape[1] != len(shape):
            raise ValueError(
                f"indices must have shape (n, {len(shape)}) for a {len(shape)}-way tensor, got {arr.shape}"
            )
        sizes = np.asarray(shape)
        bad = (arr < MISSING) | (arr >= sizes)
        if bad.any():
            row, axis = np.argwhere(bad)[0]
            raise ValueError(
                f"index {arr[row, axis]} on axis {axis} is out of range [0, {shape[axis]}) "
                "(-1 marks a missing entry)"
            )
        return arr

    @staticmethod
    def _check_dims(dims, ndim):
        if dims is None:
            return None
        dims = tuple(str(d) for d in dims)
        if len(dims) != ndim:
            raise ValueError(f"dims has {len(dims)} names but the tensor has {ndim} axes")
        if len(set(dims)) != ndim:
            raise ValueError(f"dims must be distinct, got {dims}")
        return dims

    @staticmethod
    def _check_coords(coords, dims, shape):
        if not coords:
            return {}
        if dims is None:
            raise ValueError("coords need dims (axis names) to attach to")
        out = {}
        for name, labels in coords.items():
            if name not in dims:
                raise ValueError(f"coords given for {name!r}, which is not one of dims {dims}")
            labels = list(labels)
            size = shape[dims.index(name)]
            if len(labels) != size:
                raise ValueError(f"coords[{name!r}] has {len(labels)} labels for an axis of size {size}")
            out[name] = labels
        return out

    # -- constructors --------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, array, dims=None, coords=None) -> CountTensor:
        """From a dense array of nonnegative integers (any numeric dtype holding whole numbers)."""
        arr = _as_int_array(array, "X")
        if arr.ndim == 0:
            raise ValueError("X must have at least one axis, got a scalar")
        if arr.size == 0:
            raise ValueError(f"X is empty (shape {arr.shape}); expected a tensor of counts")
        idx = np.argwhere(arr > 0)
        return cls(idx, arr[tuple(idx.T)], arr.shape, dims=dims, coords=coords)

    @classmethod
    def from_tokens(cls, tokens, shape, dims=None, coords=None) -> CountTensor:
        """From a ``(T, ndim)`` array of token coordinates (one row per token)."""
        tok = np.asarray(tokens)
        if tok.ndim == 1 and len(shape) == 1:
            tok = tok[:, None]
        return cls(tok, np.ones(len(tok), dtype=np.int64), shape, dims=dims, coords=coords)

    @classmethod
    def from_dataframe(cls, df, dims, count: str | None = "Freq") -> CountTensor:
        """From a long table: one column per axis and a count column.

        Category labels become coords: for a pandas Categorical column its categories (in order),
        otherwise the sorted unique values. With ``count=None`` each row is one token.
        """
        import pandas as pd

        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
        dims = [dims] if isinstance(dims, str) else list(dims)
        missing = [d for d in dims + ([count] if count else []) if d not in df.columns]
        if missing:
            raise ValueError(f"df has no column(s) {missing}; columns are {list(df.columns)}")
        idx, shape, coords = [], [], {}
        for d in dims:
            col = df[d]
            cat = col.astype("category") if not isinstance(col.dtype, pd.CategoricalDtype) else col
            labels = list(cat.cat.categories)
            codes = cat.cat.codes.to_numpy()
            if (codes < 0).any():
                raise ValueError(f"column {d!r} has missing labels; use from_samples for missing data")
            idx.append(codes)
            shape.append(len(labels))
            coords[d] = labels
        counts = np.ones(len(df), dtype=np.int64) if count is None else _as_int_array(df[count].to_numpy(), count)
        return cls(np.stack(idx, axis=1), counts, shape, dims=dims, coords=coords)

    @classmethod
    def from_sparse(cls, matrix, dims=None, coords=None) -> CountTensor:
        """From a ``scipy.sparse`` matrix or array of counts."""
        import scipy.sparse as sp

        if not sp.issparse(matrix):
            raise TypeError(f"from_sparse expects a scipy.sparse matrix, got {type(matrix).__name__}")
        coo = sp.coo_matrix(matrix)
        data = _as_int_array(coo.data, "X")
        return cls(np.stack([coo.row, coo.col], axis=1), data, coo.shape, dims=dims, coords=coords)

    @classmethod
    def from_samples(cls, samples, shape=None, dims=None, coords=None) -> CountTensor:
        """From a ``(T, N)`` array of categorical samples; ``-1`` or NaN marks a missing entry.

        ``shape`` defaults to one more than the largest category seen on each axis. Rows whose
        entries are all missing carry no information: they are dropped with a ``UserWarning``
        (samples with every entry missing in every row raise ValueError).
        """
        arr = np.asarray(samples)
        if arr.ndim != 2:
            raise ValueError(f"samples must be a 2-D (T, N) array, got shape {arr.shape}")
        if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
            raise TypeError(f"samples must be numeric category codes, got dtype {arr.dtype}")
        if np.issubdtype(arr.dtype, np.floating):
            nan = np.isnan(arr)
            arr = np.where(nan, MISSING, arr)
            if (arr != np.round(arr)).any():
                raise ValueError("samples must hold integer category codes (-1 or NaN for missing)")
        arr = arr.astype(np.int64)
        if (arr < MISSING).any():
            raise ValueError("samples contain negative codes other than -1 (the missing marker)")
        if arr.shape[0] == 0:
            raise ValueError("samples is empty; expected at least one row (sample)")
        all_missing = (arr == MISSING).all(axis=1)
        if all_missing.all():
            raise ValueError(f"samples has every entry missing in all {arr.shape[0]} row(s); there is nothing to fit")
        if all_missing.any():
            import warnings

            warnings.warn(
                f"samples: dropped {int(all_missing.sum())} of {arr.shape[0]} row(s) with every entry "
                f"missing (e.g. row {int(np.argmax(all_missing))}); such a sample carries no information",
                UserWarning, stacklevel=2,
            )
            arr = arr[~all_missing]
        if shape is None:
            shape = tuple(int(max(arr[:, n].max(), 0)) + 1 for n in range(arr.shape[1]))
        return cls(arr, np.ones(len(arr), dtype=np.int64), shape, dims=dims, coords=coords)

    # -- views ---------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nnz(self) -> int:
        """Number of distinct observed cells (patterns) with a positive count."""
        return int(self.counts.shape[0])

    @property
    def total(self) -> int:
        """Total number of tokens T."""
        return int(self.counts.sum())

    @property
    def has_missing(self) -> bool:
        return bool((self.indices == MISSING).any())

    def to_dense(self) -> np.ndarray:
        if self.has_missing:
            raise ValueError("a tensor with missing coordinates has no dense form")
        out = np.zeros(self.shape, dtype=np.int64)
        out[tuple(self.indices.T)] = self.counts
        return out

    def tokens(self) -> np.ndarray:
        """One row per token, ``(T, ndim)`` (cells repeated by their counts)."""
        return np.repeat(self.indices, self.counts, axis=0)

    def _dim_names(self) -> tuple[str, ...]:
        """``dims``, or xarray's default names ``dim_0, dim_1, …`` for a tensor without them."""
        return self.dims or tuple(f"dim_{n}" for n in range(self.ndim))

    def to_xarray(self, name: str = "count"):
        """The dense counts as an ``xarray.DataArray`` with the tensor's dims (``dim_0``, … without
        names) and coords; :func:`as_count_tensor` and every backend read it back as the same tensor.

        A tensor with missing coordinates has no dense form (ValueError).
        """
        import xarray as xr

        dims = self._dim_names()
        return xr.DataArray(self.to_dense(), dims=dims, coords={d: list(c) for d, c in self.coords.items()},
                            name=name)

    def to_dataframe(self, count: str = "count"):
        """One row per nonzero cell: a column per dim holding the cell's label on that axis (its index
        where the axis has no coords), and a ``count`` column.

        The dim columns are pandas Categoricals whose categories are all the labels of the axis, in
        order, so ``CountTensor.from_dataframe(df, dims, count="count")`` gives back this tensor,
        zero rows and columns included (a tensor without dims comes back with the names
        ``dim_0``, … and its indices as labels). A missing coordinate (``-1``) is a missing value.
        """
        import pandas as pd

        if not isinstance(count, str) or count in self._dim_names():
            raise ValueError(f"count must be a column name other than the dims {self._dim_names()}, got {count!r}")
        columns = {}
        for axis, dim in enumerate(self._dim_names()):
            labels = self.coords.get(dim, range(self.shape[axis]))
            codes = self.indices[:, axis]
            try:
                columns[dim] = pd.Categorical.from_codes(codes, categories=list(labels))
            except ValueError:  # repeated labels cannot be categories: the labels themselves
                values = np.asarray(list(labels), dtype=object)[np.where(codes == MISSING, 0, codes)]
                columns[dim] = pd.Series(values).where(codes != MISSING)
        columns[count] = self.counts.copy()
        return pd.DataFrame(columns)

    def transpose(self, dims) -> CountTensor:
        """The same counts with the axes reordered to ``dims`` (a permutation of ``self.dims``)."""
        if self.dims is None:
            raise ValueError("transpose needs named dims")
        dims = tuple(dims)
        if sorted(dims) != sorted(self.dims):
            raise ValueError(f"dims must be a permutation of {self.dims}, got {dims}")
        perm = [self.dims.index(d) for d in dims]
        out = CountTensor.__new__(CountTensor)
        out.indices = self.indices[:, perm]
        out.counts = self.counts
        if perm != sorted(perm):  # keep the sorted-unique-cells invariant of __init__
            order = np.lexsort(out.indices.T[::-1])
            out.indices, out.counts = out.indices[order], out.counts[order]
        out.shape = tuple(self.shape[p] for p in perm)
        out.dims = dims
        out.coords = {d: self.coords[d] for d in dims if d in (self.coords or {})}
        return out

    def with_dims(self, dims) -> CountTensor:
        out = CountTensor.__new__(CountTensor)
        out.indices, out.counts, out.shape = self.indices, self.counts, self.shape
        out.dims = self._check_dims(dims, self.ndim)
        out.coords = {d: c for d, c in (self.coords or {}).items() if d in (out.dims or ())}
        if self.dims and out.dims:
            out.coords = {out.dims[i]: self.coords[d] for i, d in enumerate(self.dims) if d in self.coords}
        return out

    def __repr__(self) -> str:
        dims = f", dims={self.dims}" if self.dims else ""
        return f"CountTensor(shape={self.shape}, nnz={self.nnz}, total={self.total}{dims})"


def _from_pandas(data, name: str) -> CountTensor:
    """A Series of counts indexed by named levels (what ``df.value_counts()`` and
    ``df.groupby(dims).size()`` return): its level names the dims, its labels the coords."""
    import pandas as pd

    dims = list(data.index.names) if isinstance(data, pd.Series) else []
    if not dims or None in dims or len(set(dims)) < len(dims) or data.name in dims:
        raise TypeError(
            f"{name}: a pandas object is ambiguous here; pass a Series of counts indexed by named levels "
            "(df.value_counts()), CountTensor.from_dataframe(df, dims=..., count=...) for a long count table, "
            "or CountTensor.from_samples for samples"
        )
    count = "count" if data.name is None else data.name
    return CountTensor.from_dataframe(data.rename(count).reset_index(), dims, count=count)


def _crosstab_as_long(df):
    """A two-way table with a named index and named columns (what ``pd.crosstab`` returns) as a long
    table: a column for each name and one of counts."""
    rows, columns = str(df.index.name), str(df.columns.name)
    count = next(c for c in ("count", "counts", "n") if c not in (rows, columns))
    return df.rename_axis(index=rows, columns=None).reset_index().melt(rows, var_name=columns, value_name=count)


def as_count_tensor(data, name: str = "X") -> CountTensor:
    """Accept a :class:`CountTensor`, an ``xarray.DataArray`` (its dims and coords kept), a pandas
    Series of counts indexed by named levels (their names the dims, their labels the coords), a
    dense array-like of counts, or a scipy sparse matrix."""
    if isinstance(data, CountTensor):
        return data
    if data is None:
        raise TypeError(f"{name} is None; expected a count tensor (array of nonnegative integers)")
    if type(data).__name__ == "DataArray" and hasattr(data, "dims") and hasattr(data, "coords"):
        dims = tuple(str(d) for d in data.dims)
        coords = {d: list(np.asarray(data.coords[d])) for d in dims if d in data.coords}
        return CountTensor.from_dense(np.asarray(data), dims=dims, coords=coords)
    try:
        import scipy.sparse as sp

        if sp.issparse(data):
            return CountTensor.from_sparse(data)
    except ImportError:  # pragma: no cover
        pass
    try:
        import pandas as pd

        if isinstance(data, (pd.DataFrame, pd.Series)):
            return _from_pandas(data, name)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(data, (Mapping, str, bytes)):
        raise TypeError(f"{name} must be an array of counts, got {type(data).__name__}")
    if isinstance(data, Sequence) or hasattr(data, "__array__"):
        try:
            return CountTensor.from_dense(data)
        except (TypeError, ValueError) as err:
            raise type(err)(str(err).replace("X ", f"{name} ", 1)) from None
    raise TypeError(f"{name} must be an array of nonnegative integer counts, got {type(data).__name__}")


class BinaryMatrix(NamedTuple):
    """A binary matrix (0/1 floats, NaN = missing) with its row and column labels.

    ``row_groups`` optionally gives a known class of each row (e.g. an MP's party).
    """

    X: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    row_groups: np.ndarray | None = None


class BinaryData(NamedTuple):
    """A checked binary matrix (:func:`as_binary_matrix`): its entries, which are observed, and the
    row and column labels of a :class:`BinaryMatrix` (None: positions)."""

    values: np.ndarray
    observed: np.ndarray
    rows: np.ndarray | None
    cols: np.ndarray | None


def is_data_frame(value) -> bool:
    """Whether ``value`` is a pandas DataFrame (read as a long table of counts, or a labelled binary matrix)."""
    import pandas as pd

    return isinstance(value, pd.DataFrame)


def as_binary_matrix(V, mask=None, name: str = "V") -> BinaryData:
    """Validate a binary matrix with missing entries (Lumbreras et al. 2020 §3, V ∈ {0, 1, NA}^{F×N}).

    Parameters
    ----------
    V : array-like of shape (F, N) or BinaryMatrix
        Entries 0 or 1 (bool or any numeric dtype); NaN marks a missing entry.
    mask : array of bool, shape (F, N), optional
        NumPyro's convention: ``True`` marks an observed entry, ``False`` hides it.

    Returns
    -------
    BinaryData
        ``values`` (int8, (F, N): the entries, 0 where missing), ``observed`` (bool, (F, N): entries
        that are neither NaN nor masked out), ``rows``, ``cols`` (labels carried by a
        :class:`BinaryMatrix` or a pandas DataFrame's index and columns, else None).
    """
    rows = cols = None
    if isinstance(V, BinaryMatrix):
        V, rows, cols = V.X, V.rows, V.cols
    elif is_data_frame(V):  # a labelled table keeps its labels, as a BinaryMatrix does
        V, rows, cols = V.to_numpy(dtype=float), np.asarray(V.index), np.asarray(V.columns)
    if V is None or isinstance(V, (Mapping, str, bytes)):
        raise TypeError(f"{name} must be a 2-d array of 0/1 values, got {type(V).__name__}")
    try:
        arr = np.asarray(V)
    except Exception as err:  # ragged lists and the like
        raise TypeError(f"{name} must be a 2-d array of 0/1 values: {err}") from None
    if not (np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)) or \
            np.issubdtype(arr.dtype, np.complexfloating):
        raise TypeError(f"{name} must hold 0/1 numbers (NaN for missing), got dtype {arr.dtype}")
    if arr.ndim != 2 or 0 in arr.shape:
        raise ValueError(f"{name} must be a non-empty 2-d matrix, got shape {arr.shape}")
    arr = arr.astype(np.float64)
    missing = np.isnan(arr)
    bad = ~missing & (arr != 0) & (arr != 1)
    if bad.any():
        raise ValueError(
            f"{name} must hold only 0, 1 or NaN (missing); found {np.unique(arr[bad])[:5].tolist()}")
    observed = ~missing
    if mask is not None:
        mask_arr = np.asarray(mask)
        if mask_arr.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True = observed), got dtype {mask_arr.dtype}")
        if mask_arr.shape != arr.shape:
            raise ValueError(f"mask must have the shape of {name} {arr.shape}, got {mask_arr.shape}")
        observed &= mask_arr
    if not observed.any():
        raise ValueError(f"{name} has no observed entry (all NaN or masked out)")
    values = np.where(observed, arr, 0.0).astype(np.int8)
    return BinaryData(values, observed, rows, cols)


def match_dims(data: CountTensor, nodes: Sequence[str], name: str = "X") -> CountTensor:
    """Put the axes of ``data`` in the order of the model's visible ``nodes``, by name.

    Named axes (CountTensor dims, xarray dims, DataFrame columns) are matched to the node names
    whatever their order. Data without names, or whose names share none with the nodes (say a
    ``hair × eye × sex`` table for a model over ``i, j, k``), are taken by position: axis n is
    node ``nodes[n]``. Names that match some nodes but not all are an error, since a positional
    reading would silently fit another graph.
    """
    nodes = tuple(nodes)
    if data.dims is None or tuple(data.dims) == nodes:
        return data
    names = set(data.dims)
    if names == set(nodes):
        return data.transpose(nodes)
    if names.isdisjoint(nodes):
        return data
    raise ValueError(
        f"{name} has named axes {list(data.dims)} but the model's visible nodes are {list(nodes)}: "
        "name every axis after a visible node (any order), or give data without names "
        f"(axes in the order {list(nodes)})"
    )


def long_table(df, nodes: Sequence[str], name: str = "X") -> CountTensor:
    """A long-format DataFrame with one column per visible node (any order) and, optionally, one
    count column (any other single numeric column); without it each row is one token. A two-way
    table whose index and columns are named by the two nodes (``pd.crosstab``) reads as its cells."""
    nodes = list(nodes)
    if (len(nodes) == 2 and df.index.nlevels == 1 and df.columns.nlevels == 1
            and {df.index.name, df.columns.name} == set(nodes) and not set(nodes) & set(df.columns)):
        df = _crosstab_as_long(df)
    missing = [n for n in nodes if n not in df.columns]
    if missing:
        from pandas.api.types import is_numeric_dtype

        numeric = all(is_numeric_dtype(dtype) for dtype in df.dtypes)
        if len(missing) == len(nodes) == 2 and numeric:  # likely the table itself, rows by columns
            hint = (f"; a DataFrame is read as a long table (a column per node), so a table of counts laid "
                    f"out as rows by columns goes in as df.to_numpy(), or as CountTensor.from_dense("
                    f"df.to_numpy(), dims={nodes}, coords=...) to keep its labels")
        else:
            hint = f"; rename the columns that hold the nodes' values to {missing} (df.rename(columns=...))"
        raise ValueError(
            f"{name}: the DataFrame has no column for node(s) {missing}; columns are "
            f"{list(df.columns)}, the model's visible nodes {nodes}{hint}"
        )
    rest = [c for c in df.columns if c not in nodes]
    if len(rest) > 1:
        raise ValueError(
            f"{name}: columns {rest} are neither visible nodes {nodes} nor a single count column; "
            "select the columns to use, or build CountTensor.from_dataframe(df, dims=..., count=...)"
        )
    return CountTensor.from_dataframe(df, dims=nodes, count=rest[0] if rest else None)
