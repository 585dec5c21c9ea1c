"""The algorithms of one model family each, beside the generic backends of :mod:`bam_ppl.infer`;
importing this package registers them. The models themselves are in :mod:`bam_ppl.models`."""

# Importing a backend module registers it.
from .dirichlet_tucker import em as dirichlet_tucker_em  # noqa: F401
from .nbmf import gibbs as nbmf_gibbs  # noqa: F401
from .nbmf import numpyro_backends as nbmf_numpyro_backends  # noqa: F401
from .nbmf import variational as nbmf_variational  # noqa: F401
from .pmf import em as pmf_em  # noqa: F401
from .pmf import variational as pmf_variational  # noqa: F401
