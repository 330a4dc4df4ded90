"""Where a job's input record belongs, whatever partitioner its producer used (pure, no client library).

The pipeline's topics are co-partitioned by murmur2 of the job id (`straggler.core.partitioner`): the
worker's timer writes a live job's boundaries there, its tables keep the job's state there, and the
mitigation consumer joins a job's predictions with its task events there. A foreign producer (kcat and
other librdkafka clients default to CRC32, ``consistent_random``) may put a job's records elsewhere.
`route` decides, per record, from its key, its job id and the partition it arrived on:

- `Process`: the record is where murmur2 puts its job (all our own producers: no extra record);
- `Forward`: the worker copies it, unchanged bytes and key, to ``partition`` of the same topic before
  any state is touched, and consumers of the inputs skip the misplaced original;
- `Reject`: it has no key, or a key other than its job id; Kafka then keeps no order among the job's
  records (they are spread over partitions), and a re-keying could not restore it, so the worker
  dead-letters it with ``reason`` rather than predict from misordered events.
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


def is_home(key: bytes | None, job_id: str, partition: int, n_partitions: int) -> bool:
    """Whether a consumer of the inputs should read this record (the agent handles it here too)."""
    return isinstance(route(key, job_id, partition, n_partitions), Process)
