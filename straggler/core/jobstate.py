"""What one running job has shown so far: finished tasks with latencies, running tasks with features.

The offline evaluator and the streaming agent feed the same `JobState` with the same calls, one
task event at a time, so they cannot disagree about what a job has revealed. Updates are
idempotent and safe against reordering: a duplicate changes nothing, a late ``running`` event never
resurrects a task that has finished, and an older checkpoint never overwrites a newer one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple, Protocol

import numpy as np

from straggler.core.arrays import BoolArray, FloatArray


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


class FinishedView(NamedTuple):
    """The finished tasks, ordered by (finish time, task id)."""

    ids: tuple[str, ...]
    X: FloatArray
    latency: FloatArray
    finished_at: FloatArray
    """When each finished (its finish event's time)."""


class RunningView(NamedTuple):
    """The running tasks at one instant, ordered by (start, task id), flagged ones included."""

    ids: list[str]
    X: FloatArray
    start: FloatArray
    elapsed: FloatArray
    """At the instant asked for, floored at 0."""
    flagged: BoolArray
    attempt: list[int]


@dataclass
class JobState:
    """The finished and running sets of one job, and which tasks were already flagged."""

    job_id: str
    n_features: int
    expected_tasks: int = 0
    tasks: dict[str, TaskRecord] = field(default_factory=dict)
    flagged: dict[str, float] = field(default_factory=dict)
    """Task id -> checkpoint time at which it was predicted to straggle (never evaluated again)."""
    _finished_view: FinishedView | None = field(default=None, init=False, repr=False, compare=False)
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
        self, task_id: str, features: FloatArray, start: float | None, observed_at: float, attempt: int = 0
    ) -> bool:
        """Record a running task's latest features. Returns False when the event was stale.

        ``start`` None (a producer that does not know it): the start already recorded for the same
        running attempt, else ``observed_at``, so the attempt's elapsed time still grows."""
        return self._running(task_id, self._check(features), start, observed_at, attempt)

    def _running(
        self, task_id: str, x: FloatArray, start: float | None, observed_at: float, attempt: int
    ) -> bool:
        record = self.tasks.get(task_id)
        if start is None:
            same_run = (
                record is not None and record.status == TaskStatus.RUNNING and record.attempt == attempt
            )
            start = record.start if same_run and record is not None else observed_at
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
        see there when it has none), `observe_finished` or `observe_gone` by its status; features are read by
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
                applied = self._running(o.task_id, x.copy(), o.start_time, o.checkpoint_time, o.attempt)
            elif status == "finished":
                assert o.latency is not None  # the schema requires it
                applied = self._finished_task(o.task_id, x.copy(), o.latency, o.checkpoint_time, o.attempt)
            else:
                applied = self.observe_gone(o.task_id, o.checkpoint_time, o.attempt)
            if applied:
                changed.append(o.task_id)
        return changed

    def latest_report(self) -> float | None:
        """The time of the newest observation applied (None: none yet)."""
        return max((record.observed_at for record in self.tasks.values()), default=None)

    def flag(self, task_id: str, at: float) -> None:
        self.flagged.setdefault(task_id, at)

    # -- views for the models ---------------------------------------------------------------------
    def finished(self) -> tuple[list[str], FloatArray, FloatArray]:
        """(ids, features, latencies) of the finished tasks, ordered by (finish time, task id).

        A canonical order, not insertion order: a state rebuilt from a changelog must train models
        on exactly the same arrays as the state it replaces. The arrays are shared between calls until
        the finished set changes: callers must not modify them.
        """
        view = self.finished_view()
        return list(view.ids), view.X, view.latency

    def finished_view(self) -> FinishedView:
        """`finished` with the finish times, as cached (shared between calls: do not modify)."""
        view = self._finished_view
        if view is not None and self._finished_since_view:
            view = self._finished_view = self._extended(view, self._finished_since_view)
            self._finished_since_view = []
        if view is None:
            ids = sorted(
                (t for t, r in self.tasks.items() if r.status == TaskStatus.FINISHED),
                key=lambda t: (self.tasks[t].observed_at, t),
            )
            view = self._finished_view = self._finished_rows(ids)
            self._finished_since_view = []
        return view

    def _extended(self, view: FinishedView, added: list[str]) -> FinishedView | None:
        """``view`` with the ``added`` finishes appended, or None if one of them sorts before its end."""
        tasks = self.tasks
        order = sorted(added, key=lambda t: (tasks[t].observed_at, t))
        ids = view.ids
        if ids and (tasks[order[0]].observed_at, order[0]) < (tasks[ids[-1]].observed_at, ids[-1]):
            return None
        more = self._finished_rows(order)
        return FinishedView(
            ids + more.ids,
            *(_frozen(np.concatenate([old, new])) for old, new in zip(view[1:], more[1:], strict=True)),
        )

    def _finished_rows(self, ids: list[str]) -> FinishedView:
        """The view of the finished tasks ``ids``, in that order."""
        records = [self.tasks[t] for t in ids]
        X = np.array([r.features for r in records]).reshape(len(ids), self.n_features)
        latency = np.array([r.latency for r in records], dtype=np.float64)
        finished_at = np.array([r.observed_at for r in records], dtype=np.float64)
        return FinishedView(tuple(ids), _frozen(X), _frozen(latency), _frozen(finished_at))

    def running(self, at: float, *, unflagged_only: bool = True) -> tuple[list[str], FloatArray, FloatArray]:
        """(ids, features, elapsed at ``at``) of the running tasks, ordered by (start, task id)."""
        view = self.running_view(at)
        if not unflagged_only:
            return view.ids, view.X, view.elapsed
        keep = ~view.flagged
        ids = [t for t, flagged in zip(view.ids, view.flagged.tolist(), strict=True) if not flagged]
        return ids, view.X[keep], view.elapsed[keep]

    def running_view(self, at: float) -> RunningView:
        """Every running task, flagged or not, ordered by (start, task id), in one pass."""
        flagged = self.flagged
        running = TaskStatus.RUNNING
        rows = [(r.start, t, r) for t, r in self.tasks.items() if r.status == running]
        rows.sort(key=_start_then_id)
        X = np.array([row[2].features for row in rows]).reshape(len(rows), self.n_features)
        start = np.array([row[0] for row in rows], dtype=np.float64)
        return RunningView(
            ids=[row[1] for row in rows],
            X=X,
            start=start,
            elapsed=np.maximum(at - start, 0.0),
            flagged=np.array([row[1] in flagged for row in rows], dtype=bool),
            attempt=[row[2].attempt for row in rows],
        )

    def counts(self) -> dict[str, int]:
        out = {s.name.lower(): 0 for s in TaskStatus}
        for r in self.tasks.values():
            out[r.status.name.lower()] += 1
        return out

    @property
    def n_finished(self) -> int:
        return self._n_finished


def _start_then_id(row: tuple[float, str, TaskRecord]) -> tuple[float, str]:
    return row[0], row[1]


def _frozen(array: FloatArray) -> FloatArray:
    """``array``, read-only: views are shared between callers."""
    array.setflags(write=False)
    return array
