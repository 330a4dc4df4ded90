"""Write simulated jobs as a Google 2011 trace with usage (``task_events`` + ``task_usage``).

Why: writing synthetic jobs in exactly the format of the real usage table (~41 GB, not available here)
runs the whole `load_google2011_usage` path on data whose causes are known. Times are offset by 600 s
(`TIME_OFFSET_US`) so that none reads as "before the trace"; an interrupted task is written as the
Google trace would show it (its last run), an uninterrupted one exactly.

Ids, columns and the restart caveat: docs/architecture.md, "Synthetic jobs written as a Google trace".
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator, Sized
from pathlib import Path
from typing import TextIO

import numpy as np

from straggler.core.arrays import IntArray
from straggler.traces.synthetic import USAGE_FEATURES as SYNTHETIC_USAGE_FEATURES
from straggler.traces.synthetic import SimulatedJob
from straggler.traces.usage import TASK_USAGE_COLUMNS

JOB_ID_BASE = 6_000_000_000
"""Job j of the input is written as ``JOB_ID_BASE + j`` (Google job ids are large integers)."""
TIME_OFFSET_US = 600_000_000
"""Added to every simulation time: the real trace starts at 600 s, 0 means "before the trace"."""
PART_NAME = "part-00000-of-00001.csv.gz"
TASK_EVENTS_COLUMNS = 13
SUBMIT, SCHEDULE, EVICT, FAIL, FINISH = 0, 1, 2, 3, 4

USAGE_COLUMN_OF: dict[str, str] = {
    "cpu_usage": "mean_cpu_rate",
    "max_cpu": "maximum_cpu_rate",
    "memory_usage": "canonical_memory_usage",
    "disk_io_time": "mean_disk_io_time",
    "cpi": "cycles_per_instruction",
    "mem_accesses_per_instr": "memory_accesses_per_instruction",
}
"""Synthetic usage feature → the ``task_usage`` column it is written to."""
DROPPED_FEATURES: tuple[str, ...] = tuple(f for f in SYNTHETIC_USAGE_FEATURES if f not in USAGE_COLUMN_OF)
"""Synthetic features with no column in the Google table (read rate, machine load): not written."""

_USAGE_FIRST_VALUE = TASK_USAGE_COLUMNS.index("mean_cpu_rate")
_SOURCE_OF_COLUMN: tuple[int | None, ...] = tuple(
    SYNTHETIC_USAGE_FEATURES.index(next(f for f, c in USAGE_COLUMN_OF.items() if c == column))
    if column in USAGE_COLUMN_OF.values()
    else None
    for column in TASK_USAGE_COLUMNS[_USAGE_FIRST_VALUE:]
)
"""For each value column of a usage row (mean_cpu_rate onwards): the synthetic feature, or None."""


def to_us(seconds: np.ndarray) -> IntArray:
    """Simulation seconds → trace microseconds (rounded, offset by `TIME_OFFSET_US`)."""
    return np.rint(np.asarray(seconds, dtype=np.float64) * 1e6).astype(np.int64) + TIME_OFFSET_US


def _task_events(job: SimulatedJob) -> IntArray:
    """The job's events as rows (time_us, task, machine or -1, event type), in per-task order."""
    rows: list[tuple[int, int, int, int]] = []
    start, end = to_us(job.start), to_us(job.end)
    submit = int(start.min()) if job.n_tasks else 0
    for task in range(job.n_tasks):
        machine, first, last = int(job.machine[task]), int(start[task]), int(end[task])
        rows += [(submit, task, -1, SUBMIT), (first, task, machine, SCHEDULE)]
        hits = sorted(
            [(t, EVICT) for t in to_us(job.evictions[task][np.isfinite(job.evictions[task])]).tolist()]
            + [(t, FAIL) for t in to_us(job.failures[task][np.isfinite(job.failures[task])]).tolist()]
        )
        for when, kind in hits:
            if not first < when < last:
                raise ValueError(f"job {job.job_id} task {task}: interruption at {when} us outside its run")
            rows += [(when, task, machine, kind), (when, task, -1, SUBMIT), (when, task, machine, SCHEDULE)]
        rows.append((last, task, machine, FINISH))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


def _value(x: float) -> str:
    return repr(x) if np.isfinite(x) else ""


def _write_usage_rows(handle: TextIO, job: SimulatedJob, job_id: int) -> int:
    """One ``task_usage`` row per window of the job; returns how many were written."""
    windows = job.windows
    if windows.n_columns != len(SYNTHETIC_USAGE_FEATURES):
        raise ValueError(
            f"job {job.job_id}: {windows.n_columns} usage columns, expected {len(SYNTHETIC_USAGE_FEATURES)}"
        )
    start, end = to_us(windows.start), to_us(windows.end)
    order = np.lexsort((windows.task, start))
    values = windows.values.tolist()
    machines = job.machine.tolist()
    for w in order.tolist():
        task = int(windows.task[w])
        row = values[w]
        usage = ",".join("" if source is None else _value(row[source]) for source in _SOURCE_OF_COLUMN)
        handle.write(f"{start[w]},{end[w]},{job_id},{task},{machines[task]},{usage}\n")
    return len(order)


def _write_events(path: Path, events: list[tuple[int, IntArray]]) -> None:
    """All jobs' events sorted by time (stable: a task's same-instant events keep their order)."""
    job_ids = np.concatenate(
        [np.full(len(rows), job_id, dtype=np.int64) for job_id, rows in events]
        or [np.empty(0, dtype=np.int64)]
    )
    table = np.concatenate([rows for _, rows in events] or [np.empty((0, 4), dtype=np.int64)])
    order = np.argsort(table[:, 0], kind="stable")
    empty = "," * (TASK_EVENTS_COLUMNS - 6)  # user … different_machine_constraint
    with gzip.open(path, "wt", newline="") as handle:
        for i in order.tolist():
            time_us, task, machine, kind = table[i].tolist()
            where = "" if machine < 0 else str(machine)
            handle.write(f"{time_us},,{job_ids[i]},{task},{where},{kind}{empty}\n")


def _jobs_with_progress(jobs: Iterable[SimulatedJob], progress: bool) -> Iterator[SimulatedJob]:
    if not progress:
        return iter(jobs)
    from tqdm import tqdm

    total = len(jobs) if isinstance(jobs, Sized) else None
    return iter(tqdm(jobs, total=total, desc="usage trace", unit="job"))


def write_usage_trace(jobs: Iterable[SimulatedJob], out_dir: Path, *, progress: bool = True) -> Path:
    """Write ``jobs`` under ``out_dir`` as ``task_events/`` and ``task_usage/``; returns ``out_dir``.

    Jobs are consumed one at a time: their usage rows are written at once, their events (a few per
    task) are kept until the end to be written in time order. Existing parts are overwritten.
    """
    out_dir = Path(out_dir)
    (out_dir / "task_events").mkdir(parents=True, exist_ok=True)
    (out_dir / "task_usage").mkdir(parents=True, exist_ok=True)
    events: list[tuple[int, IntArray]] = []
    with gzip.open(out_dir / "task_usage" / PART_NAME, "wt", newline="") as usage:
        for j, job in enumerate(_jobs_with_progress(jobs, progress)):
            if job.n_tasks and (float(np.min(job.start)) < 0 or not np.all(job.end > job.start)):
                raise ValueError(f"job {job.job_id}: needs start >= 0 and end > start for every task")
            job_id = JOB_ID_BASE + j
            events.append((job_id, _task_events(job)))
            _write_usage_rows(usage, job, job_id)
    _write_events(out_dir / "task_events" / PART_NAME, events)
    return out_dir
