"""Acknowledging the agent's input records by hand, so an offset is committed only once what the
record changed is written (`pipeline.handler`: a job's changes are written at its checkpoints).

The agent iterates its stream without Faust's automatic acknowledgements and acknowledges each
record's `faust.Event` once the handler lets it (in offset order per partition: Faust commits the
highest contiguous acknowledged offset). Two places of Faust need more than `Event.ack`:

- Before a rebalance Faust waits until every record it delivered is acknowledged (`wait_empty`);
  records held for their job's checkpoint never would be. `let_go_before_waiting` gives them up
  first, and `give_up` marks each one done *without* acknowledging it: its offset is not committed,
  and the partition's next owner reads it again.
- A table write goes to the changelog partition of the event being handled; the worker's timer
  writes a job's held changes within one of the job's own events (`writes_routed_to`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any
from weakref import ref

import faust
from faust import streams


def give_up(event: faust.EventT) -> None:
    """Mark ``event`` done for Faust without acknowledging it: it is not committed, nor waited for."""
    event.message.acked = True


def let_go_before_waiting(consumer: Any, let_go: Callable[[], None]) -> None:
    """Make the consumer's ``wait_empty`` (a rebalance's or a stop's) call ``let_go`` first."""
    wait_empty: Callable[[], Coroutine[Any, Any, None]] = consumer.wait_empty

    async def wait_for_the_record_in_hand() -> None:
        let_go()
        await wait_empty()

    consumer.wait_empty = wait_for_the_record_in_hand


@contextmanager
def writes_routed_to(event: faust.EventT) -> Iterator[None]:
    """Table writes within go to ``event``'s partition, as if the stream were handling it."""
    token = streams._current_event.set(ref(event))
    try:
        yield
    finally:
        streams._current_event.reset(token)
