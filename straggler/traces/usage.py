"""Google 2011 ``task_usage`` windows → honest running features (the NURD paper's 15 Google features).

A usage feature at t is the time-weighted mean of the windows of the task's last run *reported* by t
(ended at or before t; an open window is never used); ``evictions`` and ``failures`` count events
strictly before t. The synthetic traces use the same machinery, so both obey one honesty rule.

Details and the expected layout: docs/architecture.md, "Google 2011 usage windows".
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from straggler.core.jobtrace import (
    BoolArray,
    FloatArray,
    IntArray,
    JobTrace,
    checkpoint_grid,
)

TASK_USAGE_COLUMNS: tuple[str, ...] = (
    "start_time",
    "end_time",
    "job_id",
    "task_index",
    "machine_id",
    "mean_cpu_rate",
    "canonical_memory_usage",
    "assigned_memory_usage",
    "unmapped_page_cache",
    "total_page_cache",
    "maximum_memory_usage",
    "mean_disk_io_time",
    "mean_local_disk_space_used",
    "maximum_cpu_rate",
    "maximum_disk_io_time",
    "cycles_per_instruction",
    "memory_accesses_per_instruction",
    "sample_portion",
    "aggregation_type",
    "sampled_cpu_usage",
)
"""The 20 columns of a ``task_usage`` row, in file order (schema of clusterdata-2011-2)."""

USAGE_FEATURES: tuple[str, ...] = (
    "mean_cpu_rate",  # MCU
    "maximum_cpu_rate",  # MAXCPU
    "sampled_cpu_usage",  # SCPU
    "canonical_memory_usage",  # CMU
    "assigned_memory_usage",  # AMU
    "maximum_memory_usage",  # MAXMU
    "unmapped_page_cache",  # UPC
    "total_page_cache",  # TPC
    "mean_disk_io_time",  # MIO
    "maximum_disk_io_time",  # MAXIO
    "mean_local_disk_space_used",  # MDK
    "cycles_per_instruction",  # CPI
    "memory_accesses_per_instruction",  # MAI
)
"""The 13 usage columns the paper uses (Table 1 order); sample_portion/aggregation_type are bookkeeping."""

EVENT_FEATURES: tuple[str, ...] = ("evictions", "failures")
FEATURE_NAMES: tuple[str, ...] = USAGE_FEATURES + EVENT_FEATURES
"""NURD's 15 Google features: MCU … MAI, then EV and FL."""

_USAGE_COLUMN_INDEX = tuple(TASK_USAGE_COLUMNS.index(name) for name in USAGE_FEATURES)

# task_events event types (schema section "Job and task life cycles").
SCHEDULE, EVICT, FAIL, FINISH, KILL, LOST = 1, 2, 3, 4, 5, 6
_RUN_ENDS = frozenset((EVICT, FAIL, FINISH, KILL, LOST))
_AFTER_TRACE_END_US = 2**63 - 1
_US = 1e6


@dataclass(frozen=True)
class UsageWindows:
    """A job's measurement windows, sorted by (task, end): the only input features are computed from.

    ``task`` indexes the job's task arrays; ``values`` has one column per usage feature, NaN where a
    window did not report that column (e.g. CPI is missing for some machines).
    """

    task: IntArray
    start: FloatArray
    end: FloatArray
    values: FloatArray

    @classmethod
    def from_unsorted(
        cls, task: IntArray, start: FloatArray, end: FloatArray, values: FloatArray
    ) -> UsageWindows:
        """Sort by (task, end) and drop empty windows (zero duration carries no weight)."""
        task = np.asarray(task, dtype=np.int64)
        start = np.asarray(start, dtype=np.float64)
        end = np.asarray(end, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64).reshape(len(task), -1)
        keep = end > start
        order = np.lexsort((end[keep], task[keep]))
        return cls(task[keep][order], start[keep][order], end[keep][order], values[keep][order])

    @property
    def n_columns(self) -> int:
        return int(self.values.shape[1])


