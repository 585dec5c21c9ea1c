"""bam.from_numpyro: NumPyro programs recognised as allocation models, and refused when they are not.

Round trips: a program written the way NumPyro's examples write a zoo model gives the zoo model's
exact evidence (to 1e-10). Token programs draw a fixed number of tokens, so their evidence is the
count table's given that total (no Gamma–Poisson term); the token sequence's probability differs
by the multinomial coefficient ``program_info.log_sequence_offset``.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.special import gammaln

import bam_ppl as bam

RNG = np.random.default_rng(7)


def exact(model, data):
    return bam.log_evidence(model, data, method="exact").value


def log_beta(alpha, counts):
    """log B(α + n) − log B(α) of one Dirichlet-multinomial column (the sequence's probability)."""
    alpha = np.broadcast_to(alpha, counts.shape).astype(float)
    return float(gammaln(alpha + counts).sum() - gammaln(alpha).sum()
                 - gammaln((alpha + counts).sum()) + gammaln(alpha.sum()))


# -- NumPyro example-style token programs ------------------------------------------------------
def lda_nested(docs, num_topics=2, vocab=4):
    """LDA as in Pyro's/NumPyro's examples: a documents plate, a words plate inside it."""
    with numpyro.plate("topics", num_topics):
        phi = numpyro.sample("phi", dist.Dirichlet(jnp.full(vocab, 0.5)))
    with numpyro.plate("documents", docs.shape[1]):
        theta = numpyro.sample("theta", dist.Dirichlet(jnp.ones(num_topics)))
        with numpyro.plate("words", docs.shape[0], dim=-2):
            z = numpyro.sample("z", dist.Categorical(theta), infer={"enumerate": "parallel"})
            numpyro.sample("w", dist.Categorical(phi[z]), obs=docs)


def lda_flat(doc, words, num_docs, num_topics, vocab, alpha, beta):
    """LDA over a flat token list, the document of each token given by ``doc``."""
    with numpyro.plate("topics", num_topics):
        phi = numpyro.sample("phi", dist.Dirichlet(jnp.full(vocab, beta)))
    with numpyro.plate("docs", num_docs):
        theta = numpyro.sample("theta", dist.Dirichlet(jnp.full(num_topics, alpha)))
    with numpyro.plate("tokens", len(words)):
        z = numpyro.sample("z", dist.Categorical(theta[doc]), infer={"enumerate": "parallel"})
        numpyro.sample("w", dist.Categorical(phi[z]), obs=words)


def mixture(x, K=2, V=3):
    """A mixture of categoricals (NumPyro's enumeration examples)."""
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(K)))
    with numpyro.plate("components", K):
        probs = numpyro.sample("probs", dist.Dirichlet(jnp.ones(V)))
    with numpyro.plate("data", len(x)):
        z = numpyro.sample("z", dist.Categorical(weights))
        numpyro.sample("x", dist.Categorical(probs[z]), obs=x)


def latent_class(x1, x2, x3, K=2):
    """Naive Bayes with a hidden class: one Categorical site per feature."""
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(K)))
    tables = []
    for n, v in enumerate((3, 2, 3)):
        with numpyro.plate(f"classes_{n}", K):
            tables.append(numpyro.sample(f"phi{n + 1}", dist.Dirichlet(jnp.ones(v))))
    with numpyro.plate("people", len(x1)):
        c = numpyro.sample("c", dist.Categorical(pi))
        for n, x in enumerate((x1, x2, x3)):
            numpyro.sample(f"x{n + 1}", dist.Categorical(tables[n][c]), obs=x)


def test_lda_nested_plates_is_the_zoo_lda():
    docs = RNG.integers(0, 4, size=(3, 3))
    model, data = bam.from_numpyro(lda_nested, docs)
    assert model.condition_on == ("documents",) and model.latent == {"z": 2}
    assert data.dims == ("documents", "w") and data.total == docs.size
    zoo = bam.models.lda(2).replace(priors={"k": 1.0, "w": 0.5})
    X = data.to_dense()
    assert exact(model, data) == pytest.approx(exact(zoo, X), abs=1e-10)


