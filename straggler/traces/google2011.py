"""Google cluster-usage trace 2011 (``clusterdata-2011-2``): ``task_events`` parts as `JobTrace` objects.

Parts are streamed in order, keeping only per-task state and compact step logs. A task is scored by
its last run (SCHEDULE → FINISH); runs cut by a gap between non-consecutive parts, or never seen
scheduled, are not scored. Features come from one chronological sweep over all events of the window
(`online_features`), so machine context includes every job.

How events become tasks: docs/architecture.md, "Google 2011 task events".
"""

from __future__ import annotations

import csv
import gzip
import math
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from straggler.core.arrays import BoolArray, FloatArray, IntArray
from straggler.core.jobtrace import JobTrace, checkpoint_grid
from straggler.traces.online_features import FEATURE_NAMES, OnlineFeatureLog, OnlineFeatures

SUBMIT, SCHEDULE, EVICT, FAIL, FINISH, KILL, LOST, UPDATE_PENDING, UPDATE_RUNNING = range(9)
TERMINAL_EVENTS = frozenset({EVICT, FAIL, FINISH, KILL, LOST})
MACHINE_FAILURE_EVENTS = frozenset({EVICT, FAIL, KILL, LOST})
NO_RUN, RUN_OPEN, RUN_CUT = -1, 100, 101
"""`last_kind` codes besides the terminal event types: no observed run, still running, cut at a gap."""

(
    TIME,
    MISSING_INFO,
    JOB_ID,
    TASK_INDEX,
    MACHINE_ID,
    EVENT_TYPE,
    USER,
    SCHEDULING_CLASS,
    PRIORITY,
    CPU_REQUEST,
    MEMORY_REQUEST,
    DISK_REQUEST,
    DIFFERENT_MACHINES,
) = range(13)
"""The columns of a ``task_events`` row, in the trace's schema order (times in microseconds)."""
STATIC_COLUMNS = (CPU_REQUEST, MEMORY_REQUEST, DISK_REQUEST, PRIORITY, SCHEDULING_CLASS, DIFFERENT_MACHINES)
"""The request and constraint columns a task's static features come from, in the order of
`OnlineFeatureLog.static_changed`'s values."""
(
    JOB_TIME,
    JOB_MISSING_INFO,
    JOB_JOB_ID,
    JOB_EVENT_TYPE,
    JOB_USER,
    JOB_SCHEDULING_CLASS,
    JOB_NAME,
    JOB_LOGICAL_NAME,
) = range(8)
"""The columns of a ``job_events`` row, in the trace's schema order."""

TASK_EVENTS_DIR = "task_events"
JOB_EVENTS_DIR = "job_events"
PART_NAME = re.compile(r"^part-(\d{5})-of-(\d{5})\.csv\.gz$")
US_PER_S = 1_000_000
_QUERY_BATCH_ROWS = 1_000_000


def trace_parts(directory: Path) -> list[tuple[int, Path]]:
    """The ``part-NNNNN-of-MMMMM.csv.gz`` files of a table directory, ordered by part number."""
    parts = []
    for path in directory.iterdir():
        match = PART_NAME.match(path.name)
        if match:
            parts.append((int(match.group(1)), path))
    return sorted(parts)


def _csv_rows(path: Path) -> Iterator[list[str]]:
    with gzip.open(path, "rt", newline="", encoding="utf-8") as text:
        reader = csv.reader(text)
        try:
            yield from reader
        except csv.Error as err:
            raise ValueError(f"{path}: unreadable CSV near line {reader.line_num}") from err


def _float_or_nan(text: str) -> float:
    return float(text) if text else math.nan


