"""The cluster simulation's speculative copies, kills, relaunches and machine-time accounting, and
the closed loop offline (no broker)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from harness.small_jobs import make_job

from straggler.core.execution import Copy, Kill, Skip
from straggler.core.jobtrace import JobTrace, checkpoint_grid
from straggler.core.policy_spec import make_policy
from straggler.evaluation import EvaluationConfig, online_job
from straggler.simulation import (
    JobSimulation,
    checkpoint_interval,
    limit_outcome,
    observe_step,
    relaunch_flagged,
    relaunch_latencies,
    run_closed_loop,
    steps,
)


def _first_running(sim: JobSimulation, trace: JobTrace) -> tuple[float, np.ndarray]:
    t0 = float(trace.checkpoints[0])
    _, _, _, _, running, _ = sim.step(0, t0)
    return t0, running


def test_a_copy_that_finishes_first_ends_the_task_and_names_its_attempt() -> None:
    trace = make_job(30, seed=3, interval=10.0, job_id="job-d")
    sim = JobSimulation(trace, seed=0)
    t0, running = _first_running(sim, trace)
    draws = np.array([sim.new_latency(int(i)) for i in running])
    wins = [int(i) for i, d in zip(running, draws, strict=True) if t0 + d < trace.end[i]]
    loses = [int(i) for i, d in zip(running, draws, strict=True) if t0 + d > trace.end[i]]
    assert wins and loses, "the job must have both outcomes at its first checkpoint"
    winner, loser = wins[0], loses[0]
    for i in (winner, loser):
        assert sim.apply(trace.task_ids[i], "duplicate", t0, 0) == Copy("job-d", trace.task_ids[i], 0, 1)
    assert _skipped(sim.apply(trace.task_ids[winner], "duplicate", t0, 0)) == "attempt_exists"
    assert _skipped(sim.apply(trace.task_ids[winner], "duplicate", t0)) == "one_copy"  # of the copy
    assert sim.end[winner] == t0 + sim.new_latency(winner)
    assert sim.finish_of(winner) == (1, t0) and sim.loser_attempt(winner) == 0
    assert sim.end[loser] == trace.end[loser]
    assert sim.finish_of(loser) == (0, trace.start[loser]) and sim.loser_attempt(loser) == 1
    # the loser of a race can be killed only once the race is decided, and only while it runs
    assert _skipped(sim.apply(trace.task_ids[winner], "kill", t0, 0)) == "race_undecided"
    decided = float(sim.end[winner])
    assert decided < float(trace.end[winner])  # the original runs on past the copy's finish
    assert _skipped(sim.apply(trace.task_ids[winner], "kill", decided, 1)) == "ended_attempt"  # the winner
    assert sim.apply(trace.task_ids[winner], "kill", decided, 0) == Kill("job-d", trace.task_ids[winner], 0)
    assert _skipped(sim.apply(trace.task_ids[winner], "kill", decided, 0)) == "ended_attempt"
    task = sim.attempts_at(winner, decided)
    assert task.winner == 1 and task.attempts[0].status == "killed" and task.attempts[1].copy_of == 0
    later = float(max(sim.end[loser], t0 + sim.new_latency(loser))) + 1.0
    # a loser that ended by itself before the kill came is not killed: nothing is left to stop
    assert _skipped(sim.apply(trace.task_ids[loser], "kill", later, 1)) == "ended_attempt"
    # a task's only attempt is never killed: its result would be lost
    lone = next(int(i) for i in running if int(i) not in (winner, loser))
    assert _skipped(sim.apply(trace.task_ids[lone], "kill", t0, 0)) == "last_attempt"


def _skipped(decision: object) -> str:
    assert isinstance(decision, Skip), decision
    return decision.kind


def test_machine_time_counts_each_attempt_until_it_ends_or_is_killed() -> None:
    trace = make_job(30, seed=3, interval=10.0, job_id="job-m")
    sim = JobSimulation(trace, seed=0)
    t0, running = _first_running(sim, trace)
    i = int(running[0])
    start, own_end = float(trace.start[i]), float(trace.end[i])
    sim.apply(trace.task_ids[i], "duplicate", t0, 0)
    copy_end = t0 + sim.new_latency(i)
    first, second = sorted((own_end, copy_end))
    assert first < second
    kill_at = (first + second) / 2  # the loser is killed before it would have ended on its own
    sim.apply(trace.task_ids[i], "kill", kill_at, sim.loser_attempt(i))
    # the loser runs until its kill, the winner until its end
    copy_won = copy_end < own_end
    expected = (kill_at - start) + (copy_end - t0) if copy_won else (own_end - start) + (kill_at - t0)
    used = sim.machine_time()
    assert used[i] == pytest.approx(expected)
    late = JobSimulation(trace, seed=0)  # a kill after the loser's own end stops nothing
    late.step(0, t0)
    late.apply(trace.task_ids[i], "duplicate", t0, 0)
    late.apply(trace.task_ids[i], "kill", second + 50.0, late.loser_attempt(i))
    assert late.machine_time()[i] == pytest.approx((own_end - start) + (copy_end - t0))
    others = np.arange(trace.n_tasks) != i
    assert np.allclose(used[others], (trace.end - trace.start)[others])
    outcome = sim.outcome()
    work = float(np.sum(trace.end - trace.start))
    assert outcome.extra_machine_time == pytest.approx((float(used.sum()) - work) / work)


def test_a_relaunch_counts_the_killed_run_and_the_new_one() -> None:
    trace = make_job(30, seed=3, interval=10.0, job_id="job-r")
    sim = JobSimulation(trace, seed=0)
    t0, running = _first_running(sim, trace)
    i = int(running[0])
    sim.apply(trace.task_ids[i], "relaunch", t0, 0)
    assert sim.machine_time()[i] == pytest.approx((t0 - trace.start[i]) + sim.new_latency(i))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_limit_copies_every_true_straggler_and_never_lengthens_a_job(seed: int) -> None:
    trace = make_job(120, seed=seed, interval=10.0, job_id=f"job-l{seed}", waves=3, wave_gap=20.0)
    limit = limit_outcome(trace, 0, 10.0)
    assert limit.reduction >= 0.0
    copied = limit.attempts > 0
    latency = trace.latency[trace.scored]
    assert np.array_equal(copied, latency >= np.quantile(latency, 0.9))


@pytest.mark.parametrize("policy", ["speculate", "speculate:2"])
@pytest.mark.parametrize("seed", [4, 5])
def test_speculation_in_the_closed_loop_never_lengthens_a_job(policy: str, seed: int) -> None:
    trace = make_job(200, seed=seed, interval=4.0, job_id=f"job-s{seed}", signal=0.5, waves=4, wave_gap=30.0)
    config = EvaluationConfig(methods=("reactive",), threshold="online")
    interval = checkpoint_interval(trace, 4.0)
    run = run_closed_loop(
        trace, online_job(trace, "reactive", config), make_policy(policy, interval), 0, interval
    )
    actions = [a.action for a in run.commands]
    assert "duplicate" in actions, "the scenario must make the policy copy"
    assert actions.count("kill") <= actions.count("duplicate")
    assert run.outcome.reduction >= 0.0
    # every command is carried out but a kill of a loser that ended by itself before the kill came
    assert set(run.ignored) <= {"ended_attempt"}, run.ignored
    assert sum(run.ignored.values()) <= actions.count("kill")
    if policy == "speculate:2":
        live: set[str] = set()
        for action in run.commands:  # at most two races at once
            if action.action == "duplicate":
                live.add(action.task_id)
            assert len(live) <= 2
            if action.action == "kill":
                live.discard(action.task_id)


def test_steps_extend_the_grid_for_a_new_run_that_outlasts_the_job() -> None:
    trace = make_job(12, seed=3, interval=10.0, job_id="job-x")
    sim = JobSimulation(trace, seed=0)
    seen = []
    for _, t, _, _, running, _ in steps(sim, 10.0):
        seen.append(t)
        if len(seen) == 1:
            i = int(running[0])
            sim.new_latency(i)
            assert sim._draws is not None
            sim._draws[i] = float(trace.checkpoints[-1])  # outlasts the trace's own grid
            sim.apply(trace.task_ids[i], "relaunch", t)
    assert seen[-1] >= sim.end[np.isfinite(sim.end)].max()
    assert len(seen) > len(trace.checkpoints)


def test_a_copy_carries_the_task_when_the_original_fails_first() -> None:
    trace = make_job(30, seed=3, interval=10.0, job_id="job-f")
    t0 = float(trace.checkpoints[0])
    i = int(trace.running_index[0][0])
    finished = trace.finished.copy()
    finished[i] = False  # the original run fails at its end instead of finishing
    failing = dataclasses.replace(trace, finished=finished)
    sim = JobSimulation(failing, seed=0)
    sim.step(0, t0)
    draw = sim.new_latency(i)
    assert sim.apply(failing.task_ids[i], "duplicate", t0, 0) == Copy("job-f", failing.task_ids[i], 0, 1)
    task = sim.attempts_at(i, max(float(trace.end[i]), t0 + draw))
    assert (task.attempts[0].status, task.attempts[1].status, task.winner) == ("failed", "finished", 1)
    assert sim.finished[i] and sim.end[i] == t0 + draw and sim.finish_of(i) == (1, t0)
    assert sim.loser_attempt(i) == 0


def _job(end: list[float], job_id: str, interval: float = 10.0) -> JobTrace:
    """Tasks started at 0 and ending at ``end``, one constant feature, a checkpoint every ``interval``."""
    n = len(end)
    start, ends = np.zeros(n), np.asarray(end, dtype=np.float64)
    checkpoints = checkpoint_grid(0.0, float(ends.max()), interval)
    index = [np.flatnonzero((start <= t) & (t < ends)).astype(np.int64) for t in checkpoints]
    return JobTrace(
        job_id=job_id,
        task_ids=[f"t{i}" for i in range(n)],
        machine_ids=["m"] * n,
        start=start,
        end=ends,
        finished=np.ones(n, dtype=bool),
        feature_names=("x",),
        checkpoints=checkpoints,
        running_index=index,
        running_features=[np.zeros((len(idx), 1)) for idx in index],
        finish_features=np.zeros((n, 1)),
    )


def test_unlimited_relaunch_shortens_the_job_and_counts_wasted_work() -> None:
    trace = _job([10.0] * 20 + [100.0], "job-u")
    flag = np.full(trace.n_tasks, np.nan)
    flag[20] = 20.0
    assert JobSimulation(trace, seed=0).new_latency(20) == 10.0, "the seed draws a short new run"
    result = relaunch_flagged(trace, flag, seed=0)
    assert result.jct_before == 100.0 and result.jct_after == 30.0 and result.relaunched == 1
    assert abs(result.reduction - 0.7) < 1e-12
    assert abs(result.relaunch_waste - 20.0 / 300.0) < 1e-12


def test_limited_machines_make_stragglers_wait() -> None:
    trace = _job([100.0] * 3 + [5.0] * 27, "job-l")
    flag = np.full(trace.n_tasks, np.nan)
    flag[:3] = 10.0
    sim = JobSimulation(trace, seed=3)
    assert [sim.new_latency(i) for i in range(3)] == [5.0] * 3, "the seed draws short new runs"
    one = relaunch_flagged(trace, flag, seed=3, machines=1)
    # one spare: relaunched at 10 (done 15), 20 (done 25), 30 (done 35)
    assert one.jct_after == 35.0 and one.relaunched == 3
    assert abs(one.relaunch_waste - (10.0 + 20.0 + 30.0) / 435.0) < 1e-12
    unlimited = relaunch_flagged(trace, flag, seed=3)
    assert unlimited.jct_after == 15.0


def test_relaunch_draws_are_reproducible_per_job() -> None:
    pool = np.arange(1.0, 100.0)
    a = relaunch_latencies(pool, 50, "job-a", seed=3)
    assert np.array_equal(a, relaunch_latencies(pool, 50, "job-a", seed=3))
    assert not np.array_equal(a, relaunch_latencies(pool, 50, "job-b", seed=3))
    assert set(a) <= set(pool)


@pytest.mark.parametrize("method", ["nurd", "reactive"])
def test_the_cores_recorded_replay_decides_as_the_simulation_with_no_command(method: str) -> None:
    """The evaluator and START replay recorded jobs in the core (`straggler.core.recorded_run`, which
    may not import the simulation); it must show a job exactly what a `JobSimulation` that receives
    no command shows it, step by step as the replayer publishes them."""
    from straggler.core.recorded_run import recorded_decisions
    from straggler.traces.synthetic import generate_jobs

    config = EvaluationConfig(methods=(method,), threshold="online")
    for trace in generate_jobs(3, seed=4, min_tasks=150, max_tasks=300):
        job = online_job(trace, method, config)
        sim = JobSimulation(trace, config.seed)
        expected = []
        for step in steps(sim, None):
            observe_step(job.state, sim, step)
            expected.append(repr(job.checkpoint(step.at)))
        got = [repr(ds) for ds in recorded_decisions(online_job(trace, method, config), trace)]
        assert got == expected, trace.job_id
        assert "is_straggler=True" in "".join(expected)


def test_every_copy_is_counted_scored_or_not() -> None:
    """A copy of a task the evaluation does not score (killed in the trace) costs machine time too: it is
    in the gross figure, though not in the scored tasks' ``extra_machine_time``."""
    base = make_job(60, seed=3)
    t = float(base.checkpoints[2])
    first = JobSimulation(base, seed=0)
    i = int(np.flatnonzero(first.running_at(t))[0])
    finished = base.finished.copy()
    finished[i] = False  # the trace killed it: not scored
    trace = dataclasses.replace(base, finished=finished)
    sim = JobSimulation(trace, seed=0)
    assert isinstance(sim.apply(trace.task_ids[i], "duplicate", t), Copy)
    use = sim.machine_use()
    assert use.copies == 1 and use.copies_won + use.copies_lost == 1
    assert use.extra_attempts == pytest.approx(sim.copy_end[i] - sim.copy_start[i])
    assert use.gross == pytest.approx(use.extra_attempts / use.work) and use.gross > 0
    assert sim.outcome().extra_machine_time == 0.0  # the scored tasks alone do not see it
    untouched = JobSimulation(trace, seed=0).machine_use()
    assert (untouched.gross, untouched.net, untouched.copies) == (0.0, 0.0, 0)
