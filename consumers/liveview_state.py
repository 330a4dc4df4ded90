"""The live view's pure core: a fold from decoded pipeline events to the JSON the page renders.

`LiveViewState.apply` keeps, per job and task, only what the topics said: each attempt's start and
end as the task events report them, the latest prediction, and the commands issued. Everything the
page shows is derived from those facts when asked (`summary`, `job_detail`), so a command read
before the task events it acts on counts as if read after them. No Kafka here.

Only figures the stream can measure are shown: a job's completion time, copies won and lost (which
attempt finished), machine time of attempts beyond each task's first. How long a job would have run
without the commands needs the trace's own latencies, which the topics never carry, so the view
shows no saving; ``straggler replay``'s report measures it. The rules: docs/architecture.md, "The live view".
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import numpy as np

from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    Event,
    JobEvent,
    MitigationNote,
    Prediction,
    RelaunchCommand,
    TaskCheckpoint,
)

SORT_KEYS = ("task", "attempts", "elapsed", "predicted", "probability", "machine", "status", "copy")
"""Columns the task table sorts by."""
FILTERS = ("all", "running", "finished", "flagged", "copied", "killed")
"""What the task table's status filter keeps."""
DEFAULT_LIMIT = 50
"""Task rows (and timeline lanes) a job's detail returns unless asked for more."""


@dataclass
class _Observed:
    """One attempt as the task events report it."""

    start: float | None = None
    end: float | None = None
    status: str = "running"


@dataclass
class _Task:
    """What the view keeps per task: facts from the topics, nothing derived."""

    machine: str = ""
    observed: dict[int, _Observed] = field(default_factory=dict)
    """attempt -> what its task events said."""
    finish: tuple[float, int] | None = None
    """(end, attempt that finished), from the first finish event."""
    commands: list[tuple[float, str, int | None]] = field(default_factory=list)
    """(checkpoint time, action, attempt acted on) of each distinct command."""
    flagged_at: float | None = None
    """First checkpoint at which it was predicted to straggle."""
    prediction: tuple[float, float | None, float | None] | None = None
    """(checkpoint time, predicted latency, straggle probability) of the latest verdict."""
    note: tuple[float, str] | None = None
    """(checkpoint time, reason) of the latest `MitigationNote`: why it has no command."""


@dataclass
class Run:
    """One attempt of a task as the page draws it; ``end`` None: still running (or never seen ending)."""

    attempt: int
    kind: Literal["original", "relaunch", "copy"]
    start: float | None
    end: float | None
    outcome: str
    """running, finished, killed, failed, lost (a race's loser not killed), or replaced (relaunched)."""
    killed_at: float | None = None


@dataclass
class _Job:
    """What the view keeps per job."""

    started_at: float | None = None
    expected_tasks: int | None = None
    ended_at: float | None = None
    abandoned: str | None = None
    """Why the agent closed the job as abandoned (its ``ended`` event's reason); None: not abandoned."""
    last_checkpoint: float = -math.inf
    running: set[str] = field(default_factory=set)
    """Tasks reported running at ``last_checkpoint``."""
    tasks: dict[str, _Task] = field(default_factory=dict)
    command_ids: set[str] = field(default_factory=set)
    """Commands counted already (a redelivered command counts once)."""
    command_log: list[Decision] = field(default_factory=list)
    """Each distinct command, with its reason, as it arrived."""
    commands_by_action: dict[str, int] = field(default_factory=dict)
    checkpoints: int = 0
    """Checkpoints the agent finished evaluating (``checkpoint_evaluated`` markers)."""
    figures: Figures | None = None
    """`job_figures` as of the latest event (None: to compute again), so a poll does not redo every
    ended job."""

    def task(self, task_id: str) -> _Task:
        return self.tasks.setdefault(task_id, _Task())

    def now(self) -> float | None:
        """The latest instant the job's events speak of."""
        if self.ended_at is not None:
            return self.ended_at
        ends = [t.finish[0] for t in self.tasks.values() if t.finish is not None]
        latest = max([self.last_checkpoint, *ends])
        return latest if math.isfinite(latest) else self.started_at


@dataclass(frozen=True)
class Decision:
    """A command as the job page lists it."""

    checkpoint_time: float
    task: str
    action: str
    attempt: int | None
    reason: str
    policy: str


@dataclass(frozen=True)
class Letter:
    """A dead letter as the page lists it."""

    failed_at: float
    stage: str | None
    source: str
    """``topic[partition]@offset`` of the record."""
    reason: str