def test_lda_flat_with_bdeu_priors_round_trips():
    D, K, V, a = 3, 2, 4, 2.0
    doc = np.repeat(np.arange(D), 3)
    words = RNG.integers(0, V, size=doc.size)
    model, data = bam.from_numpyro(lda_flat, doc, words, D, K, V, a / (D * K), a / (K * V))
    assert model.priors == {} and model.a == pytest.approx(a)
    assert data.dims == ("doc", "w")
    zoo = bam.models.lda(K, a=a)
    assert exact(model, data) == pytest.approx(exact(zoo, data.to_dense()), abs=1e-10)
    # Beyond enumeration: the same estimator and key give the same value.
    smc = [bam.log_evidence(m, x, method="smc", rng_key=3).value for m, x in ((model, data), (zoo, data.to_dense()))]
    assert smc[0] == smc[1]


def test_mixture_of_categoricals_has_no_total_term_and_the_sequence_offset():
    x = RNG.integers(0, 3, size=6)
    model, data = bam.from_numpyro(mixture, x)
    assert model.latent == {"z": 2} and model.condition_on == ("data",)
    value = exact(model, data)
    # The same counts under the zoo model, which carries the Gamma–Poisson term, given T instead.
    zoo = bam.AllocationModel("z -> x", latent={"z": 2}, priors={"z": 1.0, "x": 1.0})
    counts = data.to_dense()[0]
    bound = zoo.bind(counts)
    expected = exact(zoo, counts) - bound.log_total_term() + gammaln(len(x) + 1.0)
    assert value == pytest.approx(expected, abs=1e-10)
    offset = model.program_info.log_sequence_offset
    assert offset == pytest.approx(gammaln(len(x) + 1.0) - gammaln(counts + 1.0).sum())


def test_sequence_offset_against_the_closed_form_of_a_latent_free_program():
    def chain(i, j):
        p_i = numpyro.sample("p_i", dist.Dirichlet(jnp.full(2, 0.7)))
        with numpyro.plate("parents", 2):
            p_j = numpyro.sample("p_j", dist.Dirichlet(jnp.full(3, 1.3)))
        with numpyro.plate("tokens", len(i)):
            numpyro.sample("i", dist.Categorical(p_i), obs=i)
            numpyro.sample("j", dist.Categorical(p_j[i]), obs=j)

    i, j = np.array([0, 1, 1, 0, 1]), np.array([2, 0, 2, 2, 1])
    model, data = bam.from_numpyro(chain, i, j)
    sequence = log_beta(0.7, np.bincount(i, minlength=2))
    for parent in range(2):
        sequence += log_beta(1.3, np.bincount(j[i == parent], minlength=3))
    assert exact(model, data) - model.program_info.log_sequence_offset == pytest.approx(sequence, abs=1e-10)


def test_latent_class_with_one_site_per_feature():
    T = 5
    xs = [RNG.integers(0, v, size=T) for v in (3, 2, 3)]
    model, data = bam.from_numpyro(latent_class, *xs)
    assert model.dag.parents["x2"] == ("c",) and data.dims == ("people", "x1", "x2", "x3")
    zoo = bam.AllocationModel("people; c -> x1; c -> x2; c -> x3", latent={"c": 2},
                              observed=("people", "x1", "x2", "x3"), condition_on="people",
                              priors={"c": 1.0, "x1": 1.0, "x2": 1.0, "x3": 1.0})
    assert exact(model, data) == pytest.approx(exact(zoo, data), abs=1e-10)


