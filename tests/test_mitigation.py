"""The mitigation consumer: policies driven from the stream, exactly-once commands, restarts, dead letters.

Broker tests write a job's stream the way the replayer and the agent do (finish events and a boundary
on task-checkpoints, predictions and a marker on straggler-predictions, start/end on job-events), run
the consumer until it is idle, and read the committed commands with a read_committed consumer.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from stream_events import prediction

from consumers.cli import register
from consumers.fold import MitigationState
from consumers.mitigation import MitigationConsumer, MitigationStats
from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    Event,
    JobEvent,
    Prediction,
    RelaunchCommand,
    TaskCheckpoint,
    command_id,
    decode,
    encode,
)
from schemas.events import TaskStatus
from straggler.core.policies import Unlimited
from straggler.kafka.config import consumer_config, producer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.produce import produce_with_backpressure
from straggler.kafka.topics import create_topics

PARTITIONS = 4
INTERVAL = 300.0
COORDINATOR_NOT_READY = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
)
RUN_LIMIT_S = 180.0
"""Safety stop of a consumer run; runs end when the group has committed all its input."""
REPO = Path(__file__).resolve().parents[1]

InputEvent = TaskCheckpoint | JobEvent | CheckpointBoundary | CheckpointEvaluated | Prediction


# ---------------------------------------------------------------- streams as the replayer/agent write them


@dataclass
class Stream:
    """A list of input events in production order, built checkpoint by checkpoint."""

    events: list[InputEvent] = field(default_factory=list)

    def start(self, job: str, tasks: int) -> None:
        self.events.append(JobEvent(job_id=job, event="started", time=0.0, expected_tasks=tasks))

    def finish(self, job: str, task: str, at: float, latency: float) -> None:
        self.events.append(
            TaskCheckpoint(
                job_id=job,
                task_id=task,
                attempt=0,
                checkpoint_time=at,
                status="finished",
                machine_id="m",
                features={},
                latency=latency,
                start_time=max(0.0, at - latency),
            )
        )

    def checkpoint(self, job: str, at: float, verdicts: dict[str, tuple[bool, float | None, float]]) -> None:
        """Boundary, one prediction per ``task -> (flagged, adjusted latency, elapsed)``, marker."""
        index = int(at // INTERVAL)
        self.events.append(
            CheckpointBoundary(job_id=job, checkpoint_time=at, checkpoint_index=index, produced_at=1.0)
        )
        for task, (flagged, adjusted, elapsed) in verdicts.items():
            self.events.append(prediction(job, task, at, flagged=flagged, latency=adjusted, elapsed=elapsed))
        self.events.append(
            CheckpointEvaluated(
                job_id=job,
                checkpoint_time=at,
                evaluated=len(verdicts),
                flagged=sum(v[0] for v in verdicts.values()),
                model_version=1,
                boundary_produced_at=1.0,
                produced_at=1.0,
            )
        )

    def end(self, job: str, at: float) -> None:
        self.events.append(JobEvent(job_id=job, event="ended", time=at))


def random_stream(seed: int, jobs: int, tasks: int) -> Stream:
    """Jobs on a shared checkpoint grid with random latencies and verdicts (the agent never re-flags)."""
    rng = random.Random(seed)
    stream = Stream()
    plan = {}
    for j in range(jobs):
        job = f"job-{seed}-{j}"
        starts = {f"t{i}": rng.uniform(0, 400) for i in range(tasks)}
        ends = {t: s + rng.uniform(100, 600) * (6 if rng.random() < 0.15 else 1) for t, s in starts.items()}
        plan[job] = (starts, ends)
        stream.start(job, tasks)
    flagged: set[tuple[str, str]] = set()
    done: set[str] = set()
    at = 0.0
    while len(done) < jobs:
        previous, at = at, at + INTERVAL
        for job, (starts, ends) in plan.items():
            if job in done:
                continue
            for task in sorted(ends, key=ends.__getitem__):
                if previous < ends[task] <= at:
                    stream.finish(job, task, ends[task], ends[task] - starts[task])
            running = [t for t in starts if starts[t] <= at < ends[t]]
            if running:
                verdicts = {}
                for task in running:
                    if (job, task) in flagged:
                        continue
                    elapsed = at - starts[task]
                    adjusted = None if rng.random() < 0.1 else elapsed + rng.uniform(0, 2000)
                    is_straggler = rng.random() < 0.2
                    if is_straggler:
                        flagged.add((job, task))
                    verdicts[task] = (is_straggler, adjusted, elapsed)
                stream.checkpoint(job, at, verdicts)
            elif all(ends[t] <= at for t in ends):
                stream.end(job, max(ends.values()))
                done.add(job)
    return stream


def topic_of(event: InputEvent, topics: TopicNames) -> str:
    if isinstance(event, Prediction | CheckpointEvaluated):
        return topics.predictions
    if isinstance(event, JobEvent):
        return topics.job_events
    return topics.checkpoints


def offline_commands(stream: Stream, policy: str, topics: TopicNames) -> list[RelaunchCommand]:
    """The commands of the pure fold over the stream in production order."""
    state = MitigationState(policy, INTERVAL)
    out: list[RelaunchCommand] = []
    for offset, event in enumerate(stream.events):
        for output in state.process(encode(event), topic_of(event, topics), 0, offset):
            assert isinstance(output, RelaunchCommand)
            out.append(output)
    return out


# ---------------------------------------------------------------- broker plumbing


@dataclass
class Produced:
    partition_of_job: dict[str, int] = field(default_factory=dict)
    offsets: list[tuple[str, int, int]] = field(default_factory=list)


def produce(bootstrap: str, records: Iterable[tuple[str, bytes, bytes | None]]) -> Produced:
    """Write ``(topic, key, value)`` records with a plain idempotent producer (murmur2 like the pipeline)."""
    config = producer_config(bootstrap)
    config["partitioner"] = "murmur2_random"
    producer = Producer(config)
    produced = Produced()
    errors: list[KafkaError] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(error)
            return
        topic, partition, offset = message.topic() or "", message.partition() or 0, message.offset() or 0
        produced.offsets.append((topic, partition, offset))
        produced.partition_of_job[(message.key() or b"").decode()] = partition

    for topic, key, value in records:
        produce_with_backpressure(producer, topic, value, key, delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []
    return produced


def produce_stream(bootstrap: str, topics: TopicNames, stream: Stream) -> Produced:
    return produce(bootstrap, ((topic_of(e, topics), e.job_id.encode(), encode(e)) for e in stream.events))


def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes | None, int, Event]]:
    """Every committed record of ``topic`` as (key, partition, event), read to the end of each partition."""
    config = consumer_config(bootstrap, f"reader-{time.monotonic_ns()}", read_committed=True)
    config["enable.partition.eof"] = True
    reader = Consumer(config)
    out = []
    try:
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, f"{topic} not read to the end in time"
            for message in reader.consume(num_messages=500, timeout=0.5):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    at_end.add(message.partition() or 0)
                    continue
                out.append((message.key(), message.partition() or 0, decode(message.value())))
    finally:
        reader.close()
    return out


def committed_commands(bootstrap: str, topics: TopicNames) -> list[RelaunchCommand]:
    commands = []
    for _, _, event in read_topic(bootstrap, topics.commands):
        assert isinstance(event, RelaunchCommand)
        commands.append(event)
    return commands


def input_consumed(bootstrap: str, group: str, topics: TopicNames) -> bool:
    """Whether ``group`` has committed every partition of the mitigator's inputs up to its end.

    The inputs are written without transactions, so the end offset is the last record's plus one. While
    the group's coordinator moves or loads (a retriable error) the answer is no: the caller asks again."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        inputs = (topics.predictions, topics.checkpoints, topics.job_events)
        partitions = [TopicPartition(topic, p) for topic in inputs for p in range(PARTITIONS)]
        for tp in probe.committed(partitions, timeout=30):
            if max(tp.offset, 0) < probe.get_watermark_offsets(tp, timeout=30)[1]:
                return False
        return True
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError) and (error.retriable() or error.code() in COORDINATOR_NOT_READY):
            return False
        raise
    finally:
        probe.close()


