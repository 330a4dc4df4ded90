"""Alibaba cluster-trace-v2018 batch workloads → `JobTrace`s (the NURD paper's second trace).

Unit of prediction: one task of a batch job, whose instances are the JobTrace's tasks. No future
information: ``batch_instance``'s cpu/mem summaries cover the whole run and are never read; features at
t are the submission-time plans and the machine's ``machine_usage`` samples taken after the instance
started and by t (and before its end).

Run selection, features and columns: docs/architecture.md, "Alibaba 2018".
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from straggler.core.arrays import BoolArray, FloatArray
from straggler.core.jobtrace import JobTrace
from straggler.traces.usage import UsageWindows, assemble_job_trace

BATCH_TASK_COLUMNS: tuple[str, ...] = (
    "task_name",
    "instance_num",
    "job_name",
    "task_type",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
)
BATCH_INSTANCE_COLUMNS: tuple[str, ...] = (
    "instance_name",
    "task_name",
    "job_name",
    "task_type",
    "status",
    "start_time",
    "end_time",
    "machine_id",
    "seq_no",
    "total_seq_no",
    "cpu_avg",  # whole-run summaries: never features
    "cpu_max",
    "mem_avg",
    "mem_max",
)
MACHINE_USAGE_COLUMNS: tuple[str, ...] = (
    "machine_id",
    "time_stamp",
    "cpu_util_percent",
    "mem_util_percent",
    "mem_gps",
    "mkpi",
    "net_in",
    "net_out",
    "disk_io_percent",
)

PLAN_FEATURES: tuple[str, ...] = ("plan_cpu", "plan_mem", "instance_num")
MACHINE_FEATURES: tuple[str, ...] = MACHINE_USAGE_COLUMNS[2:]
FEATURE_NAMES: tuple[str, ...] = (*PLAN_FEATURES, *MACHINE_FEATURES, "machine_instances")

FIRST_SAMPLE_SECONDS = 10.0
"""Length of the window a machine's first sample closes (the trace samples every 10 s)."""
FINISHED = "Terminated"
_UNBOUNDED = frozenset(("mkpi",))  # not a [0, 100] column: only negative values are invalid
_PLAN_COLUMNS = slice(0, len(PLAN_FEATURES))
_MACHINE_COLUMNS = slice(len(PLAN_FEATURES), len(PLAN_FEATURES) + len(MACHINE_FEATURES))
_COLOCATED_COLUMN = len(FEATURE_NAMES) - 1


def _table(trace_dir: Path, name: str) -> Path:
    for suffix in (".csv", ".csv.gz"):
        path = trace_dir / f"{name}{suffix}"
        if path.is_file():
            return path
    hint = " (extract the .tar.gz first)" if (trace_dir / f"{name}.tar.gz").exists() else ""
    raise FileNotFoundError(f"no {name}.csv or {name}.csv.gz in {trace_dir}{hint}")


def _rows(path: Path, progress: bool) -> Iterator[list[str]]:
    with gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="") as handle:
        for line in tqdm(handle, desc=path.name, unit=" rows", disable=not progress):
            line = line.rstrip("\r\n")
            if line:
                yield line.split(",")


def _number(fields: list[str], column: int) -> float:
    text = fields[column].strip() if column < len(fields) else ""
    return float(text) if text else math.nan


def _run_end(start: float, end: float) -> float:
    """An attempt's end, NaN when the trace does not know it (0/empty: outside the span)."""
    return end if end > 0 and end >= start else math.nan


@dataclass(frozen=True)
class _Plan:
    instance_num: float
    plan_cpu: float
    plan_mem: float


@dataclass(frozen=True)
class _Attempt:
    seq_no: int
    status: str
    start: float
    end: float
    machine: str


GroupKey = tuple[str, str]
"""(job_name, task_name)."""


def _read_plans(path: Path, progress: bool) -> dict[GroupKey, _Plan]:
    plans: dict[GroupKey, _Plan] = {}
    for row in _rows(path, progress):
        plans[(row[2], row[0])] = _Plan(_number(row, 1), _number(row, 7), _number(row, 8))
    return plans


