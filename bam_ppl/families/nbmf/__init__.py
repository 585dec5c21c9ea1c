"""Backends of non-negative binary matrix factorisation (:func:`bam_ppl.models.nbmf`): Gibbs in
:mod:`.gibbs`, VB and CVB in :mod:`.variational`, NUTS and SVI in
:mod:`.numpyro_backends`; what they share in :mod:`.common`."""
