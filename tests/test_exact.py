"""Exact evidence: papers/000 Example 3.2 and the reference table of notes/bam_digest.md §14."""

import numpy as np
import pytest
from conftest import X1, X2

import bam_ppl as bam
from bam_ppl.infer.exact import count_allocations, exact_log_evidence

S_EX32 = np.array([[2, 1], [0, 1]])


@pytest.mark.parametrize("structure", ["i -> j", "j -> i"])
def test_example_3_2_consistent(structure):
    dep = bam.AllocationModel(structure, observed=("i", "j"), a=1, b=1)
    assert bam.log_evidence(dep, S_EX32).value == pytest.approx(-8.094, abs=1e-3)
    ind = bam.AllocationModel("i; j", a=1, b=1)
    assert bam.log_evidence(ind, S_EX32).value == pytest.approx(-7.977, abs=1e-3)


def test_example_3_2_undirected_and_inconsistent():
    # undirected i - j: one joint table with cells a/4 (a complete graph in either direction)
    assert float(bam.log_evidence(bam.models.complete_graph(2, a=1, b=1), S_EX32)) == pytest.approx(-8.094, abs=1e-3)
    flat = {"i": 0.25, "j": 0.25}
    expected = {"i; j": -8.808, "i -> j": -8.472, "j -> i": -8.549}
    for structure, value in expected.items():
        m = bam.AllocationModel(structure, observed=("i", "j"), a=1, b=1, priors=flat)
        assert bam.log_evidence(m, S_EX32).value == pytest.approx(value, abs=1e-3)


EXACT_X1 = {
    1e-5: [-86.038, -85.432, -86.239, -86.873],
    1e-3: [-58.418, -57.812, -58.618, -59.250],
    1e-1: [-31.350, -30.760, -31.482, -32.047],
    1.0: [-20.227, -19.811, -20.093, -20.345],
    10.0: [-14.487, -14.458, -14.443, -14.435],
}
EXACT_X2 = {
    1e-5: [-77.459, -59.405, -59.418, -59.448],
    1e-3: [-54.443, -40.995, -41.007, -41.037],
    1e-1: [-31.933, -23.200, -23.175, -23.186],
    1.0: [-22.751, -17.254, -16.991, -16.872],
    10.0: [-17.907, -17.323, -16.984, -16.749],
}


@pytest.mark.parametrize("X, table", [(X1, EXACT_X1), (X2, EXACT_X2)], ids=["X1", "X2"])
def test_reference_table(X, table):
    for a, values in table.items():
        for K, expected in zip(range(1, 5), values):
            got = bam.log_evidence(bam.models.nmf(K, a=a), X, method="exact")
            assert got.kind == "exact" and got.stderr == 0.0
            assert got.value == pytest.approx(expected, abs=1.5e-3), (a, K)


def test_example_3_4_missing_entry_mode():
    # papers/000 Example 3.4: X3 = [[3, ?], [3, 3]], a = 4, b = 0.01; the posterior mode of the
    # missing cell is 3 (T = 12) for every K; reference values in notes/bam_digest.md §14.
    for K, expected in [(1, -17.754), (2, -17.928)]:
        m = bam.models.nmf(K, a=4, b=0.01)
        values = [exact_log_evidence(m, np.array([[3, x], [3, 3]])) for x in range(0, 7)]
        assert int(np.argmax(values)) == 3
        assert values[3] == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize(
    "structures, latent, shape",
    [
        (["k -> i; k -> j", "i -> k; k -> j", "j -> k; k -> i"], {"k": 2}, (2, 3)),
        (["r -> i, j, k", "i -> r; r -> j; r -> k"], {"r": 2}, (2, 2, 2)),
        (["i -> j; (i, j) -> k", "k -> j; (k, j) -> i", "j -> i; (j, i) -> k"], {}, (2, 3, 2)),
    ],
)
def test_markov_equivalent_structures_agree(structures, latent, shape):
    X = np.random.default_rng(0).integers(0, 3, size=shape)
    observed = ("i", "j", "k")[: len(shape)]
    values = [
        exact_log_evidence(bam.AllocationModel(s, latent=latent, observed=observed, a=0.7), X)
        for s in structures
    ]
    np.testing.assert_allclose(values, values[0], atol=1e-9)


def test_closed_form_equals_enumeration():
    # Latent-free: closed form. The same model with a latent node of size 1 goes through the
    # enumeration path and must agree.
    X = np.array([[3, 0, 1], [2, 2, 0]])
    closed = exact_log_evidence(bam.AllocationModel("i -> j", a=2.0), X)
    enum = exact_log_evidence(bam.AllocationModel("i -> j; z -> j", latent={"z": 1}, a=2.0), X)
    assert closed == pytest.approx(enum, abs=1e-10)


def test_sum_over_missing_cell_is_marginal():
    # Evidence of samples with a missing coordinate equals the sum over its possible values
    # (each completion as its own allocation), a check of the missing-data path.
    m = bam.models.nmf(2, a=1.0, b=0.5)
    base = [[0, 1], [1, 0], [1, 1]]
    samples = np.array(base + [[0, -1]])
    with_missing = exact_log_evidence(m, bam.CountTensor.from_samples(samples, shape=(2, 2)))
    completions = [
        exact_log_evidence(m, bam.CountTensor.from_tokens(np.array(base + [[0, v]]), (2, 2)))
        for v in range(2)
    ]
    # tokens are exchangeable: the pattern (0, ?) has one ordering per completion multiplicity
    from scipy.special import logsumexp

    def multiplicity(v):
        full = bam.CountTensor.from_tokens(np.array(base + [[0, v]]), (2, 2))
        return np.log(full.counts[(full.indices == [0, v]).all(1)][0])

    expected = logsumexp([c + multiplicity(v) for v, c in enumerate(completions)])
    assert with_missing == pytest.approx(expected, abs=1e-9)


def test_enumeration_limit_is_checked_before_work():
    X = np.full((5, 5), 6)
    m = bam.models.nmf(4)
    with pytest.raises(ValueError, match="method='auto' or 'tempered'"):
        bam.log_evidence(m, X, method="exact")
    assert count_allocations(bam.CountTensor.from_dense(X), m.bind(X).cell_layout(bam.CountTensor.from_dense(X))) > 1e6


def test_complete_graph_closed_form_large():
    # no latent: closed form at any size, never enumerated
    rng = np.random.default_rng(1)
    X = rng.poisson(0.3, size=(5, 5, 5, 5, 5, 5))
    value = bam.log_evidence(bam.models.complete_graph(6), X).value
    # Dirichlet-multinomial over the joint table (notes/bam_digest.md §4, complete DAG)
    from scipy.special import gammaln

    a, T = 1.0, X.sum()
    b = a / T
    alpha = a / X.size
    dm = gammaln(a) - gammaln(a + T) + (gammaln(alpha + X) - gammaln(alpha)).sum()
    pt = a * np.log(b) - (a + T) * np.log1p(b) + gammaln(a + T) - gammaln(a) - gammaln(T + 1)
    expected = pt + gammaln(T + 1) - gammaln(X + 1).sum() + dm
    assert value == pytest.approx(expected, rel=1e-12)
