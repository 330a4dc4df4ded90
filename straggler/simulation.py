"""A pure simulation of a cluster obeying mitigation commands, shared by the replayer and the evaluator.

`JobSimulation` holds one job's tasks as commands change them; the closed-loop replayer publishes its
steps onto Kafka and `run_closed_loop` feeds them to an `OnlineJob` and a policy offline, so both decide
the same commands. No future information reaches a predictor: a new run takes its task's one fixed
`relaunch_latencies` draw and reports the features last observed when it started. ``relaunch``
restarts from zero, ``duplicate`` races a copy (first finisher wins), ``kill`` stops a race's loser;
jobs that now end later get further checkpoints on the same grid.

Commands are decided by the rules the Dask executor follows (`straggler.core.execution.decide`, on
the task's attempts as `JobSimulation.attempts_at` reads them), and races and extra machine time are
counted as it counts them (`straggler.core.execution.race_tally`); `SimulatedCluster` is the replay's
cluster in the role they share (`straggler.core.execution.CommandExecutor`).

A `JobSimulation` that receives no command shows the trace as recorded (`recorded_steps`, which the
replayer's open loop publishes; the evaluator's decisions replay it through
`straggler.core.recorded_run`, checked equal), and the relaunch figures on open-loop flags
(`relaunch_flagged`, the paper's Algorithms 2 and 3) run their policy on the same cluster.

The rules in full, and machine time: docs/architecture.md, "The cluster simulation".
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from schemas import RelaunchCommand, command_id
from straggler.core import execution
from straggler.core.arrays import BoolArray, FloatArray, IntArray
from straggler.core.execution import (
    AttemptRun,
    Copy,
    Kill,
    RaceTally,
    Relaunch,
    Skip,
    TaskAttempts,
    total_tally,
)
from straggler.core.jobstate import JobState
from straggler.core.jobtrace import JobTrace
from straggler.core.online import Decision, OnlineJob
from straggler.core.policies import Action, Limited, MitigationPolicy, Unlimited
from straggler.core.threshold import oracle_threshold


class CheckpointStep(NamedTuple):
    """Checkpoint number ``k`` (on the job's grid) at ``at``: the tasks whose run finished (or ended
    otherwise) since the previous checkpoint, in task order, and the tasks running at ``at`` with
    their features: exactly what a streaming consumer learns between two checkpoint boundaries."""

    k: int
    at: float
    finished: IntArray
    """Tasks whose run finished since the previous checkpoint."""
    gone: IntArray
    """Tasks whose run ended otherwise (killed, evicted, failed, lost) since the previous checkpoint."""
    running: IntArray
    """Tasks running at ``at``."""
    features: FloatArray
    """The running tasks' features at ``at``, a row per task of ``running``."""


def relaunch_latencies(job_latencies: FloatArray, n_tasks: int, job_id: str, seed: int) -> FloatArray:
    """One new-run latency per task, sampled from the job's latencies (fixed per job, task and seed), so
    every method faces the same luck and two runs of the evaluation agree."""
    rng = np.random.default_rng([seed, zlib.crc32(job_id.encode())])
    pool = job_latencies[np.isfinite(job_latencies)]
    return rng.choice(pool, size=n_tasks, replace=True).astype(np.float64)


def _run(
    since: float | None,
    end: float,
    finishes: bool,
    t: float,
    killed_at: float = math.nan,
    copy_of: int | None = None,
) -> AttemptRun:
    """An attempt at ``t`` that runs until ``end`` (NaN or inf: never ends), finishing there if
    ``finishes`` (else failing), unless killed earlier at ``killed_at``."""
    if killed_at <= t and not (end <= killed_at):
        return AttemptRun("killed", since, killed_at, copy_of=copy_of)
    if end <= t:
        return AttemptRun("finished" if finishes else "failed", since, end, copy_of=copy_of)
    return AttemptRun("live", since, copy_of=copy_of)


