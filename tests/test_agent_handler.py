"""The agent's rules without a broker: `JobEventHandler` over a `JobStore` of plain dicts.

Each test feeds encoded records through `pipeline.handler.process`, as the Faust agent does, and
reads what the handler asked the worker to send (and where it asked it to wait for the broker).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from pipeline.commit_order import ACKNOWLEDGE, Acknowledge, InputRecord
from pipeline.handler import (
    Action,
    ForwardRecord,
    JobEventHandler,
    SendDeadLetter,
    SendPredictionPart,
    SendTick,
    process,
)
from pipeline.jobstore import JobMeta, JobStore, new_online_job
from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    JobEvent,
    Prediction,
    PredictionBatch,
    TaskCheckpoint,
    decode,
    encode,
    expand_predictions,
)
from straggler.core.online import OnlineJob
from straggler.core.partitioner import partition_of
from straggler.core.registry import make_method

PARTITIONS = 4
CHECKPOINTS = "task-checkpoints"
JOB_EVENTS = "job-events"
FEATURES = {"cpu": 1.0, "mem": 2.0}
Tables = tuple[dict[bytes, bytes], dict[bytes, bytes], dict[bytes, bytes]]


class Worker:
    """A handler over dict tables, with clocks the test sets, and the actions it asked for."""

    def __init__(
        self, make_job: Callable[[str, JobMeta], OnlineJob] | None = None, tables: Tables | None = None
    ) -> None:
        self.tables: Tables = ({}, {}, {}) if tables is None else tables
        protocol = {"quantile": 0.9, "start_fraction": 0.04, "refit_growth": 0.25}
        factory = make_job or new_online_job(lambda: make_method("nurd", 0), protocol)
        self.store = JobStore(*self.tables, make_job=factory)
        self.now = 0.0
        self.handler = JobEventHandler(
            self.store,
            method="nurd",
            partitions=PARTITIONS,
            pending_grace=30.0,
            clock=lambda: self.now,
            wall_clock=lambda: 1.7e9 + self.now,
        )
        self.commits = self.handler.commits
        self.offset = 0
        self.given_up: list[InputRecord] = []
        """Records whose partition was let go while they were handled."""

    def record(self, topic: str, job_id: str, value: bytes, partition: int | None = None) -> InputRecord:
        self.offset += 1
        home = partition_of(job_id, PARTITIONS) if partition is None else partition
        return InputRecord(job_id.encode(), value, topic, home, self.offset)

    def send(self, record: InputRecord, perform: Callable[[Action], None] | None = None) -> list[Action]:
        """Everything the handler asks for one record, in order (``perform`` sees each first)."""
        actions: list[Action] = []

        async def collect(action: Action) -> None:
            if perform is not None:
                perform(action)
            actions.append(action)

        if not asyncio.run(process(self.handler, record, collect)):
            self.given_up.append(record)
        return actions

    def event(self, event: Any) -> list[Action]:
        topic = JOB_EVENTS if isinstance(event, JobEvent) else CHECKPOINTS
        return self.send(self.record(topic, event.job_id, encode(event)))

    def meta(self, job_id: str) -> JobMeta | None:
        return self.store.meta(job_id)


def started(job_id: str = "j", *, boundaries: bool = True, features: list[str] | None = None) -> JobEvent:
    names = list(FEATURES) if features is None else features
    return JobEvent(
        job_id=job_id,
        event="started",
        time=0.0,
        expected_tasks=10,
        sends_boundaries=boundaries,
        feature_names=names,
    )


def ended(at: float, job_id: str = "j") -> JobEvent:
    return JobEvent(job_id=job_id, event="ended", time=at)


def observation(
    task: str, at: float, status: str, job_id: str, features: dict[str, float], latency: float | None = None
) -> TaskCheckpoint:
    return TaskCheckpoint(
        job_id=job_id,
        task_id=task,
        attempt=0,
        checkpoint_time=at,
        status=status,  # type: ignore[arg-type]
        machine_id="m",
        features=features,
        latency=latency,
        start_time=0.0,
    )


def running(
    task: str, at: float, job_id: str = "j", features: dict[str, float] | None = None
) -> TaskCheckpoint:
    return observation(task, at, "running", job_id, FEATURES if features is None else features)


def finished(task: str, latency: float, job_id: str = "j") -> TaskCheckpoint:
    return observation(task, latency, "finished", job_id, {"cpu": latency / 10, "mem": 1.0}, latency)


def boundary(at: float, job_id: str = "j", origin: str = "producer") -> CheckpointBoundary:
    return CheckpointBoundary(
        job_id=job_id,
        checkpoint_time=at,
        checkpoint_index=int(at),
        produced_at=1.7e9 + at,
        origin=origin,  # type: ignore[arg-type]
    )


def some_finished(job_id: str = "j") -> list[TaskCheckpoint]:
    """Enough finished tasks for the job to predict (two at least, 4 % of ten)."""
    return [finished(f"f{i}", 3.0 + i, job_id) for i in range(4)]


def evaluations(actions: list[Action]) -> list[tuple[list[Prediction], CheckpointEvaluated]]:
    """The checkpoints the actions publish: their verdicts and marker (all parts read)."""
    out = []
    verdicts: list[Prediction] = []
    for action in actions:
        if isinstance(action, SendPredictionPart):
            batch = decode(action.value)
            assert isinstance(batch, PredictionBatch)
            part, marker = expand_predictions(batch)
            verdicts += part
            if marker is not None:
                out.append((verdicts, marker))
                verdicts = []
    return out


def letters(actions: list[Action]) -> list[DeadLetter]:
    out = []
    for action in actions:
        if isinstance(action, SendDeadLetter):
            letter = decode(action.value)
            assert isinstance(letter, DeadLetter) and letter.error == action.reason
            out.append(letter)
    return out


def test_events_before_started_wait_and_are_applied_in_order_once_it_comes() -> None:
    worker = Worker()
    early = [*some_finished(), running("r1", 10.0), boundary(10.0), running("r2", 12.0)]
    for event in early:
        assert worker.event(event) == []
    assert worker.meta("j") is None and len(worker.handler.pending["j"]) == len(early)

    actions = worker.event(started())

    assert not worker.handler.pending
    ((verdicts, marker),) = evaluations(actions)
    assert [p.task_id for p in verdicts] == ["r1"]  # the boundary saw r1, not r2, which came after it
    assert marker.checkpoint_time == 10.0 and marker.boundary_produced_at == 1.7e9 + 10.0
    job = worker.store.job("j")
    assert job is not None and set(job.state.tasks) == {"f0", "f1", "f2", "f3", "r1", "r2"}


def test_a_job_that_never_starts_has_its_events_dead_lettered_after_the_grace() -> None:
    worker = Worker()
    record = worker.record(CHECKPOINTS, "ghost", encode(running("t", 1.0, job_id="ghost")))
    assert worker.send(record) == []
    worker.now = 29.0
    assert worker.handler.expire_pending() == []
    worker.now = 31.0

    (letter,) = letters(list(worker.handler.expire_pending()))

    assert letter.error == "event for unknown job 'ghost': no job_event 'started' within 30s"
    assert letter.raw_payload == record.value.decode()  # type: ignore[union-attr]
    assert (letter.source_topic, letter.source_offset) == (CHECKPOINTS, record.offset)
    assert not worker.handler.pending and worker.handler.stats.dead_letters == 1


def test_a_job_started_without_feature_names_takes_them_from_its_first_observation() -> None:
    worker = Worker()
    worker.event(started(features=[]))
    worker.event(running("a", 1.0, features={"io": 3.0, "cpu": 0.5}))
    worker.event(running("b", 2.0, features={"cpu": 7.0}))

    meta = worker.meta("j")
    job = worker.store.job("j")
    assert meta is not None and meta.feature_names == ["io", "cpu"]
    assert job is not None and job.state.n_features == 2
    assert job.state.tasks["a"].features.tolist() == [3.0, 0.5]
    b = job.state.tasks["b"].features.tolist()
    assert b[0] != b[0] and b[1] == 7.0  # a feature the event leaves out is unknown (NaN)


def test_a_repeated_or_late_boundary_is_ignored() -> None:
    worker = Worker()
    for event in [started(), *some_finished(), running("r", 10.0)]:
        worker.event(event)
    assert len(evaluations(worker.event(boundary(20.0)))) == 1
    ignored = worker.handler.stats.ignored

    assert worker.event(boundary(20.0)) == []
    assert worker.event(boundary(15.0)) == []

    assert worker.handler.stats.ignored == ignored + 2
    meta = worker.meta("j")
    assert meta is not None and meta.last_evaluated == 20.0


def test_the_timer_evaluates_live_jobs_only_and_a_producer_boundary_ends_a_jobs_timer() -> None:
    worker = Worker()
    for job_id, sends in (("live", False), ("replayed", True)):
        for event in [started(job_id, boundaries=sends), *some_finished(job_id), running("r", 10.0, job_id)]:
            worker.event(event)

    ticks = worker.handler.live_ticks()
    (tick,) = ticks
    assert isinstance(tick, SendTick) and tick.key == b"live"
    timer = decode(tick.value)
    assert isinstance(timer, CheckpointBoundary) and timer.origin == "timer" and timer.checkpoint_index == 1

    assert worker.event(boundary(12.0, "replayed", origin="timer")) == []  # no timer for a replayed job
    ((_, marker),) = evaluations(worker.event(timer))
    assert marker.job_id == "live" and marker.boundary_produced_at is None

    ((_, marker),) = evaluations(
        worker.event(boundary(2e9, "live"))
    )  # its producer sends boundaries after all
    meta = worker.meta("live")
    assert meta is not None and not meta.live
    assert worker.handler.live_ticks() == []
    assert worker.event(boundary(3e9, "live", origin="timer")) == []


def test_a_job_ended_after_its_last_evaluation_is_dropped_at_once() -> None:
    worker = Worker()
    for event in [started(), *some_finished(), running("r", 10.0), boundary(20.0)]:
        worker.event(event)
    assert worker.meta("j") is not None

    assert worker.event(ended(15.0)) == [ACKNOWLEDGE]  # the last job row is on the broker first

    assert worker.meta("j") is None
    assert worker.tables == ({}, {}, {})


def test_a_job_ended_before_its_last_evaluation_is_dropped_once_that_is_evaluated() -> None:
    worker = Worker()
    for event in [started(), *some_finished(), running("r", 10.0), boundary(20.0)]:
        worker.event(event)
    worker.event(ended(30.0))
    meta = worker.meta("j")
    assert meta is not None and meta.ended_at == 30.0

    ((_, marker),) = evaluations(worker.event(boundary(30.0)))

    assert marker.checkpoint_time == 30.0
    assert worker.meta("j") is None
    assert worker.tables == ({}, {}, {})


def test_a_bad_observation_of_a_batch_is_dead_lettered_alone() -> None:
    worker = Worker()
    worker.event(started())
    good = {"task_id": "a", "attempt": 0, "checkpoint_time": 1.0, "status": "running", "machine_id": "m",
            "features": FEATURES}  # fmt: skip
    bad = {**good, "task_id": "b", "status": "finished"}  # finished without a latency
    batch = {"type": "task_batch", "schema_version": 1, "job_id": "j",
             "observations": [good, bad, {**good, "task_id": "c"}]}  # fmt: skip

    (letter,) = letters(worker.send(worker.record(CHECKPOINTS, "j", orjson.dumps(batch))))

    assert letter.error.startswith("SchemaError: task_batch.observations[1]")
    assert orjson.loads(letter.raw_payload) == bad
    job = worker.store.job("j")
    assert job is not None and set(job.state.tasks) == {"a", "c"}
    assert worker.handler.stats.task_events == 3


def test_an_exception_while_handling_becomes_an_internal_error_dead_letter() -> None:
    def broken(job_id: str, meta: JobMeta) -> OnlineJob:
        raise RuntimeError("no method today")

    worker = Worker(make_job=broken)
    worker.event(started())

    (letter,) = letters(worker.event(running("a", 1.0)))

    assert letter.error == "internal error: RuntimeError: no method today"
    assert worker.handler.stats.dead_letters == 1


def test_a_checkpoint_commits_its_job_row_only_after_the_predictions_are_acknowledged() -> None:
    """The write order `pipeline.jobstore` relies on: model and predictions; acknowledged; job row;
    acknowledged before the job's next write; old models retired only then."""
    worker = Worker()
    for event in [started(), *some_finished(), running("r", 10.0)]:
        worker.event(event)
    jobs, models = worker.tables[1], worker.tables[2]
    seen: list[tuple[str, float | None, int]] = []

    def perform(action: Action) -> None:
        committed = JobMeta.decode(jobs[b"j"]).last_evaluated
        seen.append((type(action).__name__, committed, len(models)))

    worker.send(worker.record(CHECKPOINTS, "j", encode(boundary(20.0))), perform)
    assert JobMeta.decode(jobs[b"j"]).last_evaluated == 20.0
    assert worker.store.awaiting_acknowledgement("j")
    # the job's next write waits for its job row: a task record now costs one acknowledgement first
    assert worker.event(finished("f4", 25.0)) == [ACKNOWLEDGE]
    assert not worker.store.awaiting_acknowledgement("j")
    for event in (finished("f5", 26.0), running("r2", 28.0)):  # grown: a refit at the next boundary
        assert worker.event(event) == []
    worker.send(worker.record(CHECKPOINTS, "j", encode(boundary(30.0))), perform)

    assert [name for name, _, _ in seen] == ["SendPredictionPart", "Acknowledge"] * 2
    assert [committed for _, committed, _ in seen] == [None, None, 20.0, 20.0]
    job = worker.store.job("j")
    assert job is not None and job.model_version == 2
    assert [n for _, _, n in seen] == [1, 1, 2, 2]
    assert len(models) == 2, "version 1 was retired before the job row naming version 2 was acknowledged"
    worker.send(worker.record(CHECKPOINTS, "j", encode(boundary(30.0))), perform)  # a repeat: no write
    assert len(models) == 2
    assert worker.event(finished("f6", 35.0)) == [ACKNOWLEDGE]
    assert len(models) == 1


