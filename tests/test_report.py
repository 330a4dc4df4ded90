"""The report's numbers and plots: table cells against values computed independently from the same
inputs, plot content through the figures' data and the PNGs' pixels (not only that a file exists)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib.image
import numpy as np
import pytest
from harness.small_jobs import make_job
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from straggler import report
from straggler.core.arrays import FloatArray
from straggler.core.jobtrace import JobTrace
from straggler.evaluation import EvaluationConfig, evaluate_job, flag_times, summarise

METHODS = ("reactive", "tobit")
CONFIG = EvaluationConfig(methods=METHODS, machine_counts=(5, 50), policies=("relaunch", "speculate"))


@pytest.fixture(scope="module")
def traces() -> list[JobTrace]:
    return [make_job(120, seed=s, job_id=f"report-{s}", slow_group=0.1) for s in (1, 2, 3)]


@pytest.fixture(scope="module")
def summary(traces: list[JobTrace]) -> dict[str, Any]:
    return summarise([evaluate_job(t, CONFIG) for t in traces], CONFIG)


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Body rows of a Markdown table by their first cell (and second, joined by '/', if two-keyed)."""
    rows = [line.strip("|").split("|") for line in markdown.splitlines()[2:]]
    return {cells[0].strip(): [c.strip().strip("*") for c in cells[1:]] for cells in rows}


def number(cell: str) -> float:
    """A table cell as a float: '0.123', '+4.56%' (a fraction), 'n/a' (NaN)."""
    if cell == "n/a":
        return float("nan")
    return float(cell.rstrip("%")) / 100 if cell.endswith("%") else float(cell)


def independent_confusion(traces: list[JobTrace], method: str) -> dict[str, float]:
    """TPR, FPR, FNR, F1 of ``method``, means over jobs, counted here from the flags and the true p90."""
    per_job = []
    for trace in traces:
        latency = trace.end - trace.start
        truth = latency >= np.quantile(latency, CONFIG.quantile)
        flagged = np.isfinite(flag_times(trace, method, CONFIG)[0])
        tp, fp = np.sum(truth & flagged), np.sum(~truth & flagged)
        fn, tn = np.sum(truth & ~flagged), np.sum(~truth & ~flagged)
        per_job.append(
            {
                "tpr": tp / (tp + fn),
                "fpr": fp / (fp + tn) if fp + tn else 0.0,
                "fnr": fn / (tp + fn),
                "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0,
            }
        )
    return {key: float(np.mean([job[key] for job in per_job])) for key in per_job[0]}


@pytest.mark.parametrize("method", METHODS)
def test_prediction_table_cells_match_an_independent_count(
    traces: list[JobTrace], summary: dict[str, Any], method: str
) -> None:
    cells = table_rows(report.markdown_table(summary))[method]
    expected = independent_confusion(traces, method)
    for column, key in enumerate(("tpr", "fpr", "fnr", "f1")):
        assert number(cells[column]) == pytest.approx(expected[key], abs=5e-4), key
    jct = summary["jct"][method]
    assert number(cells[5]) == pytest.approx(jct["unlimited"]["reduction"], abs=5e-4)
    assert number(cells[6]) == pytest.approx(jct["unlimited"]["extra_work"], abs=5e-4)
    limited = [jct["limited"][str(m)]["reduction"] for m in CONFIG.machine_counts]
    assert number(cells[7]) == pytest.approx(sum(limited) / len(limited), abs=5e-4)


def test_the_prediction_table_has_one_row_per_method_and_every_column(summary: dict[str, Any]) -> None:
    table = report.markdown_table(summary)
    header = table.splitlines()[0].strip("|").split("|")
    rows = table_rows(table)
    assert list(rows) == list(METHODS)
    assert all(len(cells) == len(header) - 1 for cells in rows.values())


