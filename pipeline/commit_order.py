"""When the worker may acknowledge an input record, and the order in which a checkpoint is committed.

A job's task changes are written as one row at its checkpoints, not one row per record
(`pipeline.jobstore`), so a record's offset may be committed only once the row holding its changes
is written. `CommitOrder` keeps the records received and not yet acknowledged, per input partition in
offset order (Faust commits a partition's highest contiguous acknowledged offset), and hands out
each partition's leading records that nothing waits for any more. A record waits while its job's
changes from it are not written (`JobStore.holder`) or while it waits for its job's start
(`JobEventHandler.waits_for_start`). A job that holds a record longer than ``hold_seconds`` has its
changes written without waiting for its checkpoint.

`CommitOrder.checkpoint` writes a checkpoint in the order that lets a killed worker recover exactly.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from pipeline.jobstore import JobMeta, JobStore, Position
from straggler.core.online import Decision

HOLD_SECONDS = 2.0
"""How long a record may wait for its job's next checkpoint before the job's changes are written."""
IDLE_SECONDS = 0.25
"""Once no record has arrived for this long the input has paused: every waiting job is written then,
so a pause (or the end of a replay) makes everything durable at once, not after `HOLD_SECONDS`."""


@dataclass(frozen=True)
class Acknowledge:
    """Wait until everything sent so far, on every topic, is acknowledged by the broker."""


ACKNOWLEDGE = Acknowledge()
Send = TypeVar("Send")


@dataclass(frozen=True)
class InputRecord:
    """One record of the agent's input topics, as it arrived."""

    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int

    @property
    def position(self) -> Position:
        return (self.topic, self.partition, self.offset)


@dataclass(eq=False)
class _Received:
    record: InputRecord
    received: float
    generation: int
    handled: bool = False