def test_a_failed_acknowledgement_leaves_the_checkpoint_uncommitted() -> None:
    worker = Worker()
    for event in [started(), *some_finished(), running("r", 10.0)]:
        worker.event(event)

    def perform(action: Action) -> None:
        if isinstance(action, Acknowledge):
            raise TimeoutError("broker gone")

    worker.send(worker.record(CHECKPOINTS, "j", encode(boundary(20.0))), perform)

    meta = JobMeta.decode(worker.tables[1][b"j"])
    assert meta.last_evaluated is None and meta.model_version == 0


def test_records_off_their_jobs_partition_are_forwarded_and_unkeyed_ones_refused() -> None:
    worker = Worker()
    home = partition_of("j", PARTITIONS)
    stray = worker.record(JOB_EVENTS, "j", encode(started()), partition=(home + 1) % PARTITIONS)
    assert worker.send(stray) == [ForwardRecord(stray, home)]
    assert worker.meta("j") is None

    unkeyed = InputRecord(None, encode(started()), JOB_EVENTS, home, 99)
    (letter,) = letters(worker.send(unkeyed))
    assert letter.error.startswith("record of job 'j' has no key")

    (letter,) = letters(worker.send(worker.record(CHECKPOINTS, "j", b"not json")))
    assert letter.error.startswith("SchemaError: payload")
    assert worker.handler.stats.events == 3 and worker.handler.stats.forwarded == 1


