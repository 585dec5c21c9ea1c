"""The algorithms of one model family each, beside the generic backends of :mod:`bam_ppl.infer`;
importing this package registers them. The models themselves are in :mod:`bam_ppl.models`."""

from .dirichlet_tucker import em as dirichlet_tucker_em  # noqa: F401  (importing registers the backends)
from .nbmf import gibbs as nbmf_gibbs, variational as nbmf_variational  # noqa: F401
from .pmf import backends as pmf_backends  # noqa: F401
