"""The problem every allocation backend and evidence estimator starts from, built once per call.

:func:`prepare` checks the model and the data, binds the model to the data and lays out the
cells over the free nodes' configurations; nothing is compiled, so a bad argument raises before
any JAX or numba work. :func:`configs_of_allocation` reads an allocation that a user or an earlier
call gives (a start, a reference) as every token's configuration.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..data import MISSING, CountTensor
from ..models.allocation import DEFAULT_MAX_CONFIGS, AllocationModel, BoundModel, CellLayout


class Prepared(NamedTuple):
    """``data`` as a CountTensor, the model ``bound`` to it, the cell ``layout`` and
    ``log_data_constant`` (:meth:`BoundModel.log_data_constant`: the part of log L_X that the
    data alone fix)."""

    data: CountTensor
    bound: BoundModel
    layout: CellLayout
    log_data_constant: float


def prepare(model, data, *, max_configs: int = DEFAULT_MAX_CONFIGS, algorithm: str = "inference") -> Prepared:
    """Validate ``data`` for ``model`` and build the :class:`Prepared` problem.

    ``algorithm`` names the caller in the error raised for data without tokens.
    """
    if not isinstance(model, AllocationModel):
        raise TypeError(f"model must be an AllocationModel, got {type(model).__name__}")
    data = model.as_data(data)
    if data.total == 0:
        raise ValueError(f"X has no tokens (T = 0); {algorithm} needs at least one observed token")
    bound = model.bind(data)
    if bound.conditioned:
        positions = [bound.visible.index(c) for c in bound.conditioned]
        if (data.indices[:, positions] == MISSING).any():
            raise ValueError(
                f"X has missing entries on the conditioned node(s) {bound.conditioned}; "
                "conditioned totals must be fully observed"
            )
    layout = bound.cell_layout(data, max_configs=max_configs)
    return Prepared(data, bound, layout, bound.log_data_constant(data))


def configs_of_allocation(bound, data, layout, token_cell, allocation, name: str) -> np.ndarray:
    """Token configurations (T,) of an allocation given as (full cells (n, nodes), counts (n,)),
    for tokens in the cells ``token_cell`` (T,); ``name`` is the argument's name in errors."""
    try:
        if isinstance(allocation, (str, bytes)):
            raise TypeError
        cells, counts = (np.asarray(part) for part in allocation)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an allocation (cells, counts): full cells (n, nodes) and their "
                        "counts (n,), e.g. (result.best_cells, result.best_counts) of run_tempered") from None
    full = bound.full_cells(data, layout)  # (U, L, nodes)
    if cells.ndim != 2 or cells.shape[1] != full.shape[2] or counts.shape != cells.shape[:1]:
        raise ValueError(f"{name}: cells must have shape (n, {full.shape[2]}) and counts shape (n,), got "
                         f"{cells.shape} and {counts.shape}")
    # A full cell can complete several observed cells with missing entries: its tokens fill them in turn.
    where = {}
    for u, row_l in enumerate(full.tolist()):
        for l, row in enumerate(row_l):
            if layout.valid is None or layout.valid[u, l]:
                where.setdefault(tuple(row), []).append((u, l))
    room = np.bincount(token_cell, minlength=full.shape[0])
    cell, value, placed_counts = [], [], []
    for row, count in zip(cells.tolist(), counts.tolist()):
        if tuple(row) not in where or count < 0:
            raise ValueError(f"{name}: the allocation is not consistent with X at cell {row} (count {count})")
        for u, l in where[tuple(row)]:
            take = min(count, room[u])
            if take > 0:
                cell.append(u), value.append(l), placed_counts.append(take)
                room[u] -= take
                count -= take
        if count > 0:
            raise ValueError(f"{name}: the allocation's counts do not add up to X in every cell")
    cell, value, counts = np.array(cell, np.int64), np.array(value, np.int64), np.array(placed_counts, np.int64)
    if room.any():
        raise ValueError(f"{name}: the allocation's counts do not add up to X in every cell")
    # Tokens of a cell are exchangeable: give the cell's tokens its configurations in turn.
    by_cell = np.argsort(cell, kind="stable")
    config = np.empty(token_cell.shape[0], np.int64)
    config[np.argsort(token_cell, kind="stable")] = np.repeat(value[by_cell], counts[by_cell].astype(np.int64))
    return config


def as_allocations(start) -> list:
    """``start`` as a list of allocations (cells, counts): None, one allocation or a list of them."""
    if start is None:
        return []
    try:
        one = len(start) == 2 and np.ndim(start[0]) == 2 and np.ndim(start[1]) == 1
    except (TypeError, ValueError):
        one = False
    if one or not isinstance(start, (list, tuple)):
        return [start]
    return list(start)