def window_means(windows: UsageWindows, tasks: IntArray, times: FloatArray) -> FloatArray:
    """Time-weighted mean of each column over the windows of ``tasks[i]`` that ended by ``times[i]``.

    Exact about the boundary (a window ending exactly at t counts, one ending a microsecond later does
    not): windows and queries are merged in one sort rather than compared through a float key. Each
    mean is summed from the task's own windows only, so no other window — not even through rounding in
    a running total — can move it.
    """
    tasks = np.asarray(tasks, dtype=np.int64)
    times = np.asarray(times, dtype=np.float64)
    n_query, n_win = len(tasks), len(windows.task)
    if n_query == 0:
        return np.empty((0, windows.n_columns))
    duration = (windows.end - windows.start)[:, None]
    present = np.isfinite(windows.values)
    weighted = np.where(present, windows.values * duration, 0.0)
    weight = np.where(present, duration, 0.0)

    # Merge: windows sort before queries at equal (task, time), so "ended at or before t" counts.
    all_task = np.concatenate([windows.task, tasks])
    all_time = np.concatenate([windows.end, times])
    is_query = np.concatenate([np.zeros(n_win, dtype=np.int8), np.ones(n_query, dtype=np.int8)])
    order = np.lexsort((is_query, all_time, all_task))
    windows_before = np.cumsum(is_query[order] == 0)
    position = np.empty(n_win + n_query, dtype=np.int64)
    position[order] = np.arange(n_win + n_query)
    upto = windows_before[position[n_win:]]  # windows of earlier tasks + this task's reported ones
    first = np.searchsorted(windows.task, tasks, side="left")

    total = _range_sums(weighted, first, upto)
    total_weight = _range_sums(weight, first, upto)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total_weight > 0, total / np.where(total_weight > 0, total_weight, 1.0), np.nan)


def _range_sums(rows: FloatArray, first: IntArray, upto: IntArray) -> FloatArray:
    """``rows[first[i]:upto[i]].sum(axis=0)`` for every i, in one vectorised pass.

    ``reduceat`` also sums the gaps between consecutive ranges; taking ranges in decreasing ``first``
    makes every gap run backwards, which costs one row instead of a sweep over other tasks' windows.
    """
    order = np.argsort(-first, kind="stable")
    padded = np.vstack([rows, np.zeros((1, rows.shape[1]))])  # keeps every index in range
    bounds = np.empty(2 * len(first), dtype=np.int64)
    bounds[0::2], bounds[1::2] = first[order], upto[order]
    sums = np.empty((len(first), rows.shape[1]))
    sums[order] = np.add.reduceat(padded, bounds, axis=0)[0::2]
    sums[first >= upto] = 0.0  # reduceat returns rows[first] for an empty range
    return sums


def event_counts(event_times: FloatArray, tasks: IntArray, times: FloatArray) -> FloatArray:
    """How many of each task's events (rows of ``event_times``, padded with +inf) fell strictly before t."""
    if event_times.shape[1] == 0:
        return np.zeros(len(tasks))
    return np.sum(event_times[tasks] < np.asarray(times)[:, None], axis=1).astype(np.float64)


def features_at(
    windows: UsageWindows, event_times: Sequence[FloatArray], tasks: IntArray, times: FloatArray
) -> FloatArray:
    """Feature rows (usage means, then one count per event kind) for tasks as seen at given times."""
    tasks = np.asarray(tasks, dtype=np.int64)
    times = np.broadcast_to(np.asarray(times, dtype=np.float64), tasks.shape)
    columns = [window_means(windows, tasks, times)]
    columns += [event_counts(kind, tasks, times)[:, None] for kind in event_times]
    return np.hstack(columns)


def assemble_job_trace(
    *,
    job_id: str,
    task_ids: list[str],
    machine_ids: list[str],
    start: FloatArray,
    end: FloatArray,
    finished: BoolArray,
    windows: UsageWindows,
    event_times: Sequence[FloatArray],
    feature_names: tuple[str, ...],
    checkpoint_seconds: float,
    expected_tasks: int = 0,
    excluded_tasks: int = 0,
    meta: dict[str, float | str] | None = None,
) -> JobTrace:
    """Cut a job at its checkpoints; every feature row comes from `features_at` at its own time."""
    n = len(task_ids)
    if windows.n_columns + len(event_times) != len(feature_names):
        raise ValueError("feature_names does not match the usage columns plus event kinds")
    open_end = np.where(np.isnan(end), np.inf, end)
    ended = end[np.isfinite(end)]
    last_end = float(ended.max()) if len(ended) else float("nan")
    checkpoints = checkpoint_grid(float(np.min(start)), last_end, checkpoint_seconds)

    running_index = [np.flatnonzero((start <= t) & (t < open_end)).astype(np.int64) for t in checkpoints]
    sizes = [len(idx) for idx in running_index]
    all_tasks = np.concatenate(running_index) if n else np.empty(0, dtype=np.int64)
    all_times = np.repeat(checkpoints, sizes)
    all_rows = features_at(windows, event_times, all_tasks, all_times)
    running_features = np.split(all_rows, np.cumsum(sizes)[:-1]) if sizes else []

    finish_features = np.full((n, len(feature_names)), np.nan)
    done = np.flatnonzero(finished & np.isfinite(end))
    finish_features[done] = features_at(windows, event_times, done, end[done])
    return JobTrace(
        job_id=job_id,
        task_ids=task_ids,
        machine_ids=machine_ids,
        start=start,
        end=end,
        finished=finished,
        feature_names=feature_names,
        checkpoints=checkpoints,
        running_index=running_index,
        running_features=list(running_features),
        finish_features=finish_features,
        expected_tasks=expected_tasks,
        excluded_tasks=excluded_tasks,
        meta=dict(meta or {}),
    )