@dataclass
class _TaskTable:
    """Per-task outcome of the sweep (dense task codes), plus what the window looked like."""

    job_names: list[str]
    machine_names: list[str]
    task_job: IntArray
    task_index: list[str]
    last_start: IntArray
    """SCHEDULE time (us) of the last observed run, -1 when none."""
    last_end: IntArray
    """End time (us) of that run, -1 while open."""
    last_kind: IntArray
    last_machine: IntArray
    unobserved: BoolArray
    """The task's last run began unobserved (before the window or in a gap)."""
    finished_any: BoolArray
    """Some observed run of the task FINISHED (the traces README's count)."""
    parts: tuple[int, ...]
    gaps: int
    events: int
    anomalies: int
    window_start_us: int
    window_end_us: int


@dataclass
class _TaskRuns:
    """The sweep's state of every task seen so far, by dense task code: a list per field, all
    extended together by `add` (lists, not objects: the sweep reads millions of events)."""

    job: list[int] = field(default_factory=list)
    index: list[str] = field(default_factory=list)
    run_start: list[int] = field(default_factory=list)
    """The current run's SCHEDULE time (us), -1 when not running."""
    run_machine: list[int] = field(default_factory=list)
    last_start: list[int] = field(default_factory=list)
    """`_TaskTable`'s, below."""
    last_end: list[int] = field(default_factory=list)
    last_kind: list[int] = field(default_factory=list)
    last_machine: list[int] = field(default_factory=list)
    unobserved: list[bool] = field(default_factory=list)
    finished_any: list[bool] = field(default_factory=list)
    static_text: list[str] = field(default_factory=list)
    """The task's request and constraint columns as last seen, joined (to notice a change)."""

    def add(self, job: int, index: str) -> int:
        """A new task of job code ``job`` with task index ``index``, not yet run; its code."""
        self.job.append(job)
        self.index.append(index)
        self.run_start.append(-1)
        self.run_machine.append(-1)
        self.last_start.append(-1)
        self.last_end.append(-1)
        self.last_kind.append(NO_RUN)
        self.last_machine.append(-1)
        self.unobserved.append(False)
        self.finished_any.append(False)
        self.static_text.append("")
        return len(self.job) - 1


def _static_features(row: list[str]) -> tuple[float, ...]:
    """A ``task_events`` row's request and constraint columns (`STATIC_COLUMNS`), NaN where empty."""
    return tuple(_float_or_nan(row[column]) for column in STATIC_COLUMNS)


