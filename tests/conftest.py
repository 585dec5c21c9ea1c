import numpy as np
import pytest

# Reference matrices of papers/000 Example 3.3 and §5.1.1 (notes/bam_digest.md §14).
X1 = np.array([[2, 1, 1, 0], [0, 0, 1, 2], [0, 0, 1, 1]])
X2 = np.array([[4, 3, 0], [0, 0, 3], [0, 0, 3]])


@pytest.fixture
def x1():
    return X1.copy()


@pytest.fixture
def x2():
    return X2.copy()