# --------------------------------------------------------------------------------------------------
# Google 2011 files


@dataclass
class TaskHistory:
    """One task as the event stream leaves it: its last run and every EVICT/FAIL so far."""

    run_start_us: int = -1
    run_end_us: int = -1
    end_type: int = -1
    machine: str = ""
    evictions_us: list[int] = field(default_factory=list)
    failures_us: list[int] = field(default_factory=list)


def _csv_rows(paths: Iterable[Path], progress: bool, label: str) -> Iterator[list[str]]:
    files = list(paths)
    if progress:
        from tqdm import tqdm

        files = list(tqdm(files, desc=label, unit="part"))
    for path in files:
        with gzip.open(path, "rt", newline="") as handle:
            for line in handle:
                yield line.rstrip("\r\n").split(",")


def _parts(directory: Path) -> list[Path]:
    parts = sorted(directory.glob("part-*.csv.gz"))
    if not parts:
        raise FileNotFoundError(f"no part-*.csv.gz files in {directory}")
    return parts


def read_task_histories(
    task_events_dir: Path, *, progress: bool = False
) -> dict[str, dict[int, TaskHistory]]:
    """Per job, per task index: the last run (last SCHEDULE → its end event) and the EVICT/FAIL times.

    Events are taken in file order, which is time order in the published trace. A minimal parser on
    purpose; it keeps only what a last-run latency and the EV/FL counts need.
    """
    jobs: dict[str, dict[int, TaskHistory]] = {}
    for row in _csv_rows(_parts(task_events_dir), progress, "task_events"):
        if len(row) < 6 or not row[5]:
            continue
        time_us, job, task, machine, kind = int(row[0]), row[2], int(row[3]), row[4], int(row[5])
        history = jobs.setdefault(job, {}).setdefault(task, TaskHistory())
        if kind == SCHEDULE:
            history.run_start_us, history.run_end_us, history.end_type = time_us, -1, -1
            history.machine = machine
        elif kind in _RUN_ENDS:
            if kind == EVICT:
                history.evictions_us.append(time_us)
            elif kind == FAIL:
                history.failures_us.append(time_us)
            if history.run_start_us >= 0 and history.run_end_us < 0:
                history.run_end_us, history.end_type = time_us, kind
    return jobs


@dataclass
class _JobRuns:
    """The tasks of one job that enter its trace, in task-index order."""

    job_id: str
    task_index: list[int]
    machine: list[str]
    start: FloatArray
    end: FloatArray
    finished: BoolArray
    evictions: FloatArray
    failures: FloatArray
    expected_tasks: int
    excluded_tasks: int


def _padded(times_us: list[list[int]]) -> FloatArray:
    width = max((len(t) for t in times_us), default=0)
    out = np.full((len(times_us), width), np.inf)
    for i, times in enumerate(times_us):
        out[i, : len(times)] = np.asarray(times, dtype=np.float64) / _US
    return out


