"""What an executor of relaunch commands decides, with no cluster and no Kafka: which attempts of a
task are live, whether a command is carried out or skipped (and why), each command id applied once,
who won a race, and the machine time the extra attempts cost.

Two clusters play the role (`CommandExecutor`): the Dask executor (`consumers.dask_executor`) and
the simulated cluster of trace replays and evaluations (`straggler.simulation`). Both turn a command
into a `Copy`, `Kill` or `Relaunch` to carry out, or a `Skip` with its reason, by the same rules
(`decide`), on what they know of the task's attempts (`TaskAttempts`), and count races and extra
machine time the same way (`RaceTally`). `ExecutionBook` keeps that knowledge for the Dask executor,
which learns it from the cluster piece by piece (`observe`, `attempt_added`, `attempt_ended`); the
simulated cluster reads it off its own state.

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from schemas import RelaunchCommand

AttemptStatus = Literal["live", "finished", "failed", "killed"]
RuleSkipKind = Literal[
    "applied", "unknown_task", "finished_task", "unknown_attempt", "ended_attempt", "not_copyable",
    "attempt_exists", "last_attempt", "restarted",
]  # fmt: skip
SKIP_KINDS: tuple[RuleSkipKind, ...] = (
    "applied", "unknown_task", "finished_task", "unknown_attempt", "ended_attempt", "not_copyable",
    "attempt_exists", "last_attempt", "restarted",
)  # fmt: skip
"""Why any executor skips a command (`decide`)."""
SimulatedSkipKind = Literal["race_undecided", "one_copy", "no_latency"]
"""Why the simulated cluster cannot carry out what the rules allow: it draws a race's outcome when
the copy starts, so neither side can be stopped before the race ends; it runs at most one copy of a
task; a job with no latency recorded gives no time to draw a new run's from."""
SkipKind = RuleSkipKind | SimulatedSkipKind


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
    copy_of: int | None = None
    """The attempt this one races, for a copy (None: a task's first attempt, or a relaunch)."""


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
        self._tally = RaceTally()
        """`total_tally` of the tasks, kept as their attempts end (`attempt_ended`)."""

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

    def attempt_added(
        self, job_id: str, task_id: str, attempt: int, at: float, copy_of: int | None = None
    ) -> None:
        """The executor started ``attempt`` at ``at``: a copy of ``copy_of``, or a relaunch."""
        task = self._tasks[(job_id, task_id)]
        task.attempts.setdefault(attempt, AttemptRun(since=at, copy_of=copy_of))

    def attempt_ended(
        self, job_id: str, task_id: str, attempt: int, status: AttemptStatus, at: float
    ) -> None:
        """An attempt finished, failed or was killed at ``at``; the first to finish wins the task."""
        task = self._tasks.get((job_id, task_id))
        run = None if task is None else task.attempts.get(attempt)
        if task is None or run is None or run.status != "live" or status == "live":
            return
        before = race_tally(task)
        run.status, run.ended = status, at
        if status == "finished" and task.winner is None:
            task.winner = attempt
        self._tally += race_tally(task) - before

    def dropped(self, job_id: str, task_id: str, at: float) -> None:
        """The task's record is gone from the cluster: its job ended, and the adapter cancelled the
        attempts still running, so each live one ends, killed, at ``at`` (a later command for it is
        skipped, as for any ended attempt)."""
        task = self._tasks.get((job_id, task_id))
        for attempt in [] if task is None else task.live():
            self.attempt_ended(job_id, task_id, attempt, "killed", at)

    def decide(self, command: RelaunchCommand) -> Decision:
        """What to do about ``command`` (call `observe` first with the task's attempts, if it has any)."""
        if command.command_id in self._applied:
            return Skip("applied", f"command {command.command_id} was applied already")
        task = self._tasks.get((command.job_id, command.task_id))
        return decide(
            task, command.job_id, command.task_id, command.action, command.attempt, command.checkpoint_time
        )

    def tally(self) -> RaceTally:
        """The races decided and the extra machine time of the attempts the book has seen end."""
        return self._tally


