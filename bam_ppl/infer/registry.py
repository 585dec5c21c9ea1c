"""One registry for every inference backend and evidence estimator (DESIGN §4).

A backend is ``fn(model, data, *, rng_key, **options) -> InferenceData`` registered with
:func:`register` under a method name for the model types it accepts; an evidence estimator is
``fn(model, data, *, rng_key, **options) -> EvidenceEstimate`` registered with
:func:`register_evidence`. The same name may serve several model families (``"gibbs"`` for
allocation models and for NBMF), dispatched on the model's type (the most specific class wins).
Importing :mod:`bam_ppl.infer` registers every built-in one.

Option vocabulary, the same in every backend and estimator (NumPyro's names where it has them):

* ``num_chains`` — independent chains, runs or restarts, each drawn from ``fold_in(rng_key, c)``.
  Default per kind of backend: MCMC samplers (``gibbs``, ``nuts``) 4, since ArviZ's R-hat and
  ESS need several chains; SMC and evidence runs (``smc``, ``tempered``, ``chib``) 4, since the
  spread of the runs gives the stated error; optimisers (``map``, ``vb``, ``cvb``) 1, a restart
  being a full extra fit (``map`` for allocation models and VB's evidence keep 10: their
  optimum depends on the start more than a posterior summary does).
* ``num_warmup`` / ``num_samples`` — discarded and kept sweeps (draws) of a sampler;
  ``num_steps`` — optimiser steps (``svi``); ``num_iters`` — iterations of EM/VB to convergence.
* ``engine`` — ``"auto"``, ``"numba"`` or ``"jax"``: which implementation runs the token loops
  (NumPyro's ``kernel`` is an MCMC transition kernel, another thing).

Old names (``num_runs``, ``num_restarts``, ``kernel``; Chib's ``num_steps`` and ``num_warmup``)
are accepted for one release with a FutureWarning (:func:`bam_ppl.validation.renamed_options`).
"""

from __future__ import annotations

import inspect
import logging
import time
import warnings
from typing import NamedTuple

from ..parallel import check_executor, split_backend
from ..types import KeyLike
from ..validation import rename_options

logger = logging.getLogger(__name__)


class Backend(NamedTuple):
    name: str
    models: tuple[type, ...]
    fn: object
    description: str


_BACKENDS: dict[str, list[Backend]] = {}


def register(name: str, models: tuple[type, ...] = (object,), description: str | None = None):
    """Decorator registering an inference backend.

    Examples
    --------
    >>> @register("my_method", models=(AllocationModel,))  # doctest: +SKIP
    ... def my_method(model, data, *, rng_key, **options):
    ...     return idata
    """
    if not isinstance(name, str) or not name:
        raise ValueError("register: name must be a non-empty string")
    models = tuple(models)
    if not all(isinstance(m, type) for m in models):
        raise TypeError("register: models must be a tuple of classes")

    def deco(fn):
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        entries = _BACKENDS.setdefault(name, [])
        replaced = [b for b in entries if b.models == models and b.fn is not fn]
        if replaced:
            warnings.warn(
                f"register: {name!r} for {[m.__name__ for m in models]} was already registered "
                f"({replaced[0].description!r}); the new backend replaces it", UserWarning, stacklevel=2)
        entries[:] = [b for b in entries if b.models != models]
        entries.append(Backend(name, models, fn, doc))
        return fn

    return deco


def deprecated_alias(alias: str, name: str, models: tuple[type, ...], note: str = ""):
    """Register ``alias`` as an old name of backend ``name``: it runs that backend after a
    FutureWarning (shown to users by default, unlike a DeprecationWarning raised inside a
    library) that names the new one."""
    def run_under_new_name(model, data, *, rng_key=0, **options):
        warnings.warn(f"method={alias!r} is deprecated for {type(model).__name__}: use method={name!r}{note}",
                      FutureWarning, stacklevel=3)
        backend = find(name, model)
        options = resolve_options(backend.fn, options, f"bam.infer(method={alias!r} -> {name!r})")
        return backend.fn(model, data, rng_key=rng_key, **options)

    register(alias, models, description=f"deprecated name of {name!r}")(run_under_new_name)