def _sweep(trace_dir: Path, log: OnlineFeatureLog | None, progress: bool) -> _TaskTable:
    """One pass over all task events in time order: last runs per task, and feature steps into ``log``."""
    parts = trace_parts(trace_dir / TASK_EVENTS_DIR)
    if not parts:
        raise FileNotFoundError(f"no {TASK_EVENTS_DIR}/part-NNNNN-of-NNNNN.csv.gz files under {trace_dir}")
    job_code: dict[str, int] = {}
    machine_code: dict[str, int] = {}
    task_code: dict[tuple[str, str], int] = {}
    tasks = _TaskRuns()
    # the columns the loop below updates, by local name (it runs once per event)
    run_start, run_machine = tasks.run_start, tasks.run_machine
    last_start, last_end, last_kind, last_machine = (
        tasks.last_start,
        tasks.last_end,
        tasks.last_kind,
        tasks.last_machine,
    )
    unobserved, finished_any, task_job = tasks.unobserved, tasks.finished_any, tasks.job
    running: set[int] = set()
    events = anomalies = gaps = 0
    window_start = window_end = -1
    previous_part: int | None = None

    def machine_of(name: str) -> int:
        code = machine_code.get(name)
        if code is None:
            code = machine_code[name] = len(machine_code)
        return code

    for part, path in tqdm(parts, desc="task_events", unit="part", disable=not progress):
        if previous_part is not None and part != previous_part + 1:
            gaps += 1
            for cut in running:  # unknown time follows: every open run is cut at the last known instant
                if log is not None:
                    log.run_ended(cut, task_job[cut], run_machine[cut], window_end, None)
                if run_start[cut] > 0:
                    last_end[cut], last_kind[cut] = window_end, RUN_CUT
                run_start[cut] = -1
            running.clear()
        previous_part = part
        for row in _csv_rows(path):
            t = int(row[TIME])
            kind = int(row[EVENT_TYPE])
            events += 1
            if window_start < 0:
                window_start = t
            window_end = t
            job, machine = row[JOB_ID], row[MACHINE_ID]
            key = (job, row[TASK_INDEX])
            c = task_code.get(key)
            if c is None:
                if job not in job_code:
                    job_code[job] = len(job_code)
                c = task_code[key] = tasks.add(job_code[job], row[TASK_INDEX])
            if log is not None and row[CPU_REQUEST]:
                text = ",".join(row[SCHEDULING_CLASS : DIFFERENT_MACHINES + 1])
                if text != tasks.static_text[c]:
                    tasks.static_text[c] = text
                    log.static_changed(c, t, _static_features(row))
            if kind == SCHEDULE:
                if not machine:
                    anomalies += 1
                    continue
                m = machine_of(machine)
                if run_start[c] >= 0:  # scheduled while running: the earlier run ended unseen
                    anomalies += 1
                    if log is not None:
                        log.run_ended(c, task_job[c], run_machine[c], t, None)
                run_start[c] = t
                run_machine[c] = m
                running.add(c)
                if log is not None:
                    log.run_started(c, task_job[c], m, t)
                if t > 0:
                    last_start[c], last_end[c], last_kind[c], last_machine[c] = t, -1, RUN_OPEN, m
                    unobserved[c] = False
                else:
                    unobserved[c] = True
            elif kind in TERMINAL_EVENTS:
                start = run_start[c]
                if start >= 0:
                    m = run_machine[c]
                    if start > 0:
                        last_end[c], last_kind[c] = t, kind
                        finished_any[c] = finished_any[c] or kind == FINISH
                    run_start[c] = -1
                    running.discard(c)
                    if log is not None:
                        latency = t - start if kind == FINISH and start > 0 else None
                        log.run_ended(c, task_job[c], m, t, latency)
                else:
                    m = machine_of(machine) if machine else -1
                    if m >= 0 and last_kind[c] != RUN_CUT:
                        # It was running on a machine since an unseen SCHEDULE: that is its last run now.
                        last_start[c], last_end[c], last_kind[c], last_machine[c] = -1, -1, NO_RUN, -1
                        unobserved[c] = True
                if log is not None:
                    if kind in MACHINE_FAILURE_EVENTS and m >= 0:
                        log.machine_failure(m, t)
                    if kind == EVICT:
                        log.task_evicted(c, t)
                    elif kind == FAIL:
                        log.task_failed(c, t)
            elif kind == SUBMIT and log is not None:
                log.submitted(c, t)

    machine_names = [""] * len(machine_code)
    for name, code in machine_code.items():
        machine_names[code] = name
    job_names = [""] * len(job_code)
    for name, code in job_code.items():
        job_names[code] = name
    return _TaskTable(
        job_names=job_names,
        machine_names=machine_names,
        task_job=np.asarray(task_job, dtype=np.int64),
        task_index=tasks.index,
        last_start=np.asarray(last_start, dtype=np.int64),
        last_end=np.asarray(last_end, dtype=np.int64),
        last_kind=np.asarray(last_kind, dtype=np.int64),
        last_machine=np.asarray(last_machine, dtype=np.int64),
        unobserved=np.asarray(unobserved, dtype=bool),
        finished_any=np.asarray(finished_any, dtype=bool),
        parts=tuple(part for part, _ in parts),
        gaps=gaps,
        events=events,
        anomalies=anomalies,
        window_start_us=window_start,
        window_end_us=window_end,
    )


