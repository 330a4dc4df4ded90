"""Where Kafka puts a keyed record: the Java client's (and Faust's, and our producers') murmur2 partitioner.

Pure Python, no client library: the core (e.g. collaborative ADMM's nodes = partitions) and the tests
use it to know a job's partition without asking a broker.
"""

from __future__ import annotations


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (32-bit, seed 0x9747b28c), as an unsigned int."""
    m = 0x5BD1E995
    h = (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    tail = len(data) & ~3
    for i in range(0, tail, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * m) & 0xFFFFFFFF
        k = ((k ^ (k >> 24)) * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = data[tail:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h = ((h ^ rest[0]) * m) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


def partition_of(job_id: str, n_partitions: int) -> int:
    """The partition Kafka's murmur2 partitioner gives a record keyed by ``job_id`` (UTF-8)."""
    if n_partitions < 1:
        raise ValueError(f"n_partitions must be >= 1, got {n_partitions}")
    return (murmur2(job_id.encode()) & 0x7FFFFFFF) % n_partitions
