"""Google 2011 task-event loader: last runs, gaps, past-only features, the bundled sample."""

from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from straggler.core.jobtrace import JobTrace, checkpoint_grid
from straggler.traces.google2011 import (
    EVICT,
    FAIL,
    FINISH,
    KILL,
    SCHEDULE,
    SUBMIT,
    TraceCounts,
    count_tasks,
    load_google2011,
)
from straggler.traces.online_features import FEATURE_NAMES, OnlineFeatureLog
from straggler.traces.sample import extract_sample

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "google-2011-sample"
SHARED = Path(os.environ.get("STRAGGLER_SHARED_DIR", REPO.parent / "shared"))
SHARED_TRACE = SHARED / "traces" / "google-2011"
F = {name: i for i, name in enumerate(FEATURE_NAMES)}

Event = tuple[float, str, int, str | None, int]
"""(time in seconds, job id, task index, machine id or None, event type)."""


def _line(event: Event) -> str:
    t, job, task, machine, kind = event
    fields = [str(round(t * 1_000_000)), "", job, str(task), machine or "", str(kind), "user", "1", "2"]
    fields += ["0.125", "0.0625", "0.001", "0"]
    return ",".join(fields) + "\n"


def _write_part(trace_dir: Path, part: int, events: list[Event]) -> None:
    path = trace_dir / "task_events" / f"part-{part:05d}-of-00500.csv.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = sorted(events, key=lambda e: e[0])  # stable: equal times keep the order given
    with gzip.open(path, "wt") as out:
        out.writelines(_line(e) for e in ordered)


def _run(job: str, task: int, machine: str, start: float, end: float, kind: int = FINISH) -> list[Event]:
    return [
        (start - 1, job, task, None, SUBMIT),
        (start, job, task, machine, SCHEDULE),
        (end, job, task, machine, kind),
    ]


def _by_id(traces: list[JobTrace]) -> dict[str, JobTrace]:
    return {trace.job_id: trace for trace in traces}


@pytest.fixture
def lifecycle_trace(tmp_path: Path) -> Path:
    """One job whose tasks cover every fate a task can meet."""
    events: list[Event] = [
        # task 0: evicted once, rescheduled elsewhere, finished: its last run is 60 s .. 160 s
        (10, "1", 0, None, SUBMIT),
        (20, "1", 0, "m1", SCHEDULE),
        (50, "1", 0, "m1", EVICT),
        (51, "1", 0, None, SUBMIT),
        (60, "1", 0, "m2", SCHEDULE),
        (160, "1", 0, "m2", FINISH),
        # task 1: killed, so ended but not scored
        (10, "1", 1, None, SUBMIT),
        (30, "1", 1, "m1", SCHEDULE),
        (90, "1", 1, "m1", KILL),
        # task 2: running since before the trace began: excluded
        (0, "1", 2, None, SUBMIT),
        (0, "1", 2, "m3", SCHEDULE),
        (40, "1", 2, "m3", FINISH),
        # task 3: still running when the window ends
        (10, "1", 3, None, SUBMIT),
        (100, "1", 3, "m3", SCHEDULE),
        # task 4: never scheduled
        (10, "1", 4, None, SUBMIT),
        # another job keeps the window open past task 3's start
        *_run("2", 0, "m4", 150, 200),
    ]
    _write_part(tmp_path, 0, events)
    return tmp_path


def test_last_run_latency_and_fates(lifecycle_trace: Path) -> None:
    trace = _by_id(load_google2011(lifecycle_trace, checkpoint_seconds=30, min_tasks=1))["1"]
    assert trace.task_ids == ["0", "1", "3"]
    assert trace.machine_ids == ["m2", "m1", "m3"]
    np.testing.assert_array_equal(trace.start, [60.0, 30.0, 100.0])
    np.testing.assert_array_equal(trace.end, [160.0, 90.0, np.nan])
    np.testing.assert_array_equal(trace.finished, [True, False, False])
    np.testing.assert_array_equal(trace.latency, [100.0, np.nan, np.nan])
    assert trace.excluded_tasks == 1
    assert trace.meta["never_scheduled"] == 1
    assert trace.meta["running_at_end"] == 1
    assert trace.meta["ended_tasks"] == 1

    counts = count_tasks(lifecycle_trace)
    assert (counts.tasks, counts.scored_tasks, counts.excluded_tasks) == (6, 2, 1)
    assert (counts.ended_tasks, counts.running_at_end, counts.never_scheduled) == (1, 1, 1)
    assert counts.scheduled_tasks == counts.scored_tasks + counts.ended_tasks + counts.running_at_end


