"""The held-out causal usage trace: deterministic, read by the evaluation's loader, each cause visible.

Traces here are small (a few jobs of 100–300 tasks on a small cluster, with more of each cause than the
held-out defaults so every cause has enough tasks), and are read through `load_traces`, the path of
``straggler evaluate --format google-2011-usage``.
"""

from __future__ import annotations

import dataclasses
import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from straggler.core.jobtrace import JobTrace
from straggler.traces.causal_usage import (
    CAUSES,
    GROUND_TRUTH,
    JOB_ID_BASE,
    WINDOW_S,
    CausalConfig,
    read_ground_truth,
    write_causal_usage_trace,
)
from straggler.traces.loading import load_traces

ROOT = Path(__file__).resolve().parents[1]
SMALL = dataclasses.replace(
    CausalConfig(),
    machines=120,
    median_tasks=180.0,
    max_tasks=300,
    skew_share=0.1,
    hidden_share=0.08,
    hang_probability=0.05,
    eviction_probability=0.08,
)
JOBS = 8


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("causal")
    write_causal_usage_trace(out, JOBS, seed=11, config=SMALL)
    return out


@pytest.fixture(scope="module")
def traces(trace_dir: Path) -> list[JobTrace]:
    return load_traces("google-2011-usage", trace_dir, checkpoint_seconds=300.0, progress=False)


def _last_runs(trace_dir: Path) -> dict[tuple[str, str], dict[str, str]]:
    return {(r["job_id"], r["task_index"]): r for r in read_ground_truth(trace_dir) if r["last"] == "1"}


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*.gz"))}


def test_same_seed_writes_the_same_bytes_and_another_seed_does_not(tmp_path: Path) -> None:
    tiny = dataclasses.replace(SMALL, median_tasks=100.0, max_tasks=120)
    write_causal_usage_trace(tmp_path / "a", 2, seed=5, config=tiny)
    write_causal_usage_trace(tmp_path / "b", 2, seed=5, config=tiny)
    write_causal_usage_trace(tmp_path / "c", 2, seed=6, config=tiny)
    first = _files(tmp_path / "a")
    assert set(first) == {
        GROUND_TRUTH,
        *(
            f"{table}/part-{p:05d}-of-00004.csv.gz"
            for table in ("task_events", "task_usage")
            for p in range(4)
        ),
    }
    assert first == _files(tmp_path / "b")
    assert first != _files(tmp_path / "c")


def test_the_evaluation_loader_finds_every_job_with_its_latencies(
    trace_dir: Path, traces: list[JobTrace]
) -> None:
    truth = _last_runs(trace_dir)
    assert sorted(int(t.job_id) for t in traces) == [JOB_ID_BASE + j for j in range(JOBS)]
    assert sum(len(t.task_ids) for t in traces) == len(truth)
    for trace in traces:
        assert len(trace.task_ids) >= 100 and trace.finished.all()
        rows = [truth[(trace.job_id, task)] for task in trace.task_ids]
        expected = np.asarray([(int(r["end_us"]) - int(r["start_us"])) / 1e6 for r in rows])
        np.testing.assert_allclose(trace.end - trace.start, expected, atol=1e-5)
        evictions = trace.finish_features[:, list(trace.feature_names).index("evictions")]
        np.testing.assert_array_equal(evictions, [int(r["attempt"]) for r in rows])
        assert np.isfinite(trace.finish_features[:, 0]).mean() > 0.95  # nearly every task has usage


def test_usage_windows_lie_on_the_300s_grid_inside_their_run(trace_dir: Path) -> None:
    runs = {
        (r["job_id"], r["task_index"], r["machine_id"]): (int(r["start_us"]), int(r["end_us"]))
        for r in read_ground_truth(trace_dir)
    }
    rows = 0
    for part in sorted((trace_dir / "task_usage").glob("part-*.csv.gz")):
        with gzip.open(part, "rt") as handle:
            for line in handle:
                row = line.rstrip("\n").split(",")
                assert len(row) == 20
                start, end = int(row[0]), int(row[1])
                run_start, run_end = runs[(row[2], row[3], row[4])]
                assert run_start <= start < end <= run_end
                assert end - start <= WINDOW_S * 1e6
                assert end == run_end or end % round(WINDOW_S * 1e6) == 0
                rows += 1
    assert rows > 0