def test_latent_class_with_a_batched_table_sliced_per_feature():
    def program(x, K=2):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(K)))
        with numpyro.plate("items", x.shape[1], dim=-2), numpyro.plate("classes", K):
            phi = numpyro.sample("phi", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("people", x.shape[0]):
            c = numpyro.sample("c", dist.Categorical(pi))
            for j in range(x.shape[1]):
                numpyro.sample(f"x{j}", dist.Categorical(phi[j, c]), obs=x[:, j])

    x = RNG.integers(0, 3, size=(5, 2))
    model, data = bam.from_numpyro(program, x)
    assert model.tie == () and model.program_info.tables["phi[1, :]"] == ["x1"]
    same = bam.AllocationModel("people; c -> x0; c -> x1", latent={"c": 2}, observed=data.dims,
                               condition_on="people", priors={"c": 1.0, "x0": 1.0, "x1": 1.0})
    assert exact(model, data) == pytest.approx(exact(same, data), abs=1e-10)


def test_tied_table_and_core_gathered_by_two_indices():
    def tucker_tokens(i, j):
        p2 = numpyro.sample("p2", dist.Dirichlet(jnp.full(2, 0.5)))
        with numpyro.plate("r2s", 2):
            p1 = numpyro.sample("p1", dist.Dirichlet(jnp.full(2, 0.5)))
        with numpyro.plate("a", 2), numpyro.plate("b", 2, dim=-2):
            core = numpyro.sample("core", dist.Dirichlet(jnp.full(3, 0.5)))
        with numpyro.plate("r3s", 3):
            W = numpyro.sample("W", dist.Dirichlet(jnp.full(3, 0.5)))
        with numpyro.plate("tokens", len(i)):
            r2 = numpyro.sample("r2", dist.Categorical(p2))
            r1 = numpyro.sample("r1", dist.Categorical(p1[r2]))
            r3 = numpyro.sample("r3", dist.Categorical(core[r2, r1]))
            numpyro.sample("i", dist.Categorical(W[r3]), obs=i)
            numpyro.sample("j", dist.Categorical(W[r3]), obs=j)

    i, j = np.array([0, 2, 1, 2]), np.array([1, 2, 0, 2])
    model, data = bam.from_numpyro(tucker_tokens, i, j)
    assert model.dag.parents["r3"] == ("r2", "r1") and model.tie == (("i", "j"),)
    assert model.program_info.tables["W"] == ["i", "j"]
    same = bam.AllocationModel("tokens; r2 -> r1; (r2, r1) -> r3; r3 -> i; r3 -> j",
                               latent={"r1": 2, "r2": 2, "r3": 3}, observed=("tokens", "i", "j"),
                               condition_on="tokens", tie=[("i", "j")],
                               priors={n: 0.5 for n in ("r1", "r2", "r3", "i", "j")})
    assert exact(model, data) == pytest.approx(exact(same, data), abs=1e-10)


def test_vindex_expand_and_broadcast_sums_are_read():
    from numpyro.ops.indexing import Vindex

    def program(i, j):
        p1 = numpyro.sample("p1", dist.Dirichlet(jnp.full(2, 0.5)))
        core = numpyro.sample("core", dist.Dirichlet(jnp.full(3, 0.5)).expand([2]).to_event(1))
        with numpyro.plate("tokens", len(i)):
            r1 = numpyro.sample("r1", dist.Categorical(p1))
            numpyro.sample("i", dist.Categorical(Vindex(core)[r1]), obs=i)
            numpyro.sample("j", dist.Categorical(p1), obs=j)

    model, data = bam.from_numpyro(program, np.array([0, 2, 2]), np.array([1, 0, 1]))
    assert model.dag.parents["i"] == ("r1",) and model.program_info.tables["p1"] == ["r1", "j"]

    def broadcast(X, a=1.0):
        lam = numpyro.sample("lam", dist.Gamma(a, 0.2))
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.full(2, 0.5)))
        W = numpyro.sample("W", dist.Dirichlet(jnp.full(3, 0.5)).expand([2]).to_event(1))
        H = numpyro.sample("H", dist.Dirichlet(jnp.full(2, 0.5)).expand([2]).to_event(1))
        p = (pi[:, None, None] * W[:, :, None] * H[:, None, :]).sum(0)
        numpyro.sample("X", dist.Poisson(lam * p), obs=X)

    X = np.array([[1, 0], [2, 1], [0, 1]])
    model, data = bam.from_numpyro(broadcast, X)
    same = bam.AllocationModel("k -> i; k -> j", latent={"k": 2}, a=1.0, b=0.2, priors={"k": 0.5, "i": 0.5, "j": 0.5})
    assert exact(model, data) == pytest.approx(exact(same, X), abs=1e-10)


# -- count programs: the zoo round trip with the Gamma–Poisson total ---------------------------------
def _poisson(einsum, tables, operands=None):
    """A Poisson count program: Dirichlet tables in plates, lam ~ Gamma(a, b), X ~ Poisson(lam p)."""

    def program(X, a, b):
        lam = numpyro.sample("lam", dist.Gamma(a, b))
        values = {}
        for name, (batch, size, conc) in tables.items():
            with numpyro.plate_stack(f"{name}_plate", list(batch)):
                values[name] = numpyro.sample(name, dist.Dirichlet(jnp.full(size, conc)))
        p = jnp.einsum(einsum, *[values[n] for n in operands or tables])
        numpyro.sample("X", dist.Poisson(lam * p), obs=X)

    return program