@dataclass(frozen=True)
class TraceCounts:
    """What a window of the trace holds, for reports (every task counted once, by its last run)."""

    parts: tuple[int, ...]
    gaps: int
    window_start_s: float
    window_end_s: float
    events: int
    jobs: int
    tasks: int
    scheduled_tasks: int
    """Tasks whose last run was observed from its SCHEDULE (= scored + ended + running + cut)."""
    scored_tasks: int
    ended_tasks: int
    running_at_end: int
    cut_tasks: int
    excluded_tasks: int
    never_scheduled: int
    finished_tasks: int
    """Tasks with a SCHEDULE after time 0 followed by a FINISH, in any run (the traces README's count)."""
    anomalies: int
    scored_per_job: dict[str, int] = field(repr=False)
    finished_per_job: dict[str, int] = field(repr=False)

    def jobs_with_scored(self, min_tasks: int) -> int:
        return sum(1 for n in self.scored_per_job.values() if n >= min_tasks)

    def jobs_with_finished(self, min_tasks: int) -> int:
        return sum(1 for n in self.finished_per_job.values() if n >= min_tasks)


def _per_job(table: _TaskTable, mask: BoolArray) -> dict[str, int]:
    counts = np.bincount(table.task_job[mask], minlength=len(table.job_names))
    return {table.job_names[j]: int(counts[j]) for j in np.flatnonzero(counts)}


def count_tasks(trace_dir: Path, *, progress: bool = False) -> TraceCounts:
    """Totals of a trace window (events, jobs, tasks by fate) without computing features."""
    table = _sweep(Path(trace_dir), None, progress)
    observed = table.last_start > 0
    kind = table.last_kind
    scored = observed & (kind == FINISH)
    return TraceCounts(
        parts=table.parts,
        gaps=table.gaps,
        window_start_s=table.window_start_us / US_PER_S,
        window_end_s=table.window_end_us / US_PER_S,
        events=table.events,
        jobs=len(table.job_names),
        tasks=len(table.task_index),
        scheduled_tasks=int(observed.sum()),
        scored_tasks=int(scored.sum()),
        ended_tasks=int((observed & np.isin(kind, list(TERMINAL_EVENTS - {FINISH}))).sum()),
        running_at_end=int((observed & (kind == RUN_OPEN)).sum()),
        cut_tasks=int((observed & (kind == RUN_CUT)).sum()),
        excluded_tasks=int((~observed & table.unobserved).sum()),
        never_scheduled=int((~observed & ~table.unobserved).sum()),
        finished_tasks=int(table.finished_any.sum()),
        anomalies=table.anomalies,
        scored_per_job=_per_job(table, scored),
        finished_per_job=_per_job(table, table.finished_any),
    )


def _job_metadata(trace_dir: Path, wanted: set[str]) -> dict[str, dict[str, float | str]]:
    """User, names and first SUBMIT of the wanted jobs, from ``job_events/`` when it exists."""
    directory = trace_dir / JOB_EVENTS_DIR
    meta: dict[str, dict[str, float | str]] = {}
    if not directory.is_dir():
        return meta
    for _, path in trace_parts(directory):
        for row in _csv_rows(path):
            job = row[JOB_JOB_ID]
            if job not in wanted or job in meta:
                continue
            meta[job] = {
                "user": row[JOB_USER],
                "job_name": row[JOB_NAME],
                "logical_job_name": row[JOB_LOGICAL_NAME],
                "job_first_event_s": int(row[JOB_TIME]) / US_PER_S,
            }
    return meta


def _job_order(job_id: str) -> tuple[int, str]:
    """Numeric job ids sort by value ("9" before "10"); any others after them, by text."""
    return (0, f"{int(job_id):020d}") if job_id.isdigit() else (1, job_id)


def _ceil_us(seconds: FloatArray) -> IntArray:
    """Smallest whole microsecond not before each time: an event at e us is before t iff e < this."""
    return np.ceil(np.round(seconds * US_PER_S, 3)).astype(np.int64)


@dataclass
class _JobPlan:
    """One job's tasks and the (task, time) rows whose features it needs."""

    job: int
    tasks: IntArray
    start_us: IntArray
    start: FloatArray
    end: FloatArray
    finished: BoolArray
    checkpoints: FloatArray
    running_k: IntArray
    running_i: IntArray

    @property
    def n_rows(self) -> int:
        return len(self.running_i) + int(self.finished.sum())


