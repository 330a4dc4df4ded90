"""A round trip through a real broker: declared topics, an idempotent producer, a fresh consumer group.

Why: it proves, in a few seconds, the things every stage of the pipeline relies on — topics exist,
keyed records are delivered, and records of one key come back in the order they were produced.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from straggler.kafka.config import DeliveryCounter, consumer_config, producer_config
from straggler.kafka.offsets import PAUSE_SECONDS, end_offset, not_ready
from straggler.kafka.topics import DEFAULT_PARTITIONS, create_missing_topics, create_topics

SMOKE_TOPIC = "straggler-smoke"
"""The smoke run's own topic: its untyped records never reach a stage reading the pipeline's topics."""
SMOKE_RETENTION_MS = 60 * 60 * 1000
DEFAULT_MESSAGES = 200
DEFAULT_KEYS = 8
CONSUME_DEADLINE_S = 60.0


@dataclass
class SmokeResult:
    """Counts of one smoke run; ``ok`` only if everything produced came back, keyed and in order."""

    bootstrap: str
    topic: str
    produced: int
    delivered: int
    consumed: int
    keys: int
    elapsed_s: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.consumed == self.produced == self.delivered

    def summary(self) -> str:
        verdict = "ok" if self.ok else "FAILED: " + "; ".join(self.problems[:3])
        return (
            f"smoke {verdict}: {self.delivered}/{self.produced} delivered, {self.consumed} consumed "
            f"back over {self.keys} keys on {self.topic} at {self.bootstrap} in {self.elapsed_s:.2f} s"
        )


def smoke_check(
    bootstrap: str,
    messages: int = DEFAULT_MESSAGES,
    keys: int = DEFAULT_KEYS,
    *,
    topic: str = SMOKE_TOPIC,
    echo: bool = True,
) -> SmokeResult:
    """Create the pipeline's topics and ``topic``, produce ``messages`` keyed JSON records to ``topic``,
    consume them back and check them.

    Only this run's records are read: the consumer starts each partition at its end offset from before
    producing, so earlier runs' records on a long-lived broker do not count.
    """
    started = time.monotonic()
    run_id = uuid.uuid4().hex
    create_topics(bootstrap)
    retention = {"retention.ms": str(SMOKE_RETENTION_MS)}
    create_missing_topics(bootstrap, [NewTopic(topic, DEFAULT_PARTITIONS, 1, config=retention)])
    problems: list[str] = []
    counter = DeliveryCounter()
    consumed = 0

    consumer = Consumer(consumer_config(bootstrap, f"straggler-smoke-{run_id}"))
    try:
        start_offsets = _end_offsets(consumer, topic)

        producer = Producer(producer_config(bootstrap))
        for index in range(messages):
            job = f"smoke-job-{index % keys}"
            value = {"run": run_id, "job_id": job, "seq": index // keys}
            producer.produce(topic, key=job.encode(), value=orjson.dumps(value), on_delivery=counter)
            producer.poll(0)
        remaining = producer.flush(30.0)
        if remaining:
            problems.append(f"{remaining} records still unsent after flush")
        problems.extend(f"delivery failed: {error}" for error in counter.errors)

        def on_assign(assigned_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            for partition in partitions:
                partition.offset = start_offsets.get(partition.partition, partition.offset)
            assigned_consumer.assign(partitions)

        consumer.subscribe([topic], on_assign=on_assign)
        consumed = _consume_run(consumer, run_id, counter.delivered, problems)
        if consumed:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()

    result = SmokeResult(
        bootstrap=bootstrap,
        topic=topic,
        produced=messages,
        delivered=counter.delivered,
        consumed=consumed,
        keys=min(keys, messages),
        elapsed_s=time.monotonic() - started,
        problems=problems,
    )
    if echo:
        print(result.summary())
    return result


def _end_offsets(consumer: Consumer, topic: str) -> dict[int, int]:
    """Each partition's end offset, retrying while a just-created topic elects its leaders (bounded)."""
    deadline = time.monotonic() + 30.0
    while True:
        try:
            partitions = consumer.list_topics(topic, timeout=10.0).topics[topic].partitions
        except KafkaException as exc:
            if not not_ready(exc):
                raise
            partitions = {}
        if partitions:
            left = max(deadline - time.monotonic(), 1.0)
            return {p: end_offset(consumer, TopicPartition(topic, p), left) for p in partitions}
        if time.monotonic() >= deadline:
            raise TimeoutError(f"partitions of {topic!r} got no leader within 30 s")
        time.sleep(PAUSE_SECONDS)


def _consume_run(consumer: Consumer, run_id: str, expected: int, problems: list[str]) -> int:
    """Read until this run's ``expected`` records arrived (or the deadline), checking keys and order."""
    next_seq: dict[str, int] = {}
    consumed = 0
    deadline = time.monotonic() + CONSUME_DEADLINE_S
    while consumed < expected and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            if error.fatal() or error.code() not in (
                KafkaError._PARTITION_EOF,
                KafkaError.UNKNOWN_TOPIC_OR_PART,
            ):
                problems.append(f"consume error: {error}")
            continue
        raw = message.value()
        value = orjson.loads(raw) if raw is not None else None
        if not isinstance(value, dict) or value.get("run") != run_id:
            continue
        consumed += 1
        key = message.key()
        job = value["job_id"]
        if key is None or key.decode() != job:
            problems.append(f"record {value} came back with key {key!r}")
        expected_seq = next_seq.get(job, 0)
        if value["seq"] != expected_seq:
            problems.append(f"{job}: got seq {value['seq']}, expected {expected_seq}")
        next_seq[job] = value["seq"] + 1
    if consumed < expected:
        problems.append(f"only {consumed} of {expected} records came back within {CONSUME_DEADLINE_S:.0f} s")
    return consumed
