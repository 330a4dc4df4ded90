"""What one running job has shown so far: finished tasks with latencies, running tasks with features.

The offline evaluator and the streaming agent feed the same `JobState` with the same calls, one
task event at a time, so they cannot disagree about what a job has revealed. Updates are
idempotent and safe against reordering: a duplicate changes nothing, a late ``running`` event never
resurrects a task that has finished, and an older checkpoint never overwrites a newer one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

import numpy as np

from straggler.core.arrays import FloatArray


class TaskStatus(IntEnum):
    RUNNING = 0
    FINISHED = 1
    GONE = 2
    """Ended without a latency (failed or killed); occupies no machine and enters no model."""


class TaskObservation(Protocol):
    """What `JobState.observe_all` reads of a task observation (a ``task_checkpoint``, or a batch's)."""

    @property
    def task_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def checkpoint_time(self) -> float: ...
    @property
    def status(self) -> str: ...
    @property
    def features(self) -> Mapping[str, float]: ...
    @property
    def latency(self) -> float | None: ...
    @property
    def start_time(self) -> float | None: ...


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
    """`finished()` as last built (every checkpoint asks for it, and most checkpoints of a large job
    add few finishes, mostly later than every earlier one: the view is then extended, not rebuilt)."""
    _finished_since_view: list[str] = field(default_factory=list, init=False, repr=False, compare=False)
    """Tasks that entered the finished set since the view was built (none of them was in it)."""
    _n_finished: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.forget_views()

    def forget_views(self) -> None:
        """Call after writing ``tasks`` directly (a rebuild from a changelog)."""
        self._finished_view = None
        self._finished_since_view.clear()
        self._n_finished = sum(r.status == TaskStatus.FINISHED for r in self.tasks.values())

    def _check(self, features: FloatArray) -> FloatArray:
        x = np.asarray(features, dtype=np.float64).reshape(-1)
        if len(x) != self.n_features:
            raise ValueError(f"job {self.job_id}: expected {self.n_features} features, got {len(x)}")
        return x

    def observe_running(
        self, task_id: str, features: FloatArray, start: float, observed_at: float, attempt: int = 0
    ) -> bool:
        """Record a running task's latest features. Returns False when the event was stale."""
        return self._running(task_id, self._check(features), start, observed_at, attempt)

    def _running(self, task_id: str, x: FloatArray, start: float, observed_at: float, attempt: int) -> bool:
        record = self.tasks.get(task_id)
        if record is not None:
            if attempt < record.attempt:
                return False
            same_attempt = attempt == record.attempt
            if same_attempt and (record.status != TaskStatus.RUNNING or observed_at < record.observed_at):
                return False
            if record.status == TaskStatus.FINISHED:  # a new attempt of a finished task runs again
                self._finished_view = None
                self._n_finished -= 1
        self.tasks[task_id] = TaskRecord(TaskStatus.RUNNING, x, start, observed_at, attempt)
        return True

    def observe_finished(
        self, task_id: str, features: FloatArray, latency: float, observed_at: float, attempt: int = 0
    ) -> bool:
        """Move a task to the finished set with its latency. Returns False for a duplicate."""
        return self._finished_task(task_id, self._check(features), latency, observed_at, attempt)

    def _finished_task(
        self, task_id: str, x: FloatArray, latency: float, observed_at: float, attempt: int
    ) -> bool:
        if not np.isfinite(latency) or latency < 0:
            raise ValueError(f"job {self.job_id} task {task_id}: latency must be finite and >= 0")
        record = self.tasks.get(task_id)
        if record is not None and (
            attempt < record.attempt or (attempt == record.attempt and record.status == TaskStatus.FINISHED)
        ):
            return False
        start = observed_at - latency
        self.tasks[task_id] = TaskRecord(TaskStatus.FINISHED, x, start, observed_at, attempt, float(latency))
        if record is not None and record.status == TaskStatus.FINISHED:  # an older attempt's finish
            self._finished_view = None
        else:
            self._n_finished += 1
            if self._finished_view is not None:
                self._finished_since_view.append(task_id)
        return True

    def observe_gone(self, task_id: str, observed_at: float, attempt: int = 0) -> bool:
        """A task's run ended without a latency (failed, killed, lost)."""
        record = self.tasks.get(task_id)
        if record is None or attempt < record.attempt or record.status != TaskStatus.RUNNING:
            return False
        record.status = TaskStatus.GONE
        record.observed_at = observed_at
        return True

    def observe_all(self, observations: Sequence[TaskObservation], feature_names: Sequence[str]) -> list[str]:
        """Feed task observations in order, each as `observe_running` (started at its ``start_time``,
        else its checkpoint), `observe_finished` or `observe_gone` by its status; features are read by
        name, one the observation lacks is unknown (NaN). Returns the ids of those that changed the state.

        One feature matrix for all of them, not an array per observation: the agent's path for a batch.
        """
        if len(feature_names) != self.n_features:
            got = len(feature_names)
            raise ValueError(f"job {self.job_id}: expected {self.n_features} features, got {got}")
        rows = np.array(  # None (a missing name) becomes NaN
            [list(map(o.features.get, feature_names)) for o in observations], dtype=np.float64
        ).reshape(len(observations), self.n_features)
        changed = []
        for o, x in zip(observations, rows, strict=True):
            status = o.status
            if status == "running":
                start = o.start_time if o.start_time is not None else o.checkpoint_time
                applied = self._running(o.task_id, x.copy(), start, o.checkpoint_time, o.attempt)
            elif status == "finished":
                assert o.latency is not None  # the schema requires it
                applied = self._finished_task(o.task_id, x.copy(), o.latency, o.checkpoint_time, o.attempt)
            else:
                applied = self.observe_gone(o.task_id, o.checkpoint_time, o.attempt)
            if applied:
                changed.append(o.task_id)
        return changed

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
        view = self._finished_view
        if view is not None and self._finished_since_view:
            view = self._finished_view = self._extended(view, self._finished_since_view)
            self._finished_since_view = []
        if view is None:
            ids = sorted(
                (t for t, r in self.tasks.items() if r.status == TaskStatus.FINISHED),
                key=lambda t: (self.tasks[t].observed_at, t),
            )
            X, y = self._arrays(ids, lambda r: r.latency)
            view = self._finished_view = (ids, _frozen(X), _frozen(y))
            self._finished_since_view = []
        return view

    def _extended(
        self, view: tuple[list[str], FloatArray, FloatArray], added: list[str]
    ) -> tuple[list[str], FloatArray, FloatArray] | None:
        """``view`` with the ``added`` finishes appended, or None if one of them sorts before its end."""
        tasks = self.tasks
        order = sorted(added, key=lambda t: (tasks[t].observed_at, t))
        ids = view[0]
        if ids and (tasks[order[0]].observed_at, order[0]) < (tasks[ids[-1]].observed_at, ids[-1]):
            return None
        X, y = self._arrays(order, lambda r: r.latency)
        return ids + order, _frozen(np.concatenate([view[1], X])), _frozen(np.concatenate([view[2], y]))

    def _arrays(self, ids: list[str], value: Callable[[TaskRecord], float]) -> tuple[FloatArray, FloatArray]:
        """(features, value) of ``ids``, one row each."""
        records = [self.tasks[t] for t in ids]
        X = np.array([r.features for r in records]).reshape(len(ids), self.n_features)
        return X, np.array([value(r) for r in records], dtype=np.float64)

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
        return self._n_finished


def _frozen(array: FloatArray) -> FloatArray:
    """``array``, read-only: views are shared between callers."""
    array.setflags(write=False)
    return array