class JobSimulation:
    """One job's tasks as commands change them: start, end, outcome and attempts of each task.

    Without commands, `step` yields the trace as recorded (its ``running_index`` and ``running_features``;
    a test checks it): a task runs at t when ``start <= t`` and it has not ended by t, and its end is
    announced at the first checkpoint at or after it.
    """

    def __init__(self, trace: JobTrace, seed: int) -> None:
        n = trace.n_tasks
        self.trace = trace
        self.seed = seed
        self.start: FloatArray = trace.start.astype(np.float64, copy=True)
        """Start of the attempt that reports while the task runs (the original while a copy races)."""
        self.end: FloatArray = trace.end.astype(np.float64, copy=True)
        """When the task ends: its running attempt's end, or the earlier of a race's two."""
        self.finished: BoolArray = trace.finished.copy()
        self.attempt: IntArray = np.zeros(n, dtype=np.int64)
        self.reported: BoolArray = np.zeros(n, dtype=bool)
        """The task's end has been published."""
        self.rerun: BoolArray = np.zeros(n, dtype=bool)
        """The task's end is no longer the trace's (relaunched, killed, or a copy won)."""
        self.frozen: BoolArray = np.zeros(n, dtype=bool)
        """The task runs a new attempt the trace does not describe: its features stay as at relaunch."""
        self.last_features: FloatArray = np.full((n, len(trace.feature_names)), np.nan)
        self.checkpoints: list[float] = [float(t) for t in trace.checkpoints]
        self.task_index: dict[str, int] = {}
        for i, task_id in enumerate(trace.task_ids):
            self.task_index.setdefault(task_id, i)
        self.own_end: FloatArray = self.end.copy()
        """When the reporting attempt would end on its own (differs from ``end`` while a copy wins)."""
        self.copy_start: FloatArray = np.full(n, np.nan)
        self.copy_end: FloatArray = np.full(n, np.nan)
        self.loser_stop: FloatArray = np.full(n, np.nan)
        """When the losing attempt of a race was killed (NaN: not yet, it runs to its own end)."""
        self.copy_won: BoolArray = np.zeros(n, dtype=bool)
        """The task's race was won by its copy (decided when the copy starts: both ends are drawn)."""
        self.own_finished: BoolArray = self.finished.copy()
        """Whether the reporting attempt ends by finishing (not failing) on its own, race or not."""
        self.killed_runs: dict[int, list[tuple[int, float, float]]] = {}
        """Task -> (attempt, start, stop) of each attempt a relaunch stopped: the machine time it spent."""
        self._draws: FloatArray | None = None

    def running_at(self, t: float) -> BoolArray:
        with np.errstate(invalid="ignore"):
            return (self.start <= t) & ~(self.end <= t)

    def step(self, k: int, t: float) -> CheckpointStep:
        """Checkpoint ``k`` at ``t``: the ends to announce since the last one, and the running tasks."""
        with np.errstate(invalid="ignore"):
            ending = np.flatnonzero(~self.reported & np.isfinite(self.end) & (self.end <= t))
        self.reported[ending] = True
        running = np.flatnonzero(self.running_at(t))
        features = self.last_features[running]
        if k < len(self.trace.running_index):
            position = np.full(self.trace.n_tasks, -1, dtype=np.int64)
            trace_running = self.trace.running_index[k]
            position[trace_running] = np.arange(len(trace_running))
            rows = position[running]
            from_trace = (rows >= 0) & ~self.frozen[running]
            features[from_trace] = self.trace.running_features[k][rows[from_trace]]
        self.last_features[running] = features
        done = self.finished[ending]
        return CheckpointStep(k, t, ending[done], ending[~done], running, features)

    def copied(self, i: int) -> bool:
        return bool(np.isfinite(self.copy_start[i]))

    def finish_of(self, i: int) -> tuple[int, float]:
        """(attempt, start) of the attempt whose end is task ``i``'s end."""
        if self.copy_won[i]:
            return int(self.attempt[i]) + 1, float(self.copy_start[i])
        return int(self.attempt[i]), float(self.start[i])

    def loser_attempt(self, i: int) -> int | None:
        """The attempt that lost task ``i``'s race, or None if it has no copy."""
        if not self.copied(i):
            return None
        return int(self.attempt[i]) if self.copy_won[i] else int(self.attempt[i]) + 1

    def finish_features(self, i: int) -> FloatArray:
        """The features a finish event carries: the trace's own, unless the task's end was changed."""
        if self.rerun[i]:
            return self.last_features[i]
        return self.trace.finish_features[i]

    def new_latency(self, i: int) -> float:
        """Task ``i``'s new-run latency: scored tasks get the offline evaluator's draws, in order, and
        the others the draws after those (NaN when the job has no latency to draw from)."""
        if self._draws is None:
            scored = self.trace.scored
            n_scored = int(scored.sum())
            draws = np.full(self.trace.n_tasks, np.nan)
            if n_scored:
                pool = self.trace.latency[scored]
                sample = relaunch_latencies(pool, self.trace.n_tasks, self.trace.job_id, self.seed)
                draws[scored] = sample[:n_scored]
                draws[~scored] = sample[n_scored:]
            self._draws = draws
        return float(self._draws[i])

    def attempts_at(self, i: int, t: float) -> TaskAttempts:
        """Task ``i``'s attempts as a cluster would report them at ``t``: those begun by then, each
        one's status, when an extra one began and when each ended, and the first to finish. A run
        that has not ended by ``t`` is live; a race's loser runs on until killed or it ends by itself."""
        runs: dict[int, AttemptRun] = {}
        for number, began, stop in self.killed_runs.get(i, ()):  # stopped by relaunches
            if began <= t:
                runs[number] = _run(began if number > 0 else None, math.inf, True, t, stop)
        current, start = int(self.attempt[i]), float(self.start[i])
        if start <= t:
            since = start if current > 0 else None
            own = (float(self.own_end[i]), bool(self.own_finished[i]))
            if not (self.copy_start[i] <= t):  # no race (yet)
                runs[current] = _run(since, *own, t)
            elif self.copy_won[i]:
                runs[current] = _run(since, *own, t, float(self.loser_stop[i]))
                runs[current + 1] = _run(
                    float(self.copy_start[i]), float(self.end[i]), True, t, copy_of=current
                )
            else:
                runs[current] = _run(since, float(self.end[i]), True, t)
                copy_end, stop = float(self.copy_end[i]), float(self.loser_stop[i])
                runs[current + 1] = _run(float(self.copy_start[i]), copy_end, True, t, stop, current)
        finished = [(run.ended, n) for n, run in runs.items() if run.status == "finished"]
        return TaskAttempts(True, runs, min(finished)[1] if finished else None)

    def apply(self, task_id: str, action: str, t: float, attempt: int | None = None) -> execution.Decision:
        """Carry out a command at instant ``t`` by the rules every executor follows
        (`straggler.core.execution.decide`, on `attempts_at`); what was done, or why it was skipped.

        ``attempt`` names the attempt acted on (None: the newest live one)."""
        i = self.task_index.get(task_id)
        task = None if i is None else self.attempts_at(i, t)
        if task is not None and not task.attempts:
            task = None  # not started yet: the cluster does not know it
        decision = execution.decide(task, self.trace.job_id, task_id, action, attempt, t)
        if i is None or isinstance(decision, Skip):
            return decision
        if isinstance(decision, Kill):  # a race's side: the rules kill only where two run
            if not (self.end[i] <= t):
                return Skip("race_undecided", f"task {task_id!r}'s race has not ended: its outcome is drawn")
            self.loser_stop[i] = t
            return decision
        if self.copied(i):  # the rules allow a copy's copy or relaunch
            return Skip("one_copy", f"task {task_id!r} has its copy already: the simulation runs one")
        draw = self.new_latency(i)
        if not math.isfinite(draw):
            return Skip("no_latency", f"job {self.trace.job_id!r} has no latency to draw a new run's from")
        new_end = t + draw
        self.rerun[i] = self.frozen[i] = True
        if isinstance(decision, Relaunch):
            self._killed(i, t)
            self.attempt[i] += 1
            self.start[i] = t
            self.end[i] = self.own_end[i] = new_end
            self.finished[i] = self.own_finished[i] = True
        else:
            assert isinstance(decision, Copy)
            self.copy_start[i], self.copy_end[i] = t, new_end
            if not (new_end >= self.end[i]) or not self.finished[i]:
                # the copy wins: it ends first, or the original fails (or never ends) before it
                self.end[i] = new_end
                self.finished[i] = True
                self.copy_won[i] = True
            else:
                self.rerun[i] = False  # the original wins: its own finish, features and latency
            self.frozen[i] = False  # the original keeps reporting with its own features
        return decision

    def _killed(self, i: int, t: float) -> None:
        """The running attempt of task ``i`` stops at ``t`` (a relaunch): its run so far is spent."""
        self.killed_runs.setdefault(i, []).append((int(self.attempt[i]), float(self.start[i]), t))

    def extend(self, t: float, interval: float) -> list[float]:
        """Checkpoints to add after ``t`` so every end not yet announced gets a checkpoint at or after it."""
        with np.errstate(invalid="ignore"):
            pending = ~self.reported & np.isfinite(self.end)
        if not pending.any():
            return []
        need = max(float(self.end[pending].max()), t)
        last = self.checkpoints[-1]
        if last >= need and last > t:
            return []
        first = round(last / interval) + 1
        stop = max(first, math.ceil(need / interval))
        if interval * stop <= t:
            stop += 1
        added = [float(c) for c in interval * np.arange(first, stop + 1, dtype=np.float64)]
        self.checkpoints.extend(added)
        return added

    def horizon(self) -> float:
        """The last instant the simulation knows of: a run that never ends is counted up to it."""
        ends = np.concatenate([self.trace.end, self.end, self.copy_end, np.asarray(self.checkpoints)])
        return float(np.nanmax(ends)) if np.isfinite(ends).any() else 0.0

    def machine_time(self) -> FloatArray:
        """Machine time each task's attempts used, seconds (NaN where the task never ends)."""
        spent = np.zeros(self.trace.n_tasks)  # runs already stopped by relaunches
        for i, runs in self.killed_runs.items():
            spent[i] = sum(stop - began for _, began, stop in runs)
        used = spent + (self.end - self.start)
        for i in np.flatnonzero(np.isfinite(self.copy_start)).tolist():
            copy_won = bool(self.copy_won[i])
            natural = self.own_end[i] if copy_won else self.copy_end[i]
            if not math.isfinite(natural):
                natural = float(np.nanmax(self.end))
            stop = min(self.loser_stop[i], natural) if math.isfinite(self.loser_stop[i]) else natural
            original = (stop if copy_won else self.end[i]) - self.start[i]
            copy = (self.end[i] if copy_won else stop) - self.copy_start[i]
            used[i] = spent[i] + original + copy
        return used

    def tally(self) -> RaceTally:
        """The job's races and its extra attempts' machine time, as every executor counts them
        (`straggler.core.execution.race_tally`), to `horizon`: a run that never ends counts up to it."""
        horizon = self.horizon()
        extra = np.flatnonzero((self.attempt > 0) | np.isfinite(self.copy_start)).tolist()
        return total_tally((self.attempts_at(i, horizon) for i in extra), until=horizon)

    def machine_use(self) -> MachineUse:
        """Machine time of every task, scored or not (a run that never ends counted up to `horizon`)."""
        horizon = self.horizon()
        trace = self.trace
        own = np.where(np.isfinite(trace.end), trace.end, horizon) - trace.start
        saved_end = self.end.copy()
        self.end = np.where(np.isfinite(self.end), self.end, horizon)
        try:
            used = self.machine_time()
        finally:
            self.end = saved_end
        tally = self.tally()
        return MachineUse(
            work=float(np.nansum(own)),
            used=float(np.nansum(used)),
            extra_attempts=tally.extra_machine_seconds,
            copies=tally.copies_won + tally.copies_lost,
            copies_won=tally.copies_won,
        )

    def outcome(self) -> JobOutcome:
        trace = self.trace
        scored = trace.scored
        return JobOutcome(
            job_id=trace.job_id,
            task_ids=[task for task, ok in zip(trace.task_ids, scored.tolist(), strict=True) if ok],
            start_before=trace.start[scored],
            end_before=trace.end[scored],
            start_after=self.start[scored],
            end_after=self.end[scored],
            attempts=self.attempt[scored] + np.isfinite(self.copy_start[scored]),
            machine_time_after=self.machine_time()[scored],
            machine=self.machine_use(),
        )


