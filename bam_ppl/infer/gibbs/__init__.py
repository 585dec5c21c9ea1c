"""Collapsed Gibbs sampling of the allocations (:mod:`.collapsed`, numba kernel in
:mod:`.collapsed_numba`) and Chib's evidence estimator built on its sweeps (:mod:`.chib`)."""
