"""Read a NumPyro program and recognise the Bayesian allocation model it writes.

:func:`from_numpyro` traces a user's model function (``numpyro.handlers.trace``, ``seed`` and
``substitute``) and reads two forms of Dirichlet–categorical program:

* **token form** — ``Dirichlet`` table sites, then a plate of tokens whose ``Categorical``
  sites (latent or observed) take their probabilities from a table gathered by other index sites,
  by plate positions or by data arrays (``theta[doc]``, ``phi[z]``, ``core[r1, r2]``);
* **count form** — ``Dirichlet`` tables and one observed count site over cells: ``Poisson`` with
  rate ``lam * p`` where ``lam ~ Gamma(a, b)`` (the BAM of Cemgil et al. 2019 eq. 3.3–3.4), or
  ``Multinomial`` with fixed totals per row (conditioned totals, eq. 3.15).

How a site's probabilities depend on the tables is read by substitution rather than by parsing
the program text: in the token form every table entry is replaced by a distinct integer tag, so a
site's probabilities name the table entries they were gathered from, and index sites are replaced
by random values, so the gathered coordinates show which index each one follows. In the count form
the candidate DAGs that fit the table shapes are tried in turn and the one whose cell
probabilities equal the program's, for random tables, is kept. Anything else is refused with a
ValueError that names the site.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy.special import gammaln

from ..data import MISSING, CountTensor
from ..models.allocation import AllocationModel
from .numpyro_trace import mask_of as _mask_of
from .numpyro_trace import sites as _sites
from .numpyro_trace import trace as _trace
from .numpyro_trace import unwrap as _unwrap

_NUM_PROBES = 3
_QUICK_HYPOTHESES = 2_000  # tried before the Jacobian that prunes the search is computed
_MAX_HYPOTHESES = 50_000


@dataclass(frozen=True)
class ProgramInfo:
    """What :func:`from_numpyro` read from the program (attached as ``model.program_info``).

    Attributes
    ----------
    form : str
        ``"tokens"`` (Categorical sites in a plate of tokens), ``"poisson"`` (counts with a Gamma
        total rate) or ``"multinomial"`` (counts with fixed totals per row).
    nodes : dict
        Every node of the model → what it was read from (a Categorical site, a plate position, a
        data argument, an axis of the count site, a latent index summed in it).
    tables : dict
        Dirichlet site name → the nodes whose conditional table it is (two or more: tied).
    evidence_of : str
        What ``bam.log_evidence(model, data)`` is the probability of (always the count table:
        bam_ppl's convention, Cemgil et al. 2019 eq. 3.11 / 3.15).
    log_sequence_offset : float
        log of the multinomial coefficient that turns the count table's probability into the
        probability of the program's token sequence: ``log p(tokens) = evidence - offset``
        (token form only; 0.0 for count forms, whose observed site *is* the count table).
    """

    form: str
    nodes: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)
    evidence_of: str = "count table"
    log_sequence_offset: float = 0.0



def _number(value) -> float:
    """A scalar parameter as a float; a float32 one as its shortest decimal (0.3, not 0.30000001)."""
    value = np.asarray(value)
    if value.dtype == np.float32:
        return float(np.format_float_positional(value.reshape(-1)[0], unique=True))
    return float(value.reshape(-1)[0])


def _table_concentration(tr, name) -> float:
    site = tr[name]
    raw = np.asarray(_unwrap(site["fn"]).concentration)
    conc = np.broadcast_to(raw, np.shape(site["value"]))
    if not np.all(conc == conc.reshape(-1)[0]):
        raise ValueError(f"site {name!r}: an asymmetric Dirichlet concentration; the allocation model "
                         "takes one symmetric concentration per table")
    return _number(conc)


def _check_constant_priors(base, probe, tables):
    for name in tables:
        a = np.asarray(_unwrap(base[name]["fn"]).concentration)
        b = np.asarray(_unwrap(probe[name]["fn"]).concentration)
        if a.shape != b.shape or not np.array_equal(a, b):
            raise ValueError(f"site {name!r}: the Dirichlet concentration depends on other sites; "
                             "it must be a constant")


def _unique(name: str, taken: set) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    return out


# -- concentrations ------------------------------------------------------------------------------
def _priors(members: dict, sizes: dict, parents: dict, conc: dict, a_hint=None):
    """BDeu ``a`` if every table's constant is a contraction of one base measure (Cemgil et al. 2019
    eq. 3.3, tied tables summing their members, App. E), else explicit concentrations per node."""
    implied = []
    for t, nodes in members.items():
        fam = [math.prod(sizes[u] for u in (*parents[n], n)) for n in nodes]
        implied.append(conc[t] / sum(1.0 / f for f in fam))
    a = a_hint if a_hint is not None else float(f"{implied[0]:.12g}")
    if all(math.isclose(x, a, rel_tol=1e-6) for x in implied):
        return a, None
    return (a_hint if a_hint is not None else 1.0), {n: conc[t] for t, nodes in members.items() for n in nodes}


# -- token form ----------------------------------------------------------------------------------
_FULL_CHECK = 1024  # elements whose whole probability vector is compared with the table column


def _gathered(tr, name, offsets, shapes, table_names):
    """Decode which table and which coordinates each element of index site ``name`` gathers.

    Every element's first and last probabilities are decoded, and the whole vector of up to
    :data:`_FULL_CHECK` of them, so the check costs O(elements) beside what the program computes.
    """
    site = tr[name]
    batch = np.shape(site["value"])
    probs = np.asarray(_unwrap(site["fn"]).probs)
    K = probs.shape[-1]
    first = np.broadcast_to(probs[..., 0], batch).astype(np.float64) - 1.0
    last = np.broadcast_to(probs[..., -1], batch).astype(np.float64) - 1.0
    some = np.broadcast_to(probs, (*batch, K)).reshape(-1, K)[:_FULL_CHECK].astype(np.float64) - 1.0
    total = offsets[-1]
    if not all(np.all(v == np.round(v)) and np.all((v >= 0) & (v < total)) for v in (first, last, some)):
        raise ValueError(
            f"site {name!r}: its probabilities are not a column of a Dirichlet table gathered by "
            f"indices (table[...]); expected e.g. Categorical(theta[doc]) or Categorical(phi[z]) "
            f"with tables {table_names}")
    first = first.astype(np.int64)
    which = np.searchsorted(offsets, first, side="right") - 1
    t = int(which.reshape(-1)[0])
    if not np.all(which == t):
        raise ValueError(f"site {name!r}: its probabilities mix entries of several tables; expected "
                         "one table gathered by indices")
    shape = shapes[t]
    if shape[-1] != K:
        raise ValueError(f"site {name!r}: has {K} categories but table {table_names[t]!r} has "
                         f"{shape[-1]}; expected a whole column of the table")
    # A column is contiguous in the flat table: entry k of the column sits k after its first.
    expected = first.reshape(-1)[: len(some), None] + np.arange(K)
    coords = np.unravel_index(first - offsets[t], shape)
    if (not np.all(coords[-1] == 0) or not np.array_equal(last, first + K - 1)
            or not np.array_equal(some, expected)):
        raise ValueError(f"site {name!r}: its probabilities are not one column of table "
                         f"{table_names[t]!r} (the last, category axis must be kept whole)")
    return t, list(coords[:-1]), batch


def _argument_names(model_fn, args, kwargs):
    """The program's array arguments by parameter name (a data index is named after its argument)."""
    try:
        bound = inspect.signature(model_fn).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in bound.arguments.items() if hasattr(v, "shape") or isinstance(v, (list, tuple))}


