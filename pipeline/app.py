"""The Faust worker: one App, one agent partitioned by job id, NURD at every checkpoint boundary.

    task-checkpoints + job-events --> [agent: decode, validate, update, evaluate] --> straggler-predictions
                                                 \\--> dead-letters (anything that fails to decode)

The agent only moves events: it decodes and validates them (`schemas`), feeds task observations
(``task_checkpoint`` or ``task_batch`` records) to the job's `OnlineJob` (`straggler.core.online`, the
object the offline evaluator drives), and at a checkpoint boundary publishes the verdicts as
``prediction_batch`` records (one per job checkpoint, in parts within 64 KiB; the last part completes
the checkpoint). Jobs that send no boundaries (live telemetry) are evaluated on a timer that publishes a
boundary into the job's own partition, so every table write goes to the right changelog partition; a
record on a foreign partition is first forwarded to its job's (`straggler.kafka.routing`). What each
record asks is decided by `pipeline.handler`; this module performs it with Faust.
"""

from __future__ import annotations

from typing import Any, cast

import faust

from pipeline.commit_order import IDLE_SECONDS, InputRecord
from pipeline.faust_app import TABLE_HELP, TABLES, faust_app, method_factory
from pipeline.faust_app import create_changelog_topics as create_changelog_topics  # `straggler worker`
from pipeline.faust_patches import acknowledged, give_up, let_go_before_waiting, writes_routed_to
from pipeline.handler import (
    Action,
    AgentStats,
    ForwardRecord,
    JobEventHandler,
    SendDeadLetter,
    SendPredictionPart,
    SendTick,
    process,
)
from pipeline.jobstore import JobStore, Position, new_online_job
from pipeline.metrics import WorkerMetrics, install_lag_sampler
from pipeline.settings import WorkerSettings


def create_app(settings: WorkerSettings) -> faust.App:
    """Build the worker's App with its topics, tables, agent and timers (`Worker`)."""
    return Worker(settings).app


