"""Model families: the allocation model, its named presets, and other families."""

from .allocation import AllocationModel, BoundModel, CellLayout, Table
from .nbmf import NBMF, nbmf
from .zoo import complete_graph, cp, independence, lda, nmf, symmetric_nmf, tucker

__all__ = [
    "AllocationModel",
    "BoundModel",
    "CellLayout",
    "NBMF",
    "Table",
    "complete_graph",
    "cp",
    "independence",
    "lda",
    "nbmf",
    "nmf",
    "symmetric_nmf",
    "tucker",
]