class _TokenProbes(NamedTuple):
    """The index sites of a token program and the probe traces they are read from."""

    tr: dict  # the trace with stand-in values
    index: list  # Categorical index sites
    latent: list  # the latent ones among them, set at random in each probe
    tables: list  # Dirichlet table sites
    shapes: list  # each table's shape
    offsets: np.ndarray  # where each table's tags start in the flat range of tags
    K: dict  # index site -> number of categories
    probes: list  # (probe trace, index site -> its values) per probe
    grid: tuple  # the token grid every index site spans
    plates: dict  # plate dim -> plate name
    masks: dict  # index site -> mask of its observed entries, or None
    arguments: dict  # the program's array arguments by parameter name


class _Coordinates(NamedTuple):
    """Data indices read so far (conditioned nodes), where each node came from, names in use."""

    values: dict  # data index -> its values over the token grid
    sizes: dict  # data index -> its number of categories
    sources: dict  # node -> what it was read from
    taken: set


def _token_form(model_fn, args, kwargs, tr, kinds):
    """(model, data, info) of a program whose observed sites are Categorical tokens.

    Tables are tagged, latent index sites set at random in each probe; a table axis gathered by
    the values of an index site makes that site a parent, one gathered by a fixed data index
    (plate position, argument) a conditioned visible node, one gathered at a fixed position a
    slice that is a table of its own.
    """
    p = _token_probes(model_fn, args, kwargs, tr, kinds)
    sources = {s: f"{'observed' if tr[s]['is_observed'] else 'latent'} Categorical site {s!r}" for s in p.index}
    coords = _Coordinates({}, {}, sources, set(p.index) | set(p.tables))
    parents, table_of, base_of = _read_tables(p, coords)
    sizes = {**coords.sizes, **{s: p.K[s] for s in p.index}}
    members = {t: [s for s in p.index if table_of[s] == t] for t in base_of}
    conc = {t: _table_concentration(tr, base) for t, base in base_of.items()}
    cond = list(coords.values)
    if not cond:
        # A plate of fixed size: the token total is fixed, not Gamma–Poisson. A one-cell conditioned
        # node states that (eq. 3.15) without changing any table.
        total = _unique(p.plates.get(-1, "tokens"), coords.taken)
        cond, coords.values[total], sizes[total] = [total], np.zeros(p.grid, np.int64), 1
        coords.sources[total] = "the fixed number of tokens (one cell)"
    a, priors = _priors(members, sizes, parents, conc)
    # obs_mask splits site x into x_observed and x_unobserved; the node keeps the name x.
    name = {s: s[: -len("_observed")] if p.masks[s] is not None and s.endswith("_observed")
            and tr.get(s[: -len("_observed")], {}).get("type") == "deterministic" else s for s in p.index}
    rename = {**{c: c for c in cond}, **name}
    observed_sites = [s for s in p.index if tr[s]["is_observed"]]
    visible = cond + [name[s] for s in observed_sites]
    structure = {**{c: [] for c in cond}, **{name[s]: [rename[u] for u in parents[s]] for s in p.index}}
    members = {t: [name[s] for s in m] for t, m in members.items()}
    priors = None if priors is None else {rename[n]: v for n, v in priors.items()}
    sources = {rename.get(n, n): v for n, v in coords.sources.items()}
    model = AllocationModel(
        structure, latent={name[s]: p.K[s] for s in p.latent}, observed=visible, a=a, priors=priors,
        tie=[tuple(m) for m in members.values() if len(m) > 1] or None, condition_on=cond)
    data, offset = _token_data(p, coords, sizes, cond, observed_sites, visible)
    return model, data, ProgramInfo("tokens", sources, members, log_sequence_offset=offset)