def run_in_thread(consumer: MitigationConsumer, **kwargs: int) -> MitigationStats:
    """Run the consumer in a thread until it returns by itself (``max_messages``) or has committed all
    its input (a condition, not an idle clock); `RUN_LIMIT_S` is only a safety stop."""
    stop = threading.Event()
    result: dict[str, MitigationStats | BaseException] = {}

    def target() -> None:
        try:
            result["stats"] = consumer.run(stop=stop, **kwargs)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    deadline = time.monotonic() + RUN_LIMIT_S
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.5)
        if "max_messages" not in kwargs and input_consumed(
            consumer.bootstrap, consumer.group_id, consumer.topics
        ):
            break
    stop.set()
    thread.join(30)
    assert not thread.is_alive(), "the consumer did not stop"
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    stats = result["stats"]
    assert isinstance(stats, MitigationStats)
    return stats


def setup_topics(bootstrap: str, prefix: str) -> TopicNames:
    create_topics(bootstrap, partitions=PARTITIONS, prefix=prefix)
    return TopicNames(prefix)


def ids(commands: Sequence[RelaunchCommand]) -> list[str]:
    return [c.command_id for c in commands]


def assert_committed_once(bootstrap: str, topics: TopicNames, expected: set[str]) -> None:
    """Every command of ``expected`` is on the commands topic exactly once, and no other."""
    union = committed_commands(bootstrap, topics)
    assert len(union) == len(set(ids(union))), "a command was committed twice"
    assert set(ids(union)) == expected