def most_specific(model, entries):
    """The entry whose accepted type is nearest to ``type(model)`` in its MRO (None if none fits).

    A backend registered for a subclass (e.g. the Dirichlet-Tucker preset) wins over one
    registered for :class:`AllocationModel`, whatever the registration order.
    """
    mro = type(model).__mro__
    ranked = [
        (min(mro.index(t) for t in types if isinstance(model, t)), -k, value)
        for k, (types, value) in enumerate(entries)
        if isinstance(model, types)
    ]
    return min(ranked, key=lambda r: r[:2])[2] if ranked else None


def refuse_program(model) -> None:
    """A TypeError if ``model`` is a function (a NumPyro model function, say) rather than a bam_ppl
    model, saying to read it with :func:`bam_ppl.from_numpyro` first."""
    if callable(model) and not isinstance(model, type):
        name = getattr(model, "__name__", None) or type(model).__name__
        raise TypeError(
            f"got the function {name!r}, not a bam_ppl model: read a NumPyro program first with "
            f"`model, data = bam.from_numpyro({name}, *args, **kwargs)` and pass that model and data")


def find(name: str, model) -> Backend:
    if not isinstance(name, str):
        raise TypeError(f"method must be a string, got {type(name).__name__}")
    if name not in _BACKENDS:
        raise ValueError(f"unknown method {name!r}; registered methods: {sorted(_BACKENDS)}")
    best = most_specific(model, [(b.models, b) for b in _BACKENDS[name]])
    if best is not None:
        return best
    refuse_program(model)
    ok = sorted({m.__name__ for b in _BACKENDS[name] for m in b.models})
    fits = sorted(n for n, bs in _BACKENDS.items() if any(isinstance(model, b.models) for b in bs))
    raise TypeError(
        f"method {name!r} accepts models of type {ok}, not {type(model).__name__}; "
        f"methods for {type(model).__name__}: {fits}"
    )


def infer(model, data, method: str | None = None, rng_key: KeyLike = 0, *, executor=None, **options):
    """Run inference and return ArviZ InferenceData.

    Parameters
    ----------
    model : a bam_ppl model (AllocationModel, NBMF, ...)
    data : the data (array-like, CountTensor, binary matrix ...)
    method : str, optional
        A registered method (see :func:`methods`); default: the model's ``default_method``.
    rng_key : int or JAX key
        Randomness; the same key gives the same result.
    executor : concurrent.futures.Executor or dask.distributed.Client, optional
        Runs the chains (or the restarts) as tasks there, model and data sent to each worker once
        (:func:`bam_ppl.parallel.split_backend`): chain (restart) ``c`` is the backend run with
        one chain starting at index ``c``, chains concatenated in order, restarts merged as the
        backend keeps them. Every built-in backend draws chain ``c`` from
        ``fold_in(rng_key, c)`` alone, so the InferenceData is the one of ``executor=None``, bit
        for bit, on every executor and any number of workers.
    **options
        Backend options (``num_particles``, ``num_chains``, ``num_samples``, ``num_iters`` ...);
        the same name means the same thing in every backend (module docstring).

    Warns
    -----
    LabelSwitchingWarning
        Where the chains settled in different labellings of the latent classes
        (:func:`bam_ppl.switched_chains`): :func:`bam_ppl.relabel` aligns them before ``az.summary``.
    """
    if method is None:
        method = getattr(model, "default_method", None)
        if method is None:
            refuse_program(model)
            raise ValueError("method is required for this model; see bam_ppl.methods()")
    backend = find(method, model)
    options = resolve_options(backend.fn, options, f"bam.infer(method={method!r})")
    check_executor(executor)
    logger.debug("infer(method=%r) on %s: started", method, type(model).__name__)
    began = time.perf_counter()
    if executor is None:
        result = backend.fn(model, data, rng_key=rng_key, **options)
    else:
        result = split_backend(backend.fn, model, data, rng_key, options, executor,
                               f"{type(model).__name__} {method!r}")
    logger.debug("infer(method=%r) on %s: done in %.1f s", method, type(model).__name__, time.perf_counter() - began)
    if not _is_inference_data(result):
        raise TypeError(
            f"backend {method!r} for {type(model).__name__} returned {type(result).__name__}, not "
            "InferenceData; a backend must return InferenceData (e.g. via bam_ppl.convert.to_inference_data)")
    _warn_of_switched_labels(result, method)
    return result