class Worker:
    """The worker's Faust wiring: its topics and tables, the agent that hands each record to
    `pipeline.handler.process`, and the timers; it performs the handler's actions and acknowledges
    the records `CommitOrder.acknowledgeable` hands out."""

    def __init__(self, settings: WorkerSettings) -> None:
        names = settings.topics
        self.app = app = faust_app(settings)
        self.inputs = app.topic(names.checkpoints, names.job_events, key_type=bytes, value_type=bytes)
        self.predictions = app.topic(names.predictions, key_type=bytes, value_type=bytes)
        self.dead_letters = app.topic(names.dead_letters, key_type=bytes, value_type=bytes)
        self.home_topics = {  # where a record on a foreign partition is copied to, and ticks go
            name: app.topic(name, key_type=bytes, value_type=bytes)
            for name in (names.checkpoints, names.job_events)
        }
        self.boundaries = self.home_topics[names.checkpoints]
        # Rows are bytes we encode ourselves: without key_type/value_type=bytes Faust writes them raw but
        # decodes the changelog as JSON on recovery, and a restarted worker never finishes recovering.
        tasks, jobs, models = (
            app.Table(
                name, partitions=settings.partitions, key_type=bytes, value_type=bytes, help=TABLE_HELP[name]
            )
            for name in TABLES
        )
        protocol = {
            "quantile": settings.quantile,
            "start_fraction": settings.start_fraction,
            "refit_growth": settings.refit_growth,
        }
        self.store = JobStore(
            tasks, jobs, models, make_job=new_online_job(method_factory(settings), protocol)
        )
        admm = None
        if settings.admm_interval is not None:
            from pipeline.admm_online import install

            admm = install(app, settings, self.store)
        stats = AgentStats()
        metrics = WorkerMetrics(stats, jobs=lambda: len(jobs))
        app.straggler_stats = stats  # type: ignore[attr-defined]
        app.straggler_metrics = metrics  # type: ignore[attr-defined]  # served by `straggler worker --metrics-port`
        install_lag_sampler(app, metrics, {names.checkpoints, names.job_events})
        self.handler = JobEventHandler(
            self.store,
            method=settings.method,
            partitions=settings.partitions,
            pending_grace=settings.pending_grace,
            stats=stats,
            metrics=metrics,
            consensus=admm,
        )
        self.commits = self.handler.commits
        self.unacknowledged: dict[Position, faust.EventT] = {}
        """The events of the records received and not acknowledged or given up yet."""
        app.on_partitions_revoked.connect(cast(Any, self.on_partitions_revoked))
        app.on_partitions_assigned.connect(cast(Any, self.on_partitions_assigned))
        app.agent(self.inputs)(self.straggler_agent)
        app.timer(interval=1.0)(self.expire_pending)
        app.timer(interval=IDLE_SECONDS / 2)(self.write_held_changes)
        app.timer(interval=settings.live_interval)(self.evaluate_live_jobs)

    async def straggler_agent(self, stream: faust.StreamT[bytes]) -> None:
        """Decode -> validate -> update the job's state -> at a boundary, NURD -> predictions.

        Records are acknowledged by hand, once their changes are written (`pipeline.commit_order`)."""
        let_go_before_waiting(self.app.consumer, self.let_go)
        async for event in cast(faust.Stream[bytes], stream).noack().events():
            message = event.message
            record = InputRecord(message.key, message.value, message.topic, message.partition, message.offset)
            self.unacknowledged[record.position] = event
            if not await process(self.handler, record, self.perform):
                give_up(self.unacknowledged.pop(record.position))  # its partition was let go meanwhile
            self.acknowledge()

    def acknowledge(self) -> None:
        """Acknowledge the records whose changes are written: Faust commits their offsets."""
        for record in self.commits.acknowledgeable():
            self.unacknowledged.pop(record.position).ack()

    def let_go(self) -> None:
        """Partitions move: give up the records not acknowledged (their next owner reads them again)."""
        for record in self.handler.let_go():
            give_up(self.unacknowledged.pop(record.position))

    async def on_partitions_revoked(self, sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        """The cache may hold jobs that are no longer ours: drop it, with the records not acknowledged."""
        self.let_go()
        self.store.forget_cache()

    async def on_partitions_assigned(self, sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        """The cache may miss changelog updates: drop it, unless it holds changes not written yet
        (records of this assignment, handled before this signal; the revocation dropped the rest)."""
        if not self.unacknowledged:
            self.store.forget_cache()

    async def perform(self, action: Action) -> None:
        """Send what the handler asks for, or wait for the broker where it says so."""
        if isinstance(action, SendPredictionPart):
            await self.predictions.send(key=action.key, value=action.value)
        elif isinstance(action, SendDeadLetter):
            await self.dead_letters.send(key=action.key, value=action.value)
        elif isinstance(action, SendTick):
            await self.boundaries.send(key=action.key, value=action.value)
        elif isinstance(action, ForwardRecord):
            # Sends keep their order per partition, so one producer's records of a job stay in order;
            # the source offset is committed only after the copy is on the broker (`drain_fully`), so
            # a crash forwards it again at worst: a repeated observation, boundary or start changes nothing.
            record = action.record
            await self.home_topics[record.topic].send(
                key=record.key, value=record.value, partition=action.partition
            )
        else:
            await acknowledged(self.app.producer)

    async def expire_pending(self) -> None:
        """Task events whose job never started go to dead letters once the grace period is over."""
        letters = self.handler.expire_pending()
        for letter in letters:
            await self.perform(letter)
        if letters:
            self.handler.letters_sent()
            self.acknowledge()

    async def write_held_changes(self) -> None:
        """Jobs that held records longer than allowed, or any once the input paused, have their
        changes written, so a job without checkpoints does not hold its partition's commits back."""
        if not self.app.flow_control.is_active():
            return  # partitions are moving
        overdue = self.commits.overdue()
        if any(self.store.awaiting_acknowledgement(job_id) for job_id in overdue):
            for action in self.commits.flush():
                await self.perform(action)
            overdue = self.commits.overdue()  # the agent may have gone on meanwhile
        for job_id, record in overdue.items():
            event = self.unacknowledged.get(record.position)
            if event is not None:
                with writes_routed_to(event):
                    self.commits.write_held(job_id)
        self.acknowledge()

    async def evaluate_live_jobs(self) -> None:
        """Jobs that send no boundaries get one from the worker, into their own partition.

        Only jobs this worker has handled since its last rebalance (its cache) are ticked, so two
        workers never tick the same job; a live job re-enters the cache with its next report.
        """
        for tick in self.handler.live_ticks():
            await self.perform(tick)