def _job_runs(job_id: str, tasks: dict[int, TaskHistory]) -> _JobRuns:
    """Keep tasks whose last run started inside the trace (a SCHEDULE at 0 predates it: no latency)."""
    kept = sorted(i for i, h in tasks.items() if h.run_start_us > 0)
    histories = [tasks[i] for i in kept]
    end_us = [h.run_end_us if 0 <= h.run_end_us < _AFTER_TRACE_END_US else -1 for h in histories]
    return _JobRuns(
        job_id=job_id,
        task_index=kept,
        machine=[h.machine for h in histories],
        start=np.asarray([h.run_start_us / _US for h in histories], dtype=np.float64),
        end=np.asarray([e / _US if e >= 0 else np.nan for e in end_us], dtype=np.float64),
        finished=np.asarray(
            [h.end_type == FINISH and e >= 0 for h, e in zip(histories, end_us, strict=True)], dtype=bool
        ),
        evictions=_padded([h.evictions_us for h in histories]),
        failures=_padded([h.failures_us for h in histories]),
        expected_tasks=len(tasks),
        excluded_tasks=len(tasks) - len(kept),
    )


def _read_usage(
    task_usage_dir: Path, jobs: dict[str, _JobRuns], progress: bool
) -> dict[str, tuple[list[int], list[float], list[float], list[list[float]]]]:
    """Usage rows of the selected jobs that belong to a task's last run (same machine, ending after its
    start); rows of earlier runs describe another execution and are dropped."""
    position = {job_id: {t: i for i, t in enumerate(runs.task_index)} for job_id, runs in jobs.items()}
    rows: dict[str, tuple[list[int], list[float], list[float], list[list[float]]]] = {
        job_id: ([], [], [], []) for job_id in jobs
    }
    for row in _csv_rows(_parts(task_usage_dir), progress, "task_usage"):
        job_id = row[2]
        if job_id not in jobs:
            continue
        i = position[job_id].get(int(row[3]))
        if i is None:
            continue
        runs = jobs[job_id]
        start, end = int(row[0]) / _US, int(row[1]) / _US
        if end <= runs.start[i] or (row[4] and runs.machine[i] and row[4] != runs.machine[i]):
            continue
        task, starts, ends, values = rows[job_id]
        task.append(i)
        starts.append(start)
        ends.append(end)
        values.append([float(row[c]) if c < len(row) and row[c] else np.nan for c in _USAGE_COLUMN_INDEX])
    return rows


def load_google2011_usage(
    trace_dir: Path,
    *,
    checkpoint_seconds: float = 300.0,
    min_tasks: int = 100,
    max_jobs: int | None = None,
    progress: bool = False,
) -> list[JobTrace]:
    """Jobs with at least ``min_tasks`` finished last runs, with the paper's 15 features per checkpoint.

    Jobs come in order of their first task start; ``max_jobs`` keeps the first ones (usage is read only
    for those). A task's start/end/outcome come from ``task_events`` (its last run), its usage features
    from the ``task_usage`` windows of that run that ended by the time described.
    """
    trace_dir = Path(trace_dir)
    histories = read_task_histories(trace_dir / "task_events", progress=progress)
    selected: dict[str, _JobRuns] = {}
    candidates = [_job_runs(job_id, tasks) for job_id, tasks in histories.items()]
    candidates = [runs for runs in candidates if int(runs.finished.sum()) >= min_tasks]
    candidates.sort(key=lambda runs: (float(runs.start.min()), runs.job_id))
    for runs in candidates[:max_jobs]:
        selected[runs.job_id] = runs

    usage = _read_usage(trace_dir / "task_usage", selected, progress)
    traces: list[JobTrace] = []
    for job_id, runs in selected.items():
        task, starts, ends, values = usage[job_id]
        windows = UsageWindows.from_unsorted(
            np.asarray(task, dtype=np.int64),
            np.asarray(starts, dtype=np.float64),
            np.asarray(ends, dtype=np.float64),
            np.asarray(values, dtype=np.float64).reshape(len(task), len(USAGE_FEATURES)),
        )
        with_usage = np.unique(windows.task)
        traces.append(
            assemble_job_trace(
                job_id=job_id,
                task_ids=[str(t) for t in runs.task_index],
                machine_ids=runs.machine,
                start=runs.start,
                end=runs.end,
                finished=runs.finished,
                windows=windows,
                event_times=(runs.evictions, runs.failures),
                feature_names=FEATURE_NAMES,
                checkpoint_seconds=checkpoint_seconds,
                expected_tasks=runs.expected_tasks,
                excluded_tasks=runs.excluded_tasks,
                meta={
                    "source": "google2011_usage",
                    "usage_windows": float(len(windows.task)),
                    "tasks_without_usage": float(len(runs.task_index) - len(with_usage)),
                },
            )
        )
    return traces