# ---------------------------------------------------------------- the pure fold


def test_a_marker_waits_until_the_jobs_task_events_reach_its_checkpoint() -> None:
    topics = TopicNames()
    stream = Stream()
    stream.checkpoint("j", 300.0, {"a": (True, 900.0, 200.0)})
    boundary, prediction, marker = (encode(e) for e in stream.events)
    state = MitigationState("unlimited")
    assert state.process(prediction, topics.predictions, 0, 0) == []
    assert state.process(marker, topics.predictions, 0, 1) == []  # task-checkpoints not at 300 yet
    (command,) = state.process(boundary, topics.checkpoints, 0, 0)
    assert isinstance(command, RelaunchCommand)
    assert command.command_id == command_id("j", "a", "relaunch", 300.0)


@pytest.mark.parametrize("policy", ["unlimited", "limited:2", "mantri"])
def test_the_fold_does_not_depend_on_how_topics_and_partitions_interleave(policy: str) -> None:
    """Any merge of the per-partition streams gives the commands of production order (what makes the
    rebuild after a restart reach the live run's state)."""
    topics = TopicNames()
    stream = random_stream(seed=7, jobs=12, tasks=15)
    expected = sorted(ids(offline_commands(stream, policy, topics)))
    assert expected, "the scenario should cause commands"
    queues: dict[tuple[str, int], list[bytes]] = {}
    for event in stream.events:
        partition = sum(event.job_id.encode()) % PARTITIONS
        queues.setdefault((topic_of(event, topics), partition), []).append(encode(event))
    for shuffle_seed in range(5):
        rng = random.Random(shuffle_seed)
        state = MitigationState(policy, INTERVAL)
        heads = {where: 0 for where in queues}
        got = []
        while heads:
            where = rng.choice(sorted(heads))
            value = queues[where][heads[where]]
            outputs = state.process(value, where[0], where[1], heads[where])
            got += [o.command_id for o in outputs if isinstance(o, RelaunchCommand)]
            heads[where] += 1
            if heads[where] == len(queues[where]):
                del heads[where]
        assert sorted(got) == expected
        assert state.active_jobs < {e.job_id for e in stream.events}  # ended jobs were dropped


def test_an_ended_job_is_dropped_once_later_markers_show_it_cannot_act_again() -> None:
    topics = TopicNames()
    stream = Stream()
    stream.checkpoint("old", 300.0, {"a": (False, 100.0, 50.0)})
    stream.end("old", 350.0)
    stream.checkpoint("other", 600.0, {"b": (False, 100.0, 50.0)})
    state = MitigationState("limited:1")
    for offset, event in enumerate(stream.events[:4]):
        state.process(encode(event), topic_of(event, topics), 0, offset)
    assert "old" in state.active_jobs  # its last marker might still be on its way
    for offset, event in enumerate(stream.events[4:]):
        state.process(encode(event), topic_of(event, topics), 0, offset)
    assert state.active_jobs == {"other"}


class QueuedConsumer:
    """Stands in for confluent-kafka's consume(): ``waited`` counts the calls that would block."""

    def __init__(self, queued: int) -> None:
        self.queued = queued
        self.waited = 0

    def consume(self, num_messages: int, timeout: float) -> list[object]:
        take = min(num_messages, self.queued)
        if take < num_messages and timeout > 0:
            self.waited += 1  # the real call would wait out its timeout for the rest of the batch
        self.queued -= take
        return [QueuedMessage() for _ in range(take)]


class QueuedMessage:
    def error(self) -> None:
        return None


@pytest.mark.parametrize("queued", [1, 7, 499])
def test_the_consumer_takes_what_has_arrived_without_waiting_for_a_full_batch(queued: int) -> None:
    consumer = QueuedConsumer(queued)
    mitigator = MitigationConsumer("127.0.0.1:9", "unlimited", batch_size=500)
    records = mitigator._consume(consumer, 500)  # type: ignore[arg-type]
    assert len(records) == queued and consumer.waited == 0