def test_the_end_of_an_unknown_job_is_ignored() -> None:
    worker = Worker()
    assert worker.event(ended(1.0, "nobody")) == [] and worker.handler.stats.ignored == 1


def acked(worker: Worker) -> list[int]:
    """Offsets of the records the handler lets the worker acknowledge now."""
    return [record.offset for record in worker.commits.acknowledgeable()]


def test_a_records_changes_are_written_at_its_jobs_checkpoint_and_it_is_acknowledged_only_then() -> None:
    worker = Worker()
    worker.event(started())
    assert acked(worker) == [1]  # the job row is written at once
    for event in [*some_finished(), running("r", 10.0)]:
        worker.event(event)
    assert worker.tables[0] == {}, "a task row per record"
    assert acked(worker) == []

    worker.event(boundary(10.0))

    assert len(worker.tables[0]) == 1, "the checkpoint's task changes are one row"
    assert acked(worker) == [2, 3, 4, 5, 6, 7]


def test_records_are_acknowledged_in_offset_order_per_partition() -> None:
    """Faust commits the highest contiguous acknowledged offset: a record done after one still held
    waits for it, whoever's job it is."""
    worker = Worker()
    worker.event(started("a"))
    worker.event(started("b"))  # "a" and "b" share a partition
    acked(worker)
    worker.event(running("ra", 1.0, "a"))  # offset 3: waits for a's checkpoint
    for event in [*some_finished("b"), boundary(10.0, "b")]:
        worker.event(event)
    assert acked(worker) == []

    worker.event(boundary(10.0, "a"))

    assert acked(worker) == list(range(3, 10))


