"""Telemetry from a Dask cluster: a worker plugin that reports each attempt of the adapter's tasks
(`producers.dask_job`) through the `TelemetryProducer` SDK.

`DaskTelemetry` runs in every worker process. An attempt tells it when it really starts executing
and how it ends (`straggler.dask_tasks.run_attempt`, from the task's thread); a thread of the plugin
turns that into reports: ``running`` at the start (its ``start_time`` the moment execution began,
not when the task was queued), ``running`` again every ``interval`` seconds, and ``finished`` with the
latency (or ``failed``, ``killed``). Nothing is produced on the worker's event loop nor on the task's
thread: they only put the news on a queue. Features are measured where the task runs: a worker runs
one task at a time (one thread), so its process's CPU, memory and I/O are that task's.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import psutil
from distributed import Worker, WorkerPlugin

from producers.telemetry import TelemetryProducer
from schemas import INPUT_FEATURE
from straggler.dask_tasks import AttemptEnd, AttemptInfo, kind_feature
from straggler.kafka.names import TopicNames
from straggler.kafka.reachability import BrokerUnreachable

log = logging.getLogger(__name__)

PLUGIN_NAME = "straggler-telemetry"
DEFAULT_INTERVAL_S = 2.0
"""Seconds between two ``running`` reports of an attempt."""
FEATURE_NAMES = (
    "cpu",
    "memory_mb",
    "disk_read_mb_s",
    "disk_write_mb_s",
    "net_mb_s",
    INPUT_FEATURE,
    "queue_length",
    "kind",
    "worker_recent_s",
)
"""What every report carries: the worker process's CPU share (1 = one core) and resident memory,
its disk reads and writes and the machine's network traffic since the last sample, the task's input
size (Dask's ``sizeof`` of its arguments, `schemas.INPUT_FEATURE`), the tasks waiting on the
worker, the task's kind (its function's name) as a number, and the mean latency of the last attempts
that finished on this worker (`RECENT_ATTEMPTS`; 0 before the first): a slow worker's past, known
before its next task ends."""
RECENT_ATTEMPTS = 5
"""How many of the worker's last finished attempts ``worker_recent_s`` averages."""
MB = 1e6
CLOSE_TIMEOUT_S = 5.0
"""Longest a closing worker waits for its last reports to be delivered."""


@dataclass(frozen=True)
class _Started:
    info: AttemptInfo


@dataclass(frozen=True)
class _Ended:
    info: AttemptInfo
    outcome: AttemptEnd
    at: float


