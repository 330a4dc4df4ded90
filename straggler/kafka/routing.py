"""Where a job's input record belongs, whatever partitioner its producer used (pure, no client library).

The pipeline's topics are co-partitioned by murmur2 of the job id (`straggler.core.partitioner`); a
foreign producer (librdkafka's default CRC32) may put a job's records elsewhere. `route` decides per
record: `Process` (it is on its job's partition), `Forward` (copy it unchanged to ``partition``;
consumers skip the original) or `Reject` (no key, or not the job id: dead-lettered with ``reason``,
as the job's order is lost).

Details: docs/stream-protocol.md, "Records on another partition (foreign producers)".
"""

from __future__ import annotations

from dataclasses import dataclass

from straggler.core.partitioner import partition_of


@dataclass(frozen=True)
class Process:
    """The record is on its job's partition: handle it here."""


@dataclass(frozen=True)
class Forward:
    """The record belongs on ``partition`` of the same topic: copy it there, do nothing else."""

    partition: int


@dataclass(frozen=True)
class Reject:
    """The record cannot be placed in its job's order: dead-letter it with ``reason``."""

    reason: str


Route = Process | Forward | Reject


def route(key: bytes | None, job_id: str, partition: int, n_partitions: int) -> Route:
    """Where a record of ``job_id`` with ``key`` that arrived on ``partition`` is handled."""
    if key is None:
        return Reject(
            f"record of job {job_id!r} has no key: key every record by its job id "
            "(e.g. kcat -K or -k), so Kafka keeps a job's records in order"
        )
    if key != job_id.encode():
        shown = key.decode("utf-8", "backslashreplace")
        return Reject(
            f"record key {shown!r} is not its job id {job_id!r}: key every record by its job id, "
            "so Kafka keeps a job's records in order"
        )
    home = partition_of(job_id, n_partitions)
    return Process() if partition == home else Forward(home)


def is_on_job_partition(key: bytes | None, job_id: str, partition: int, n_partitions: int) -> bool:
    """Whether the record is on its job's partition, so a consumer of the inputs reads it here (the
    agent handles it here too); else it is forwarded or dead-lettered."""
    return isinstance(route(key, job_id, partition, n_partitions), Process)
