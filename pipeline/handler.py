"""What each input record asks the worker to do, without Faust.

`JobEventHandler` decodes, routes and applies records to the jobs of a `JobStore`, and yields what
to send: prediction parts, dead letters, live jobs' timer boundaries, and records copied to their
job's partition. `pipeline.app` sends them; `process` is the whole of one record's handling. The records
are acknowledged at the next group commit (`pipeline.group_commit`), but those waiting for their
job's start (`JobEventHandler.waiting_for_start`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from pipeline.group_commit import InputRecord
from pipeline.jobstore import JobStore, Position
from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    Event,
    JobEvent,
    SchemaError,
    TaskBatch,
    TaskCheckpoint,
    TaskObservations,
    dead_letter_for,
    decode,
    encode,
    observations,
    read_task_batch,
)
from schemas.events import ABANDONED
from straggler.argtypes import readable_time
from straggler.core.abandonment import job_silence
from straggler.core.decision_event import describe_flag, prediction_parts
from straggler.core.live_cadence import due, evaluation_interval, median_finished_latency
from straggler.core.online import Decision, OnlineJob
from straggler.kafka.names import TopicNames
from straggler.kafka.routing import Forward, Reject, route

log = logging.getLogger(__name__)

TaskInput = TaskObservations | CheckpointBoundary
"""What a job's input record asks of it (its valid task observations, or a boundary); it needs the
job's 'started' event first."""


def latest_time(work: TaskInput) -> float:
    """When a task input happened: a boundary's checkpoint, a batch's latest observation."""
    if isinstance(work, CheckpointBoundary):
        return work.checkpoint_time
    return max(o.checkpoint_time for o in work.observations)


@dataclass(frozen=True)
class WaitingForStart:
    """A job's input that arrived before the job's 'started' event."""

    arrived: float
    record: InputRecord
    work: TaskInput


@dataclass
class AgentStats:
    events: int = 0
    """Input records."""
    task_events: int = 0
    """Task observations (a batch counts its observations)."""
    boundaries: int = 0
    predictions: int = 0
    dead_letters: int = 0
    ignored: int = 0
    forwarded: int = 0
    """Input records copied to their job's partition (`straggler.kafka.routing`)."""


@dataclass(frozen=True)
class Send:
    """Send ``value`` keyed ``key`` to ``topic``: a prediction part, a dead letter, a live job's timer
    boundary, or a copy of an input record into ``partition``, its job's (`straggler.kafka.routing`).

    A copy keeps the order of its producer's records of the job, as sends keep their order per
    partition; its source record is acknowledged once the copy is on the broker (a group commit's
    step 1), so a crash copies it again at worst, and a repeated record changes nothing."""

    topic: str
    key: bytes | None
    value: bytes
    partition: int | None = None


class AgentMetrics(Protocol):
    """What the handler reports beyond `AgentStats` (`pipeline.metrics.WorkerMetrics`)."""

    def dead_lettered(self, error: str | BaseException) -> None: ...

    def evaluated(
        self,
        decisions: Sequence[Decision],
        refit_seconds: float | None,
        decided_from: float | None,
        sent_at: float,
    ) -> None: ...


class ConsensusHooks(Protocol):
    """What a method learnt in the stream needs of the agent (`pipeline.admm_online.AdmmWiring`)."""

    def prepare(self, job: OnlineJob | None) -> None: ...

    def retire(self, job_id: str) -> None: ...