class WorkerSampler:
    """The worker process's load since the previous sample (CPU, memory, disk and network rates)."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only starts the measurement
        self._at = time.monotonic()
        self._io = self._read_io()

    def _read_io(self) -> tuple[float, float, float]:
        try:
            disk = self._process.io_counters()
            read, written = float(disk.read_bytes), float(disk.write_bytes)
        except (psutil.Error, AttributeError, NotImplementedError):  # not on every platform
            read = written = 0.0
        net = psutil.net_io_counters()
        return read, written, float(net.bytes_sent + net.bytes_recv) if net is not None else 0.0

    def sample(self) -> dict[str, float]:
        now, io = time.monotonic(), self._read_io()
        span = max(now - self._at, 1e-3)
        rates = [max(after - before, 0.0) / MB / span for before, after in zip(self._io, io, strict=True)]
        self._at, self._io = now, io
        state = self._worker.state
        return {
            "cpu": self._process.cpu_percent(None) / 100.0,
            "memory_mb": self._process.memory_info().rss / MB,
            "disk_read_mb_s": rates[0],
            "disk_write_mb_s": rates[1],
            "net_mb_s": rates[2],
            "queue_length": float(len(state.ready) + len(state.constrained)),
        }


class DaskTelemetry(WorkerPlugin):
    """Register it with ``client.register_plugin(DaskTelemetry(bootstrap))`` (the adapter does)."""

    name = PLUGIN_NAME

    def __init__(
        self, bootstrap: str, *, topic_prefix: str = "", interval: float = DEFAULT_INTERVAL_S
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.bootstrap = bootstrap
        self.topic_prefix = topic_prefix
        self.interval = interval
        self._events: queue.SimpleQueue[_Started | _Ended | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Only the settings travel to the workers; each builds its own queue, thread and producer."""
        return {"bootstrap": self.bootstrap, "topic_prefix": self.topic_prefix, "interval": self.interval}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["bootstrap"], topic_prefix=state["topic_prefix"], interval=state["interval"])  # type: ignore[misc]

    def setup(self, worker: Worker) -> None:
        sdk = TelemetryProducer(self.bootstrap, topics=TopicNames(self.topic_prefix), source="dask")
        self._thread = threading.Thread(
            target=self._report, args=(sdk, WorkerSampler(worker)), name="straggler-telemetry", daemon=True
        )
        self._thread.start()

    def teardown(self, worker: Worker) -> None:
        if self._thread is not None:
            self._events.put(None)
            self._thread.join(timeout=CLOSE_TIMEOUT_S + 1.0)

    def attempt_started(self, info: AttemptInfo) -> None:
        self._events.put(_Started(info))

    def attempt_ended(self, info: AttemptInfo, outcome: AttemptEnd, at: float) -> None:
        self._events.put(_Ended(info, outcome, at))

    def _report(self, sdk: TelemetryProducer, sampler: WorkerSampler) -> None:
        """The plugin's thread: every report of this worker is produced here."""
        running: dict[tuple[str, str, int], AttemptInfo] = {}
        recent: deque[float] = deque(maxlen=RECENT_ATTEMPTS)
        due = time.monotonic() + self.interval
        send = _Sender(sdk)

        def load() -> dict[str, float]:
            return {**sampler.sample(), "worker_recent_s": sum(recent) / len(recent) if recent else 0.0}

        try:
            while True:
                try:
                    event = self._events.get(timeout=max(due - time.monotonic(), 0.0))
                except queue.Empty:
                    now = load()
                    for info in running.values():
                        send(info, now, "running", time.time())
                    due = time.monotonic() + self.interval
                    continue
                if event is None:
                    return
                where = (event.info.job_id, event.info.task_id, event.info.attempt)
                if isinstance(event, _Started):
                    running[where] = event.info
                    send(event.info, load(), "running", event.info.started_at)
                else:
                    running.pop(where, None)
                    send(event.info, load(), event.outcome, event.at)  # its own latency not yet in it
                    if event.outcome == "finished":
                        recent.append(max(event.at - event.info.started_at, 0.0))
        except Exception:  # telemetry must never take the worker down: say why it stopped
            log.exception("dask telemetry stopped")
        finally:
            try:
                sdk.close(CLOSE_TIMEOUT_S)
            except Exception as exc:  # a broker that is gone must not hold the worker's shutdown
                log.warning("dask telemetry: reports lost at close: %s", exc)


class _Sender:
    """Reports an attempt through the SDK; a report it refuses (no broker answers: `BrokerUnreachable`)
    is dropped with one warning per streak of failures, and the reports after it are tried again."""

    def __init__(self, sdk: TelemetryProducer) -> None:
        self.sdk = sdk
        self.failing = False

    def __call__(self, info: AttemptInfo, load: dict[str, float], status: Any, at: float) -> None:
        features = {**load, INPUT_FEATURE: info.input_bytes / MB, "kind": kind_feature(info.kind)}
        try:
            self.sdk.report(
                info.job_id,
                info.task_id,
                features,
                status,
                attempt=info.attempt,
                machine_id=info.worker,
                latency=max(at - info.started_at, 0.0) if status == "finished" else None,
                start_time=info.started_at,
                at=at,
            )
        except BrokerUnreachable as exc:
            if not self.failing:
                log.warning("dask telemetry: reports dropped until the broker answers again: %s", exc)
            self.failing = True
            return
        self.failing = False
