"""When the worker acknowledges its input records: at a group commit, every `COMMIT_SECONDS`.

The worker applies each record to its job in memory (`pipeline.jobstore.JobStore`) and sends what it
asks for (predictions, dead letters, forwards) at once, but acknowledges nothing yet. Every
`COMMIT_SECONDS`, or once the input pauses, `GroupCommit.commit` makes the changes so far durable and
hands out the records they cover; the worker acknowledges them, and Faust commits their offsets.
No record is handled while a commit runs (the worker holds a lock around both).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pipeline.jobstore import JobStore, Position

COMMIT_SECONDS = 0.5
"""How often the worker commits while records arrive; a pause in the input is committed at once."""


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


@dataclass
class GroupCommit:
    """The input records handled and not acknowledged yet, and the commit that releases them."""

    store: JobStore
    waiting_for_start: Callable[[], set[Position]] = set
    """The records whose job has not started (`JobEventHandler.waiting_for_start`): their changes
    are not applied yet, so no commit covers them."""
    interval: float = COMMIT_SECONDS
    clock: Callable[[], float] = time.monotonic
    _handled: list[InputRecord] = field(default_factory=list)
    _last_commit: float = field(default=float("-inf"))
    _generation: int = 0
    """Counts `release_unacknowledged` calls: a commit during which partitions moved hands out nothing."""

    def handled(self, record: InputRecord) -> None:
        """The worker has handled ``record``: the next commit covers it."""
        self._handled.append(record)

    def due(self) -> bool:
        """Whether records wait for a commit and the last one is `interval` ago."""
        return bool(self._handled) and self.clock() - self._last_commit >= self.interval

    def release_unacknowledged(self) -> None:
        """Partitions are about to be revoked (or the consumer stops): the worker releases every
        record not acknowledged (the next owner reads them again) and the store forgets their changes."""
        self._handled.clear()
        self._generation += 1

    async def commit(self, flush: Callable[[], Awaitable[None]]) -> list[InputRecord]:
        """Make every change so far durable; return the records it covers, to acknowledge.

        ``flush`` returns once the broker has everything sent so far, on every topic. A killed
        worker may leave any prefix of these steps; the records after its last committed offset are
        then read again onto the tables, and each step says why that recovers exactly:

        1. everything sent is on the broker: predictions, dead letters, forwarded records, and each
           refit's model (under a version key no durable job row names yet). Killed before, the
           records read again send them again (the mitigation consumer acts on a checkpoint's
           first marker only, and a forward's copy repeats observations, which change nothing);
        2. the changed job rows are written and on the broker: each commits its job's checkpoints
           up to its last evaluated one, the model version it names (durable since 1) and the flags
           raised since the job's last task row. A boundary read again is then ignored;
        3. the changed tasks are written, one row per job, and on the broker. Killed between 2 and
           3, the records read again rebuild them: an observation applied again changes nothing,
           and a task row never holds a change from after its job row (nothing is handled meanwhile);
        4. the models the durable job rows no longer name are deleted;
        5. the records handled before 1 are handed out to be acknowledged, but those still waiting
           for their job's start and those behind them in their partition (`held_back`).
        """
        records, self._handled, generation = self._handled, [], self._generation
        self._last_commit = self.clock()
        try:
            await flush()  # 1
            written = self.store.write_job_rows()  # 2
            await flush()
            self.store.write_task_rows()  # 3
            await flush()
        except BaseException:
            self._handled[:0] = records  # for the next commit
            raise
        self.store.retire_models(written)  # 4
        if generation != self._generation:
            return []  # released meanwhile: the partitions' next owners read them again
        held = held_back(records, self.waiting_for_start())  # 5
        self._handled = [r for r in records if r.position in held] + self._handled
        return [r for r in records if r.position not in held]


def held_back(records: list[InputRecord], waiting: set[Position]) -> set[Position]:
    """The records not to acknowledge yet: those waiting for their job's start, and every record at a
    later offset of the same partition.

    Faust commits a partition up to the end of the first run of consecutive acknowledged offsets,
    checking it against the committed offset only when there is one and allowing one offset between
    them: a record acknowledged behind a waiting one could carry the commit past it, and a worker
    killed before the job's start arrived would then lose the waiting record."""
    first: dict[tuple[str, int], int] = {}
    for topic, partition, offset in waiting:
        first[(topic, partition)] = min(offset, first.get((topic, partition), offset))
    return {
        r.position
        for r in records
        if (r.topic, r.partition) in first and r.offset >= first[(r.topic, r.partition)]
    }
