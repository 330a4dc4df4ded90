"""The patches of Faust and mode internals (`pipeline.faust_patches`), each held to what it relies on.

Each test fails if the internal a patch relies on changes: then the patch may do nothing, or harm.
"""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust import streams
from faust.transport.consumer import Consumer
from faust.transport.producer import ProducerBuffer
from mode.utils.queues import FlowControlEvent, FlowControlQueue

from pipeline import faust_patches
from pipeline.faust_patches import (
    complete_flush,
    keep_queued_records,
    release_before_wait_empty,
    release_without_commit,
    restart_if_stalled,
    stalled_partitions,
)


def test_the_faust_internals_the_patches_use_are_there() -> None:
    """Faust 0.15's names and shapes: ``Message.acked``, ``Consumer.wait_empty``,
    ``ProducerBuffer.flush``/``flush_atmost``/``size``."""
    assert "acked" in faust.types.tuples.Message.__slots__
    assert inspect.iscoroutinefunction(Consumer.wait_empty)
    assert inspect.iscoroutinefunction(ProducerBuffer.flush)
    assert list(inspect.signature(ProducerBuffer.flush_atmost).parameters) == ["self", "max_messages"]
    assert inspect.getsource(ProducerBuffer.flush).count("flush_atmost") == 1, "flush no longer times out"


class _Delivered:
    """A delivered message, as Faust's consumer tracks it until it is acknowledged."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.acked = False


def test_faust_stops_waiting_for_a_record_released_without_acknowledging_it() -> None:
    """``wait_empty`` waits while ``_unacked_messages`` is not empty and drops from it every message
    whose ``acked`` is set (`release_without_commit` sets it, and no offset is committed for it)."""
    held, done = _Delivered(1), _Delivered(2)
    consumer = SimpleNamespace(_unacked_messages={held, done})
    done.acked = True
    release_without_commit(SimpleNamespace(message=held))  # type: ignore[arg-type]
    Consumer._clean_unacked_messages(consumer)  # type: ignore[arg-type]
    assert consumer._unacked_messages == set()
    assert "_clean_unacked_messages" in inspect.getsource(Consumer.wait_empty)


class SlowBuffer:
    """Faust's buffer as a long NURD fit leaves it: flush rounds that time out before any progress."""

    def __init__(self, size: int, stalls_per_message: int) -> None:
        self.size = size
        self.stalls = stalls_per_message
        self.calls = 0

    async def flush_atmost(self, max_messages: int | None) -> int:
        self.calls += 1
        if self.calls % (self.stalls + 1):
            return 0  # 0.1 s passed and no message left the buffer
        self.size -= 1
        return 1


def test_the_complete_flush_waits_until_the_buffer_is_empty() -> None:
    buffer = SlowBuffer(size=5, stalls_per_message=3)
    asyncio.run(complete_flush(buffer)())
    assert buffer.size == 0 and buffer.calls == 20


class BusyBuffer:
    """Faust's buffer while writes keep coming (ADMM's consensus table, a round every tenth of a
    second): each message that leaves is replaced by a new one, so it is never empty."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sent = 0

    async def flush_atmost(self, max_messages: int | None) -> int:
        self.sent += 1  # one message leaves, and another is written meanwhile
        if self.sent > 100:
            raise AssertionError("the flush waited for messages written after it began")
        return 1


def test_the_complete_flush_ends_once_what_was_buffered_has_left_though_writes_go_on() -> None:
    """A group commit awaits this flush while holding the agent: waiting for an empty buffer under
    a steady stream of writes stalled the worker for good (CI, testcontainers: the ADMM broker test)."""
    buffer = BusyBuffer(size=3)
    asyncio.run(complete_flush(buffer)())
    assert buffer.sent == 3 and buffer.size == 3


def test_a_stalled_buffer_fails_the_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faust_patches, "STALL_LIMIT_S", 0.5)
    buffer = SlowBuffer(size=1, stalls_per_message=10**9)
    with pytest.raises(RuntimeError, match="stalled"):
        asyncio.run(complete_flush(buffer)())
    assert buffer.size == 1 and buffer.calls == 5


def test_faust_producer_buffer_flush_is_replaced_on_the_worker() -> None:
    from pipeline.app import Worker
    from pipeline.settings import WorkerSettings

    app = Worker(WorkerSettings(bootstrap="127.0.0.1:9")).app  # nothing is contacted
    assert app.producer.buffer.flush.__qualname__.startswith("complete_flush")


def test_a_rebalance_releases_the_held_records_before_faust_waits_for_them() -> None:
    """Faust's ``wait_empty`` (rebalance, stop) waits until every delivered record is acknowledged;
    records held for their job's checkpoint are first released: done for Faust, never committed."""
    held = SimpleNamespace(message=SimpleNamespace(acked=False))
    seen: list[str] = []

    class Consumer:
        async def wait_empty(self) -> None:
            seen.append(f"wait_empty, held record done: {held.message.acked}")

    def release_unacknowledged() -> None:
        seen.append("released")
        release_without_commit(held)  # type: ignore[arg-type]

    consumer = Consumer()
    release_before_wait_empty(consumer, release_unacknowledged)
    asyncio.run(consumer.wait_empty())

    assert seen == ["released", "wait_empty, held record done: True"]


