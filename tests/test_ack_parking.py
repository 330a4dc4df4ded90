"""Waits for the broker without holding up other partitions, without a broker: a job that must wait
parks its partition (`JobEventHandler.park_acknowledgements`), the partition's later records queue
behind it, and the worker's group flush (`flush_started`, then `flush_done`) resumes every partition
parked before it began.

The group flush is a deferred fake: a test decides when each starts and ends. Every table write,
prediction and flush goes to one log, on which the write order of `pipeline.jobstore` is checked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from test_agent_handler import (
    PARTITIONS,
    acked,
    boundary,
    ended,
    evaluations,
    letters,
    running,
    some_finished,
    started,
)
from test_refit_offloop import OffLoopWorker, interleaved_jobs, parts_of

from pipeline.handler import (
    Acknowledge,
    Action,
    GroupFlush,
    InputRecord,
    RunRefit,
    SendPredictionPart,
    resume,
)
from pipeline.jobstore import SEPARATOR, JobMeta, JobStore
from schemas import JobEvent
from straggler.core.partitioner import partition_of

A, B, C = "a", "d", "c"  # on partitions 0, 1 and 2
SAME_AS_A = "b"  # on partition 0
Entry = tuple[Any, ...]


class LoggedTable(dict[bytes, bytes]):
    """A table that logs each write: ("write", table, job, the job row's last evaluated checkpoint,
    the partition of the record in hand, where Faust sends it)."""

    def __init__(self, name: str, log: list[Entry], routing: list[int | None]) -> None:
        super().__init__()
        self.name, self.log, self.routing = name, log, routing

    def __setitem__(self, key: bytes, value: bytes) -> None:
        evaluated = JobMeta.decode(value).last_evaluated if self.name == "jobs" else None
        self.log.append(("write", self.name, job_of(key), evaluated, self.routing[-1]))
        super().__setitem__(key, value)

    def __delitem__(self, key: bytes) -> None:
        self.log.append(("write", self.name, job_of(key), None, self.routing[-1]))
        super().__delitem__(key)


def job_of(key: bytes) -> str:
    return key.decode().split(SEPARATOR)[0]


class ParkingWorker(OffLoopWorker):
    """`OffLoopWorker` whose jobs park where they must wait for the broker (``park``, else they
    wait inline); the test starts and ends the group flushes."""

    def __init__(self, park: bool = True, offload: bool = False) -> None:
        super().__init__(offload=offload)
        self.log: list[Entry] = []
        self.routing: list[int | None] = [None]
        """The partition table writes go to (the record in hand's), innermost last."""
        self.tables = (
            LoggedTable("tasks", self.log, self.routing),
            LoggedTable("jobs", self.log, self.routing),
            LoggedTable("models", self.log, self.routing),
        )
        self.store = JobStore(*self.tables, make_job=self.store.make_job)
        self.handler.store = self.store
        self.handler.park_acknowledgements = park
        self.flushes = 0

    def perform(self, action: Action) -> None:
        """Log what the worker sends, and an inline wait for the broker as a flush started and ended."""
        if isinstance(action, SendPredictionPart):
            self.log.append(("prediction", action.key.decode()))
        elif isinstance(action, Acknowledge):
            flush = self.start_flush()
            self.log.append(("flush ended", flush))

    def send(self, record: InputRecord, perform: Callable[[Action], None] | None = None) -> list[Action]:
        def logged(action: Action) -> None:
            self.perform(action)
            if perform is not None:
                perform(action)

        with self.routed(record):
            return super().send(record, logged)

    @contextmanager
    def routed(self, record: InputRecord) -> Iterator[None]:
        self.routing.append(record.partition)
        try:
            yield
        finally:
            self.routing.pop()

    def _resume(self, resumed: Any) -> list[Action]:
        actions: list[Action] = []

        async def collect(action: Action) -> None:
            self.perform(action)
            actions.append(action)

        asyncio.run(resume(self.handler, resumed, collect, self.routed))
        return self._seen(actions)

    def complete(self, refit: RunRefit, error: BaseException | None = None) -> list[Action]:
        self.refits.remove(refit)
        if error is None:
            refit.fit()
        return self._resume(self.handler.refit_done(refit, error))

    def start_flush(self) -> GroupFlush:
        self.flushes += 1
        flush = self.handler.flush_started()
        self.log.append(("flush started", flush))
        return flush

    def end_flush(self, flush: GroupFlush, error: BaseException | None = None) -> list[Action]:
        """The flush ended: what resuming its parked partitions sent."""
        self.log.append(("flush ended", flush))
        return self._resume(self.handler.flush_done(flush, error))

    def flush(self) -> list[Action]:
        """One whole group flush (started and ended now)."""
        return self.end_flush(self.start_flush())

    def committed(self, job_id: str) -> float | None:
        """The last checkpoint the job row commits."""
        return JobMeta.decode(self.tables[1][job_id.encode()]).last_evaluated


def check_write_order(log: list[Entry]) -> int:
    """`pipeline.jobstore`'s order: a checkpoint's job row is written only after a flush that started
    after the job's earlier writes and predictions ended; after it, nothing of the job is written until
    a flush that started after it ended. Returns how many checkpoint rows it checked."""
    started: dict[int, int] = {}
    flushed: list[tuple[int, int]] = []  # (started at, ended at)
    last: dict[str, int] = {}  # job -> its last write or prediction
    row: dict[str, int] = {}  # job -> its checkpoint row not known to be on the broker yet
    evaluated: dict[str, float | None] = {}
    checked = 0

    def flushed_between(begin: int, end: int) -> bool:
        return any(begin < s and e < end for s, e in flushed)

    for i, entry in enumerate(log):
        kind = entry[0]
        if kind == "flush started":
            started[id(entry[1])] = i
        elif kind == "flush ended":
            flushed.append((started.pop(id(entry[1])), i))
        else:
            job = entry[-1] if kind == "prediction" else entry[2]
            if job in row:
                assert flushed_between(row[job], i), (
                    f"{entry} (log {i}) before the job row (log {row[job]}) was acknowledged"
                )
                del row[job]
            if kind == "write" and entry[1] == "jobs" and evaluated.get(job) != entry[3]:
                evaluated[job] = entry[3]
                if entry[3] is not None:
                    assert flushed_between(last.get(job, -1), i), (
                        f"checkpoint row (log {i}) before its writes were acknowledged"
                    )
                    row[job] = i
                    checked += 1
            last[job] = i
    return checked


def check_routing(log: list[Entry]) -> None:
    """Each write of a job goes to the job's own partition (its changelogs' partition)."""
    for entry in log:
        if entry[0] == "write":
            assert entry[4] == partition_of(entry[2], PARTITIONS), f"{entry} routed to another partition"


def jobs_with_tasks(*jobs: str) -> list[Any]:
    return [e for j in jobs for e in [started(j), *some_finished(j), running("r", 10.0, j)]]


def start_with_tasks(worker: ParkingWorker, *jobs: str) -> None:
    for event in jobs_with_tasks(*jobs):
        worker.feed(event)


def test_other_partitions_records_are_handled_and_predicted_while_a_job_waits_for_the_broker() -> None:
    worker = ParkingWorker()
    start_with_tasks(worker, A, B)

    actions = worker.feed(boundary(10.0, A))

    ((_, marker),) = evaluations(actions)
    assert marker.job_id == A and not [a for a in actions if isinstance(a, Acknowledge)]
    assert worker.handler.parked() and worker.committed(A) is None  # the job row waits for the flush
    flush = worker.start_flush()
    assert worker.feed(running("x", 15.0, A)) == []  # queued behind the parked partition
    ((verdicts, marker),) = evaluations(worker.feed(boundary(10.0, B)))
    assert marker.job_id == B and [p.task_id for p in verdicts] == ["r"]
    job_a = worker.store.job(A)
    assert job_a is not None and "x" not in job_a.state.tasks

    worker.end_flush(flush)

    assert worker.committed(A) == 10.0 and "x" not in job_a.state.tasks  # x waits for A's job row now
    assert worker.committed(B) is None, "B parked after the flush began: the next one resumes it"
    worker.flush()
    assert worker.committed(B) == 10.0 and "x" in job_a.state.tasks
    assert worker.flushes == 2 and check_write_order(worker.log) == 2


def test_one_flush_resumes_every_partition_parked_before_it_began() -> None:
    worker = ParkingWorker()
    start_with_tasks(worker, A, B, C)
    for job_id in (A, B, C):
        worker.feed(boundary(10.0, job_id))
    assert [worker.committed(job_id) for job_id in (A, B, C)] == [None] * 3

    assert worker.flush() == []

    assert [worker.committed(job_id) for job_id in (A, B, C)] == [10.0] * 3
    assert not worker.handler.parked() and worker.flushes == 1
    assert check_write_order(worker.log) == 3


def replay(worker: ParkingWorker, events: list[Any], flush_after: int | None, refit_after: int) -> None:
    """Feed ``events``; a group flush starts once a job parks and none runs, and ends ``flush_after``
    records later (None: once the input ends); a refit ends ``refit_after`` records after it began."""
    flight: tuple[GroupFlush, int] | None = None
    refits_from: dict[int, int] = {}

    def go_on(n: int, final: bool = False) -> None:
        nonlocal flight
        moved = True
        while moved:
            moved = False
            for refit in list(worker.refits):
                if final or n - refits_from.setdefault(id(refit), n) >= refit_after:
                    worker.complete(refit)
                    moved = True
            if flight is not None and (final or (flush_after is not None and n - flight[1] >= flush_after)):
                worker.end_flush(flight[0])
                flight, moved = None, True
            if flight is None and worker.handler.parked():
                flight = (worker.start_flush(), n)
                moved = flush_after == 0 or final

    for n, event in enumerate(events):
        worker.feed(event)
        go_on(n)
    go_on(len(events), final=True)
    assert not worker.handler.parked() and not worker.refits


def without_ends(events: list[Any]) -> list[Any]:
    return [e for e in events if not (isinstance(e, JobEvent) and e.event == "ended")]


def renamed(events: list[Any], job_id: str, to: str) -> list[Any]:
    return [replace(e, job_id=to) if e.job_id == job_id else e for e in events]


def markers_by_partition(actions: list[Action]) -> dict[int, list[tuple[str, float]]]:
    """The checkpoints each predictions partition gets, in order (the mitigation consumer relies on it)."""
    markers: dict[int, list[tuple[str, float]]] = {}
    for _, marker in evaluations(actions):
        where = partition_of(marker.job_id, PARTITIONS)
        markers.setdefault(where, []).append((marker.job_id, marker.checkpoint_time))
    return markers


@pytest.mark.parametrize("other", [B, SAME_AS_A])
@pytest.mark.parametrize("ends", [True, False])
@pytest.mark.parametrize(
    ("flush_after", "offload"), [(0, False), (1, False), (3, False), (None, False), (1, True), (2, True)]
)
def test_decisions_and_tables_are_the_inline_paths(
    flush_after: int | None, offload: bool, ends: bool, other: str
) -> None:
    """Two jobs interleaved (``other`` on another partition than A's, or on A's), flushes ending
    ``flush_after`` records after they began (refits run apart too with ``offload``, ending one record
    after they began): every prediction part, table row and figure is the inline path's, each
    partition's markers come in the inline order, and the write order holds on both paths."""
    events = renamed(interleaved_jobs(), B, other)
    events = events if ends else without_ends(events)
    inline = ParkingWorker(park=False)
    replay(inline, events, flush_after=0, refit_after=0)
    worker = ParkingWorker(offload=offload)
    replay(worker, events, flush_after, refit_after=1)
    assert check_write_order(inline.log) == check_write_order(worker.log) == 8
    check_routing(worker.log)
    for done in (inline, worker):  # the last job rows acknowledged: models retired alike
        done.store.acknowledged(done.store.unacknowledged())

    for job_id in (A, other):
        assert parts_of(worker.actions, job_id) == parts_of(inline.actions, job_id)
        assert (
            len(evaluations([a for a in worker.actions if getattr(a, "key", None) == job_id.encode()])) == 4
        )
    assert worker.tables == inline.tables
    assert (worker.tables == ({}, {}, {})) == ends
    assert worker.handler.stats == inline.handler.stats
    assert markers_by_partition(worker.actions) == markers_by_partition(inline.actions)
    if flush_after is None and other != SAME_AS_A:
        assert worker.flushes < inline.flushes  # one flush for both partitions


def test_a_parked_partitions_other_jobs_wait_behind_it_so_its_markers_keep_the_inline_order() -> None:
    """A's boundary 20 waits for A's job row of 10; the boundary 20 of a job on A's partition, after it,
    must not be evaluated first: the mitigation consumer relies on markers in checkpoint order per
    partition (`consumers.fold`)."""
    events = [*jobs_with_tasks(A, SAME_AS_A), boundary(10.0, A)]
    events += [running("x", 15.0, A), boundary(20.0, A), running("y", 15.0, SAME_AS_A)]
    events += [boundary(20.0, SAME_AS_A)]
    inline, worker = ParkingWorker(park=False), ParkingWorker()
    for event in events:
        inline.feed(event)
    for event in events[:-1]:
        worker.feed(event)
    flush = worker.start_flush()
    assert worker.feed(events[-1]) == [], "waits behind A's records"
    worker.end_flush(flush)
    while worker.handler.parked():
        worker.flush()

    expected = {0: [(A, 10.0), (A, 20.0), (SAME_AS_A, 20.0)]}
    assert markers_by_partition(inline.actions) == markers_by_partition(worker.actions) == expected
    assert worker.committed(SAME_AS_A) == 20.0 and check_write_order(worker.log) == 3


def test_a_parked_jobs_records_are_applied_in_order_after_it_and_acked_once_written() -> None:
    worker = ParkingWorker()
    start_with_tasks(worker, A)
    worker.feed(boundary(10.0, A))  # offset 7: parked before its job row
    assert acked(worker) == [1, 2, 3, 4, 5, 6]
    x, b20, late, end = (worker.offset + 1 + i for i in range(4))
    for event in (running("x", 15.0, A), boundary(20.0, A), running("late", 21.0, A), ended(25.0, A)):
        assert worker.feed(event) == []
    job = worker.store.job(A)
    assert job is not None and "x" not in job.state.tasks and acked(worker) == []

    assert worker.flush() == []  # the job row of checkpoint 10; x parks: A's next write waits for it
    assert worker.committed(A) == 10.0 and acked(worker) == [7]
    ((verdicts, marker),) = evaluations(worker.flush())  # x applied; boundary 20 evaluated, parked
    assert marker.checkpoint_time == 20.0 and sorted(p.task_id for p in verdicts) == ["r", "x"]
    assert "late" not in job.state.tasks and acked(worker) == [x]
    assert worker.flush() == [] and worker.committed(A) == 20.0  # late parks for the row of 20
    assert acked(worker) == [b20]
    worker.flush()  # late applied (held for the job's next task row), the job's end noted
    assert "late" in job.state.tasks and not worker.handler.parked()
    meta = worker.store.meta(A)
    assert meta is not None and meta.ended_at == 25.0
    assert acked(worker) == [end], "a job event queued behind the wait is done once applied"
    worker.now = 10.0  # the input paused: held changes are written
    for job_id, _ in worker.handler.overdue():
        assert worker.handler.write_held(job_id)
    assert acked(worker) == [late]
    assert check_write_order(worker.log) == 2


def test_let_go_during_a_flush_gives_up_the_parked_jobs_records_and_its_end_resumes_nothing() -> None:
    worker = ParkingWorker()
    start_with_tasks(worker, A)
    first = worker.feed(boundary(10.0, A))
    acked(worker)
    flush = worker.start_flush()
    worker.feed(running("x", 15.0, A))

    given_up = {r.offset for r in worker.handler.let_go()}

    assert given_up == {worker.offset - 1, worker.offset}
    assert not worker.handler.parked()
    worker.store.forget_cache()  # as the worker does when partitions are revoked
    tables = tuple(dict(t) for t in worker.tables)
    assert worker.end_flush(flush) == [] and tuple(dict(t) for t in worker.tables) == tables
    assert worker.committed(A) is None
    again = worker.feed(boundary(10.0, A))  # the partition came back: its boundary is read again
    assert parts_of(again, A) == parts_of(first, A)
    worker.flush()
    assert worker.committed(A) == 10.0 and acked(worker) == [worker.offset]


def test_a_failed_flush_dead_letters_the_parked_record_and_the_job_goes_on() -> None:
    worker = ParkingWorker()
    start_with_tasks(worker, A)
    worker.feed(boundary(10.0, A))
    parked = worker.offset
    worker.feed(running("x", 15.0, A))
    acked(worker)

    actions = worker.end_flush(worker.start_flush(), TimeoutError("broker gone"))

    (letter,) = letters(actions)
    assert letter.source_offset == parked and letter.error == "internal error: TimeoutError: broker gone"
    assert worker.committed(A) is None, "the checkpoint is not committed"
    job = worker.store.job(A)
    assert job is not None and "x" in job.state.tasks  # applied after it: its job row was never written
    assert acked(worker) == [parked]
    assert not worker.handler.parked()
