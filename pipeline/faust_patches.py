"""Every place the worker reaches into Faust (or mode, which Faust is built on), and why.

Faust has no public API for these; each patch is one function here, and tests/test_faust_patches.py
fails if the Faust or mode internal it relies on changes.

1. `release_without_commit`, `release_before_wait_empty`: the agent acknowledges records by hand,
   at the group commit that makes their changes durable (`pipeline.group_commit`). Before a
   rebalance or a stop Faust waits until every record it delivered is acknowledged
   (``Consumer.wait_empty``); records waiting for a commit or for their job's start never would be.
   They are released first: marked done (``Message.acked``) without an acknowledgement, so their
   offsets are not committed and the partition's next owner reads them.
2. `drain_fully`: the producer's flush, which each group commit awaits, drains Faust's buffer with
   ``ProducerBuffer.flush``, which returns once 0.1 s pass without a message leaving the buffer. A
   NURD fit holding the event loop for longer makes it return with rows still buffered, and the
   records that wrote them are acknowledged anyway: after a kill those rows are lost. The flush is
   made to wait until every message buffered when it began has left.
3. `keep_queued_records`: mode's ``FlowControlEvent.resume`` empties every queue it manages; right
   after a rebalance, wrong when Faust calls it again at the end of a recovery, because the cleared
   records are then neither delivered again nor acknowledged (docs/reliability.md, "A recovery keeps
   the records already fetched").
4. `restart_stalled_recovery`: Faust's table recovery waits, without a bound, for changelog records
   it is owed; when a record is lost on its way from the fetcher to the recovery (the fetcher's
   position is past it, so it is never fetched again), the worker never becomes ready. A recovery that
   reads nothing for `RECOVERY_STALL_S` while a partition is still behind is restarted: Faust then
   seeks every changelog partition back to what it has read, as after a rebalance.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from time import monotonic
from typing import Any, Protocol, TypeVar, cast

import faust

log = logging.getLogger(__name__)


def release_without_commit(event: faust.EventT) -> None:
    """Mark ``event`` done for Faust without acknowledging it: it is not committed, nor waited for."""
    event.message.acked = True


def release_before_wait_empty(consumer: Any, release: Callable[[], None]) -> None:
    """Make the consumer's ``wait_empty`` (a rebalance's or a stop's) call ``release`` first."""
    wait_empty: Callable[[], Coroutine[Any, Any, None]] = consumer.wait_empty

    async def release_then_wait_empty() -> None:
        release()
        await wait_empty()

    consumer.wait_empty = release_then_wait_empty


STALL_LIMIT_S = 60.0
"""A buffer that does not move for this long is broken: fail the flush (and the commit) loudly."""
STEP_S = 0.1
"""How long `ProducerBuffer.flush_atmost` waits for one message before it gives up."""


class DrainableBuffer(Protocol):
    """What `drain_fully` needs of Faust's `ProducerBuffer`."""

    @property
    def size(self) -> int: ...

    async def flush_atmost(self, max_messages: int | None) -> int: ...


def complete_flush(buffer: DrainableBuffer) -> Callable[[], Coroutine[Any, Any, None]]:
    """A ``flush`` for ``buffer`` that returns once every message buffered when it began has left
    (the buffer is first in, first out), or raises once it stalls.

    Not "until the buffer is empty": writes that keep coming meanwhile (ADMM's consensus table, a
    round every tenth of a second) would keep it from ever being empty, and the group commit that
    awaits this flush, holding the agent, would never end."""

    async def flush() -> None:
        owed, idle = buffer.size, 0.0
        while owed > 0 and buffer.size:
            sent = await buffer.flush_atmost(owed)  # counts at most the messages sent: never too few
            if sent:
                owed, idle = owed - sent, 0.0
            else:
                idle += STEP_S
                if idle >= STALL_LIMIT_S:
                    raise RuntimeError(f"producer buffer stalled with {buffer.size} messages for {idle:.0f}s")

    return flush


def drain_fully(producer: Any) -> None:
    """Replace the Faust producer's buffer flush, which every commit awaits, by `complete_flush`."""
    producer.buffer.flush = complete_flush(producer.buffer)


async def acknowledged(producer: Any) -> None:
    """Return once everything sent so far, on every topic, is acknowledged by the broker (public API)."""
    await producer.flush()


class FlowControl(Protocol):
    """What `keep_queued_records` needs of mode's `FlowControlEvent`."""

    def is_active(self) -> bool: ...

    def resume(self) -> None: ...


