"""Backends of the Dirichlet-Tucker model (:func:`bam_ppl.models.dirichlet_tucker`): MAP-EM and
stochastic EM with the collapsed E-step, in :mod:`.em`."""