def _zoo_cases(a=1.5):
    I, J, K, R = 2, 3, 4, 2
    return {
        "nmf": (bam.models.nmf(R, a=a), (I, J), "k,ki,kj->ij",
                {"pi": ((), R, a / R), "W": ((R,), I, a / (R * I)), "H": ((R,), J, a / (R * J))}),
        "cp": (bam.models.cp(R, a=a), (I, J, K), "r,ri,rj,rk->ijk",
               {"pi": ((), R, a / R), "A": ((R,), I, a / (R * I)), "B": ((R,), J, a / (R * J)),
                "C": ((R,), K, a / (R * K))}),
        "tucker": (bam.models.tucker((2, 2), a=a), (J, K), "s,sr,ri,sj->ij",
                   {"core2": ((), 2, a / 2), "core1": ((2,), 2, a / 4), "A": ((2,), J, a / (2 * J)),
                    "B": ((2,), K, a / (2 * K))}),
        # Every size 2: only the derivative pattern of the cell probabilities tells the axes apart.
        "tucker_equal_sizes": (bam.models.tucker((2, 2, 2), a=a), (2, 2, 2), "c,cb,cba,ai,bj,ck->ijk",
                               {"core3": ((), 2, a / 2), "core2": ((2,), 2, a / 4), "core1": ((2, 2), 2, a / 8),
                                "A": ((2,), 2, a / 4), "B": ((2,), 2, a / 4), "C": ((2,), 2, a / 4)}),
        "symmetric_nmf": (bam.models.symmetric_nmf(R, a=a), (J, J), "r,ri,rj->ij",
                          {"pi": ((), R, a / R), "W": ((R,), J, 2 * a / (R * J))}),
        "complete_graph": (bam.models.complete_graph(3, a=a), (I, J, K), "i,ij,ijk->ijk",
                           {"pi": ((), I, a / I), "pj": ((I,), J, a / (I * J)),
                            "pk": ((I, J), K, a / (I * J * K))}),
        "independence": (bam.models.independence(3, a=a), (I, J, K), "i,j,k->ijk",
                         {"pi": ((), I, a / I), "pj": ((), J, a / J), "pk": ((), K, a / K)}),
    }


@pytest.mark.parametrize("name", list(_zoo_cases()))
def test_zoo_round_trip_poisson_counts(name):
    zoo, shape, einsum, tables = _zoo_cases()[name]
    X = np.zeros(shape, dtype=int)
    X.flat[RNG.choice(X.size, size=min(X.size, 5), replace=False)] = 1
    b = zoo.a / X.sum()
    operands = ["pi", "W", "W"] if name == "symmetric_nmf" else None
    model, data = bam.from_numpyro(_poisson(einsum, tables, operands), X, zoo.a, b)
    assert model.program_info.form == "poisson" and model.b == pytest.approx(b)
    assert model.priors == {} and model.a == pytest.approx(zoo.a)  # BDeu recognised
    assert exact(model, data) == pytest.approx(exact(zoo, X), abs=1e-10)


@pytest.mark.parametrize("name", ["lda", "tucker", "symmetric_nmf", "complete_graph", "pmf_tensor"])
def test_the_program_bam_ppl_writes_reads_back_as_the_same_model(name):
    zoo, shape = {
        "lda": (bam.models.lda(2), (3, 4)), "tucker": (bam.models.tucker((2, 2)), (3, 2)),
        "symmetric_nmf": (bam.models.symmetric_nmf(2), (3, 3)),
        "complete_graph": (bam.models.complete_graph(3), (2, 3, 2)),
        "pmf_tensor": (bam.models.pmf_tensor(2, alpha_lambda=0.3, num_variables=2), (2, 3)),
    }[name]
    X = np.zeros(shape, dtype=int)
    X.flat[RNG.choice(X.size, size=5, replace=False)] = 1
    X = bam.CountTensor.from_dense(X)
    model, data = bam.from_numpyro(zoo.numpyro_model(), X)
    assert exact(model, data) == pytest.approx(exact(zoo, X), abs=1e-10)


