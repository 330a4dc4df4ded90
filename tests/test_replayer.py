"""The trace replayer against a real broker: the protocol's event order, keys and partitions, and the
closed loop driven by a minimal stand-in for the agent and the mitigation consumer."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from harness.small_jobs import make_job

from producers.replayer import (
    ReplayStalled,
    TraceReplayer,
    feature_map,
    replay_producer_config,
    steady_due,
)
from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    Event,
    JobEvent,
    RelaunchCommand,
    TaskCheckpoint,
    command_id,
    decode,
    decode_each,
    encode,
)
from straggler.core.execution import Copy, Relaunch, Skip
from straggler.core.jobtrace import JobTrace, checkpoint_grid
from straggler.core.partitioner import partition_of
from straggler.kafka.config import consumer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.simulation import CheckpointStep, JobSimulation, relaunch_latencies
from straggler.traces.synthetic import generate_jobs

PARTITIONS = 4
READ_TIMEOUT_S = 60.0
STATUS_RANK = {"finished": 0, "killed": 1, "failed": 1, "running": 2}


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes
    timestamp_ms: int
    event: Event


def read_topics(bootstrap: str, topics: list[str]) -> list[Record]:
    """Every record of ``topics`` from the beginning to the current end, decoded (batches unbatched)."""
    consumer = Consumer(
        {**consumer_config(bootstrap, f"reader-{uuid.uuid4().hex}"), "enable.partition.eof": True}
    )
    try:
        assignment = []
        for topic in topics:
            described = consumer.list_topics(topic, timeout=30).topics[topic]
            assignment += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in described.partitions]
        consumer.assign(assignment)
        at_end: set[tuple[str, int]] = set()
        records = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(at_end) < len(assignment):
            assert time.monotonic() < deadline, "topics not read to their end in time"
            for message in consumer.consume(500, timeout=0.2):
                error = message.error()
                name, partition, offset = message.topic(), message.partition(), message.offset()
                assert name is not None and partition is not None and offset is not None
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    at_end.add((name, partition))
                    continue
                key = message.key()
                assert isinstance(key, bytes)
                records += [  # a batch's observations share its offset, in the batch's order
                    Record(name, partition, offset, key, message.timestamp()[1], event)
                    for event in decode_each(message.value())
                ]
        return records
    finally:
        consumer.close()


def rebuild(trace: JobTrace, *, finished: np.ndarray, end: np.ndarray, interval: float = 10.0) -> JobTrace:
    """``trace`` with other task outcomes, its checkpoints and running sets recomputed to match."""
    last_end = float(np.nanmax(end))
    checkpoints = checkpoint_grid(float(trace.start.min()), last_end, interval)
    index, rows = [], []
    base = trace.finish_features
    for t in checkpoints:
        with np.errstate(invalid="ignore"):
            idx = np.flatnonzero((trace.start <= t) & ~(end <= t))
        index.append(idx.astype(np.int64))
        rows.append(base[idx] + t / 1000.0)  # features that change from checkpoint to checkpoint
    finish_features = np.where(finished[:, None], base, np.nan)
    return dataclasses.replace(
        trace,
        end=end,
        finished=finished,
        checkpoints=checkpoints,
        running_index=index,
        running_features=rows,
        finish_features=finish_features,
    )


def job_with_unscored_tasks(job_id: str) -> JobTrace:
    """A job where some runs were killed, and one still runs when the trace ends."""
    trace = make_job(24, seed=2, job_id=job_id)
    finished = np.ones(trace.n_tasks, dtype=bool)
    finished[[1, 4, 7]] = False
    end = trace.end.copy()
    end[9] = np.nan
    finished[9] = False
    trace = rebuild(trace, finished=finished, end=end)
    trace.finish_features[2, 1] = np.nan  # unknown features are left out of the map
    trace.running_features[3][0, 0] = np.nan
    return trace


def as_recorded(trace: JobTrace) -> Iterator[CheckpointStep]:
    """The trace's own record, checkpoint by checkpoint: the ends in (t_{k-1}, t_k], finished or not, and
    the trace's running tasks and features at t_k."""
    previous = -np.inf
    ended = np.isfinite(trace.end)
    for k, t in enumerate(trace.checkpoints):
        with np.errstate(invalid="ignore"):
            in_window = ended & (trace.end > previous) & (trace.end <= t)
        previous = t
        finished, gone = (
            np.flatnonzero(in_window & trace.finished),
            np.flatnonzero(in_window & ~trace.finished),
        )
        yield CheckpointStep(k, float(t), finished, gone, trace.running_index[k], trace.running_features[k])


