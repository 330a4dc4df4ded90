"""Live telemetry SDK: how a running cluster (not a trace) feeds the straggler pipeline.

`TelemetryProducer`: `start_job`, `report` (features while a task runs, its latency when it finishes),
`end_job`. Each report is validated against its JSON Schema at once (`schemas.SchemaError`, nothing
sent); reports leave as ``task_batch`` records per job, at most ``linger`` seconds late, keyed by job
id with murmur2 (sooner once ``max_batch`` are waiting, and at `flush`, `end_job`, `close`). Delivery is
asynchronous (an idempotent producer, ``acks=all``); `flush` waits for it and raises `DeliveryError`
carrying every failed delivery. `start_job` and `end_job` wait for it, at most ``delivery_timeout``
seconds, and raise `BrokerUnreachable` (naming the address) when it did not come, or its subclass
`TopicsMissing` (naming the topics and the command that creates them) when the broker answers but
lacks a topic; `report` raises it too, at once, when records sent before it have waited that long
without a delivery. A failed TLS handshake with the brokers (a wrong CA, an expired or missing
certificate) raises `TlsHandshakeError` naming the address and the cause from the next call
(`start_job` within about a second), instead of retrying until the records time out.

Example: README.md ("Live telemetry"); the records: docs/stream-protocol.md.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from types import TracebackType
from typing import Any, Self, SupportsFloat, SupportsIndex

from confluent_kafka import KafkaError, KafkaException, Producer

from schemas import Event, JobEvent, TaskCheckpoint, encode, task_batches
from schemas.events import TaskStatus
from straggler.kafka.config import DeliveryCounter, DeliveryError, TlsHandshakeError, producer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.produce import produce_with_backpressure
from straggler.kafka.reachability import (
    BrokerUnreachable,
    TopicsMissing,
    failure_cause,
    quiet_librdkafka_logger,
)
from straggler.kafka.security import current_security
from straggler.kafka.tls_errors import handshake_failure
from straggler.kafka.topics import absent_from, create_command

DEFAULT_FLUSH_SECONDS = 30.0
FLUSH_SLICE_SECONDS = 0.5
"""`flush` waits in slices this long, looking for a failed TLS handshake between them."""
DEFAULT_DELIVERY_TIMEOUT_S = 10.0
"""Longest `start_job` and `end_job` wait for their records' delivery before they raise."""
DEFAULT_LINGER_SECONDS = 0.5
"""Longest a report waits in the SDK for others of its job before its batch is sent."""
METADATA_TIMEOUT_S = 2.0
"""Longest wait for the broker's topic list when records wait undelivered (to tell a missing topic)."""
DEFAULT_MAX_BATCH = 1000
"""A job's batch is sent as soon as this many reports wait (records are cut within 64 KiB anyway)."""


