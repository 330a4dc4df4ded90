"""Topic declarations against a real broker: idempotent creation, partitions and configs as declared."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

from straggler.kafka.embedded import embedded_kafka
from straggler.kafka.topics import (
    DEAD_LETTERS,
    TASK_CHECKPOINTS,
    create_topics,
    partition_count,
    topic_configs,
    topic_specs,
    verify_partitions,
    wait_until_served,
)


@pytest.mark.broker
def test_creating_twice_is_a_no_op(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    specs = topic_specs(partitions=3, prefix=fresh_topic_prefix)
    first = create_topics(kafka_bootstrap, partitions=3, prefix=fresh_topic_prefix)
    assert sorted(first) == sorted(spec.name for spec in specs)
    second = create_topics(kafka_bootstrap, partitions=3, prefix=fresh_topic_prefix)
    assert second == []
    for spec in specs:
        assert partition_count(kafka_bootstrap, spec.name) == 3
    assert verify_partitions(kafka_bootstrap, specs) == []


@pytest.mark.broker
def test_configs_are_as_declared(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    specs = topic_specs(partitions=2, prefix=fresh_topic_prefix)
    create_topics(kafka_bootstrap, partitions=2, prefix=fresh_topic_prefix)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resources = [ConfigResource(ConfigResource.Type.TOPIC, spec.name) for spec in specs]
    described = admin.describe_configs(resources, request_timeout=30)
    for spec, resource in zip(specs, resources, strict=True):
        entries = described[resource].result()
        assert entries["cleanup.policy"].value == spec.cleanup_policy
        assert entries["retention.ms"].value == str(spec.retention_ms)
        assert topic_configs(kafka_bootstrap, spec.name)["retention.ms"] == str(spec.retention_ms)
    retention = {spec.name.removeprefix(fresh_topic_prefix): spec.retention_ms for spec in specs}
    assert retention[DEAD_LETTERS] > retention[TASK_CHECKPOINTS]


@pytest.mark.broker
def test_existing_topics_are_kept_and_mismatches_reported(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    create_topics(kafka_bootstrap, partitions=2, prefix=fresh_topic_prefix)
    assert create_topics(kafka_bootstrap, partitions=4, prefix=fresh_topic_prefix) == []
    declared = topic_specs(partitions=4, prefix=fresh_topic_prefix)
    problems = verify_partitions(kafka_bootstrap, declared)
    assert len(problems) == len(declared)
    assert all("has 2 partitions, declared 4" in problem for problem in problems)


@pytest.mark.broker
def test_other_creation_errors_are_raised(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    with pytest.raises(KafkaException, match=r"(?i)replication"):
        create_topics(kafka_bootstrap, partitions=1, replication=1000, prefix=fresh_topic_prefix)


@pytest.mark.broker
def test_missing_topic_has_no_partition_count(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    with pytest.raises(KeyError):
        partition_count(kafka_bootstrap, fresh_topic_prefix + "absent")
    assert verify_partitions(kafka_bootstrap, topic_specs(prefix=fresh_topic_prefix))


@pytest.mark.parametrize(("partitions", "replication"), [(0, 1), (1, 0)])
def test_counts_must_be_positive(partitions: int, replication: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        topic_specs(partitions=partitions, replication=replication)


@pytest.mark.broker
def test_every_partition_is_served_when_creation_returns_on_a_fresh_broker() -> None:
    """A fresh broker publishes a new partition's leader about a second before it serves it (measured:
    NOT_LEADER on every fresh broker); a produce in that second can lose records (`wait_until_served`).
    The first creation on a fresh broker is where the window is widest."""
    with embedded_kafka() as bootstrap:
        specs = topic_specs(partitions=16, prefix="served.")
        create_topics(bootstrap, partitions=16, prefix="served.")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        asked = {TopicPartition(spec.name, p): OffsetSpec.latest() for spec in specs for p in range(16)}
        answers = admin.list_offsets(asked, request_timeout=30)
        refused = []
        for tp, future in answers.items():
            try:
                future.result()
            except KafkaException as exc:
                refused.append(f"{tp.topic}[{tp.partition}]: {exc.args[0].name()}")
        del admin, answers  # no client outlives the broker (it would log refused connections)
        assert refused == [], f"{len(refused)} of {len(asked)} partitions not served: {refused[:5]}"


class _Admin:
    """`AdminClient`'s metadata and ListOffsets, answered from a script: each partition's errors in
    turn (an error code, or None for an answer), the last one repeated."""

    def __init__(self, script: dict[int, list[int | None]]) -> None:
        self.script = script
        self.asked: list[list[int]] = []

    def list_topics(self, timeout: float) -> Any:
        partitions = {p: SimpleNamespace(id=p, leader=1) for p in self.script}
        return SimpleNamespace(topics={"t": SimpleNamespace(partitions=partitions, error=None)})

    def list_offsets(
        self, asked: dict[TopicPartition, Any], request_timeout: float
    ) -> dict[TopicPartition, Any]:
        self.asked.append(sorted(tp.partition for tp in asked))
        answers = {}
        for tp in asked:
            code = (
                self.script[tp.partition].pop(0)
                if len(self.script[tp.partition]) > 1
                else self.script[tp.partition][0]
            )
            future: Future[Any] = Future()
            if code is None:
                future.set_result(SimpleNamespace(offset=0))
            else:
                future.set_exception(KafkaException(KafkaError(code)))
            answers[tp] = future
        return answers


def test_waits_for_each_partition_its_leader_does_not_serve_yet_and_asks_only_for_those() -> None:
    admin = _Admin(
        {0: [None], 1: [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.UNKNOWN_LEADER_EPOCH, None]}
    )
    wait_until_served(admin, ["t"], timeout=10)  # type: ignore[arg-type]
    assert admin.asked == [[0, 1], [1], [1]]


def test_a_partition_never_served_times_out_naming_it() -> None:
    admin = _Admin({0: [None], 1: [KafkaError.NOT_LEADER_FOR_PARTITION]})
    with pytest.raises(TimeoutError, match=r"not served by their leader after 0.3 s: t\[1\]$"):
        wait_until_served(admin, ["t"], timeout=0.3)  # type: ignore[arg-type]


def test_an_error_that_waiting_cannot_cure_is_raised() -> None:
    admin = _Admin({0: [KafkaError.TOPIC_AUTHORIZATION_FAILED]})
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        wait_until_served(admin, ["t"], timeout=10)  # type: ignore[arg-type]