def test_pmf_tensor_round_trip_with_explicit_priors():
    samples = np.array([[0, 1, 2], [1, 1, 0], [0, 0, 2], [1, 1, 2]])
    zoo = bam.models.pmf_tensor(2, alpha_lambda=0.3, alpha=1.2, num_variables=3)
    counts = bam.models.categorical_samples(samples, num_categories=(2, 2, 3))
    tables = {"lam_r": ((), 2, 0.3), "A1": ((2,), 2, 1.2), "A2": ((2,), 2, 1.2), "A3": ((2,), 3, 1.2)}
    program = _poisson("r,ri,rj,rk->ijk", tables)
    model, data = bam.from_numpyro(program, counts.to_dense(), 1.0, 1.0 / counts.total)
    assert sorted(set(model.priors.values())) == [0.3, 1.2]
    assert exact(model, data) == pytest.approx(exact(zoo, counts), abs=1e-10)


def test_pmf_tensor_samples_with_missing_entries_via_obs_mask():
    def pmf(x, rank=2, alpha_lambda=0.3, alpha=1.2):
        lam = numpyro.sample("lam", dist.Dirichlet(jnp.full(rank, alpha_lambda)))
        factors = []
        for n, size in enumerate((2, 3)):
            with numpyro.plate(f"rank_{n}", rank):
                factors.append(numpyro.sample(f"A{n + 1}", dist.Dirichlet(jnp.full(size, alpha))))
        with numpyro.plate("samples", x.shape[0]):
            r = numpyro.sample("r", dist.Categorical(lam))
            for n, A in enumerate(factors):
                numpyro.sample(f"x{n + 1}", dist.Categorical(A[r]), obs=np.maximum(x[:, n], 0),
                               obs_mask=x[:, n] >= 0)

    x = np.array([[0, 1], [1, -1], [-1, 2], [1, 2], [0, 0]])
    model, data = bam.from_numpyro(pmf, x)
    assert data.dims == ("samples", "x1", "x2") and data.has_missing
    zoo = bam.models.pmf_tensor(2, alpha_lambda=0.3, alpha=1.2, num_variables=2)
    counts = bam.models.categorical_samples(x, num_categories=(2, 3))
    # The zoo model carries the Gamma–Poisson total term; the program fixes the number of samples.
    expected = exact(zoo, counts) - zoo.bind(counts).log_total_term() + gammaln(len(x) + 1.0)
    assert exact(model, data) == pytest.approx(expected, abs=1e-10)


def test_lda_multinomial_counts_condition_on_document_totals():
    def lda_counts(X, K=2):
        with numpyro.plate("topics", K):
            phi = numpyro.sample("phi", dist.Dirichlet(jnp.full(X.shape[1], 0.25)))
        with numpyro.plate("docs", X.shape[0]):
            theta = numpyro.sample("theta", dist.Dirichlet(jnp.full(K, 0.5)))
            numpyro.sample("X", dist.Multinomial(X.sum(-1), theta @ phi), obs=X)

    X = np.array([[2, 0, 1, 1], [0, 3, 0, 1], [1, 1, 1, 0]])
    model, data = bam.from_numpyro(lda_counts, X)
    assert model.program_info.form == "multinomial" and model.condition_on == ("docs",)
    zoo = bam.models.lda(2).replace(priors={"k": 0.5, "w": 0.25})
    assert exact(model, data) == pytest.approx(exact(zoo, X), abs=1e-10)


def lda_sampled(docs, num_topics=2, vocab=4):
    """``lda_nested`` without the enumeration flag on ``z``."""
    with numpyro.plate("topics", num_topics):
        phi = numpyro.sample("phi", dist.Dirichlet(jnp.full(vocab, 0.5)))
    with numpyro.plate("documents", docs.shape[1]):
        theta = numpyro.sample("theta", dist.Dirichlet(jnp.ones(num_topics)))
        with numpyro.plate("words", docs.shape[0], dim=-2):
            z = numpyro.sample("z", dist.Categorical(theta))
            numpyro.sample("w", dist.Categorical(phi[z]), obs=docs)


def _same_reading(first, second):
    (m1, d1), (m2, d2) = first, second
    assert repr(m1) == repr(m2) and m1.program_info == m2.program_info
    assert d1.dims == d2.dims and np.array_equal(d1.to_dense(), d2.to_dense())
    assert exact(m1, d1) == exact(m2, d2)


