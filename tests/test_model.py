"""AllocationModel: construction checks, closed forms, generative draws, zoo."""

import numpy as np
import pytest
from scipy.special import gammaln

import bam_ppl as bam
from bam_ppl.infer.exact import exact_log_evidence


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(a=0), ValueError, "a must be a positive"),
        (dict(a=-1.0), ValueError, "a must be a positive"),
        (dict(b=0.0), ValueError, "b must be a positive"),
        (dict(a="1"), TypeError, "a must be a positive number"),
        (dict(latent={"z": 2}), ValueError, r"latent: node\(s\) \['z'\] are not in the DAG"),
        (dict(latent={"k": 0}), ValueError, r"latent\['k'\] must be at least 1"),
        (dict(latent={"k": 2.5}), TypeError, "int cardinality"),
        (dict(latent={"k": 2}, observed=("i",)), ValueError, "observed must list each visible node"),
        (dict(latent={"k": 2}, priors={"q": 1.0}), ValueError, "priors"),
        (dict(latent={"k": 2}, priors={"k": 0.0}), ValueError, "priors"),
        (dict(latent={"k": 2}, condition_on="k"), ValueError, "latent"),
        (dict(latent={"k": 2}, condition_on="i"), ValueError, "parents"),
        (dict(latent={"k": 2, "i": 3, "j": 2}), ValueError, "every node is latent"),
    ],
)
def test_invalid_arguments(kwargs, err, match):
    kwargs = {"latent": {"k": 2}, **kwargs}
    with pytest.raises(err, match=match):
        bam.AllocationModel("k -> i; k -> j", **kwargs)


def test_tied_nodes_must_match():
    with pytest.raises(ValueError, match="families of different sizes"):
        bam.AllocationModel("r -> i; s -> j; r -> s", latent={"r": 2, "i": 3, "s": 2},
                            tie=[("i", "j")]).bind(np.ones(2, int))
    with pytest.raises(ValueError, match="different sizes"):
        bam.AllocationModel("r -> i; r -> j; r -> v", latent={"r": 2, "i": 3, "j": 4}, tie=[("i", "j")])
    with pytest.raises(ValueError, match="families of different sizes"):
        bam.models.symmetric_nmf(2).bind(np.ones((3, 4), int))


def test_data_shape_must_match_dag():
    with pytest.raises(ValueError, match="X has 3 axes but the model has 2 visible nodes"):
        bam.log_evidence(bam.models.nmf(2), np.ones((2, 2, 2), int))
    with pytest.raises(ValueError, match="T = 0"):
        bam.models.nmf(2).bind(np.zeros((2, 2), int))


def test_bdeu_contractions():
    bound = bam.models.cp(3, order=3, a=6.0).bind(np.ones((2, 4, 5), int))
    conc = {t.name: t.concentration for t in bound.tables}
    assert conc["r"].shape == (3,) and np.allclose(conc["r"], 6.0 / 3)
    assert conc["j"].shape == (3, 4) and np.allclose(conc["j"], 6.0 / 12)
    sym = bam.models.symmetric_nmf(2, a=1.0).bind(np.ones((3, 3), int))
    tied = [t for t in sym.tables if t.name == "i_j"][0]
    assert tied.members == ("i", "j") and np.allclose(tied.concentration, 2 * 1.0 / 6)  # App. E


def test_log_prob_allocation_matches_formula():
    m = bam.models.nmf(2, a=1.5, b=0.3)
    rng = np.random.default_rng(0)
    S = rng.integers(0, 3, size=(2, 3, 4))  # axes (k, i, j): topological order
    assert m.dag.nodes == ("k", "i", "j")
    a, b, T = 1.5, 0.3, S.sum()

    def logB(z):
        return gammaln(z).sum() - gammaln(z.sum(-1)).sum()

    Sk, Sik, Sjk = S.sum((1, 2)), S.sum(2).T, S.sum(1).T
    ak, aik, ajk = a / 2, a / 6, a / 8
    expected = (a * np.log(b) - (a + T) * np.log(b + 1) + gammaln(a + T) - gammaln(a)
                + logB(ak + Sk) - logB(np.full(2, ak))
                + logB(aik + Sik.T) - logB(np.full((2, 3), aik))
                + logB(ajk + Sjk.T) - logB(np.full((2, 4), ajk))
                - gammaln(S + 1).sum())
    assert m.log_prob_allocation(S) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="S must have"):
        m.log_prob_allocation(S[:, :2, :2].sum(0))


