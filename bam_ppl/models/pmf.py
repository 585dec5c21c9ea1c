"""Joint PMF of N categorical variables as a rank-R CPD with tuning-free rank detection (Chege et al. 2024).

The joint PMF of X_1..X_N is a mixture of R product distributions (Chege et al. 2024 eq. 1–2),

    Pr(x_1, …, x_N) = Σ_r λ_r ∏_n A_n(x_n, r),

i.e. the naive-Bayes allocation model ``r -> x1; …; r -> xN`` with a sparse Dirichlet(α_λ) prior
on the mixing weights λ (eq. 11) and a Dirichlet(α) prior on every factor column (eq. 12). With
α_λ ≪ 1 the variational posterior switches off the components the data do not need, so an
over-specified ``max_rank`` is pruned to the detected rank in one run (Chege et al. 2024 §III).

Data are T samples with missing entries: a ``(T, N)`` array of category codes with ``-1`` (or NaN /
``pandas.NA``) for a missing entry, a pandas DataFrame of categoricals, or a
:class:`~bam_ppl.data.CountTensor`; :func:`categorical_samples` is the one place that validates
them. A missing entry drops out of every sum because each factor column sums to one.

This module also holds what the rank-detection experiments of Chege et al. 2024 §V need: ground-truth
PMFs (:func:`random_pmf`, :func:`sample_pmf`), the dense joint PMF and its KL divergence, and
the rating-prediction metrics (eq. 55, RMSE, MAE, mean test NLL).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence

import numpy as np
from scipy.special import logsumexp

from ..data import MISSING, CountTensor
from ..types import KeyLike, numpy_generator
from ..validation import check_int, check_positive
from .allocation import AllocationModel

#: Attributes of an allocation model that exist only once the number of variables is known.
_RESOLVED_ONLY = ("dag", "observed", "priors")


def _variable_names(num_variables: int) -> tuple[str, ...]:
    return tuple(f"x{n + 1}" for n in range(num_variables))


# -- data ------------------------------------------------------------------------------------------
def _codes_from_frame(frame):
    """Codes and labels per column: categoricals (and text) by category, numbers as codes."""
    import pandas as pd

    codes, labels = [], []
    for column in frame.columns:
        values = frame[column]
        if pd.api.types.is_numeric_dtype(values.dtype) and not isinstance(values.dtype, pd.CategoricalDtype):
            codes.append(_codes_from_array(values.to_numpy(dtype=np.float64, na_value=np.nan)[:, None])[:, 0])
            labels.append(None)
            continue
        cat = values if isinstance(values.dtype, pd.CategoricalDtype) else values.astype("category")
        codes.append(cat.cat.codes.to_numpy().astype(np.int64))
        labels.append(list(cat.cat.categories))
    return np.stack(codes, axis=1), labels


def _codes_from_array(samples) -> np.ndarray:
    arr = np.asarray(samples)
    if arr.dtype == object:
        import pandas as pd

        missing = pd.isna(arr)
        try:
            arr = np.where(missing, MISSING, arr).astype(np.float64)
        except (TypeError, ValueError):
            raise TypeError("samples must hold numeric category codes (-1, NaN or NA for missing)") from None
    if arr.ndim != 2:
        raise ValueError(f"samples must be a 2-D (T, N) array of category codes, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)):
        raise TypeError(f"samples must hold numeric category codes, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        arr = np.where(np.isnan(arr), MISSING, arr)
        if not np.isfinite(arr).all() or (arr != np.round(arr)).any():
            raise ValueError("samples must hold integer category codes (-1, NaN or NA for missing)")
    return arr.astype(np.int64)


def _drop_empty_rows(codes: np.ndarray, name: str = "samples", stacklevel: int = 3) -> np.ndarray:
    """``codes`` without the rows whose every entry is missing, with a warning naming how many.

    Such a sample carries no information about the joint PMF (its likelihood is 1 under every
    model), so dropping it changes no estimate; Chege et al. 2024's missing-data settings produce them.
    Data with no observed entry at all are an error naming ``name``.
    """
    empty = (codes == MISSING).all(axis=1)
    if not empty.any():
        return codes
    if empty.all():
        raise ValueError(
            f"{name} has every entry missing in all {codes.shape[0]} row(s); there is nothing to fit"
        )
    warnings.warn(
        f"{name}: dropped {int(empty.sum())} of {codes.shape[0]} row(s) with every entry missing "
        f"(e.g. row {int(np.argmax(empty))}); such a sample carries no information",
        UserWarning, stacklevel=stacklevel,
    )
    return codes[~empty]


def _check_codes(codes: np.ndarray, sizes: Sequence[int], names) -> None:
    if codes.shape[0] == 0:
        raise ValueError("samples is empty; expected at least one row (sample)")
    for n, size in enumerate(sizes):
        column = codes[:, n]
        bad = (column < MISSING) | (column >= size)
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(
                f"samples: category {int(column[row])} of variable {names[n]!r} (row {row}) is out of "
                f"range; expected a code in [0, {size}) or -1 for a missing entry"
            )


def _category_sizes(num_categories, codes: np.ndarray, default) -> tuple[int, ...]:
    N = codes.shape[1]
    if num_categories is None:
        return tuple(default)
    if isinstance(num_categories, (int, np.integer)) and not isinstance(num_categories, bool):
        sizes = (int(num_categories),) * N
    else:
        sizes = tuple(num_categories)
        if len(sizes) != N:
            raise ValueError(f"num_categories has {len(sizes)} entries for {N} variables")
    for n, size in enumerate(sizes):
        check_int(size, f"num_categories[{n}]")
    return tuple(int(s) for s in sizes)


def sample_codes(samples, num_categories=None, *, allow_empty_rows: bool = False):
    """Validate categorical samples and return them row by row (the one validation point).

    Takes the same inputs as :func:`categorical_samples`. Returns ``(codes, sizes, dims, labels)``:
    codes ``(T, N)`` int64 in the input's row order with -1 for missing, alphabet sizes, data
    dims (DataFrame columns or CountTensor dims; ``None`` for arrays) and category labels.
    Unless ``allow_empty_rows``, rows with every entry missing are dropped with a warning (so
    ``T`` counts the informative rows); data with no observed entry at all raise ValueError.
    """
    import pandas as pd

    labels, dims = None, None
    if isinstance(samples, CountTensor):
        codes = samples.tokens()
        default = samples.shape
        dims, labels = samples.dims, samples.coords
    elif isinstance(samples, pd.DataFrame):
        codes, frame_labels = _codes_from_frame(samples)
        default = tuple(max(len(lab), 1) if lab is not None else int(max(codes[:, n].max(initial=0), 0)) + 1
                        for n, lab in enumerate(frame_labels))
        dims = tuple(str(c) for c in samples.columns)
        labels = {d: lab for d, lab in zip(dims, frame_labels) if lab is not None}
    else:
        codes = _codes_from_array(samples)
        default = tuple(int(max(codes[:, n].max(initial=0), 0)) + 1 for n in range(codes.shape[1]))
    if codes.ndim != 2 or codes.shape[1] < 1:
        raise ValueError(f"samples must have shape (T, N) with N >= 1, got {codes.shape}")
    sizes = _category_sizes(num_categories, codes, default)
    _check_codes(codes, sizes, dims or _variable_names(codes.shape[1]))
    if not allow_empty_rows:
        codes = _drop_empty_rows(codes, stacklevel=4)
    if labels and dims:
        labels = {d: lab for d, lab in labels.items() if len(lab) == sizes[dims.index(d)]}
    return codes, sizes, dims, labels or None


def categorical_samples(samples, num_categories=None, *, allow_empty_rows: bool = False) -> CountTensor:
    """Validate categorical samples with missing entries and aggregate them into a CountTensor.

    Parameters
    ----------
    samples : array-like (T, N), pandas.DataFrame or CountTensor
        Category codes ``0..I_n-1`` with ``-1``, NaN or ``pandas.NA`` for a missing entry; or a
        DataFrame whose categorical (or text) columns give codes by category, their labels kept
        as coords, numeric columns being codes already, column names kept as dims; or a CountTensor of sample patterns (``-1`` = missing).
    num_categories : int or sequence of int, optional
        Alphabet sizes I_n. Default: the DataFrame's categories, the CountTensor's shape, or one
        more than the largest code seen per column.
    allow_empty_rows : bool
        Keep rows with every entry missing (only meaningful for prediction, where the target
        entry has been hidden). By default they are dropped with a ``UserWarning``: such a
        sample carries no information (Chege et al. 2024's 30 % missing setting produces some).

    Returns
    -------
    CountTensor
        Distinct sample patterns with their counts; shape ``(I_1, …, I_N)``.

    Raises
    ------
    ValueError
        Codes out of range, empty input or input with no observed entry, non-integer codes.
    TypeError
        Non-numeric codes.
    """
    codes, sizes, dims, labels = sample_codes(samples, num_categories, allow_empty_rows=allow_empty_rows)
    return CountTensor(codes, np.ones(len(codes), dtype=np.int64), sizes, dims=dims, coords=labels)


# -- the model -------------------------------------------------------------------------------------
class PMFTensorModel(AllocationModel):
    """The rank-R CPD of a joint PMF: ``r -> x1; …; r -> xN`` with sparse Dirichlet priors.

    Parameters
    ----------
    max_rank : int
        Initial (over-specified) number of components R; VB prunes it to the detected rank.
    alpha_lambda : float
        Symmetric Dirichlet concentration on the mixing weights λ (Chege et al. 2024 eq. 11); ≪ 1 makes
        the posterior sparse, which is the rank-detection mechanism.
    alpha : float
        Symmetric Dirichlet concentration of every factor column a_{n,r} (eq. 12).
    num_variables : int, optional
        N. Left out, the model is a *template*: the number of variables is read from the data at
        fit time (:meth:`resolve`), so one ``pmf_tensor(50)`` serves any data set. Why a template
        rather than a required ``num_variables``: the number of variables is a property of the
        data, like the alphabet sizes I_n, which every allocation model already takes from the
        data when it is bound. A template binds, draws and builds its NumPyro program by resolving
        itself first; only the DAG-level attributes (``dag``, ``observed``, ``priors``) need a
        resolved model.

    Notes
    -----
    Visible nodes are named ``x1..xN``; a DataFrame's column names stay the data's dims and its
    labels the coords. The Gamma–Poisson total term of the allocation model (Cemgil et al. 2019 eq. 3.11)
    is independent of λ and the factors, so posteriors equal those of Chege et al. 2024; only evidence
    values carry it. Backends written for any :class:`AllocationModel` take a CountTensor built
    by :func:`categorical_samples` (a plain array would be read as a dense count tensor).
    """

    default_method = "vb"

    def __init__(self, max_rank: int, alpha_lambda: float = 1e-6, alpha: float = 1.0,
                 num_variables: int | None = None):
        self.max_rank = check_int(max_rank, "max_rank")
        self.alpha_lambda = check_positive(alpha_lambda, "alpha_lambda")
        self.alpha = check_positive(alpha, "alpha")
        self.num_variables = None if num_variables is None else check_int(num_variables, "num_variables")
        if self.num_variables is None:
            # The template carries every setting that does not depend on N.
            self.a, self.b = 1.0, None
            self.latent = {"r": self.max_rank}
            self.tie, self.condition_on = (), ()
            return
        names = _variable_names(self.num_variables)
        super().__init__(
            "; ".join(f"r -> {x}" for x in names),
            latent={"r": self.max_rank},
            observed=names,
            priors={"r": self.alpha_lambda, **{x: self.alpha for x in names}},
        )

    def __getattr__(self, name):
        # Only reached when normal lookup fails: a template has no DAG until it sees data.
        if name in _RESOLVED_ONLY:
            raise AttributeError(
                f"PMFTensorModel.{name}: this model takes its number of variables from the data; "
                "use model.resolve(data) or pmf_tensor(..., num_variables=N)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def is_template(self) -> bool:
        return self.num_variables is None

    @property
    def variables(self) -> tuple[str, ...]:
        """Names of the visible nodes (``x1..xN``)."""
        if self.is_template:
            raise AttributeError("a template PMFTensorModel has no variables yet; resolve it on data")
        return _variable_names(self.num_variables)

    def with_rank(self, rank: int) -> PMFTensorModel:
        """The same model with ``rank`` components (e.g. the detected rank after pruning)."""
        return PMFTensorModel(rank, self.alpha_lambda, self.alpha, self.num_variables)

    def resolve(self, data) -> PMFTensorModel:
        """The model for ``data`` (samples, CountTensor or an int N): fixes the number of variables.

        A resolved model returns itself after checking that the data have its number of variables.
        """
        if isinstance(data, (int, np.integer)) and not isinstance(data, bool):
            num = check_int(data, "num_variables")
        elif isinstance(data, CountTensor):
            num = data.ndim
        else:
            num = categorical_samples(data, allow_empty_rows=True).ndim
        if self.is_template:
            return PMFTensorModel(self.max_rank, self.alpha_lambda, self.alpha, num)
        if num != self.num_variables:
            raise ValueError(
                f"data have {num} variables but the model was built for num_variables={self.num_variables}"
            )
        return self

    def as_data(self, data) -> CountTensor:
        """Categorical samples in any form :func:`categorical_samples` takes, as a CountTensor."""
        return categorical_samples(data)

    def bind(self, data=None, *, shape=None, total: int | None = None):
        """Bind to categorical samples (any form :func:`categorical_samples` takes) or a shape."""
        if data is not None:
            data = categorical_samples(data)
            return AllocationModel.bind(self.resolve(data), data)
        if shape is None:
            raise ValueError("bind needs data or a shape (alphabet sizes I_1..I_N)")
        return AllocationModel.bind(self.resolve(len(tuple(shape))), shape=shape, total=total)

    def sample(self, rng_key: KeyLike, shape=None, total=None):
        """Generative draw (S, X) of the allocation model; ``shape`` = alphabet sizes I_1..I_N."""
        if shape is None:
            raise ValueError("sample needs shape= (alphabet sizes I_1..I_N)")
        return AllocationModel.sample(self.resolve(len(tuple(shape))), rng_key, shape, total)

    def __repr__(self) -> str:
        n = "from data" if self.is_template else self.num_variables
        return (f"PMFTensorModel(max_rank={self.max_rank}, alpha_lambda={self.alpha_lambda:g}, "
                f"alpha={self.alpha:g}, num_variables={n})")

    # -- prediction (Chege et al. 2024 §V-B) -----------------------------------------------------------------
    def predict_conditional(self, idata, samples, target) -> np.ndarray:
        """Conditional PMF of one variable given the other observed entries of each sample.

        Pr(x_target = i | y_obs) = Σ_r λ_r A_target(i, r) ∏_{n ∈ obs} A_n(y_n, r) /
        Σ_r λ_r ∏_{n ∈ obs} A_n(y_n, r), the Bayes-rule reading of Chege et al. 2024 eq. (55), with the
        posterior means of λ and the factors in ``idata`` (any backend's output).

        Parameters
        ----------
        idata : InferenceData from a backend run on this model
        samples : (T', N) array-like or DataFrame
            Codes with -1 for missing; the target entry is ignored (treated as hidden). A DataFrame
            whose columns name variables of the fitted data is read by name, its labels against the
            fitted categories (columns in any order; a left-out column, the target's say, is missing).
        target : int, str or array of int (T',)
            The variable to predict: an index, a node name (``"x3"``), a data dim name, or one
            index per row. Per-row targets must share one alphabet size.

        Returns
        -------
        numpy.ndarray, shape (T', I_target)
        """
        weights, factors, dims = point_estimate(idata)
        codes = _prediction_codes(samples, factors, dims, _category_labels(idata))
        rows = np.arange(codes.shape[0])
        targets = _target_indices(target, dims, codes.shape[0])
        present, which = np.unique(targets, return_inverse=True)
        target_sizes = {factors[t].shape[1] for t in present}
        if len(target_sizes) > 1:
            raise ValueError(f"per-row targets have different alphabet sizes {sorted(target_sizes)}")
        codes[rows, targets] = MISSING
        log_w = _log_component_likelihood(weights, factors, codes)  # (T', R)
        w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
        target_factor = np.stack([factors[t] for t in present])[which.reshape(-1)]  # (T', R, I)
        probs = np.einsum("tr,tri->ti", w, target_factor)
        return probs / probs.sum(axis=1, keepdims=True)

    def predict_mean(self, idata, samples, target, values=None) -> np.ndarray:
        """Conditional expectation Σ_i values[i] Pr(x_target = i | y_obs) (Chege et al. 2024 eq. 55).

        ``values`` are the numbers the categories stand for (default: the codes 0..I-1).
        """
        probs = self.predict_conditional(idata, samples, target)
        values = np.arange(probs.shape[1], dtype=np.float64) if values is None else np.asarray(values, float)
        if values.shape != (probs.shape[1],):
            raise ValueError(f"values must have one number per category ({probs.shape[1]}), got shape {values.shape}")
        return probs @ values

    def log_likelihood(self, idata, samples) -> np.ndarray:
        """log Pr(observed entries of each sample) under the posterior-mean PMF, shape (T',)."""
        weights, factors, dims = point_estimate(idata)
        codes = _prediction_codes(samples, factors, dims, _category_labels(idata))
        return logsumexp(_log_component_likelihood(weights, factors, codes), axis=1)

    def mean_nll(self, idata, samples) -> float:
        """Mean test negative log-likelihood per sample (the NLL column of Chege et al. 2024 Table I)."""
        return float(-self.log_likelihood(idata, samples).mean())


def _prediction_codes(samples, factors, dims, labels) -> np.ndarray:
    sizes = [f.shape[1] for f in factors]
    if hasattr(samples, "columns") and hasattr(samples, "iloc"):  # a DataFrame
        named = [column in dims for column in samples.columns]
        if all(named):
            samples = _aligned_frame(samples, dims, labels)
        elif any(named):  # none named: the columns by position, as an array's
            raise ValueError(f"samples has columns {[c for c, n in zip(samples.columns, named) if not n]} that the "
                             f"fitted data do not; expected columns among {list(dims)}")
    codes = sample_codes(samples, num_categories=sizes if _width(samples) == len(sizes) else None,
                         allow_empty_rows=True)[0]
    if codes.shape[1] != len(sizes):
        raise ValueError(f"samples have {codes.shape[1]} variables, the fitted model has {len(sizes)}")
    return codes.copy()


def _aligned_frame(frame, dims, labels):
    """``frame``'s columns by name in the fitted data's order, each a categorical of the fitted categories (a
    variable without a column all missing), so that :func:`sample_codes` codes every label as the fit did."""
    import pandas as pd

    columns = {}
    for name, categories in zip(dims, labels):
        values = frame[name] if name in frame.columns else pd.Series(np.nan, index=frame.index)
        coded = pd.Categorical(values, categories=categories)
        unknown = np.asarray(pd.isna(coded)) & values.notna().to_numpy()
        if unknown.any():
            raise ValueError(f"samples[{name!r}] holds {sorted(map(str, set(values[unknown])))}, not categories of "
                             f"the fitted data {list(categories)}")
        columns[name] = coded
    return pd.DataFrame(columns, index=frame.index)


def _category_labels(idata) -> list:
    """The categories of every variable, as the fit's posterior labels them (its coordinates)."""
    from ..convert.read import attrs_of, group

    posterior = group(idata, "posterior")
    return [list(posterior[f"theta_{n}"].coords[n].values) for n in str(attrs_of(idata).get("observed", "")).split(",")]


def _width(samples) -> int | None:
    shape = getattr(samples, "shape", None) or np.shape(samples)
    return shape[1] if len(shape) == 2 else None


def _target_indices(target, dims, num_rows) -> np.ndarray:
    N = len(dims)
    if isinstance(target, str):
        names = list(dims)
        if target in names:
            index = names.index(target)
        elif target in _variable_names(N):
            index = _variable_names(N).index(target)
        else:
            raise ValueError(f"target {target!r} is not a variable; expected one of {names}")
        return np.full(num_rows, index)
    arr = np.asarray(target)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"target must be an int, a variable name or an int array, got {target!r}")
    if arr.ndim == 0:
        arr = np.full(num_rows, int(arr))
    if arr.shape != (num_rows,):
        raise ValueError(f"per-row target must have shape ({num_rows},), got {arr.shape}")
    if ((arr < 0) | (arr >= N)).any():
        raise ValueError(f"target indices must be in [0, {N}), got {arr.min()}..{arr.max()}")
    return arr.astype(np.int64)


def _log_component_likelihood(weights, factors, codes) -> np.ndarray:
    """log λ_r + Σ_{n observed} log A_n(y_n, r) for every sample, shape (T', R)."""
    with np.errstate(divide="ignore"):
        out = np.broadcast_to(np.log(weights), (codes.shape[0], weights.size)).copy()
        for n, factor in enumerate(factors):  # a loop over variables, vectorised over samples
            observed = codes[:, n] != MISSING
            out[observed] += np.log(factor[:, codes[observed, n]]).T
    return out


def point_estimate(idata):
    """Posterior means (λ̂ (R,), [Â_n (R, I_n)], data dims) from a PMF backend's InferenceData.

    Uses the variational Dirichlet parameters when the run stored them (group ``variational``:
    exact means, Chege et al. 2024 eqs. 24, 30), else the mean of the posterior draws.
    """
    from ..convert.read import attrs_of, group

    attrs = attrs_of(idata)
    nodes = str(attrs.get("observed", "")).split(",")
    if not nodes or not nodes[0]:
        raise ValueError("idata has no 'observed' attribute; pass the output of a PMF backend")
    try:
        source = group(idata, "variational")
        name = "concentration_{}"
    except (AttributeError, KeyError):
        source = group(idata, "posterior")
        name = "theta_{}"
    if name.format("r") not in source:
        raise ValueError("idata holds no mixing weights theta_r; pass the output of a PMF backend")

    def mean(var):
        values = np.asarray(source[name.format(var)], dtype=np.float64)
        if name.startswith("concentration"):
            return values / values.sum(axis=-1, keepdims=True)
        return values.reshape(-1, *values.shape[2:]).mean(axis=0)

    weights = mean("r")
    factors = [mean(n) for n in nodes]
    dims = tuple(json.loads(attrs["data_dims"])) if "data_dims" in attrs else tuple(nodes)
    return weights / weights.sum(), factors, dims


# -- ground truth and metrics (Chege et al. 2024 §V) ------------------------------------------------------
def random_pmf(rng_key: KeyLike, rank: int, num_variables: int, num_categories):
    """A ground-truth rank-R PMF as in Chege et al. 2024 §V-A.

    λ_r ~ U(0.3, 1) and factor entries ~ U(0, 1), then λ is normalised and every factor column
    normalised to sum to one.

    Returns
    -------
    weights : (R,) numpy array
    factors : list of (R, I_n) numpy arrays (row r = column a_{n,r} of Chege et al. 2024)
    """
    rank = check_int(rank, "rank")
    num_variables = check_int(num_variables, "num_variables")
    sizes = [num_categories] * num_variables if np.isscalar(num_categories) else list(num_categories)
    rng = numpy_generator(rng_key)
    weights = rng.uniform(0.3, 1.0, size=rank)
    factors = []
    for size in sizes:
        f = rng.uniform(0.0, 1.0, size=(rank, check_int(size, "num_categories")))
        factors.append(f / f.sum(axis=1, keepdims=True))
    return weights / weights.sum(), factors


def sample_pmf(rng_key: KeyLike, weights, factors, num_samples: int, missing_prob: float = 0.0) -> np.ndarray:
    """Draw T samples of the naive-Bayes model and hide entries independently with ``missing_prob``.

    A row that would lose every entry keeps one, chosen uniformly: an all-missing sample carries no
    information (Chege et al. 2024 eq. 3, conditioned on at least one observed entry).

    Returns
    -------
    numpy.ndarray, shape (T, N), codes with -1 for missing
    """
    num_samples = check_int(num_samples, "num_samples")
    if not 0.0 <= float(missing_prob) < 1.0:
        raise ValueError(f"missing_prob must be in [0, 1), got {missing_prob}")
    rng = numpy_generator(rng_key)
    weights = np.asarray(weights, dtype=np.float64)
    hidden = rng.choice(weights.size, size=num_samples, p=weights / weights.sum())
    columns = []
    for factor in factors:  # inverse-CDF draws, vectorised over samples
        cdf = np.cumsum(np.asarray(factor, dtype=np.float64), axis=1)[hidden]
        u = rng.random(num_samples)[:, None] * cdf[:, -1:]
        columns.append(np.minimum((u >= cdf).sum(axis=1), cdf.shape[1] - 1))
    codes = np.stack(columns, axis=1).astype(np.int64)
    if missing_prob > 0:
        missing = rng.random(codes.shape) < missing_prob
        empty = np.flatnonzero(missing.all(axis=1))
        missing[empty, rng.integers(0, codes.shape[1], size=empty.size)] = False
        codes[missing] = MISSING
    return codes


def joint_pmf(weights, factors) -> np.ndarray:
    """The dense tensor Σ_r λ_r a_{1,r} ∘ … ∘ a_{N,r} (Chege et al. 2024 eq. 1); factors are (R, I_n)."""
    weights = np.asarray(weights, dtype=np.float64)
    out = weights
    for factor in factors:  # grow the tensor one mode at a time, keeping the rank axis first
        out = out[..., None] * np.asarray(factor, dtype=np.float64).reshape(
            factor.shape[0], *([1] * (out.ndim - 1)), factor.shape[1])
    return out.sum(axis=0)


def kl_divergence(p, q) -> float:
    """D(p ‖ q) = Σ p log(p / q) between two dense PMF tensors (Chege et al. 2024 §V-A)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    support = p > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(p[support] * (np.log(p[support]) - np.log(q[support]))))


def hide_one_entry(rng_key: KeyLike, samples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hide one observed entry per row, chosen uniformly (the rating-prediction protocol, §V-B).

    Returns
    -------
    masked : (T, N) codes with the chosen entry set to -1
    target : (T,) index of the hidden variable per row
    truth : (T,) its hidden code
    """
    codes = _codes_from_array(samples)
    observed = codes != MISSING
    if not observed.any(axis=1).all():
        raise ValueError("samples has rows with no observed entry to hide")
    u = numpy_generator(rng_key).random(codes.shape)
    target = np.argmax(np.where(observed, u, -1.0), axis=1)
    rows = np.arange(codes.shape[0])
    truth = codes[rows, target].copy()
    masked = codes.copy()
    masked[rows, target] = MISSING
    return masked, target, truth


def rmse(predicted, truth) -> float:
    """Root-mean-square error between predicted and true values."""
    predicted, truth = np.asarray(predicted, float), np.asarray(truth, float)
    return float(np.sqrt(np.mean((predicted - truth) ** 2)))


def mae(predicted, truth) -> float:
    """Mean absolute error between predicted and true values."""
    predicted, truth = np.asarray(predicted, float), np.asarray(truth, float)
    return float(np.mean(np.abs(predicted - truth)))


def pmf_tensor(max_rank: int, alpha_lambda: float = 1e-6, alpha: float = 1.0,
               num_variables: int | None = None) -> PMFTensorModel:
    """Joint PMF of N categorical variables as a rank-``max_rank`` CPD with rank detection.

    The naive-Bayes allocation model ``r -> x1; …; r -> xN`` with Dirichlet(α_λ) mixing weights
    and Dirichlet(α) factor columns (Chege et al. 2024 eqs. 11–12). N comes from the data at fit time
    unless ``num_variables`` is given (see :class:`PMFTensorModel`).

    Examples
    --------
    >>> import bam_ppl as bam
    >>> model = bam.models.pmf_tensor(23)
    >>> idata = bam.infer(model, samples, method="vb")          # doctest: +SKIP
    >>> int(bam.convert.attrs_of(idata)["detected_rank"])      # doctest: +SKIP
    """
    return PMFTensorModel(max_rank, alpha_lambda, alpha, num_variables)
