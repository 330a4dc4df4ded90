"""Jobs that wait (for a refit, for the broker) and the inputs that arrive for them meanwhile.

A waiting job's inputs are applied once its wait ends, in the order they arrived, so the job decides
exactly as if it had not waited, while other jobs go on (`pipeline.handler`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Wait = TypeVar("Wait")
Input = TypeVar("Input")


@dataclass
class WaitingJobs(Generic[Wait, Input]):
    """What each waiting job waits for, and each job's queued inputs, in order."""

    _waits: dict[str, Wait] = field(default_factory=dict)
    _queued: dict[str, deque[Input]] = field(default_factory=dict)

    def busy(self, job_id: str) -> bool:
        """Whether an input of the job must queue: the job waits, or inputs of it wait already."""
        return job_id in self._waits or job_id in self._queued

    def wait(self, job_id: str, what: Wait) -> None:
        """The job waits for ``what`` (it waits for nothing else)."""
        assert job_id not in self._waits, f"job {job_id!r} waits already"
        self._waits[job_id] = what

    def waiting_for(self, job_id: str) -> Wait | None:
        return self._waits.get(job_id)

    def waits(self) -> dict[str, Wait]:
        """Each waiting job's wait, in the order they began."""
        return dict(self._waits)

    def end(self, job_id: str, what: Wait) -> bool:
        """End the job's wait for ``what``; False if it waits for something else or nothing (let go)."""
        if self._waits.get(job_id) is not what:
            return False
        del self._waits[job_id]
        return True

    def queue(self, job_id: str, item: Input) -> None:
        self._queued.setdefault(job_id, deque()).append(item)

    def queue_first(self, job_id: str, items: Sequence[Input]) -> None:
        """Queue ``items`` ahead of the job's queued inputs (they came before them)."""
        self._queued.setdefault(job_id, deque()).extendleft(reversed(items))

    def next_input(self, job_id: str) -> Input | None:
        """The job's next queued input, unless it waits (again) or none is left."""
        queue = self._queued.get(job_id)
        if job_id in self._waits or not queue:
            return None
        item = queue.popleft()
        if not queue:
            del self._queued[job_id]
        return item

    def clear(self) -> list[str]:
        """Forget every wait and queued input; the jobs that waited."""
        waited = list(self._waits)
        self._waits.clear()
        self._queued.clear()
        return waited