def test_every_row_goes_to_its_jobs_partition_whatever_event_is_in_hand() -> None:
    """`pipeline.faust_app.JobTable` overrides ``Table.partition_for_key``, which Faust's table asks
    for every write and delete: a commit writes each job's rows to its own changelog partition."""
    from pipeline.app import Worker
    from pipeline.faust_app import JobTable
    from pipeline.jobstore import changes_key, model_key
    from pipeline.settings import WorkerSettings
    from straggler.core.partitioner import partition_of

    settings = WorkerSettings(bootstrap="127.0.0.1:9", partitions=8)
    app = Worker(settings).app  # nothing is contacted
    assert streams.current_event() is None, "no event in hand"
    homes = {job_id: partition_of(job_id, 8) for job_id in ("a", "job-17", "x\u00e9")}
    assert len(set(homes.values())) > 1
    for name in ("tasks", "jobs", "models"):
        table = app.tables[name]
        assert isinstance(table, JobTable)
        for job_id, home in homes.items():
            for key in (job_id.encode(), changes_key(job_id, 3), model_key(job_id, 2)):
                assert table.partition_for_key(key) == home
    for method in (faust.Table.on_key_set, faust.Table.on_key_del):
        assert "self.partition_for_key(key)" in inspect.getsource(method), "Faust routes rows otherwise"


def test_after_a_recovery_the_inputs_the_group_never_committed_start_at_their_beginning() -> None:
    """`start_uncommitted_inputs_at_their_beginning`: an input partition without a committed offset is
    sought to its earliest offset; a committed one (offset 0 too), and a changelog partition, are left
    where the recovery put them. Faust sends ``on_rebalance_complete`` before its seek to committed
    offsets."""
    from faust.types import TP

    from pipeline.faust_app import start_uncommitted_inputs_at_their_beginning

    fresh, committed, at_zero = TP("in", 0), TP("in", 1), TP("in", 2)
    changelog = TP("app-tasks-changelog", 0)
    seeks: list[tuple[TP, int]] = []

    class RecoveredConsumer:
        def assignment(self) -> set[TP]:
            return {fresh, committed, at_zero, changelog}

        async def seek_to_committed(self) -> dict[TP, int | None]:
            return {fresh: None, committed: 7, at_zero: 0, changelog: None}

        async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
            return dict.fromkeys(tps, 3)

        async def position(self, tp: TP) -> int:
            return 5

        async def seek(self, tp: TP, offset: int) -> None:
            seeks.append((tp, offset))

    app = faust.App("seek-test", broker="kafka://127.0.0.1:9")
    app.consumer = RecoveredConsumer()  # type: ignore[assignment]
    start_uncommitted_inputs_at_their_beginning(app, {"in"})
    asyncio.run(app.on_rebalance_complete.send())
    assert seeks == [(fresh, 3)]
    source = inspect.getsource(faust.tables.recovery.Recovery)
    assert source.index("on_rebalance_complete.send()") < source.rindex("perform_seek()")


def _running_flow(guarded: bool) -> tuple[FlowControlEvent, FlowControlQueue[str]]:
    flow = FlowControlEvent(initially_suspended=True)
    queue: FlowControlQueue[str] = FlowControlQueue(flow_control=flow, clear_on_resume=True)
    if guarded:
        keep_queued_records(flow)
    flow.resume()  # recovery starts the flow to read the changelogs
    queue.put_nowait("offset 551")  # the fetcher queues a stream record for the agent
    return flow, queue


def test_unguarded_a_second_resume_drops_the_queued_records() -> None:
    flow, queue = _running_flow(guarded=False)
    flow.resume()  # Faust's resume at the end of the recovery
    assert queue.empty(), "mode no longer clears on resume: pipeline.faust_patches may be unnecessary"


def test_guarded_a_second_resume_keeps_the_queued_records() -> None:
    flow, queue = _running_flow(guarded=True)
    flow.resume()
    assert flow.is_active()
    assert queue.get_nowait() == "offset 551"


def test_guarded_a_resume_after_a_suspension_still_clears_stale_records() -> None:
    flow, queue = _running_flow(guarded=True)
    flow.suspend()  # a rebalance: what was queued may belong to partitions that moved
    assert not flow.is_active()
    flow.resume()
    assert flow.is_active()
    assert queue.empty()