def _read_instances(
    path: Path, progress: bool
) -> tuple[dict[GroupKey, dict[str, _Attempt]], dict[str, tuple[list[float], list[float]]]]:
    """Per task group, each instance's last attempt; per machine, the (start, end) of every attempt
    that started inside the trace (end +inf when unknown), for ``machine_instances``."""
    groups: dict[GroupKey, dict[str, _Attempt]] = {}
    occupancy: dict[str, tuple[list[float], list[float]]] = {}
    for row in _rows(path, progress):
        seq = _number(row, 8)
        start, end = _number(row, 5), _number(row, 6)
        attempt = _Attempt(int(seq) if np.isfinite(seq) else 0, row[4], start, end, row[7])
        instances = groups.setdefault((row[2], row[1]), {})
        previous = instances.get(row[0])
        if previous is None or attempt.seq_no >= previous.seq_no:
            instances[row[0]] = attempt
        if start > 0 and attempt.machine:
            starts, ends = occupancy.setdefault(attempt.machine, ([], []))
            starts.append(start)
            run_end = _run_end(start, end)
            ends.append(math.inf if math.isnan(run_end) else run_end)
    return groups, occupancy


@dataclass
class _Group:
    """The instances of one task group that enter its trace, in name order."""

    key: GroupKey
    instances: list[str]
    machine: list[str]
    start: FloatArray
    end: FloatArray
    finished: BoolArray
    plan: _Plan | None
    expected_tasks: int
    excluded_tasks: int

    @property
    def job_id(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"


def _group(key: GroupKey, attempts: dict[str, _Attempt], plan: _Plan | None) -> _Group:
    kept = sorted(name for name, a in attempts.items() if a.start > 0)
    runs = [attempts[name] for name in kept]
    start = np.asarray([a.start for a in runs], dtype=np.float64)
    end = np.asarray([_run_end(a.start, a.end) for a in runs], dtype=np.float64)
    status = np.asarray([a.status == FINISHED for a in runs], dtype=bool)
    with np.errstate(invalid="ignore"):
        finished = status & (end > start)
    return _Group(
        key=key,
        instances=kept,
        machine=[a.machine for a in runs],
        start=start,
        end=end,
        finished=finished,
        plan=plan,
        expected_tasks=int(plan.instance_num) if plan and plan.instance_num > 0 else len(attempts),
        excluded_tasks=len(attempts) - len(kept),
    )


@dataclass(frozen=True)
class _MachineSamples:
    """One machine's samples inside the span the selected instances need, sorted by time."""

    time: FloatArray
    window_start: FloatArray
    values: FloatArray
    colocated: FloatArray
    """Batch attempts running on the machine at each sample (``start <= time < end``)."""


def _read_machine_usage(
    path: Path,
    groups: list[_Group],
    occupancy: dict[str, tuple[list[float], list[float]]],
    progress: bool,
) -> dict[str, _MachineSamples]:
    """Samples of the selected instances' machines after the earliest start there; of earlier ones only
    the latest is kept, as the start of the first kept sample's window."""
    lo: dict[str, float] = {}
    for group in groups:
        for machine, start in zip(group.machine, group.start, strict=True):
            if machine:
                lo[machine] = min(lo.get(machine, math.inf), float(start))
    before: dict[str, float] = {}
    rows: dict[str, tuple[list[float], list[list[float]]]] = {m: ([], []) for m in lo}
    width = len(MACHINE_FEATURES)
    for row in _rows(path, progress):
        machine = row[0]
        if machine not in lo:
            continue
        stamp = _number(row, 1)
        if not stamp > 0:  # 0: outside the 8-day span
            continue
        if stamp <= lo[machine]:
            before[machine] = max(before.get(machine, -math.inf), stamp)
            continue
        times, values = rows[machine]
        times.append(stamp)
        values.append([_number(row, 2 + c) for c in range(width)])

    samples: dict[str, _MachineSamples] = {}
    for machine, (times, values) in rows.items():
        if not times:
            continue
        order = np.argsort(np.asarray(times), kind="stable")
        time = np.asarray(times, dtype=np.float64)[order]
        value = np.asarray(values, dtype=np.float64).reshape(len(times), width)[order]
        for c, name in enumerate(MACHINE_FEATURES):
            low, high = (0.0, math.inf) if name in _UNBOUNDED else (0.0, 100.0)
            with np.errstate(invalid="ignore"):
                value[(value[:, c] < low) | (value[:, c] > high), c] = np.nan
        first = before.get(machine, time[0] - FIRST_SAMPLE_SECONDS)
        starts, ends = occupancy.get(machine, ([], []))
        started = np.searchsorted(np.sort(np.asarray(starts, dtype=np.float64)), time, side="right")
        ended = np.searchsorted(np.sort(np.asarray(ends, dtype=np.float64)), time, side="right")
        samples[machine] = _MachineSamples(
            time=time,
            window_start=np.concatenate([[first], time[:-1]]),
            values=value,
            colocated=(started - ended).astype(np.float64),
        )
    return samples


def _windows(group: _Group, samples: dict[str, _MachineSamples]) -> UsageWindows:
    """The plan window of every instance, then its machine's samples in ``(start, end)``."""
    n, width = len(group.instances), len(FEATURE_NAMES)
    plan_values = np.full((n, width), np.nan)
    if group.plan is not None:
        plan = group.plan
        plan_values[:, _PLAN_COLUMNS] = [plan.plan_cpu, plan.plan_mem, plan.instance_num]
    task = [np.arange(n, dtype=np.int64)]
    starts, ends, values = [group.start - 1.0], [group.start.copy()], [plan_values]
    for i, machine in enumerate(group.machine):
        machine_samples = samples.get(machine)
        if machine_samples is None:
            continue
        first = np.searchsorted(machine_samples.time, group.start[i], side="right")
        last = (
            np.searchsorted(machine_samples.time, group.end[i], side="left")
            if np.isfinite(group.end[i])
            else len(machine_samples.time)
        )
        if last <= first:
            continue
        rows = np.full((last - first, width), np.nan)
        rows[:, _MACHINE_COLUMNS] = machine_samples.values[first:last]
        rows[:, _COLOCATED_COLUMN] = machine_samples.colocated[first:last] - 1.0  # not itself
        task.append(np.full(last - first, i, dtype=np.int64))
        starts.append(machine_samples.window_start[first:last])
        ends.append(machine_samples.time[first:last])
        values.append(rows)
    return UsageWindows.from_unsorted(
        np.concatenate(task), np.concatenate(starts), np.concatenate(ends), np.vstack(values)
    )


def load_alibaba2018(
    trace_dir: Path,
    *,
    checkpoint_seconds: float = 60.0,
    min_tasks: int = 100,
    max_jobs: int | None = None,
    progress: bool = True,
) -> list[JobTrace]:
    """Task groups with at least ``min_tasks`` finished instances, one `JobTrace` each (job id
    ``job_name/task_name``), in order of their first instance start; ``max_jobs`` keeps the groups with
    the most finished instances. ``machine_usage`` is read only for the machines of those groups.
    """
    trace_dir = Path(trace_dir)
    plans = _read_plans(_table(trace_dir, "batch_task"), progress)
    attempts, occupancy = _read_instances(_table(trace_dir, "batch_instance"), progress)
    candidates = [_group(key, group, plans.get(key)) for key, group in attempts.items()]
    candidates = [g for g in candidates if len(g.instances) and int(g.finished.sum()) >= min_tasks]
    candidates.sort(key=lambda g: (-int(g.finished.sum()), float(g.start.min()), g.job_id))
    selected = sorted(candidates[:max_jobs], key=lambda g: (float(g.start.min()), g.job_id))
    if not selected:
        return []

    samples = _read_machine_usage(_table(trace_dir, "machine_usage"), selected, occupancy, progress)
    traces: list[JobTrace] = []
    for group in selected:
        windows = _windows(group, samples)
        machine_windows = np.isfinite(windows.values[:, _COLOCATED_COLUMN])
        with_usage = np.unique(windows.task[machine_windows])
        traces.append(
            assemble_job_trace(
                job_id=group.job_id,
                task_ids=group.instances,
                machine_ids=group.machine,
                start=group.start,
                end=group.end,
                finished=group.finished,
                windows=windows,
                event_times=(),
                feature_names=FEATURE_NAMES,
                checkpoint_seconds=checkpoint_seconds,
                expected_tasks=group.expected_tasks,
                excluded_tasks=group.excluded_tasks,
                meta={
                    "source": "alibaba-2018",
                    "job_name": group.key[0],
                    "task_name": group.key[1],
                    "machine_windows": float(machine_windows.sum()),
                    "instances_without_usage": float(len(group.instances) - len(with_usage)),
                },
            )
        )
    return traces
