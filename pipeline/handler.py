"""The agent's event handling without Faust: what each input record asks the worker to send, and when.

`JobEventHandler` decodes, routes and applies records to the jobs of a `JobStore`, and yields
actions: prediction parts, dead letters (with their reason), forwards, live ticks, and
`Acknowledge`, the points where the worker must wait until the broker has everything sent so far
(the write order of a checkpoint, `pipeline.jobstore`). `pipeline.app` only performs the actions.

A job's task changes are written at its checkpoints, not per record, so an input record is held
until its changes are written, and its offset may be committed only then: `take_acks` hands out the
records done, in offset order per partition (Faust commits the highest contiguous acknowledged
offset). A job that reaches no checkpoint within ``hold_seconds`` has its changes written anyway.

A refit may run off the event loop (`RunRefit`): its partition's later records wait, held, until
`refit_done` concludes the checkpoint; other partitions' records go on, and no decision changes. So may
a wait for the broker (`park_acknowledgements`): the partition parks until the worker's next group
flush (`flush_started`, `flush_done`), one round trip for every parked partition.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from pipeline.jobstore import JobMeta, JobStore
from pipeline.partition_waits import WaitingPartitions
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
from straggler.core.online import CheckpointPlan, Decision, OnlineJob
from straggler.core.partitioner import partition_of
from straggler.kafka.routing import Forward, Reject, route

log = logging.getLogger(__name__)

TaskInput = TaskObservations | CheckpointBoundary
"""What a job's input record asks of it (its valid task observations, or a boundary); it needs the
job's 'started' event first."""


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
class InputRecord:
    """One record of the agent's input topics, as it arrived."""

    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int


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


@dataclass(frozen=True)
class Acknowledge:
    """Wait until everything sent so far, on every topic, is acknowledged by the broker."""


@dataclass(frozen=True)
class _Park(Acknowledge):
    """Within the handler only: the partition parks here until the worker's next group flush (`_parkable`)."""


@dataclass(frozen=True, eq=False)
class RunRefit:
    """Run ``fit`` (a job's refit) off the event loop, then hand this action to
    `JobEventHandler.refit_done` (with what ``fit`` raised, if anything)."""

    job_id: str
    fit: Callable[[], None]
    record: InputRecord
    """The boundary whose checkpoint waits for the refit: the checkpoint's table writes go to its
    partition's changelogs."""


ACKNOWLEDGE = Acknowledge()
_PARK = _Park()
HOLD_SECONDS = 2.0
"""How long a record may wait for its job's next checkpoint before the job's changes are written."""
IDLE_SECONDS = 0.25
"""Once no record has arrived for this long the input has paused: every held job is written then,
so a pause (or the end of a replay) makes everything durable at once, not after `HOLD_SECONDS`."""
Action = SendPredictionPart | SendDeadLetter | ForwardRecord | SendTick | Acknowledge | RunRefit


@dataclass(eq=False)
class _Held:
    """An input record the worker has not acknowledged yet."""

    record: InputRecord
    received: float
    generation: int
    """`JobEventHandler.let_go` starts a new one: records of older generations are never acknowledged."""
    job_id: str | None = None
    """The job whose next task row writes the record's changes (`JobStore.hold`)."""
    waiting: bool = False
    """For its job's task row (``job_id``) or for its job's start (`JobEventHandler.pending`)."""
    done: bool = False


TopicPartition = tuple[str, int]
JobInput = TaskInput | JobEvent
_Waiting = tuple[InputRecord, _Held | None, JobInput]
"""A job's input applied later (after its job's start, or its refit), with its held entry if any."""


@dataclass(eq=False)
class _Refit:
    """A checkpoint whose refit runs apart: what concluding it needs."""

    plan: CheckpointPlan
    job: OnlineJob
    meta: JobMeta
    entry: _Held
    """The boundary's, held until the checkpoint is concluded."""
    boundary_produced_at: float | None
    seconds: float
    """The evaluation's own time so far (not its wait for the thread): `AgentMetrics.evaluated`."""
    action: RunRefit = field(init=False)
    """What the worker is asked to run."""

    def __post_init__(self) -> None:
        self.action = RunRefit(self.job.job_id, self.fit, self.entry.record)

    @property
    def job_id(self) -> str:
        return self.job.job_id

    def fit(self) -> None:
        """The refit (`RunRefit.fit`), timed."""
        started = time.perf_counter()
        self.plan.fit()
        self.seconds += time.perf_counter() - started