class SimulatedCluster:
    """The replay's cluster, in the role of every executor of commands
    (`straggler.core.execution.CommandExecutor`): its jobs' simulations, the commands it has taken
    but not yet carried out, and its clock. A command is carried out at the first instant at or after
    the checkpoint it was decided on, in the order taken, by the rules every executor follows
    (`JobSimulation.apply`), and once: a command id already carried out is skipped."""

    def __init__(self, sims: Sequence[JobSimulation]) -> None:
        self.sims = {sim.trace.job_id: sim for sim in sims}
        self.now = -math.inf
        """The instant the cluster has reached (`advance`)."""
        self._waiting: list[RelaunchCommand] = []
        self._applied: set[str] = set()

    def take(self, commands: Iterable[RelaunchCommand]) -> None:
        """Commands read from the stream, carried out once their checkpoint is reached."""
        self._waiting.extend(commands)

    def advance(self, t: float) -> list[tuple[RelaunchCommand, execution.Decision]]:
        """Move the clock to ``t`` and carry out the commands due by then; what each came to."""
        self.now = t
        due = [c for c in self._waiting if c.checkpoint_time <= t]
        self._waiting = [c for c in self._waiting if c.checkpoint_time > t]
        return [(command, self.apply(command)) for command in due]

    def apply(self, command: RelaunchCommand) -> execution.Decision:
        """Carry out ``command`` now (at `now`), or skip it; say which."""
        if command.command_id in self._applied:
            return Skip("applied", f"command {command.command_id} was applied already")
        sim = self.sims.get(command.job_id)
        if sim is None:
            return Skip("unknown_task", f"no job {command.job_id!r} on this cluster")
        decision = sim.apply(command.task_id, command.action, self.now, command.attempt)
        if not isinstance(decision, Skip):
            self._applied.add(command.command_id)
        return decision

    def tally(self) -> RaceTally:
        """Races and extra machine time of every job, each to its own `JobSimulation.horizon`."""
        total = RaceTally()
        for sim in self.sims.values():
            total += sim.tally()
        return total