KEEP_LETTERS = 100
"""Dead letters the page lists (the newest); older ones only count."""


@dataclass(frozen=True)
class Figures:
    """Measured figures, the ones ``straggler replay``'s summary.json also reports: one job's, or
    summed over jobs with ``+`` (so the totals keep no more than a job does)."""

    jobs: int
    jct_sum: float
    """Sum of the completion times (latest finish minus the job's start) of ``jct_jobs`` jobs: those
    with a finished task."""
    jct_jobs: int
    copies: int
    copies_won: int
    extra_machine_seconds: float
    """Run time of every attempt beyond each task's first (copies, relaunches)."""
    flagged: int

    def __add__(self, other: Figures) -> Figures:
        return Figures(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Figures)))

    @property
    def mean_jct(self) -> float | None:
        return self.jct_sum / self.jct_jobs if self.jct_jobs else None

    @property
    def copies_lost(self) -> int:
        return self.copies - self.copies_won


NO_FIGURES = Figures(
    jobs=0, jct_sum=0.0, jct_jobs=0, copies=0, copies_won=0, extra_machine_seconds=0.0, flagged=0
)


@dataclass
class LiveViewState:
    """The fold; ``keep_ended`` bounds how many ended jobs are kept in detail (oldest ended go first)."""

    keep_ended: int = 200
    jobs: dict[str, _Job] = field(default_factory=dict)
    predictions: int = 0
    dead_letters: int = 0
    undecodable: int = 0
    commands_by_action: dict[str, int] = field(default_factory=dict)
    retired: set[str] = field(default_factory=set)
    retired_figures: Figures = NO_FIGURES
    """Figures of the ended jobs no longer kept in detail, summed."""
    letters: list[Letter] = field(default_factory=list)
    """The newest `KEEP_LETTERS` dead letters, oldest first."""

    def apply_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: Event) -> None:
        """Fold one event in; events of any type and topic are accepted, unknown ones ignored."""
        if isinstance(event, DeadLetter):
            self.dead_letters += 1
            source = f"{event.source_topic}[{event.source_partition}]@{event.source_offset}"
            self.letters.append(Letter(event.failed_at, event.stage, source, event.error))
            del self.letters[:-KEEP_LETTERS]
            lettered = self.jobs.get(_never_started(event) or "")
            if lettered is not None and lettered.started_at is None:  # its records are lettered: it never ran
                del self.jobs[_never_started(event) or ""]
            return
        job_id = getattr(event, "job_id", None)
        if job_id is None or job_id in self.retired:
            return
        job = self.jobs.setdefault(job_id, _Job())
        job.figures = None
        if isinstance(event, JobEvent):
            if event.event == "started":
                job.started_at = event.time
                job.expected_tasks = event.expected_tasks
            else:
                job.ended_at = event.time
                job.abandoned = event.reason if event.abandoned else None
                self._retire()
        elif isinstance(event, TaskCheckpoint):
            _on_task(job, event)
        elif isinstance(event, Prediction):
            self.predictions += 1
            task = job.task(event.task_id)
            if event.is_straggler and (task.flagged_at is None or event.checkpoint_time < task.flagged_at):
                task.flagged_at = event.checkpoint_time
            if task.prediction is None or event.checkpoint_time >= task.prediction[0]:
                latency = event.adjusted_latency
                finite = latency if latency is not None and math.isfinite(latency) else None
                task.prediction = (event.checkpoint_time, finite, event.straggle_probability)
        elif isinstance(event, RelaunchCommand):
            if event.command_id not in job.command_ids:
                job.command_ids.add(event.command_id)
                job.task(event.task_id).commands.append((event.checkpoint_time, event.action, event.attempt))
                job.command_log.append(
                    Decision(
                        event.checkpoint_time,
                        event.task_id,
                        event.action,
                        event.attempt,
                        event.reason,
                        event.policy,
                    )
                )
                job.commands_by_action[event.action] = job.commands_by_action.get(event.action, 0) + 1
                self.commands_by_action[event.action] = self.commands_by_action.get(event.action, 0) + 1
        elif isinstance(event, MitigationNote):
            task = job.task(event.task_id)
            if task.note is None or event.checkpoint_time >= task.note[0]:
                task.note = (event.checkpoint_time, event.reason)
        elif isinstance(event, CheckpointEvaluated):
            job.checkpoints += 1
        elif isinstance(event, CheckpointBoundary):
            job.last_checkpoint = max(job.last_checkpoint, event.checkpoint_time)

    def _retire(self) -> None:
        """Drop the oldest ended jobs beyond ``keep_ended``, keeping their figures in the totals."""
        ended = sorted((j.ended_at, job_id) for job_id, j in self.jobs.items() if j.ended_at is not None)
        for _, job_id in ended[: max(0, len(ended) - self.keep_ended)]:
            self.retired_figures += job_figures(self.jobs.pop(job_id))
            self.retired.add(job_id)

    def summary(self, max_jobs: int = 100) -> dict[str, Any]:
        """Totals, measured figures over ended jobs, then jobs in flight (oldest first) and ended ones
        (latest first)."""
        measured = self.retired_figures
        rows = []
        for job_id, job in self.jobs.items():
            rows.append(_job_row(job_id, job))
            if job.ended_at is not None:
                measured += job_figures(job)
        in_flight = sorted((r for r in rows if r["ended_at"] is None), key=_start_key)
        ended = sorted((r for r in rows if r["ended_at"] is not None), key=lambda r: -r["ended_at"])
        return {
            "totals": {
                "jobs_in_flight": len(in_flight),
                "jobs_ended": measured.jobs,
                "predictions": self.predictions,
                "flagged_tasks": measured.flagged
                + sum(_flagged(j) for j in self.jobs.values() if j.ended_at is None),
                "commands": sum(self.commands_by_action.values()),
                "commands_by_action": dict(sorted(self.commands_by_action.items())),
                "dead_letters": self.dead_letters,
                "undecodable": self.undecodable,
            },
            "dead_letters": [asdict(letter) for letter in reversed(self.letters)],
            "ended": {
                "jobs": measured.jobs,
                "mean_jct": measured.mean_jct,
                "copies": measured.copies,
                "copies_won": measured.copies_won,
                "copies_lost": measured.copies_lost,
                "extra_machine_seconds": measured.extra_machine_seconds,
            },
            "jobs": (in_flight + ended)[:max_jobs],
        }

    def job_detail(
        self,
        job_id: str,
        *,
        sort: str = "elapsed",
        descending: bool = True,
        show: str = "all",
        search: str = "",
        limit: int = DEFAULT_LIMIT,
    ) -> dict[str, Any] | None:
        """One job: its row, finished-task quantiles, the task table (filtered by ``show`` and by
        ``search`` in the task or machine name, sorted by ``sort``, first ``limit`` rows) and the
        timeline's lanes (tasks with more than one attempt or flagged, first ``limit`` by start).
        None for a job the view does not keep."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        if sort not in SORT_KEYS:
            raise ValueError(f"unknown sort key {sort!r}; one of {', '.join(SORT_KEYS)}")
        if show not in FILTERS:
            raise ValueError(f"unknown filter {show!r}; one of {', '.join(FILTERS)}")
        limit = max(0, limit)
        now = job.now()
        rows = [_task_row(task_id, task, job, now) for task_id, task in job.tasks.items() if task.observed]
        finished = [r["elapsed"] for r in rows if r["status"] == "finished" and r["elapsed"] is not None]
        matched = [r for r in rows if _shows(r, show) and _matches(r, search)]
        matched.sort(key=lambda r: r["task"])  # ties keep the task order, in either direction
        present = [r for r in matched if r[sort] is not None]
        present.sort(key=lambda r: r[sort], reverse=descending)
        ordered = present + [r for r in matched if r[sort] is None]  # no value: last either way
        lanes = [r for r in rows if r["attempts"] > 1 or r["flagged"]]
        lanes.sort(key=lambda r: (math.inf if r["start"] is None else r["start"], r["task"]))
        return {
            "job": _job_row(job_id, job),
            "now": now,
            "quantiles": _quantiles(finished),
            "table": {
                "sort": sort,
                "descending": descending,
                "show": show,
                "search": search,
                "total": len(rows),
                "matched": len(matched),
                "rows": [{k: v for k, v in r.items() if k != "runs"} for r in ordered[:limit]],
            },
            "commands": [
                asdict(d)
                for d in sorted(job.command_log, key=lambda d: (d.checkpoint_time, d.task), reverse=True)[
                    :limit
                ]
            ],
            "timeline": {
                "lanes": len(lanes),
                "shown": [
                    {"task": r["task"], "flagged_at": r["flagged_at"], "runs": r["runs"]}
                    for r in lanes[:limit]
                ],
            },
        }


UNKNOWN_JOB = re.compile(r"event for unknown job (?P<job>'.*'|\".*\"): no job_event 'started'")
"""The reason the agent letters the records of a job that never started (`pipeline.handler`)."""


def _never_started(letter: DeadLetter) -> str | None:
    """The job whose records ``letter`` says never started (the agent's reason), else None."""
    found = UNKNOWN_JOB.search(letter.error)
    if found is None:
        return None
    try:
        job_id = ast.literal_eval(found["job"])
    except (ValueError, SyntaxError):
        return None
    return job_id if isinstance(job_id, str) else None


def _job_status(job: _Job) -> str:
    """running, ended, abandoned (closed by the agent: it stopped reporting), or waiting (task
    reports and no start yet)."""
    if job.ended_at is not None:
        return "ended" if job.abandoned is None else "abandoned"
    return "running" if job.started_at is not None else "waiting"


def _on_task(job: _Job, event: TaskCheckpoint) -> None:
    task = job.task(event.task_id)
    task.machine = event.machine_id
    seen = task.observed.setdefault(event.attempt, _Observed())
    if event.start_time is not None:
        seen.start = event.start_time
    if event.status == "finished":
        seen.end, seen.status = event.checkpoint_time, "finished"
        if task.finish is None:
            task.finish = (event.checkpoint_time, event.attempt)
        job.running.discard(event.task_id)
    elif event.status in ("killed", "failed"):
        seen.end, seen.status = event.checkpoint_time, event.status
        job.running.discard(event.task_id)
    else:
        if event.checkpoint_time > job.last_checkpoint:
            job.last_checkpoint = event.checkpoint_time
            job.running = set()
        if event.checkpoint_time == job.last_checkpoint and task.finish is None:
            job.running.add(event.task_id)


def task_runs(task: _Task) -> tuple[list[Run], int | None]:
    """A task's attempts from its events and commands, and its copy's attempt (None: never copied).

    A copy (``duplicate`` on attempt a at t) is attempt a + 1 starting at t, unless the task had
    already finished by t or had a copy already (the cluster ignores such a command). ``relaunch``
    ends attempt a at t and starts a + 1; ``kill`` ends the attempt it names. A race's loser that
    no kill stopped is ``lost``, its end unknown."""
    runs: dict[int, Run] = {
        a: Run(a, "original" if a == 0 else "relaunch", o.start, o.end, o.status)
        for a, o in task.observed.items()
    }
    copy: int | None = None
    order = {"relaunch": 0, "duplicate": 0, "kill": 1}
    for t, action, named in sorted(task.commands, key=lambda c: (c[0], order.get(c[1], 2))):
        attempt = named if named is not None else max((a for a in runs if a != copy), default=0)
        done = task.finish is not None and task.finish[0] <= t
        if action == "duplicate" and copy is None and not done:
            copy = attempt + 1
            run = runs.setdefault(copy, Run(copy, "copy", t, None, "running"))
            run.kind = "copy"
            if run.start is None:
                run.start = t
        elif action == "relaunch" and not done:
            replaced = runs.setdefault(attempt, Run(attempt, "original", None, None, "running"))
            if replaced.end is None:
                replaced.end, replaced.outcome, replaced.killed_at = t, "replaced", t
            run = runs.setdefault(attempt + 1, Run(attempt + 1, "relaunch", t, None, "running"))
            if run.start is None:
                run.start = t
        elif action == "kill" and attempt in runs:
            run = runs[attempt]
            if run.outcome not in ("finished", "replaced"):
                run.killed_at = t if run.killed_at is None else min(run.killed_at, t)
                run.end, run.outcome = run.killed_at, "killed"
    if copy is not None and task.finish is not None:
        for run in runs.values():
            if run.outcome == "running" and run.attempt in (copy, copy - 1):
                run.outcome = "lost"
    return [runs[a] for a in sorted(runs)], copy


def _copy_result(task: _Task, copy: int | None) -> str | None:
    if copy is None:
        return None
    if task.finish is None:
        return "racing"
    return "won" if task.finish[1] == copy else "lost"


def _status(task: _Task, runs: list[Run], job: _Job) -> str:
    if task.finish is not None:
        return "finished"
    latest = runs[-1] if runs else None
    if latest is not None and latest.outcome in ("killed", "failed"):
        return "killed"
    return "running" if job.ended_at is None else "unfinished"


def _task_row(task_id: str, task: _Task, job: _Job, now: float | None) -> dict[str, Any]:
    runs, copy = task_runs(task)
    starts = [r.start for r in runs if r.start is not None]
    start = min(starts) if starts else None
    status = _status(task, runs, job)
    end = task.finish[0] if task.finish is not None else None
    if end is None and status == "killed":
        end = max((r.end for r in runs if r.end is not None), default=None)
    until = end if end is not None else now
    predicted, probability = (None, None) if task.prediction is None else task.prediction[1:]
    copy_result = _copy_result(task, copy)
    return {
        "task": task_id,
        "attempts": len(runs),
        "start": start,
        "elapsed": None if start is None or until is None else until - start,
        "predicted": predicted,
        "probability": probability,
        "flagged": task.flagged_at is not None,
        "flagged_at": task.flagged_at,
        "machine": task.machine,
        "status": status,
        "copy": copy_result,
        "why": _why(task, copy_result),
        "runs": [asdict(r) for r in runs],
    }


def _why(task: _Task, copy: str | None) -> str | None:
    """Why a flagged task has no copy (the mitigator's latest note), if it said."""
    if task.flagged_at is None or copy is not None or task.note is None:
        return None
    return task.note[1]


def _shows(row: dict[str, Any], show: str) -> bool:
    if show == "all":
        return True
    if show == "flagged":
        return bool(row["flagged"])
    if show == "copied":
        return row["copy"] is not None
    return bool(row["status"] == show)


def _matches(row: dict[str, Any], search: str) -> bool:
    needle = search.strip().lower()
    return not needle or needle in row["task"].lower() or needle in row["machine"].lower()


def _quantiles(values: list[float]) -> dict[str, float | int | None]:
    """p50, p90, p99 (numpy's linear interpolation) and max of ``values``, and how many there are."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = (float(v) for v in np.percentile(values, [50, 90, 99]))
    return {"n": len(values), "p50": p50, "p90": p90, "p99": p99, "max": max(values)}


def _flagged(job: _Job) -> int:
    return sum(1 for t in job.tasks.values() if t.flagged_at is not None)


def job_figures(job: _Job) -> Figures:
    """The job's measured figures (a run with no known end is counted up to the job's latest instant)."""
    if job.figures is None:
        job.figures = _measure(job)
    return job.figures


def _measure(job: _Job) -> Figures:
    now = job.now()
    ends = [t.finish[0] for t in job.tasks.values() if t.finish is not None]
    copies = won = 0
    extra = 0.0
    for task in job.tasks.values():
        runs, copy = task_runs(task)
        if copy is not None:
            copies += 1
            won += task.finish is not None and task.finish[1] == copy
        for run in runs:
            end = run.end if run.end is not None else now
            if run.attempt > 0 and run.start is not None and end is not None:
                extra += max(0.0, end - run.start)
    jct = max(ends) - job.started_at if ends and job.started_at is not None else None
    return Figures(
        jobs=1,
        jct_sum=0.0 if jct is None else jct,
        jct_jobs=0 if jct is None else 1,
        copies=copies,
        copies_won=won,
        extra_machine_seconds=extra,
        flagged=_flagged(job),
    )


def _start_key(row: dict[str, Any]) -> tuple[float, str]:
    start = row["started_at"]
    return (math.inf if start is None else start, row["job_id"])


def _job_row(job_id: str, job: _Job) -> dict[str, Any]:
    figures = job_figures(job)
    now = job.now()
    return {
        "job_id": job_id,
        "status": _job_status(job),
        "abandoned": job.abandoned,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "last_checkpoint": job.last_checkpoint if math.isfinite(job.last_checkpoint) else None,
        "checkpoints_evaluated": job.checkpoints,
        "finished": sum(1 for t in job.tasks.values() if t.finish is not None),
        "expected": job.expected_tasks,
        "running": 0 if job.ended_at is not None else len(job.running),
        "flagged": figures.flagged,
        "commands": sum(job.commands_by_action.values()),
        "commands_by_action": dict(sorted(job.commands_by_action.items())),
        "copies": figures.copies,
        "copies_won": figures.copies_won,
        "copies_lost": figures.copies_lost,
        "extra_machine_seconds": figures.extra_machine_seconds,
        "jct": figures.mean_jct if job.ended_at is not None else None,
        "elapsed": None if now is None or job.started_at is None else now - job.started_at,
    }
