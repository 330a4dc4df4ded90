"""The tasks straggler-stream runs on a Dask cluster: each attempt of a user's task, and the names
the adapter (`producers.dask_job`), the telemetry plugin (`producers.dask_telemetry`) and the command
executor (`consumers.dask_executor`) share on the scheduler.

One user task is one `TaskCall` (function, arguments), packed once into bytes that every attempt's
task carries; every attempt of it (the original, a speculative copy, a relaunch) is a Dask task of
its own, `run_attempt` on that packed call, with
the key `attempt_key(job, task, n)`. So a copy runs the very same function on the very same
arguments, and its key says which attempt it is (the executor's commands name attempts). The
adapter publishes each task's `TaskRecord` under `task_record_name`; the executor reads it to copy
or stop an attempt and publishes it again with the attempts it added, and tells the adapter about a
new attempt on the job's queue (`attempts_queue_name`).

Needs the `dask` extra; imported only by the modules above.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import cloudpickle
from dask.sizeof import sizeof
from distributed import get_worker

ATTEMPT_KEY_PREFIX = "straggler-attempt"
"""First element of every attempt's key (Dask shows it as the task's prefix on its dashboard)."""
EXECUTOR_METADATA = "straggler-executor"
"""Root of the scheduler metadata where the executor records the command ids it applied."""
CANCELLED_STATES = frozenset({"cancelled", "released", "forgotten"})
"""Worker task states of an attempt the scheduler no longer wants (cancelled while it executes)."""

AttemptEnd = Literal["finished", "failed", "killed"]


@dataclass(frozen=True)
class TaskCall:
    """What a user's task runs: ``fn(*args, **kwargs)``. ``kind`` names the function (a feature)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    kind: str

    def packed(self) -> bytes:
        """The call as bytes (cloudpickle, as Dask ships functions), for every attempt's task.

        Bytes in the task itself, not data scattered to one worker: a worker that dies takes no
        argument with it (Dask alone runs the task again elsewhere, and so must every attempt), and
        the executor passes them on without unpickling the user's code."""
        return cloudpickle.dumps(self)

    @staticmethod
    def unpacked(packed: bytes) -> TaskCall:
        call = cloudpickle.loads(packed)
        if not isinstance(call, TaskCall):
            raise TypeError(f"not a packed TaskCall: {type(call).__name__}")
        return call


@dataclass
class TaskRecord:
    """One user task on the scheduler (published by the adapter, republished by the executor):
    its call, its attempts' futures by number, and whether it may be copied (pure)."""

    job_id: str
    task_id: str
    call: bytes
    """The packed `TaskCall` (`TaskCall.packed`)."""
    attempts: dict[int, Any] = field(default_factory=dict)
    """Attempt number -> its future."""
    copyable: bool = True

    def published(self) -> dict[str, Any]:
        """The record as plain dicts, what ``Client.publish_dataset`` takes: Dask finds (and binds to
        the reading client) futures in dicts and lists, not in other objects."""
        return {
            "job_id": self.job_id,
            "task_id": self.task_id,
            "call": self.call,
            "attempts": dict(self.attempts),
            "copyable": self.copyable,
        }

    @classmethod
    def from_published(cls, data: object) -> TaskRecord | None:
        """The record `published` wrote; None for anything else (no such dataset)."""
        if not isinstance(data, dict) or set(data) != {"job_id", "task_id", "call", "attempts", "copyable"}:
            return None
        return cls(
            data["job_id"], data["task_id"], data["call"], dict(data["attempts"]), bool(data["copyable"])
        )


@dataclass(frozen=True)
class AttemptInfo:
    """An attempt as it starts executing on a worker (what telemetry reports about it)."""

    job_id: str
    task_id: str
    attempt: int
    kind: str
    input_bytes: int
    started_at: float
    """Wall-clock time the attempt began executing (not when it was queued)."""
    worker: str


