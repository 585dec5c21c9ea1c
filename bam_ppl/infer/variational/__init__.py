"""Variational Bayes over the allocations (:mod:`.vb`) and its collapsed variant (:mod:`.cvb`)."""