def test_evidence_is_sum_of_allocation_probabilities():
    # L_X = Σ_{S: S_V = X} π(S) (eq. 3.7), checked by brute force over all 2 x 2 x 2 tensors
    m = bam.models.nmf(2, a=1.0, b=0.5)
    X = np.array([[1, 2], [0, 1]])
    import itertools

    from scipy.special import logsumexp

    logs = []
    for split in itertools.product(*[range(x + 1) for x in X.ravel()]):
        s0 = np.array(split).reshape(X.shape)
        S = np.stack([s0, X - s0])
        logs.append(m.log_prob_allocation(S))
    assert logsumexp(logs) == pytest.approx(exact_log_evidence(m, X), abs=1e-10)


def test_sample_shapes_and_totals():
    m = bam.models.cp(4, order=3, a=10.0)
    S, X = m.sample(0, shape=(5, 6, 7), total=300)
    assert S.shape == (4, 5, 6, 7) and X.shape == (5, 6, 7)
    assert S.sum() == 300 and np.array_equal(S.sum(0), X)
    S2, X2 = m.sample(0, shape=(5, 6, 7), total=300)
    assert np.array_equal(X, X2)  # same key, same draw
    lda = bam.models.lda(3)
    _, Xd = lda.sample(1, shape=(4, 9), total=np.array([5, 0, 7, 2]))
    assert Xd.sum(1).tolist() == [5, 0, 7, 2]
    with pytest.raises(ValueError, match="total"):
        bam.models.nmf(2).sample(0, shape=(3, 3))
    _, Xp = bam.models.nmf(2, a=4.0, b=0.1).sample(0, shape=(3, 3))
    assert Xp.shape == (3, 3)


def test_zoo_structures():
    assert str(bam.models.nmf(3).dag) == "k -> i; k -> j"
    assert bam.models.cp(5, order=3).dag == bam.DAG("r -> i; r -> j; r -> k")
    assert bam.models.cp(2, order=4).observed == ("i1", "i2", "i3", "i4")
    tk = bam.models.tucker((2, 3, 4))
    assert tk.latent == {"r1": 2, "r2": 3, "r3": 4} and tk.observed == ("i", "j", "k")
    assert set(tk.dag.parents["r1"]) == {"r3", "r2"}
    assert bam.models.complete_graph(3).dag.parents["k"] == ("i", "j")
    assert bam.models.independence(3).dag.parents == {"i": (), "j": (), "k": ()}
    assert bam.models.lda(4).condition_on == ("d",)
    assert bam.models.symmetric_nmf(2).tie == (("i", "j"),)


@pytest.mark.parametrize("build, error, match", [
    (lambda: bam.models.cp(2, order="3"), TypeError, "order must be an int"),
    (lambda: bam.models.cp(2, order=0), ValueError, "order must be >= 1"),
    (lambda: bam.models.tucker(3), TypeError, "ranks must be a tuple of ints"),
    (lambda: bam.models.tucker(()), ValueError, "ranks must name at least one rank"),
])
def test_zoo_constructors_name_the_bad_argument(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_lda_evidence_is_conditional_on_document_lengths():
    # LDA = BAM conditioned on the document totals (papers/000 §3.5): the joint evidence of the
    # unconditioned model factorises into p(document totals) x p(X | totals) for d -> k -> w.
    X = np.array([[2, 1, 0], [0, 1, 2]])
    a, b = 2.0, 0.5
    joint = exact_log_evidence(bam.AllocationModel("d -> k -> w", latent={"k": 2}, a=a, b=b), X)
    cond = exact_log_evidence(bam.AllocationModel("d -> k -> w", latent={"k": 2}, a=a, b=b, condition_on="d"), X)
    totals = exact_log_evidence(bam.AllocationModel("d", a=a, b=b), X.sum(1))
    assert joint == pytest.approx(totals + cond, abs=1e-10)