def test_simulation_without_commands_is_the_trace() -> None:
    traces = [make_job(40, seed=1), job_with_unscored_tasks("job-u"), *generate_jobs(1, seed=0, min_tasks=60)]
    for trace in traces:
        sim = JobSimulation(trace, seed=0)
        for expected, t in zip(as_recorded(trace), trace.checkpoints, strict=True):
            k, _, finished, gone, running, features = expected
            _, t_sim, finished_sim, gone_sim, running_sim, features_sim = sim.step(k, float(t))
            order = np.argsort(running, kind="stable")
            assert t_sim == t
            assert np.array_equal(np.sort(finished), np.sort(finished_sim))
            assert np.array_equal(np.sort(gone), np.sort(gone_sim))
            assert np.array_equal(running[order], running_sim)
            assert np.array_equal(features[order], features_sim, equal_nan=True)
        assert sim.extend(float(trace.checkpoints[-1]), 10.0) == []


def test_relaunch_draws_are_the_offline_evaluators() -> None:
    trace = job_with_unscored_tasks("job-u")
    scored = trace.scored
    evaluator = relaunch_latencies(trace.latency[scored], int(scored.sum()), trace.job_id, 5)
    sim = JobSimulation(trace, seed=5)
    draws = [sim.new_latency(i) for i in range(trace.n_tasks)]
    assert np.array_equal(np.asarray(draws)[scored], evaluator)
    assert all(np.isfinite(draws))


def test_simulated_commands_change_runs_and_extend_the_job() -> None:
    trace = make_job(12, seed=3, interval=10.0, job_id="job-s")
    sim = JobSimulation(trace, seed=0)
    last = len(trace.checkpoints) - 1
    for k, t in enumerate(trace.checkpoints[:-1]):
        sim.step(k, float(t))
    t_last = float(trace.checkpoints[last])
    _, _, _, _, running, _ = sim.step(last, t_last)
    assert len(running) == 0  # the trace's own grid ends once every task has ended
    # Replay from the start with commands at the first checkpoint.
    sim = JobSimulation(trace, seed=0)
    t0 = float(trace.checkpoints[0])
    _, _, _, _, running, features = sim.step(0, t0)
    victim, copied, moved = (int(i) for i in running[:3])
    done = int(np.flatnonzero(trace.end <= t0)[0])
    assert _skipped(sim.apply(trace.task_ids[done], "relaunch", t0)) == "finished_task"
    assert _skipped(sim.apply("no-such-task", "relaunch", t0)) == "unknown_task"
    # a task's only attempt is never killed (its result would be lost), as on any executor
    assert _skipped(sim.apply(trace.task_ids[victim], "kill", t0)) == "last_attempt"
    assert isinstance(sim.apply(trace.task_ids[copied], "duplicate", t0), Copy)
    assert sim.end[copied] == min(trace.end[copied], t0 + sim.new_latency(copied))
    sim.new_latency(moved)
    assert sim._draws is not None
    sim._draws[moved] = t_last  # the new run outlasts the job's own checkpoints
    assert sim.apply(trace.task_ids[moved], "relaunch", t0) == Relaunch(
        trace.job_id, trace.task_ids[moved], 0, 1
    )
    assert (sim.attempt[moved], sim.start[moved], sim.end[moved]) == (1, t0, t0 + t_last)
    added = sim.extend(t0, 10.0)
    assert added and added[0] > trace.checkpoints[-1] and added[-1] >= t0 + t_last
    assert np.allclose(np.diff([trace.checkpoints[-1], *added]), 10.0)
    _, _, _, gone, running_1, features_1 = sim.step(1, float(trace.checkpoints[1]))
    assert victim not in gone and sim.end[victim] == trace.end[victim]
    # the new run reports the features observed at the relaunch, not the original run's later ones
    assert np.array_equal(features_1[running_1 == moved][0], features[2])