def test_checkpoints_and_running_sets(lifecycle_trace: Path) -> None:
    trace = _by_id(load_google2011(lifecycle_trace, checkpoint_seconds=30, min_tasks=1))["1"]
    # first start 30 s, last end 160 s
    np.testing.assert_array_equal(trace.checkpoints, checkpoint_grid(30, 160, 30))
    assert trace.checkpoints.tolist() == [60.0, 90.0, 120.0, 150.0, 180.0]
    running = [sorted(idx.tolist()) for idx in trace.running_index]
    assert running == [[0, 1], [0], [0, 2], [0, 2], [2]]

    at_60 = dict(zip(trace.running_index[0].tolist(), trace.running_features[0], strict=True))
    assert at_60[0][F["own_evictions"]] == 1  # its eviction at 50 s is in the past
    assert at_60[0][F["schedule_delay"]] == 50  # first SUBMIT 10 s, last SCHEDULE 60 s
    assert at_60[1][F["machine_failures_1h"]] == 1  # task 0's eviction on m1
    assert at_60[1][F["machine_running_tasks"]] == 1  # task 0 left m1 at 50 s
    assert at_60[0][F["machine_running_tasks"]] == 0  # task 0's SCHEDULE at exactly 60 s is not yet seen
    assert at_60[0][F["cpu_request"]] == 0.125
    finish = trace.finish_features[0]
    assert finish[F["machine_running_tasks"]] == 1  # itself, until its FINISH at 160 s
    assert finish[F["own_evictions"]] == 1
    assert np.isnan(trace.finish_features[1:]).all()


def test_checkpoints_per_job_spread_over_the_span_with_the_same_features(lifecycle_trace: Path) -> None:
    per_job = _by_id(load_google2011(lifecycle_trace, checkpoints_per_job=4, min_tasks=1))["1"]
    # first start 30 s, last end 160 s: a checkpoint every 32.5 s, the last at the job's end
    assert per_job.checkpoints.tolist() == [62.5, 95.0, 127.5, 160.0]
    assert [sorted(idx.tolist()) for idx in per_job.running_index] == [[0, 1], [0], [0, 2], [2]]
    # a grid point's features are the same whichever grid it belongs to: events strictly before it
    fixed = _by_id(load_google2011(lifecycle_trace, checkpoint_seconds=62.5, min_tasks=1))["1"]
    assert fixed.checkpoints[0] == 62.5
    np.testing.assert_array_equal(per_job.running_features[0], fixed.running_features[0])


def test_event_at_t_is_invisible_at_t_and_visible_just_after(tmp_path: Path) -> None:
    grid = checkpoint_grid(100, 5000, 300)
    fail_at = float(grid[1])  # a failure at exactly a checkpoint of job 1
    events: list[Event] = [
        *_run("1", 0, "m", 100, 5000),
        *_run("1", 1, "m", 100, fail_at + 1e-6),  # finishes 1 us after the failure
        *_run("7", 0, "m", 200, fail_at, kind=FAIL),
    ]
    _write_part(tmp_path, 0, events)
    trace = _by_id(load_google2011(tmp_path, min_tasks=1))["1"]
    np.testing.assert_array_equal(trace.checkpoints, grid)
    at_fail, hour_later = 1, int(np.flatnonzero(grid == fail_at + 3600)[0])
    next_one = hour_later + 1
    failures = [
        trace.running_features[k][0, F["machine_failures_1h"]] for k in (at_fail, hour_later, next_one)
    ]
    assert failures == [0, 1, 0]  # the last hour is [t - 3600, t)
    assert trace.running_features[at_fail][0, F["machine_running_tasks"]] == 3
    assert trace.finish_features[1, F["machine_failures_1h"]] == 1
    assert trace.finish_features[1, F["machine_running_tasks"]] == 2


def test_feature_log_ties_are_strict() -> None:
    log = OnlineFeatureLog()
    log.run_started(task=0, job=0, machine=0, t=1_000)
    log.task_evicted(task=0, t=1_000)
    features = log.freeze()
    one = np.ones(2, dtype=np.int64)
    rows = features.at(0 * one, 0 * one, 0 * one, np.full(2, 1_000), np.asarray([1_000, 1_001]))
    np.testing.assert_array_equal(rows[:, F["machine_running_tasks"]], [0, 1])
    np.testing.assert_array_equal(rows[:, F["own_evictions"]], [0, 1])


def _random_trace(rng: np.random.Generator, horizon: float) -> list[Event]:
    events: list[Event] = []
    for job in range(6):
        for task in range(30):
            start = float(rng.uniform(1, horizon * 0.7))
            end = start + float(rng.lognormal(np.log(300), 0.8))
            machine = f"m{rng.integers(8)}"
            kind = FINISH if rng.random() < 0.85 else [EVICT, FAIL, KILL][rng.integers(3)]
            events += _run(str(100 + job), task, machine, start, end, kind)
    return events


