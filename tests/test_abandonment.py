"""Stale live jobs: the pure rule (`straggler.core.abandonment`) and the agent closing a silent job
as abandoned (`pipeline.handler.JobEventHandler.abandon_silent_jobs`), without a broker."""

from __future__ import annotations

import numpy as np
import pytest
from test_agent_handler import FEATURES, TOPICS, Worker

from schemas import CheckpointBoundary, JobEvent, TaskCheckpoint, decode
from straggler.core.abandonment import CAP_S, FLOOR_S, TASK_MULTIPLE, default_limit, job_silence, silence
from straggler.core.jobstate import JobState

T0 = 1.7e9
"""The live job's start, the cluster's clock (the test worker's wall clock is 1.7e9 + its now)."""


def test_the_default_limit_is_a_multiple_of_the_longest_task_within_a_floor_and_a_cap() -> None:
    assert default_limit(None) == FLOOR_S
    assert default_limit(1.0) == FLOOR_S
    assert default_limit(200.0) == TASK_MULTIPLE * 200.0
    assert default_limit(10 * CAP_S) == CAP_S
    assert default_limit(float("nan")) == FLOOR_S


def test_a_job_is_abandoned_only_past_its_limit_and_a_fixed_limit_wins() -> None:
    assert not silence(100.0, 100.0 + FLOOR_S, longest_task=5.0).abandoned
    assert silence(100.0, 100.0 + FLOOR_S + 1, longest_task=5.0).abandoned
    assert not silence(100.0, 100.0 + 1000.0, longest_task=500.0).abandoned  # 4 x 500 s
    assert silence(100.0, 106.0, longest_task=500.0, fixed=5.0).abandoned
    assert silence(100.0, 50.0, longest_task=None).silent_for == 0.0  # a clock going back: no silence


def test_a_running_tasks_length_is_its_elapsed_time_at_its_last_report_not_at_now() -> None:
    state = JobState("j", n_features=1)
    state.observe_finished("a", np.array([1.0]), latency=20.0, observed_at=T0 + 20.0)
    state.observe_running("r", np.array([1.0]), start=T0, observed_at=T0 + 90.0)
    quiet = job_silence(state, started_at=T0, now=T0 + 90.0 + 10_000.0)
    assert quiet is not None
    assert quiet.last_report == T0 + 90.0 and quiet.limit == TASK_MULTIPLE * 90.0  # not 4 x 10,090 s
    assert quiet.abandoned
    assert job_silence(JobState("j", n_features=1), started_at=None, now=T0) is None
    only_started = job_silence(JobState("j", n_features=1), started_at=T0, now=T0 + FLOOR_S + 1)
    assert only_started is not None and only_started.abandoned


def live_started(job_id: str = "live", boundaries: bool = False) -> JobEvent:
    return JobEvent(
        job_id=job_id,
        event="started",
        time=T0,
        expected_tasks=10,
        sends_boundaries=boundaries,
        feature_names=list(FEATURES),
    )


def report(task: str, at: float, job_id: str = "live", latency: float | None = None) -> TaskCheckpoint:
    return TaskCheckpoint(
        job_id=job_id,
        task_id=task,
        attempt=0,
        checkpoint_time=at,
        status="running" if latency is None else "finished",
        machine_id="m",
        features=FEATURES,
        latency=latency,
        start_time=T0 if latency is None else None,
    )


def abandoned_ends(worker: Worker) -> list[JobEvent]:
    ends = []
    for send in worker.handler.abandon_silent_jobs():
        assert send.topic == TOPICS.job_events
        event = decode(send.value)
        assert isinstance(event, JobEvent) and send.key == event.job_id.encode()
        ends.append(event)
    return ends


@pytest.mark.parametrize("fixed", [None, 5.0])
def test_a_silent_live_job_is_closed_as_abandoned_and_its_state_freed(fixed: float | None) -> None:
    worker = Worker()
    worker.handler.abandon_after = fixed
    for event in [live_started(), report("a", T0 + 20.0, latency=20.0), report("r", T0 + 30.0)]:
        worker.event(event)
    limit = FLOOR_S if fixed is None else fixed
    worker.now = 30.0 + limit  # exactly the limit: not yet
    assert abandoned_ends(worker) == []
    worker.now = 30.0 + limit + 1

    (end,) = abandoned_ends(worker)

    assert end.event == "ended" and end.abandoned and end.time == T0 + 30.0
    assert end.reason is not None and f"limit {limit:.0f} s" in end.reason and "UTC" in end.reason
    assert abandoned_ends(worker) == [], "sent once, until it is read back"
    assert worker.handler.live_ticks() == [], "no more evaluations"
    assert worker.meta("live") is not None, "freed when the end is read back, in the stream's order"

    assert worker.event(end) == []

    assert worker.meta("live") is None
    tasks, _, models = worker.tables
    assert not tasks and not models, "the commit deleted its tasks and models"
    assert worker.store.closed_end("live") == end.time, "and left its closed row"
    assert worker.store.open_jobs() == 0 and abandoned_ends(worker) == []
    assert worker.event(end) == [], "a repeated end changes nothing"


def test_a_report_resets_the_silence_and_replayed_jobs_are_never_abandoned() -> None:
    worker = Worker()
    for event in [live_started(), live_started("replayed", boundaries=True), report("r", T0 + 30.0)]:
        worker.event(event)
    worker.now = 30.0 + FLOOR_S - 10
    worker.event(report("r", 1.7e9 + worker.now))
    worker.now += 20
    assert abandoned_ends(worker) == []
    worker.now += TASK_MULTIPLE * worker.now  # r has run for about now seconds: its limit is 4 x that
    (end,) = abandoned_ends(worker)
    assert end.job_id == "live"


def test_a_job_held_only_in_the_table_is_abandoned_too() -> None:
    """After a restart a silent job sends nothing that would bring it back into the cache."""
    worker = Worker()
    for event in [live_started(), report("r", T0 + 30.0)]:
        worker.event(event)
    worker.store.forget_cache()  # as a restarted worker: the job is in its tables only
    worker.now = 30.0
    assert abandoned_ends(worker) == []
    assert worker.store.cached_jobs() == [], "a job only looked at stays out of the cache (no tick)"
    worker.now = 30.0 + FLOOR_S + 1
    (end,) = abandoned_ends(worker)
    assert end.job_id == "live"
    worker.event(end)
    assert worker.meta("live") is None


def test_a_live_jobs_timer_boundary_still_evaluates_before_the_limit() -> None:
    worker = Worker()
    for event in [live_started(), report("r", T0 + 30.0)]:
        worker.event(event)
    worker.now = 40.0
    (tick,) = worker.handler.live_ticks()
    assert isinstance(decode(tick.value), CheckpointBoundary)