@dataclass(eq=False)
class _Parked:
    """A partition waiting for the broker: the record in hand when it parked (of ``job_id``), and the
    rest of its handling."""

    job_id: str
    record: InputRecord
    entry: _Held | None
    rest: Iterator[Action]


@dataclass(frozen=True, eq=False)
class GroupFlush:
    """A flush the worker started (`JobEventHandler.flush_started`): what its end acknowledges and resumes."""

    rows: frozenset[str]
    """The jobs whose job rows were written before it began (`JobStore.unacknowledged`). Their
    acknowledgement retires models: a table write, routed to the partition of the record in hand,
    so a job's is acknowledged when its partition resumes (or by a later flush)."""
    parked: dict[int, _Parked]
    """The partitions parked before it began."""


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
    pending: defaultdict[str, list[tuple[float, InputRecord, TaskInput, _Held | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    """Events of jobs whose 'started' event has not arrived yet: job-events and task-checkpoints are
    separate topics, so Kafka does not order them against each other."""
    hold_seconds: float = HOLD_SECONDS
    idle_seconds: float = IDLE_SECONDS
    offload_refits: bool = False
    """Hand a checkpoint's refit to the worker (`RunRefit`) instead of running it in `handle`: the job's
    partition waits for it (`refit_done`) while other partitions' records go on."""
    inline_refit_below: int = 0
    """Refits on fewer finished tasks run in `handle` anyway (a thread hop would cost more); where a
    refit runs never changes a decision."""
    park_acknowledgements: bool = False
    """Where a job must wait for the broker, park its partition (`flush_done` resumes it) instead of
    yielding `Acknowledge`: the partition's records wait, held, while other partitions' go on."""
    _waiting: WaitingPartitions[_Refit | _Parked, _Waiting] = field(default_factory=WaitingPartitions)
    """Partitions whose refit runs or that are parked, with their inputs that arrived meanwhile."""
    _last_received: float = float("-inf")
    _held: dict[TopicPartition, deque[_Held]] = field(default_factory=dict)
    """Records not acknowledged yet, per input partition in offset order."""
    _current: _Held | None = None
    """The record being handled (between `receive` and `finish`)."""
    _generation: int = 0
    _acks: list[InputRecord] = field(default_factory=list)
    _dropped: list[InputRecord] = field(default_factory=list)
    _expiring: list[_Held] = field(default_factory=list)

    def receive(self, record: InputRecord) -> None:
        """Start handling ``record``: it is held until `finish` (or its job's task row) lets it go."""
        entry = _Held(record, self.clock(), self._generation)
        self._last_received = entry.received
        self._held.setdefault((record.topic, record.partition), deque()).append(entry)
        self._current = entry

    def finish(self, record: InputRecord) -> Iterator[Action]:
        """Done with ``record``: write the jobs of its partition that held records too long."""
        entry = self._current
        if entry is None or entry.record is not record:
            return
        if entry.generation != self._generation:
            self._current = None
            self._dropped.append(record)  # partitions moved while it was handled: read again
            return
        if not entry.waiting:
            entry.done = True
        for topic_partition, held in list(self._held.items()):
            if topic_partition[1] == record.partition and self._overdue(held):
                # this record's table writes go to its partition's changelogs, where its jobs' rows are
                for job_id in self._overdue_jobs(held):
                    if self.store.awaiting_acknowledgement(job_id):
                        yield from self.flush()  # inline even when jobs park: hardly ever needed here
                    self.store.write_changes(job_id)
        self._current = None
        self._collect()

    def take_acks(self) -> list[InputRecord]:
        """Records whose changes are written (or that made none), in offset order per partition:
        the worker acknowledges them, and Faust may commit their offsets."""
        acks, self._acks = self._acks, []
        return acks

    def take_dropped(self) -> list[InputRecord]:
        """Records let go without an acknowledgement (`let_go`): the worker must not wait for them."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def let_go(self) -> list[InputRecord]:
        """Partitions are about to move: give up every held record but the one in hand, which `finish`
        gives up. None is acknowledged: the partitions' next owner reads them again, and rebuilds
        their jobs from the tables (applying an observation twice changes nothing)."""
        self._generation += 1
        records = [e.record for held in self._held.values() for e in held if e is not self._current]
        records += self.take_acks()
        self._held.clear()
        self.pending.clear()
        self._expiring.clear()
        for wait in self._waiting.clear():
            # its method may still be fitting, or its checkpoint is half done: rebuild it from the tables
            self.store.forget(wait.job_id)
        return records

    def overdue(self) -> list[tuple[str, InputRecord]]:
        """For the worker's timer, while no record is in hand: each job whose changes held a record
        longer than ``hold_seconds`` (any, once the input paused for ``idle_seconds``), with one of its
        records (its partition routes the write)."""
        if self._current is not None:
            return []
        jobs: dict[str, InputRecord] = {}
        for held in self._held.values():
            if self._overdue(held):
                jobs.update(self._overdue_jobs(held))
        return list(jobs.items())

    def write_held(self, job_id: str) -> bool:
        """Write the job's changes now (`overdue`), unless a record is in hand or the job's last job
        row may not be on the broker yet (`flush` first)."""
        if self._current is not None or self.store.awaiting_acknowledgement(job_id):
            return False
        self.store.write_changes(job_id)
        self._collect()
        return True

    def _overdue(self, held: deque[_Held]) -> bool:
        """Whether the partition's oldest record waits for a job's task row longer than allowed."""
        return bool(held) and held[0].waiting and held[0].received <= self._deadline()

    def _deadline(self) -> float:
        """Records received at or before this are held too long (all of them once the input paused)."""
        now = self.clock()
        return now if now - self._last_received >= self.idle_seconds else now - self.hold_seconds

    def _overdue_jobs(self, held: deque[_Held]) -> dict[str, InputRecord]:
        deadline = self._deadline()
        jobs: dict[str, InputRecord] = {}
        for entry in held:
            if entry.received > deadline:
                break
            job_id = entry.job_id
            if not entry.waiting or job_id is None or not self.store.has_changes(job_id):
                continue
            if self._waiting.waiting_for(entry.record.partition) is None:  # waiting: written after
                jobs.setdefault(job_id, entry.record)
        return jobs

    def _hold(self, entry: _Held | None, job_id: str) -> None:
        """``entry`` applied changes to ``job_id``: held until the job's next task row, if any is due."""
        if entry is None:
            return
        entry.waiting = self.store.has_changes(job_id)
        if entry.waiting:
            entry.job_id = job_id
            self.store.hold(job_id, entry)

    def _collect(self) -> None:
        """Mark the records whose changes are written done; move each partition's done prefix to acks."""
        for entry in self.store.take_written():
            if isinstance(entry, _Held):
                entry.waiting = False
                entry.done = True
        for held in self._held.values():
            while held and held[0].done:
                self._acks.append(held.popleft().record)

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
            yield from self._route(record, self._current, work)
        elif isinstance(decoded, JobEvent):
            yield from self._route(record, self._current, decoded)
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
        for job_id in [j for j, items in self.pending.items() if items and items[0][0] < deadline]:
            reason = (
                f"event for unknown job {job_id!r}: no job_event 'started' within {self.pending_grace:.0f}s"
            )
            for _, record, _, entry in self.pending.pop(job_id):
                letters.append(self._dead_letter(record, reason))
                if entry is not None:
                    self._expiring.append(entry)
        return letters

    def letters_sent(self) -> None:
        """The letters of the last `expire_pending` are sent: their records are done."""
        for entry in self._expiring:
            entry.waiting = False
            entry.done = True
        self._expiring.clear()
        self._collect()

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

    def flush(self) -> Iterator[Action]:
        """Wait for everything written so far; the job rows among it are then durable."""
        rows = self.store.unacknowledged()
        yield ACKNOWLEDGE
        self.store.acknowledged(rows)

    def _on_the_broker(self) -> Iterator[Action]:
        """Return once everything sent so far is on the broker: `flush` inline, or (with
        `park_acknowledgements`) parked until the worker's next group flush, other partitions going on."""
        if self.park_acknowledgements:
            yield _PARK
        else:
            yield from self.flush()

    def _settled(self, job_id: str) -> Iterator[Action]:
        """Before any write of a job: its last job row must be on the broker (`pipeline.jobstore`)."""
        if self.store.awaiting_acknowledgement(job_id):
            yield from self._on_the_broker()

    def parked(self) -> bool:
        """Whether partitions wait for the worker's next group flush (`flush_started`)."""
        return any(isinstance(wait, _Parked) for wait in self._waiting.waits().values())

    def flush_started(self) -> GroupFlush:
        """The worker starts a flush for the parked partitions: hand what it returns to `flush_done`."""
        waits = self._waiting.waits().items()
        parked = {partition: wait for partition, wait in waits if isinstance(wait, _Parked)}
        return GroupFlush(self.store.unacknowledged(), parked)

    def flush_done(
        self, flush: GroupFlush, error: BaseException | None = None
    ) -> Iterator[tuple[InputRecord, Iterator[Action]]]:
        """``flush`` ended (``error``: how it failed). Yields each record to finish now, as `refit_done`
        does: for each partition parked before the flush began, in order, the record it parked with
        (the rest of its handling; a failed flush fails it), then its queued inputs until it waits
        again. Partitions let go meanwhile are not resumed."""
        if self._current is not None:
            raise RuntimeError("a flush is concluded between records, not while one is handled")
        rows = set(flush.rows)
        for partition, parked in flush.parked.items():
            if not self._waiting.end(partition, parked):
                continue
            if error is None:
                here = {
                    j for j in rows if j == parked.job_id or partition_of(j, self.partitions) == partition
                }
                rows -= here
                rest = self._acknowledged_then(here, parked.rest)
            else:
                rest = _raising(error)
            yield from self._resumed(parked.job_id, parked.record, parked.entry, rest)

    def _acknowledged_then(self, rows: set[str], rest: Iterator[Action]) -> Iterator[Action]:
        """The job rows of ``rows`` are on the broker (`JobStore.acknowledged`, within the resumed
        record's routing), then ``rest``."""
        self.store.acknowledged(rows)
        yield from rest

    def _parkable(
        self, job_id: str, record: InputRecord, entry: _Held | None, actions: Iterator[Action]
    ) -> Iterator[Action]:
        """``actions`` (handling ``record``, of ``job_id``); where they wait for the broker in parked
        mode (`_on_the_broker`), the partition parks with the rest of them, the record held, until
        `flush_done`. Without parking, ``actions`` as they are (no wrapper on every record)."""
        if not self.park_acknowledgements:
            return actions
        return self._parking(job_id, record, entry, actions)

    def _parking(
        self, job_id: str, record: InputRecord, entry: _Held | None, actions: Iterator[Action]
    ) -> Iterator[Action]:
        for action in actions:
            if action is _PARK:
                if entry is not None:
                    entry.waiting = True
                self._waiting.wait(record.partition, _Parked(job_id, record, entry, actions))
                return
            yield action

    def _route(self, record: InputRecord, entry: _Held | None, work: JobInput) -> Iterator[Action]:
        """Apply ``work`` now, or after what its partition waits for (and the inputs that wait for it)."""
        if self._waiting.busy(record.partition):
            if entry is not None:
                entry.waiting = True  # held until applied
            self._waiting.queue(record.partition, (record, entry, work))
        else:
            yield from self._parkable(work.job_id, record, entry, self._dispatch(record, entry, work))

    def _dispatch(self, record: InputRecord, entry: _Held | None, work: JobInput) -> Iterator[Action]:
        """Apply ``work``; a task input of a job not started yet waits in `pending`."""
        if isinstance(work, JobEvent):
            yield from self._apply_job_event(work)
        elif self.store.meta(work.job_id) is None or work.job_id in self.pending:
            if entry is not None:
                entry.waiting = True
            self.pending[work.job_id].append((self.clock(), record, work, entry))
        else:
            yield from self._apply(work, entry)

    def refit_done(
        self, refit: RunRefit, error: BaseException | None = None
    ) -> Iterator[tuple[InputRecord, Iterator[Action]]]:
        """``refit`` ran (``error``: what its fit raised). Yields each record to finish now, with what
        finishing it asks (perform it, then `finish` the record, as `process` does): the refit's
        boundary, whose checkpoint is concluded as `handle` would have, then the partition's inputs
        that waited, in order, until it waits again. Nothing if the job was let go meanwhile."""
        if self._current is not None:
            raise RuntimeError("a refit is concluded between records, not while one is handled")
        running = self._waiting.waiting_for(refit.record.partition)
        if not isinstance(running, _Refit) or running.action is not refit:
            return
        self._waiting.end(refit.record.partition, running)
        yield from self._resumed(refit.job_id, refit.record, running.entry, self._conclude(running, error))

    def _resumed(
        self, job_id: str, record: InputRecord, entry: _Held | None, rest: Iterator[Action]
    ) -> Iterator[tuple[InputRecord, Iterator[Action]]]:
        """The wait of ``record``'s partition ended: the rest of its handling (of ``job_id``), then the
        partition's queued inputs in order (each with the record to finish after it), until it waits
        again."""
        partition = record.partition
        if entry is not None:
            entry.waiting = False
        self._current = entry
        yield record, self._parkable(job_id, record, entry, rest)
        while (queued := self._waiting.next_input(partition)) is not None:
            record, entry, work = queued
            if entry is not None:
                entry.waiting = False  # `_dispatch` holds it again if it must
            self._current = entry
            yield record, self._parkable(work.job_id, record, entry, self._dispatch(record, entry, work))

    def _apply_in_order(
        self, job_id: str, inputs: list[tuple[InputRecord, _Held | None, TaskInput]]
    ) -> Iterator[Action]:
        """Apply the job's ``inputs`` (they waited for its start); once one starts a refit, the rest
        wait for it, ahead of the partition's inputs queued already (those came later)."""
        for i, (record, entry, work) in enumerate(inputs):
            if self._waiting.waiting_for(record.partition) is not None:
                self._waiting.queue_first(record.partition, inputs[i:])  # entries wait already (`pending`)
                return
            yield from self._apply(work, entry)
            if entry is not None and not entry.waiting:
                entry.done = True

    def _apply(self, work: TaskInput, entry: _Held | None) -> Iterator[Action]:
        if entry is not None:
            entry.waiting = False
        if isinstance(work, CheckpointBoundary):
            yield from self._apply_boundary(work, entry)
            return
        yield from self._settled(work.job_id)
        self._apply_tasks(work)
        self._hold(entry, work.job_id)  # written with the job's next checkpoint

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

    def _apply_boundary(self, event: CheckpointBoundary, entry: _Held | None) -> Iterator[Action]:
        meta = self.store.meta(event.job_id)
        assert meta is not None
        if event.origin == "timer":
            if meta.live:
                yield from self._evaluate(event.job_id, event.checkpoint_time, None, entry)
            return
        if meta.live:  # a producer that did not say it sends boundaries does: no timer for this job
            yield from self._settled(event.job_id)
            meta.live = False
            self.store.save_meta(event.job_id, meta)
        yield from self._evaluate(event.job_id, event.checkpoint_time, event.produced_at, entry)

    def _apply_job_event(self, event: JobEvent) -> Iterator[Action]:
        """Start or end the job; a start applies the job's inputs that waited for it."""
        yield from self._settled(event.job_id)
        self._start_or_end(event)
        if self.store.meta(event.job_id) is not None:
            waiting = self.pending.pop(event.job_id, [])
            yield from self._apply_in_order(event.job_id, [(r, e, w) for _, r, w, e in waiting])

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

    def _evaluate(
        self, job_id: str, at: float, boundary_produced_at: float | None, entry: _Held | None
    ) -> Iterator[Action]:
        """Evaluate the checkpoint; a refit the worker runs apart (`RunRefit`) holds the boundary's
        ``entry`` and makes the job wait until `refit_done` concludes the checkpoint."""
        store = self.store
        meta = store.meta(job_id)
        if meta is None or (meta.last_evaluated is not None and at <= meta.last_evaluated):
            self.stats.ignored += 1
            return  # a duplicate or late boundary: the checkpoint was already evaluated
        yield from self._settled(job_id)
        job, meta = store.job(job_id), store.meta(job_id)  # the cached pair, kept current below
        assert job is not None and meta is not None
        if self.consensus is not None:
            self.consensus.prepare(job)  # the latest consensus weights
        # The order of writes is what makes a killed worker recover exactly (`pipeline.jobstore`).
        started = time.perf_counter()
        plan = store.begin_evaluation(job_id, at)
        assert plan is not None
        if plan.refit and entry is not None and self._offloaded(plan):
            refit = _Refit(plan, job, meta, entry, boundary_produced_at, time.perf_counter() - started)
            self._waiting.wait(entry.record.partition, refit)
            entry.waiting = True
            yield refit.action
            return
        plan.fit()
        decisions = store.end_evaluation(job, plan)
        refit_seconds = time.perf_counter() - started if plan.refit else None
        yield from self._evaluated(job, meta, at, decisions, boundary_produced_at, refit_seconds)

    def _offloaded(self, plan: CheckpointPlan) -> bool:
        """Whether the plan's refit runs apart (`offload_refits`, `inline_refit_below`)."""
        data = plan.data
        return self.offload_refits and data is not None and data.n_finished >= self.inline_refit_below

    def _conclude(self, refit: _Refit, error: BaseException | None) -> Iterator[Action]:
        """The rest of `_evaluate` once its refit ran apart; a failed fit fails the boundary's record."""
        if error is not None:
            raise error
        started = time.perf_counter()
        decisions = self.store.end_evaluation(refit.job, refit.plan)
        refit.seconds += time.perf_counter() - started
        yield from self._evaluated(
            refit.job, refit.meta, refit.plan.at, decisions, refit.boundary_produced_at, refit.seconds
        )

    def _evaluated(
        self,
        job: OnlineJob,
        meta: JobMeta,
        at: float,
        decisions: list[Decision],
        boundary_produced_at: float | None,
        refit_seconds: float | None,
    ) -> Iterator[Action]:
        """Publish a checkpoint's decisions, then commit it (`JobStore.record_evaluation`)."""
        store, job_id = self.store, job.job_id
        now = self.wall_clock()
        key = job_id.encode()
        marker = CheckpointEvaluated(
            job_id=job_id,
            checkpoint_time=at,
            evaluated=len(decisions),
            flagged=sum(d.is_straggler for d in decisions),
            model_version=job.model_version,
            boundary_produced_at=boundary_produced_at,
            produced_at=now,
        )
        for part in prediction_parts(decisions, self.method, marker):
            yield SendPredictionPart(key, part)
        yield from self._on_the_broker()  # the model and predictions are on the broker
        if self.metrics is not None:
            self.metrics.evaluated(decisions, refit_seconds, boundary_produced_at, self.wall_clock())
        store.record_evaluation(at, job, meta)  # acknowledged by the next flush, before the job's next write
        self.stats.predictions += len(decisions)
        if meta.ended_at is not None and at >= meta.ended_at:
            yield from self._settled(job_id)
            self._drop(job_id)

    def _drop(self, job_id: str) -> None:
        if self.consensus is not None:
            self.consensus.retire(job_id)  # ADMM's node keeps the ended job's rows for a while
        self.store.drop(job_id)


def _raising(error: BaseException) -> Iterator[Action]:
    """The rest of a record's handling when what it waited for failed: the failure."""
    raise error
    yield  # a generator


async def process(
    handler: JobEventHandler, record: InputRecord, perform: Callable[[Action], Awaitable[None]]
) -> None:
    """Handle one input record, performing each action before the handler goes on.

    A failure while handling (the handler's or a send's) dead-letters the record as an internal error.
    The record is then held until its changes are written (`JobEventHandler.take_acks`)."""
    handler.receive(record)
    admitted = handler.admit(record)
    if isinstance(admitted, SendDeadLetter | ForwardRecord):
        await perform(admitted)
        await _finish(handler, record, perform)
    else:
        await _perform_handling(handler, record, handler.handle(record, admitted), perform)


async def resume(
    handler: JobEventHandler,
    resumed: Iterator[tuple[InputRecord, Iterator[Action]]],
    perform: Callable[[Action], Awaitable[None]],
    routed: Callable[[InputRecord], AbstractContextManager[object]] = lambda record: nullcontext(),
) -> None:
    """Finish each record a job's ended wait hands back (`JobEventHandler.refit_done`, `flush_done`) as
    `process` finishes one, within ``routed(record)``. Call it between records, never while one is handled."""
    for record, actions in resumed:
        with routed(record):
            await _perform_handling(handler, record, actions, perform)


async def _perform_handling(
    handler: JobEventHandler,
    record: InputRecord,
    actions: Iterator[Action],
    perform: Callable[[Action], Awaitable[None]],
) -> None:
    try:
        for action in actions:
            await perform(action)
    except Exception as error:  # one bad event must not stop the agent
        log.exception(
            "failed on record %s[%d]@%d (key %r)", record.topic, record.partition, record.offset, record.key
        )
        await perform(handler.failed(record, error))
    await _finish(handler, record, perform)


async def _finish(
    handler: JobEventHandler, record: InputRecord, perform: Callable[[Action], Awaitable[None]]
) -> None:
    for action in handler.finish(record):
        await perform(action)
