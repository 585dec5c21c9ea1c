"""Argument checks shared by models and backends: a named ValueError/TypeError before any compilation."""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np


def check_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_positive(value, name: str, upper: float | None = None, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    low_ok = value >= 0 if allow_zero else value > 0
    if not math.isfinite(value) or not low_ok or (upper is not None and value > upper):
        bound = f"in {'[0' if allow_zero else '(0'}, {upper}]" if upper is not None else (
            ">= 0" if allow_zero else "> 0")
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_choice(value, name: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def rename_options(options: dict, renames: dict, caller: str, stacklevel: int = 3) -> dict:
    """``options`` with each deprecated name of ``renames`` (old -> new) replaced by its new name.

    The old name warns (FutureWarning, shown to users by default) for one release; passing both
    names of one option is a ValueError, since which to obey would be a guess.
    """
    old_given = [old for old in renames if old in options]
    if not old_given:
        return options
    options = dict(options)
    for old in old_given:
        new = renames[old]
        if new in options:
            raise ValueError(f"{caller}: {old!r} and {new!r} name the same option ({old!r} is its deprecated "
                             f"name); pass {new!r} only")
        warnings.warn(f"{caller}: option {old!r} is deprecated and will be removed in the next release; "
                      f"use {new!r}", FutureWarning, stacklevel=stacklevel)
        options[new] = options.pop(old)
    return options


def renamed_options(**renames: str):
    """Decorator: a function whose options were renamed (``old="new"``) still accepts the old names
    (:func:`rename_options`). Its signature shows the new names only; ``fn.renamed_options`` holds
    the map, so that ``bam.infer`` and ``bam.log_evidence`` rename before checking the options."""

    def deco(fn):
        @functools.wraps(fn)
        def accepting_old_names(*args, **options):
            return fn(*args, **rename_options(options, renames, f"{fn.__name__}()"))

        accepting_old_names.renamed_options = {**getattr(fn, "renamed_options", {}), **renames}
        return accepting_old_names

    return deco