def _token_probes(model_fn, args, kwargs, tr, kinds) -> _TokenProbes:
    """Trace the program with tagged tables and random latent index values, :data:`_NUM_PROBES` times."""
    tables, index = kinds["table"], kinds["index"]
    shapes = [tuple(np.shape(tr[t]["value"])) for t in tables]
    offsets = np.cumsum([0] + [math.prod(s) for s in shapes])
    tags = {t: (offsets[k] + np.arange(math.prod(shapes[k])) + 1.0).reshape(shapes[k])
            for k, t in enumerate(tables)}
    K = {s: int(np.shape(_unwrap(tr[s]["fn"]).probs)[-1]) for s in index}
    latent = [s for s in index if not tr[s]["is_observed"]]
    rng = np.random.default_rng(0)
    probes = []
    for _ in range(_NUM_PROBES):
        values = {s: rng.integers(0, K[s], size=np.shape(tr[s]["value"])).astype(np.int32) for s in latent}
        ptr = _trace(model_fn, args, kwargs, {**tags, **values})
        _check_constant_priors(tr, ptr, tables)
        probes.append((ptr, {s: np.asarray(ptr[s]["value"]) for s in index}))
    masks = {s: _mask_of(tr[s]) for s in index}
    grid = _token_grid(tr, index)
    plates = {f.dim: f.name for s in index for f in tr[s]["cond_indep_stack"]}
    return _TokenProbes(tr, index, latent, tables, shapes, offsets, K, probes, grid, plates, masks,
                        _argument_names(model_fn, args, kwargs))


