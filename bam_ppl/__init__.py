"""bam_ppl: Bayesian allocation models for count, binary and categorical data on NumPyro.

Declare a model as a DAG of index variables, run any registered backend through
:func:`infer`, and compare structures by their evidence with :func:`log_evidence` and
:func:`compare`.
"""

import logging

# Stages of long calls are logged under "bam_ppl"; a library configures no output of its own.
logging.getLogger(__name__).addHandler(logging.NullHandler())

from . import datasets, families, models  # noqa: E402,F401  (families: importing registers their backends)
from ._version import __version__  # noqa: E402,F401
from .convert.from_numpyro import from_numpyro  # noqa: E402
from .dag import DAG  # noqa: E402
from .data import CountTensor  # noqa: E402
from .evidence import (  # noqa: E402
    EvidenceEstimate,
    EvidenceWarning,
    add_evidence,
    compare,
    log_evidence,
    read_evidence,
    register_evidence,
)
from .infer.registry import infer, methods, register  # noqa: E402
from .infer.smc.reverse import evidence_upper_bound  # noqa: E402
from .models.allocation import AllocationModel  # noqa: E402
from .plots import plot_compare, plot_evidence, plot_trace, plot_var_names  # noqa: E402
from .predictive import LabelSwitchingWarning, posterior_predictive, relabel, switched_chains  # noqa: E402
from .selection import plot_rank_selection, select_ranks  # noqa: E402

__all__ = [
    "DAG",
    "AllocationModel",
    "CountTensor",
    "EvidenceEstimate",
    "EvidenceWarning",
    "evidence_upper_bound",
    "add_evidence",
    "compare",
    "datasets",
    "from_numpyro",
    "infer",
    "log_evidence",
    "methods",
    "plot_compare",
    "plot_evidence",
    "plot_rank_selection",
    "plot_trace",
    "plot_var_names",
    "posterior_predictive",
    "read_evidence",
    "relabel",
    "switched_chains",
    "LabelSwitchingWarning",
    "models",
    "register",
    "register_evidence",
    "select_ranks",
]
