"""Backends of the PMF tensor model (:func:`bam_ppl.models.pmf_tensor`): VB and stochastic VB in
:mod:`.variational`, EM over candidate ranks with BIC/AIC in :mod:`.em`; what they share in :mod:`.common`."""