def test_the_consumer_waits_for_one_record_when_none_has_arrived() -> None:
    consumer = QueuedConsumer(0)
    assert MitigationConsumer("127.0.0.1:9", "unlimited")._consume(consumer, 500) == []  # type: ignore[arg-type]
    assert consumer.waited == 1


# ---------------------------------------------------------------- policies through a real broker


@pytest.mark.broker
def test_unlimited_relaunches_each_flagged_task_once(
    kafka_bootstrap: str, fresh_topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="consumers.mitigation")
    topics = setup_topics(kafka_bootstrap, fresh_topic_prefix)
    stream = Stream()
    flagged = []
    for j in range(3):
        job = f"job{j}"
        stream.start(job, 4)
        stream.checkpoint(job, 300.0, {"a": (True, 900.0, 250.0), "b": (False, 300.0, 250.0)})
        stream.checkpoint(job, 600.0, {"b": (True, 1200.0, 550.0), "c": (False, None, 100.0)})
        stream.checkpoint(job, 900.0, {"c": (False, 500.0, 400.0)})
        flagged += [(job, "a", 300.0), (job, "b", 600.0)]
    produced = produce_stream(kafka_bootstrap, topics, stream)

    stats = run_in_thread(
        MitigationConsumer(kafka_bootstrap, "unlimited", topics=topics, group_id=fresh_topic_prefix)
    )

    records = read_topic(kafka_bootstrap, topics.commands)
    commands = [event for _, _, event in records if isinstance(event, RelaunchCommand)]
    assert len(commands) == len(records)
    assert Counter(ids(commands)) == Counter(command_id(j, t, "relaunch", at) for j, t, at in flagged)
    for (key, partition, _), command in zip(records, commands, strict=True):
        assert key == command.job_id.encode()
        assert partition == produced.partition_of_job[command.job_id]  # co-partitioned with its inputs
        assert command.policy == "unlimited"
        assert (command.job_id, command.task_id, command.checkpoint_time) in flagged
    assert stats.commands == len(flagged)
    assert stats.predictions == 3 * 5
    assert stats.checkpoints == 3 * 3
    assert stats.consumed == len(stream.events)
    assert stats.dead_letters == stats.aborts == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "consumers.mitigation"]
    ready = [line for line in lines if line.startswith("mitigator ready: ")]
    (line,) = ready
    reads = f"{topics.predictions}, {topics.checkpoints}, {topics.job_events}"
    assert line.startswith(f"mitigator ready: broker {kafka_bootstrap}, reading {reads} (")
    assert line.endswith(f"partitions here), writing {topics.commands}, {topics.dead_letters}")
    said = [line for line in lines if line.startswith("command ")]
    assert len(said) == len(flagged) and all(" relaunch of job " in line and "(" in line for line in said)