class TelemetryProducer:
    """Publishes live jobs' task checkpoints and job events; use it as a context manager.

    ``source`` is written into every task checkpoint, so consumers can tell producers apart.
    Times (``at``, ``start_time``) are seconds on one clock shared by the whole cluster; by default
    ``time.time()``. ``linger`` and ``max_batch`` bound how long and how many reports of a job wait to
    be sent together; ``delivery_timeout`` how long a record may wait for its delivery before the
    broker counts as unreachable (`BrokerUnreachable`).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        topics: TopicNames = TopicNames(),  # noqa: B008 - a frozen dataclass, safe as a default
        source: str = "sdk",
        linger: float = DEFAULT_LINGER_SECONDS,
        max_batch: int = DEFAULT_MAX_BATCH,
        delivery_timeout: float = DEFAULT_DELIVERY_TIMEOUT_S,
    ) -> None:
        if not linger > 0 or max_batch < 1 or not delivery_timeout > 0:
            raise ValueError(
                "linger and delivery_timeout must be > 0 and max_batch >= 1, "
                f"got {linger}, {delivery_timeout}, {max_batch}"
            )
        self._security = current_security()
        config: dict[str, Any] = dict(producer_config(bootstrap, security=self._security))
        config.setdefault("partitioner", "murmur2_random")
        config["error_cb"] = self._note_error  # the cause, when the broker cannot be reached
        config["logger"] = quiet_librdkafka_logger()  # its connection failures: a line, not a flood
        self.bootstrap = bootstrap
        self.topics = topics
        self.source = source
        self.delivery_timeout = delivery_timeout
        self._connection_errors: deque[str] = deque(maxlen=20)
        self._client_errors: list[KafkaError] = []
        """librdkafka's client errors not looked at yet for a failed TLS handshake."""
        self._tls_failure: str | None = None
        self._producer = Producer(config)
        self._deliveries = DeliveryCounter()
        self._settled = 0
        """Deliveries (successful or failed) counted at the last look (`_raise_if_stalled`)."""
        self._stalled_since: float | None = None
        """Since when records have waited without any delivery (None: none waits, or one came)."""
        self._errors_raised = 0
        self._undelivered: tuple[int, BrokerUnreachable] | None = None
        """Why records wait (`_unreachable`), with the deliveries settled when that was found."""
        self._closed = False
        self.linger = linger
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[float, list[TaskCheckpoint]]] = {}
        """Reports not sent yet, by job: (monotonic time of the first, the reports)."""
        self._first_report: dict[tuple[str, str, Any], float] = {}
        """When each running task attempt was first reported: its start when the caller gives none."""
        self._stop = threading.Event()
        self._lingerer = threading.Thread(target=self._send_lingering, name="telemetry-linger", daemon=True)
        self._lingerer.start()

    def start_job(
        self,
        job_id: str,
        expected_tasks: int,
        *,
        feature_names: Sequence[str] | None = None,
        at: float | None = None,
    ) -> None:
        """Announce a job and how many tasks it will run (the agent's 4 % start rule counts on it).

        ``feature_names`` fixes the order of the job's features for its models; without it the agent
        takes the names of the job's first report, so a feature missing from that report is never used.
        Live jobs send no checkpoint boundaries: the agent evaluates them on its timer.
        Waits until the announcement is delivered, so it is on the broker before any of the job's
        task reports (they go to another topic, with no ordering between topics otherwise); raises
        `BrokerUnreachable` when it is not within ``delivery_timeout`` seconds.
        """
        event = JobEvent(
            job_id=job_id,
            event="started",
            time=_now(at),
            expected_tasks=_int_or_value(expected_tasks),
            feature_names=None if feature_names is None else list(feature_names),
        )
        self._raise_if_stalled()
        self._send(self.topics.job_events, job_id, event)
        self._wait_delivered()

    def report(
        self,
        job_id: str,
        task_id: str,
        features: Mapping[str, SupportsFloat],
        status: TaskStatus = "running",
        *,
        attempt: SupportsIndex = 0,
        machine_id: str = "",
        latency: float | None = None,
        start_time: float | None = None,
        at: float | None = None,
    ) -> None:
        """Report one task's state: its features now (``running``), or how it ended.

        ``features`` must hold finite numbers (NumPy scalars are fine) observed before ``at``; leave
        out what is unknown rather than sending NaN. Without ``start_time`` a running attempt is taken to
        have started at its first report through this producer (pass it when the task started earlier).
        A ``finished`` report needs ``latency`` (seconds from start to finish, >= 0); other statuses
        must not carry one. ``attempt`` counts the task's runs from 0, so a relaunched copy is attempt
        1. Raises `schemas.SchemaError` (and sends nothing) for an invalid report, `BrokerUnreachable`
        when records sent before have waited ``delivery_timeout`` seconds without any delivery.
        """
        now = _now(at)
        attempt_no = _int_or_value(attempt)
        attempt_key = (job_id, task_id, attempt_no)
        if status == "running" and start_time is None:
            start_time = self._first_report.setdefault(attempt_key, now)
        elif status != "running":
            self._first_report.pop(attempt_key, None)
        event = TaskCheckpoint(
            job_id=job_id,
            task_id=task_id,
            attempt=attempt_no,
            checkpoint_time=now,
            status=status,
            machine_id=machine_id,
            features={name: _number_or_value(value) for name, value in features.items()},
            latency=None if latency is None else _number_or_value(latency),
            start_time=None if start_time is None else _number_or_value(start_time),
            source=self.source,
        )
        encode(event)  # validates now: a bad report raises here, not when its batch is sent
        if self._closed:
            raise RuntimeError("TelemetryProducer is closed")
        self._raise_on_tls_failure()
        self._raise_if_stalled()
        with self._lock:
            _, reports = self._waiting.setdefault(job_id, (time.monotonic(), []))
            reports.append(event)
            full = len(reports) >= self.max_batch
        if full:
            self._send_batch(job_id)

    def end_job(self, job_id: str, *, at: float | None = None) -> None:
        """Tell the pipeline the job is over, so its state can be dropped (its waiting reports go first).
        Waits until they are delivered; raises `BrokerUnreachable` when they are not within
        ``delivery_timeout`` seconds."""
        self._raise_if_stalled()
        self._first_report = {k: v for k, v in self._first_report.items() if k[0] != job_id}
        self._send_batch(job_id)
        self._send(self.topics.job_events, job_id, JobEvent(job_id=job_id, event="ended", time=_now(at)))
        self._wait_delivered()

    def flush(self, timeout: float = DEFAULT_FLUSH_SECONDS) -> int:
        """Wait up to ``timeout`` seconds for every report to be delivered; return how many are still
        pending (0 when all are delivered). Raises `DeliveryError` with the errors of every delivery
        that failed since the last flush. Reports still waiting for their linger are sent first."""
        for job_id in list(self._waiting):
            self._send_batch(job_id)
        deadline = time.monotonic() + timeout
        remaining = self._producer.flush(min(timeout, FLUSH_SLICE_SECONDS))
        while remaining:
            self._raise_on_tls_failure()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            remaining = self._producer.flush(min(left, FLUSH_SLICE_SECONDS))
        errors = self._deliveries.errors[self._errors_raised :]
        if errors:
            self._errors_raised += len(errors)
            raise DeliveryError(errors)
        return remaining

    @property
    def delivered(self) -> int:
        """Records the broker has acknowledged so far."""
        return self._deliveries.delivered

    def close(self, timeout: float | None = None) -> None:
        """Flush, at most ``timeout`` seconds (default ``delivery_timeout``; none when a call has
        already found the broker unreachable and nothing was delivered since), raising on failed or
        undelivered records (`BrokerUnreachable`) and on a failed TLS handshake (`TlsHandshakeError`);
        the producer cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._lingerer.join()
        self._raise_on_tls_failure()  # known already: say so, whatever the queue holds
        known_down = self._stalled_since is not None and self._settled == self._settled_now()
        wait = 0.0 if known_down else self.delivery_timeout if timeout is None else timeout
        if self.flush(wait):
            raise self._unreachable()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # deliver what was reported; keep the block's own error
            self.close()

    def _wait_delivered(self) -> None:
        """Wait up to ``delivery_timeout`` seconds until every record sent so far is delivered; raise
        `BrokerUnreachable` when some is not."""
        if self.flush(self.delivery_timeout):
            self._stalled_since = time.monotonic() - self.delivery_timeout
            self._settled = self._settled_now()
            raise self._unreachable()

    def _raise_if_stalled(self) -> None:
        """Raise `BrokerUnreachable` when records have waited ``delivery_timeout`` seconds, as far as
        these looks can tell, without any delivery (successful or failed) meanwhile."""
        self._producer.poll(0)
        settled, now = self._settled_now(), time.monotonic()
        if settled != self._settled or len(self._producer) == 0:
            self._settled, self._stalled_since = settled, None
        elif self._stalled_since is None:
            self._stalled_since = now
        elif now - self._stalled_since >= self.delivery_timeout:
            raise self._unreachable()

    def _settled_now(self) -> int:
        return self._deliveries.delivered + self._deliveries.failed

    def _unreachable(self) -> BrokerUnreachable:
        """Why records wait undelivered, found once until a delivery settles (later calls raise at
        once): the broker was reached but lacks a topic (`TopicsMissing`), else it does not answer
        (`BrokerUnreachable`, with librdkafka's cause)."""
        settled = self._settled_now()
        if self._undelivered is None or self._undelivered[0] != settled:
            self._undelivered = (settled, self._why_undelivered())
        return self._undelivered[1]

    def _why_undelivered(self) -> BrokerUnreachable:
        if not self._connection_errors:  # the broker was reached: look for a missing topic
            wanted = (self.topics.checkpoints, self.topics.job_events)
            try:
                listed = self._producer.list_topics(timeout=METADATA_TIMEOUT_S).topics
            except KafkaException:  # no answer after all
                listed = None
            missing = [] if listed is None else absent_from(listed, wanted)
            if missing:
                return TopicsMissing(
                    self.bootstrap,
                    missing,
                    create_command(self.bootstrap, self.topics.prefix),
                    self.delivery_timeout,
                )
        return BrokerUnreachable(
            self.bootstrap, failure_cause(self._connection_errors), self.delivery_timeout
        )

    def _note_error(self, error: KafkaError) -> None:
        """librdkafka's client-level errors (``error_cb``): kept for the cause, not logged."""
        self._client_errors.append(error)
        if error.code() != KafkaError._ALL_BROKERS_DOWN:
            self._connection_errors.append(error.str())

    def _raise_on_tls_failure(self) -> None:
        """Raise `TlsHandshakeError` once librdkafka has reported a failed TLS handshake (its error
        callback, served by ``poll`` and ``flush``); other client errors are left to its retries."""
        if self._tls_failure is None and self._client_errors:
            errors = self._client_errors[:]
            del self._client_errors[: len(errors)]  # error_cb may append meanwhile (another thread's poll)
            self._tls_failure = handshake_failure(errors, self.bootstrap, self._security)
        if self._tls_failure is not None:
            raise TlsHandshakeError(self._tls_failure)

    def _send(self, topic: str, job_id: str, event: Event) -> None:
        if self._closed:
            raise RuntimeError("TelemetryProducer is closed")
        self._raise_on_tls_failure()
        self._produce(topic, job_id, encode(event))  # encode validates before anything is queued

    def _send_batch(self, job_id: str) -> None:
        """Send the job's waiting reports as task_batch records (nothing if none wait)."""
        with self._lock:
            _, reports = self._waiting.pop(job_id, (0.0, []))
            for payload in task_batches(job_id, reports, source=self.source) if reports else []:
                self._produce(self.topics.checkpoints, job_id, payload)  # under the lock: in order

    def _send_lingering(self) -> None:
        """Background: send each job's batch once its first report has waited ``linger`` seconds."""
        while not self._stop.wait(self.linger / 4):
            due = time.monotonic() - self.linger
            with self._lock:  # report() adds to the dict from the caller's thread
                lingering = [job for job, (since, _) in self._waiting.items() if since <= due]
            for job_id in lingering:
                self._send_batch(job_id)

    def _produce(self, topic: str, job_id: str, payload: bytes) -> None:
        produce_with_backpressure(self._producer, topic, payload, job_id.encode(), self._deliveries)
        self._producer.poll(0)


def _now(at: float | None) -> float:
    return time.time() if at is None else _number_or_value(at)


def _number_or_value(value: Any) -> Any:
    """Plain ``float`` for any real number (NumPy scalars included); anything else is left for the
    schema to reject with a message naming the field."""
    if isinstance(value, Real) and not isinstance(value, bool):
        return float(value)
    return value


def _int_or_value(value: Any) -> Any:
    """Plain ``int`` for integral NumPy or Python integers; anything else is left for the schema."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        return int(value)
    return value