@dataclass
class CommitOrder:
    """The input records not acknowledged yet, and the commit order of the store's checkpoints."""

    store: JobStore
    waits_for_start: Callable[[Position], str | None] = lambda position: None
    """The job whose start a record waits for, if any (`JobEventHandler.waits_for_start`)."""
    clock: Callable[[], float] = time.monotonic
    hold_seconds: float = HOLD_SECONDS
    idle_seconds: float = IDLE_SECONDS
    _partitions: dict[tuple[str, int], deque[_Received]] = field(default_factory=dict)
    _in_hand: _Received | None = None
    _generation: int = 0
    _last_received: float = float("-inf")

    def received(self, record: InputRecord) -> None:
        """The worker starts handling ``record``."""
        entry = _Received(record, self.clock(), self._generation)
        self._last_received = entry.received
        self._partitions.setdefault((record.topic, record.partition), deque()).append(entry)
        self._in_hand = entry

    def handled(self, record: InputRecord) -> bool:
        """The worker is done handling ``record``; False if its partition was let go meanwhile (the
        worker gives it up, unacknowledged: the partition's next owner reads it again)."""
        entry, self._in_hand = self._in_hand, None
        assert entry is not None and entry.record is record, "one record is handled at a time"
        entry.handled = True
        return entry.generation == self._generation

    def acknowledgeable(self) -> list[InputRecord]:
        """Take each partition's leading records that are handled and wait for nothing, in offset
        order: the worker acknowledges them, and Faust may commit their offsets."""
        records = []
        for entries in self._partitions.values():
            while entries and entries[0].handled and self._waits_for(entries[0].record) is None:
                records.append(entries.popleft().record)
        return records

    def let_go(self) -> list[InputRecord]:
        """Partitions are about to move: give up every record received but the one in hand (`handled`
        tells). None is acknowledged: the next owner reads them again and rebuilds their jobs from
        the tables (an observation applied twice changes nothing)."""
        self._generation += 1
        records = [
            e.record for entries in self._partitions.values() for e in entries if e is not self._in_hand
        ]
        self._partitions.clear()
        return records

    def _waits_for(self, record: InputRecord) -> str | None:
        return self.store.holder(record.position) or self.waits_for_start(record.position)

    def overdue(self, partition: int | None = None) -> dict[str, InputRecord]:
        """Each job whose unwritten changes hold a record (of ``partition``, or any) longer than
        ``hold_seconds`` (any record, once the input paused), with one such record: the job's
        changes are written within that record's partition. None while a record is in hand, unless
        ``partition`` is the in-hand record's."""
        if partition is None and self._in_hand is not None:
            return {}
        now = self.clock()
        deadline = now if now - self._last_received >= self.idle_seconds else now - self.hold_seconds
        jobs: dict[str, InputRecord] = {}
        for (_, p), entries in self._partitions.items():
            if partition is not None and p != partition:
                continue
            if not entries or entries[0].received > deadline or self._waits_for(entries[0].record) is None:
                continue
            for entry in entries:
                if entry.received > deadline:
                    break
                job_id = self.store.holder(entry.record.position)
                if job_id is not None and self.store.has_changes(job_id):
                    jobs.setdefault(job_id, entry.record)
        return jobs

    def write_held(self, job_id: str) -> bool:
        """Write the job's changes now (the timer's, for `overdue`), unless a record is in hand or the
        job's last job row may not be on the broker yet (`flush` first)."""
        if self._in_hand is not None or self.store.awaiting_acknowledgement(job_id):
            return False
        self.store.write_changes(job_id)
        return True

    def write_overdue(self, partition: int) -> Iterator[Acknowledge]:
        """Write the jobs that hold records of ``partition`` too long (`overdue`); the worker calls it
        after each record, whose table writes go to that partition's changelogs."""
        for job_id in self.overdue(partition):
            yield from self.before_write(job_id)
            self.store.write_changes(job_id)

    def flush(self) -> Iterator[Acknowledge]:
        """Wait for everything written so far; the job rows among it are then on the broker."""
        rows = self.store.unacknowledged()
        yield ACKNOWLEDGE
        self.store.acknowledged(rows)

    def before_write(self, job_id: str) -> Iterator[Acknowledge]:
        """Before any write of a job, its last job row must be on the broker (step 6 of `checkpoint`)."""
        if self.store.awaiting_acknowledgement(job_id):
            yield from self.flush()

    def checkpoint(
        self,
        job_id: str,
        at: float,
        evaluate: Callable[[], list[Decision]],
        publish: Callable[[list[Decision]], Iterator[Send]],
    ) -> Generator[Send | Acknowledge, None, tuple[list[Decision], JobMeta]]:
        """Evaluate the job's checkpoint at ``at`` and commit it; the decisions, and the job row.

        A killed worker may leave any prefix of these steps; each line says why recovery is exact:

        1. the job's previous job row is on the broker (`before_write`), so nothing below is written
           while the checkpoint before may still be lost;
        2. ``evaluate`` (`JobStore.evaluate`): a refit's model is written under a new version key,
           which no job row names yet; lost here, the boundary is read again and evaluated again;
        3. ``publish`` sends the predictions;
        4. everything so far is on the broker (`flush`): the model the job row will name exists;
        5. the job row (`JobStore.record_evaluation`) commits the checkpoint: its model version and
           flags (they reach a task row with the job's next write). A rebuild trusts it alone, so a
           checkpoint without it is evaluated again, to the same decisions, and its predictions are
           sent again (the mitigation consumer acts on a checkpoint's first marker only);
        6. the job row is acknowledged by the next flush, which any later write of the job waits for
           (step 1 of its next checkpoint, `before_write`); only then are older models deleted;
        7. the boundary record is acknowledged once handled (`acknowledgeable`): after the job row.
        """
        yield from self.before_write(job_id)  # 1
        job, meta = self.store.job(job_id), self.store.meta(job_id)  # the cached pair, kept current below
        assert job is not None and meta is not None
        decisions = evaluate()  # 2
        yield from publish(decisions)  # 3
        yield from self.flush()  # 4
        self.store.record_evaluation(at, job, meta)  # 5 (6, 7: later)
        return decisions, meta