def _warn_of_switched_labels(result, method: str) -> None:
    """A :class:`~bam_ppl.predictive.LabelSwitchingWarning` where the chains of ``result`` settled in different
    labellings of a latent node (:func:`~bam_ppl.predictive.switched_chains`)."""
    from ..predictive import LabelSwitchingWarning, switched_chains

    switched = switched_chains(result)
    if switched:
        where = "; ".join(f"{dim!r}: chains {chains}" for dim, chains in switched.items())
        warnings.warn(f"bam.infer(method={method!r}): chains settled in labellings of the latent classes other than "
                      f"chain 0's ({where}), so R-hat and ESS of their tables say nothing of convergence; "
                      "bam.relabel(idata) aligns the labels", LabelSwitchingWarning, stacklevel=3)


def option_names(fn) -> set[str]:
    """The keyword-only options of a backend or estimator (without ``rng_key``)."""
    params = inspect.signature(fn).parameters
    return {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and n != "rng_key"}


def check_options(fn, options, caller: str) -> None:
    """Reject options that ``fn`` does not take, naming the caller and the valid options."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = option_names(fn) | set(getattr(fn, "renamed_options", {}))
    unknown = sorted(set(options) - valid)
    if unknown:  # private options (leading underscore) and old names are accepted but not advertised
        public = sorted(n for n in option_names(fn) if not n.startswith("_"))
        raise TypeError(f"{caller}: unknown option(s) {unknown}; valid options: {public}")


def resolve_options(fn, options: dict, caller: str, stacklevel: int = 4) -> dict:
    """``options`` under their current names (deprecated ones warn and are mapped), checked
    against what ``fn`` takes; the public entry points call this before running ``fn``
    (``stacklevel`` points the warning at their caller)."""
    options = rename_options(options, getattr(fn, "renamed_options", {}), caller, stacklevel=stacklevel)
    check_options(fn, options, caller)
    return options


def _is_inference_data(result) -> bool:
    kind = type(result).__name__
    return kind in ("InferenceData", "DataTree") or hasattr(result, "posterior") and hasattr(result, "groups")


def methods(kind: str = "inference"):
    """Registered inference backends (``kind="inference"``, for :func:`infer`) or evidence
    estimators (``kind="evidence"``, for :func:`bam_ppl.log_evidence`) as a pandas DataFrame
    (method, models, description)."""
    import pandas as pd

    if kind == "inference":
        rows = [(b.name, b.models, b.description) for name in sorted(_BACKENDS) for b in _BACKENDS[name]]
    elif kind == "evidence":
        rows = [(name, models, (fn.__doc__ or "").strip().split("\n")[0])
                for name in sorted(_EVIDENCE) for models, fn in _EVIDENCE[name]]
    else:
        raise ValueError(f"kind must be 'inference' or 'evidence', got {kind!r}")
    return pd.DataFrame([dict(method=name, models=", ".join(m.__name__ for m in models), description=description)
                         for name, models, description in rows], columns=["method", "models", "description"])


# -- evidence estimators -----------------------------------------------------------------------
_EVIDENCE: dict[str, list[tuple[tuple[type, ...], object]]] = {}


def register_evidence(name: str, models: tuple[type, ...] = (object,)):
    """Decorator registering ``fn(model, data, *, rng_key, **options) -> EvidenceEstimate``."""
    if not isinstance(name, str) or not name:
        raise ValueError("register_evidence: name must be a non-empty string")

    def deco(fn):
        entries = _EVIDENCE.setdefault(name, [])
        entries[:] = [(m, f) for m, f in entries if m != tuple(models)]
        entries.append((tuple(models), fn))
        return fn

    return deco


def evidence_methods() -> list[str]:
    """Names of the registered evidence estimators."""
    return sorted(_EVIDENCE)


def find_evidence(name: str, model):
    """The estimator registered as ``name`` for the type of ``model``."""
    if not isinstance(name, str):
        raise TypeError(f"method must be a string, got {type(name).__name__}")
    if name not in _EVIDENCE:
        raise ValueError(f"unknown evidence method {name!r}; registered: {sorted(_EVIDENCE)}")
    fn = most_specific(model, _EVIDENCE[name])
    if fn is None:
        refuse_program(model)
        accepted = [t.__name__ for types, _ in _EVIDENCE[name] for t in types]
        raise TypeError(f"evidence method {name!r} accepts {accepted}, not {type(model).__name__}")
    return fn
