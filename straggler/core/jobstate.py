"""What one running job has shown so far: finished tasks with latencies, running tasks with features.

The offline evaluator and the streaming agent feed the same `JobState` with the same calls, one
task event at a time, so they cannot disagree about what a job has revealed. Updates are
idempotent and safe against reordering: a duplicate changes nothing, a late ``running`` event never
resurrects a task that has finished, and an older checkpoint never overwrites a newer one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


class TaskStatus(IntEnum):
    RUNNING = 0
    FINISHED = 1
    GONE = 2
    """Ended without a latency (failed or killed); occupies no machine and enters no model."""


@dataclass
class TaskRecord:
    """One task's latest known state (per-task, so a changelog can store one row per task)."""

    status: TaskStatus
    features: FloatArray
    start: float
    observed_at: float
    attempt: int = 0
    latency: float = float("nan")


@dataclass
class JobState:
    """The finished and running sets of one job, and which tasks were already flagged."""

    job_id: str
    n_features: int
    expected_tasks: int = 0
    tasks: dict[str, TaskRecord] = field(default_factory=dict)
    flagged: dict[str, float] = field(default_factory=dict)
    """Task id -> checkpoint time at which it was predicted to straggle (never evaluated again)."""
    _finished_view: tuple[list[str], FloatArray, FloatArray] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """`finished()` as last built; dropped whenever the finished set changes (every checkpoint asks
    for it, and most checkpoints of a large job add few finishes)."""

    def forget_views(self) -> None:
        """Call after writing ``tasks`` directly (a rebuild from a changelog)."""
        self._finished_view = None

    def _check(self, features: FloatArray) -> FloatArray:
        x = np.asarray(features, dtype=np.float64).reshape(-1)
        if len(x) != self.n_features:
            raise ValueError(f"job {self.job_id}: expected {self.n_features} features, got {len(x)}")
        return x

    def observe_running(
        self, task_id: str, features: FloatArray, start: float, observed_at: float, attempt: int = 0
    ) -> bool:
        """Record a running task's latest features. Returns False when the event was stale."""
        record = self.tasks.get(task_id)
        if record is not None:
            if attempt < record.attempt:
                return False
            same_attempt = attempt == record.attempt
            if same_attempt and (record.status != TaskStatus.RUNNING or observed_at < record.observed_at):
                return False
            if record.status == TaskStatus.FINISHED:
                self._finished_view = None  # a new attempt of a finished task runs again
        self.tasks[task_id] = TaskRecord(
            TaskStatus.RUNNING, self._check(features), start, observed_at, attempt
        )
        return True

    def observe_finished(
        self, task_id: str, features: FloatArray, latency: float, observed_at: float, attempt: int = 0
    ) -> bool:
        """Move a task to the finished set with its latency. Returns False for a duplicate."""
        if not np.isfinite(latency) or latency < 0:
            raise ValueError(f"job {self.job_id} task {task_id}: latency must be finite and >= 0")
        record = self.tasks.get(task_id)
        if record is not None and (
            attempt < record.attempt or (attempt == record.attempt and record.status == TaskStatus.FINISHED)
        ):
            return False
        start = observed_at - latency
        self.tasks[task_id] = TaskRecord(
            TaskStatus.FINISHED, self._check(features), start, observed_at, attempt, float(latency)
        )
        self._finished_view = None
        return True

    def observe_gone(self, task_id: str, observed_at: float, attempt: int = 0) -> bool:
        """A task's run ended without a latency (failed, killed, lost)."""
        record = self.tasks.get(task_id)
        if record is None or attempt < record.attempt or record.status != TaskStatus.RUNNING:
            return False
        record.status = TaskStatus.GONE
        record.observed_at = observed_at
        return True

    def flag(self, task_id: str, at: float) -> None:
        self.flagged.setdefault(task_id, at)

    # -- views for the models ---------------------------------------------------------------------
    def finished(self) -> tuple[list[str], FloatArray, FloatArray]:
        """(ids, features, latencies) of the finished tasks, ordered by (finish time, task id).

        A canonical order, not insertion order: a state rebuilt from a changelog must train models
        on exactly the same arrays as the state it replaces. The arrays are shared between calls until
        the finished set changes: callers must not modify them.
        """
        ids, X, y = self._finished()
        return list(ids), X, y

    def _finished(self) -> tuple[list[str], FloatArray, FloatArray]:
        """The cached view `finished` returns (its id list not copied)."""
        if self._finished_view is None:
            ids = sorted(
                (t for t, r in self.tasks.items() if r.status == TaskStatus.FINISHED),
                key=lambda t: (self.tasks[t].observed_at, t),
            )
            X = np.array([self.tasks[t].features for t in ids]).reshape(len(ids), self.n_features)
            y = np.array([self.tasks[t].latency for t in ids], dtype=np.float64)
            X.setflags(write=False)
            y.setflags(write=False)
            self._finished_view = (ids, X, y)
        return self._finished_view

    def running(self, at: float, *, unflagged_only: bool = True) -> tuple[list[str], FloatArray, FloatArray]:
        """(ids, features, elapsed at ``at``) of the running tasks, ordered by (start, task id)."""
        ids = sorted(
            (
                t
                for t, r in self.tasks.items()
                if r.status == TaskStatus.RUNNING and not (unflagged_only and t in self.flagged)
            ),
            key=lambda t: (self.tasks[t].start, t),
        )
        X = np.array([self.tasks[t].features for t in ids]).reshape(len(ids), self.n_features)
        elapsed = np.array([max(at - self.tasks[t].start, 0.0) for t in ids], dtype=np.float64)
        return ids, X, elapsed

    def counts(self) -> dict[str, int]:
        out = {s.name.lower(): 0 for s in TaskStatus}
        for r in self.tasks.values():
            out[r.status.name.lower()] += 1
        return out

    @property
    def n_finished(self) -> int:
        return len(self._finished()[0])