@runtime_checkable
class AttemptObserver(Protocol):
    """A worker plugin told when an attempt starts and ends on its worker (from the task's thread,
    so it must only hand the news over, never block)."""

    def attempt_started(self, info: AttemptInfo) -> None: ...

    def attempt_ended(self, info: AttemptInfo, outcome: AttemptEnd, at: float) -> None: ...


def attempt_key(job_id: str, task_id: str, attempt: int) -> tuple[str, str, str, int]:
    """The Dask key of a task's attempt."""
    return (ATTEMPT_KEY_PREFIX, job_id, task_id, attempt)


def parse_attempt_key(key: object) -> tuple[str, str, int] | None:
    """(job, task, attempt) of an attempt's key; None for any other key."""
    if (
        isinstance(key, tuple)
        and len(key) == 4
        and key[0] == ATTEMPT_KEY_PREFIX
        and isinstance(key[1], str)
        and isinstance(key[2], str)
        and isinstance(key[3], int)
    ):
        return key[1], key[2], key[3]
    return None


def task_record_name(job_id: str, task_id: str) -> str:
    """Name of a task's published `TaskRecord`."""
    return f"straggler/{len(job_id)}:{job_id}/{task_id}"


def attempts_queue_name(job_id: str) -> str:
    """Name of the job's queue of attempts the executor added (read by the adapter)."""
    return f"straggler-attempts/{job_id}"


def applied_metadata_key(command_id: str) -> list[str]:
    """Where the scheduler's metadata records that a command was applied."""
    return [EXECUTOR_METADATA, "applied", command_id]


def kind_feature(kind: str) -> float:
    """A task's kind (its function's name) as a number in [0, 1): the same kind, the same number."""
    return zlib.crc32(kind.encode()) / 2**32


_current = threading.local()
_run_started: dict[tuple[str, str, str, int], float] = {}
"""The attempts running in this worker process, by key: when their run began (`attempt_run_started`)."""


def cancelled() -> bool:
    """Whether the attempt running in this thread was cancelled (killed, or lost its race): a
    long task may call it now and then and return early, which frees its worker at once instead of
    at the worker's restart. False outside an attempt."""
    key = getattr(_current, "key", None)
    if key is None:
        return False
    state = get_worker().state.tasks.get(key)
    return state is None or state.state in CANCELLED_STATES


def attempt_run_started(key: Any, dask_worker: Any = None) -> float | None:
    """On a worker (`Client.run`): when this worker began running the attempt ``key`` (None: it
    does not run it). The executor asks it of an attempt Dask runs again after a worker died under
    it: a command decided before this run began was decided on the run that died."""
    return _run_started.get(plain_key(key))


def plain_key(key: Any) -> Any:
    """A Dask key as a hashable value: a tuple key may arrive as a list across the wire."""
    return tuple(plain_key(part) for part in key) if isinstance(key, list | tuple) else key


def run_attempt(packed: bytes, job_id: str, task_id: str, attempt: int) -> Any:
    """Run one attempt of a task (its `TaskCall.packed`) on a worker, telling the worker's
    `AttemptObserver` plugins when it really starts (now, on the worker's thread) and how it ends."""
    worker = get_worker()
    call = TaskCall.unpacked(packed)
    info = AttemptInfo(
        job_id=job_id,
        task_id=task_id,
        attempt=attempt,
        kind=call.kind,
        input_bytes=int(sizeof(call.args) + sizeof(dict(call.kwargs))),
        started_at=time.time(),
        worker=worker.address,
    )
    observers = [plugin for plugin in worker.plugins.values() if isinstance(plugin, AttemptObserver)]
    for observer in observers:
        observer.attempt_started(info)
    _current.key = key = attempt_key(job_id, task_id, attempt)
    _run_started[key] = info.started_at
    outcome: AttemptEnd = "failed"
    try:
        result = call.fn(*call.args, **call.kwargs)
        outcome = "finished"
        return result
    finally:
        if cancelled():  # its result (or error) is thrown away: the attempt was stopped
            outcome = "killed"
        _current.key = None
        _run_started.pop(key, None)
        for observer in observers:
            observer.attempt_ended(info, outcome, time.time())