def _plan_job(
    table: _TaskTable, job: int, tasks: IntArray, interval: float, per_job: int | None = None
) -> _JobPlan:
    order = np.argsort(np.asarray([int(table.task_index[c]) for c in tasks]), kind="stable")
    tasks = tasks[order]
    start_us = table.last_start[tasks]
    end_us = table.last_end[tasks]
    start = start_us / US_PER_S
    end = np.where(end_us >= 0, end_us / US_PER_S, np.nan)
    finished = table.last_kind[tasks] == FINISH
    has_end = np.isfinite(end)
    last_end = float(end[has_end].max()) if has_end.any() else math.nan
    if per_job is None:
        checkpoints = checkpoint_grid(float(start.min()), last_end, interval)
    else:
        checkpoints = per_job_grid(float(start.min()), last_end, per_job)
    with np.errstate(invalid="ignore"):
        is_running = (start[None, :] <= checkpoints[:, None]) & ~(end[None, :] <= checkpoints[:, None])
    running_k, running_i = np.nonzero(is_running)
    return _JobPlan(job, tasks, start_us, start, end, finished, checkpoints, running_k, running_i)


def per_job_grid(first_start: float, last_end: float, count: int) -> FloatArray:
    """``count`` checkpoints evenly spread over the job's span, the last at its last task's end.

    The paper's normalised-time protocol (and the issue's prototype: "20 checkpoints per job"). Placing
    them needs the job's end, which no live deployment knows: an evaluation protocol only. No method
    sees the grid; every feature is still computed from events strictly before each checkpoint.
    """
    if count < 1:
        raise ValueError(f"checkpoints per job must be >= 1, got {count}")
    if not np.isfinite(last_end) or last_end <= first_start:
        return np.array([first_start + 1e-6])
    return first_start + (last_end - first_start) * np.arange(1, count + 1, dtype=np.float64) / count


def _build_traces(
    table: _TaskTable,
    features: OnlineFeatures,
    plans: list[_JobPlan],
    excluded: IntArray,
    never_scheduled: IntArray,
    meta: dict[str, dict[str, float | str]],
) -> list[JobTrace]:
    """Evaluate every plan's rows in one batch of feature queries and cut them back into traces."""
    task_parts, t_parts, start_parts = [], [], []
    for plan in plans:
        fin = np.flatnonzero(plan.finished)
        task_parts += [plan.tasks[plan.running_i], plan.tasks[fin]]
        t_parts += [_ceil_us(plan.checkpoints[plan.running_k]), table.last_end[plan.tasks[fin]]]
        start_parts += [plan.start_us[plan.running_i], plan.start_us[fin]]
    task = np.concatenate(task_parts)
    rows = features.at(
        task,
        table.task_job[task],
        table.last_machine[task],
        np.concatenate(start_parts),
        np.concatenate(t_parts),
    )
    traces = []
    offset = 0
    for plan in plans:
        n_running = len(plan.running_i)
        running_rows = rows[offset : offset + n_running]
        offset += n_running
        finish_features = np.full((len(plan.tasks), len(FEATURE_NAMES)), np.nan)
        fin = np.flatnonzero(plan.finished)
        finish_features[fin] = rows[offset : offset + len(fin)]
        offset += len(fin)
        bounds = np.searchsorted(plan.running_k, np.arange(1, len(plan.checkpoints)))
        job_name = table.job_names[plan.job]
        kinds = table.last_kind[plan.tasks]
        job_meta: dict[str, float | str] = {
            "source": "google-2011",
            "scored_tasks": float(plan.finished.sum()),
            "ended_tasks": float(np.isin(kinds, list(TERMINAL_EVENTS - {FINISH})).sum()),
            "running_at_end": float((kinds == RUN_OPEN).sum()),
            "cut_tasks": float((kinds == RUN_CUT).sum()),
            "never_scheduled": float(never_scheduled[plan.job]),
        }
        job_meta.update(meta.get(job_name, {}))
        traces.append(
            JobTrace(
                job_id=job_name,
                task_ids=[table.task_index[c] for c in plan.tasks],
                machine_ids=[table.machine_names[m] for m in table.last_machine[plan.tasks]],
                start=plan.start,
                end=plan.end,
                finished=plan.finished,
                feature_names=FEATURE_NAMES,
                checkpoints=plan.checkpoints,
                running_index=np.split(plan.running_i.astype(np.int64), bounds),
                running_features=np.split(running_rows.copy(), bounds),
                finish_features=finish_features,
                excluded_tasks=int(excluded[plan.job]),
                meta=job_meta,
            )
        )
    return traces


