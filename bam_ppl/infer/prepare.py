"""The problem every allocation backend and evidence estimator starts from, built once per call.

:func:`prepare` checks the model and the data, binds the model to the data and lays out the
cells over the free nodes' configurations; nothing is compiled, so a bad argument raises before
any JAX or numba work.
"""

from __future__ import annotations

from typing import NamedTuple

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
