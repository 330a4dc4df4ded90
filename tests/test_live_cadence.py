"""How often a live job is evaluated: the pure rule (`straggler.core.live_cadence`) and the agent's
timer boundaries at each job's own spacing (`JobEventHandler.live_ticks`), without a broker."""

from __future__ import annotations

from test_abandonment import live_started, report
from test_agent_handler import Worker

from schemas import JobEvent, TaskCheckpoint
from straggler.core.live_cadence import FLOOR_S, TASK_SHARE, TIMER_SLACK_S, due, evaluation_interval


def test_a_job_is_evaluated_every_tenth_of_its_median_task_within_a_floor_and_the_longest() -> None:
    assert evaluation_interval(None, longest=30.0) == 30.0  # nothing finished: it cannot be predicted yet
    assert evaluation_interval(4.0, longest=30.0) == FLOOR_S
    assert evaluation_interval(120.0, longest=30.0) == TASK_SHARE * 120.0
    assert evaluation_interval(3600.0, longest=30.0) == 30.0  # no more evaluations than --live-interval
    assert evaluation_interval(4.0, longest=0.5) == 0.5  # an operator's shorter --live-interval wins
    assert due(None, 5.0, 30.0) and not due(0.0, 29.8, 30.0) and due(0.0, 30.0, 30.0)


def test_a_timer_that_fires_a_little_early_still_evaluates_a_job_due_each_tick() -> None:
    """The worker's 1 s timer fires a few milliseconds early now and then: a job due every second must
    not wait for the next tick (measured: a Dask job of 1 s tasks was evaluated every 2 s)."""
    ticks = [1.0, 1.998, 3.0, 3.999, 5.0]
    last, evaluated = 0.0, []
    for now in ticks:
        if due(last, now, FLOOR_S):
            last = now
            evaluated.append(now)
    assert evaluated == ticks
    assert due(0.0, FLOOR_S - TIMER_SLACK_S, FLOOR_S) and not due(0.0, FLOOR_S / 2, FLOOR_S)


def ticked(worker: Worker) -> list[bytes]:
    return [send.key or b"" for send in worker.handler.live_ticks()]


def test_a_job_of_short_tasks_is_ticked_every_second_and_one_of_long_tasks_every_live_interval() -> None:
    worker = Worker()
    assert worker.handler.live_interval == 30.0  # the worker's default --live-interval
    events: list[JobEvent | TaskCheckpoint] = [
        live_started("short"),
        live_started("long"),
        live_started("fresh"),
    ]
    events += [report(f"s{i}", 1.7e9 + 3.0, "short", latency=3.0 + i / 10) for i in range(4)]
    events += [report(f"l{i}", 1.7e9 + 900.0, "long", latency=900.0 + i) for i in range(4)]
    events += [report("r", 1.7e9 + 1.0, "fresh")]
    for event in events:
        worker.event(event)
    worker.now = 3.0 + FLOOR_S / 2  # the test worker's wall clock is 1.7e9 + now, the jobs' start 1.7e9
    assert ticked(worker) == [b"short"]  # each job is due one of its spacings after its start
    worker.now += FLOOR_S / 2
    assert ticked(worker) == []
    worker.now += FLOOR_S / 2
    assert ticked(worker) == [b"short"]
    worker.now = 30.0
    assert sorted(ticked(worker)) == [b"fresh", b"long", b"short"]
    worker.now += FLOOR_S
    assert ticked(worker) == [b"short"]