def test_a_recovery_is_stalled_once_it_reads_nothing_for_the_limit_with_partitions_behind() -> None:
    """Offsets and highwaters are Faust's: the last offset read and the last offset there (-1: none).
    Only the partitions still behind are named; a partition not measured yet (None) is not."""
    offsets = {"behind": -1, "partly": 3, "done": 7, "unmeasured": None, "no-end": 2}
    highwaters = {"behind": 4, "partly": 9, "done": 7, "unmeasured": 5, "no-end": None}
    assert stalled_partitions(offsets, highwaters, heard_at=100.0, now=129.9, limit=30.0) == {}
    stalled = stalled_partitions(offsets, highwaters, heard_at=100.0, now=130.0, limit=30.0)
    assert stalled == {"behind": (-1, 4), "partly": (3, 9)}
    done = {"behind": 4, "partly": 9, "done": 7}
    assert stalled_partitions(done, highwaters, heard_at=0.0, now=1e6, limit=30.0) == {}


def test_the_faust_recovery_internals_the_restart_uses_are_there() -> None:
    """`restart_stalled_recovery` reads the recovery's state and sets its restart signal; Faust's
    recovery loop must still start over on that signal, and still start an App's timers only after
    the first recovery (which is why the check is not a timer)."""
    from faust.tables.recovery import Recovery

    tables: Any = faust.App("recovery-test", broker="kafka://127.0.0.1:9").tables
    recovery = tables.recovery
    assert recovery.in_recovery is False
    for name in ("active_offsets", "active_highwaters", "_active_events_received_at"):
        assert isinstance(getattr(recovery, name), dict), name
    assert hasattr(recovery, "_recovery_started_at")
    assert not recovery.signal_recovery_start.is_set()
    assert "self._recovery_started_at = monotonic()" in inspect.getsource(Recovery._set_recovery_started)
    assert "active_events_received_at[tp] = now" in inspect.getsource(faust.tables.recovery)
    assert "raise RebalanceAgain()" in inspect.getsource(Recovery._wait)
    assert "_wait_for_table_recovery_completed" in inspect.getsource(faust.App.on_started)


def test_a_stalled_recovery_is_restarted_once_and_says_where_each_partition_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Faust's recovery, as `restart_if_stalled` reads it: started at 100, last changelog record at 110,
    one partition behind. At 139 it is still waiting; at 140 it is restarted (Faust's own signal) with
    one line naming the partition, what was read, its end and the fetch position; once the signal is
    set, or when the recovery has ended, nothing more happens."""
    from faust.types import TP

    behind, done = TP("app-tasks-changelog", 4), TP("app-jobs-changelog", 4)

    class Consumer:
        async def position(self, tp: TP) -> int:
            return 8

    recovery = SimpleNamespace(
        in_recovery=True,
        signal_recovery_start=asyncio.Event(),
        _recovery_started_at=100.0,
        _active_events_received_at={done: 110.0},
        active_offsets={behind: -1, done: 5},
        active_highwaters={behind: 7, done: 5},
    )

    def check(now: float) -> bool:
        return asyncio.run(restart_if_stalled(recovery, Consumer(), 30.0, now))

    with caplog.at_level("WARNING", logger="pipeline.faust_patches"):
        assert not check(139.9)
        assert not recovery.signal_recovery_start.is_set()
        assert check(140.0)
        assert recovery.signal_recovery_start.is_set()
        assert not check(200.0)  # restarting already
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "table recovery read no changelog record for 30 s with 1 partition(s) behind "
        "(app-tasks-changelog[4] read to -1 of 7, fetch at 8); restarting it"
    ]
    recovery.signal_recovery_start.clear()
    recovery.in_recovery = False
    assert not check(1e6)


@pytest.mark.parametrize("meanwhile", ["reads a record", "ends"])
def test_a_recovery_that_moves_while_the_positions_are_asked_is_not_restarted(
    meanwhile: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The fetch positions come from the consumer's thread, and the recovery goes on while they are
    asked. Stalled at 140 when the check begins, it then reads the record it waited for, or ends: the
    check sees it and does not restart it (after its end, a restart would recover the tables of a
    worker that already runs on them)."""
    from faust.types import TP

    behind = TP("app-tasks-changelog", 4)
    recovery = SimpleNamespace(
        in_recovery=True,
        signal_recovery_start=asyncio.Event(),
        _recovery_started_at=100.0,
        _active_events_received_at={},
        active_offsets={behind: -1},
        active_highwaters={behind: 0},
    )

    class Consumer:
        async def position(self, tp: TP) -> int:
            if meanwhile == "reads a record":
                recovery._active_events_received_at[behind] = 140.5
                recovery.active_offsets[behind] = 0
            else:
                recovery.in_recovery = False
            return 1

    with caplog.at_level("WARNING", logger="pipeline.faust_patches"):
        assert not asyncio.run(restart_if_stalled(recovery, Consumer(), 30.0, 140.0))
    assert not recovery.signal_recovery_start.is_set()
    assert caplog.records == []
