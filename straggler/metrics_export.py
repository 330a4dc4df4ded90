"""What the worker's and the mitigation consumer's Prometheus metrics share.

Each process object owns a `prometheus_client.CollectorRegistry` (`pipeline.metrics`,
`consumers.metrics`), so tests can build several side by side; this module holds the pure pieces
(the bounded dead-letter kind, per-partition lag) and the thin shell that serves a registry over HTTP.
Counts a process already keeps in a stats dataclass are read from it at scrape time
(`StatsCollector`) instead of being counted a second time.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from straggler.argtypes import port
from straggler.ports import binding, check_port

log = logging.getLogger(__name__)

disable_created_metrics()  # no ``*_created`` series beside every counter: nothing here reads them

DEFAULT_METRICS_HOST = "127.0.0.1"
"""Where ``--metrics-port`` listens unless ``--metrics-host`` says otherwise (compose: 0.0.0.0)."""

DEAD_LETTER_KINDS = (
    "payload",
    "schema",
    "range",
    "key",
    "unknown_job",
    "unexpected_event",
    "internal",
    "other",
)
"""The bounded ``kind`` label of the dead-letter counters (the free-text reason stays in the letter)."""

KEY_REASONS = ("record of job ", "record key ")
"""How `straggler.kafka.routing` starts the reason of a record it cannot place (no key, another key)."""

LAG_SAMPLE_S = 1.0
"""Seconds between samples of the consumer lag."""

TopicPartition = tuple[str, int]


def dead_letter_kind(error: str | BaseException) -> str:
    """The kind of a dead letter's reason: ``error`` as given to `schemas.dead_letter_for`, or the
    ``error`` text of the letter it made (which writes an exception as ``Type: message``)."""
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
    if text.startswith("SchemaError: payload"):
        return "payload"  # not JSON, no value, over the size limit
    if text.startswith("SchemaError: "):
        return "range" if " (range)" in text else "schema"  # `schemas.ranges`: a physically impossible value
    if text.startswith(KEY_REASONS):
        return "key"  # no key, or not the job id (`straggler.kafka.routing`)
    if text.startswith("event for unknown job"):
        return "unknown_job"
    if text.startswith("unexpected "):
        return "unexpected_event"
    if text.startswith("internal error"):
        return "internal"
    return "other"


def build_version() -> str:
    """This installation's version of the package (``unknown`` when it runs from an uninstalled tree)."""
    try:
        return version("straggler-stream")
    except PackageNotFoundError:
        return "unknown"


def process_registry() -> CollectorRegistry:
    """A registry of one process's metrics, with what every process exports: prometheus_client's
    process (CPU, memory, open files), platform (Python version) and GC collectors, and
    ``straggler_build_info{version}`` (always 1), so a dashboard tells the deployed version."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = Gauge(
        "straggler_build_info",
        "the straggler-stream version running, as a label",
        ["version"],
        registry=registry,
    )
    info.labels(build_version()).set(1)
    return registry


def partition_lags(
    ends: Mapping[TopicPartition, int | None], positions: Mapping[TopicPartition, int | None]
) -> dict[TopicPartition, int]:
    """Records behind per partition: its end (high watermark, or last stable offset) minus the next
    offset to process. Partitions with an unknown end or position (negative or None: nothing fetched
    or consumed yet) are left out rather than reported as a made-up number."""
    lags = {}
    for tp, end in ends.items():
        position = positions.get(tp)
        if end is None or position is None or end < 0 or position < 0:
            continue
        lags[tp] = max(0, end - position)
    return lags


class DeadLetterCounter:
    """A ``{kind}`` counter of dead letters, every kind shown (at 0) from the start."""

    def __init__(self, name: str, registry: CollectorRegistry) -> None:
        self.counter = Counter(name, "records dead-lettered, by kind of reason", ["kind"], registry=registry)
        for kind in DEAD_LETTER_KINDS:
            self.counter.labels(kind)

    def count(self, error: str | BaseException) -> None:
        """One letter more, of the kind of ``error`` (see `dead_letter_kind`)."""
        self.counter.labels(dead_letter_kind(error)).inc()


class LagGauge:
    """A ``{topic, partition}`` gauge of consumer lag that forgets partitions no longer assigned."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.gauge = Gauge(name, documentation, ["topic", "partition"], registry=registry)
        self._shown: set[TopicPartition] = set()

    def update(self, lags: Mapping[TopicPartition, int]) -> None:
        for topic, partition in self._shown - set(lags):
            self.gauge.remove(topic, str(partition))
        for (topic, partition), lag in lags.items():
            self.gauge.labels(topic, str(partition)).set(lag)
        self._shown = set(lags)


@dataclass(frozen=True)
class StatCounter:
    """One field of a stats dataclass exported as a counter (``name`` without ``_total``)."""

    field: str
    name: str
    documentation: str


class StatsCollector(Collector):
    """Exports fields of the stats object ``read()`` returns, as counters, at every scrape."""

    def __init__(self, read: Callable[[], Any], counters: Iterable[StatCounter]) -> None:
        self.read = read
        self.counters = tuple(counters)

    def collect(self) -> Iterable[Metric]:
        stats = self.read()
        for counter in self.counters:
            yield CounterMetricFamily(
                counter.name, counter.documentation, value=float(getattr(stats, counter.field))
            )

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(c.name, c.documentation) for c in self.counters]


def serve(
    registry: CollectorRegistry,
    port: int,
    host: str = DEFAULT_METRICS_HOST,
    option: str = "--metrics-port",
) -> Callable[[], None]:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread; return its stop.

    Says where it serves once the port is bound; a port taken (or not allowed) raises
    `straggler.ports.PortUnavailable`, naming ``option``, the one that sets it."""
    with binding(host, port, option):
        server, thread = start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5.0)

    return stop


@contextmanager
def serving(
    registry: CollectorRegistry, port: int | None, host: str = DEFAULT_METRICS_HOST
) -> Iterator[None]:
    """`serve` ``registry`` for the length of a ``with`` block (nothing when ``port`` is None)."""
    if port is None:
        yield
        return
    stop = serve(registry, port, host)
    try:
        yield
    finally:
        stop()


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name ``registry`` exposes now (``_total``, ``_bucket``, ... included)."""
    return {sample.name for metric in registry.collect() for sample in metric.samples}


def check_metrics_port(args: argparse.Namespace) -> None:
    """Raise `straggler.ports.PortUnavailable` when ``--metrics-port`` is given and cannot be listened
    on: a stage checks it before its start line and its broker, so a port taken ends the command in
    one line (exit 2); it binds the port for good once it has its registry (`serve`)."""
    if args.metrics_port is not None:
        check_port(args.metrics_host, args.metrics_port, "--metrics-port")


def metrics_off(port: int | None) -> str:
    """What a stage's start line says of its metrics: ``, metrics off``, or nothing when it serves
    them (`serve` says where, once the port is bound)."""
    return ", metrics off" if port is None else ""


def add_metrics_arguments(p: argparse.ArgumentParser) -> None:
    """``--metrics-port``/``--metrics-host``: the Prometheus endpoint (off unless a port is given)."""
    p.add_argument(
        "--metrics-port",
        type=port,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)",
    )
    p.add_argument(
        "--metrics-host",
        default=DEFAULT_METRICS_HOST,
        help=f"address the metrics endpoint listens on (default: {DEFAULT_METRICS_HOST}; 0.0.0.0 in compose)",
    )
