"""Model families: the allocation model, its named presets, and other families."""

from .allocation import AllocationModel, BoundModel, CellLayout, Table
from .dirichlet_tucker import DirichletTuckerModel, DirichletTuckerParams, dirichlet_tucker
from .nbmf import NBMF, nbmf
from .pmf import PMFTensorModel, categorical_samples, pmf_tensor
from .zoo import complete_graph, cp, independence, lda, nmf, symmetric_nmf, tucker

__all__ = [
    "AllocationModel",
    "BoundModel",
    "CellLayout",
    "DirichletTuckerModel",
    "DirichletTuckerParams",
    "NBMF",
    "PMFTensorModel",
    "Table",
    "complete_graph",
    "categorical_samples",
    "cp",
    "dirichlet_tucker",
    "independence",
    "lda",
    "nbmf",
    "nmf",
    "pmf_tensor",
    "symmetric_nmf",
    "tucker",
]
