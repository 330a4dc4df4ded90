"""What each input record asks the worker to do, without Faust.

`JobEventHandler` decodes, routes and applies records to the jobs of a `JobStore`, and yields
actions: prediction parts, dead letters (with their reason), forwards, live ticks, and
`Acknowledge`, where the worker must wait until the broker has everything sent so far.
`pipeline.app` performs the actions; `process` is the whole of one record's handling.

When a record may be acknowledged, and the order of a checkpoint's writes, are
`pipeline.commit_order`'s; the handler tells it which records wait for their job's start.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from pipeline.commit_order import Acknowledge, CommitOrder, InputRecord
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
from straggler.core.decision_event import prediction_parts
from straggler.core.online import Decision, OnlineJob
from straggler.kafka.routing import Forward, Reject, route

log = logging.getLogger(__name__)

TaskInput = TaskObservations | CheckpointBoundary
"""What a job's input record asks of it (its valid task observations, or a boundary); it needs the
job's 'started' event first."""


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
class SendPredictionPart:
    """Send a ``prediction_batch`` part to the predictions topic."""

    key: bytes
    value: bytes


@dataclass(frozen=True)
class SendDeadLetter:
    """Send a dead letter (``value``, the encoded letter) for a record that could not be handled."""

    key: bytes | None
    value: bytes
    reason: str


@dataclass(frozen=True)
class ForwardRecord:
    """Copy ``record``, unchanged, to ``partition`` of its topic (its job's partition)."""

    record: InputRecord
    partition: int


@dataclass(frozen=True)
class SendTick:
    """Send a timer boundary of a live job to the checkpoints topic, into the job's partition."""

    key: bytes
    value: bytes


Action = SendPredictionPart | SendDeadLetter | ForwardRecord | SendTick | Acknowledge


class AgentMetrics(Protocol):
    """What the handler reports beyond `AgentStats` (`pipeline.metrics.WorkerMetrics`)."""

    def dead_lettered(self, error: str | BaseException) -> None: ...

    def evaluated(
        self,
        decisions: Sequence[Decision],
        refit_seconds: float | None,
        boundary_produced_at: float | None,
        sent_at: float,
    ) -> None: ...


class ConsensusHooks(Protocol):
    """What a method learnt in the stream needs of the agent (`pipeline.admm_online.AdmmWiring`)."""

    def prepare(self, job: OnlineJob | None) -> None: ...

    def retire(self, job_id: str) -> None: ...


