"""bam.plot_evidence: names on the axis for unrelated models, lower bounds drawn as such."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import bam_ppl as bam  # noqa: E402


def _table(names, values, stderr, kinds, methods):
    return pd.DataFrame({"log_evidence": values, "stderr": stderr, "kind": kinds, "method": methods},
                        index=pd.Index(names, name="model"))


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _markers(ax):
    """(x, y, marker, filled) of every plotted point except the 'largest' star."""
    points = []
    for line in ax.lines:
        if line.get_linestyle() not in ("None", "none", "") or line.get_marker() not in ("o", "s", "^"):
            continue  # lines, the star and the error bars' caps
        for x, y in zip(line.get_xdata(), line.get_ydata()):
            points.append((float(x), float(y), line.get_marker(), line.get_fillstyle() != "none"))
    return sorted(points)


def test_unrelated_models_are_labelled_by_name_without_a_line():
    names = ["independence", "CP(R=2)", "CP(R=3)", "tucker(2, 2)", "complete"]
    table = _table(names, [-150.0, -140.0, -138.0, -139.5, -160.0], [0.0, 0.5, 0.8, 0.3, 1.0],
                   ["exact", "estimate", "estimate", "estimate", "estimate"], ["exact"] + ["smc"] * 4)
    ax = bam.plot_evidence(table)
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    np.testing.assert_array_equal(ax.get_xticks(), np.arange(5))
    assert ax.get_xlabel() == "model"
    # No line joins unrelated models: every drawn line is markers only.
    assert all(line.get_linestyle() in ("None", "none") for line in ax.lines)
    points = _markers(ax)
    assert [(x, y) for x, y, _, _ in points] == list(zip(range(5), table["log_evidence"]))
    assert {m for _, _, m, _ in points} == {"s", "o"}  # exact square, estimates circles
    # Error bars (± 2 se) on the estimates only.
    (bars,) = [c for c in ax.containers if c.has_yerr]
    heights = sorted(seg[1, 1] - seg[0, 1] for seg in bars.lines[2][0].get_segments())
    np.testing.assert_allclose(heights, sorted(4 * np.array([0.5, 0.8, 0.3, 1.0])))


def test_lower_bound_is_an_open_one_sided_marker():
    table = _table(["R=1", "R=2", "R=3", "R=4"], [-150.0, -140.0, -138.0, -139.0], [1.0, 0.5, 0.8, 0.0],
                   ["estimate", "estimate", "estimate", "lower_bound"], ["smc", "smc", "smc", "vb"])
    ax = bam.plot_evidence(table, xlabel="rank R")
    # Names ending in a number: ordered by it and joined by one line.
    (joined,) = [line for line in ax.lines if line.get_linestyle() not in ("None", "none")]
    np.testing.assert_array_equal(joined.get_xdata(), [1, 2, 3, 4])
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 4]
    assert ticks == [round(t) for t in ticks]  # ranks: whole-number ticks only
    assert bam.plot_evidence(table).get_xlabel() == "R"  # what the names count
    named = table.rename(index=lambda name: f"CP({name})")  # no trailing number: placed by x, not named
    assert bam.plot_evidence(named, x=[1, 2, 3, 4]).get_xlabel() == "model order"
    points = {(x, y): (m, filled) for x, y, m, filled in _markers(ax)}
    assert points[(4.0, -139.0)] == ("^", False)  # the lower bound: open triangle
    assert all(filled for (x, _), (_, filled) in points.items() if x < 4)
    # Its bar points upwards only (lolims), starting at the bound.
    lower = [c for c in ax.containers if c.lines[0] is not None and c.lines[0].get_marker() == "^"]
    assert len(lower) == 1
    (segments,) = [seg for seg in lower[0].lines[2][0].get_segments()]
    assert segments[0, 1] == pytest.approx(-139.0) and segments[1, 1] > -139.0
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("lower bound" in label for label in labels) and any("estimate" in label for label in labels)


def test_explicit_positions_and_bad_tables():
    table = _table(["a", "b"], [-3.0, -2.0], [0.1, 0.1], ["estimate"] * 2, ["smc"] * 2)
    ax = bam.plot_evidence(table, x={"a": 2, "b": 5})
    assert sorted(x for x, *_ in _markers(ax)) == [2.0, 5.0]
    with pytest.raises(ValueError, match="no position"):
        bam.plot_evidence(table, x={"a": 1})
    with pytest.raises(TypeError, match="compare"):
        bam.plot_evidence(pd.DataFrame({"x": [1]}))
    with pytest.raises(ValueError, match="errorbars"):
        bam.plot_evidence(table, errorbars=-1)


@pytest.fixture(scope="module")
def small_fit():
    X = np.array([[5, 0, 1, 2], [0, 6, 2, 0], [1, 0, 4, 3]])
    return bam.infer(bam.models.nmf(3), X, method="smc", rng_key=0, num_particles=64, num_chains=2,
                     progress_bar=False)


def test_plot_trace_picks_a_few_variables(small_fit):
    """The default az.plot_trace / plot_dist of ArviZ 1.x give one panel per table entry (too many)."""
    from bam_ppl.convert import group

    names = bam.plot_var_names(small_fit)
    post = group(small_fit, "posterior")
    sizes = {n: int(np.prod([s for d, s in post[n].sizes.items() if d not in ("chain", "draw")])) for n in names}
    assert names[0] == "total_rate" and "theta_k" in names
    assert sum(sizes.values()) <= 8
    assert bam.plot_var_names(small_fit, max_panels=1) == ["total_rate"]
    with pytest.raises(ValueError, match="max_panels"):
        bam.plot_var_names(small_fit, max_panels=0)
    bam.plot_trace(small_fit)
    bam.plot_trace(small_fit, var_names="theta_k")


def test_inference_data_round_trips_through_netcdf(small_fit, tmp_path):
    """to_netcdf needs netCDF4 or h5netcdf: h5netcdf is a dependency."""
    from bam_ppl.convert import group, import_arviz

    az = import_arviz()
    path = tmp_path / "fit.nc"
    small_fit.to_netcdf(str(path))
    loaded = az.from_netcdf(str(path))
    np.testing.assert_allclose(group(loaded, "posterior")["theta_k"].values,
                               group(small_fit, "posterior")["theta_k"].values)


def test_plot_compare_draws_rows_best_on_top_with_se_and_dse_bars():
    table = pd.DataFrame({"log_evidence": [-12.0, -10.0, -15.0], "se": [0.5, 0.2, 0.0], "dse": [0.54, 0.0, 0.2],
                          "kind": ["estimate", "estimate", "exact"]}, index=["a", "b", "c"])
    ax = bam.plot_compare(table)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "a", "c"]
    # The dashed line at the best value, and a grey difference marker for each model but the best.
    assert any(np.allclose(line.get_xdata(), -10.0) for line in ax.lines if line.get_linestyle() == "--")
    grey = [c for c in ax.containers if c.lines[0].get_color() == "grey"]
    assert len(grey) == 1 and np.allclose(grey[0].lines[0].get_xdata(), [-12.0, -15.0])
    with pytest.raises(TypeError, match="table"):
        bam.plot_compare({"log_evidence": [1.0]})
    with pytest.raises(ValueError, match="errorbars"):
        bam.plot_compare(table, errorbars=-1)
