"""End offsets of partitions, asked again while a just-created topic elects its leaders.

Right after a topic is created, or while a broker restarts, a lookup can fail with a retriable error
or a "no leader yet" code. Those are asked again until a deadline; any other error is raised, and so
is a leader that never comes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

LEADERLESS = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
    }
)
"""Codes that mean "no leader known yet" rather than a refusal."""

PAUSE_SECONDS = 0.2


def not_ready(exc: KafkaException) -> bool:
    """Whether a failed lookup is worth asking again (the partition's leader may come)."""
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in LEADERLESS)


def end_offset(consumer: Consumer, partition: TopicPartition, timeout: float) -> int:
    """The partition's high watermark, asked again while it is not ready, for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(deadline - time.monotonic(), 0.1)
        try:
            return int(consumer.get_watermark_offsets(partition, timeout=left, cached=False)[1])
        except KafkaException as exc:
            if not not_ready(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(PAUSE_SECONDS)


def end_offsets(consumer: Consumer, topic: str, partitions: Sequence[int], timeout: float) -> dict[int, int]:
    """Each partition's end offset, in one request (the latest offset as the consumer's isolation
    level sees it); a partition without an answer is asked alone, with `end_offset`."""
    asked = [TopicPartition(topic, p, OFFSET_END) for p in partitions]
    try:
        answered = consumer.offsets_for_times(asked, timeout=timeout)
    except KafkaException:
        answered = []
    ends = {tp.partition: tp.offset for tp in answered if tp.error is None and tp.offset >= 0}
    for p in partitions:
        if p not in ends:
            ends[p] = end_offset(consumer, TopicPartition(topic, p), timeout)
    return {p: ends[p] for p in partitions}
