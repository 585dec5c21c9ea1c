"""InferenceData in and out: :mod:`.build` turns backend arrays into ArviZ InferenceData (the one
builder every backend uses), :mod:`.read` reads groups and attributes back for both ArviZ
generations."""

from .build import (  # noqa: F401
    DENSE_OBSERVED_LIMIT,
    SAMPLE_GROUPS,
    allocation_inference_data,
    import_arviz,
    observed_variables,
    to_inference_data,
)
from .read import attrs_of, group, with_groups  # noqa: F401
