"""The Dask adapter: submit a job's tasks so straggler-stream can watch them and copy a straggler,
and get each task's result from whichever of its attempts finishes first.

``SpeculativeClient(client, bootstrap)`` registers the telemetry plugin (`producers.dask_telemetry`)
on the workers; ``with speculative.job("job-1", expected_tasks=N) as job`` announces the job (and its
end on leaving), ``job.submit(fn, *args, pure=True)`` runs ``fn`` as attempt 0 of a task and returns a
`SpeculativeFuture`. The command executor (`consumers.dask_executor`) may add attempts (a copy, a
relaunch); the future resolves to the first attempt that finishes.

Only tasks submitted here can be copied, and only those submitted with ``pure=True`` (the default,
as in ``Client.submit``): a copy runs the function a second time, at the same time as the first, so
a task with side effects (writes a file, a row, a message) would do them twice. Pass ``pure=False``
for such a task: the executor never copies nor relaunches it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from concurrent.futures import Future as ThreadFuture
from types import TracebackType
from typing import Any, Self

from distributed import Client, Future, Queue

from producers.dask_telemetry import DEFAULT_INTERVAL_S, FEATURE_NAMES, PLUGIN_NAME, DaskTelemetry
from producers.telemetry import TelemetryProducer
from straggler.dask_tasks import (
    TaskCall,
    TaskRecord,
    attempt_key,
    attempts_queue_name,
    parse_attempt_key,
    run_attempt,
    task_record_name,
)
from straggler.kafka.names import TopicNames

log = logging.getLogger(__name__)

POLL_S = 0.2
"""How often a waiting result looks for attempts the executor added."""


class SpeculativeClient:
    """A Dask ``Client`` whose jobs straggler-stream watches (telemetry) and may copy (executor)."""

    def __init__(
        self,
        client: Client,
        bootstrap: str,
        *,
        topic_prefix: str = "",
        interval: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.client = client
        client.register_plugin(DaskTelemetry(bootstrap, topic_prefix=topic_prefix, interval=interval))
        self._sdk = TelemetryProducer(bootstrap, topics=TopicNames(topic_prefix), source="dask")
        self._publishing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="straggler-records")

    def job(self, job_id: str, expected_tasks: int) -> SpeculativeJob:
        """A job of ``expected_tasks`` tasks; use it as a context manager (start and end are reported)."""
        records = RecordPublisher(self.client, self._publishing)
        return SpeculativeJob(self.client, self._sdk, job_id, expected_tasks, records)

    def close(self) -> None:
        """Deliver what was reported and remove the plugin from the workers."""
        self._publishing.shutdown(wait=True)
        self._sdk.close()
        self.client.unregister_worker_plugin(PLUGIN_NAME)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordPublisher:
    """Publishes a job's task records (`TaskRecord`, which the executor reads to copy a task) on the
    scheduler in batches, on a thread of its own.

    One ``publish_dataset`` call is a round trip to the scheduler (about 10 ms on a local cluster):
    one per task, in ``submit``, held back each next submit, so the last task of 24 started 0.26 s
    after the first (0.01 s for the 24 in one call). ``submit`` now only hands the record over; every
    record handed over meanwhile goes in the next call. The executor asks for a record at the
    earliest a telemetry interval (1 s) after its task started."""

    def __init__(self, client: Client, pool: ThreadPoolExecutor) -> None:
        self.client, self._pool = client, pool
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        self._draining = False
        self._last: ThreadFuture[None] | None = None

    def publish(self, name: str, record: Any) -> None:
        """Publish ``record`` as dataset ``name`` soon, with the others handed over meanwhile."""
        with self._lock:
            self._pending[name] = record
            if not self._draining:
                self._draining = True
                self._last = self._pool.submit(self._drain)

    def _drain(self) -> None:
        try:
            while True:
                with self._lock:
                    batch, self._pending = self._pending, {}
                    if not batch:
                        self._draining = False
                        return
                self.client.publish_dataset(**batch)
        except BaseException:
            log.exception("task records not published: the executor cannot copy those tasks")
            with self._lock:
                self._draining = False
            raise

    def flush(self) -> None:
        """Return once every record handed over is published (raising a failed publication's error):
        the last drain runs until nothing is pending."""
        with self._lock:
            last = self._last
        if last is not None:
            last.result()


class SpeculativeJob:
    """One job's tasks on the cluster; made by `SpeculativeClient.job`."""

    def __init__(
        self,
        client: Client,
        sdk: TelemetryProducer,
        job_id: str,
        expected_tasks: int,
        records: RecordPublisher,
    ) -> None:
        self.client, self._sdk = client, sdk
        self.job_id, self.expected_tasks = job_id, expected_tasks
        self._records = records
        self._tasks: dict[str, SpeculativeFuture] = {}
        self._numbers = itertools.count()
        self._added = Queue(attempts_queue_name(job_id), client=client)

    def __enter__(self) -> Self:
        self._sdk.start_job(self.job_id, self.expected_tasks, feature_names=FEATURE_NAMES)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Report the job's end and drop its tasks from the scheduler: attempts still running (the
        losers of races, and tasks not done) are cancelled, and each future keeps only its winner's
        result, so the cluster holds nothing else of the job."""
        self._sdk.end_job(self.job_id)
        try:
            self._records.flush()  # published before they are taken back
        except Exception:  # the scheduler is unreachable: the cleanup below says so, or does its part
            log.exception("job %s: its task records were not all published", self.job_id)
        self.poll_added_attempts()
        for task_id, future in self._tasks.items():
            self.client.unpublish_dataset(task_record_name(self.job_id, task_id))
            live = [f for f in future.attempts.values() if not f.done()]
            if live:
                self.client.cancel(live, force=True)
            future.keep_only_the_winner()
        # Each future refers to its job: a cycle that only Python's garbage collector breaks, and
        # until it runs, Dask keeps every result of the job on the workers (a worker that dies then
        # makes Dask compute them all again, beside the next job).
        self._tasks.clear()

    def submit(
        self, fn: Callable[..., Any], *args: Any, task_id: str | None = None, pure: bool = True, **kwargs: Any
    ) -> SpeculativeFuture:
        """Run ``fn(*args, **kwargs)`` as a task of the job (``task_id`` defaults to its number);
        ``pure=False`` for a task with side effects, which is then never copied."""
        task_id = str(next(self._numbers)) if task_id is None else task_id
        if task_id in self._tasks:
            raise ValueError(f"job {self.job_id!r} already has a task {task_id!r}")
        call = TaskCall(fn, args, kwargs, kind=getattr(fn, "__name__", type(fn).__name__))
        packed = call.packed()
        first = self.client.submit(
            run_attempt,
            packed,
            self.job_id,
            task_id,
            0,
            key=attempt_key(self.job_id, task_id, 0),
            pure=False,
        )
        record = TaskRecord(self.job_id, task_id, packed, {0: first}, copyable=pure)
        self._records.publish(task_record_name(self.job_id, task_id), record.published())
        future = SpeculativeFuture(self, task_id, {0: first})
        self._tasks[task_id] = future
        return future

    def map(
        self, fn: Callable[..., Any], items: Iterable[Any], *, pure: bool = True
    ) -> list[SpeculativeFuture]:
        """``submit(fn, item)`` for each item, task ids 0, 1, ..."""
        return [self.submit(fn, item, pure=pure) for item in items]

    def gather(self, futures: Sequence[SpeculativeFuture], timeout: float | None = None) -> list[Any]:
        """Each future's result, in order."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return [
            f.result(None if deadline is None else max(deadline - time.monotonic(), 0.0)) for f in futures
        ]

    def poll_added_attempts(self) -> None:
        """Take the attempts the executor added to this job's tasks off the job's queue."""
        with self.client.as_current():  # the futures taken off the queue are bound to the current client
            added_attempts = self._added.get(batch=True)
        for added in added_attempts:
            parsed = parse_attempt_key(getattr(added, "key", None))
            if parsed is not None and parsed[1] in self._tasks:
                self._tasks[parsed[1]].attempts.setdefault(parsed[2], added)


