"""The bam-ppl command line on a user's own tables."""

import itertools

import numpy as np
import pandas as pd
import pytest
import xarray as xr

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


def test_version_and_plain_help(capsys):
    from bam_ppl import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"bam-ppl {__version__}"
    pages = {}
    for command in ([], ["evidence"], ["fit"], ["methods"], ["demo"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        pages[" ".join(command)] = capsys.readouterr().out
    for page in pages.values():
        assert "``" not in page and ":func:" not in page and ":mod:" not in page  # no reStructuredText
    assert "Run bam-ppl COMMAND --help" in pages[""]
    assert not any("Run bam-ppl COMMAND --help" in page for command, page in pages.items() if command)
    assert "--target-stderr" in pages["evidence"] and "--jobs N" in pages["fit"]


def test_several_structures_in_one_json_table(survey_csv, capsys):
    import json

    assert main(["evidence", str(survey_csv), "--count", "Freq", "--json", "--structure", "age -> vote; region",
                 "--structure", "age -> region; vote", "--structure", "r -> age, vote, region",
                 "--latent", "r=1..2"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # stdout holds the JSON alone
    names = [row["model"] for row in result["models"]]
    assert sorted(names) == sorted(["age -> vote; region", "age -> region; vote", "r -> age, vote, region (r=1)",
                                    "r -> age, vote, region (r=2)"])
    assert [row["rank"] for row in result["models"]] == [1, 2, 3, 4]
    assert {"log_evidence", "se", "dse", "weight", "warning", "kind", "method", "lower_bound"} <= set(result["models"][0])
    assert names.index("age -> vote; region") < names.index("age -> region; vote")
    assert "survey.csv" in captured.err


def test_structures_must_share_their_visible_nodes(survey_csv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["evidence", str(survey_csv), "--count", "Freq", "--structure", "age -> vote; region",
              "--structure", "age -> vote"])
    assert exit_info.value.code == 2 and "same visible nodes" in capsys.readouterr().err


def test_precision_options_of_evidence(survey_csv, capsys):
    import json

    common = ["evidence", str(survey_csv), "--count", "Freq", "--structure", "r -> age, vote, region",
              "--latent", "r=2", "--method", "smc", "--option", "num_particles=20", "--json"]
    assert main([*common, "--min-calls", "2"]) == 0
    [row] = json.loads(capsys.readouterr().out)["models"]
    assert row["kind"] == "estimate" and row["se"] > 0
    assert main([*common, "--target-stderr", "1000", "--max-time", "60"]) == 0
    [row] = json.loads(capsys.readouterr().out)["models"]
    assert row["method"] == "smc"
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--target-stderr", "-1"])
    assert exit_info.value.code == 2 and "positive float" in capsys.readouterr().err


def test_jobs_runs_models_in_processes_with_the_serial_result(survey_csv, tmp_path):
    serial, parallel = tmp_path / "serial.csv", tmp_path / "parallel.csv"
    argv = ["evidence", str(survey_csv), "--count", "Freq", "--method", "exact",
            "--structure", "age -> vote; region", "--structure", "age -> region; vote"]
    assert main([*argv, "--out", str(serial)]) == 0
    assert main([*argv, "--jobs", "2", "--out", str(parallel)]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(serial, index_col=0), pd.read_csv(parallel, index_col=0))


def test_jobs_and_scheduler_exclude_each_other(survey_csv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["evidence", str(survey_csv), "--structure", "age", "--jobs", "2", "--scheduler", "tcp://x:1"])
    assert exit_info.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_fit_writes_a_default_file_and_says_where(survey_csv, tmp_path, monkeypatch, capsys):
    import json

    monkeypatch.chdir(tmp_path)
    argv = ["fit", str(survey_csv), "--count", "Freq", "--structure", "r -> age, vote, region", "--latent", "r=2",
            "--option", "num_samples=3", "--option", "num_warmup=2", "--option", "num_chains=1"]
    assert main(argv) == 0
    written = tmp_path / "survey.gibbs.nc"
    printed = capsys.readouterr().out
    assert written.stat().st_size > 0 and f"wrote {written}" in printed and "r_hat" not in printed  # one chain
    assert main([*argv[:-2], "--option", "num_chains=2"]) == 0
    assert "largest r_hat of theta_r:" in capsys.readouterr().out
    assert main([*argv[:-6], "--method", "vb", "--json", "--option", "num_iters=5"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["out"] == str(tmp_path / "survey.vb.nc") and "posterior" in result["groups"]


def test_methods_lists_backends_and_evidence_estimators(capsys):
    import json

    assert main(["methods"]) == 0
    printed = capsys.readouterr().out
    assert "inference backends" in printed and "evidence estimators" in printed and "tempered" in printed
    assert "``" not in printed and ":func:" not in printed
    assert main(["methods", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {"auto", "exact", "tempered", "chib", "smc", "vb"} <= {row["method"] for row in listed["evidence"]}
    assert "gibbs" in {row["method"] for row in listed["inference"]}
    import bam_ppl as bam

    with pytest.raises(ValueError, match="kind must be 'inference' or 'evidence'"):
        bam.methods("estimators")


def test_bad_option_values_are_usage_errors_and_bugs_keep_their_traceback(survey_csv, monkeypatch, capsys):
    argv = ["evidence", str(survey_csv), "--count", "Freq", "--structure", "r -> age, vote, region",
            "--latent", "r=2", "--method", "smc"]
    with pytest.raises(SystemExit) as exit_info:  # bam_ppl.validation's check: the user's mistake
        main([*argv, "--option", "num_particles=0"])
    assert exit_info.value.code == 2 and "num_particles must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # auto's own knob, checked before any work
        main([*argv[:-2], "--option", "effort=-1"])
    assert exit_info.value.code == 2 and "effort must be > 0" in capsys.readouterr().err

    import bam_ppl

    def broken(*args, **kwargs):
        raise ValueError("an internal error")

    monkeypatch.setattr(bam_ppl, "compare", broken)
    with pytest.raises(ValueError, match="an internal error"):  # not a one-line usage error
        main(argv)


def test_verbose_logs_the_stages_on_stderr(survey_csv, capsys):
    import logging

    logger = logging.getLogger("bam_ppl")
    handlers, level = list(logger.handlers), logger.level
    try:
        assert main(["evidence", str(survey_csv), "--count", "Freq", "--structure", "age -> vote; region",
                     "-vv"]) == 0
    finally:
        logger.handlers[:], logger.level = handlers, level
    err = capsys.readouterr().err
    assert "auto evidence: exact" in err and "log_evidence(method='auto')" in err


def test_scheduler_sends_the_work_to_a_dask_cluster(survey_csv, tmp_path):
    distributed = pytest.importorskip("distributed")
    serial, remote = tmp_path / "serial.csv", tmp_path / "remote.csv"
    argv = ["evidence", str(survey_csv), "--count", "Freq", "--method", "exact",
            "--structure", "age -> vote; region", "--structure", "age -> region; vote"]
    assert main([*argv, "--out", str(serial)]) == 0
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        assert main([*argv, "--scheduler", cluster.scheduler_address, "--out", str(remote)]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(serial, index_col=0), pd.read_csv(remote, index_col=0))


def test_unreachable_scheduler_is_a_usage_error(survey_csv, capsys):
    pytest.importorskip("distributed")
    with pytest.raises(SystemExit) as exit_info:
        main(["evidence", str(survey_csv), "--count", "Freq", "--structure", "age -> vote; region",
              "--scheduler", "bogus://nowhere:1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "cannot connect" in err and "Traceback" not in err


def test_the_clis_dask_clients_leave_nothing_behind(survey_csv, tmp_path):
    # A client left as the process's default (one that failed to connect, say) would make xarray
    # lock every file it writes through it.
    distributed = pytest.importorskip("distributed")
    argv = ["evidence", str(survey_csv), "--count", "Freq", "--method", "exact", "--structure", "age -> vote; region"]
    xr.Dataset({"a": ("x", [1, 2])}).to_netcdf(tmp_path / "before.nc")
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        assert main([*argv, "--scheduler", cluster.scheduler_address]) == 0
    with pytest.raises(SystemExit):
        main([*argv, "--scheduler", "bogus://nowhere:1"])
    xr.Dataset({"a": ("x", [1, 2])}).to_netcdf(tmp_path / "a.nc")


def test_effort_is_the_default_estimators_cost_knob(survey_csv, monkeypatch, capsys):
    import json

    import bam_ppl

    compare, given = bam_ppl.compare, {}

    def spy(*args, **kwargs):
        given.update(kwargs)
        return compare(*args, **kwargs)

    monkeypatch.setattr(bam_ppl, "compare", spy)
    argv = ["evidence", str(survey_csv), "--count", "Freq", "--structure", "age -> vote; region"]
    assert main([*argv, "--effort", "0.25", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["models"]
    assert given["effort"] == 0.25 and row["method"] == "auto" and row["log_evidence"] < 0
    for extra, message in [(["--effort", "0"], "positive float"),
                           (["--effort", "2", "--option", "effort=2"], "give the effort once"),
                           (["--effort", "2", "--method", "smc"], "--method/--option/--effort: evidence --method smc: "
                                                                  "unknown option(s) ['effort']")]:
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, *extra])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