def test_mitigation_table_cells_and_shares(summary: dict[str, Any]) -> None:
    rows = {
        f"{cells[0].strip()}/{cells[1].strip()}": [c.strip() for c in cells[2:]]
        for cells in (
            line.strip("|").split("|")
            for line in report.mitigation_table(summary).splitlines()[2:]
            if line.startswith("|")
        )
    }
    limit = summary["mitigation_limit"]["relaunch"]
    for method in METHODS:
        for policy in CONFIG.policies:
            cells = rows[f"{method}/{policy}"]
            values = summary["mitigation"][method][policy]
            assert number(cells[0]) == pytest.approx(values["jct_reduction"], abs=5e-5)
            assert number(cells[1]) == pytest.approx(values["gross_extra_machine_time"], abs=5e-5)
            assert number(cells[2]) == pytest.approx(values["net_extra_machine_time"], abs=5e-5)
            assert cells[3] == f"{values['copies_won']} / {values['copies_lost']}"
            share = values["jct_reduction"] / limit["jct_reduction"]
            assert number(cells[4]) == pytest.approx(share, abs=5e-4)
            assert int(cells[5]) == values["jobs_longer"]
    for policy in CONFIG.policies:  # the oracle-fed control, beside every method
        cells = rows[f"*oracle-fed* (future information)/{policy}"]
        values = summary["mitigation_oracle"][policy]
        assert number(cells[0]) == pytest.approx(values["jct_reduction"], abs=5e-5)
        assert number(cells[1]) == pytest.approx(values["gross_extra_machine_time"], abs=5e-5)
    limit_row = next(cells for key, cells in rows.items() if key.startswith("*limit*"))
    assert number(limit_row[0]) == pytest.approx(limit["jct_reduction"], abs=5e-5)
    assert number(limit_row[1]) == pytest.approx(limit["gross_extra_machine_time"], abs=5e-5)


# ---------------------------------------------------------------- plots


def handmade_summary() -> dict[str, Any]:
    """A summary with values chosen here, so every plotted number is known."""
    return {
        "threshold": "online",
        "quantile": 0.9,
        "jobs": 2,
        "tasks": 100,
        "excluded_tasks": 0,
        "policies": ["relaunch", "speculate"],
        "methods": {
            "alpha": {
                "tpr": 0.9,
                "fpr": 0.01,
                "fnr": 0.1,
                "f1": 0.85,
                "lead_time": 0.4,
                "f1_over_time": [0.1, 0.4, 0.8, 0.9],
            },
            "beta": {
                "tpr": 0.5,
                "fpr": 0.2,
                "fnr": 0.5,
                "f1": 0.3,
                "lead_time": float("nan"),
                "f1_over_time": [0.0, 0.2, 0.3, 0.6],
            },
        },
        "jct": {
            "alpha": {
                "unlimited": {"reduction": 0.12, "extra_work": 0.05},
                "limited": {"100": {"reduction": 0.02}, "300": {"reduction": 0.07}},
            },
            "beta": {
                "unlimited": {"reduction": -0.03, "extra_work": 0.2},
                "limited": {"100": {"reduction": 0.01}, "300": {"reduction": 0.04}},
            },
        },
        "mitigation": {
            "alpha": {
                "relaunch": {
                    "jct_reduction": 0.1,
                    "extra_machine_time": 0.03,
                    "gross_extra_machine_time": 0.05,
                    "net_extra_machine_time": 0.035,
                    "copies_won": 3,
                    "copies_lost": 4,
                    "jobs_longer": 0,
                },
                "speculate": {"jct_reduction": 0.15, "extra_machine_time": 0.06, "jobs_longer": 1},
            },
            "beta": {
                "relaunch": {"jct_reduction": -0.02, "extra_machine_time": 0.1, "jobs_longer": 2},
                "speculate": {"jct_reduction": 0.05, "extra_machine_time": 0.08, "jobs_longer": 0},
            },
        },
        "mitigation_limit": {
            p: {"jct_reduction": 0.25, "extra_machine_time": 0.04} for p in ("relaunch", "speculate")
        },
    }


def xs(line: Line2D) -> FloatArray:
    return np.asarray(line.get_xdata(), dtype=np.float64)


