"""The simulated cluster and the Dask executor are one role (`straggler.core.execution`): told the
same story of a task's attempts, they decide every command alike and count races and machine time
alike. The simulated cluster reads the story off its arrays (`JobSimulation.attempts_at`); the Dask
executor's `ExecutionBook` hears it event by event, as the cluster reports it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from harness.small_jobs import make_job

from schemas import RelaunchCommand, command_id
from straggler.core.execution import AttemptStatus, ExecutionBook, RaceTally, Skip, TaskAttempts
from straggler.simulation import JobSimulation, SimulatedCluster, steps

ACTIONS = ("duplicate", "relaunch", "kill")


def _book_of(sim: JobSimulation, i: int, t: float) -> ExecutionBook:
    """An `ExecutionBook` told task ``i``'s story up to ``t`` as a cluster reports it: the first
    attempt live from its start, each extra attempt when the executor starts it, each end when it
    happens, in time order."""
    job, task_id = sim.trace.job_id, sim.trace.task_ids[i]
    final = sim.attempts_at(i, math.inf)
    book = ExecutionBook()
    if not (sim.trace.start[i] <= t):  # its first attempt has not started: the cluster does not know it
        return book
    first = min(final.attempts)
    book.observe(job, task_id, True, {first: "live"}, at=0.0)
    events: list[tuple[float, int, int, AttemptStatus]] = [
        (run.since, 0, n, "live") for n, run in final.attempts.items() if run.since is not None
    ]
    events += [(run.ended, 1, n, run.status) for n, run in final.attempts.items() if run.ended is not None]
    for at, _, n, status in sorted(events):
        if at > t:
            break
        if status == "live":
            book.attempt_added(job, task_id, n, at, final.attempts[n].copy_of)
        else:
            book.attempt_ended(job, task_id, n, status, at)
    return book


def _order(sim: JobSimulation, i: int, action: str, attempt: int | None, t: float) -> RelaunchCommand:
    task_id = sim.trace.task_ids[i]
    return RelaunchCommand(
        command_id=command_id(sim.trace.job_id, task_id, action, t),
        job_id=sim.trace.job_id,
        task_id=task_id,
        action=action,  # type: ignore[arg-type]
        reason="test",
        policy="test",
        issued_at=t,
        checkpoint_time=t,
        attempt=attempt,
    )


def _story(seed: int) -> JobSimulation:
    """A job whose commands make every kind of attempt: copies (won and lost, losers killed or left
    to end by themselves), relaunches, and a copy of a relaunched attempt."""
    trace = make_job(40, seed=seed, interval=10.0, job_id=f"job-{seed}")
    sim = JobSimulation(trace, seed=0)
    for step in steps(sim, 10.0):
        t = step.at
        for n, i in enumerate(step.finished.tolist()):
            if sim.loser_attempt(i) is not None and n % 2 == 0:
                sim.apply(trace.task_ids[i], "kill", t)
        for n, i in enumerate(step.running.tolist()):  # a third copied, a third relaunched, a third left
            if n % 3 < 2:
                sim.apply(trace.task_ids[i], ("duplicate", "relaunch")[n % 3], t)
    return sim


def _view(task: TaskAttempts | None) -> tuple[object, ...]:
    """What decides a command: each attempt's status, start if extra, end, the copy it races; the winner."""
    if task is None or not task.attempts:
        return ()
    runs = tuple(sorted((n, r.status, r.since, r.ended, r.copy_of) for n, r in task.attempts.items()))
    return (task.winner, runs)


@pytest.mark.parametrize("seed", [3, 4])
def test_told_the_same_story_both_executors_see_the_same_attempts_and_decide_alike(seed: int) -> None:
    sim = _story(seed)
    trace = sim.trace
    assert np.isfinite(sim.copy_start).sum() >= 4 and (sim.attempt > 0).sum() >= 2
    assert (np.isfinite(sim.copy_start) & (sim.attempt > 0)).any(), "a copy of a relaunched attempt"
    skips = 0
    for i in range(trace.n_tasks):
        ends = {float(sim.end[i]), float(sim.own_end[i]), float(sim.copy_end[i]), float(sim.loser_stop[i])}
        instants = {
            *map(float, trace.checkpoints),
            *ends,
            *(e + 0.5 for e in ends),
            float(trace.start[i]) - 1,
        }
        for t in sorted(x for x in instants if math.isfinite(x)):
            book = _book_of(sim, i, t)
            assert _view(book.task(trace.job_id, trace.task_ids[i])) == _view(sim.attempts_at(i, t)), (i, t)
            for action in ACTIONS:
                for attempt in (None, 0, 1, 2):
                    expected = book.decide(_order(sim, i, action, attempt, t))
                    if isinstance(expected, Skip):  # carried out, it would change the story: skips only
                        assert sim.apply(trace.task_ids[i], action, t, attempt) == expected
                        skips += 1
    assert skips > 1000


@pytest.mark.parametrize("seed", [3, 4])
def test_both_executors_count_races_and_machine_time_alike(seed: int) -> None:
    sim = _story(seed)
    ours = SimulatedCluster([sim]).tally()
    theirs = RaceTally()
    for i in range(sim.trace.n_tasks):
        theirs += _book_of(sim, i, math.inf).tally()
    assert ours.copies_won > 0 and ours.copies_lost > 0
    assert (ours.copies_won, ours.copies_lost) == (theirs.copies_won, theirs.copies_lost)
    assert ours.extra_machine_seconds == pytest.approx(theirs.extra_machine_seconds)
    use = sim.machine_use()  # what the evaluation reports: the same count
    assert (use.copies, use.copies_won) == (theirs.copies_won + theirs.copies_lost, theirs.copies_won)
    assert use.extra_attempts == pytest.approx(theirs.extra_machine_seconds)