@dataclass
class JobEventHandler:
    """The agent's state beyond the tables (events waiting for their job's start) and its rules.

    ``handle`` is a generator: the worker performs each action it yields before resuming it, so the
    writes after an `Acknowledge` happen only once what came before is on the broker.
    """

    store: JobStore
    method: str
    """Named in every prediction."""
    partitions: int
    """Of the input topics: a record on another partition than its job's is forwarded there."""
    pending_grace: float
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
    commits: CommitOrder = field(init=False)
    """The input records not acknowledged yet, and the order of a checkpoint's writes."""
    _waiting_start: dict[Position, str] = field(default_factory=dict)
    """The records of `pending`, and those taken from it whose changes are not applied yet or whose
    dead letter is not sent yet, with their jobs."""
    _expiring: list[Position] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.commits = CommitOrder(self.store, self.waits_for_start, self.clock)

    def waits_for_start(self, position: Position) -> str | None:
        """The job whose start the record at ``position`` waits for (or, started, its application)."""
        return self._waiting_start.get(position)

    def let_go(self) -> list[InputRecord]:
        """Partitions are about to move: forget the records waiting for their jobs' start, and give
        up every record received but the one in hand (`CommitOrder.let_go`)."""
        self.pending.clear()
        self._waiting_start.clear()
        self._expiring.clear()
        return self.commits.let_go()

    def admit(self, record: InputRecord) -> Event | TaskObservations | SendDeadLetter | ForwardRecord:
        """The record's event (a valid task batch read in one pass), to `handle` here; or what disposes
        of it (a dead letter, a forward)."""
        self.stats.events += 1
        decoded: Event | TaskObservations | None = read_task_batch(record.value)
        if decoded is None:
            try:
                decoded = decode(record.value)
            except SchemaError as error:
                return self._dead_letter(record, error)
        if isinstance(decoded, TaskObservations | TaskCheckpoint | TaskBatch | CheckpointBoundary | JobEvent):
            where = route(record.key, decoded.job_id, record.partition, self.partitions)
            if isinstance(where, Forward):
                self.stats.forwarded += 1
                return ForwardRecord(record, where.partition)
            if isinstance(where, Reject):
                return self._dead_letter(record, where.reason)
        return decoded

    def handle(self, record: InputRecord, decoded: Event | TaskObservations) -> Iterator[Action]:
        """Apply an admitted event; a task input of a job not started yet waits in `pending`."""
        if isinstance(decoded, TaskObservations | TaskCheckpoint | TaskBatch | CheckpointBoundary):
            work: TaskInput
            if isinstance(decoded, TaskObservations):
                self.stats.task_events += len(decoded.observations)
                work = decoded
            elif isinstance(decoded, TaskCheckpoint):
                self.stats.task_events += 1
                work = TaskObservations(decoded.job_id, [decoded])
            elif isinstance(decoded, TaskBatch):
                self.stats.task_events += len(decoded.observations)
                valid = yield from self._valid_observations(record, decoded)
                if not valid:
                    return
                work = TaskObservations(decoded.job_id, valid)
            else:
                self.stats.boundaries += 1
                work = decoded
            yield from self._dispatch(record, work)
        elif isinstance(decoded, JobEvent):
            yield from self._dispatch(record, decoded)
        else:
            yield self._dead_letter(record, f"unexpected {decoded.type} event on {record.topic}")

    def failed(self, record: InputRecord, error: Exception) -> SendDeadLetter:
        """The dead letter of a record whose handling raised: one bad event must not stop the agent."""
        return self._dead_letter(record, f"internal error: {type(error).__name__}: {error}")

    def expire_pending(self) -> list[SendDeadLetter]:
        """Dead letters for the events whose job has not started within the grace period; their
        records are acknowledged once the worker has sent them (`letters_sent`)."""
        if not self.pending:
            return []
        deadline = self.clock() - self.pending_grace
        letters = []
        for job_id in [j for j, items in self.pending.items() if items and items[0].arrived < deadline]:
            reason = (
                f"event for unknown job {job_id!r}: no job_event 'started' within {self.pending_grace:.0f}s"
            )
            for waiting in self.pending.pop(job_id):
                letters.append(self._dead_letter(waiting.record, reason))
                self._expiring.append(waiting.record.position)
        return letters

    def letters_sent(self) -> None:
        """The letters of the last `expire_pending` are sent: their records are done."""
        for position in self._expiring:
            self._waiting_start.pop(position, None)
        self._expiring.clear()

    def live_ticks(self) -> list[SendTick]:
        """A timer boundary for each live job of the store's cache (jobs this worker handles now)."""
        now = self.wall_clock()
        ticks = []
        for job_id in self.store.cached_jobs():
            meta = self.store.meta(job_id)
            if meta is None or not meta.live:
                continue
            meta.ticks += 1
            tick = CheckpointBoundary(
                job_id=job_id,
                checkpoint_time=now,
                checkpoint_index=meta.ticks,
                produced_at=now,
                origin="timer",
            )
            ticks.append(SendTick(job_id.encode(), encode(tick)))
        return ticks

    def _dead_letter(
        self, record: InputRecord, error: str | BaseException, payload: bytes | None = None
    ) -> SendDeadLetter:
        """Letter ``record`` (or ``payload``, one observation of its batch) with the reason."""
        self.stats.dead_letters += 1
        if self.metrics is not None:
            self.metrics.dead_lettered(error)
        raw = (record.value or b"") if payload is None else payload
        letter = dead_letter_for(raw, record.topic, record.partition, record.offset, error, stage="agent")
        return SendDeadLetter(record.key, encode(letter), letter.error)

    def _valid_observations(
        self, record: InputRecord, batch: TaskBatch
    ) -> Generator[SendDeadLetter, None, list[TaskCheckpoint]]:
        """The batch's valid observations; each invalid one is dead-lettered alone, with its reason."""
        valid = []
        for body, observation in zip(batch.observations, observations(batch, record.value), strict=True):
            if isinstance(observation, SchemaError):
                yield self._dead_letter(record, observation, payload=orjson.dumps(body))
            else:
                valid.append(observation)
        return valid

    def _dispatch(self, record: InputRecord, work: TaskInput | JobEvent) -> Iterator[Action]:
        """Apply ``work``; a task input of a job not started yet waits in `pending`."""
        if isinstance(work, JobEvent):
            yield from self._apply_job_event(work)
        elif self.store.meta(work.job_id) is None or work.job_id in self.pending:
            self.pending[work.job_id].append(WaitingForStart(self.clock(), record, work))
            self._waiting_start[record.position] = work.job_id
        else:
            yield from self._apply(record, work)

    def _apply(self, record: InputRecord, work: TaskInput) -> Iterator[Action]:
        """Apply a job's input; its record waits for the job's next task row if it changed the job."""
        if isinstance(work, CheckpointBoundary):
            yield from self._apply_boundary(work)
            return
        yield from self.commits.before_write(work.job_id)
        self._apply_tasks(work)
        if self.store.has_changes(work.job_id):
            self.store.hold(work.job_id, record.position)  # written with the job's next checkpoint

    def _apply_tasks(self, work: TaskObservations) -> None:
        """Feed task observations to their (known) job; `JobStore.write_changes` writes what they changed."""
        store = self.store
        meta = store.meta(work.job_id)
        job = store.job(work.job_id)
        assert meta is not None and job is not None
        if not meta.feature_names:
            meta.feature_names = list(work.observations[0].features)
            store.save_meta(work.job_id, meta)
            job = store.reload(work.job_id)  # rebuild with the right feature count
            assert job is not None
        changed = job.state.observe_all(work.observations, meta.feature_names)
        store.put_tasks(job, changed)
        self.stats.ignored += len(work.observations) - len(changed)

    def _apply_boundary(self, event: CheckpointBoundary) -> Iterator[Action]:
        meta = self.store.meta(event.job_id)
        assert meta is not None
        if event.origin == "timer":
            if meta.live:
                yield from self._evaluate(event.job_id, event.checkpoint_time, None)
            return
        if meta.live:  # a producer that did not say it sends boundaries does: no timer for this job
            yield from self.commits.before_write(event.job_id)
            meta.live = False
            self.store.save_meta(event.job_id, meta)
        yield from self._evaluate(event.job_id, event.checkpoint_time, event.produced_at)

    def _apply_job_event(self, event: JobEvent) -> Iterator[Action]:
        """Start or end the job; a start applies the job's inputs that waited for it."""
        yield from self.commits.before_write(event.job_id)
        self._start_or_end(event)
        if self.store.meta(event.job_id) is not None:
            for waiting in self.pending.pop(event.job_id, []):  # in the order they arrived
                yield from self._apply(waiting.record, waiting.work)
                self._waiting_start.pop(waiting.record.position, None)

    def _start_or_end(self, event: JobEvent) -> None:
        store = self.store
        if event.event == "started":
            assert event.expected_tasks is not None
            live = not event.sends_boundaries
            store.start(event.job_id, event.expected_tasks, list(event.feature_names or []), live=live)
            log.info(
                "job %s started: %d tasks, %s",
                event.job_id,
                event.expected_tasks,
                "live" if live else "replayed",
            )
            return
        meta = store.meta(event.job_id)
        if meta is None:
            self.stats.ignored += 1
            return
        log.info("job %s ended at %g", event.job_id, event.time)
        if meta.last_evaluated is not None and meta.last_evaluated >= event.time:
            self._drop(event.job_id)
        else:
            meta.ended_at = event.time
            store.save_meta(event.job_id, meta)

    def _evaluate(self, job_id: str, at: float, boundary_produced_at: float | None) -> Iterator[Action]:
        """Evaluate the checkpoint, publish its decisions, commit it (`CommitOrder.checkpoint`)."""
        meta = self.store.meta(job_id)
        if meta is None or (meta.last_evaluated is not None and at <= meta.last_evaluated):
            self.stats.ignored += 1
            return  # a duplicate or late boundary: the checkpoint was already evaluated
        refit_seconds: float | None = None

        def evaluate() -> list[Decision]:
            nonlocal refit_seconds
            job = self.store.job(job_id)
            assert job is not None
            if self.consensus is not None:
                self.consensus.prepare(job)  # the latest consensus weights
            started, version = time.perf_counter(), job.model_version
            decisions = self.store.evaluate(job_id, at)
            if job.model_version != version:
                refit_seconds = time.perf_counter() - started
            return decisions

        def publish(decisions: list[Decision]) -> Iterator[Action]:
            job = self.store.job(job_id)
            assert job is not None
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
                yield SendPredictionPart(job_id.encode(), part)

        decisions, meta = yield from self.commits.checkpoint(job_id, at, evaluate, publish)
        if self.metrics is not None:
            self.metrics.evaluated(decisions, refit_seconds, boundary_produced_at, self.wall_clock())
        self.stats.predictions += len(decisions)
        if meta.ended_at is not None and at >= meta.ended_at:
            yield from self.commits.before_write(job_id)
            self._drop(job_id)

    def _drop(self, job_id: str) -> None:
        if self.consensus is not None:
            self.consensus.retire(job_id)  # ADMM's node keeps the ended job's rows for a while
        self.store.drop(job_id)


async def process(
    handler: JobEventHandler, record: InputRecord, perform: Callable[[Action], Awaitable[None]]
) -> bool:
    """Handle one input record, performing each action before the handler goes on; False if its
    partition was let go meanwhile (the worker gives the record up, unacknowledged).

    A failure while handling (the handler's or a send's) dead-letters the record as an internal
    error. Then the jobs that hold the partition's records too long are written."""
    commits = handler.commits
    commits.received(record)
    admitted = handler.admit(record)
    if isinstance(admitted, SendDeadLetter | ForwardRecord):
        await perform(admitted)
    else:
        try:
            for action in handler.handle(record, admitted):
                await perform(action)
        except Exception as error:  # one bad event must not stop the agent
            log.exception(
                "failed on record %s[%d]@%d (key %r)",
                record.topic,
                record.partition,
                record.offset,
                record.key,
            )
            await perform(handler.failed(record, error))
    if not commits.handled(record):
        return False
    for action in commits.write_overdue(record.partition):  # its table writes go to this partition
        await perform(action)
    return True
