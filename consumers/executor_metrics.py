"""The Dask executor's Prometheus metrics (``straggler dask-executor --metrics-port``).

`ExecutorStats` (commands consumed and what became of them) is read at scrape time; skips by kind,
dead letters by kind and the time a kill takes to free its worker's slot are counted as they happen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from confluent_kafka import Consumer
from prometheus_client import Counter, Gauge, Histogram

from schemas.events import Action
from straggler.core.execution import SKIP_KINDS, SkipKind
from straggler.metrics_export import (
    DeadLetterCounter,
    LagGauge,
    StatCounter,
    StatsCollector,
    partition_lags,
    process_registry,
)

FREED_BY = ("returned", "restart", "stuck")
"""How a killed attempt's slot was freed: its thread returned (it checked `cancelled()`, finished, or
had not started), or its worker was restarted (it ran on past the grace period); or not: the worker
could not be restarted (no nanny), so the slot frees only when the function returns."""


@dataclass
class ExecutorStats:
    """What the executor did with the commands it consumed (offsets committed after each)."""

    consumed: int = 0
    applied: int = 0
    skipped: int = 0
    dead_letters: int = 0
    copies_won: int = 0
    copies_lost: int = 0
    extra_machine_seconds: float = 0.0


COUNTERS = (
    StatCounter("consumed", "straggler_executor_records", "relaunch-command records consumed"),
    StatCounter("applied", "straggler_executor_applied", "commands carried out on the cluster"),
    StatCounter("skipped", "straggler_executor_skipped", "commands skipped (by kind: skips_total)"),
    StatCounter("copies_won", "straggler_executor_copies_won", "tasks whose copy finished first"),
    StatCounter(
        "copies_lost", "straggler_executor_copies_lost", "copied tasks whose original finished first"
    ),
    StatCounter(
        "extra_machine_seconds",
        "straggler_executor_extra_machine_seconds",
        "run time of the attempts the executor started, until they ended or were killed",
    ),
)


class ExecutorMetrics:
    """The executor's registry and the hooks its loop calls."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self.registry = r = process_registry()
        r.register(StatsCollector(stats, COUNTERS))
        self.commands = Counter(
            "straggler_executor_commands", "commands carried out, by action", ["action"], registry=r
        )
        for action in get_args(Action):
            self.commands.labels(action)
        self.skips = Counter("straggler_executor_skips", "commands skipped, by kind", ["kind"], registry=r)
        for kind in SKIP_KINDS:
            self.skips.labels(kind)
        self.dead_letters = DeadLetterCounter("straggler_executor_dead_letters", r)
        self.kill_seconds = Histogram(
            "straggler_executor_kill_seconds",
            "from a kill's start to its attempt's worker slot being free, by how it was freed",
            ["freed_by"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        for freed_by in FREED_BY:
            self.kill_seconds.labels(freed_by)
        self.lag = LagGauge("straggler_executor_consumer_lag", "command records not yet consumed", r)
        self.tasks = Gauge("straggler_executor_tasks", "tasks whose attempts the executor tracks", registry=r)

    def skipped(self, kind: SkipKind) -> None:
        self.skips.labels(kind).inc()

    def sample_lag(self, consumer: Consumer) -> None:
        """The assigned partitions' lag from librdkafka's cached end offsets (no broker round trip)."""
        assignment = consumer.assignment()
        ends = {
            (tp.topic, tp.partition): consumer.get_watermark_offsets(tp, cached=True)[1] for tp in assignment
        }
        positions = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(assignment)}
        self.lag.update(partition_lags(ends, positions))
