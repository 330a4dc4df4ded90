"""Topic declarations against a real broker: idempotent creation, partitions and configs as declared."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from straggler.kafka.topics import (
    DEAD_LETTERS,
    TASK_CHECKPOINTS,
    create_topics,
    partition_count,
    topic_configs,
    topic_specs,
    verify_partitions,
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
