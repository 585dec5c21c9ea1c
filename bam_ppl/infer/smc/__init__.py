"""Sequential Monte Carlo: the Pólya-urn SMC over tokens (:mod:`.polya_urn`, numba kernel in
:mod:`.polya_urn_numba`), SMC over a tempering ladder (:mod:`.tempered`) and the resampling schemes
both use (:mod:`.resampling`)."""
