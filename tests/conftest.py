import os
from pathlib import Path

import numpy as np
import pytest

# Tests read the real data sets from the shared folder beside the repository (never a download,
# never the user cache); an explicit $BAM_PPL_DATA wins. Subprocesses (tutorials) inherit it.
_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if not os.environ.get("BAM_PPL_DATA") and _SHARED_DATA.is_dir():
    os.environ["BAM_PPL_DATA"] = str(_SHARED_DATA)
os.environ["BAM_PPL_OFFLINE"] = "1"

# Reference matrices of papers/000 Example 3.3 and §5.1.1 (notes/bam_digest.md §14).
X1 = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])
X2 = np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]])


@pytest.fixture
def x1():
    return X1.copy()


@pytest.fixture
def x2():
    return X2.copy()