@pytest.mark.broker
def test_limited_serves_a_waiting_straggler_when_a_copy_finishes(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    """limited:1: b waits behind a's copy. In "early" a's copy finishes before the 900 checkpoint, so b
    is relaunched at 900; in "late" it finishes after 900, so b waits for 1200 (no future information)."""
    topics = setup_topics(kafka_bootstrap, fresh_topic_prefix)
    stream = Stream()
    copy_finish = {"early": 800.0, "late": 950.0}
    for job in copy_finish:
        stream.start(job, 3)
        stream.checkpoint(
            job, 300.0, {"a": (True, 2000.0, 250.0), "b": (True, 2500.0, 250.0), "c": (False, 10.0, 5.0)}
        )
        stream.checkpoint(job, 600.0, {"c": (False, 400.0, 300.0)})
    stream.finish("early", "a", copy_finish["early"], 400.0)
    stream.checkpoint("early", 900.0, {})
    stream.checkpoint("late", 900.0, {"c": (False, 700.0, 600.0)})
    stream.finish("late", "a", copy_finish["late"], 500.0)
    stream.checkpoint("early", 1200.0, {})
    stream.checkpoint("late", 1200.0, {})
    produce_stream(kafka_bootstrap, topics, stream)

    stats = run_in_thread(
        MitigationConsumer(kafka_bootstrap, "limited:1", topics=topics, group_id=fresh_topic_prefix)
    )

    issued = {(c.job_id, c.task_id): c for c in committed_commands(kafka_bootstrap, topics)}
    assert set(issued) == {("early", "a"), ("early", "b"), ("late", "a"), ("late", "b")}
    assert issued["early", "a"].checkpoint_time == issued["late", "a"].checkpoint_time == 300.0
    assert issued["early", "b"].checkpoint_time == 900.0
    assert issued["late", "b"].checkpoint_time == 1200.0
    for job in copy_finish:  # the id names the verdict (flagged at 300), not when it was served
        assert issued[job, "b"].command_id == command_id(job, "b", "relaunch", 300.0)
    assert stats.commands == 4


@pytest.mark.broker
def test_mantri_restarts_only_when_remaining_exceeds_median_plus_interval(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    """Finished latencies 100, 200, 300 before 600 (median 200): restart iff remaining > 200 + 300. A
    task finishing after 600 (latency 600, median 250) must not enter the estimate at 600."""
    topics = setup_topics(kafka_bootstrap, fresh_topic_prefix)
    stream = Stream()
    stream.start("m", 8)
    stream.start("cold", 2)
    for i, latency in enumerate((100.0, 200.0, 300.0)):
        stream.finish("m", f"f{i}", 400.0 + i, latency)
    verdicts = {
        "x": (False, 1100.0, 200.0),  # remaining 900 > 500
        "y": (False, 720.0, 200.0),  # remaining 520 > 500 (but not > 550 with the future finish)
        "z": (True, 650.0, 200.0),  # remaining 450: flagged by the predictor, not worth a restart
        "n": (False, None, 200.0),  # no latency estimate: never
    }
    stream.checkpoint("m", 600.0, verdicts)
    stream.finish("m", "late", 650.0, 600.0)
    stream.checkpoint("cold", 600.0, {"w": (True, 10000.0, 100.0)})  # nothing finished: no estimate
    produce_stream(kafka_bootstrap, topics, stream)

    run_in_thread(MitigationConsumer(kafka_bootstrap, "mantri", topics=topics, group_id=fresh_topic_prefix))

    commands = committed_commands(kafka_bootstrap, topics)
    assert sorted((c.job_id, c.task_id) for c in commands) == [("m", "x"), ("m", "y")]
    assert all(c.policy == "mantri" and c.checkpoint_time == 600.0 for c in commands)
    assert "remaining 900s > new copy 200s + 300s" in {c.task_id: c for c in commands}["x"].reason


# ---------------------------------------------------------------- exactly once across restarts and aborts


@pytest.mark.broker
@pytest.mark.scenario
def test_restarts_neither_lose_nor_repeat_commands(
    kafka_bootstrap: str, fresh_name: Callable[[str], str]
) -> None:
    policy = "limited:2"
    stream = random_stream(seed=11, jobs=10, tasks=12)
    reference_topics = setup_topics(kafka_bootstrap, fresh_name("ref") + ".")
    produce_stream(kafka_bootstrap, reference_topics, stream)
    run_in_thread(
        MitigationConsumer(kafka_bootstrap, policy, topics=reference_topics, group_id=fresh_name("g"))
    )
    reference = committed_commands(kafka_bootstrap, reference_topics)
    assert sorted(ids(reference)) == sorted(ids(offline_commands(stream, policy, reference_topics)))

    topics = setup_topics(kafka_bootstrap, fresh_name("rst") + ".")
    produce_stream(kafka_bootstrap, topics, stream)
    group, tx = fresh_name("g"), fresh_name("tx")
    total = len(stream.events)
    parts = [total // 3, total // 4]
    consumed = 0
    for part in parts:  # each instance stops part-way; the next one (same group and id) takes over
        instance = MitigationConsumer(
            kafka_bootstrap, policy, topics=topics, group_id=group, transactional_id=tx, batch_size=7
        )
        stats = run_in_thread(instance, max_messages=part)
        assert stats.rebuilt_records == consumed  # replayed exactly the committed input
        assert stats.consumed == part
        consumed += part
    last = MitigationConsumer(
        kafka_bootstrap, policy, topics=topics, group_id=group, transactional_id=tx, batch_size=7
    )
    stats = run_in_thread(last)
    assert stats.rebuilt_records == consumed
    assert stats.consumed == total - consumed

    assert_committed_once(kafka_bootstrap, topics, set(ids(reference)))


class _AbortsOnce(MitigationConsumer):
    """Fails one transaction with an abortable error just before its offsets are sent (fault injection:
    the broker, the transaction and the abort are real)."""

    calls = 0

    def _send_offsets(self, producer: Producer, consumer: Consumer) -> None:
        self.calls += 1
        if self.calls == 3:
            raise KafkaException(KafkaError(KafkaError._STATE, "injected", txn_requires_abort=True))
        super()._send_offsets(producer, consumer)


@pytest.mark.broker
def test_an_aborted_transaction_is_rewound_and_redone(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    policy = "mantri"
    topics = setup_topics(kafka_bootstrap, fresh_topic_prefix)
    stream = random_stream(seed=5, jobs=8, tasks=12)
    produce_stream(kafka_bootstrap, topics, stream)

    stats = run_in_thread(
        _AbortsOnce(kafka_bootstrap, policy, topics=topics, group_id=fresh_topic_prefix, batch_size=25)
    )

    assert stats.aborts == 1
    assert stats.rebuilt_records > 0  # the state was rebuilt from the two committed transactions
    assert stats.consumed == len(stream.events)
    commands = committed_commands(kafka_bootstrap, topics)
    assert Counter(ids(commands)) == Counter(ids(offline_commands(stream, policy, topics)))


# ---------------------------------------------------------------- dead letters


@pytest.mark.broker
def test_bad_records_go_to_dead_letters_and_the_rest_is_unchanged(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    topics = setup_topics(kafka_bootstrap, fresh_topic_prefix)
    stream = Stream()
    stream.start("j", 2)
    stream.checkpoint("j", 300.0, {"a": (True, 900.0, 250.0), "b": (False, 300.0, 250.0)})
    stream.checkpoint("j", 600.0, {"b": (True, 1200.0, 550.0)})
    future = re.sub(rb'"schema_version":\d+', b'"schema_version":99', encode(stream.events[2]))
    assert future != encode(stream.events[2])
    produce_stream(kafka_bootstrap, topics, stream)
    bad = produce(
        kafka_bootstrap,
        [(topics.predictions, b"j", b"\xffnot json{"), (topics.predictions, b"j", future)],
    )

    stats = run_in_thread(
        MitigationConsumer(kafka_bootstrap, "unlimited", topics=topics, group_id=fresh_topic_prefix)
    )

    commands = committed_commands(kafka_bootstrap, topics)
    assert sorted(ids(commands)) == sorted(
        [command_id("j", "a", "relaunch", 300.0), command_id("j", "b", "relaunch", 600.0)]
    )
    letters = read_topic(kafka_bootstrap, topics.dead_letters)
    assert stats.dead_letters == len(letters) == 2
    by_offset = {}
    for key, _, letter in letters:
        assert isinstance(letter, DeadLetter)
        assert letter.stage == "mitigator"
        assert key == b"j"
        assert letter.source_topic == topics.predictions
        by_offset[letter.source_offset] = letter
    garbage_offset, future_offset = (offset for _, _, offset in bad.offsets)
    assert "not valid JSON" in by_offset[garbage_offset].error
    assert by_offset[garbage_offset].raw_payload.startswith("\\xffnot json")
    assert "unknown version" in by_offset[future_offset].error
    assert orjson.loads(by_offset[future_offset].raw_payload)["schema_version"] == 99


# ---------------------------------------------------------------- the CLI, killed with SIGKILL


def test_the_cli_rejects_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["mitigate", "--bootstrap", "127.0.0.1:1", "--policy", "fastest"])
    assert exited.value.code == 2
    assert "unknown policy" in capsys.readouterr().err


def _cli_command() -> list[str]:
    """``python -m straggler.cli`` once it registers ``mitigate``; until then an equivalent entry point."""
    from straggler.cli import build_parser

    try:
        build_parser().parse_args(["mitigate", "--bootstrap", "127.0.0.1:1", "--policy", "unlimited"])
        return [sys.executable, "-m", "straggler.cli"]
    except SystemExit:
        entry = (
            "import argparse, sys; from consumers.cli import register; p = argparse.ArgumentParser(); "
            "register(p.add_subparsers()); a = p.parse_args(); sys.exit(a.func(a))"
        )
        return [sys.executable, "-c", entry]


def _mitigate_command(bootstrap: str, policy: str, prefix: str) -> list[str]:
    return [
        *_cli_command(),
        "mitigate",
        "--bootstrap",
        bootstrap,
        "--policy",
        policy,
        "--topic-prefix",
        prefix,
        "--group",
        prefix,
        "--batch-size",
        "20",
    ]


@dataclass(frozen=True)
class MidStream:
    """A ``straggler mitigate`` process stopped mid-stream and started again on the same group."""

    topics: TopicNames
    stream: Stream
    head: int
    """Events produced before the stop (3/5 of the stream)."""
    expected: set[str]
    """Ids of the commands the policy issues offline for the whole stream."""
    command: list[str]
    logs: Path
    """Where each started CLI's stderr goes: a file, not a pipe, since a pipe nobody reads while the
    process runs fills up with its log lines (one per command) and blocks it."""

    def start(self, name: str) -> subprocess.Popen[str]:
        """Start the CLI, its stderr written to ``logs/NAME.stderr``, its stdout a pipe."""
        with (self.logs / f"{name}.stderr").open("w") as stderr:
            return subprocess.Popen(self.command, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True)

    def stderr(self, name: str) -> str:
        """What the CLI started as ``name`` wrote to stderr so far."""
        return (self.logs / f"{name}.stderr").read_text()

    @property
    def before_stop(self) -> Stream:
        return Stream(self.stream.events[: self.head])

    @property
    def after_stop(self) -> Stream:
        return Stream(self.stream.events[self.head :])


def _mid_stream(
    bootstrap: str,
    prefix: str,
    policy: str,
    logs: Path,
    *,
    seed: int,
    size: int,
    extra: Sequence[str] = (),
) -> MidStream:
    """Fresh topics and a random stream of ``size`` jobs of ``size`` tasks; ``extra`` CLI arguments;
    the CLIs' stderr in ``logs``."""
    topics = setup_topics(bootstrap, prefix)
    stream = random_stream(seed=seed, jobs=size, tasks=size)
    expected = set(ids(offline_commands(stream, policy, topics)))
    command = [*_mitigate_command(bootstrap, policy, prefix), *extra]
    return MidStream(topics, stream, len(stream.events) * 3 // 5, expected, command, logs)


def _start_then_wait_for_a_command(bootstrap: str, run: MidStream) -> subprocess.Popen[str]:
    """Produce the stream's first ``head`` events, start the CLI, return once a command is committed.

    The rest of the stream is produced only after the caller has stopped this instance, so the stop
    lands mid-stream whatever the machine's speed."""
    produce_stream(bootstrap, run.topics, run.before_stop)
    process = run.start("first")
    deadline = time.monotonic() + 120
    while not committed_commands(bootstrap, run.topics):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.communicate(timeout=30)
            raise AssertionError(f"no command was committed; stderr: {run.stderr('first')}")
        time.sleep(0.2)
    return process


def _resume(bootstrap: str, run: MidStream) -> dict[str, int]:
    """Produce the rest of the stream and run a new instance until its group has committed all the input
    (then SIGTERM: it commits and leaves); return its stats."""
    produce_stream(bootstrap, run.topics, run.after_stop)
    resumed = run.start("resumed")
    group = run.command[run.command.index("--group") + 1]
    try:
        _wait_for(
            lambda: input_consumed(bootstrap, group, run.topics) or resumed.poll() is not None, "the input"
        )
    finally:
        resumed.send_signal(signal.SIGTERM)
        out, _ = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, run.stderr("resumed")
    stats: dict[str, int] = orjson.loads(out.strip().splitlines()[-1])
    return stats


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.scenario
def test_sigkill_mid_stream_then_restart_is_exactly_once(
    kafka_bootstrap: str, fresh_topic_prefix: str, tmp_path: Path
) -> None:
    policy = "limited:3"
    run = _mid_stream(kafka_bootstrap, fresh_topic_prefix, policy, tmp_path, seed=3, size=40)
    assert set(ids(offline_commands(run.before_stop, policy, run.topics))) < run.expected

    first = _start_then_wait_for_a_command(kafka_bootstrap, run)
    first.send_signal(signal.SIGKILL)  # most likely inside a transaction: the next instance aborts it
    first.communicate(timeout=30)
    stats = _resume(kafka_bootstrap, run)

    assert stats["rebuilt_records"] > 0
    assert_committed_once(kafka_bootstrap, run.topics, run.expected)


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.scenario
def test_sigterm_commits_and_leaves_then_a_restart_carries_on(
    kafka_bootstrap: str, fresh_topic_prefix: str, tmp_path: Path
) -> None:
    run = _mid_stream(kafka_bootstrap, fresh_topic_prefix, "mantri", tmp_path, seed=4, size=30)

    first = _start_then_wait_for_a_command(kafka_bootstrap, run)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0, run.stderr("first")
    stopped = orjson.loads(out.strip().splitlines()[-1])
    assert len(committed_commands(kafka_bootstrap, run.topics)) == stopped["commands"]
    resumed = _resume(kafka_bootstrap, run)

    assert resumed["rebuilt_records"] == stopped["consumed"]
    assert stopped["consumed"] + resumed["consumed"] == len(run.stream.events)
    assert_committed_once(kafka_bootstrap, run.topics, run.expected)


def _consumer_children(supervisor: int) -> set[int]:
    """Pids of the supervisor's consumer processes (not multiprocessing's resource tracker)."""
    found = set()
    for task in Path(f"/proc/{supervisor}/task").iterdir():
        for pid in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"multiprocessing" in cmdline and b"resource_tracker" not in cmdline:
                found.add(int(pid))
    return found


def _wait_for(condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _restarts_served(port: int) -> float:
    """``straggler_mitigator_watchdog_restarts_total`` at the consumer's endpoint (-1: not up)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return -1.0
    match = re.search(r"^straggler_mitigator_watchdog_restarts_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else -1.0


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.scenario
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_the_watchdog_restarts_a_stuck_consumer_and_nothing_is_lost_or_repeated(
    kafka_bootstrap: str, fresh_topic_prefix: str, tmp_path: Path
) -> None:
    """A consumer stuck inside a C call (as librdkafka's send_offsets_to_transaction after a broker
    restart) is alive but silent: SIGSTOP makes exactly that. The supervisor must replace it, and
    then the replacement when it dies of a signal (as when librdkafka aborts)."""
    port = _free_port()
    extra = ["--stall-timeout", "10", "--metrics-port", str(port)]
    run = _mid_stream(
        kafka_bootstrap, fresh_topic_prefix, "unlimited", tmp_path, seed=5, size=30, extra=extra
    )

    supervisor = _start_then_wait_for_a_command(kafka_bootstrap, run)
    try:
        (stuck,) = _consumer_children(supervisor.pid)
        os.kill(stuck, signal.SIGSTOP)
        _wait_for(lambda: _consumer_children(supervisor.pid) - {stuck} != set(), "a new consumer", 60)
        assert stuck not in _consumer_children(supervisor.pid), "the stuck consumer was not killed"
        (aborted,) = _consumer_children(supervisor.pid)
        os.kill(aborted, signal.SIGABRT)
        _wait_for(lambda: _consumer_children(supervisor.pid) - {aborted} != set(), "a third consumer", 60)
        produce_stream(kafka_bootstrap, run.topics, run.after_stop)
        _wait_for(
            lambda: set(ids(committed_commands(kafka_bootstrap, run.topics))) >= run.expected, "every command"
        )
        # the new consumer's endpoint carries on the supervisor's restart count
        _wait_for(lambda: _restarts_served(port) >= 2, "the restarts on the metrics endpoint", 30)
        supervisor.send_signal(signal.SIGTERM)
        out, _ = supervisor.communicate(timeout=60)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert supervisor.returncode == 0, run.stderr("first")
    # at least the stuck one; a loaded machine may add a spurious restart, which is harmless by design
    assert orjson.loads(out.strip().splitlines()[-1])["watchdog_restarts"] >= 2
    assert_committed_once(kafka_bootstrap, run.topics, run.expected)


def test_a_failed_or_killed_run_reaches_the_policy_before_the_checkpoint_it_precedes() -> None:
    heard: list[tuple[str, str, float, int]] = []

    class Recorder(Unlimited):
        def on_task_finished(
            self, job_id: str, task_id: str, at: float, latency: float, attempt: int = 0
        ) -> None:
            heard.append(("finished", task_id, at, attempt))

        def on_task_gone(self, job_id: str, task_id: str, at: float, attempt: int = 0) -> None:
            heard.append(("gone", task_id, at, attempt))

    stream = Stream()
    stream.start("j", 3)
    stream.finish("j", "a", 250.0, 200.0)
    gone: tuple[tuple[str, TaskStatus, float], ...] = (("b", "failed", 260.0), ("c", "killed", 310.0))
    for task, status, at in gone:
        stream.events.append(
            TaskCheckpoint(
                job_id="j",
                task_id=task,
                attempt=1,
                checkpoint_time=at,
                status=status,
                machine_id="m",
                features={},
            )
        )
    stream.checkpoint("j", 300.0, {})
    state = MitigationState("unlimited")
    state.policy = Recorder()
    for offset, event in enumerate(stream.events):
        topic = (
            TopicNames().predictions if isinstance(event, CheckpointEvaluated) else TopicNames().checkpoints
        )
        state.process(encode(event), topic, 0, offset)
    assert heard == [("finished", "a", 250.0, 0), ("gone", "b", 260.0, 1)]  # c ends after 300: later
