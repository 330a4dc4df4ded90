"""The pipeline's topics, declared once with partitions, replication, retention and cleanup policy.

Why explicit: the broker runs with ``auto.create.topics.enable=false``, so a typo in a topic name fails
loudly instead of silently creating a one-partition topic, and the partition count (the unit of
parallelism and of per-key ordering) is decided here rather than by whichever client wrote first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from straggler.kafka.config import admin_config

TASK_CHECKPOINTS = "task-checkpoints"
JOB_EVENTS = "job-events"
STRAGGLER_PREDICTIONS = "straggler-predictions"
RELAUNCH_COMMANDS = "relaunch-commands"
DEAD_LETTERS = "dead-letters"
MITIGATION_NOTES = "mitigation-notes"

DEFAULT_PARTITIONS = 8
DEFAULT_REPLICATION = 1
_DAY_MS = 24 * 60 * 60 * 1000
ADMIN_TIMEOUT_S = 30.0
NOT_SERVED_YET = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.REPLICA_NOT_AVAILABLE,
    }
)
"""A partition's errors while its leader is still making it (librdkafka does not mark them retriable)."""


@dataclass(frozen=True)
class TopicSpec:
    """One topic as the pipeline needs it to be."""

    name: str
    partitions: int
    replication: int
    retention_ms: int
    cleanup_policy: str
    key: str
    """What the record key is: records with one key land in one partition, in order."""
    description: str

    def configs(self) -> dict[str, str]:
        """Topic-level configs, as CreateTopics and DescribeConfigs spell them."""
        return {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms)}

    def new_topic(self) -> NewTopic:
        return NewTopic(
            self.name,
            num_partitions=self.partitions,
            replication_factor=self.replication,
            config=self.configs(),
        )


def topic_specs(
    partitions: int = DEFAULT_PARTITIONS, replication: int = DEFAULT_REPLICATION, prefix: str = ""
) -> tuple[TopicSpec, ...]:
    """Every topic of the pipeline. ``prefix`` namespaces them (one environment or test per prefix)."""
    if partitions < 1 or replication < 1:
        raise ValueError(f"partitions and replication must be >= 1, got {partitions} and {replication}")
    week = 7 * _DAY_MS

    def spec(name: str, retention_ms: int, key: str, description: str) -> TopicSpec:
        return TopicSpec(prefix + name, partitions, replication, retention_ms, "delete", key, description)

    return (
        spec(TASK_CHECKPOINTS, week, "job id", "features of a job's running tasks at each checkpoint"),
        spec(JOB_EVENTS, week, "job id", "task schedule/finish events as the trace replays them"),
        spec(STRAGGLER_PREDICTIONS, week, "job id", "per-task straggler predictions at each checkpoint"),
        spec(RELAUNCH_COMMANDS, week, "job id", "relaunch decisions for predicted stragglers"),
        spec(DEAD_LETTERS, 30 * _DAY_MS, "source topic key", "records no stage could process, kept longer"),
        spec(MITIGATION_NOTES, week, "job id", "why a flagged task got no command (for people: the view)"),
    )


def create_topics(
    bootstrap: str,
    partitions: int = DEFAULT_PARTITIONS,
    replication: int = DEFAULT_REPLICATION,
    *,
    prefix: str = "",
) -> list[str]:
    """Create the topics that do not exist yet; return the names created (empty when all existed).

    An existing topic is left as it is (TOPIC_ALREADY_EXISTS is expected); any other error is raised.
    """
    return create_missing_topics(
        bootstrap, [spec.new_topic() for spec in topic_specs(partitions, replication, prefix)]
    )


def create_missing_topics(bootstrap: str, topics: Sequence[NewTopic]) -> list[str]:
    """Create each of ``topics`` unless it exists; return the names created, once every partition of
    ``topics`` is served by its leader (`wait_until_served`; a create request completes before then,
    and a produce right after can be refused or, worse, lost). Existing topics are left as they are;
    any error other than TOPIC_ALREADY_EXISTS is raised."""
    admin = AdminClient(admin_config(bootstrap))
    futures = admin.create_topics(
        list(topics), operation_timeout=ADMIN_TIMEOUT_S, request_timeout=ADMIN_TIMEOUT_S
    )
    created: list[str] = []
    for topic in topics:
        try:
            futures[topic.topic].result()
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise
        created.append(topic.topic)
    wait_until_led(admin, [topic.topic for topic in topics])
    wait_until_served(admin, [topic.topic for topic in topics])
    return created


def wait_until_led(admin: AdminClient, names: Sequence[str], timeout: float = ADMIN_TIMEOUT_S) -> None:
    """Until each topic of ``names`` is in the metadata with a leader for every partition; raises
    TimeoutError naming those still missing."""
    deadline = time.monotonic() + timeout
    missing = list(names)
    while True:
        metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
        missing = [name for name in names if not _led(metadata.topics.get(name))]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if missing:
        raise TimeoutError(f"topics without a leader after {timeout:g} s: {', '.join(missing)}")