def test_stragglers_exist_and_every_cause_makes_some(traces: list[JobTrace], trace_dir: Path) -> None:
    truth = _last_runs(trace_dir)
    causes: set[str] = set()
    for trace in traces:
        latency = trace.end - trace.start
        p90 = np.percentile(latency, 90)
        stragglers = np.flatnonzero(latency >= p90)
        assert len(stragglers) >= 0.05 * len(latency)
        assert p90 > 1.2 * np.median(latency)
        causes |= {truth[(trace.job_id, trace.task_ids[i])]["cause"] for i in stragglers}
    assert set(CAUSES) <= causes


def _relative_features(traces: list[JobTrace], trace_dir: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Finish features over the job's median per column, and each task's factor per cause."""
    truth = _last_runs(trace_dir)
    names = list(traces[0].feature_names)
    rows, factors = [], []
    for trace in traces:
        with np.errstate(invalid="ignore", divide="ignore"):
            rows.append(trace.finish_features / np.nanmedian(trace.finish_features, axis=0))
        factors += [[float(truth[(trace.job_id, t)][c]) for c in CAUSES] for t in trace.task_ids]
    table = np.vstack(rows)
    return {name: table[:, k] for k, name in enumerate(names)}, np.asarray(factors)


@pytest.mark.parametrize(
    ("cause", "feature", "direction"),
    [
        ("slow_machine", "cycles_per_instruction", +1),
        ("slow_machine", "mean_cpu_rate", -1),
        ("contention", "cycles_per_instruction", +1),
        ("contention", "total_page_cache", +1),
        ("input_skew", "mean_disk_io_time", +1),
        ("input_skew", "canonical_memory_usage", +1),
        ("eviction", "mean_disk_io_time", +1),
        ("hung", "mean_cpu_rate", -1),
    ],
)
def test_each_cause_shows_in_its_feature(
    traces: list[JobTrace], trace_dir: Path, cause: str, feature: str, direction: int
) -> None:
    features, factors = _relative_features(traces, trace_dir)
    affected = factors[:, CAUSES.index(cause)] >= 1.3
    clean = np.all(factors < 1.1, axis=1)
    assert affected.sum() >= 10
    values = features[feature]
    shift = np.nanmean(values[affected]) / np.nanmean(values[clean])
    assert shift > 1.1 if direction > 0 else shift < 0.9


def test_hidden_slowdowns_show_in_no_usage_feature(traces: list[JobTrace], trace_dir: Path) -> None:
    features, factors = _relative_features(traces, trace_dir)
    only_hidden = (factors[:, CAUSES.index("hidden")] >= 1.3) & np.all(
        np.delete(factors, CAUSES.index("hidden"), axis=1) < 1.1, axis=1
    )
    clean = np.all(factors < 1.1, axis=1)
    assert only_hidden.sum() >= 10
    # Medians over the job's median: the usage noise alone moves them by a few percent (disk I/O more).
    bounds = {
        "mean_cpu_rate": 0.1,
        "cycles_per_instruction": 0.1,
        "canonical_memory_usage": 0.1,
        "mean_disk_io_time": 0.25,
        "total_page_cache": 0.2,
    }
    for name, bound in bounds.items():
        shift = np.nanmedian(features[name][only_hidden]) / np.nanmedian(features[name][clean])
        assert abs(np.log(shift)) < bound, name


def test_the_script_writes_a_trace(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_causal_usage_trace.py"),
            "--jobs",
            "1",
            "--seed",
            "3",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "stragglers" in done.stdout
    assert (out / GROUND_TRUTH).exists()
    assert len(load_traces("google-2011-usage", out, progress=False)) == 1