def ys(line: Line2D) -> FloatArray:
    return np.asarray(line.get_ydata(), dtype=np.float64)


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the plot functions draw, kept open (they close them after saving)."""
    kept: list[Figure] = []
    monkeypatch.setattr(report.plt, "close", kept.append)
    return kept


def test_f1_plot_draws_each_methods_series(tmp_path: Path, figures: list[Figure]) -> None:
    summary = handmade_summary()
    report.plot_f1_over_time(summary, tmp_path / "f1.png")
    (ax,) = figures[0].axes
    lines = {str(line.get_label()): line for line in ax.get_lines()}
    assert set(lines) == {"alpha", "beta"}
    for name, line in lines.items():
        series = summary["methods"][name]["f1_over_time"]
        np.testing.assert_allclose(ys(line), series)
        np.testing.assert_allclose(xs(line), [0.25, 0.5, 0.75, 1.0])
    assert lines["alpha"].get_color() != lines["beta"].get_color()


def test_jct_plot_bars_lines_and_limit(tmp_path: Path, figures: list[Figure]) -> None:
    summary = handmade_summary()
    report.plot_jct(summary, tmp_path / "jct.png")
    left, right = figures[0].axes
    heights = [bar.get_height() for bar in left.patches if isinstance(bar, Rectangle)]
    assert heights == pytest.approx([0.12, -0.03, 0.05, 0.2])  # reductions, then extra machine time
    limit_lines = [line for line in left.get_lines() if str(line.get_label()).startswith("limit")]
    assert [ys(line)[0] for line in limit_lines] == [0.25]
    curves = {
        line.get_label(): line for line in right.get_lines() if not str(line.get_label()).startswith("limit")
    }
    np.testing.assert_allclose(xs(curves["alpha"]), [100, 300])
    np.testing.assert_allclose(ys(curves["alpha"]), [0.02, 0.07])
    np.testing.assert_allclose(ys(curves["beta"]), [0.01, 0.04])


def test_mitigation_plot_places_one_point_per_method_and_policy(
    tmp_path: Path, figures: list[Figure]
) -> None:
    summary = handmade_summary()
    summary["mitigation_oracle"] = {
        "speculate": {"jct_reduction": 0.2, "extra_machine_time": 0.03, "gross_extra_machine_time": 0.045}
    }
    report.plot_mitigation(summary, tmp_path / "mitigation.png")
    (ax,) = figures[0].axes
    points: dict[str, tuple[float, ...]] = {
        str(c.get_label()): tuple(float(v) for v in np.round(np.asarray(c.get_offsets())[0], 9))
        for c in ax.collections
        if isinstance(c, PathCollection)
    }
    assert points == (
        {
            "alpha / relaunch": (5.0, 10.0),  # gross extra machine time where the summary has it
            "alpha / speculate": (6.0, 15.0),
            "oracle-fed (future information) / speculate": (4.5, 20.0),
            "beta / relaunch": (10.0, -2.0),
            "beta / speculate": (8.0, 5.0),
        }
    )
    assert 25.0 in [ys(line)[0] for line in ax.get_lines()]  # the limit, in percent


def test_written_pngs_show_each_methods_colour(tmp_path: Path) -> None:
    """Pixels, not file sizes: each method's line colour is drawn in the saved F1 plot, and a plot of
    one method shows the first colour but not the second."""
    summary = handmade_summary()
    report.write_report(summary, tmp_path, title="t", command="c")
    colours = report._colours(list(summary["methods"]))

    def pixels_of(path: Path, rgba: tuple[float, ...]) -> int:
        image = matplotlib.image.imread(path)[..., :3]
        return int(np.sum(np.all(np.abs(image - np.asarray(rgba[:3])) < 0.02, axis=-1)))

    both = tmp_path / "f1_over_time.png"
    assert pixels_of(both, colours["alpha"]) > 300 and pixels_of(both, colours["beta"]) > 300
    summary["methods"].pop("beta")
    report.plot_f1_over_time(summary, tmp_path / "one.png")
    assert pixels_of(tmp_path / "one.png", colours["alpha"]) > 200
    assert pixels_of(tmp_path / "one.png", colours["beta"]) < 30  # a few antialiased edges of alpha's
    text = (tmp_path / "report.md").read_text()
    alpha = r"\| alpha \| relaunch \| \+10\.00% \| \+5\.00% \| \+3\.50% \| 3 / 4 \| 0\.400 \| 0 \|"
    assert re.search(alpha, text)
    assert re.search(r"\| beta \| relaunch \| -2\.00% \| – \| \+10\.00% \| – \| -0\.080 \| 2 \|", text)
    assert "| beta | 0.500 | 0.200 | 0.500 | **0.300** | n/a | -0.030 | 0.200 | 0.025 |" in text


def frontier_summary() -> dict[str, Any]:
    """One method at two prices, over Spark 4.0's floor and priced gross with none (and late), and
    Spark's rule at four multipliers."""
    summary = handmade_summary()

    def point(jct: float, gross: float) -> dict[str, float]:
        return {"jct_reduction": jct, "extra_machine_time": gross / 2, "gross_extra_machine_time": gross}

    summary["mitigation"] = {
        "alpha": {
            "speculate@4": point(0.10, 0.08),
            "speculate": point(0.08, 0.05),
            "speculate@32/spark": point(0.05, 0.01),
            "speculate@64/none/gross": point(0.04, 0.005),
            "speculate@24/none/gross/late": point(0.035, 0.004),
            "spark@5": point(0.02, 0.006),
            "spark": point(0.03, 0.012),
            "spark@1.5": point(0.09, 0.06),
            "spark-legacy": point(0.11, 0.07),
        }
    }
    summary["mitigation_limit"] = {p: point(0.2, 0.09) for p in summary["mitigation"]["alpha"]}
    return summary