def _token_grid(tr, index) -> tuple:
    """The shape of the tokens, which every index site spans in the same plates."""
    grid = np.broadcast_shapes(*[np.shape(tr[s]["value"]) for s in index])
    for s in index:
        if tuple(np.shape(tr[s]["value"])) != tuple(grid):
            raise ValueError(
                f"site {s!r}: batch shape {np.shape(tr[s]['value'])} but the tokens (the other index "
                f"sites) have shape {grid}; every Categorical index site needs one value per token "
                "(put it in the same plates)")
    frames = {s: {f.name for f in tr[s]["cond_indep_stack"]} for s in index}
    for s in index:
        if frames[s] != frames[index[0]]:
            # Equal shapes in different plates are different tokens; pairing them would be a guess.
            raise ValueError(
                f"site {s!r}: in plates {sorted(frames[s])} but site {index[0]!r} is in plates "
                f"{sorted(frames[index[0]])}; every Categorical index site of a token must be in the "
                "same plates")
    return grid


def _read_tables(p: _TokenProbes, coords: _Coordinates):
    """Each index site's parents and table (or fixed slice of one), and each table's base site."""
    parents: dict[str, list[str]] = {}
    table_of: dict[str, str] = {}  # site -> its table, or a fixed slice of one
    base_of: dict[str, str] = {}
    for s in p.index:
        parents[s], table_of[s], base_of_s = _site_table(p, s, coords)
        base_of[table_of[s]] = base_of_s
    used = set(base_of.values())
    unused = [t for t in p.tables if t not in used]
    if unused:
        raise ValueError(f"site {unused[0]!r}: a Dirichlet table that no Categorical site gathers from")
    return parents, table_of, base_of


def _site_table(p: _TokenProbes, s: str, coords: _Coordinates):
    """(parents, table or slice name, table site) of index site ``s``, from what it gathers."""
    decoded = [_gathered(ptr, s, p.offsets, p.shapes, p.tables) for ptr, _ in p.probes]
    t = decoded[0][0]
    if any(d[0] != t for d in decoded):
        raise ValueError(f"site {s!r}: the table it gathers from changes with the index values; "
                         "expected one table per site")
    pars, sliced = [], {}
    for axis in range(len(p.shapes[t]) - 1):
        col = [np.broadcast_to(d[1][axis], p.grid) for d in decoded]
        source = _axis_source(p, s, t, axis, col, coords)
        if source is None:
            # One fixed slice (phi[j] in a loop over features): an independent table of its own.
            sliced[axis] = int(col[0].reshape(-1)[0])
            continue
        if p.masks.get(source) is not None:
            raise ValueError(f"site {s!r}: gathers by the masked site {source!r}; a site with "
                             "missing entries cannot index a table")
        pars.append(source)
    name = p.tables[t] if not sliced else "{}[{}]".format(p.tables[t], ", ".join(
        str(sliced[k]) if k in sliced else ":" for k in range(len(p.shapes[t]) - 1)))
    return pars, name, p.tables[t]


def _axis_source(p: _TokenProbes, s, t, axis, col, coords: _Coordinates) -> str | None:
    """The node that axis ``axis`` of table ``t`` follows where site ``s`` gathers it (``col``: its
    coordinates in each probe): another index site, or a data index added to ``coords``; None for
    one fixed position."""
    source = next((u for u in p.index if u != s and all(
        np.array_equal(c, np.broadcast_to(v[u], p.grid)) for c, (_, v) in zip(col, p.probes))), None)
    if source is not None:
        return source
    if not all(np.array_equal(c, col[0]) for c in col):
        raise ValueError(
            f"site {s!r}: axis {axis} of table {p.tables[t]!r} is indexed by a value computed "
            "from the latent sites, not by one index site; expected table[z] with z a "
            "Categorical site (or a data array, or a plate position)")
    source = _coordinate(col[0], p.grid, p.plates, p.arguments, coords.values, coords.taken, coords.sources)
    if source is None and np.all(col[0] == col[0].reshape(-1)[0]):
        return None
    if source is None:
        source = _unique(f"{p.tables[t]}_axis{axis}", coords.taken)
        coords.sources[source] = f"data index of axis {axis} of {p.tables[t]!r}"
    coords.values[source] = col[0]
    coords.sizes[source] = p.shapes[t][axis]
    coords.taken.add(source)
    return source