def load_google2011(
    trace_dir: Path,
    *,
    checkpoint_seconds: float = 300.0,
    checkpoints_per_job: int | None = None,
    min_tasks: int = 100,
    max_jobs: int | None = None,
    job_ids: Collection[str] | None = None,
    progress: bool = False,
) -> list[JobTrace]:
    """Jobs of a Google 2011 trace window with at least ``min_tasks`` scored tasks, as `JobTrace`s.

    ``job_ids`` restricts the jobs returned (``min_tasks`` still applies); ``max_jobs`` keeps the
    largest by scored-task count, ties by numeric job id. The result is ordered by each job's first
    task start, then job id. Features always come from every event of the window. With
    ``checkpoints_per_job`` the checkpoints are `per_job_grid` instead of every ``checkpoint_seconds``.
    """
    trace_dir = Path(trace_dir)
    log = OnlineFeatureLog()
    table = _sweep(trace_dir, log, progress)
    features = log.freeze()
    del log

    observed = table.last_start > 0
    n_jobs = len(table.job_names)
    scored = np.bincount(table.task_job[observed & (table.last_kind == FINISH)], minlength=n_jobs)
    excluded = np.bincount(table.task_job[~observed & table.unobserved], minlength=n_jobs)
    never_scheduled = np.bincount(table.task_job[~observed & ~table.unobserved], minlength=n_jobs)
    with_runs = np.bincount(table.task_job[observed], minlength=n_jobs) > 0
    selected: list[int] = np.flatnonzero((scored >= min_tasks) & with_runs).tolist()
    if job_ids is not None:
        wanted = {str(job) for job in job_ids}
        selected = [j for j in selected if table.job_names[j] in wanted]
    if max_jobs is not None:
        selected.sort(key=lambda j: (-int(scored[j]), _job_order(table.job_names[j])))
        selected = selected[:max_jobs]

    observed_tasks = np.flatnonzero(observed)
    by_job = observed_tasks[np.argsort(table.task_job[observed_tasks], kind="stable")]
    job_bounds = np.searchsorted(table.task_job[by_job], np.arange(n_jobs + 1))
    plans = [
        _plan_job(
            table, j, by_job[job_bounds[j] : job_bounds[j + 1]], checkpoint_seconds, checkpoints_per_job
        )
        for j in selected
    ]
    plans.sort(key=lambda plan: (float(plan.start.min()), _job_order(table.job_names[plan.job])))
    meta = _job_metadata(trace_dir, {table.job_names[plan.job] for plan in plans})

    traces: list[JobTrace] = []
    batch: list[_JobPlan] = []
    batch_rows = 0
    with tqdm(total=len(plans), desc="features", unit="job", disable=not progress) as bar:
        for plan in [*plans, None]:
            if plan is not None:
                batch.append(plan)
                batch_rows += plan.n_rows
            if batch and (plan is None or batch_rows >= _QUERY_BATCH_ROWS):
                traces += _build_traces(table, features, batch, excluded, never_scheduled, meta)
                bar.update(len(batch))
                batch, batch_rows = [], 0
    return traces
