"""Where a job's input record is handled, whatever partitioner produced it (`straggler.kafka.routing`),
and the mitigation fold skipping what the worker forwards (no broker)."""

from __future__ import annotations

import zlib

from consumers.fold import MitigationState
from schemas import CheckpointBoundary, JobEvent, TaskCheckpoint, encode
from straggler.core.partitioner import partition_of
from straggler.kafka.routing import Forward, Process, Reject, is_on_job_partition, route

N = 8


def crc32_partition(job_id: str, n: int = N) -> int:
    """librdkafka's default (``consistent_random``) partition of a keyed record, e.g. kcat's."""
    return zlib.crc32(job_id.encode()) % n


def test_a_record_on_its_murmur2_partition_is_processed_where_it_is() -> None:
    for job_id in ("a", "golf-7", "job-123", "ü-utf8"):
        assert route(job_id.encode(), job_id, partition_of(job_id, N), N) == Process()


def test_a_misplaced_record_is_forwarded_to_its_murmur2_partition() -> None:
    job_id = "golf-7"
    home, foreign = partition_of(job_id, N), crc32_partition(job_id)
    assert home != foreign, "the example must be one that kcat misplaces"
    assert route(job_id.encode(), job_id, foreign, N) == Forward(home)
    for p in range(N):
        decision = route(job_id.encode(), job_id, p, N)
        assert decision == (Process() if p == home else Forward(home))
    # the forwarded copy is processed where it lands: one hop, never a loop
    assert route(job_id.encode(), job_id, home, N) == Process()


def test_records_without_their_job_id_as_key_are_rejected_with_the_reason() -> None:
    job_id = "golf-7"
    home = partition_of(job_id, N)
    keyless = route(None, job_id, home, N)
    assert isinstance(keyless, Reject) and "no key" in keyless.reason and "golf-7" in keyless.reason
    other = route(b"task-3", job_id, home, N)
    assert isinstance(other, Reject) and "'task-3' is not its job id 'golf-7'" in other.reason
    assert not is_on_job_partition(None, job_id, home, N)
    assert is_on_job_partition(job_id.encode(), job_id, home, N)


def test_the_mitigation_fold_reads_a_job_event_once_where_the_worker_puts_it() -> None:
    """A misplaced original is skipped, its forwarded copy on the home partition is folded."""
    job_id = "golf-7"
    home, foreign = partition_of(job_id, N), crc32_partition(job_id)
    finished = TaskCheckpoint(
        job_id=job_id,
        task_id="t0",
        attempt=0,
        checkpoint_time=100.0,
        status="finished",
        machine_id="m",
        features={"cpu": 1.0},
        latency=50.0,
    )
    boundary = CheckpointBoundary(job_id=job_id, checkpoint_time=120.0, checkpoint_index=1, produced_at=1.0)
    ended = JobEvent(job_id=job_id, event="ended", time=120.0)
    key = job_id.encode()
    state = MitigationState("unlimited", 60.0, partitions=N)
    for event, topic in ((finished, "tc"), (boundary, "tc"), (ended, "je")):
        assert state.process(encode(event), topic, foreign, 0, key) == []
    assert state.active_jobs == frozenset()  # nothing of the misplaced originals was folded
    copies: tuple[tuple[TaskCheckpoint | CheckpointBoundary, str], ...] = ((finished, "tc"), (boundary, "tc"))
    for offset, (forwarded, topic) in enumerate(copies):
        state.process(encode(forwarded), topic, home, offset, key)
    assert state.active_jobs == {job_id}
    job = state._jobs[job_id]
    assert job.watermark == 120.0 and [end.task_id for end in job.finishes] == ["t0"]
    # without a partition count (the fold's tests, single partitions) every record is folded
    unchecked = MitigationState("unlimited", 60.0)
    unchecked.process(encode(finished), "tc", foreign, 0, None)
    assert unchecked.active_jobs == {job_id}