def _token_data(p: _TokenProbes, coords: _Coordinates, sizes, cond, observed_sites, visible):
    """The tokens' count table, and the log multinomial coefficient of its counts given the
    conditioned totals (:attr:`ProgramInfo.log_sequence_offset`)."""

    def observed_values(s):
        value = np.broadcast_to(np.asarray(p.tr[s]["value"]), p.grid)
        return value if p.masks[s] is None else np.where(p.masks[s], value, MISSING)

    tokens = np.stack([np.broadcast_to(coords.values[c], p.grid).reshape(-1) for c in cond]
                      + [observed_values(s).reshape(-1) for s in observed_sites], axis=1)
    data = CountTensor.from_tokens(tokens, tuple(sizes[c] for c in cond) + tuple(p.K[s] for s in observed_sites),
                                   dims=visible)
    cond_totals = np.bincount(np.ravel_multi_index(tokens[:, : len(cond)].T, [sizes[c] for c in cond]))
    offset = float(gammaln(cond_totals + 1.0).sum() - gammaln(data.counts + 1.0).sum())
    return data, offset


def _coordinate(values, grid, plates, arg_arrays, known, taken, sources) -> str | None:
    """Name the data index ``values`` (over the token grid): a known one, a plate, an argument, or
    None; a new name's origin is written to ``sources``."""
    for name, v in known.items():
        if np.array_equal(v, values):
            return name
    for dim, plate in plates.items():
        axis = len(grid) + dim
        if 0 <= axis < len(grid):
            pos = np.arange(grid[axis]).reshape((-1,) + (1,) * (len(grid) - axis - 1))
            if np.array_equal(np.broadcast_to(pos, grid), values) and plate not in taken:
                sources[plate] = f"position in plate {plate!r}"
                return plate
    for arg, v in arg_arrays.items():
        v = np.asarray(v)
        try:
            if np.array_equal(np.broadcast_to(v, grid), values) and arg not in taken:
                sources[arg] = f"argument {arg!r}"
                return arg
        except ValueError:
            continue
    return None


# -- count form ------------------------------------------------------------------------------------
class _CountSite(NamedTuple):
    """The program, its observed count site and the tables its cell probabilities are read from."""

    model_fn: Callable
    args: tuple
    kwargs: dict
    tr: dict  # the trace with stand-in values
    kinds: dict  # site kind -> site names (:func:`_sites`)
    name: str  # the count site
    X: np.ndarray  # its counts
    tables: list  # Dirichlet table sites
    shapes: list  # each table's shape
    multinomial: bool  # Multinomial counts (else Poisson)


class _Cells(NamedTuple):
    """The count site's axes as nodes."""

    names: list  # a node per axis
    free: list  # the axes a table owns (all but the conditioned rows of Multinomial counts)
    sizes: dict  # node -> size of its axis


def _count_form(model_fn, args, kwargs, tr, kinds):
    """(model, data, info) of a program whose observed site is a Poisson or Multinomial count."""
    site_name = (kinds["multinomial"] or kinds["poisson"])[0]
    X = np.asarray(tr[site_name]["value"])
    if X.ndim < 1:
        raise ValueError(f"site {site_name!r}: a scalar count; expected counts over cells of indices")
    shapes = [tuple(np.shape(tr[t]["value"])) for t in kinds["table"]]
    c = _CountSite(model_fn, args, kwargs, tr, kinds, site_name, X, kinds["table"], shapes,
                   bool(kinds["multinomial"]))
    probes = _count_probes(c)
    rate_a, rate_b = _total_rate(c, probes[0])
    cells, taken = _cell_axes(c)
    members, parents, latent = _find_dag(c, cells, probes)
    rename = _latent_names(tr, members, c.shapes, c.tables, parents, latent, taken | set(cells.names))
    members = {t: [rename.get(n, n) for n in m] for t, m in members.items()}
    parents = {rename.get(n, n): [rename.get(p, p) for p in ps] for n, ps in parents.items()}
    latent = {rename.get(n, n): k for n, k in latent.items()}
    conc = {t: _table_concentration(tr, t) for t in c.tables}
    all_sizes = {**cells.sizes, **latent}
    a, priors = _priors(members, all_sizes, parents, conc, a_hint=rate_a)
    cond = cells.names[:-1] if c.multinomial else []
    structure = {**{n: [] for n in cond}, **{n: parents[n] for m in members.values() for n in m}}
    model = AllocationModel(
        structure, latent=latent, observed=cells.names, a=a, b=rate_b, priors=priors,
        tie=[tuple(m) for m in members.values() if len(m) > 1] or None, condition_on=cond or None)
    data = CountTensor.from_dense(c.X, dims=cells.names)
    sources = {**{n: f"{c.name} axis {k}" for k, n in enumerate(cells.names)},
               **{n: f"latent, summed in {c.name}" for n in latent}}
    info = ProgramInfo("multinomial" if c.multinomial else "poisson", sources, members)
    return model, data, info


