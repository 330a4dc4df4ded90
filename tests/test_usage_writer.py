"""Synthetic jobs written as a Google 2011 usage trace, read back by `load_google2011_usage`.

Every expected value is computed here from the simulation's own arrays, with plain loops: nothing
goes through `straggler.traces.usage` helpers or the writer's mapping table.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
from pathlib import Path

import numpy as np
import pytest

from straggler.core.jobtrace import JobTrace
from straggler.traces.synthetic import USAGE_FEATURES as SYNTHETIC_USAGE_FEATURES
from straggler.traces.synthetic import SimulatedJob, SyntheticConfig, iter_simulated_jobs
from straggler.traces.usage import FEATURE_NAMES, load_google2011_usage
from straggler.traces.usage_writer import write_usage_trace

OFFSET_S = 600.0  # the writer's documented time offset
ROUNDING_S = 1e-6 + 1e-9  # each written time is rounded to the microsecond
# Interruptions are rare with the defaults (~1.5 % of tasks); more of them so every job has some.
CONFIG = dataclasses.replace(
    SyntheticConfig(), usage_window_seconds=300.0, failures_per_hour=0.5, evictions_per_hour_at_full_load=3.0
)
MAPPED = {  # synthetic feature → Google task_usage column, spelled out independently of the writer
    "cpu_usage": "mean_cpu_rate",
    "max_cpu": "maximum_cpu_rate",
    "memory_usage": "canonical_memory_usage",
    "disk_io_time": "mean_disk_io_time",
    "cpi": "cycles_per_instruction",
    "mem_accesses_per_instr": "memory_accesses_per_instruction",
}
SYNTHETIC_COLUMNS = tuple(MAPPED)


@dataclasses.dataclass
class Written:
    root: Path
    jobs: list[SimulatedJob]
    traces: dict[int, JobTrace]
    """Loaded traces by input position of their job."""


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    jobs = list(iter_simulated_jobs(3, seed=11, min_tasks=30, max_tasks=60, config=CONFIG))
    root = write_usage_trace(jobs, tmp_path_factory.mktemp("usage") / "trace", progress=False)
    loaded = load_google2011_usage(root, checkpoint_seconds=300.0, min_tasks=1)
    return Written(root, jobs, {int(t.job_id) - 6_000_000_000: t for t in loaded})


def _last_interruption(job: SimulatedJob, task: int) -> float:
    """Simulation time of the task's last eviction/failure, -inf when it ran uninterrupted."""
    times = [t for t in list(job.evictions[task]) + list(job.failures[task]) if np.isfinite(t)]
    return max(times, default=-np.inf)


def _expected_usage(job: SimulatedJob, task: int, run_start: float, t: float) -> list[float]:
    """Mapped columns at trace time t: duration-weighted mean of the windows of the task's last run
    (ending after ``run_start``, trace time) that ended at or before t."""
    sums = [0.0] * len(SYNTHETIC_COLUMNS)
    weight = 0.0
    for w in range(len(job.windows.task)):
        if int(job.windows.task[w]) != task:
            continue
        start, end = float(job.windows.start[w]) + OFFSET_S, float(job.windows.end[w]) + OFFSET_S
        if end <= run_start or end > t:
            continue
        weight += end - start
        for c, name in enumerate(SYNTHETIC_COLUMNS):
            column = SYNTHETIC_USAGE_FEATURES.index(name)
            sums[c] += (end - start) * float(job.windows.values[w, column])
    return [s / weight if weight > 0 else np.nan for s in sums]


def test_written_files_look_like_the_google_trace(written: Written) -> None:
    with gzip.open(written.root / "task_events" / "part-00000-of-00001.csv.gz", "rt") as handle:
        events = list(csv.reader(handle))
    with gzip.open(written.root / "task_usage" / "part-00000-of-00001.csv.gz", "rt") as handle:
        usage = list(csv.reader(handle))
    assert all(len(row) == 13 for row in events) and all(len(row) == 20 for row in usage)
    times = [int(row[0]) for row in events]
    assert times == sorted(times) and times[0] > 600_000_000
    assert (
        {int(row[2]) for row in events}
        == {int(row[2]) for row in usage}
        == {6_000_000_000 + j for j in range(3)}
    )
    assert min(int(row[0]) for row in usage) > 600_000_000
    assert len(usage) == sum(len(job.windows.task) for job in written.jobs)  # one row per window