def _skipped(decision: object) -> str:
    assert isinstance(decision, Skip), decision
    return decision.kind


def test_duplicate_job_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        TraceReplayer([make_job(5), make_job(5)], "127.0.0.1:1")


@pytest.mark.parametrize(
    ("rate", "other", "message"),
    [
        (0.0, {}, "positive"),
        (float("inf"), {}, "positive"),
        (100.0, {"speed": 2.0}, "not with speed"),
        (100.0, {"closed_loop": True, "checkpoint_seconds": 60.0}, "not with speed"),
    ],
)
def test_steady_pacing_is_refused_where_it_means_nothing(
    rate: float, other: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TraceReplayer([make_job(5)], "127.0.0.1:1", observations_per_second=rate, **other)  # type: ignore[arg-type]


def test_steady_due_gives_each_observation_its_share_of_time() -> None:
    assert steady_due(100.0, 0, 50.0) == 100.0
    assert steady_due(100.0, 150, 50.0) == 103.0


@pytest.mark.broker
def test_steady_replay_spreads_the_observations(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    """At a steady rate the replay takes at least (observations before its last instant) / rate, and
    sends what an unpaced replay sends."""
    create_topics(kafka_bootstrap, partitions=PARTITIONS, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    traces = [make_job(30, seed=0, job_id="job-a"), make_job(20, seed=1, job_id="job-b")]
    observations = sum(len(r) for t in traces for r in t.running_index)
    rate = observations / 1.5  # about a second and a half
    began = time.monotonic()
    result = TraceReplayer(
        traces, kafka_bootstrap, topics=topics, progress=False, observations_per_second=rate
    ).run()
    took = time.monotonic() - began
    last_instant = max(float(t.checkpoints[-1]) for t in traces)
    at_last = sum(
        len(running)
        for t in traces
        for c, running in zip(t.checkpoints, t.running_index, strict=True)
        if c == last_instant
    )
    assert result.observations_produced >= observations
    assert took >= (observations - at_last) / rate * 0.999
    records = read_topics(kafka_bootstrap, [topics.checkpoints, topics.job_events])
    for trace in traces:
        check_protocol(trace, records, topics)


def check_protocol(trace: JobTrace, records: list[Record], topics: TopicNames) -> None:
    """The job's records follow docs/stream-protocol.md, and carry exactly what the trace implies."""
    key = trace.job_id.encode()
    mine = [r for r in records if r.key == key]
    jobs = [r for r in mine if r.topic == topics.job_events]
    tasks = sorted((r for r in mine if r.topic == topics.checkpoints), key=lambda r: r.offset)
    assert all(getattr(r.event, "job_id", None) == trace.job_id for r in mine)
    assert {r.partition for r in mine} == {partition_of(key.decode(), PARTITIONS)}  # co-partitioned, murmur2

    jobs.sort(key=lambda r: r.offset)
    assert len(jobs) == 2
    started, ended = jobs[0].event, jobs[1].event
    assert isinstance(started, JobEvent) and started.event == "started"
    assert started.expected_tasks == trace.expected_tasks
    assert isinstance(ended, JobEvent) and ended.event == "ended"
    assert ended.time == trace.checkpoints[-1]
    # started was acknowledged before the first task event was produced; ended after the last boundary
    assert jobs[0].timestamp_ms <= tasks[0].timestamp_ms
    assert jobs[1].timestamp_ms >= tasks[-1].timestamp_ms
    assert isinstance(tasks[-1].event, CheckpointBoundary)

    segments: list[list[TaskCheckpoint]] = [[]]
    boundaries: list[CheckpointBoundary] = []
    for record in tasks:
        if isinstance(record.event, CheckpointBoundary):
            boundaries.append(record.event)
            segments.append([])
        else:
            assert isinstance(record.event, TaskCheckpoint)
            segments[-1].append(record.event)
    assert segments.pop() == []
    assert len(boundaries) == len(trace.checkpoints)
    previous = -np.inf
    for (k, t, finished, gone, running, features), boundary, segment in zip(
        as_recorded(trace), boundaries, segments, strict=True
    ):
        assert (boundary.checkpoint_index, boundary.checkpoint_time) == (k, t)
        ranks = [STATUS_RANK[e.status] for e in segment]
        assert ranks == sorted(ranks), f"checkpoint {k}: finished, then killed, then running"
        by_status: dict[str, list[TaskCheckpoint]] = {"finished": [], "killed": [], "running": []}
        for event in segment:
            by_status[event.status].append(event)
            assert event.attempt == 0
        assert [e.task_id for e in by_status["finished"]] == [
            trace.task_ids[i] for i in finished[np.argsort(trace.end[finished], kind="stable")]
        ]
        assert sorted(e.task_id for e in by_status["killed"]) == sorted(trace.task_ids[i] for i in gone)
        assert [e.task_id for e in by_status["running"]] == [trace.task_ids[i] for i in running]
        for event in by_status["finished"]:
            i = trace.task_ids.index(event.task_id)
            assert previous < event.checkpoint_time == trace.end[i] <= t
            assert event.latency == pytest.approx(trace.end[i] - trace.start[i])
            assert event.features == feature_map(trace.feature_names, trace.finish_features[i])
        for event in by_status["killed"]:
            assert event.latency is None and previous < event.checkpoint_time <= t
        for event, i, row in zip(by_status["running"], running, features, strict=True):
            assert event.checkpoint_time == t and event.start_time == trace.start[i]
            assert event.machine_id == trace.machine_ids[i]
            assert event.features == feature_map(trace.feature_names, row)
        previous = t


@pytest.mark.broker
def test_open_loop_replay_follows_the_protocol(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    create_topics(kafka_bootstrap, partitions=PARTITIONS, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    # Both jobs name their tasks t0, t1, ...: the job id in the key keeps them apart.
    traces = [make_job(30, seed=0, job_id="job-a"), job_with_unscored_tasks("job-b")]
    assert set(traces[1].task_ids) < set(traces[0].task_ids)
    result = TraceReplayer(traces, kafka_bootstrap, topics=topics, progress=False).run()

    records = read_topics(kafka_bootstrap, [topics.checkpoints, topics.job_events])
    assert result.delivery_failures == 0
    assert result.events_produced == len({(r.topic, r.partition, r.offset) for r in records})
    observed = [r for r in records if isinstance(r.event, TaskCheckpoint)]
    assert result.observations_produced == len(observed)
    batched = {(r.topic, r.partition, r.offset) for r in observed}
    assert len(batched) < len(observed) / 3, "each checkpoint's observations go as a few task_batch records"
    assert result.instants == len(np.union1d(traces[0].checkpoints, traces[1].checkpoints))
    assert {r.key for r in records} == {b"job-a", b"job-b"}
    for trace in traces:
        check_protocol(trace, records, topics)
        assert result.jct_after[trace.job_id] == result.jct_before[trace.job_id]
        scored = trace.scored
        assert result.jct_before[trace.job_id] == trace.end[scored].max() - trace.start[scored].min()
        for k, t in enumerate(trace.checkpoints):
            assert (trace.job_id, float(t)) in result.boundary_produced_at, k


class FakePipeline(threading.Thread):
    """Stands in for the agent and the mitigation consumer: answers every boundary with a marker,
    then, in one transaction as the mitigation consumer does, writes the given commands and commits
    the mitigator group past the marker and the boundary (offsets committed apart, after the
    transaction, could be seen before its commands: `commit_transaction` returns before the broker
    has written the markers that make them readable)."""

    def __init__(
        self,
        bootstrap: str,
        topics: TopicNames,
        group: str,
        commands: dict[tuple[str, float], list[RelaunchCommand]],
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topics, self.group, self.commands = bootstrap, topics, group, commands
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.markers = 0

    def run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # surfaced by the test after join()
            self.error = exc

    def _serve(self) -> None:
        config = replay_producer_config(self.bootstrap)
        boundaries = Consumer(consumer_config(self.bootstrap, f"fake-agent-{uuid.uuid4().hex}"))
        partitions = (
            boundaries.list_topics(self.topics.checkpoints, timeout=30)
            .topics[self.topics.checkpoints]
            .partitions
        )
        boundaries.assign([TopicPartition(self.topics.checkpoints, p, OFFSET_BEGINNING) for p in partitions])
        agent = Producer(config)
        mitigator = Producer({**config, "transactional.id": f"fake-mitigator-{uuid.uuid4().hex}"})
        mitigator.init_transactions(30)
        committer = Consumer(consumer_config(self.bootstrap, self.group))
        committer.assign([TopicPartition(self.topics.predictions, p) for p in partitions])
        deadline = time.monotonic() + 300
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                for message in boundaries.consume(100, timeout=0.1):
                    if message.error() is not None:
                        continue
                    event = decode(message.value())
                    if isinstance(event, CheckpointBoundary):
                        self._answer(event, message, agent, mitigator, committer)
        finally:
            boundaries.close()
            committer.close()

    def _answer(
        self,
        boundary: CheckpointBoundary,
        boundary_message: Message,
        agent: Producer,
        mitigator: Producer,
        committer: Consumer,
    ) -> None:
        marker = CheckpointEvaluated(
            job_id=boundary.job_id,
            checkpoint_time=boundary.checkpoint_time,
            evaluated=0,
            flagged=0,
            model_version=0,
            boundary_produced_at=boundary.produced_at,
            produced_at=time.time(),
        )
        where: list[tuple[int, int]] = []

        def delivered(error: KafkaError | None, message: object) -> None:
            assert error is None, error
            where.append((message.partition(), message.offset()))  # type: ignore[attr-defined]

        agent.produce(
            self.topics.predictions, encode(marker), boundary.job_id.encode(), on_delivery=delivered
        )
        agent.flush(30)
        partition, offset = where[0]
        commands = self.commands.get((boundary.job_id, boundary.checkpoint_time), [])
        boundary_partition, boundary_offset = boundary_message.partition(), boundary_message.offset()
        assert boundary_partition is not None and boundary_offset is not None
        mitigator.begin_transaction()
        for command in commands:
            mitigator.produce(self.topics.commands, encode(command), command.job_id.encode())
        mitigator.send_offsets_to_transaction(
            [
                TopicPartition(self.topics.predictions, partition, offset + 1),
                TopicPartition(self.topics.checkpoints, boundary_partition, boundary_offset + 1),
            ],
            committer.consumer_group_metadata(),
            30,
        )
        mitigator.commit_transaction(30)
        self.markers += 1


def relaunch(job_id: str, task_id: str, t: float, action: str = "relaunch") -> RelaunchCommand:
    return RelaunchCommand(
        command_id=command_id(job_id, task_id, action, t),
        job_id=job_id,
        task_id=task_id,
        action=action,  # type: ignore[arg-type]
        reason="test",
        policy="unlimited",
        issued_at=time.time(),
        checkpoint_time=t,
    )


@pytest.mark.broker
@pytest.mark.slow
def test_closed_loop_relaunches_with_the_evaluators_draw(
    kafka_bootstrap: str, fresh_topic_prefix: str, fresh_name: Callable[[str], str]
) -> None:
    create_topics(kafka_bootstrap, partitions=PARTITIONS, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    group = fresh_name("mitigator")
    seed = 7
    job = make_job(20, seed=1, interval=10.0, job_id="job-c")
    other = make_job(12, seed=4, interval=10.0, job_id="job-d")
    t0 = float(job.checkpoints[0])
    target = int(np.argmax(job.end))  # the task that sets the job's completion time
    done = np.flatnonzero(job.end <= t0)
    assert job.start[target] <= t0 < job.end[target] and len(done), "preconditions of the chosen job"
    command = relaunch(job.job_id, job.task_ids[target], t0)
    commands = {(job.job_id, t0): [command, command, relaunch(job.job_id, job.task_ids[done[0]], t0)]}
    pipeline = FakePipeline(kafka_bootstrap, topics, group, commands)
    pipeline.start()
    try:
        result = TraceReplayer(
            [job, other],
            kafka_bootstrap,
            topics=topics,
            closed_loop=True,
            seed=seed,
            mitigator_group=group,
            wait_timeout=60.0,
            progress=False,
        ).run()
    finally:
        pipeline.stop.set()
        pipeline.join(60)
    assert pipeline.error is None, pipeline.error

    draw = relaunch_latencies(job.latency[job.scored], int(job.scored.sum()), job.job_id, seed)[target]
    new_end = job.end.copy()
    new_end[target] = t0 + draw
    assert new_end[target] != job.end[target]
    assert (result.commands_applied, result.commands_duplicate, result.commands_ignored) == (1, 1, 1)
    assert result.ignored_reasons == {"finished_task": 1}
    assert result.jct_before["job-c"] == job.end.max() - job.start.min()
    assert result.jct_after["job-c"] == pytest.approx(new_end.max() - job.start.min())
    assert result.jct_after["job-d"] == result.jct_before["job-d"]
    assert result.outcomes["job-c"].relaunched == 1

    records = read_topics(kafka_bootstrap, [topics.checkpoints, topics.job_events])
    job_c = sorted((r for r in records if r.key == b"job-c"), key=lambda r: r.offset)
    target_events = [
        r.event
        for r in job_c
        if isinstance(r.event, TaskCheckpoint) and r.event.task_id == job.task_ids[target]
    ]
    at_t0 = next(e for e in target_events if e.checkpoint_time == t0)
    assert at_t0.attempt == 0 and at_t0.status == "running"
    *running, finish = [e for e in target_events if e.attempt == 1]
    assert running, "the relaunched attempt is reported while it runs"
    for event in running:
        assert event.status == "running" and event.start_time == t0
        assert t0 < event.checkpoint_time < t0 + draw
        assert event.features == at_t0.features  # observed at the relaunch, not the original's future
    assert finish.status == "finished" and finish.attempt == 1
    assert finish.latency == pytest.approx(draw) and finish.checkpoint_time == pytest.approx(t0 + draw)
    boundaries = [r.event for r in records if r.key == b"job-c" and isinstance(r.event, CheckpointBoundary)]
    assert boundaries[-1].checkpoint_time >= new_end.max()
    ended = [r.event for r in records if r.key == b"job-c" and isinstance(r.event, JobEvent)]
    assert [e.event for e in ended] == ["started", "ended"]
    assert pipeline.markers == len(boundaries) + sum(
        isinstance(r.event, CheckpointBoundary) for r in records if r.key == b"job-d"
    )


@pytest.mark.broker
def test_closed_loop_without_a_pipeline_stalls_with_the_jobs_named(
    kafka_bootstrap: str, fresh_topic_prefix: str, fresh_name: Callable[[str], str]
) -> None:
    create_topics(kafka_bootstrap, partitions=PARTITIONS, prefix=fresh_topic_prefix)
    replayer = TraceReplayer(
        [make_job(10, job_id="job-lonely")],
        kafka_bootstrap,
        topics=TopicNames(fresh_topic_prefix),
        closed_loop=True,
        mitigator_group=fresh_name("nobody"),
        wait_timeout=2.0,
        progress=False,
    )
    with pytest.raises(ReplayStalled, match="job-lonely: no checkpoint_evaluated marker"):
        replayer.run()
