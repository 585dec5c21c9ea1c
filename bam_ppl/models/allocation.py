"""The Bayesian Allocation Model (Cemgil et al. 2019 §3) for any DAG of index variables.

:class:`AllocationModel` holds what the user declares (structure, latent cardinalities, priors,
tied tables, conditioned totals). Binding it to data (:meth:`AllocationModel.bind`) fixes every
cardinality and gives a :class:`BoundModel`: the Dirichlet tables with their concentrations and
the closed forms of the model (log π(S), eq. 3.11). Backends work on the bound model and on its
:class:`CellLayout`, the flat-index bookkeeping that lets them touch only observed cells.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import gammaln

from ..dag import DAG
from ..data import MISSING, CountTensor, as_count_tensor, is_data_frame, long_table, match_dims
from ..priors import log_beta, table_concentration
from ..types import KeyLike, as_key

DEFAULT_MAX_CONFIGS = 100_000


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a positive number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return value


class Table(NamedTuple):
    """One Dirichlet-distributed conditional probability table θ_{n|pa(n)}.

    Tied nodes (Cemgil et al. 2019 App. E) share one table; ``members`` lists them with their parents.
    The array layout is ``(*parents, child)``: columns (conditional distributions) along the
    last axis.
    """

    name: str
    members: tuple[str, ...]
    parents: tuple[tuple[str, ...], ...]
    concentration: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.concentration.shape

    @property
    def dims(self) -> tuple[str, ...]:
        """The axis names (the first member's parents, then the first member)."""
        return (*self.parents[0], self.members[0])

    @property
    def size(self) -> int:
        return int(self.concentration.size)


def group_log_factorials(keys: np.ndarray, counts: np.ndarray) -> float:
    """Σ_g lnΓ(n_g + 1) over the totals n_g of ``counts`` grouped by equal rows of ``keys``."""
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    return float(gammaln(np.bincount(inverse.reshape(-1), weights=counts) + 1.0).sum())


class CellLayout(NamedTuple):
    """Flat indices of every (observed cell, free configuration, table member).

    The free nodes are the latent nodes plus visible nodes that are missing in some cell; their
    joint configurations are enumerated (``configs``). Table counts of all tables are kept in
    one concatenated vector (``BoundModel.flat_concentration``) and their column sums in
    another; for member m, cell u and configuration l the count index is
    ``cell_flat[m, u] + config_flat[m, l]`` and the column index is
    ``cell_col[m, u] + config_col[m, l]``. ``valid[u, l]`` is False where the configuration
    contradicts the cell's observed values (only when data have missing entries).
    ``same_table_before[m]`` lists earlier members sharing m's table (tied tables): within one
    token their increments enter m's urn probability.
    """

    free: tuple[str, ...]
    configs: np.ndarray
    cell_flat: np.ndarray
    config_flat: np.ndarray
    cell_col: np.ndarray
    config_col: np.ndarray
    valid: np.ndarray | None
    member_table: np.ndarray
    same_table_before: tuple[tuple[int, ...], ...]

    @property
    def num_configs(self) -> int:
        return int(self.configs.shape[0])

    @property
    def num_members(self) -> int:
        return int(self.member_table.shape[0])


@dataclass(frozen=True, eq=False)
class BoundModel:
    """An :class:`AllocationModel` with every cardinality and hyperparameter fixed by the data."""

    model: AllocationModel
    sizes: dict
    tables: tuple[Table, ...]
    a: float
    b: float | None
    total: int

    # -- structure ---------------------------------------------------------------------------
    @property
    def dag(self) -> DAG:
        return self.model.dag

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.model.dag.nodes

    @property
    def visible(self) -> tuple[str, ...]:
        return self.model.observed

    @property
    def latent(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if n in self.model.latent)

    @property
    def conditioned(self) -> tuple[str, ...]:
        return self.model.condition_on

    @property
    def has_total_term(self) -> bool:
        """Whether the Gamma–Poisson term Pr(T) (eq. 3.15) belongs to the evidence."""
        return not self.model.condition_on

    @property
    def members(self) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
        """(table index, child, parents) for every node that owns a table, in topological order."""
        out = []
        for t, table in enumerate(self.tables):
            out.extend((t, child, pars) for child, pars in zip(table.members, table.parents))
        order = {n: i for i, n in enumerate(self.nodes)}
        return tuple(sorted(out, key=lambda m: order[m[1]]))

    @property
    def table_starts(self) -> np.ndarray:
        return np.cumsum([0] + [t.size for t in self.tables])

    @property
    def column_starts(self) -> np.ndarray:
        return np.cumsum([0] + [t.size // t.shape[-1] for t in self.tables])

    @property
    def flat_concentration(self) -> np.ndarray:
        """All tables' concentrations, concatenated (the index space of :class:`CellLayout`)."""
        return np.concatenate([t.concentration.reshape(-1) for t in self.tables])

    @property
    def column_of(self) -> np.ndarray:
        """Column index of every entry of the concatenated table vector (columns are contiguous)."""
        return np.concatenate([
            start + np.arange(t.size) // t.shape[-1] for start, t in zip(self.column_starts, self.tables)
        ])

    @property
    def flat_column_concentration(self) -> np.ndarray:
        return np.concatenate([t.concentration.sum(-1).reshape(-1) for t in self.tables])

    def split_flat(self, flat) -> dict[str, np.ndarray]:
        """Cut a concatenated table vector (or a batch of them, leading axes kept) into tables."""
        flat = np.asarray(flat)
        starts = self.table_starts
        return {
            t.name: flat[..., starts[k] : starts[k + 1]].reshape(*flat.shape[:-1], *t.shape)
            for k, t in enumerate(self.tables)
        }

    # -- closed forms --------------------------------------------------------------------------
    def log_total_term(self) -> float:
        """log of the T-dependent normaliser: Pr(T) · T! / Γ-terms folded as in eq. 3.11.

        Unconditioned: a log b − (a+T) log(b+1) + lnΓ(a+T) − lnΓ(a) (the Gamma–Poisson part of
        eq. 3.11). Conditioned totals contribute no such term.
        """
        if not self.has_total_term:
            return 0.0
        a, b, T = self.a, self.b, self.total
        return float(a * np.log(b) - (a + T) * np.log1p(b) + gammaln(a + T) - gammaln(a))

    def table_counts(self, cells: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
        """Family counts S_fa of each table from full cells ``(n, len(nodes))`` and counts."""
        cells = np.asarray(cells, dtype=np.int64)
        counts = np.asarray(counts)
        pos = {n: i for i, n in enumerate(self.nodes)}
        out = []
        for table in self.tables:
            acc = np.zeros(table.shape, dtype=counts.dtype if counts.dtype.kind == "f" else np.int64)
            for child, pars in zip(table.members, table.parents):
                idx = tuple(cells[:, pos[p]] for p in pars) + (cells[:, pos[child]],)
                np.add.at(acc, idx, counts)
            out.append(acc)
        return out

    def log_prob_cells(self, cells: np.ndarray, counts: np.ndarray) -> float:
        """log π(S) (eq. 3.11) for the allocation with the given full cells and counts.

        Under ``condition_on`` it is log π(S | S_C): the conditioned cells' multinomial
        coefficients replace Pr(T) · T!.
        """
        cells = np.asarray(cells, dtype=np.int64).reshape(-1, len(self.nodes))
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        value = self.log_total_term()
        for table, cnt in zip(self.tables, self.table_counts(cells, counts)):
            value += log_beta(table.concentration + cnt) - log_beta(table.concentration)
        value -= gammaln(counts + 1.0).sum()
        if self.conditioned:
            value += group_log_factorials(cells[:, [self.nodes.index(c) for c in self.conditioned]], counts)
        return float(value)

    def conditioned_log_factorials(self, data: CountTensor) -> float:
        """Σ_c lnΓ(n_c + 1) over the token totals n_c of the conditioned cells of ``data``; 0
        without ``condition_on`` (the multinomial coefficients given the totals, eq. 3.15)."""
        if not self.conditioned:
            return 0.0
        return group_log_factorials(data.indices[:, [self.visible.index(c) for c in self.conditioned]],
                                    data.counts)

    def log_data_constant(self, data: CountTensor) -> float:
        """The part of log L_X fixed by the data alone: the total-count term, the conditioned cells'
        and the multinomial coefficients (eq. 3.11, conditioned form eq. 3.15)."""
        return (self.log_total_term() - float(gammaln(data.counts + 1.0).sum())
                + self.conditioned_log_factorials(data))

    def log_prob_allocation(self, S) -> float:
        """log π(S) of a dense allocation tensor with axes in ``self.nodes`` order (eq. 3.11)."""
        S = np.asarray(S)
        expected = tuple(self.sizes[n] for n in self.nodes)
        if S.shape != expected:
            raise ValueError(
                f"S must have shape {expected} (axes {self.nodes}), got {S.shape}"
            )
        from ..data import _as_int_array

        S = _as_int_array(S, "S")
        if S.sum() != self.total:
            raise ValueError(f"S holds {S.sum()} tokens but the model was bound to T = {self.total}")
        idx = np.argwhere(S > 0)
        return self.log_prob_cells(idx, S[tuple(idx.T)])

    # -- layout for backends -------------------------------------------------------------------
    def cell_layout(self, data: CountTensor, max_configs: int = DEFAULT_MAX_CONFIGS) -> CellLayout:
        """Flat-index layout of the observed cells of ``data`` (see :class:`CellLayout`)."""
        vis_pos = {n: i for i, n in enumerate(self.visible)}
        missing_axes = (data.indices == MISSING).any(axis=0)
        free = tuple(
            n for n in self.nodes
            if n in self.model.latent or (n in vis_pos and missing_axes[vis_pos[n]])
        )
        free_sizes = [self.sizes[n] for n in free]
        num_configs = math.prod(free_sizes)
        if num_configs > max_configs:
            raise ValueError(
                f"the model has {num_configs} joint configurations of its free nodes {free} "
                f"(latent, or visible with missing entries), above max_configs={max_configs}; "
                "raise max_configs if memory allows or use a model with smaller latent spaces"
            )
        configs = (
            np.stack(np.unravel_index(np.arange(num_configs), free_sizes), axis=1)
            if free else np.zeros((1, 0), dtype=np.int64)
        )
        free_pos = {n: i for i, n in enumerate(free)}
        members = self.members
        U, L, M = data.nnz, configs.shape[0], len(members)
        cell_flat = np.zeros((M, U), np.int64)
        config_flat = np.zeros((M, L), np.int64)
        cell_col = np.zeros((M, U), np.int64)
        config_col = np.zeros((M, L), np.int64)
        tstart, cstart = self.table_starts, self.column_starts
        for m, (t, child, pars) in enumerate(members):
            axes = (*pars, child)
            sizes = [self.sizes[n] for n in axes]
            strides = np.cumprod([1] + sizes[::-1])[:-1][::-1]  # row-major strides
            cell_flat[m] += tstart[t]
            cell_col[m] += cstart[t]
            for axis, stride in zip(axes, strides):
                col_stride = stride // sizes[-1] if axis != child else 0
                if axis in free_pos:
                    val = configs[:, free_pos[axis]]
                    config_flat[m] += val * stride
                    config_col[m] += val * col_stride
                else:
                    val = data.indices[:, vis_pos[axis]]
                    cell_flat[m] += val * stride
                    cell_col[m] += val * col_stride
        valid = None
        if missing_axes.any():
            valid = np.ones((U, L), dtype=bool)
            for n in free:
                if n in vis_pos:
                    obs = data.indices[:, vis_pos[n]]
                    valid &= (obs[:, None] == MISSING) | (obs[:, None] == configs[None, :, free_pos[n]])
        member_table = np.array([t for t, _, _ in members], dtype=np.int64)
        same_before = tuple(
            tuple(k for k in range(m) if member_table[k] == member_table[m]) for m in range(M)
        )
        return CellLayout(
            free, configs, cell_flat, config_flat, cell_col, config_col, valid, member_table, same_before
        )

    def full_cells(self, data: CountTensor, layout: CellLayout) -> np.ndarray:
        """Full node coordinates ``(U, L, len(nodes))`` of every (cell, configuration) pair."""
        vis_pos = {n: i for i, n in enumerate(self.visible)}
        free_pos = {n: i for i, n in enumerate(layout.free)}
        U, L = data.nnz, layout.num_configs
        out = np.zeros((U, L, len(self.nodes)), dtype=np.int64)
        for k, n in enumerate(self.nodes):
            if n in free_pos:
                out[:, :, k] = layout.configs[None, :, free_pos[n]]
            else:
                out[:, :, k] = data.indices[:, None, vis_pos[n]]
        return out


class AllocationModel:
    """A Bayesian allocation model over a DAG of index variables (Cemgil et al. 2019 §3).

    Parameters
    ----------
    structure : str, dict, DAG or networkx.DiGraph
        The DAG, e.g. ``"r -> i; r -> j; r -> k"`` (CP/PARAFAC) or ``"k -> i; k -> j"``
        (KL-NMF/LDA).
    latent : dict[str, int]
        Cardinalities of the latent nodes; every other node is visible and takes its size from
        the data.
    observed : sequence of str, optional
        Order of the axes of unnamed data (plain arrays, sparse matrices). Data with named axes
        (CountTensor dims, xarray dims, DataFrame columns) are matched to the nodes by name.
        Default: visible nodes in order of first appearance in the structure.
    a : float
        BDeu equivalent sample size and Gamma shape of the total rate λ ~ Gamma(a, b).
    b : float, optional
        Gamma rate of λ; ``None`` means b = a / T at fit time (empirical Bayes, Cemgil et al. 2019 §3.2).
    priors : dict[str, float], optional
        Explicit symmetric Dirichlet concentrations per node (replacing BDeu for those nodes).
    tie : list of tuples of str, optional
        Groups of nodes that share one conditional table (symmetric NMF, Cemgil et al. 2019 App. E).
    condition_on : sequence of str, optional
        Visible nodes whose totals are fixed (e.g. documents in LDA); they must form an
        ancestral set. The evidence then has no Gamma–Poisson total term and the likelihood is
        multinomial given those totals.
    """

    # Collapsed Gibbs: the Pólya-urn SMC's particles collapse onto a few histories from hundreds
    # of tokens on, while Gibbs chains mix on data of any size (and ArviZ diagnoses them).
    default_method = "gibbs"

    def __init__(
        self,
        structure,
        latent: Mapping[str, int] | None = None,
        observed: Sequence[str] | None = None,
        a: float = 1.0,
        b: float | None = None,
        priors: Mapping[str, float] | None = None,
        tie: Sequence[Sequence[str]] | None = None,
        condition_on: Sequence[str] | str | None = None,
    ):
        self.dag = DAG(structure)
        self.a = _positive(a, "a")
        self.b = None if b is None else _positive(b, "b")
        self.latent = self._check_latent(latent)
        self.observed = self._check_observed(observed)
        self.priors = self._check_priors(priors)
        self.tie = self._check_tie(tie)
        self.condition_on = self._check_condition(condition_on)

    # -- validation ----------------------------------------------------------------------------
    def _check_latent(self, latent) -> dict[str, int]:
        latent = dict(latent or {})
        unknown = [n for n in latent if n not in self.dag]
        if unknown:
            raise ValueError(f"latent: node(s) {unknown} are not in the DAG {list(self.dag.nodes)}")
        out = {}
        for n, k in latent.items():
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
                raise TypeError(f"latent[{n!r}] must be an int cardinality, got {type(k).__name__}")
            if k < 1:
                raise ValueError(f"latent[{n!r}] must be at least 1, got {k}")
            out[n] = int(k)
        if len(out) == len(self.dag):
            raise ValueError("latent: every node is latent; at least one node must be visible")
        return out

    def _check_observed(self, observed) -> tuple[str, ...]:
        visible = [n for n in self.dag.order_of_appearance if n not in self.latent]
        if observed is None:
            return tuple(visible)
        observed = [observed] if isinstance(observed, str) else list(observed)
        if sorted(observed) != sorted(visible) or len(set(observed)) != len(observed):
            raise ValueError(
                f"observed must list each visible node exactly once: expected a permutation of "
                f"{visible}, got {observed}"
            )
        return tuple(observed)

    def _check_priors(self, priors) -> dict[str, float]:
        priors = dict(priors or {})
        unknown = [n for n in priors if n not in self.dag]
        if unknown:
            raise ValueError(f"priors: node(s) {unknown} are not in the DAG {list(self.dag.nodes)}")
        return {n: _positive(v, f"priors[{n!r}]") for n, v in priors.items()}

    def _check_tie(self, tie) -> tuple[tuple[str, ...], ...]:
        if not tie:
            return ()
        groups, seen = [], set()
        for group in tie:
            group = (group,) if isinstance(group, str) else tuple(group)
            if len(group) < 2:
                raise ValueError(f"tie: a group must name at least two nodes, got {group}")
            for n in group:
                self.dag._require(n)
                if n in seen:
                    raise ValueError(f"tie: node {n!r} appears in more than one group")
                seen.add(n)
            npar = {len(self.dag.parents[n]) for n in group}
            if len(npar) > 1:
                raise ValueError(f"tie: nodes {group} have different numbers of parents")
            # Sizes of visible nodes are known only at bind time, where families are compared again.
            sizes = [self.latent.get(n) for n in group]
            if len({s for s in sizes if s is not None}) > 1:
                raise ValueError(f"tie: tied nodes {group} have different sizes {sizes}")
            for k in range(npar.pop()):
                psizes = {self.latent.get(self.dag.parents[n][k]) for n in group} - {None}
                if len(psizes) > 1:
                    raise ValueError(f"tie: tied nodes {group} have parents of different sizes")
            vals = {self.priors.get(n) for n in group}
            if len(vals) > 1:
                raise ValueError(f"tie: tied nodes {group} have different explicit priors {vals}")
            groups.append(group)
        return tuple(groups)

    def _check_condition(self, condition_on) -> tuple[str, ...]:
        if condition_on is None:
            return ()
        cond = (condition_on,) if isinstance(condition_on, str) else tuple(condition_on)
        for n in cond:
            self.dag._require(n)
            if n in self.latent:
                raise ValueError(f"condition_on: {n!r} is latent; only visible nodes can be conditioned on")
            outside = [p for p in self.dag.parents[n] if p not in cond]
            if outside:
                raise ValueError(
                    f"condition_on: {n!r} has parents {outside} outside the conditioned set; "
                    "conditioned nodes must be visible roots (an ancestral set)"
                )
            if any(n in g for g in self.tie):
                raise ValueError(f"condition_on: {n!r} is tied; conditioned nodes have no table")
        return cond

    # -- binding -------------------------------------------------------------------------------
    def as_data(self, data) -> CountTensor:
        """Validate ``data`` for this model and return it as a :class:`CountTensor`.

        Every backend reads its data through this method, so a preset whose natural input is not a
        dense count tensor (categorical samples, say) converts it in one place. Named axes
        (CountTensor dims, xarray dims, the columns of a long-format DataFrame) are matched to the
        visible nodes by name (:func:`~bam_ppl.data.match_dims`); unnamed axes follow ``observed``.
        """
        if is_data_frame(data):
            return long_table(data, self.observed)
        return match_dims(as_count_tensor(data), self.observed)

    def visible_sizes(self, shape) -> dict[str, int]:
        shape = tuple(int(s) for s in shape)
        if len(shape) != len(self.observed):
            raise ValueError(
                f"X has {len(shape)} axes but the model has {len(self.observed)} visible nodes "
                f"{self.observed}; expected a {len(self.observed)}-way tensor"
            )
        return dict(zip(self.observed, shape))

    def bind(self, data=None, *, shape=None, total: int | None = None) -> BoundModel:
        """Fix every cardinality and b from ``data`` (or from ``shape`` and ``total``)."""
        if data is not None:
            data = self.as_data(data)
            shape, total = data.shape, data.total
        if shape is None:
            raise ValueError("bind needs data or a shape for the visible nodes")
        sizes = {**self.visible_sizes(shape), **self.latent}
        sizes = {n: sizes[n] for n in self.dag.nodes}
        b = self.b
        if b is None and not self.condition_on:
            if total is None or total <= 0:
                raise ValueError(
                    "b=None sets b = a / T from the data, but T = "
                    f"{total}; pass data with at least one token, or total= (T) with shape=, "
                    "or set b explicitly"
                )
            b = self.a / total
        return BoundModel(self, sizes, self._tables(sizes), self.a, b, int(total or 0))

    def _tables(self, sizes) -> tuple[Table, ...]:
        tied = {n: g for g in self.tie for n in g}
        tables, done = [], set()
        for n in self.dag.nodes:
            if n in self.condition_on or n in done:
                continue
            group = tied.get(n, (n,))
            fams = [tuple(sizes[u] for u in self.dag.family(m)) for m in group]
            if len({f for f in fams}) > 1:
                raise ValueError(f"tie: tied nodes {group} have families of different sizes {fams}")
            conc = table_concentration(self.a, fams, self.priors.get(n))
            name = "_".join(group)
            tables.append(Table(name, group, tuple(self.dag.parents[m] for m in group), conc))
            done.update(group)
        return tuple(tables)

    # -- closed forms and draws ----------------------------------------------------------------
    def log_prob_allocation(self, S, *, b: float | None = None) -> float:
        """Closed-form log π(S) of a dense allocation tensor (Cemgil et al. 2019 eq. 3.11).

        ``S`` has one axis per node in topological order (``self.dag.nodes``). With ``b=None``
        and no ``b`` on the model, b = a / S_+.
        """
        S = np.asarray(S)
        if S.ndim != len(self.dag.nodes):
            raise ValueError(f"S must have {len(self.dag.nodes)} axes {self.dag.nodes}, got {S.ndim}")
        vis_shape = tuple(S.shape[self.dag.nodes.index(n)] for n in self.observed)
        model = self if b is None else self.replace(b=b)
        bound = model.bind(shape=vis_shape, total=int(np.asarray(S).sum()))
        return bound.log_prob_allocation(S)

    def replace(self, **changes) -> AllocationModel:
        """A copy with some constructor arguments changed."""
        kwargs = dict(
            structure=self.dag, latent=self.latent, observed=self.observed, a=self.a, b=self.b,
            priors=self.priors, tie=self.tie or None, condition_on=self.condition_on or None,
        )
        kwargs.update(changes)
        return type(self)(**kwargs) if type(self) is AllocationModel else AllocationModel(**kwargs)

    def sample(self, rng_key: KeyLike, shape=None, total=None):
        """Draw (S, X): an allocation tensor and its visible contraction X = S_V.

        ``shape`` gives the visible sizes (in ``observed`` order). ``total`` is the number of
        tokens T; without it T ~ Poisson(λ), λ ~ Gamma(a, b), which needs ``b``. Under
        ``condition_on`` it is the token count of every conditioned cell (an int, or an array
        over the conditioned nodes). S has one axis per node in ``self.dag.nodes`` order.
        """
        from .sampling import sample_allocation

        return sample_allocation(self, as_key(rng_key), shape, total)

    def numpyro_model(self):
        """The model as a NumPyro program ``program(X=None, *, shape=None)``.

        λ ~ Gamma(a, b) and every table column ~ Dirichlet; X ~ Poisson(λ p(i_V)) on the
        nonzero cells plus the closed-form zero-cell term (the cell probabilities sum to one), or
        the multinomial given the conditioned totals. With ``X=None`` it draws a dense X of the
        given ``shape``. Works with NUTS, SVI, Predictive and ``numpyro.render_model``.
        """
        from .program import make_program

        return make_program(self)

    # -- misc ------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        parts = [repr(str(self.dag)), f"latent={self.latent}", f"a={self.a:g}"]
        if self.b is not None:
            parts.append(f"b={self.b:g}")
        if self.priors:
            parts.append(f"priors={self.priors}")
        if self.tie:
            parts.append(f"tie={list(self.tie)}")
        if self.condition_on:
            parts.append(f"condition_on={self.condition_on}")
        return f"AllocationModel({', '.join(parts)})"