@dataclass(frozen=True)
class RaceTally:
    """What an executor's extra attempts came to: races won by the copy, races won by the original,
    and the run time of every attempt beyond a task's first, from its start until it ended or was
    killed (seconds)."""

    copies_won: int = 0
    copies_lost: int = 0
    extra_machine_seconds: float = 0.0

    def __add__(self, other: RaceTally) -> RaceTally:
        return RaceTally(
            self.copies_won + other.copies_won,
            self.copies_lost + other.copies_lost,
            self.extra_machine_seconds + other.extra_machine_seconds,
        )

    def __sub__(self, other: RaceTally) -> RaceTally:
        return RaceTally(
            self.copies_won - other.copies_won,
            self.copies_lost - other.copies_lost,
            self.extra_machine_seconds - other.extra_machine_seconds,
        )


def race_tally(task: TaskAttempts, until: float | None = None) -> RaceTally:
    """One task's part of a `RaceTally`: its race, once decided (a copy and the attempt it copies,
    the first of them to finish wins), and the run of each extra attempt that has ended (with
    ``until``, one still live counts up to then)."""
    extra = 0.0
    for run in task.attempts.values():
        ended = until if run.status == "live" else run.ended
        if run.since is not None and ended is not None:
            extra += max(ended - run.since, 0.0)
    raced = {n: run.copy_of for n, run in task.attempts.items() if run.copy_of is not None}
    if task.winner is None or not raced:
        return RaceTally(0, 0, extra)
    won = task.winner in raced
    lost = not won and task.winner in raced.values()
    return RaceTally(int(won), int(lost), extra)


def total_tally(tasks: Iterable[TaskAttempts], until: float | None = None) -> RaceTally:
    """The `RaceTally` of ``tasks`` (see `race_tally` for ``until``)."""
    total = RaceTally()
    for task in tasks:
        total += race_tally(task, until)
    return total


class CommandExecutor(Protocol):
    """The role of a cluster that carries out relaunch commands: the Dask executor, the simulated
    cluster. Each command is applied at most once (by its ``command_id``) and decided by `decide`."""

    def apply(self, command: RelaunchCommand) -> Decision:
        """Carry out ``command``, or skip it; say which."""
        ...

    def tally(self) -> RaceTally:
        """Races won and lost by copies, and the extra attempts' machine time, so far."""
        ...


def decide(
    task: TaskAttempts | None,
    job: str,
    task_id: str,
    action: str,
    attempt: int | None,
    decided_at: float,
) -> Decision:
    """The rules every executor follows for a command to ``action`` on ``attempt`` (None: the newest
    live one) of a task whose attempts are ``task`` (None: a task the cluster does not know),
    decided on the stream's checkpoint at ``decided_at``."""
    if action not in ("duplicate", "relaunch", "kill"):
        raise ValueError(f"unknown action {action!r}")
    if task is None:
        return Skip("unknown_task", f"no task {task_id!r} of job {job!r} on this cluster")
    live = task.live()
    if attempt is None and not live and task.attempts:
        return Skip("finished_task", f"task {task_id!r} of job {job!r} has no live attempt: it has ended")
    if attempt is None:
        attempt = live[-1] if live else None
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
    if started is not None and started > decided_at:
        new_run = "has not begun its new run" if math.isinf(started) else f"began a new run at {started:.3f}"
        return Skip(
            "restarted",
            f"attempt {attempt} of task {task_id!r} {new_run}, after the command was decided at "
            f"{decided_at:.3f} (its worker died and the cluster runs it again)",
        )
    new_attempt = attempt + 1
    if new_attempt in task.attempts:
        return Skip("attempt_exists", f"task {task_id!r} already has attempt {new_attempt}")
    if action == "duplicate":
        return Copy(job, task_id, attempt, new_attempt)
    return Relaunch(job, task_id, attempt, new_attempt)
