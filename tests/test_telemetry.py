"""The live-telemetry SDK against a real broker: what it sends round-trips, what is invalid never leaves."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from producers.telemetry import TelemetryProducer
from schemas import Event, JobEvent, SchemaError, TaskCheckpoint, decode_each
from straggler.kafka.config import consumer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.reachability import BrokerUnreachable, TopicsMissing
from straggler.kafka.topics import create_topics

pytestmark = pytest.mark.broker

READ_TIMEOUT_S = 60.0


def read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, Event]]:
    """(key, event) of every record of ``topic``, partition by partition, in offset order."""
    consumer = Consumer(
        {**consumer_config(bootstrap, f"reader-{uuid.uuid4().hex}"), "enable.partition.eof": True}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: list[tuple[int, int, bytes | None, Event]] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(at_end) < len(partitions):
            assert time.monotonic() < deadline, "topic not read to its end in time"
            for message in consumer.consume(100, timeout=0.2):
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    at_end.add(partition)
                    continue
                key = message.key()
                assert key is None or isinstance(key, bytes)
                records += [(partition, offset, key, event) for event in decode_each(message.value())]
        return [(key, event) for _, _, key, event in sorted(records, key=lambda r: r[:2])]
    finally:
        consumer.close()


def test_reports_round_trip_through_the_broker(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    create_topics(kafka_bootstrap, partitions=3, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    with TelemetryProducer(kafka_bootstrap, topics=topics, source="test-sdk") as telemetry:
        telemetry.start_job("live-1", expected_tasks=2, at=100.0)
        telemetry.report(
            "live-1", "a", {"cpu": np.float32(0.5), "mem": 2}, machine_id="m1", start_time=90.0, at=110.0
        )
        telemetry.report(
            "live-1", "a", {"cpu": 0.25}, "finished", attempt=np.int64(1), latency=35.0, at=125.0
        )
        telemetry.report("live-1", "b", {}, "killed", at=126.0)
        telemetry.end_job("live-1", at=130.0)
    assert telemetry.delivered == 3, "start, one task_batch of the three reports, end"

    jobs = read_all(kafka_bootstrap, topics.job_events)
    assert [key for key, _ in jobs] == [b"live-1", b"live-1"]
    assert [event for _, event in jobs] == [
        JobEvent(job_id="live-1", event="started", time=100.0, expected_tasks=2),
        JobEvent(job_id="live-1", event="ended", time=130.0),
    ]
    tasks = read_all(kafka_bootstrap, topics.checkpoints)
    assert [key for key, _ in tasks] == [b"live-1"] * 3
    assert [event for _, event in tasks] == [
        TaskCheckpoint(
            job_id="live-1",
            task_id="a",
            attempt=0,
            checkpoint_time=110.0,
            status="running",
            machine_id="m1",
            features={"cpu": 0.5, "mem": 2.0},
            start_time=90.0,
            source="test-sdk",
        ),
        TaskCheckpoint(
            job_id="live-1",
            task_id="a",
            attempt=1,
            checkpoint_time=125.0,
            status="finished",
            machine_id="",
            features={"cpu": 0.25},
            latency=35.0,
            source="test-sdk",
        ),
        TaskCheckpoint(
            job_id="live-1",
            task_id="b",
            attempt=0,
            checkpoint_time=126.0,
            status="killed",
            machine_id="",
            features={},
            source="test-sdk",
        ),
    ]


def test_reports_wait_at_most_the_linger_then_go_as_one_batch(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    create_topics(kafka_bootstrap, partitions=3, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    with TelemetryProducer(kafka_bootstrap, topics=topics, linger=0.2) as telemetry:
        telemetry.start_job("live-2", expected_tasks=5, at=100.0)
        assert telemetry.delivered == 1
        for i in range(5):
            telemetry.report("live-2", f"t{i}", {"cpu": 0.1 * i}, start_time=90.0, at=110.0)
        deadline = time.monotonic() + 30.0  # no flush: only the linger thread can send them
        while telemetry.delivered < 2 and time.monotonic() < deadline:
            telemetry._producer.poll(0.05)
        assert telemetry.delivered == 2, "the five reports were not sent as one record after the linger"
    tasks = read_all(kafka_bootstrap, topics.checkpoints)
    assert [event.task_id for _, event in tasks] == [f"t{i}" for i in range(5)]  # type: ignore[union-attr]


def test_a_full_batch_goes_without_waiting(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    create_topics(kafka_bootstrap, partitions=3, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    with TelemetryProducer(kafka_bootstrap, topics=topics, linger=3600.0, max_batch=3) as telemetry:
        for i in range(7):
            telemetry.report("live-3", f"t{i}", {"cpu": 0.5}, at=110.0)
        assert telemetry.flush() == 0
        assert telemetry.delivered == 3, "two full batches of 3, then the last report at the flush"


@pytest.mark.parametrize(
    ("features", "status", "extra", "field", "rule"),
    [
        ({"cpu": math.nan}, "running", {}, "task_checkpoint.features.cpu", "finite"),
        ({"cpu": "high"}, "running", {}, "task_checkpoint.features.cpu", "type"),
        ({"cpu": 0.5}, "finished", {"latency": -1.0}, "task_checkpoint.latency", "minimum"),
        ({"cpu": 0.5}, "finished", {}, "task_checkpoint.latency", "required"),
        ({"cpu": 0.5}, "running", {"latency": 3.0}, "task_checkpoint.latency", "type"),
        ({"cpu": 0.5}, "running", {"attempt": -1}, "task_checkpoint.attempt", "minimum"),
        ({"cpu": 0.5}, "done", {}, "task_checkpoint.status", "enum"),
    ],
)
def test_an_invalid_report_raises_and_sends_nothing(
    kafka_bootstrap: str,
    fresh_topic_prefix: str,
    features: dict[str, Any],
    status: Any,
    extra: dict[str, Any],
    field: str,
    rule: str,
) -> None:
    create_topics(kafka_bootstrap, partitions=2, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    with TelemetryProducer(kafka_bootstrap, topics=topics) as telemetry:
        with pytest.raises(SchemaError) as raised:
            telemetry.report("live-2", "a", features, status, at=10.0, **extra)
        assert (raised.value.field, raised.value.rule) == (field, rule)
        assert telemetry.flush() == 0
    assert telemetry.delivered == 0
    assert read_all(kafka_bootstrap, topics.checkpoints) == []


def test_closed_producer_refuses_reports(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    create_topics(kafka_bootstrap, partitions=1, prefix=fresh_topic_prefix)
    telemetry = TelemetryProducer(kafka_bootstrap, topics=TopicNames(fresh_topic_prefix))
    telemetry.close()
    with pytest.raises(RuntimeError, match="closed"):
        telemetry.report("live-3", "a", {"cpu": 1.0})


def test_a_report_without_start_time_carries_its_attempts_first_report_time(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    create_topics(kafka_bootstrap, partitions=1, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    with TelemetryProducer(kafka_bootstrap, topics=topics) as telemetry:
        telemetry.report("j", "a", {}, at=100.0)
        telemetry.report("j", "a", {}, at=110.0)
        telemetry.report("j", "a", {}, attempt=1, at=115.0)  # a relaunched attempt starts anew
        telemetry.report("j", "a", {}, "finished", attempt=1, latency=10.0, at=125.0)
        telemetry.report("j", "a", {}, attempt=2, at=130.0, start_time=126.0)  # given: sent as given
    sent = [e for _, e in read_all(kafka_bootstrap, topics.checkpoints)]
    assert [(e.attempt, e.start_time) for e in sent if isinstance(e, TaskCheckpoint)] == [
        (0, 100.0),
        (0, 100.0),
        (1, 115.0),
        (1, None),
        (2, 126.0),
    ]


def test_a_job_started_on_topics_that_do_not_exist_names_them_and_the_command_that_creates_them(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    """The broker answers, the topics are missing (never auto-created here): one line says which and
    how to create them, not that no broker answers. It is a `BrokerUnreachable`, so code that stops
    sending on one stops on this too."""
    topics = TopicNames(fresh_topic_prefix)  # not created
    with pytest.raises(TopicsMissing) as raised:  # noqa: SIM117 - the error comes from inside the block
        with TelemetryProducer(kafka_bootstrap, topics=topics, delivery_timeout=2.0) as telemetry:
            telemetry.start_job("live-1", expected_tasks=1, at=1.0)
    message = str(raised.value)
    assert isinstance(raised.value, BrokerUnreachable)
    assert raised.value.topics == [topics.checkpoints, topics.job_events]
    create = f"straggler topics create --bootstrap {kafka_bootstrap} --topic-prefix {fresh_topic_prefix}"
    assert create in message
    assert "no Kafka broker answers" not in message and "\n" not in message