def _cell_probabilities(c: _CountSite, values, rate=1.0):
    """The count site's cell probabilities (Multinomial) or rates (Poisson) at table ``values``."""
    extra = {c.kinds["rate"][0]: np.float64(rate)} if c.kinds["rate"] else {}
    ptr = _trace(c.model_fn, c.args, c.kwargs, {**values, **extra})
    _check_constant_priors(c.tr, ptr, c.tables)
    fn = _unwrap(ptr[c.name]["fn"])
    out = fn.probs if c.multinomial else fn.rate
    return np.broadcast_to(np.asarray(out, dtype=np.float64), c.X.shape)


def _count_probes(c: _CountSite) -> list:
    """(random tables, the cell probabilities they give) for each of :data:`_NUM_PROBES` probes."""
    rng = np.random.default_rng(0)
    probes = []
    for _ in range(_NUM_PROBES):
        values = {t: rng.uniform(0.5, 1.5, size=s) for t, s in zip(c.tables, c.shapes)}
        probes.append((values, _cell_probabilities(c, values)))
    return probes


def _total_rate(c: _CountSite, probe):
    """(a, b) of the Gamma total rate of Poisson counts, checked to scale the cell rates; (None,
    None) for Multinomial counts, whose totals must be the observed row totals."""
    if c.multinomial:
        fn = _unwrap(c.tr[c.name]["fn"])
        n = np.broadcast_to(np.asarray(fn.total_count), c.X.shape[:-1])
        if not np.array_equal(n, c.X.sum(-1)):
            raise ValueError(f"site {c.name!r}: total_count differs from the observed row totals")
        return None, None
    if not c.kinds["rate"]:
        raise ValueError(f"site {c.name!r}: Poisson counts need a total rate lam ~ Gamma(a, b) "
                         "with rate = lam * p (Cemgil et al. 2019 eq. 3.3); none found")
    rate_site = c.kinds["rate"][0]
    if np.shape(c.tr[rate_site]["value"]) != ():
        raise ValueError(f"site {rate_site!r}: the total rate must be a scalar")
    doubled = _cell_probabilities(c, probe[0], rate=2.0)
    if not np.allclose(doubled, 2.0 * probe[1], rtol=1e-5):
        raise ValueError(f"site {c.name!r}: its rate is not lam * p with lam = {rate_site!r}")
    g = _unwrap(c.tr[rate_site]["fn"])
    return _number(g.concentration), _number(g.rate)


def _cell_axes(c: _CountSite):
    """The count site's axes named after their plates (or ``X_0``, ``X_1``, ...), and the names taken."""
    X, multinomial = c.X, c.multinomial
    plates = {f.dim: f.name for f in c.tr[c.name]["cond_indep_stack"]}
    taken = set(c.tables) | set(c.kinds["rate"]) | {c.name}
    names = []
    for axis in range(X.ndim):
        dim = axis - (X.ndim - 1 if multinomial else X.ndim)  # plates index the batch axes
        name = plates.get(dim) if not (multinomial and axis == X.ndim - 1) else None
        names.append(_unique(name or f"{c.name}_{axis}", taken))
        taken.add(names[-1])
    free = names[-1:] if multinomial else names
    return _Cells(names, free, dict(zip(names, X.shape))), taken


def _find_dag(c: _CountSite, cells: _Cells, probes):
    """(members, parents, latent) of the DAG that gives the program's cell probabilities."""
    try:
        return _search(c, cells, probes, {}, _QUICK_HYPOTHESES)
    except _TooMany:
        # Many equal sizes: settle the cell axes by the derivative pattern, then search again.
        forced = _forced_axes(c, cells, probes[0][0])
        try:
            return _search(c, cells, probes, forced, _MAX_HYPOTHESES)
        except _TooMany:
            raise ValueError(f"site {c.name!r}: more than {_MAX_HYPOTHESES} candidate DAGs fit the "
                             "table shapes; use distinct sizes or the token form") from None


