import numpy as np
import pytest

import bam_ppl as bam
from bam_ppl.convert import attrs_of, to_inference_data


def test_methods_lists_numpyro_backends():
    table = bam.methods()
    assert {"nuts", "svi"} <= set(table["method"])
    assert {"method", "models", "description"} <= set(table.columns)


def test_unknown_method_lists_registered():
    with pytest.raises(ValueError, match=r"unknown method 'nope'; registered methods: \[.*'nuts'"):
        bam.infer(bam.models.nmf(2), np.ones((2, 2), int), method="nope")
    with pytest.raises(ValueError, match="unknown evidence method"):
        bam.log_evidence(bam.models.nmf(2), np.ones((2, 2), int), method="nope")


def test_user_backend_registers_with_decorator():
    class MyModel:
        default_method = "constant_fit"

    @bam.register("constant_fit", models=(MyModel,))
    def constant_fit(model, data, *, rng_key=0, value=1.0):
        """A toy backend defined outside the package."""
        draws = np.full((1, 3), value)
        return to_inference_data({"posterior": {"mu": (("chain", "draw"), draws)}},
                                 attrs={"method": "constant_fit"})

    idata = bam.infer(MyModel(), None, value=2.5)
    assert float(idata.posterior["mu"].mean()) == 2.5
    assert attrs_of(idata)["inference_library"] == "bam_ppl"
    assert "constant_fit" in set(bam.methods()["method"])
    with pytest.raises(TypeError, match="accepts models of type"):
        bam.infer(bam.models.nmf(2), np.ones((2, 2), int), method="constant_fit")


def test_subclass_backend_wins():
    class Special(bam.AllocationModel):
        pass

    @bam.register("svi", models=(Special,))
    def special_svi(model, data, *, rng_key=0):
        return to_inference_data({"posterior": {"mu": (("chain", "draw"), np.zeros((1, 1)))}},
                                 attrs={"method": "special"})

    m = Special("k -> i; k -> j", latent={"k": 2})
    assert attrs_of(bam.infer(m, np.ones((2, 2), int), method="svi"))["method"] == "special"


def test_registry_guards():
    class Toy:
        pass

    @bam.register("toy_fit", models=(Toy,))
    def toy_fit(model, data, *, rng_key=0, size=1, _first_chain=0):  # a private option is not advertised
        return {"not": "inference data"}

    with pytest.raises(TypeError, match="returned dict, not InferenceData"):
        bam.infer(Toy(), None, method="toy_fit")
    with pytest.raises(TypeError, match=r"bam.infer\(method='toy_fit'\): unknown option\(s\) \['sise'\]; valid options: \['size'\]"):
        bam.infer(Toy(), None, method="toy_fit", sise=2)
    with pytest.warns(UserWarning, match="already registered"):
        bam.register("toy_fit", models=(Toy,))(lambda model, data, *, rng_key=0: None)
    with pytest.raises(TypeError, match=r"bam.log_evidence\(method='exact'\): unknown option.*max_tensors"):
        bam.log_evidence(bam.models.nmf(1), np.ones((2, 2), int), method="exact", num_particles=10)


def test_user_evidence_and_compare():
    @bam.register_evidence("fixed_value")
    def fixed(model, data, *, rng_key=0):
        return bam.EvidenceEstimate(value=-float(model.a), stderr=0.1, method="fixed_value", kind="estimate")

    X = np.array([[1, 2], [3, 4]])
    models = {"a=1": bam.models.nmf(1, a=1.0), "a=3": bam.models.nmf(1, a=3.0),
              "given": bam.EvidenceEstimate(-2.0, 0.0, "exact", "exact")}
    table = bam.compare(models, X, method="fixed_value")
    assert list(table.index) == ["a=1", "given", "a=3"]
    assert table.loc["a=1", "rank"] == 1 and table.loc["a=3", "delta"] == pytest.approx(2.0)
    assert table.loc["a=3", "log_bayes_factor"] == pytest.approx(-2.0)
    assert table["prob"].sum() == pytest.approx(1.0)
    assert table.loc["given", "kind"] == "exact"
    est = bam.log_evidence(bam.models.nmf(1), X, method="exact")
    assert float(est) == est.value and "exact" in repr(est)
    with pytest.raises(ValueError, match="kind"):
        bam.EvidenceEstimate(0.0, 0.0, "x", "guess")


def test_bad_rng_key():
    with pytest.raises(TypeError, match="rng_key"):
        bam.infer(bam.models.nmf(2), np.ones((2, 2), int), method="nuts", rng_key="zero")
