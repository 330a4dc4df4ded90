"""Input partitions that wait (a job's refit, a wait for the broker) and the records that arrive on
them meanwhile.

A waiting partition's records are applied once its wait ends, in the order they arrived: per partition
the agent does what it would have done without waiting, in the same order (its outputs too: the
mitigation consumer relies on markers in checkpoint order per partition), while other partitions go on
(`pipeline.handler`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Wait = TypeVar("Wait")
Input = TypeVar("Input")


@dataclass
class WaitingPartitions(Generic[Wait, Input]):
    """What each waiting partition waits for, and each partition's queued inputs, in order."""

    _waits: dict[int, Wait] = field(default_factory=dict)
    _queued: dict[int, deque[Input]] = field(default_factory=dict)

    def busy(self, partition: int) -> bool:
        """Whether an input of the partition must queue: it waits, or inputs of it wait already."""
        return partition in self._waits or partition in self._queued

    def wait(self, partition: int, what: Wait) -> None:
        """The partition waits for ``what`` (it waits for nothing else)."""
        assert partition not in self._waits, f"partition {partition} waits already"
        self._waits[partition] = what

    def waiting_for(self, partition: int) -> Wait | None:
        return self._waits.get(partition)

    def waits(self) -> dict[int, Wait]:
        """Each waiting partition's wait, in the order they began."""
        return dict(self._waits)

    def end(self, partition: int, what: Wait) -> bool:
        """End the partition's wait for ``what``; False if it waits for another or none (let go)."""
        if self._waits.get(partition) is not what:
            return False
        del self._waits[partition]
        return True

    def queue(self, partition: int, item: Input) -> None:
        self._queued.setdefault(partition, deque()).append(item)

    def queue_first(self, partition: int, items: Sequence[Input]) -> None:
        """Queue ``items`` ahead of the partition's queued inputs (they came before them)."""
        self._queued.setdefault(partition, deque()).extendleft(reversed(items))

    def next_input(self, partition: int) -> Input | None:
        """The partition's next queued input, unless it waits (again) or none is left."""
        queue = self._queued.get(partition)
        if partition in self._waits or not queue:
            return None
        item = queue.popleft()
        if not queue:
            del self._queued[partition]
        return item

    def clear(self) -> list[Wait]:
        """Forget every wait and queued input; the waits."""
        waits = list(self._waits.values())
        self._waits.clear()
        self._queued.clear()
        return waits