def test_each_point_of_sparks_rule_meets_the_best_speculate_at_equal_or_lower_machine_time() -> None:
    rows = {spark: (policy, m) for _, spark, _, policy, m in report.equal_cost_rows(frontier_summary())}
    assert rows["spark"] == (
        "speculate@32/spark",
        pytest.approx(frontier_summary()["mitigation"]["alpha"]["speculate@32/spark"]),
    )
    assert rows["spark@5"][0] == "speculate@64/none/gross"  # a gross price is a point of the same curve
    assert rows["spark@1.5"][0] == "speculate"  # 8 % beats 5 %; speculate@4 costs more than 6 %
    assert rows["spark-legacy"][0] == "speculate"
    table = report.frontier_table(frontier_summary())
    assert table is not None
    assert (
        "| alpha | spark | +3.00% | +1.20% | speculate@32/spark | +5.00% | +1.00% | shorter (+2.00 points) |"
        in table
    )
    assert (
        "| alpha | spark-legacy | +11.00% | +7.00% | speculate | +8.00% | +5.00% "
        "| not shorter (-3.00 points) |" in table
    )
    assert report.frontier_table(handmade_summary()) is None  # no point of Spark's rule to compare


@pytest.mark.parametrize(
    ("points", "verdict"),
    [
        (2.0, "shorter (+2.00 points)"),
        (-0.57, "not shorter (-0.57 points)"),
        (1e-13, "the same (+0.00 points)"),  # two means of the same jobs' figures, summed apart
        (-0.004, "the same (+0.00 points)"),
        (0.005, "shorter (+0.01 points)"),
    ],
)
def test_a_completion_time_difference_too_small_to_show_is_the_same(points: float, verdict: str) -> None:
    assert report.completion_verdict(points) == verdict


def test_the_frontier_plot_draws_a_curve_per_family_sorted_by_machine_time(
    tmp_path: Path, figures: list[Figure]
) -> None:
    assert report.plot_frontier(frontier_summary(), tmp_path / "frontier.png")
    (ax,) = figures[0].axes
    curves = {str(line.get_label()): line for line in ax.get_lines()}
    np.testing.assert_allclose(xs(curves["alpha / speculate"]), [5.0, 8.0])
    np.testing.assert_allclose(ys(curves["alpha / speculate"]), [8.0, 10.0])
    np.testing.assert_allclose(xs(curves["alpha / spark"]), [0.6, 1.2, 6.0, 7.0])
    np.testing.assert_allclose(ys(curves["alpha / speculate/spark"]), [5.0])
    np.testing.assert_allclose(ys(curves["alpha / speculate/none/gross"]), [4.0])
    assert curves["alpha / speculate/none/gross"].get_marker() == "v"  # gross prices drawn apart
    assert curves["alpha / speculate/none/gross/late"].get_marker() == "D"  # and /late apart from them
    assert ax.get_xscale() == "symlog"  # the cheap points, where Spark 4.0 sits, spread out
    assert not report.plot_frontier(handmade_summary(), tmp_path / "none.png")