@dataclass(frozen=True)
class MachineUse:
    """A job's machine time over every task, scored or not: what the cluster paid."""

    work: float
    """The trace's own runs, seconds."""
    used: float
    """Every attempt's run after the commands, seconds."""
    extra_attempts: float
    """The runs of attempts beyond each task's first (copies, relaunches), seconds."""
    copies: int
    copies_won: int
    """Copies that finished before their original."""

    @property
    def gross(self) -> float:
        """Extra attempts' machine time as a share of the trace's work: what the commands bought."""
        return self.extra_attempts / self.work if self.work > 0 else 0.0

    @property
    def net(self) -> float:
        """(machine time after - the trace's work) / work: gross less what winning copies saved."""
        return (self.used - self.work) / self.work if self.work > 0 else 0.0

    @property
    def copies_lost(self) -> int:
        return self.copies - self.copies_won


@dataclass
class JobOutcome:
    """A job's scored tasks before and after the commands (identical without commands)."""

    job_id: str
    task_ids: list[str]
    start_before: FloatArray
    end_before: FloatArray
    start_after: FloatArray
    end_after: FloatArray
    attempts: IntArray
    """Attempts beyond the first that each task ran (relaunches and copies)."""
    machine_time_after: FloatArray
    machine: MachineUse | None = None
    """Machine time over every task of the job, scored or not."""

    @property
    def jct_before(self) -> float:
        """Job completion time as traced: last scored end minus first scored start."""
        if not len(self.task_ids):
            return math.nan
        return float(self.end_before.max() - self.start_before.min())

    @property
    def jct_after(self) -> float:
        """Completion time after the commands, from the same beginning: a relaunch moves a task's start,
        not the job's."""
        if not len(self.task_ids):
            return math.nan
        return float(self.end_after.max() - self.start_before.min())

    @property
    def reduction(self) -> float:
        """(before - after) / before: positive when the job finished sooner."""
        before = self.jct_before
        return (before - self.jct_after) / before if before > 0 else 0.0

    @property
    def extra_machine_time(self) -> float:
        """Machine time of every attempt beyond the trace's own runs, as a share of those runs."""
        work = float(np.sum(self.end_before - self.start_before))
        if not len(self.task_ids) or work <= 0:
            return 0.0
        return (float(np.sum(self.machine_time_after)) - work) / work

    @property
    def relaunch_waste(self) -> float:
        """Run time of the attempts relaunches killed (each from its start to the restart), as a share of
        the trace's own runs: the duplicate work the paper's Algorithms 2 and 3 pay for their gain."""
        work = float(np.sum(self.end_before - self.start_before))
        if not len(self.task_ids) or work <= 0:
            return 0.0
        killed = float(np.sum((self.start_after - self.start_before)[self.attempts > 0]))
        return killed / work

    @property
    def relaunched(self) -> int:
        return int(np.count_nonzero(self.attempts > 0))