def keep_queued_records(flow_control: FlowControl) -> None:
    """Make ``flow_control.resume()`` a no-op while the flow is active (it would clear the queues)."""
    resume = flow_control.resume

    def resume_if_suspended() -> None:
        if not flow_control.is_active():
            resume()

    flow_control.resume = resume_if_suspended  # type: ignore[method-assign]


RECOVERY_STALL_S = 30.0
"""A table recovery that reads no changelog record for this long while a partition is still behind
its end is restarted (`restart_stalled_recovery`). A recovery that reads goes on however long it takes."""

Partition = TypeVar("Partition")


def stalled_partitions(
    offsets: Mapping[Partition, int | None],
    highwaters: Mapping[Partition, int | None],
    heard_at: float,
    now: float,
    limit: float,
) -> dict[Partition, tuple[int, int]]:
    """The partitions a recovery still has to read, each with (read up to, last offset), when it has
    read nothing since ``heard_at`` for ``limit`` seconds; empty while it reads or has read all.

    ``offsets`` and ``highwaters`` are Faust's (``Recovery.active_offsets``/``active_highwaters``,
    both the offset of the last record: -1 for none)."""
    if now - heard_at < limit:
        return {}
    return {
        tp: (offset, highwater)
        for tp, highwater in highwaters.items()
        if highwater is not None and (offset := offsets.get(tp)) is not None and offset < highwater
    }


def _stalled(recovery: Any, now: float, limit: float) -> dict[Any, tuple[int, int]]:
    """`stalled_partitions` of Faust's ``recovery`` at ``now``; empty unless it is recovering and not
    restarting already."""
    if not recovery.in_recovery or recovery.signal_recovery_start.is_set():
        return {}
    heard = [recovery._recovery_started_at or 0.0, *recovery._active_events_received_at.values()]
    return stalled_partitions(recovery.active_offsets, recovery.active_highwaters, max(heard), now, limit)


async def restart_if_stalled(recovery: Any, consumer: Any, limit: float, now: float) -> bool:
    """Restart Faust's table ``recovery`` (its ``signal_recovery_start``) if it has read nothing for
    ``limit`` seconds at monotonic ``now`` with partitions still behind, logging where each stands
    (``consumer``'s fetch position among it); return whether it did.

    The recovery may read, or end, while the consumer's thread answers for the positions: it is
    checked again after them, with nothing awaited between that check and the restart. A restart
    signalled after the recovery ended would start another over the tables of a worker that runs."""
    behind = _stalled(recovery, now, limit)
    if not behind:
        return False
    where = []
    for tp, (offset, highwater) in sorted(behind.items()):
        try:
            position = str(await asyncio.wait_for(consumer.position(tp), timeout=1.0))
        except Exception:  # the consumer's thread does not answer: say so, restart anyway
            position = "?"
        where.append(f"{tp.topic}[{tp.partition}] read to {offset} of {highwater}, fetch at {position}")
    if not _stalled(recovery, now, limit):
        return False  # it read or ended meanwhile
    log.warning(
        "table recovery read no changelog record for %.0f s with %d partition(s) behind (%s); restarting it",
        limit,
        len(behind),
        "; ".join(where),
    )
    recovery.signal_recovery_start.set()
    return True


def restart_stalled_recovery(
    app: faust.App, limit: float | None = None, on_restart: Callable[[], None] | None = None
) -> None:
    """Restart ``app``'s table recovery when it has read nothing for ``limit`` seconds with partitions
    still behind (`restart_if_stalled`), calling ``on_restart`` each time (a metric).

    The restart is Faust's own, as when another rebalance comes (``Recovery.signal_recovery_start``):
    it rebuilds the highwaters, seeks each changelog partition to what the recovery has read and reads
    on. Checked every ``limit / 6`` seconds (`RECOVERY_STALL_S` by default) from the first assignment
    on: Faust starts an App's timers only once its first recovery is complete."""
    limit = RECOVERY_STALL_S if limit is None else limit

    async def watch() -> None:
        async for _ in app.itertimer(limit / 6, name="restart_stalled_recovery"):
            recovery = cast(Any, app.tables).recovery  # TableManagerT does not declare it
            if await restart_if_stalled(recovery, app.consumer, limit, monotonic()) and on_restart:
                on_restart()

    watching: list[asyncio.Future[Any]] = []

    async def start_watching(sender: Any, *args: Any, **kwargs: Any) -> None:
        if not watching:  # the first assignment: before the first recovery, when Faust's timers wait
            watching.append(app.add_future(watch()))

    app.on_partitions_assigned.connect(cast(Any, start_watching))