def _latent_names(tr, members, shapes, tables, parents, latent, taken) -> dict:
    """A latent node named after the plate its child tables are batched over (``rank`` rather than
    ``pi`` in ``with plate("rank", R): W = sample(...)``), where there is one."""
    rename = {}
    for table, children in members.items():
        batch = shapes[tables.index(table)][:-1]
        plates = {f.dim: f.name for f in tr[table]["cond_indep_stack"]}
        for child in children:
            for axis, parent in enumerate(parents[child]):
                plate = plates.get(axis - len(batch))
                if parent in latent and parent not in rename and plate and plate not in taken:
                    rename[parent] = plate
                    taken = taken | {plate}
    return rename


def _forced_axes(c: _CountSite, cells: _Cells, values):
    """Table axes that follow one cell axis: {(table, axis): cell name}.

    Where a table axis is a cell axis, the derivative of cell u's probability is nonzero only at
    entries whose coordinate on that axis equals u's; a latent axis shows no such pattern (it is
    summed). One reverse-mode Jacobian at random tables settles every such axis, so the search
    below only pairs latent axes. A program that cannot be differentiated gets no forced axes.
    """
    import jax
    import jax.numpy as jnp

    tables, cell_shape = c.tables, c.X.shape
    rate = {c.kinds["rate"][0]: np.float64(1.0)} if c.kinds["rate"] else {}

    def probabilities(*vals):
        ptr = _trace(c.model_fn, c.args, c.kwargs, {**dict(zip(tables, vals)), **rate})
        fn = _unwrap(ptr[c.name]["fn"])
        return jnp.broadcast_to(fn.probs if c.multinomial else fn.rate, cell_shape)

    try:
        with jax.enable_x64(True):
            jac = jax.jacrev(probabilities, argnums=tuple(range(len(tables))))(
                *[jnp.asarray(values[t], dtype=jnp.float64) for t in tables])
    except Exception:  # noqa: BLE001 (any failure only means no pruning)
        return {}
    forced = {}
    for k, J in enumerate(jac):
        nonzero = np.nonzero(np.asarray(J) != 0)
        at_cell, at_entry = nonzero[: len(cell_shape)], nonzero[len(cell_shape):]
        for axis, size in enumerate(c.shapes[k]):
            hits = [n for i, n in enumerate(cells.names)
                    if size > 1 and cells.sizes[n] == size and len(at_entry[axis])
                    and np.array_equal(at_entry[axis], at_cell[i])]
            if len(hits) == 1:
                forced[(k, axis)] = hits[0]
    return forced


class _TooMany(Exception):
    """More candidate DAGs than the search was allowed to try."""


def _search(c: _CountSite, cells: _Cells, probes, forced, limit):
    """The DAG whose cell probabilities Σ_latent ∏ θ equal the program's for every probe.

    Each table owns one latent node or one or more free cell axes (several: tied tables); its
    batch axes are its parents, matched to nodes of the same size. Axes in ``forced`` follow
    their cell axis; the others are latent (or tied), and candidates are tried in turn.
    """
    tables, shapes = c.tables, c.shapes
    tried = 0
    for owners in _ownerships(tables, shapes, cells.free, cells.sizes, forced):
        # A latent node takes the name of the table that owns it (``pi`` in ``k ~ Categorical(pi)``).
        latent = {t: shapes[k][-1] for k, t in enumerate(tables) if owners[k] is None}
        owned = {k: ([t] if owners[k] is None else list(owners[k])) for k, t in enumerate(tables)}
        node_sizes = {**cells.sizes, **latent}
        choices = []
        for k in range(len(tables)):
            for child in owned[k]:
                batch = shapes[k][:-1]
                options = [[forced[(k, a)]] if (k, a) in forced else
                           [n for n in node_sizes if n != child and node_sizes[n] == b
                            and (n in latent or b == 1 or not forced)]
                           for a, b in enumerate(batch)]
                choices.append([(k, child, p) for p in itertools.product(*options) if len(set(p)) == len(p)])
        for assignment in itertools.product(*choices):
            tried += 1
            if tried > limit:
                raise _TooMany
            parents = {child: list(p) for _, child, p in assignment}
            if not _acyclic(parents):
                continue
            if all(np.allclose(_einsum(assignment, tables, node_sizes, cells.names, values), target,
                               rtol=1e-6, atol=0) for values, target in probes):
                members = {t: list(owned[k]) for k, t in enumerate(tables)}
                return members, parents, latent
    raise ValueError(
        f"site {c.name!r}: its cell probabilities are not Σ over latent indices of a product of "
        f"Dirichlet table entries over tables {tables}; expected e.g. "
        "lam * jnp.einsum('k,ki,kj->ij', pi, W, H) (Cemgil et al. 2019 eq. 3.4)")