def test_a_job_without_checkpoints_is_written_once_its_records_are_held_too_long() -> None:
    worker = Worker()
    for event in [started("a"), started("b"), running("ra", 1.0, "a")]:
        worker.event(event)
    acked(worker)
    worker.now = worker.commits.hold_seconds
    worker.event(running("rb", 2.0, "b"))  # a record on the same partition writes the overdue job
    assert len(worker.tables[0]) == 1 and acked(worker) == [3]

    worker.now = 2 * worker.commits.hold_seconds  # now "b" is overdue, and no record comes
    ((job_id, record),) = worker.commits.overdue().items()
    assert job_id == "b" and record.offset == 4
    assert worker.commits.write_held("b")

    assert len(worker.tables[0]) == 2 and acked(worker) == [4]
    assert worker.commits.overdue() == {}


def test_once_the_input_pauses_every_held_job_is_written_without_waiting_out_the_hold() -> None:
    worker = Worker()
    for event in [started("a"), running("ra", 1.0, "a")]:
        worker.event(event)
    acked(worker)
    assert worker.commits.idle_seconds < worker.commits.hold_seconds
    worker.now = worker.commits.idle_seconds / 2  # records may still be coming
    assert worker.commits.overdue() == {}

    worker.now = worker.commits.idle_seconds  # nothing arrived since: the input paused
    ((job_id, record),) = worker.commits.overdue().items()
    assert job_id == "a" and record.offset == 2
    assert worker.commits.write_held("a")
    assert acked(worker) == [2]


