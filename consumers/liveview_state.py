"""The live view's pure core: a fold from decoded pipeline events to a JSON-ready summary.

`LiveViewState.apply` keeps, per job, its tasks' state, predictions and commands; `summary` renders
what the page shows. No Kafka here. The completion time saved is an estimate from the stream alone,
for ended jobs: a replaced task (relaunched, or its copy won) is taken to have ended at its original
attempt's predicted end (the latest prediction on it, flagged or not: checkpoint time - elapsed +
``adjusted_latency``), every other task at its observed finish; the saving is the latest of those
ends minus the latest observed finish, and can be negative. A job whose replaced task has no
predicted latency gets no estimate. ``straggler replay``'s report measures the true saving; the page:
README.md ("Live view").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    Event,
    JobEvent,
    Prediction,
    RelaunchCommand,
    TaskCheckpoint,
)

MITIGATIONS = ("relaunch", "duplicate")
"""Actions that start another attempt of a task (a ``kill`` only ends a race's loser)."""

SAVING_NOTE = (
    "Estimated completion time saved: for each ended job, the latest end its tasks would have had "
    "without the commands (a replaced attempt's end as the model last predicted it; every other "
    "task's observed end) minus its latest observed end. An estimate from the "
    "model's latency predictions, not a measurement: straggler replay's report measures it against "
    "the trace."
)


@dataclass
class _Job:
    """What the view keeps per job."""

    started_at: float | None = None
    expected_tasks: int | None = None
    ended_at: float | None = None
    finished: dict[str, tuple[float, int]] = field(default_factory=dict)
    """task -> (end time, attempt that finished)."""
    last_checkpoint: float = -math.inf
    running: set[str] = field(default_factory=set)
    """Tasks reported running at ``last_checkpoint``."""
    flagged: dict[str, float] = field(default_factory=dict)
    """task -> first checkpoint time it was predicted to straggle."""
    predicted_end: dict[tuple[str, int], tuple[float, float | None]] = field(default_factory=dict)
    """(task, attempt) -> (checkpoint time, predicted end or None) of the latest verdict on it: one
    entry per attempt, so memory stays proportional to the tasks, not to tasks x checkpoints."""
    commands: dict[str, RelaunchCommand] = field(default_factory=dict)
    """By command id (a redelivered command is counted once), in arrival order."""
    checkpoints: int = 0
    """Checkpoints the agent finished evaluating (``checkpoint_evaluated`` markers)."""


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
    retired_saving: float = 0.0
    retired_estimated: int = 0

    def apply_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: Event) -> None:
        """Fold one event in; events of any type and topic are accepted, unknown ones ignored."""
        if isinstance(event, DeadLetter):
            self.dead_letters += 1
            return
        job_id = getattr(event, "job_id", None)
        if job_id is None or job_id in self.retired:
            return
        job = self.jobs.setdefault(job_id, _Job())
        if isinstance(event, JobEvent):
            if event.event == "started":
                job.started_at = event.time
                job.expected_tasks = event.expected_tasks
            else:
                job.ended_at = event.time
                self._retire()
        elif isinstance(event, TaskCheckpoint):
            self._on_task(job, event)
        elif isinstance(event, Prediction):
            self.predictions += 1
            if event.is_straggler:
                job.flagged.setdefault(event.task_id, event.checkpoint_time)
            key = (event.task_id, event.attempt or 0)  # version 1 names no attempt: the first
            known = job.predicted_end.get(key)
            if known is None or event.checkpoint_time >= known[0]:
                job.predicted_end[key] = (event.checkpoint_time, _predicted_end(event))
        elif isinstance(event, RelaunchCommand):
            if event.command_id not in job.commands:
                job.commands[event.command_id] = event
                self.commands_by_action[event.action] = self.commands_by_action.get(event.action, 0) + 1
        elif isinstance(event, CheckpointEvaluated):
            job.checkpoints += 1
        elif isinstance(event, CheckpointBoundary):
            job.last_checkpoint = max(job.last_checkpoint, event.checkpoint_time)

    @staticmethod
    def _on_task(job: _Job, event: TaskCheckpoint) -> None:
        if event.status == "finished":
            if event.task_id not in job.finished:
                job.finished[event.task_id] = (event.checkpoint_time, event.attempt)
            job.running.discard(event.task_id)
        elif event.status == "running":
            if event.checkpoint_time > job.last_checkpoint:
                job.last_checkpoint = event.checkpoint_time
                job.running = set()
            if event.checkpoint_time == job.last_checkpoint and event.task_id not in job.finished:
                job.running.add(event.task_id)

    def _retire(self) -> None:
        """Drop the oldest ended jobs beyond ``keep_ended``, keeping their saving in the totals."""
        ended = sorted((j.ended_at, job_id) for job_id, j in self.jobs.items() if j.ended_at is not None)
        for _, job_id in ended[: max(0, len(ended) - self.keep_ended)]:
            saving = estimated_saving(self.jobs.pop(job_id))
            self.retired.add(job_id)
            if saving is not None:
                self.retired_saving += saving["seconds"]
                self.retired_estimated += 1

    def summary(self, max_jobs: int = 100) -> dict[str, Any]:
        """What the page renders: totals, then jobs in flight (oldest first) and ended ones (latest first)."""
        rows = []
        saved, estimated = self.retired_saving, self.retired_estimated
        for job_id, job in self.jobs.items():
            row = _job_row(job_id, job)
            rows.append(row)
            if row["saving"] is not None:
                saved += row["saving"]["seconds"]
                estimated += 1
        in_flight = sorted((r for r in rows if r["ended_at"] is None), key=_start_key)
        ended = sorted((r for r in rows if r["ended_at"] is not None), key=lambda r: -r["ended_at"])
        return {
            "totals": {
                "jobs_in_flight": len(in_flight),
                "jobs_ended": len(ended) + len(self.retired),
                "predictions": self.predictions,
                "flagged_tasks": sum(len(j.flagged) for j in self.jobs.values()),
                "commands": sum(self.commands_by_action.values()),
                "commands_by_action": dict(sorted(self.commands_by_action.items())),
                "dead_letters": self.dead_letters,
                "undecodable": self.undecodable,
                "saved_seconds": saved,
                "jobs_with_estimate": estimated,
            },
            "saving_note": SAVING_NOTE,
            "jobs": (in_flight + ended)[:max_jobs],
        }


