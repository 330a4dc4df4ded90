"""The Faust worker's Prometheus metrics (``straggler worker --metrics-port``).

The agent's own `AgentStats` counts are read at scrape time; what they do not hold (flags, dead
letters by kind, latencies, lag, jobs) is recorded here by a few calls from `pipeline.app`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import faust
from prometheus_client import Counter, Gauge, Histogram

from straggler.core.online import Decision
from straggler.metrics_export import (
    LAG_SAMPLE_S,
    DeadLetterCounter,
    LagGauge,
    StatCounter,
    StatsCollector,
    TopicPartition,
    partition_lags,
    process_registry,
)

log = logging.getLogger(__name__)

AGENT_COUNTERS = (
    StatCounter("events", "straggler_worker_events", "input records consumed"),
    StatCounter(
        "task_events",
        "straggler_worker_task_observations",
        "task observations consumed (a task_batch counts each of its observations)",
    ),
    StatCounter("boundaries", "straggler_worker_boundaries", "checkpoint boundaries consumed"),
    StatCounter("predictions", "straggler_worker_predictions", "per-task predictions published"),
    StatCounter("ignored", "straggler_worker_ignored", "duplicate or late events that changed nothing"),
)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
REFIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class WorkerMetrics:
    """The worker's registry and the hooks the agent calls."""

    def __init__(self, stats: Any, jobs: Callable[[], int]) -> None:
        """``stats``: the agent's `AgentStats`; ``jobs``: how many jobs the worker's table holds."""
        self.registry = process_registry()
        self.registry.register(StatsCollector(lambda: stats, AGENT_COUNTERS))
        r = self.registry
        self.flags = Counter("straggler_worker_flags", "predictions that flag a straggler", registry=r)
        self.dead_letters = DeadLetterCounter("straggler_worker_dead_letters", r)
        self.jobs = Gauge("straggler_worker_jobs", "jobs tracked (open rows of the jobs table)", registry=r)
        self.recovery_restarts = Counter(
            "straggler_worker_recovery_restarts",
            "table recoveries restarted after reading nothing for 30 s with changelog partitions behind",
            registry=r,
        )
        self.count_jobs = jobs
        """Read on the worker's event loop (`install_lag_sampler`), never from the scrape's thread: a
        scrape that touched the Faust table before it started left the worker hanging on SIGTERM."""
        self.decision_latency = Histogram(
            "straggler_worker_decision_latency_seconds",
            "from a checkpoint boundary's produced_at (a live job's tick: its newest report) to its "
            "predictions sent",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.refit_seconds = Histogram(
            "straggler_worker_refit_seconds",
            "wall time of checkpoint evaluations that refitted the job's model (fit and predict)",
            buckets=REFIT_BUCKETS,
            registry=r,
        )
        self.lag = LagGauge(
            "straggler_worker_consumer_lag", "input records not yet processed, per partition", r
        )

    def dead_lettered(self, error: str | BaseException) -> None:
        self.dead_letters.count(error)

    def evaluated(
        self,
        decisions: Sequence[Decision],
        refit_seconds: float | None,
        decided_from: float | None,
        sent_at: float,
    ) -> None:
        """A checkpoint's predictions are sent (``sent_at``, wall clock); ``decided_from``: its
        boundary's ``produced_at``, or for a live job's timer tick the time of the job's newest report
        (None: the job has none)."""
        self.flags.inc(sum(d.is_straggler for d in decisions))
        if refit_seconds is not None:
            self.refit_seconds.observe(refit_seconds)
        if decided_from is not None:
            self.decision_latency.observe(max(0.0, sent_at - decided_from))


async def input_lags(app: faust.App, topics: set[str]) -> dict[TopicPartition, int]:
    """Lag of the assigned input partitions: aiokafka's high watermark minus the offset after the
    last record the agent read (Faust's monitor), or the fetch position before any was read."""
    consumer = app.consumer
    ends: dict[TopicPartition, int | None] = {}
    positions: dict[TopicPartition, int | None] = {}
    read = app.monitor.tp_read_offsets
    for tp in consumer.assignment():
        if tp.topic not in topics:
            continue  # changelogs: read by table recovery, not the agent
        key = (tp.topic, tp.partition)
        ends[key] = consumer.highwater(tp)
        last = read.get(tp)
        positions[key] = last + 1 if last is not None else await consumer.position(tp)
    return partition_lags(ends, positions)


def install_lag_sampler(app: faust.App, metrics: WorkerMetrics, topics: set[str]) -> None:
    """Sample the input lag and the jobs held on a Faust timer (every `LAG_SAMPLE_S`)."""

    @app.timer(interval=LAG_SAMPLE_S, name="straggler-metrics-lag")
    async def sample_lag() -> None:
        metrics.jobs.set(metrics.count_jobs())
        try:
            metrics.lag.update(await input_lags(app, topics))
        except Exception as error:  # the consumer is starting or rebalancing: try at the next tick
            log.debug("lag sample skipped: %s", error)