def test_the_timer_writes_no_job_whose_last_job_row_may_not_be_on_the_broker_yet() -> None:
    worker = Worker()
    for event in [started(), *some_finished(), running("r", 10.0), boundary(10.0)]:
        worker.event(event)
    assert worker.store.awaiting_acknowledgement("j")

    assert not worker.commits.write_held("j")
    assert list(worker.commits.flush()) == [ACKNOWLEDGE]
    assert worker.commits.write_held("j")


def test_records_of_a_job_not_started_yet_are_held_until_applied_or_dead_lettered() -> None:
    worker = Worker()
    worker.event(running("r", 1.0))  # offset 1, job "j" not started
    worker.send(worker.record(CHECKPOINTS, "ghost", encode(running("t", 1.0, job_id="ghost"))))  # 2
    worker.event(started())  # 3: applies offset 1, whose change now waits for a checkpoint
    assert acked(worker) == [3]
    worker.now = 31.0
    assert len(worker.handler.expire_pending()) == 1
    worker.event(started("d"))  # 4: the agent goes on while the timer sends the letter
    assert acked(worker) == [4], "acknowledged before its dead letter was sent"
    worker.handler.letters_sent()
    assert acked(worker) == [2]
    worker.event(boundary(5.0))
    assert acked(worker) == [1, 5]