class SpeculativeFuture:
    """A task's result: that of the first of its attempts to finish."""

    def __init__(self, job: SpeculativeJob, task_id: str, attempts: dict[int, Future]) -> None:
        self.job, self.task_id = job, task_id
        self.attempts = attempts
        """Attempt number -> its Dask future (the executor's copies and relaunches join as they come)."""
        self.winner: int | None = None
        self.job_ended = False
        self._ended = threading.Event()
        """Set when an attempt in ``_watched`` ends (by Dask's callback thread)."""
        self._watched: set[int] = set()

    def _wake_when_done(self, live: dict[int, Future]) -> None:
        """Have each of the ``live`` attempts (by number) set ``_ended`` when it ends, once each.

        Not `distributed.wait` with a timeout: the `TimeoutError` it raises is held in a reference
        cycle with the frames it passed through, this one among them, so every future they name (the
        job's results) stays on the cluster until Python's garbage collector runs; a worker that dies
        meanwhile makes Dask compute them all again."""
        ended = self._ended  # the callback holds the event only, not this future
        for number, attempt in live.items():
            if number not in self._watched:
                self._watched.add(number)
                attempt.add_done_callback(lambda _done: ended.set())

    def keep_only_the_winner(self) -> None:
        """The job has ended: hold the first finished attempt's future only (Dask keeps a result
        while a future holds it), else the failed ones (`result` raises their error); with neither,
        `result` raises `CancelledError`."""
        finished = sorted(n for n, a in self.attempts.items() if a.status == "finished")
        kept = self.winner if self.winner is not None else (finished[0] if finished else None)
        if kept is not None:
            self.attempts = {kept: self.attempts[kept]}
        else:
            self.attempts = {n: a for n, a in self.attempts.items() if a.status == "error"}
        self.job_ended = True

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the first attempt that finishes and return its result; raise the error of a failed
        attempt once no attempt is left running, `TimeoutError` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._ended.clear()  # before looking: an attempt that ends after the look wakes the wait
            self.job.poll_added_attempts()
            for number, attempt in sorted(self.attempts.items()):
                if attempt.status == "finished":
                    self.winner = number
                    return attempt.result()
            live = {n: a for n, a in self.attempts.items() if not a.done()}
            failed = [a for a in self.attempts.values() if a.status == "error"]
            if not live and failed:
                return failed[0].result()  # raises the attempt's error
            if self.job_ended and not live:
                raise CancelledError(
                    f"task {self.task_id!r} of job {self.job.job_id!r} was not done when its job ended"
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"task {self.task_id!r} of job {self.job.job_id!r} not done in {timeout} s"
                )
            if live:
                self._wake_when_done(live)
                self._ended.wait(POLL_S)  # or an attempt the executor adds: the loop looks again
            else:  # every attempt cancelled: a relaunch's new attempt is on its way
                time.sleep(POLL_S)