def test_the_enumeration_flag_is_read_as_the_same_model():
    # NumPyro enumerates a latent under NUTS when its site says so (infer={"enumerate":
    # "parallel"}, or config_enumerate on the whole program); the recogniser reads the same model.
    from numpyro.contrib.funsor import config_enumerate

    docs = RNG.integers(0, 4, size=(3, 2))
    plain = bam.from_numpyro(lda_sampled, docs)
    _same_reading(plain, bam.from_numpyro(lda_nested, docs))
    _same_reading(plain, bam.from_numpyro(config_enumerate(lda_sampled), docs))
    x = RNG.integers(0, 3, size=5)
    _same_reading(bam.from_numpyro(mixture, x), bam.from_numpyro(config_enumerate(mixture), x))


def test_a_program_passed_to_infer_or_log_evidence_says_to_read_it_first():
    x = RNG.integers(0, 3, size=5)
    for call in (lambda: bam.infer(mixture, x), lambda: bam.infer(mixture, x, method="gibbs"),
                 lambda: bam.log_evidence(mixture, x), lambda: bam.log_evidence(mixture, x, method="exact"),
                 lambda: bam.compare({"K=2": mixture}, x)):
        with pytest.raises(TypeError, match=r"model, data = bam\.from_numpyro\(mixture"):
            call()


# -- the rest of the API runs on a recognised model ------------------------------------------------
def test_infer_and_compare_run_on_a_recognised_lda():
    doc = np.repeat(np.arange(3), 4)
    words = RNG.integers(0, 4, size=doc.size)
    model, data = bam.from_numpyro(lda_flat, doc, words, 3, 2, 4, 0.5, 0.5)
    idata = bam.infer(model, data, method="gibbs", rng_key=0, num_samples=20, num_warmup=20, num_chains=1)
    assert "theta_w" in idata.posterior
    one, _ = bam.from_numpyro(lda_flat, doc, words, 3, 1, 4, 0.5, 0.5)
    table = bam.compare({"K=1": one, "K=2": model}, data, method="exact")
    assert set(table.index) == {"K=1", "K=2"}


def nmf_program(X, rank, a=1.0):
    """KL-NMF as a NumPyro program: Dirichlet factors in a rank plate, a Gamma total rate."""
    I, J = X.shape
    lam = numpyro.sample("lam", dist.Gamma(a, a / X.sum()))
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.full(rank, a / rank)))
    with numpyro.plate("rank", rank):
        W = numpyro.sample("W", dist.Dirichlet(jnp.full(I, a / (rank * I))))
        H = numpyro.sample("H", dist.Dirichlet(jnp.full(J, a / (rank * J))))
    with numpyro.plate("rows", I, dim=-2), numpyro.plate("cols", J):
        numpyro.sample("X", dist.Poisson(lam * jnp.einsum("k,ki,kj->ij", pi, W, H)), obs=X)


def test_select_ranks_over_a_program_factory():
    X = np.array([[3, 0, 1], [0, 2, 1], [2, 1, 0], [1, 0, 2]])
    model, data = bam.from_numpyro(nmf_program, X, 2)
    assert str(model.dag) == "rank -> rows; rank -> cols" and data.dims == ("rows", "cols")
    table = bam.select_ranks(lambda rank: bam.from_numpyro(nmf_program, X, rank)[0], X, {"rank": [1, 2]},
                             heldout_axes=(0, 1), heldout_fraction=0.25, folds=1, rng_key=0,
                             num_iters=20, num_chains=1)
    assert list(table["rank"]) == [1, 2] and table["selected"].sum() == 1


# -- refusals --------------------------------------------------------------------------------------
def _refused(program, site, *args):
    with pytest.raises(ValueError, match=repr(site).replace("[", r"\[")):
        bam.from_numpyro(program, *args)


X_TOKENS = np.array([0, 2, 1, 1])


def test_refuses_a_continuous_prior_on_a_table():
    def program(x):
        logits = numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with numpyro.plate("data", len(x)):
            numpyro.sample("x", dist.Categorical(jax_softmax(logits)), obs=x)

    _refused(program, "theta", X_TOKENS)


def jax_softmax(v):
    e = jnp.exp(v - v.max())
    return e / e.sum()


def test_refuses_a_non_dirichlet_prior():
    def program(x):
        w = numpyro.sample("w", dist.Gamma(jnp.ones(3)).to_event(1))
        with numpyro.plate("data", len(x)):
            numpyro.sample("x", dist.Categorical(w / w.sum()), obs=x)

    _refused(program, "w", X_TOKENS)