def wait_until_served(admin: AdminClient, names: Sequence[str], timeout: float = ADMIN_TIMEOUT_S) -> None:
    """Until every partition of ``names`` answers a ListOffsets request from its leader; raises
    TimeoutError naming those that still do not.

    Why the metadata is not enough: a KRaft broker publishes a new partition's leader in its metadata
    before its replica manager has made the partition, and refuses a produce in between (NOT_LEADER).
    On a fresh broker that lasts about a second after the create request returns. For an idempotent
    librdkafka producer a refusal there can lose records with a success report: when the first
    request to a partition is refused and the next, already in flight, is taken (a broker takes any
    first sequence from a producer it has no state for), librdkafka counts the first request's
    records as delivered. The suite lost a job's first checkpoints on fresh topics of a fresh broker,
    as this would.
    """
    deadline = time.monotonic() + timeout
    metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    pending = [TopicPartition(name, p) for name in names for p in sorted(metadata.topics[name].partitions)]
    while True:
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in pending}, request_timeout=ADMIN_TIMEOUT_S
        )
        pending = [tp for tp, future in futures.items() if not _answered(future)]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if pending:
        named = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in pending)
        raise TimeoutError(f"partitions not served by their leader after {timeout:g} s: {named}")


def _answered(future: Any) -> bool:
    """The partition's leader answered; False while it is not ready (`NOT_SERVED_YET`), else raises."""
    try:
        future.result()
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError) and (error.retriable() or error.code() in NOT_SERVED_YET):
            return False
        raise
    return True


def _led(topic: Any) -> bool:
    return topic is not None and topic.error is None and all(p.leader >= 0 for p in topic.partitions.values())


def partition_count(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has on the broker (KeyError if it does not exist)."""
    admin = AdminClient(admin_config(bootstrap))
    metadata = admin.list_topics(topic=topic, timeout=ADMIN_TIMEOUT_S)
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        raise KeyError(f"topic {topic!r} does not exist on {bootstrap}")
    return len(described.partitions)


def missing_topics(bootstrap: str, topics: Sequence[str]) -> list[str]:
    """Those of ``topics`` the broker does not have (in their order)."""
    admin = AdminClient(admin_config(bootstrap))
    return absent_from(admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics, topics)


def absent_from(listed: Mapping[str, Any], topics: Sequence[str]) -> list[str]:
    """Those of ``topics`` a metadata answer (``ClusterMetadata.topics``) lacks, or gives with an error
    or without partitions (in their order)."""
    return [t for t in topics if t not in listed or listed[t].error is not None or not listed[t].partitions]


def create_command(bootstrap: str, prefix: str) -> str:
    """The command that creates the pipeline's topics on ``bootstrap`` under ``prefix``."""
    named = f" --topic-prefix {prefix}" if prefix else ""
    return f"straggler topics create --bootstrap {bootstrap}{named}"


def missing_line(stage: str, bootstrap: str, missing: Sequence[str], prefix: str) -> str:
    """What a stage says, once, while topics it needs are missing: which, and the command that
    creates them."""
    return (
        f"{stage}: topic(s) {', '.join(missing)} missing on {bootstrap}; create them with "
        f"`{create_command(bootstrap, prefix)}` (waiting for them)"
    )


def wait_for_topics(
    stage: str,
    bootstrap: str,
    topics: Sequence[str],
    prefix: str,
    say: Callable[[str], None],
    *,
    every: float = 2.0,
    stopped: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], None] = time.sleep,
    missing: Callable[[str, Sequence[str]], list[str]] | None = None,
    then: Callable[[str], None] | None = None,
) -> bool:
    """Wait until the broker has every one of ``topics``, saying once (``say``, `missing_line`) which
    are missing and the command that creates them, and when they came (``then``, else ``say``);
    False if ``stopped`` first."""
    find = missing_topics if missing is None else missing
    said = False
    while not stopped():
        try:
            absent = find(bootstrap, topics)
        except KafkaException:  # the broker is away for a moment: ask again (its clients say so)
            sleep(every)
            continue
        if not absent:
            if said:
                (then or say)(f"{stage}: the topics exist now")
            return True
        if not said:
            say(missing_line(stage, bootstrap, absent, prefix))
            said = True
        sleep(every)
    return False


def verify_partitions(bootstrap: str, specs: Sequence[TopicSpec]) -> list[str]:
    """Mismatches between the declared and the actual partition counts (empty when all agree).

    Why: ``create_topics`` tolerates an existing topic, which may have been made with another count;
    keyed ordering and consumer parallelism silently change when it differs.
    """
    problems: list[str] = []
    for spec in specs:
        try:
            actual = partition_count(bootstrap, spec.name)
        except KeyError as exc:
            problems.append(str(exc.args[0]))
            continue
        if actual != spec.partitions:
            problems.append(f"topic {spec.name!r} has {actual} partitions, declared {spec.partitions}")
    return problems


def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    """The effective configuration of one topic, as the broker describes it."""
    admin = AdminClient(admin_config(bootstrap))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    futures = admin.describe_configs([resource], request_timeout=ADMIN_TIMEOUT_S)
    entries = futures[resource].result()
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}
