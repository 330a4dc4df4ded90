"""What an executor of relaunch commands decides, with no cluster and no Kafka: which attempts of a
task are live, whether a command is carried out or skipped (and why), each command id applied once,
who won a race, and the machine time the extra attempts cost.

`ExecutionBook` is told what the cluster says of a task's attempts (`observe`, `attempt_added`,
`attempt_ended`) and which commands were applied (`mark_applied`), and turns each command into a
`Copy`, `Kill` or `Relaunch` to carry out, or a `Skip` with its reason. The Dask executor
(`consumers.dask_executor`) is its shell; the rules are here so they are tested without either.

Attempt numbers follow the command schema: a copy of attempt ``a`` is attempt ``a + 1``, and a
relaunch of ``a`` restarts it as ``a + 1``, so the mitigator's later ``kill`` names the attempt the
executor made. A task that is not copyable (it has side effects) is never copied nor relaunched; a
kill that would stop the task's last live attempt before any attempt finished is refused (the
user's result would be lost). A copy or relaunch decided before the attempt's current run began,
or while it has not begun (the cluster runs it again, its worker having died), is skipped: it was
decided on the run that died, and the new run has not been seen straggling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from schemas import RelaunchCommand

AttemptStatus = Literal["live", "finished", "failed", "killed"]
SkipKind = Literal[
    "applied", "unknown_task", "finished_task", "unknown_attempt", "ended_attempt", "not_copyable",
    "attempt_exists", "last_attempt", "restarted",
]  # fmt: skip
SKIP_KINDS: tuple[SkipKind, ...] = (
    "applied", "unknown_task", "finished_task", "unknown_attempt", "ended_attempt", "not_copyable",
    "attempt_exists", "last_attempt", "restarted",
)  # fmt: skip


@dataclass(frozen=True)
class Copy:
    """Start ``new_attempt``, a copy of ``attempt`` on another worker; both keep running."""

    job_id: str
    task_id: str
    attempt: int
    new_attempt: int


@dataclass(frozen=True)
class Kill:
    """Stop ``attempt`` (the loser of a race)."""

    job_id: str
    task_id: str
    attempt: int


@dataclass(frozen=True)
class Relaunch:
    """Stop ``attempt`` and start the task again as ``new_attempt``."""

    job_id: str
    task_id: str
    attempt: int
    new_attempt: int


@dataclass(frozen=True)
class Skip:
    """Nothing to do: ``kind`` counts it, ``reason`` says it in a log line."""

    kind: SkipKind
    reason: str


Decision = Copy | Kill | Relaunch | Skip


@dataclass
class AttemptRun:
    """One attempt as the executor knows it. ``since``: when the executor started it (None for the
    adapter's first attempt, whose run is not extra machine time)."""

    status: AttemptStatus = "live"
    since: float | None = None
    ended: float | None = None
    run_started: float | None = None
    """When its current run began on the cluster, where known: later than its first start when the
    cluster ran it again (its worker died); `math.inf` while that new run has not begun."""


@dataclass
class TaskAttempts:
    copyable: bool
    attempts: dict[int, AttemptRun] = field(default_factory=dict)
    winner: int | None = None
    """The first attempt that finished."""

    def live(self) -> list[int]:
        return sorted(n for n, run in self.attempts.items() if run.status == "live")


class ExecutionBook:
    """The executor's state: tasks and their attempts, the command ids applied, races and costs."""

    def __init__(self) -> None:
        self._applied: set[str] = set()
        self._tasks: dict[tuple[str, str], TaskAttempts] = {}
        self.extra_machine_seconds = 0.0
        """Run time of every attempt beyond a task's first, from its start until it ended or was killed."""
        self.copies_won = 0
        self.copies_lost = 0

    def is_applied(self, command_id: str) -> bool:
        return command_id in self._applied

    def mark_applied(self, command_id: str) -> None:
        self._applied.add(command_id)

    @property
    def tracked(self) -> int:
        """Tasks the book holds."""
        return len(self._tasks)

    def task(self, job_id: str, task_id: str) -> TaskAttempts | None:
        return self._tasks.get((job_id, task_id))

    def observe(
        self,
        job_id: str,
        task_id: str,
        copyable: bool,
        statuses: dict[int, AttemptStatus],
        at: float,
        run_started: dict[int, float] | None = None,
    ) -> None:
        """What the cluster says of a task's attempts now (attempts not known yet are added), and
        when the running ones began their current run, where it knows."""
        task = self._tasks.setdefault((job_id, task_id), TaskAttempts(copyable))
        task.copyable = copyable
        for number, status in sorted(statuses.items()):
            run = task.attempts.setdefault(number, AttemptRun())
            run.run_started = (run_started or {}).get(number, run.run_started)
            if status != "live":
                self.attempt_ended(job_id, task_id, number, status, at)

    def attempt_added(self, job_id: str, task_id: str, attempt: int, at: float) -> None:
        """The executor started ``attempt`` at ``at`` (a copy or a relaunch)."""
        task = self._tasks[(job_id, task_id)]
        task.attempts.setdefault(attempt, AttemptRun(since=at))

    def attempt_ended(
        self, job_id: str, task_id: str, attempt: int, status: AttemptStatus, at: float
    ) -> None:
        """An attempt finished, failed or was killed at ``at``; the first to finish wins the task."""
        task = self._tasks.get((job_id, task_id))
        run = None if task is None else task.attempts.get(attempt)
        if task is None or run is None or run.status != "live" or status == "live":
            return
        run.status, run.ended = status, at
        if run.since is not None:
            self.extra_machine_seconds += max(at - run.since, 0.0)
        if status == "finished" and task.winner is None:
            task.winner = attempt
            if len(task.attempts) > 1:
                first = min(task.attempts)
                if attempt == first:
                    self.copies_lost += 1
                else:
                    self.copies_won += 1

    def dropped(self, job_id: str, task_id: str, at: float) -> None:
        """The task's record is gone from the cluster: its job ended, and the adapter cancelled the
        attempts still running, so each live one ends, killed, at ``at`` (a later command for it is
        skipped, as for any ended attempt)."""
        task = self._tasks.get((job_id, task_id))
        for attempt in [] if task is None else task.live():
            self.attempt_ended(job_id, task_id, attempt, "killed", at)

    def decide(self, command: RelaunchCommand) -> Decision:
        """What to do about ``command`` (call `observe` first with the task's attempts, if it has any)."""
        job, task_id, action = command.job_id, command.task_id, command.action
        if command.command_id in self._applied:
            return Skip("applied", f"command {command.command_id} was applied already")
        task = self._tasks.get((job, task_id))
        if task is None:
            return Skip("unknown_task", f"no task {task_id!r} of job {job!r} on this cluster")
        live = task.live()
        attempt = command.attempt if command.attempt is not None else (live[-1] if live else None)
        if attempt is None or attempt not in task.attempts:
            return Skip("unknown_attempt", f"task {task_id!r} of job {job!r} has no attempt {attempt}")
        if action == "kill":
            if attempt not in live:
                return Skip("ended_attempt", f"attempt {attempt} of task {task_id!r} has ended already")
            if task.winner is None and live == [attempt]:
                return Skip("last_attempt", f"attempt {attempt} is task {task_id!r}'s last live one")
            return Kill(job, task_id, attempt)
        if task.winner is not None or not live:
            return Skip("finished_task", f"task {task_id!r} of job {job!r} has ended")
        if not task.copyable:
            return Skip("not_copyable", f"task {task_id!r} of job {job!r} is not pure: never run twice")
        if attempt not in live:
            return Skip("ended_attempt", f"attempt {attempt} of task {task_id!r} has ended already")
        started = task.attempts[attempt].run_started
        if started is not None and started > command.checkpoint_time:
            new_run = (
                "has not begun its new run" if math.isinf(started) else f"began a new run at {started:.3f}"
            )
            return Skip(
                "restarted",
                f"attempt {attempt} of task {task_id!r} {new_run}, after the command was decided at "
                f"{command.checkpoint_time:.3f} (its worker died and the cluster runs it again)",
            )
        new_attempt = attempt + 1
        if new_attempt in task.attempts:
            return Skip("attempt_exists", f"task {task_id!r} already has attempt {new_attempt}")
        if action == "duplicate":
            return Copy(job, task_id, attempt, new_attempt)
        return Relaunch(job, task_id, attempt, new_attempt)