@dataclass
class JobEventHandler:
    """The agent's state beyond the tables (events waiting for their job's start) and its rules.

    ``handle`` is a generator: the worker sends what it yields before resuming it.
    """

    store: JobStore
    method: str
    """Named in every prediction."""
    partitions: int
    """Of the input topics: a record on another partition than its job's is forwarded there."""
    pending_grace: float
    abandon_after: float | None = None
    """Seconds a live job may stay silent before it is closed as abandoned; None: from its own task
    lengths (`straggler.core.abandonment`)."""
    topics: TopicNames = field(default_factory=TopicNames)
    stats: AgentStats = field(default_factory=AgentStats)
    metrics: AgentMetrics | None = None
    consensus: ConsensusHooks | None = None
    clock: Callable[[], float] = time.monotonic
    """For the pending grace period."""
    wall_clock: Callable[[], float] = time.time
    """For ``produced_at`` of predictions and ticks."""
    pending: defaultdict[str, list[WaitingForStart]] = field(default_factory=lambda: defaultdict(list))
    """Events of jobs whose 'started' event has not arrived yet: job-events and task-checkpoints are
    separate topics, so Kafka does not order them against each other."""
    live_interval: float = 30.0
    """The longest spacing of a live job's evaluations (``--live-interval``); each job's own comes
    from its task lengths (`straggler.core.live_cadence`)."""
    last_tick: dict[str, float] = field(default_factory=dict)
    """When each live job was last given a timer boundary here (``wall_clock``; before its first, the
    job's start counts)."""
    abandoning: set[str] = field(default_factory=set)
    """Jobs whose abandonment is sent and not applied yet: not sent again meanwhile."""

    def waiting_for_start(self) -> set[Position]:
        """The records waiting for their job's start: no commit covers them yet."""
        return {waiting.record.position for items in self.pending.values() for waiting in items}

    def release_unacknowledged(self) -> None:
        """Partitions are about to be revoked (or the consumer stops): forget the records waiting for
        their jobs' start."""
        self.pending.clear()
        self.abandoning.clear()

    def admit(self, record: InputRecord) -> Event | TaskObservations | Send:
        """The record's event (a valid task batch read in one pass), to `handle` here; or what disposes
        of it (a dead letter, a forward)."""
        self.stats.events += 1
        decoded: Event | TaskObservations | None = read_task_batch(record.value)
        if decoded is None:
            try:
                decoded = decode(record.value)
            except SchemaError as error:
                return self.dead_letter(record, error)
        if isinstance(decoded, TaskObservations | TaskCheckpoint | TaskBatch | CheckpointBoundary | JobEvent):
            where = route(record.key, decoded.job_id, record.partition, self.partitions)
            if isinstance(where, Forward):
                self.stats.forwarded += 1
                return Send(record.topic, record.key, record.value or b"", where.partition)
            if isinstance(where, Reject):
                return self.dead_letter(record, where.reason)
        return decoded

    def handle(self, record: InputRecord) -> Iterator[Send]:
        """Admit the record and apply its event; a task input of a job not started yet waits in `pending`."""
        match self.admit(record):
            case Send() as disposal:
                yield disposal
            case TaskObservations() | TaskCheckpoint() | TaskBatch() as tasks:
                work = yield from self._observations(record, tasks)
                if work.observations:
                    yield from self._dispatch(record, work)
            case CheckpointBoundary() | JobEvent() as event:
                self.stats.boundaries += isinstance(event, CheckpointBoundary)
                yield from self._dispatch(record, event)
            case other:
                yield self.dead_letter(record, f"unexpected {other.type} event on {record.topic}")

    def expire_pending(self) -> list[Send]:
        """Dead letters for the events whose job has not started within the grace period (the next
        commit acknowledges their records, once the letters are on the broker)."""
        if not self.pending:
            return []
        deadline = self.clock() - self.pending_grace
        letters = []
        for job_id in [j for j, items in self.pending.items() if items and items[0].arrived < deadline]:
            reason = (
                f"event for unknown job {job_id!r}: no job_event 'started' within {self.pending_grace:.0f}s"
            )
            for waiting in self.pending.pop(job_id):
                letters.append(self.dead_letter(waiting.record, reason))
        return letters

    def abandon_silent_jobs(self) -> list[Send]:
        """An ``ended`` job event, reason ``abandoned: ...``, into the job's partition of ``job-events``
        for each live job held here that has been silent for longer than its limit
        (`straggler.core.abandonment`); the agent frees the job's state when it reads it back (so the
        mitigator and the view, which read it too, close the job at the same point of the stream)."""
        now = self.wall_clock()
        ends = []
        cached = set(self.store.cached_jobs())
        for job_id in self.store.held_jobs():
            peeked = self.store.peek_meta(job_id)
            if peeked is None or not peeked.live or job_id in self.abandoning:
                continue  # a replayed job is never abandoned: no need to load it
            meta = self.store.meta(job_id)
            job = self.store.job(job_id)
            quiet = None
            if meta is not None and job is not None and meta.live and job_id not in self.abandoning:
                quiet = job_silence(job.state, meta.started_at, now, self.abandon_after)
            if quiet is None or not quiet.abandoned:
                if job_id not in cached:  # loaded to look: the cache keeps the jobs handled here only
                    self.store.uncache(job_id)
                continue
            self.abandoning.add(job_id)
            reason = f"{ABANDONED}: {quiet.describe()}, since {readable_time(quiet.last_report)}"
            end = JobEvent(job_id=job_id, event="ended", time=quiet.last_report, reason=reason)
            ends.append(Send(self.topics.job_events, job_id.encode(), encode(end)))
        return ends

    def live_ticks(self) -> list[Send]:
        """A timer boundary for each live job of the store's cache that is due (its own spacing,
        `straggler.core.live_cadence`): only jobs this worker has handled since partitions last
        moved, so two workers never tick the same job (a live job re-enters the cache with its next
        report)."""
        now = self.wall_clock()
        ticks = []
        cached = self.store.cached_jobs()
        for gone in self.last_tick.keys() - set(cached):
            del self.last_tick[gone]
        for job_id in cached:
            meta = self.store.meta(job_id)
            if meta is None or not meta.live or job_id in self.abandoning:
                continue
            job = self.store.job(job_id)
            if job is None:
                continue
            interval = evaluation_interval(median_finished_latency(job.state), self.live_interval)
            if not due(self.last_tick.get(job_id, meta.started_at), now, interval):
                continue
            self.last_tick[job_id] = now
            meta.ticks += 1
            tick = CheckpointBoundary(
                job_id=job_id,
                checkpoint_time=now,
                checkpoint_index=meta.ticks,
                produced_at=now,
                origin="timer",
            )
            ticks.append(Send(self.topics.checkpoints, job_id.encode(), encode(tick)))
        return ticks

    def dead_letter(
        self, record: InputRecord, error: str | BaseException, payload: bytes | None = None
    ) -> Send:
        """Letter ``record`` (or ``payload``, one observation of its batch) with the reason."""
        self.stats.dead_letters += 1
        if self.metrics is not None:
            self.metrics.dead_lettered(error)
        raw = (record.value or b"") if payload is None else payload
        letter = dead_letter_for(raw, record.topic, record.partition, record.offset, error, stage="agent")
        return Send(self.topics.dead_letters, record.key, encode(letter))

    def _observations(
        self, record: InputRecord, tasks: TaskObservations | TaskCheckpoint | TaskBatch
    ) -> Generator[Send, None, TaskObservations]:
        """The record's valid task observations; each invalid one of a batch is dead-lettered alone."""
        if isinstance(tasks, TaskCheckpoint):
            tasks = TaskObservations(tasks.job_id, [tasks])
        self.stats.task_events += len(tasks.observations)
        if isinstance(tasks, TaskObservations):
            return tasks
        valid = []
        for body, observation in zip(tasks.observations, observations(tasks, record.value), strict=True):
            if isinstance(observation, SchemaError):
                yield self.dead_letter(record, observation, payload=orjson.dumps(body))
            else:
                valid.append(observation)
        return TaskObservations(tasks.job_id, valid)

    def _dispatch(self, record: InputRecord, work: TaskInput | JobEvent) -> Iterator[Send]:
        """Apply ``work``; a task input of a job not started yet waits in `pending`."""
        if isinstance(work, JobEvent):
            yield from self._apply_job_event(work)
        elif self.store.meta(work.job_id) is None or work.job_id in self.pending:
            if self._handled_before(work.job_id, latest_time(work)):
                self.stats.ignored += 1  # a closed job's record, read again after a restart
            else:
                self.pending[work.job_id].append(WaitingForStart(self.clock(), record, work))
        elif isinstance(work, CheckpointBoundary):
            yield from self._apply_boundary(work)
        else:
            self._apply_tasks(work)

    def _handled_before(self, job_id: str, at: float) -> bool:
        """Whether an event of ``job_id`` at ``at`` is one the worker handled before closing the job
        (`JobMeta.closed_at`): a worker that took over reads those again, from the offsets Faust
        committed. An event after the end is not: it waits for a start as one of an unknown job."""
        end = self.store.closed_end(job_id)
        return end is not None and at <= end

    def _apply_tasks(self, work: TaskObservations) -> None:
        """Feed task observations to their (known) job; the next commit writes what they changed."""
        store = self.store
        meta = store.meta(work.job_id)
        job = store.job(work.job_id)
        assert meta is not None and job is not None
        if not meta.feature_names:
            job = store.name_features(work.job_id, list(work.observations[0].features))
        changed = job.state.observe_all(work.observations, meta.feature_names)
        store.put_tasks(job, changed)
        self.stats.ignored += len(work.observations) - len(changed)

    def _apply_boundary(self, event: CheckpointBoundary) -> Iterator[Send]:
        meta = self.store.meta(event.job_id)
        assert meta is not None
        if event.origin == "timer":
            if meta.live:
                yield from self._evaluate(event.job_id, event.checkpoint_time, None)
            return
        if meta.live:  # a producer that did not say it sends boundaries does: no timer for this job
            meta.live = False
            self.store.meta_changed(event.job_id)
        yield from self._evaluate(event.job_id, event.checkpoint_time, event.produced_at)

    def _apply_job_event(self, event: JobEvent) -> Iterator[Send]:
        """Start or end the job, then apply the job's inputs that waited for its start."""
        store, meta = self.store, self.store.meta(event.job_id)
        if self._handled_before(event.job_id, event.time):
            self.stats.ignored += 1  # a closed job's event, read again after a restart
            return
        if event.event == "started":
            assert event.expected_tasks is not None
            live = not event.sends_boundaries
            names = list(event.feature_names or [])
            store.start(event.job_id, event.expected_tasks, names, live=live, started_at=event.time)
            kind = "live" if live else "replayed"
            when = readable_time(event.time)
            log.info("job %s started: %d tasks, %s, at %s", event.job_id, event.expected_tasks, kind, when)
        elif meta is None:
            self.stats.ignored += 1
        elif event.abandoned:
            self.abandoning.discard(event.job_id)
            log.warning("job %s closed as %s; its state is freed", event.job_id, event.reason)
            self._drop(event.job_id, event.time)
        else:
            log.info("job %s ended at %s", event.job_id, readable_time(event.time))
            if meta.last_evaluated is not None and meta.last_evaluated >= event.time:
                self._drop(event.job_id, event.time)  # its last checkpoint is evaluated
            else:
                meta.ended_at = event.time  # dropped once a boundary evaluates its end
                store.meta_changed(event.job_id)
        if store.meta(event.job_id) is not None:
            for waiting in self.pending.pop(event.job_id, []):  # in the order they arrived
                yield from self._dispatch(waiting.record, waiting.work)

    def _evaluate(self, job_id: str, at: float, boundary_produced_at: float | None) -> Iterator[Send]:
        """Evaluate the checkpoint and publish its decisions; the next commit writes what it changed."""
        meta, job = self.store.meta(job_id), self.store.job(job_id)
        if meta is None or job is None or (meta.last_evaluated is not None and at <= meta.last_evaluated):
            self.stats.ignored += 1
            return  # a duplicate or late boundary: the checkpoint was already evaluated
        if self.consensus is not None:
            self.consensus.prepare(job)  # the latest consensus weights
        started, version = time.perf_counter(), job.model_version
        decisions = self.store.evaluate(job_id, at)
        refit_seconds = time.perf_counter() - started if job.model_version != version else None
        marker = CheckpointEvaluated(
            job_id=job_id,
            checkpoint_time=at,
            evaluated=len(decisions),
            flagged=sum(d.is_straggler for d in decisions),
            model_version=job.model_version,
            boundary_produced_at=boundary_produced_at,
            produced_at=self.wall_clock(),
        )
        for part in prediction_parts(decisions, self.method, marker):
            yield Send(self.topics.predictions, job_id.encode(), part)
        when = readable_time(at)
        for d in decisions:
            if d.is_straggler:
                log.info("job %s at %s: %s", job_id, when, describe_flag(d, self.method))
        if self.metrics is not None:
            # a live job's tick has no producer's boundary: its decision waited since the job's newest report
            since = boundary_produced_at if boundary_produced_at is not None else job.state.latest_report()
            self.metrics.evaluated(decisions, refit_seconds, since, self.wall_clock())
        self.stats.predictions += len(decisions)
        if meta.ended_at is not None and at >= meta.ended_at:
            self._drop(job_id, meta.ended_at)

    def _drop(self, job_id: str, ended_at: float) -> None:
        if self.consensus is not None:
            self.consensus.retire(job_id)  # ADMM's node keeps the ended job's rows for a while
        self.store.drop(job_id, ended_at, self.wall_clock())


async def process(
    handler: JobEventHandler, record: InputRecord, send: Callable[[Send], Awaitable[None]]
) -> None:
    """Handle one input record, sending what it asks for before the handler goes on.

    A failure while handling (the handler's or a send's) dead-letters the record as an internal error."""
    try:
        for out in handler.handle(record):
            await send(out)
    except Exception as error:  # one bad event must not stop the agent
        log.exception(
            "failed on record %s[%d]@%d (key %r)", record.topic, record.partition, record.offset, record.key
        )
        await send(handler.dead_letter(record, f"internal error: {type(error).__name__}: {error}"))
