"""Argument checks shared by models and backends: a named ValueError/TypeError before any compilation."""

from __future__ import annotations

import math

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
