"""Inference backends for allocation models; importing this package registers all of them.

Grouped by algorithm: :mod:`.smc` (Pólya-urn and tempered SMC, resampling), :mod:`.gibbs`
(collapsed Gibbs and Chib's estimator built on it), :mod:`.variational` (VB and CVB), :mod:`.em`,
:mod:`.exact` and :mod:`.numpyro_backends` (NUTS, SVI); :mod:`.registry` dispatches a method name
and a model type to a backend, :mod:`.auto` picks an evidence estimator. The algorithms of one model
family (PMF, NBMF, Dirichlet-Tucker) live with that family in :mod:`bam_ppl.families`.
"""

from . import auto, em, exact, numpyro_backends  # noqa: F401  (importing a backend module registers it)
from .gibbs import chib, collapsed  # noqa: F401
from .registry import infer, methods, register  # noqa: F401
from .smc import mixture, polya_urn, tempered  # noqa: F401
from .variational import cvb, vb  # noqa: F401
