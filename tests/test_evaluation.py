import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from harness.small_jobs import make_job

from straggler import report
from straggler.cli import main
from straggler.core.registry import DEFAULT_METHODS, method_names
from straggler.evaluation import EvaluationConfig, evaluate, summarise
from straggler.traces.loading import HALVES, add_trace_arguments, job_half, load_traces, load_traces_from_args

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "google-2011-sample"


MITIGATION_KEYS = {
    "jct_reduction",
    "extra_machine_time",
    "gross_extra_machine_time",
    "net_extra_machine_time",
    "copies",
    "copies_won",
    "copies_lost",
    "jobs_longer",
}


def test_summary_has_the_documented_shape_and_sane_values() -> None:
    traces = [make_job(150, seed=s, job_id=f"j{s}") for s in range(3)]
    config = EvaluationConfig(methods=("nurd", "reactive", "nurd-paper"), machine_counts=(100, 200))
    summary = summarise(evaluate(traces, config, workers=1, progress=False), config)
    assert set(summary) >= {"methods", "jobs", "tasks", "excluded_tasks", "jct"}
    assert summary["jobs"] == 3 and summary["tasks"] == 450
    for name, row in summary["methods"].items():
        assert set(row) >= {"tpr", "fpr", "fnr", "f1", "lead_time", "jobs"}
        assert 0 <= row["f1"] <= 1 and abs(row["tpr"] + row["fnr"] - 1) < 1e-9
        assert len(row["f1_over_time"]) == 10
        assert set(summary["jct"][name]["limited"]) == {"100", "200"}
    assert summary["policies"] == list(config.policies) == ["relaunch", "speculate", "speculate:5"]
    for name in config.methods:
        for policy in config.policies:
            row = summary["mitigation"][name][policy]
            assert set(row) == MITIGATION_KEYS | {"jobs_below_reactive"}
            assert -1 < row["jct_reduction"] < 1 and np.isfinite(row["extra_machine_time"])
            assert row["gross_extra_machine_time"] >= 0
            assert row["copies"] == row["copies_won"] + row["copies_lost"]
            # a winning copy ends its original early: net is gross less what that saved
            assert row["net_extra_machine_time"] <= row["gross_extra_machine_time"] + 1e-12
        for policy in ("speculate", "speculate:5"):  # a copy races the original: never later
            assert summary["mitigation"][name][policy]["jobs_longer"] == 0
    assert set(summary["mitigation_limit"]) == set(config.policies)
    assert summary["mitigation_limit"]["speculate"]["jct_reduction"] > 0
    assert summary["mitigation_limit"]["speculate"]["copies"] > 0
    assert set(summary["mitigation_oracle"]) == set(config.policies)
    assert set(summary["mitigation_oracle"]["speculate"]) == MITIGATION_KEYS
    assert summary["mitigation"]["reactive"]["speculate"]["jobs_below_reactive"] == 0
    below = summary["mitigation"]["nurd-paper"]["relaunch"]["jobs_below_reactive"]
    assert 0 <= below <= 3 and f"nurd-paper / relaunch {below}" in report.mitigation_table(summary)
    assert summary["mitigation_oracle"]["speculate"]["jct_reduction"] > 0
    # the literal formula flags far more than NURD (the measured degeneration the variants fix)
    assert summary["methods"]["nurd-paper"]["fpr"] > 5 * summary["methods"]["nurd"]["fpr"] + 0.05


def test_evaluation_is_reproducible_and_parallelism_does_not_change_it() -> None:
    traces = [make_job(120, seed=s, job_id=f"r{s}", signal=0.5) for s in range(2)]
    config = EvaluationConfig(methods=("nurd", "gbtr"), machine_counts=(100,))
    one = summarise(evaluate(traces, config, workers=1, progress=False), config)
    two = summarise(evaluate(traces, config, workers=2, progress=False), config)
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


def test_every_default_method_is_registered() -> None:
    assert set(DEFAULT_METHODS) <= set(method_names())


def test_feature_ablation_removes_exactly_the_named_columns() -> None:
    trace = make_job(50)
    smaller = trace.without_features(["x1"])
    assert smaller.feature_names == ("x0",)
    assert np.array_equal(smaller.finish_features[:, 0], trace.finish_features[:, 0])
    assert all(X.shape[1] == 1 for X in smaller.running_features)
    with pytest.raises(KeyError, match="no feature"):
        trace.without_features(["nope"])


@pytest.mark.scenario  # the whole command, end to end, on three real jobs: about 35 s
def test_evaluate_command_on_the_bundled_real_sample(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    code = main(
        ["evaluate", "--format", "google-2011", "--trace", str(SAMPLE), "--max-jobs", "3",
         "--methods", "nurd,reactive", "--threshold", "online", "--checkpoint-seconds", "60",
         "--workers", "1", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == 3 and summary["threshold"] == "online"
    report = (out / "report.md").read_text()
    assert report.count("| nurd |") == 1 + len(summary["policies"])  # prediction row, one per policy
    speculate = summary["mitigation"]["nurd"]["speculate"]
    s = speculate
    row = (
        f"| nurd | speculate | {s['jct_reduction']:+.2%} | {s['gross_extra_machine_time']:+.2%} "
        f"| {s['net_extra_machine_time']:+.2%} | {s['copies_won']} / {s['copies_lost']} |"
    )
    assert row in report
    assert "| *oracle-fed* (future information) | speculate |" in report
    for plot in ("f1_over_time.png", "jct.png", "mitigation.png"):
        assert (out / plot).stat().st_size > 0


def test_the_two_halves_of_a_trace_split_its_jobs_and_the_report_says_which(tmp_path: Path) -> None:
    """A choice tuned on one half is reported on the other: the halves share no job, cover the trace,
    do not depend on which other jobs were loaded, and the report names its half."""
    traces = load_traces("synthetic", None, jobs=6, min_tasks=50, progress=False)
    halves = {h: {t.job_id for t in traces if job_half(t.job_id) == h} for h in HALVES}
    assert halves["tune"] and halves["report"] and not halves["tune"] & halves["report"]
    assert halves["tune"] | halves["report"] == {t.job_id for t in traces}
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser, evaluation=True)
    args = parser.parse_args(
        ["--format", "synthetic", "--jobs", "6", "--min-tasks", "50", "--half", "report"]
    )
    assert [t.job_id for t in load_traces_from_args(args, progress=False)] == [
        t.job_id for t in traces if t.job_id in halves["report"]
    ]
    summary = summarise([], EvaluationConfig(methods=(), policies=()))
    summary["half"] = "report"
    with warnings.catch_warnings():  # an empty summary's plots have nothing to label
        warnings.simplefilter("ignore", UserWarning)
        text = report.write_report(summary, tmp_path, title="t", command="c").read_text()
    assert f"Jobs: {summary['jobs']} (the 'report' half of the trace's jobs" in text