def figures(outcome: JobOutcome) -> dict[str, float]:
    """A job's completion-time reduction and what it cost: extra machine time of the scored tasks
    (``extra_machine_time``), gross and net over every task, scored or not, and copies won and lost."""
    machine = outcome.machine
    assert machine is not None, "an outcome from JobSimulation.outcome carries its machine use"
    return {
        "jct_reduction": outcome.reduction,
        "extra_machine_time": outcome.extra_machine_time,
        "gross_extra_machine_time": machine.gross,
        "net_extra_machine_time": machine.net,
        "copies": machine.copies,
        "copies_won": machine.copies_won,
        "copies_lost": machine.copies_lost,
    }


def mean_figures(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """`figures` over jobs: means of the shares, sums of the copies, and how many jobs got longer."""
    out: dict[str, float] = {}
    for key in ("jct_reduction", "extra_machine_time", "gross_extra_machine_time", "net_extra_machine_time"):
        values = [row[key] for row in rows if math.isfinite(row[key])]
        out[key] = float(np.mean(values)) if values else math.nan
    for key in ("copies", "copies_won", "copies_lost"):
        out[key] = int(sum(row[key] for row in rows))
    out["jobs_longer"] = int(sum(row["jct_reduction"] < -1e-12 for row in rows))
    return out


@dataclass
class ClosedLoopRun:
    """An offline closed-loop run of one job: its outcome and the commands the policy issued."""

    outcome: JobOutcome
    commands: list[Action]
    """Every distinct command the policy issued, in order (applied or not)."""
    ignored: dict[str, int]
    """Why commands were not carried out, with counts."""


def observe_step(state: JobState, sim: JobSimulation, step: CheckpointStep) -> None:
    """Apply to ``state`` what the replayer publishes for one checkpoint of ``sim``, in its order:
    finishes (by end time), other ends, then the running tasks' snapshots."""
    ids = sim.trace.task_ids
    for i in finish_order(sim, step.finished):
        attempt, start = sim.finish_of(i)
        state.observe_finished(ids[i], sim.finish_features(i), sim.end[i] - start, sim.end[i], attempt)
    for i in finish_order(sim, step.gone):
        state.observe_gone(ids[i], sim.end[i], int(sim.attempt[i]))
    for row, i in enumerate(step.running.tolist()):
        state.observe_running(ids[i], step.features[row], sim.start[i], step.at, int(sim.attempt[i]))


def finish_order(sim: JobSimulation, finished: IntArray) -> list[int]:
    """The order in which the replayer publishes a step's finishes, or its other ends (by end time,
    stable)."""
    return [int(i) for i in finished[np.argsort(sim.end[finished], kind="stable")]]


def checkpoint_interval(trace: JobTrace, default: float) -> float:
    """The spacing of the trace's checkpoint grid (``default`` when it has a single checkpoint)."""
    if len(trace.checkpoints) < 2:
        return default
    return float(np.diff(trace.checkpoints).min())


def steps(sim: JobSimulation, interval: float | None) -> Iterator[CheckpointStep]:
    """Walk ``sim``'s checkpoints, extending the grid by ``interval`` whenever commands moved an end past
    it (``None``: the trace's own checkpoints only).

    The caller applies the commands of each step before asking for the next one."""
    k = 0
    while k < len(sim.checkpoints):
        t = sim.checkpoints[k]
        yield sim.step(k, t)
        if interval is not None:
            sim.extend(t, interval)
        k += 1


def recorded_steps(trace: JobTrace) -> Iterator[CheckpointStep]:
    """The trace as recorded, checkpoint by checkpoint: what a cluster that receives no command shows."""
    return steps(JobSimulation(trace, seed=0), None)


Verdicts = Callable[[CheckpointStep], Sequence[Decision]]
"""The verdicts of one checkpoint, given its step (called once per step, in order)."""


def run_policy(
    sim: JobSimulation,
    policy: MitigationPolicy,
    verdicts: Verdicts,
    interval: float | None,
    *,
    carry_out: bool = True,
) -> tuple[list[Action], dict[str, int]]:
    """Drive ``policy`` over ``sim``'s checkpoints as the mitigation consumer does, and carry out its
    commands in the simulation; the grid is extended by ``interval`` as `steps` does.

    At each checkpoint the policy hears the step's finishes, then its other ends (each by end time), then
    the checkpoint's verdicts. Returns every distinct command the policy issued, in order (applied or
    not, and none applied with ``carry_out=False``), and why commands were not carried out (each
    `Skip`'s kind), with counts.
    """
    commands: list[Action] = []
    ignored: dict[str, int] = {}
    issued: set[str] = set()
    job_id = sim.trace.job_id
    task_ids = sim.trace.task_ids
    machine_ids = sim.trace.machine_ids  # every attempt of a task reports its machine, as replayed
    index = {task_id: i for i, task_id in enumerate(task_ids)}
    for step in steps(sim, interval):
        t = step.at
        decisions = verdicts(step)
        for d in decisions:
            policy.on_task_machine(job_id, d.task_id, d.attempt, machine_ids[index[d.task_id]])
        for i in finish_order(sim, step.finished):  # in the stream's order: the finishes, then other ends
            attempt, start = sim.finish_of(i)
            policy.on_task_machine(job_id, task_ids[i], attempt, machine_ids[i])
            policy.on_task_finished(
                job_id, task_ids[i], float(sim.end[i]), float(sim.end[i] - start), attempt
            )
        for i in finish_order(sim, step.gone):
            policy.on_task_gone(job_id, task_ids[i], float(sim.end[i]), int(sim.attempt[i]))
        for action in policy.on_checkpoint(job_id, t, decisions):
            identity = command_id(job_id, action.task_id, action.action, action.decision_key)
            if identity in issued:
                continue
            issued.add(identity)
            commands.append(action)
            if not carry_out:
                continue
            decision = sim.apply(action.task_id, action.action, t, action.attempt)
            if isinstance(decision, Skip):
                ignored[decision.kind] = ignored.get(decision.kind, 0) + 1
    policy.on_job_ended(job_id)
    return commands, ignored


def run_closed_loop(
    trace: JobTrace,
    job: OnlineJob,
    policy: MitigationPolicy,
    seed: int,
    interval: float,
    *,
    carry_out: bool = True,
) -> ClosedLoopRun:
    """Feed ``trace`` to ``job`` and ``policy`` checkpoint by checkpoint as the stream does, carry out
    the policy's commands in the simulation, and return the outcome (the closed loop, offline).

    With ``carry_out=False`` the commands are recorded but the cluster ignores them: what an open-loop
    replay of the trace makes the pipeline issue."""
    sim = JobSimulation(trace, seed)

    def verdicts(step: CheckpointStep) -> list[Decision]:
        observe_step(job.state, sim, step)
        return job.checkpoint(step.at)

    commands, ignored = run_policy(sim, policy, verdicts, interval, carry_out=carry_out)
    return ClosedLoopRun(sim.outcome(), commands, ignored)


def relaunch_flagged(
    trace: JobTrace, flag_time: FloatArray, seed: int, machines: int | None = None
) -> JobOutcome:
    """The paper's relaunch on open-loop flags (§5, §7.3): each scored task first flagged at
    ``flag_time`` (NaN: never) is killed and restarted while it still runs, at once (``machines=None``,
    Algorithm 2) or when one of ``machines`` spares is free (Algorithm 3: a restarted task holds one
    until it finishes, flagged tasks wait in flag order), over the trace's own checkpoints.

    The flags come from a replay of the trace as recorded, so a restart changes no later verdict (the
    closed loop is `run_closed_loop`). `JobOutcome.relaunch_waste` is the price beside the gain: under
    Algorithm 2 false positives look free in completion time, and that figure shows what they cost."""
    policy: MitigationPolicy = Unlimited() if machines is None else Limited(machines)
    sim = JobSimulation(trace, seed)
    flags = np.where(trace.scored, flag_time, np.nan)
    previous = -math.inf

    def verdicts(step: CheckpointStep) -> list[Decision]:
        nonlocal previous
        t = step.at
        with np.errstate(invalid="ignore"):
            now = np.flatnonzero((flags > previous) & (flags <= t) & ~sim.reported)
        previous = t
        return [_flagged(trace.job_id, trace.task_ids[i], t) for i in now.tolist()]

    run_policy(sim, policy, verdicts, None)
    return sim.outcome()


def _flagged(job_id: str, task_id: str, at: float) -> Decision:
    """A bare straggler verdict (the open-loop flags carry no estimate)."""
    nan = math.nan
    return Decision(job_id, task_id, at, nan, nan, nan, nan, nan, nan, True, 0)


Chooser = Callable[[JobSimulation, float, IntArray], BoolArray]
"""Given the simulation, the instant and the running tasks: which of them to copy now."""


def copy_when(trace: JobTrace, seed: int, interval: float, choose: Chooser) -> JobOutcome:
    """Run ``trace`` with a copy of each running task ``choose`` picks (once per task), and each race's
    loser killed at the first checkpoint at or after the winner's finish: reference rules that may
    use future information (evaluation only)."""
    sim = JobSimulation(trace, seed)
    for _, t, finished, _, running, _ in steps(sim, interval):
        for i in finished.tolist():
            loser = sim.loser_attempt(i)
            if loser is not None:
                sim.apply(trace.task_ids[i], "kill", t, loser)
        fresh = np.array([not sim.copied(i) for i in running.tolist()], dtype=bool)
        for i in running[fresh & choose(sim, t, running)].tolist():
            sim.apply(trace.task_ids[i], "duplicate", t, int(sim.attempt[i]))
    return sim.outcome()


def limit_outcome(trace: JobTrace, seed: int, interval: float, quantile: float = 0.9) -> JobOutcome:
    """The achievable reference: a copy of every true straggler (latency >= the job's p90) at the first
    checkpoint it is running, the losers killed at the checkpoint after each race (future information:
    evaluation only)."""
    if not trace.scored.any():
        return JobSimulation(trace, seed).outcome()
    straggler = true_stragglers(trace, quantile)
    return copy_when(trace, seed, interval, lambda sim, t, running: straggler[running])


def true_stragglers(trace: JobTrace, quantile: float = 0.9) -> BoolArray:
    """The scored tasks whose latency reaches the job's true ``quantile`` (future information:
    evaluation only); the job must have a scored task."""
    scored = trace.scored
    return scored & (trace.latency >= oracle_threshold(trace.latency[scored], quantile))
