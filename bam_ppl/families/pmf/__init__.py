"""Backends of the PMF tensor model (:func:`bam_ppl.models.pmf_tensor`): VB, stochastic VB and
EM with rank selection, in :mod:`.backends`."""