def _features_until(trace: JobTrace, horizon: float) -> tuple[list[np.ndarray], np.ndarray]:
    running = [x for t, x in zip(trace.checkpoints, trace.running_features, strict=True) if t <= horizon]
    done = np.flatnonzero(trace.scored & (trace.end <= horizon))
    return running, trace.finish_features[done]


def test_changing_the_future_leaves_past_features_unchanged(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    original = _random_trace(rng, 4000)
    cutoff = 2000.0
    # Every run finishing after the cutoff now takes three times as long: future latencies change.
    schedules = {(e[1], e[2]): e[0] for e in original if e[4] == SCHEDULE}
    mutated = [
        (schedules[(e[1], e[2])] + 3 * (e[0] - schedules[(e[1], e[2])]), *e[1:])
        if e[4] == FINISH and e[0] > cutoff
        else e
        for e in original
    ]
    _write_part(tmp_path / "a", 0, original)
    _write_part(tmp_path / "b", 0, mutated)
    before = _by_id(load_google2011(tmp_path / "a", checkpoint_seconds=60, min_tasks=5))
    after = _by_id(load_google2011(tmp_path / "b", checkpoint_seconds=60, min_tasks=5))
    assert before.keys() == after.keys() and len(before) >= 3
    slowness_changed = False
    for job_id, trace in before.items():
        other = after[job_id]
        assert not np.array_equal(trace.latency, other.latency, equal_nan=True)
        running, finish = _features_until(trace, cutoff)
        running_other, finish_other = _features_until(other, cutoff)
        assert len(running) == len(running_other)
        for x, y in zip(running, running_other, strict=True):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(finish, finish_other)
        late = trace.scored & (trace.end > cutoff)
        slow_a = trace.finish_features[late, F["machine_slowness"]]
        slow_b = other.finish_features[other.scored & (other.end > cutoff), F["machine_slowness"]]
        slowness_changed |= not np.array_equal(np.sort(slow_a), np.sort(slow_b))
    assert slowness_changed  # the feature does depend on latencies, just never on future ones


@pytest.mark.slow
def test_changing_the_future_of_the_real_sample_leaves_past_features_unchanged(tmp_path: Path) -> None:
    cutoff_us = 1_800_000_000
    with gzip.open(SAMPLE / "task_events" / "part-00000-of-00500.csv.gz", "rb") as source:
        lines = source.readlines()
    scheduled: dict[tuple[bytes, bytes], int] = {}
    mutated = []
    for line in lines:
        fields = line.split(b",")
        t, task, kind = int(fields[0]), (fields[2], fields[3]), int(fields[5])
        if kind == SCHEDULE:
            scheduled[task] = t
        elif kind == FINISH and t > cutoff_us and scheduled.get(task, 0) > 0:
            t = scheduled[task] + 3 * (t - scheduled[task])  # this run now takes three times as long
            line = b",".join([str(t).encode(), *fields[1:]])
        mutated.append((t, line))
    mutated.sort(key=lambda pair: pair[0])
    part = tmp_path / "task_events" / "part-00000-of-00500.csv.gz"
    part.parent.mkdir(parents=True)
    with gzip.open(part, "wb") as out:
        out.writelines(line for _, line in mutated)

    before = _by_id(load_google2011(SAMPLE))
    after = _by_id(load_google2011(tmp_path))
    common = before.keys() & after.keys()
    assert len(common) >= 20
    for job_id in common:
        running, finish = _features_until(before[job_id], cutoff_us / 1e6)
        running_other, finish_other = _features_until(after[job_id], cutoff_us / 1e6)
        assert len(running) == len(running_other)
        for x, y in zip(running, running_other, strict=True):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(finish, finish_other)


def test_non_contiguous_parts_cut_runs_at_the_gap(tmp_path: Path) -> None:
    # Part 2 is written first: parts are ordered by number, not by directory order.
    _write_part(
        tmp_path,
        2,
        [
            (10_100, "1", 0, "m1", FINISH),  # ends a run that crossed the gap: unknown latency
            *_run("1", 2, "m1", 10_200, 10_500),
            *_run("1", 3, "m2", 10_200, 10_600),
        ],
    )
    _write_part(tmp_path, 0, [*_run("1", 0, "m1", 10, 10_000)[:2], *_run("1", 1, "m1", 20, 40)])
    counts = count_tasks(tmp_path)
    assert (counts.parts, counts.gaps) == ((0, 2), 1)
    assert (counts.cut_tasks, counts.scored_tasks) == (1, 3)
    trace = _by_id(load_google2011(tmp_path, checkpoint_seconds=300, min_tasks=1))["1"]
    assert trace.task_ids == ["0", "1", "2", "3"]
    # task 0 is cut at the last event before the gap
    np.testing.assert_array_equal(trace.end, [40.0, 40.0, 10_500.0, 10_600.0])
    np.testing.assert_array_equal(trace.finished, [False, True, True, True])
    assert trace.meta["cut_tasks"] == 1
    task2 = trace.task_ids.index("2")
    assert trace.finish_features[task2, F["machine_running_tasks"]] == 1  # the cut run left m1


def test_max_jobs_is_largest_first_with_numeric_ties(tmp_path: Path) -> None:
    events: list[Event] = []
    for job, n_tasks in (("10", 5), ("9", 5), ("3", 3), ("42", 7)):
        for task in range(n_tasks):
            events += _run(job, task, f"m{task}", 10 + task, 100 + task)
    _write_part(tmp_path, 0, events)
    picked = [t.job_id for t in load_google2011(tmp_path, min_tasks=1, max_jobs=2)]
    assert sorted(picked) == ["42", "9"]
    again = [t.job_id for t in load_google2011(tmp_path, min_tasks=1, max_jobs=2)]
    assert picked == again
    assert [t.job_id for t in load_google2011(tmp_path, min_tasks=4)] == ["9", "10", "42"]
    assert [t.job_id for t in load_google2011(tmp_path, min_tasks=1, job_ids=["3"])] == ["3"]


def _check_trace(trace: JobTrace) -> None:
    for k, t in enumerate(trace.checkpoints):
        idx = trace.running_index[k]
        assert trace.running_features[k].shape == (len(idx), len(FEATURE_NAMES))
        assert (trace.start[idx] <= t).all()
        assert not (trace.end[idx] <= t).any()
    assert np.isfinite(trace.finish_features[trace.scored]).all()
    assert np.isnan(trace.finish_features[~trace.scored]).all()


def test_bundled_sample_loads() -> None:
    counts = count_tasks(SAMPLE)
    traces = load_google2011(SAMPLE)
    assert len(traces) == counts.jobs_with_scored(100) >= 20
    assert [t.meta["source"] for t in traces] == ["google-2011"] * len(traces)
    for trace in traces:
        assert trace.scored.sum() >= 100
        _check_trace(trace)
        assert all(np.isfinite(x).all() for x in trace.running_features)
    assert "user" in traces[0].meta  # job_events were read


def test_extract_sample_copies_lines_unchanged(tmp_path: Path) -> None:
    written = extract_sample(SAMPLE, tmp_path / "a", start_s=600, end_s=1200)
    extract_sample(SAMPLE, tmp_path / "b", start_s=600, end_s=1200)
    with gzip.open(SAMPLE / "task_events" / "part-00000-of-00500.csv.gz", "rb") as source:
        expected = [line for line in source if 600_000_000 <= int(line.split(b",")[0]) < 1_200_000_000]
    part = Path("task_events") / "part-00000-of-00500.csv.gz"
    with gzip.open(tmp_path / "a" / part, "rb") as copied:
        assert copied.readlines() == expected
    assert written["task_events"] == len(expected) > 0
    assert (tmp_path / "a" / part).read_bytes() == (tmp_path / "b" / part).read_bytes()
    assert (tmp_path / "a" / "job_events" / "part-00000-of-00500.csv.gz").exists()


def test_extract_sample_refuses_a_window_across_a_gap(tmp_path: Path) -> None:
    _write_part(tmp_path / "src", 0, _run("1", 0, "m", 10, 20))
    _write_part(tmp_path / "src", 2, _run("1", 1, "m", 10_010, 10_020))
    with pytest.raises(ValueError, match="not contiguous"):
        extract_sample(tmp_path / "src", tmp_path / "dst", start_s=0, end_s=20_000)


needs_shared = pytest.mark.skipif(
    not (SHARED_TRACE / "task_events").is_dir(),
    reason=f"shared Google 2011 trace not found at {SHARED_TRACE} (set STRAGGLER_SHARED_DIR)",
)


@functools.cache
def _shared_counts() -> TraceCounts:
    """The shared window's totals, counted once for both tests (an xdist group: one worker runs both)."""
    return count_tasks(SHARED_TRACE)


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.xdist_group("shared-google2011")
@needs_shared
def test_shared_window_matches_published_counts() -> None:
    counts = _shared_counts()
    assert (counts.events, counts.jobs, counts.tasks) == (2_609_335, 19_146, 614_019)
    assert counts.finished_tasks == 311_896
    assert [counts.jobs_with_finished(n) for n in (100, 200, 500, 1000)] == [488, 239, 128, 62]
    # A task finished and later re-run is scored by its last run, so scored <= finished.
    assert counts.scored_tasks <= counts.finished_tasks
    assert counts.jobs_with_scored(100) <= 488


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.xdist_group("shared-google2011")
@needs_shared
def test_shared_window_loads_with_features() -> None:
    traces = load_google2011(SHARED_TRACE)
    assert len(traces) == _shared_counts().jobs_with_scored(100)
    for trace in traces:
        _check_trace(trace)
