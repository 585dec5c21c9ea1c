"""python -m bam_ppl.precompile: the numba kernels compiled before a parallel run."""

import pytest

from bam_ppl import precompile


def test_every_family_compiles_on_tiny_data():
    # In this process, so that it is quick once the kernels are cached (make test runs it first).
    for families in precompile.GROUPS.values():
        for name in families:
            assert precompile._compile_family(name) >= 0.0


def test_bad_jobs_raise_before_any_work():
    with pytest.raises(ValueError, match="jobs"):
        precompile.precompile(0)
    with pytest.raises(TypeError, match="jobs"):
        precompile.precompile(1.5)
