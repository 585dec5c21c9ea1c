"""Inference backends; importing this package registers all of them."""

from . import (  # noqa: F401  (importing a backend module registers it)
    auto,
    chib,
    cvb,
    dtucker_em,
    em,
    exact,
    gibbs,
    nbmf_gibbs,
    nbmf_vb,
    numpyro_backends,
    pmf_vb,
    smc,
    tempered,
    vb,
)
from .registry import infer, methods, register  # noqa: F401