def _ownerships(tables, shapes, free_cells, sizes, forced):
    """Every way for the tables to own the free cell axes (each exactly once) or a latent node."""
    options = []
    for k in range(len(tables)):
        last = len(shapes[k]) - 1
        if (k, last) in forced:
            options.append([(forced[(k, last)],)] if forced[(k, last)] in free_cells else [])
            continue
        K = shapes[k][-1]
        match = [c for c in free_cells if sizes[c] == K]
        # Unforced: latent, or tied over two or more axes (one axis alone would have been forced).
        smallest = 1 if K == 1 or not forced else 2
        opts = [None] + [tuple(g) for r in range(smallest, len(match) + 1)
                         for g in itertools.combinations(match, r)]
        options.append(opts)
    for owners in itertools.product(*options):
        cells = [c for o in owners if o for c in o]
        if sorted(cells) == sorted(free_cells):
            yield owners


def _acyclic(parents) -> bool:
    state: dict[str, int] = {}

    def visit(n):
        if state.get(n) == 1:
            return False
        if state.get(n) == 2:
            return True
        state[n] = 1
        ok = all(visit(p) for p in parents.get(n, ()))
        state[n] = 2
        return ok

    return all(visit(n) for n in parents)


def _einsum(assignment, tables, node_sizes, cell_names, values):
    letters = {n: chr(ord("a") + i) for i, n in enumerate(node_sizes)}
    operands, specs = [], []
    for k, child, pars in assignment:
        operands.append(np.asarray(values[tables[k]], dtype=np.float64))
        specs.append("".join(letters[p] for p in pars) + letters[child])
    out = "".join(letters[c] for c in cell_names)
    result = np.einsum(",".join(specs) + "->" + out, *operands)
    return result


# -- entry point -----------------------------------------------------------------------------------
def from_numpyro(model_fn: Callable, *args, **kwargs) -> tuple[AllocationModel, CountTensor]:
    """Recognise the allocation model a NumPyro program writes, and the data its observed sites hold.

    Parameters
    ----------
    model_fn : callable
        A NumPyro model function (``numpyro.sample`` statements, plates). It is run a few times
        under ``seed``/``substitute``/``trace`` with ``*args`` and ``**kwargs``.
    *args, **kwargs
        Passed to ``model_fn``; the observed sites' data among them.

    Returns
    -------
    model : AllocationModel
        DAG, cardinalities, concentrations (BDeu ``a`` when every table is a contraction of one
        base measure, explicit per-node values otherwise), tied tables and conditioned totals.
        ``model.program_info`` (:class:`ProgramInfo`) records which site became which node.
    data : CountTensor
        The observed sites as counts, dims named after the nodes.

    Notes
    -----
    ``bam.log_evidence(model, data)`` is the probability of the **count table** (Cemgil et al. 2019
    eq. 3.11; given the conditioned totals, eq. 3.15). A token program draws a fixed number of
    tokens, so it carries no Gamma–Poisson total term; its token sequence has probability
    ``evidence - model.program_info.log_sequence_offset`` (the log multinomial coefficient of
    the counts given the fixed totals).

    Raises
    ------
    TypeError
        ``model_fn`` is not callable.
    ValueError
        The program is not an allocation model; the message names the site and what was expected.
    """
    if not callable(model_fn):
        raise TypeError(f"model_fn must be a NumPyro model function, got {type(model_fn).__name__}")
    tr = _trace(model_fn, args, kwargs)
    kinds = _sites(tr)
    if kinds["index"]:
        model, data, info = _token_form(model_fn, args, kwargs, tr, kinds)
    else:
        model, data, info = _count_form(model_fn, args, kwargs, tr, kinds)
    model.program_info = info
    return model, data
