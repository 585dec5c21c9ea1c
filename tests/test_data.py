import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import bam_ppl as bam
from bam_ppl import CountTensor
from bam_ppl.data import as_count_tensor, match_dims


def test_dense_roundtrip_and_views():
    X = np.array([[2, 0, 1], [0, 0, 3]])
    t = CountTensor.from_dense(X)
    assert t.shape == (2, 3) and t.nnz == 3 and t.total == 6
    np.testing.assert_array_equal(t.to_dense(), X)
    assert sorted(map(tuple, t.tokens())) == sorted([(0, 0)] * 2 + [(0, 2)] + [(1, 2)] * 3)
    assert as_count_tensor(X.astype(float)).total == 6


def test_tokens_sparse_dataframe():
    tok = np.array([[0, 1], [0, 1], [1, 0]])
    t = CountTensor.from_tokens(tok, (2, 2))
    np.testing.assert_array_equal(t.to_dense(), [[0, 2], [1, 0]])
    s = CountTensor.from_sparse(sp.csr_matrix(np.array([[0, 2], [1, 0]])))
    np.testing.assert_array_equal(s.to_dense(), [[0, 2], [1, 0]])
    df = pd.DataFrame({"hair": ["Black", "Red", "Red"], "sex": ["M", "F", "M"], "Freq": [3, 1, 2]})
    d = CountTensor.from_dataframe(df, dims=["hair", "sex"], count="Freq")
    assert d.coords == {"hair": ["Black", "Red"], "sex": ["F", "M"]}
    assert d.to_dense().tolist() == [[0, 3], [1, 2]]


def test_samples_with_missing():
    samples = np.array([[0, 1], [0, -1], [1, np.nan], [0, 1]], dtype=float)
    t = CountTensor.from_samples(samples)
    assert t.has_missing and t.total == 4 and t.shape == (2, 2)
    assert {tuple(r): c for r, c in zip(t.indices, t.counts)} == {(0, 1): 2, (0, -1): 1, (1, -1): 1}
    # An all-missing row carries no information: dropped with a warning; all rows missing: error.
    with pytest.warns(UserWarning, match="dropped 1 of 2 row"):
        dropped = CountTensor.from_samples(np.array([[0, 1], [-1, -1]]))
    assert dropped.total == 1 and dropped.indices.tolist() == [[0, 1]]
    with pytest.raises(ValueError, match="samples has every entry missing"):
        CountTensor.from_samples(np.array([[-1, -1], [-1, -1]]))


@pytest.mark.parametrize(
    "bad, err, match",
    [
        (np.array([[1, -1]]), ValueError, "negative"),
        (np.array([[1.5, 1]]), ValueError, "non-integer"),
        (np.array([[np.nan, 1]]), ValueError, "NaN"),
        (np.zeros((0, 3)), ValueError, "empty"),
        (np.array([["a", "b"]]), TypeError, "numbers"),
        ({"a": 1}, TypeError, "array of counts"),
        (None, TypeError, "None"),
        (pd.DataFrame({"a": [1]}), TypeError, "ambiguous"),
        (pd.Series([1, 2]), TypeError, "named levels"),
        (np.array(3), ValueError, "at least one axis"),
    ],
)
def test_bad_counts(bad, err, match):
    with pytest.raises(err, match=match):
        as_count_tensor(bad)


def test_pandas_counts_by_named_levels_and_crosstabs_read_as_their_cells():
    """What pandas users tabulate with: df.value_counts() and groupby(...).size() (a Series indexed by
    named levels), and pd.crosstab (a table whose index and columns name two nodes); any order."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"hair": rng.choice(["black", "red", "brown"], 60), "eye": rng.choice(["blue", "green"], 60),
                       "sex": rng.choice(["f", "m"], 60)})
    expected = CountTensor.from_dataframe(df, ["hair", "eye", "sex"], count=None)
    for counts in (df[["sex", "hair", "eye"]].value_counts(), df.groupby(["eye", "sex", "hair"]).size()):
        X = match_dims(as_count_tensor(counts), ("hair", "eye", "sex"))
        np.testing.assert_array_equal(X.to_dense(), expected.to_dense())
        assert X.coords == expected.coords
    model = bam.AllocationModel("r -> hair, eye", latent={"r": 2}, observed=("hair", "eye"))
    two_way = CountTensor.from_dataframe(df, ["hair", "eye"], count=None)
    for table in (pd.crosstab(df.hair, df.eye), pd.crosstab(df.eye, df.hair)):
        np.testing.assert_array_equal(model.as_data(table).to_dense(), two_way.to_dense())
    with pytest.raises(ValueError, match="no column for node"):
        model.as_data(pd.crosstab(df.hair, df.sex))


def test_bad_indices():
    with pytest.raises(ValueError, match="out of range"):
        CountTensor([[0, 5]], [1], (2, 2))
    with pytest.raises(ValueError, match="shape"):
        CountTensor([[0, 1, 1]], [1], (2, 2))
    with pytest.raises(ValueError, match="coords"):
        CountTensor([[0, 1]], [1], (2, 2), dims=("a", "b"), coords={"a": ["x"]})


def test_to_xarray_and_to_dataframe_round_trip():
    from bam_ppl.datasets import load_hair_eye_color

    X = load_hair_eye_color()
    array = X.to_xarray()
    assert array.dims == ("hair", "eye", "sex") and list(array["eye"].values) == X.coords["eye"]
    assert int(array.sel(hair="Black", eye="Brown", sex="Male")) == 32 and int(array.sum()) == X.total
    back = as_count_tensor(array)
    assert back.dims == X.dims and back.coords == X.coords and np.array_equal(back.to_dense(), X.to_dense())

    table = X.to_dataframe()
    assert list(table.columns) == ["hair", "eye", "sex", "count"] and len(table) == X.nnz
    assert table["count"].sum() == X.total and (table["count"] > 0).all()
    first = table.iloc[0]
    assert (first["hair"], first["eye"], first["sex"], first["count"]) == ("Black", "Brown", "Male", 32)
    again = CountTensor.from_dataframe(table, dims=X.dims, count="count")
    assert again.coords == X.coords and np.array_equal(again.to_dense(), X.to_dense())


def test_to_dataframe_keeps_empty_labels_and_unnamed_axes():
    X = CountTensor.from_dense(np.array([[0, 2, 0], [0, 0, 0]]), dims=("row", "col"),
                               coords={"row": ["a", "b"], "col": ["x", "y", "z"]})
    table = X.to_dataframe(count="n")
    assert table.to_dict("list") == {"row": ["a"], "col": ["y"], "n": [2]}
    back = CountTensor.from_dataframe(table, dims=("row", "col"), count="n")
    assert back.shape == (2, 3) and back.coords == X.coords  # the categories keep the empty labels
    plain = CountTensor.from_dense(np.array([[1, 0], [0, 3]]))
    assert plain.to_xarray().dims == ("dim_0", "dim_1")
    assert plain.to_dataframe().to_dict("list") == {"dim_0": [0, 1], "dim_1": [0, 1], "count": [1, 3]}
    with pytest.raises(ValueError, match="count must be a column name"):
        X.to_dataframe(count="row")
    missing = CountTensor.from_samples(np.array([[0, -1], [1, 1]]))
    assert missing.to_dataframe()["dim_1"].isna().sum() == 1
    with pytest.raises(ValueError, match="no dense form"):
        missing.to_xarray()