def test_refuses_a_likelihood_that_is_not_categorical():
    def program(y):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(2)))
        with numpyro.plate("data", len(y)):
            z = numpyro.sample("z", dist.Categorical(pi))
            numpyro.sample("y", dist.Normal(z * 1.0, 1.0), obs=y)

    _refused(program, "y", np.zeros(4))


def test_refuses_an_index_computed_from_a_latent():
    def program(x):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("components", 3):
            phi = numpyro.sample("phi", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("data", len(x)):
            z = numpyro.sample("z", dist.Categorical(pi))
            numpyro.sample("x", dist.Categorical(phi[(z + 1) % 3]), obs=x)

    _refused(program, "x", X_TOKENS)


def test_refuses_probabilities_that_are_not_a_table_column():
    def program(x):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("data", len(x)):
            numpyro.sample("x", dist.Categorical(0.5 * pi + 0.5 / 3), obs=x)

    _refused(program, "x", X_TOKENS)


def test_refuses_index_sites_in_different_plates():
    def program(x, y):
        p = numpyro.sample("p", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("first", len(x)):
            numpyro.sample("x", dist.Categorical(p), obs=x)
        with numpyro.plate("second", len(y)):
            numpyro.sample("y", dist.Categorical(p), obs=y)

    _refused(program, "y", X_TOKENS, X_TOKENS)


def test_refuses_logits_asymmetric_and_dependent_concentrations():
    def logits(x):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("data", len(x)):
            numpyro.sample("x", dist.Categorical(logits=jnp.log(pi)), obs=x)

    def asymmetric(x):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.array([1.0, 2.0, 3.0])))
        with numpyro.plate("data", len(x)):
            numpyro.sample("x", dist.Categorical(pi), obs=x)

    def hierarchical(x):
        base = numpyro.sample("base", dist.Dirichlet(jnp.ones(3)))
        pi = numpyro.sample("pi", dist.Dirichlet(10.0 * base))
        with numpyro.plate("data", len(x)):
            numpyro.sample("x", dist.Categorical(pi), obs=x)

    _refused(logits, "x", X_TOKENS)
    _refused(asymmetric, "pi", X_TOKENS)
    _refused(hierarchical, "pi", X_TOKENS)


def test_refuses_poisson_counts_without_a_gamma_rate_or_with_another_rate():
    def no_rate(X):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(2)))
        with numpyro.plate("k", 2):
            W = numpyro.sample("W", dist.Dirichlet(jnp.ones(3)))
        numpyro.sample("X", dist.Poisson(10.0 * pi @ W), obs=X)

    def squared(X):
        lam = numpyro.sample("lam", dist.Gamma(1.0, 1.0))
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(2)))
        with numpyro.plate("k", 2):
            W = numpyro.sample("W", dist.Dirichlet(jnp.ones(3)))
        numpyro.sample("X", dist.Poisson(lam * (pi @ W) ** 2), obs=X)

    X = np.array([1, 0, 2])
    _refused(no_rate, "X", X)
    _refused(squared, "X", X)


def test_refuses_param_sites_and_bad_model_fn():
    def with_param(x):
        pi = numpyro.param("pi", jnp.ones(3) / 3)
        with numpyro.plate("data", len(x)):
            numpyro.sample("x", dist.Categorical(pi), obs=x)

    def with_factor(x):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(3)))
        numpyro.factor("penalty", -jnp.sum(pi ** 2))
        with numpyro.plate("data", len(x)):
            numpyro.sample("x", dist.Categorical(pi), obs=x)

    def masked(X):
        lam = numpyro.sample("lam", dist.Gamma(1.0, 1.0))
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(3)))
        with numpyro.handlers.mask(mask=X > 0):
            numpyro.sample("X", dist.Poisson(lam * pi), obs=X)

    def subsampled(x):
        pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(3)))
        with numpyro.plate("data", len(x), subsample_size=2) as idx:
            numpyro.sample("x", dist.Categorical(pi), obs=x[idx])

    _refused(with_param, "pi", X_TOKENS)
    _refused(with_factor, "penalty", X_TOKENS)
    _refused(masked, "X", np.array([1, 0, 2]))
    _refused(subsampled, "data", X_TOKENS)
    with pytest.raises(TypeError, match="model_fn"):
        bam.from_numpyro("not a program")