def test_records_let_go_at_a_rebalance_are_never_acknowledged() -> None:
    """Partitions move while a checkpoint awaits the broker: every held record, and the one in hand,
    is given up (its next owner reads it again), none acknowledged."""
    worker = Worker()
    for event in [started(), *some_finished(), running("r", 10.0)]:
        worker.event(event)
    acked(worker)
    let_go: list[int] = []

    def rebalance(action: Action) -> None:
        if isinstance(action, Acknowledge) and not let_go:
            let_go.extend(record.offset for record in worker.handler.let_go())

    worker.send(worker.record(CHECKPOINTS, "j", encode(boundary(10.0))), rebalance)

    assert let_go == [2, 3, 4, 5, 6]
    assert acked(worker) == []
    assert [record.offset for record in worker.given_up] == [7]


def test_records_read_again_after_a_kill_decide_as_an_uninterrupted_worker() -> None:
    """A worker killed with records held (their changes not written) leaves their offsets
    uncommitted; a new worker rebuilds the job from the tables, applies them again (some twice) and
    decides the next checkpoint exactly as the worker that was not killed."""
    history = [started(), *some_finished(), running("r", 10.0), boundary(10.0)]
    history += [running("r", 10.0), finished("f4", 12.0), running("r2", 13.0), running("r3", 14.0)]
    history += [finished("f5", 14.5), running("r2", 15.0)]
    uninterrupted = Worker()
    for event in history:
        uninterrupted.event(event)
    committed = [r.offset for r in uninterrupted.commits.acknowledgeable()]
    assert committed == list(range(1, 8)), "only what the checkpoint wrote may be committed"
    tasks, jobs, models = uninterrupted.tables

    restarted = Worker(tables=(dict(tasks), dict(jobs), dict(models)))
    # read again from the first uncommitted offset (and, as after a commit lost, two before it)
    for event in history[len(committed) - 2 :]:
        restarted.event(event)

    expected = evaluations(uninterrupted.event(boundary(20.0)))
    got = evaluations(restarted.event(boundary(20.0)))
    assert [(p.task_id, p.is_straggler, p.adjusted_latency) for p in got[0][0]] == [
        (p.task_id, p.is_straggler, p.adjusted_latency) for p in expected[0][0]
    ]
    assert got[0][1].model_version == expected[0][1].model_version


def test_inputs_applied_at_their_jobs_start_are_acknowledged_only_once_their_changes_are_written() -> None:
    """The inputs that waited for the job's start are applied in order; while a checkpoint among them
    waits for the broker, the ones after it (not applied yet) are not acknowledged."""
    worker = Worker()
    for event in [*some_finished(), running("r1", 10.0), boundary(10.0), running("r2", 12.0)]:
        worker.event(event)  # offsets 1 to 7, all waiting for the start
    during_flushes: list[int] = []

    def flush(action: Action) -> None:
        if isinstance(action, Acknowledge):
            during_flushes.extend(acked(worker))

    worker.send(worker.record(JOB_EVENTS, "j", encode(started())), flush)

    # 1-5 once the checkpoint wrote them, the boundary (6) once its job row is written; r2 (7) not
    # while it waits to be applied (behind the flush for that job row), nor after: it waits for the
    # job's next task row
    assert during_flushes == [1, 2, 3, 4, 5, 6]
    assert acked(worker) == [8]
