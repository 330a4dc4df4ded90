"""Waiting until what the worker wrote is on the broker: the two places Faust does not wait enough.

Faust sends table writes (and `Topic.send`) through a `ProducerBuffer` drained by a background task,
then aiokafka's own accumulator. Two things follow for a worker killed with SIGKILL:

- Before committing input offsets Faust flushes the producer, but `ProducerBuffer.flush` returns as
  soon as 0.1 s pass without a message leaving the buffer. A NURD fit that holds the event loop for
  longer than that makes the flush return with rows still buffered, and the offsets of the events
  that wrote them are committed anyway: after a crash those events are never read again and their
  rows are gone. `drain_fully` makes the flush wait until the buffer is empty.
- The changelogs are separate topics, so nothing orders a write to one against a write to another.
  `acknowledged` is the barrier the agent puts between the writes of a checkpoint that must not
  outlive each other (see `pipeline.jobstore`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

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
    """A ``flush`` for ``buffer`` that returns only when it is empty (or raises once it stalls)."""

    async def flush() -> None:
        idle = 0.0
        while buffer.size:
            if await buffer.flush_atmost(None):
                idle = 0.0
            else:
                idle += STEP_S
                if idle >= STALL_LIMIT_S:
                    raise RuntimeError(f"producer buffer stalled with {buffer.size} messages for {idle:.0f}s")

    return flush


def drain_fully(producer: Any) -> None:
    """Replace the Faust producer's buffer flush, which every commit awaits, by `complete_flush`."""
    producer.buffer.flush = complete_flush(producer.buffer)


async def acknowledged(producer: Any) -> None:
    """Return once everything sent so far, on every topic, is acknowledged by the broker."""
    await producer.flush()
