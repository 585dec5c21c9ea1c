"""The version of bam_ppl (a leaf module: anything may import it)."""

__version__ = "0.1.0"
