"""The mitigation consumer's Prometheus metrics (``straggler mitigate --metrics-port``).

`MitigationStats` (committed work) is read at scrape time; commands by action and dead letters by
kind are counted here when their transaction commits, so an aborted batch is never counted. Under the
watchdog the consumer process serves the endpoint, and a restarted one starts from the supervisor's
restart count (its other counters restart at zero, which Prometheus's ``rate`` takes as a reset).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, get_args

from confluent_kafka import Consumer
from prometheus_client import Counter, Gauge, Histogram

from schemas import DeadLetter, MitigationNote, RelaunchCommand
from schemas.events import Action
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

CONSUMER_COUNTERS = (
    StatCounter("consumed", "straggler_mitigator_records", "input records consumed (committed)"),
    StatCounter("predictions", "straggler_mitigator_predictions", "per-task predictions consumed"),
    StatCounter("checkpoints", "straggler_mitigator_checkpoints", "checkpoint markers acted on"),
    StatCounter("transactions", "straggler_mitigator_transactions", "transactions committed"),
    StatCounter("aborts", "straggler_mitigator_transaction_aborts", "transactions aborted and redone"),
    StatCounter(
        "rebuilt_records",
        "straggler_mitigator_rebuilt_records",
        "input records replayed to rebuild the state after assignments and aborts",
    ),
)


class MitigationMetrics:
    """The consumer's registry and the hooks its loop calls (all from the loop's thread)."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        """``stats``: returns the running consumer's current `MitigationStats`."""
        self.registry = process_registry()
        self.registry.register(StatsCollector(stats, CONSUMER_COUNTERS))
        r = self.registry
        self.commands = Counter(
            "straggler_mitigator_commands", "relaunch commands committed, by action", ["action"], registry=r
        )
        for action in get_args(Action):
            self.commands.labels(action)
        self.dead_letters = DeadLetterCounter("straggler_mitigator_dead_letters", r)
        self.jobs = Gauge("straggler_mitigator_jobs", "jobs whose state the consumer holds", registry=r)
        self.watchdog_restarts = Counter(
            "straggler_mitigator_watchdog_restarts",
            "consumer processes the watchdog replaced: stuck, killed by a signal or failed transiently",
            registry=r,
        )
        self.lag = LagGauge("straggler_mitigator_consumer_lag", "input records not yet committed", r)
        self.races = Counter(
            "straggler_mitigator_races",
            "speculative copies whose race was decided (the loser killed), by outcome",
            ["outcome"],
            registry=r,
        )
        for outcome in ("copy_won", "copy_lost"):
            self.races.labels(outcome)
        self.command_latency = Histogram(
            "straggler_mitigator_command_latency_seconds",
            "from the produce time of the input record that caused a command to the commit of its "
            "transaction (the mitigator's part of a decision's latency)",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self._copied: dict[tuple[str, str], int] = {}
        """(job, task) -> the attempt a committed duplicate copied: a later kill of that attempt means
        the copy won, of the copy (attempt + 1) that it lost."""
        self._sampled_at = -float("inf")

    def committed(self, outputs: Sequence[RelaunchCommand | MitigationNote | DeadLetter], jobs: int) -> None:
        """A transaction with these outputs committed; ``jobs``: the state's jobs after it."""
        for output in outputs:
            if isinstance(output, RelaunchCommand):
                self.commands.labels(output.action).inc()
                self._race(output)
            elif isinstance(output, DeadLetter):
                self.dead_letters.count(output.error)
        self.jobs.set(jobs)

    def commands_committed(self, committed_at: float, caused_at: Sequence[float]) -> None:
        """Commands whose transaction committed at ``committed_at``, each by the produce time (seconds)
        of the record that caused it."""
        for produced in caused_at:
            self.command_latency.observe(max(committed_at - produced, 0.0))

    def _race(self, command: RelaunchCommand) -> None:
        key = (command.job_id, command.task_id)
        if command.action == "duplicate" and command.attempt is not None:
            self._copied[key] = command.attempt
        elif command.action == "kill" and key in self._copied:
            original = self._copied.pop(key)
            if command.attempt == original:
                self.races.labels("copy_won").inc()
            elif command.attempt == original + 1:
                self.races.labels("copy_lost").inc()

    def sample_lag(self, consumer: Consumer, force: bool = False) -> None:
        """At most every `LAG_SAMPLE_S`: the assigned partitions' lag from librdkafka's cached end
        offsets (the last stable offset under read_committed) and the consumer's positions; no
        broker round trip."""
        now = time.monotonic()
        if not force and now - self._sampled_at < LAG_SAMPLE_S:
            return
        self._sampled_at = now
        assignment = consumer.assignment()
        ends: dict[TopicPartition, int | None] = {}
        for tp in assignment:
            _, end = consumer.get_watermark_offsets(tp, cached=True)
            ends[(tp.topic, tp.partition)] = end
        positions = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(assignment)}
        self.lag.update(partition_lags(ends, positions))
