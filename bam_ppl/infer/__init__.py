"""Inference backends; importing this package registers all of them."""

from . import dtucker_em, exact, numpyro_backends  # noqa: F401
from . import cvb, vb  # noqa: F401
from . import smc  # noqa: F401
from . import em, gibbs  # noqa: F401
from . import pmf_vb  # noqa: F401
from . import nbmf_gibbs, nbmf_vb  # noqa: F401
from .registry import infer, methods, register  # noqa: F401
