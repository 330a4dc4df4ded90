"""The Faust worker: one App, one agent partitioned by job id, NURD at every checkpoint boundary.

    task-checkpoints + job-events --> [agent: decode, validate, update, evaluate] --> straggler-predictions
                                                 \\--> dead-letters (anything that fails to decode)

What each record asks is decided by `pipeline.handler` (the job's `OnlineJob`, the object the offline
evaluator drives, at every boundary); this module sends it with Faust, ticks the jobs that send no
boundaries (live telemetry), and acknowledges the records at each group commit (`pipeline.group_commit`).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, cast

import faust

from pipeline.faust_app import create_changelog_topics as create_changelog_topics  # `straggler worker`
from pipeline.faust_app import faust_app, job_store, start_uncommitted_inputs_at_their_beginning
from pipeline.faust_patches import (
    acknowledged,
    release_before_wait_empty,
    release_without_commit,
    restart_stalled_recovery,
)
from pipeline.group_commit import COMMIT_SECONDS, GroupCommit, InputRecord
from pipeline.handler import AgentStats, JobEventHandler, Send, process
from pipeline.jobstore import CLOSED_ROW_SECONDS, Position
from pipeline.metrics import WorkerMetrics, install_lag_sampler
from pipeline.settings import WorkerSettings
from straggler.core.live_cadence import FLOOR_S
from straggler.kafka.names import ready_line

log = logging.getLogger(__name__)


class Worker:
    """The worker's Faust wiring: its topics and tables, the agent that hands each record to
    `pipeline.handler.process`, and the timers; it sends what the handler asks for and acknowledges
    the records each `GroupCommit.commit` hands out."""

    def __init__(self, settings: WorkerSettings) -> None:
        names = settings.topics
        self.app = app = faust_app(settings)
        topic = partial(app.topic, key_type=bytes, value_type=bytes)
        self.inputs = topic(names.checkpoints, names.job_events)
        outputs = (names.predictions, names.dead_letters, names.checkpoints, names.job_events)
        self.outputs = {name: topic(name) for name in outputs}
        """The topics a `Send` names; the input topics take copies of records and live jobs' ticks."""
        self.store = job_store(app, settings)
        admm = None
        if settings.admm_interval is not None:
            from pipeline.admm_online import install

            admm = install(app, settings, self.store)
        stats = AgentStats()
        metrics = WorkerMetrics(stats, jobs=self.store.open_jobs)
        app.straggler_metrics = metrics  # type: ignore[attr-defined]  # served by `straggler worker --metrics-port`
        install_lag_sampler(app, metrics, {names.checkpoints, names.job_events})
        # a recovery owed records it will never fetch reads them again (`pipeline.faust_patches`)
        restart_stalled_recovery(app, on_restart=metrics.recovery_restarts.inc)
        self.handler = JobEventHandler(
            self.store,
            method=settings.method,
            partitions=settings.partitions,
            pending_grace=settings.pending_grace,
            abandon_after=settings.abandon_after,
            live_interval=settings.live_interval,
            topics=names,
            stats=stats,
            metrics=metrics,
            consensus=admm,
        )
        self.commits = GroupCommit(self.store, self.handler.waiting_for_start)
        self.unacknowledged: dict[Position, faust.EventT] = {}
        """The events of the records received and not acknowledged or released yet."""
        self.handling = asyncio.Lock()
        """Held while a record is handled or a commit runs: they never interleave."""
        start_uncommitted_inputs_at_their_beginning(app, {names.checkpoints, names.job_events})
        app.on_partitions_revoked.connect(cast(Any, self.on_partitions_revoked))
        app.on_partitions_assigned.connect(cast(Any, self.on_partitions_assigned))
        app.on_rebalance_complete.connect(cast(Any, self.on_rebalance_complete))
        self.settings = settings
        self.ready = False
        """Said so (`ready_line`), once: at the end of its first rebalance."""
        app.agent(self.inputs)(self.straggler_agent)
        app.timer(interval=1.0)(self.expire_pending)
        app.timer(interval=COMMIT_SECONDS / 2)(self.commit_when_due)
        # Every second (or --live-interval, if shorter): each live job is given a boundary at its own
        # spacing (`straggler.core.live_cadence`); the silent ones are looked for every --live-interval.
        app.timer(interval=min(settings.live_interval, FLOOR_S))(self.evaluate_live_jobs)
        app.timer(interval=settings.live_interval)(self.close_abandoned_jobs)
        app.timer(interval=CLOSED_ROW_SECONDS / 10)(self.expire_closed_rows)

    async def straggler_agent(self, stream: faust.StreamT[bytes]) -> None:
        """Decode -> validate -> update the job's state -> at a boundary, NURD -> predictions.

        Records are acknowledged by hand, by the group commit that makes their changes durable."""
        release_before_wait_empty(self.app.consumer, self.release_unacknowledged)
        async for event in cast(faust.Stream[bytes], stream).noack().events():
            message = event.message
            record = InputRecord(message.key, message.value, message.topic, message.partition, message.offset)
            # Held from the moment it arrives, before the lock: a stop or a rebalance that releases
            # records while a commit holds the lock must release this one too, or Faust waits for it
            # forever (its flow is suspended, so no later record brings the commit that would ack it).
            self.unacknowledged[record.position] = event
            async with self.handling:
                if record.position not in self.unacknowledged:
                    continue  # released while waiting: its partition's next owner reads it again
                await process(self.handler, record, self.send)
                if record.position in self.unacknowledged:
                    self.commits.handled(record)
                else:  # its partition was revoked meanwhile: its changes go too
                    self.store.forget_cache()
                if self.commits.due():
                    await self.commit()

    async def commit(self) -> None:
        """Make every change so far durable, then acknowledge the records it covers: Faust commits
        their offsets (`GroupCommit.commit`)."""
        try:
            records = await self.commits.commit(lambda: acknowledged(self.app.producer))
        except Exception:  # the broker is unreachable: the records wait for the next commit
            log.exception("commit failed; its records stay unacknowledged until a commit succeeds")
            return
        for record in records:
            event = self.unacknowledged.pop(record.position, None)
            if event is not None:  # else released by a rebalance meanwhile
                event.ack()

    async def commit_when_due(self) -> None:
        """Commit what the agent handled once the input pauses (the agent commits while it runs)."""
        if self.commits.due() and self.app.flow_control.is_active():  # not while partitions move
            async with self.handling:
                await self.commit()

    def release_unacknowledged(self) -> None:
        """Partitions are revoked (or the consumer stops): release the records not acknowledged (their
        next owner reads them again), and forget the changes they made."""
        self.store.forget_cache()
        self.handler.release_unacknowledged()
        self.commits.release_unacknowledged()
        for event in self.unacknowledged.values():
            release_without_commit(event)
        self.unacknowledged.clear()

    async def on_partitions_revoked(self, sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        """The cache may hold jobs that are no longer ours: drop it, with the records not acknowledged."""
        self.release_unacknowledged()

    async def on_partitions_assigned(self, sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        """The cache may miss changelog updates: drop it, unless it holds changes not written yet
        (records of this assignment, handled before this signal; the revocation dropped the rest)."""
        if not self.unacknowledged:
            self.store.forget_cache()

    async def on_rebalance_complete(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        """The first time: say that the worker consumes, where and what (`ready_line`)."""
        if self.ready:
            return
        self.ready = True
        names = self.settings.topics
        reads = [names.checkpoints, names.job_events]
        mine = [tp for tp in self.app.consumer.assignment() if tp.topic in reads]
        writes = [names.predictions, names.dead_letters]
        log.info(ready_line("worker", self.settings.bootstrap, reads, writes, len(mine)))

    async def send(self, out: Send) -> None:
        """Send what the handler asks for."""
        await self.outputs[out.topic].send(key=out.key, value=out.value, partition=out.partition)

    async def expire_pending(self) -> None:
        """Task events whose job never started go to dead letters once the grace period is over."""
        async with self.handling:
            for letter in self.handler.expire_pending():
                await self.send(letter)

    async def close_abandoned_jobs(self) -> None:
        """An ``ended`` job event, reason ``abandoned: ...``, for each live job silent for longer than
        its limit (`JobEventHandler.abandon_silent_jobs`)."""
        if self.app.flow_control.is_active():  # not while partitions move
            async with self.handling:
                for end in self.handler.abandon_silent_jobs():
                    await self.send(end)

    async def expire_closed_rows(self) -> None:
        """Delete the rows of jobs closed long ago (`pipeline.jobstore.CLOSED_ROW_SECONDS`)."""
        if self.app.flow_control.is_active():  # not while partitions move
            async with self.handling:
                self.store.expire_closed(self.handler.wall_clock())

    async def evaluate_live_jobs(self) -> None:
        """Jobs that send no boundaries get one from the worker, into their own partition, when due
        (`JobEventHandler.live_ticks`)."""
        for tick in self.handler.live_ticks():
            await self.send(tick)