def _start_key(row: dict[str, Any]) -> tuple[float, str]:
    start = row["started_at"]
    return (math.inf if start is None else start, row["job_id"])


def _predicted_end(p: Prediction) -> float | None:
    """When the judged attempt would end as predicted: its start (checkpoint - elapsed) + latency."""
    if p.adjusted_latency is None or not math.isfinite(p.adjusted_latency):
        return None
    return p.checkpoint_time - p.elapsed + p.adjusted_latency


def _job_row(job_id: str, job: _Job) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "status": "ended" if job.ended_at is not None else "running",
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "last_checkpoint": job.last_checkpoint if math.isfinite(job.last_checkpoint) else None,
        "checkpoints_evaluated": job.checkpoints,
        "finished": len(job.finished),
        "expected": job.expected_tasks,
        "running": 0 if job.ended_at is not None else len(job.running),
        "flagged": sorted(job.flagged, key=lambda task: (job.flagged[task], task)),
        "commands": [
            {
                "action": c.action,
                "task_id": c.task_id,
                "attempt": c.attempt,
                "checkpoint_time": c.checkpoint_time,
                "reason": c.reason,
            }
            for c in job.commands.values()
        ],
        "saving": estimated_saving(job),
    }


def estimated_saving(job: _Job) -> dict[str, float] | None:
    """The module docstring's estimate for an ended job; None while it runs or when it has no estimate."""
    if job.ended_at is None or job.started_at is None or not job.finished:
        return None
    observed_end = max(end for end, _ in job.finished.values())
    first: dict[str, RelaunchCommand] = {}
    for command in job.commands.values():
        if command.action in MITIGATIONS:
            known = first.get(command.task_id)
            if known is None or command.checkpoint_time < known.checkpoint_time:
                first[command.task_id] = command
    replaced: dict[str, float] = {}
    for task, command in first.items():
        original = command.attempt if command.attempt is not None else 0  # version 1: no attempt named
        finish = job.finished.get(task)
        if finish is not None and finish[1] == original:
            continue  # the original attempt won its race: it ended as it would have anyway
        _, predicted = job.predicted_end.get((task, original), (0.0, None))
        if predicted is None:
            return None
        replaced[task] = predicted
    kept = [end for task, (end, _) in job.finished.items() if task not in replaced]
    without = max([*kept, *replaced.values()])
    seconds = without - observed_end
    jct_without = without - job.started_at
    return {
        "seconds": seconds,
        "share": seconds / jct_without if jct_without > 0 else 0.0,
        "jct_observed": observed_end - job.started_at,
        "jct_without_estimate": jct_without,
    }