def test_same_jobs_and_tasks(written: Written) -> None:
    assert sorted(written.traces) == [0, 1, 2]
    for j, job in enumerate(written.jobs):
        trace = written.traces[j]
        assert trace.task_ids == [str(i) for i in range(job.n_tasks)]
        assert trace.machine_ids == [str(m) for m in job.machine]
        assert trace.finished.all() and trace.excluded_tasks == 0
        last_run_windows = [  # windows of earlier runs (ended by the last interruption) are not read
            w
            for w in range(len(job.windows.task))
            if job.windows.end[w] > _last_interruption(job, int(job.windows.task[w]))
        ]
        assert trace.meta["usage_windows"] == len(last_run_windows)


def test_start_end_and_latency_are_the_simulations(written: Written) -> None:
    """Uninterrupted tasks: the simulation's start and end. Interrupted: the last run, as the Google
    format defines it — it starts at the last interruption (the writer's documented limitation)."""
    uninterrupted = interrupted = 0
    for j, job in enumerate(written.jobs):
        trace = written.traces[j]
        np.testing.assert_allclose(trace.end, job.end + OFFSET_S, rtol=0, atol=ROUNDING_S / 2)
        for task in range(job.n_tasks):
            last = _last_interruption(job, task)
            run_start = float(job.start[task]) if last == -np.inf else last
            assert abs(trace.start[task] - (run_start + OFFSET_S)) <= ROUNDING_S / 2
            latency = float(trace.end[task] - trace.start[task])
            assert abs(latency - float(job.end[task] - run_start)) <= ROUNDING_S
            uninterrupted += last == -np.inf
            interrupted += last > -np.inf
    assert uninterrupted > 50 and interrupted >= 3


def test_features_are_time_weighted_means_of_the_windows_ended_by_then(written: Written) -> None:
    columns = [FEATURE_NAMES.index(MAPPED[name]) for name in SYNTHETIC_COLUMNS]
    unmapped = [i for i, name in enumerate(FEATURE_NAMES[:13]) if name not in MAPPED.values()]
    compared = partial = 0
    for j, job in enumerate(written.jobs):
        trace = written.traces[j]
        for t, index, rows in zip(
            trace.checkpoints, trace.running_index, trace.running_features, strict=True
        ):
            for row, task in enumerate(index.tolist()):
                expected = _expected_usage(job, task, float(trace.start[task]), float(t))
                np.testing.assert_allclose(rows[row, columns], expected, rtol=1e-7, equal_nan=True)
                assert np.isnan(rows[row, unmapped]).all()
                compared += 1
                partial += int(any(job.windows.end[job.windows.task == task] + OFFSET_S > t))
        for task in range(job.n_tasks):  # as of the finish: every window of the last run
            expected = _expected_usage(job, task, float(trace.start[task]), float(job.end[task]) + OFFSET_S)
            np.testing.assert_allclose(trace.finish_features[task, columns], expected, rtol=1e-7)
    assert partial > 50 and compared > 100  # many rows where later windows exist and must be left out


def test_eviction_and_failure_counts_match(written: Written) -> None:
    ev, fl = FEATURE_NAMES.index("evictions"), FEATURE_NAMES.index("failures")
    stepped = 0
    for j, job in enumerate(written.jobs):
        trace = written.traces[j]
        for t, index, rows in zip(
            trace.checkpoints, trace.running_index, trace.running_features, strict=True
        ):
            for row, task in enumerate(index.tolist()):
                assert rows[row, ev] == sum(1 for e in job.evictions[task] if e + OFFSET_S < t)
                assert rows[row, fl] == sum(1 for f in job.failures[task] if f + OFFSET_S < t)
                stepped += int(rows[row, ev] + rows[row, fl] > 0)
        np.testing.assert_array_equal(trace.finish_features[:, ev], np.isfinite(job.evictions).sum(axis=1))
        np.testing.assert_array_equal(trace.finish_features[:, fl], np.isfinite(job.failures).sum(axis=1))
    total = sum(
        int(np.isfinite(job.evictions).sum() + np.isfinite(job.failures).sum()) for job in written.jobs
    )
    assert total >= 3 and stepped > 0
