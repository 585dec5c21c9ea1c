"""The bam-ppl command line on a user's own tables."""

import itertools

import numpy as np
import pandas as pd
import pytest

from bam_ppl.cli import main


@pytest.fixture
def survey_csv(tmp_path):
    rng = np.random.default_rng(0)
    p_yes = {"young": 0.8, "mid": 0.5, "old": 0.2}
    rows = []
    for age, region in itertools.product(p_yes, ["N", "E", "S"]):
        n = rng.poisson(10)
        yes = rng.binomial(n, p_yes[age])
        rows += [dict(region=region, Freq=yes, vote="yes", age=age),
                 dict(region=region, Freq=n - yes, vote="no", age=age)]
    path = tmp_path / "survey.csv"
    pd.DataFrame(rows).to_csv(path, index=False)  # columns in another order than the structure
    return path


def test_evidence_of_structures_and_ranks(survey_csv, tmp_path, capsys):
    out, png = tmp_path / "table.csv", tmp_path / "ranks.png"
    assert main(["evidence", str(survey_csv), "--structure", "r -> age, vote, region", "--latent", "r=1..2",
                 "--count", "Freq", "--out", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "dims=('age', 'vote', 'region')" in printed and "r=2" in printed
    table = pd.read_csv(out, index_col=0)
    assert set(table.index) == {"r=1", "r=2"} and "distinguishable" in table
    assert png.stat().st_size > 0
    # The graph the user wrote, read by column name: age -> vote beats age -> region.
    values = {}
    for structure in ("age -> vote; region", "age -> region; vote"):
        main(["evidence", str(survey_csv), "--structure", structure, "--out", str(out)])
        values[structure] = pd.read_csv(out, index_col=0)["log_evidence"].iloc[0]
    assert values["age -> vote; region"] > values["age -> region; vote"]


def test_wide_table_and_fit_writes_netcdf(tmp_path, capsys):
    X = np.random.default_rng(1).poisson(1.0, (6, 5))
    wide = tmp_path / "wide.csv"
    pd.DataFrame(X, index=[f"r{i}" for i in range(6)], columns=[f"c{j}" for j in range(5)]).to_csv(wide)
    assert main(["evidence", str(wide), "--wide", "--structure", "k -> i; k -> j", "--latent", "k=1"]) == 0
    assert "shape=(6, 5)" in capsys.readouterr().out
    nc = tmp_path / "fit.nc"
    assert main(["fit", str(wide), "--wide", "--structure", "k -> i; k -> j", "--latent", "k=2",
                 "--option", "num_samples=5", "--option", "num_warmup=2", "--option", "num_chains=1",
                 "--option", "progress_bar=False", "--out", str(nc)]) == 0
    import xarray as xr

    assert "theta_i" in xr.open_dataset(nc, group="posterior")


@pytest.mark.parametrize("argv, message", [
    (["evidence", "missing.csv", "--structure", "i"], "no such file"),
    (["evidence", "{csv}", "--structure", "age -> ballot"], r"no column\(s\) \['ballot'\]"),
    (["evidence", "{csv}", "--structure", "r -> age", "--latent", "r=x"], "NAME=SIZE"),
    (["evidence", "{csv}", "--structure", "age -> vote; region", "--option", "num_chainz=2"], "unknown option"),
    (["fit", "{csv}", "--structure", "r -> age, vote, region", "--latent", "r=1..2"], "one model"),
    (["evidence", "{csv}", "--structure", "age -> vote; region", "--wide"], "two visible nodes"),
])
def test_bad_input_gets_a_clear_message(survey_csv, capsys, argv, message):
    argv = [a.replace("{csv}", str(survey_csv)) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert pytest.importorskip("re").search(message, err)
