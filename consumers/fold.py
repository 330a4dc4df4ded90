"""The mitigation consumer's pure core: a fold from input records to relaunch commands.

`MitigationState` drives a `straggler.core.policies` policy from the records of the three input topics
(predictions and markers, task checkpoints, job events) and returns the commands and dead letters each
record causes. No Kafka here: `consumers.mitigation` runs it in transactions and rebuilds it after a
restart by folding the committed input again (outputs dropped), so it is tested without a broker.

Event-time alignment. The inputs arrive on three topics, and Kafka orders records only within one
partition, so the consumer may see a job's ``checkpoint_evaluated`` marker for ``T`` before the finish
events of ``(T - interval, T]`` on ``task-checkpoints``, or after finish events later than ``T``. Acting
on arrival order would make the policy's state depend on how fetches happened to interleave: a replay
(the rebuild) could then reach another state than the live run did, and a finish after ``T`` would
leak future information into the decision at ``T``. So the fold aligns the inputs on event time:

- a marker for ``T`` is acted on only once the job's ``task-checkpoints`` stream has reached ``T``
  (a ``checkpoint_boundary``, or a ``running`` checkpoint, at ``T`` or later; the replayer writes every
  finish of ``(T - interval, T]`` before those, and the agent's timer writes its boundaries there too);
- just before it, the job's finish events with time ``<= T`` that the policy has not seen are applied
  (in arrival order); later finishes wait for a later marker;
- a job is dropped (``on_job_ended``) once its ``ended`` event has arrived, none of its markers is
  waiting, and a marker with a later time has been seen on the same predictions partition (the agent
  writes markers in checkpoint order per partition, so none of the job's markers can still come).

With that, the commands and the state after consuming given prefixes of the input partitions do not
depend on the interleaving, and a repeated record (at-least-once producers, redelivery) changes
nothing: each command has a deterministic id (`schemas.command_id`) and is issued once per job.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from schemas import (
    INPUT_FEATURE,
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    Event,
    JobEvent,
    MitigationNote,
    Prediction,
    PredictionBatch,
    RelaunchCommand,
    SchemaError,
    TaskBatch,
    TaskCheckpoint,
    command_id,
    dead_letter_for,
    decode,
    expand_predictions,
    observations,
)
from straggler.core.decision_event import decision_of
from straggler.core.online import Decision
from straggler.core.policies import MitigationPolicy
from straggler.core.policy_spec import make_policy
from straggler.kafka.routing import is_on_job_partition

log = logging.getLogger(__name__)

Output = RelaunchCommand | MitigationNote | DeadLetter
"""What a record causes: commands (and notes on the flagged tasks left without one), or a dead letter
for a record that cannot be read."""
Decided = RelaunchCommand | MitigationNote
"""What a checkpoint's decisions cause."""


@dataclass(frozen=True)
class _TaskEnd:
    """A task run's end that the policy has not been told about yet."""

    at: float
    task_id: str
    latency: float | None
    """None for a run that failed or was killed."""
    attempt: int


@dataclass(frozen=True)
class _Evaluated:
    """A checkpoint whose marker arrived, with its decisions, waiting for the job's task events."""

    at: float
    decisions: list[Decision]


@dataclass
class _Job:
    """What the fold keeps per job, besides the policy's own state."""

    watermark: float = -math.inf
    """How far the job's ``task-checkpoints`` stream has got: every finish up to here has arrived."""
    last_marker: float = -math.inf
    buffered: dict[float, dict[str, Decision]] = field(default_factory=dict)
    """Predictions by checkpoint time, then task, until the checkpoint's marker arrives."""
    waiting: deque[_Evaluated] = field(default_factory=deque)
    """Markers that arrived before the job's ``task-checkpoints`` reached their time."""
    finishes: list[_TaskEnd] = field(default_factory=list)
    ended_at: float | None = None
    issued: set[str] = field(default_factory=set)
    finished_runs: set[tuple[str, int]] = field(default_factory=set)
    """(task, attempt) of every end seen: producers may repeat events (at least once)."""


class MitigationState:
    """The deterministic fold from input records to commands (see the module docstring)."""

    def __init__(
        self,
        policy: str,
        checkpoint_interval: float = 300.0,
        partitions: int | None = None,
        clock: Callable[[], float] = time.time,
        lettered_topics: Collection[str] | None = None,
    ) -> None:
        self.policy_spec = policy
        self.clock = clock
        """Stamps a command's ``issued_at`` (wall clock; the only part of a command not folded)."""
        self.partitions = partitions
        """The input topics' partition count: task and job events off their job's murmur2 partition
        are skipped (the worker forwards them there). None: every record is folded."""
        self.lettered_topics = None if lettered_topics is None else frozenset(lettered_topics)
        """Topics whose unreadable records this fold dead-letters: the mitigator's own (predictions).
        The agent letters those of the topics it owns (task checkpoints, job events), so each bad
        record is lettered once; here they are skipped. None: every topic's."""
        self.policy: MitigationPolicy = make_policy(policy, checkpoint_interval)
        self._jobs: dict[str, _Job] = {}
        self._closed: set[str] = set()
        """Jobs dropped after their end: their stragglers (late finish events) are ignored."""
        self._ended_by_partition: dict[int, set[str]] = {}
        self._marker_watermark: dict[int, float] = {}
        """Latest marker time seen per predictions partition (markers come in time order there)."""
        self.predictions = 0
        self.checkpoints = 0
        self.commands = 0
        self.notes = 0
        self.dead_letters = 0

    @property
    def active_jobs(self) -> frozenset[str]:
        """Jobs whose state is held (not yet dropped after their end)."""
        return frozenset(self._jobs)

    def process(
        self, msg_value: bytes | None, topic: str, partition: int, offset: int, key: bytes | None = None
    ) -> list[Output]:
        """Fold one input record into the state; return the commands and dead letters it causes."""
        try:
            event = decode(msg_value)
        except SchemaError as error:
            if self.lettered_topics is not None and topic not in self.lettered_topics:
                return []  # another stage's topic: that stage letters it
            self.dead_letters += 1
            return [dead_letter_for(msg_value, topic, partition, offset, error, stage="mitigator")]
        if (
            self.partitions is not None
            and isinstance(event, TaskCheckpoint | TaskBatch | CheckpointBoundary | JobEvent)
            and not is_on_job_partition(key, event.job_id, partition, self.partitions)
        ):
            return []  # the worker forwards it to its job's partition, or dead-letters it
        outputs: list[Output] = []
        if isinstance(event, PredictionBatch):
            try:
                predictions, marker = expand_predictions(event)
            except SchemaError as error:
                self.dead_letters += 1
                return [dead_letter_for(msg_value, topic, partition, offset, error, stage="mitigator")]
            for prediction in predictions:
                self.apply(prediction, partition)
            if marker is not None:
                outputs += self.apply(marker, partition)
        elif isinstance(event, TaskBatch):
            for observation in observations(event, msg_value):  # the agent letters the bad ones
                if isinstance(observation, TaskCheckpoint):
                    outputs += self._on_task_checkpoint(observation, partition)
        else:
            outputs += self.apply(event, partition)
        return outputs

    def apply(self, event: Event, partition: int) -> list[Decided]:
        """Fold one decoded, unbatched event that arrived on ``partition``; return the commands it causes."""
        if isinstance(event, Prediction):
            self._on_prediction(event, partition)
            return []
        if isinstance(event, CheckpointEvaluated):
            return self._on_marker(event, partition)
        if isinstance(event, TaskCheckpoint):
            return self._on_task_checkpoint(event, partition)
        if isinstance(event, CheckpointBoundary):
            job = self._job(event.job_id)
            return [] if job is None else self._advance(event.job_id, job, event.checkpoint_time, partition)
        if isinstance(event, JobEvent) and event.event == "ended":
            self._on_job_ended(event, partition)
        return []  # started jobs, and any other valid event, change nothing here

    def _job(self, job_id: str) -> _Job | None:
        if job_id in self._closed:
            return None
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _Job()
        return job

    def _on_prediction(self, event: Prediction, partition: int) -> None:
        job = self._job(event.job_id)
        if job is None or event.checkpoint_time <= job.last_marker:
            return  # a late copy of a checkpoint already acted on
        self.predictions += 1
        job.buffered.setdefault(event.checkpoint_time, {})[event.task_id] = decision_of(event)

    def _on_marker(self, event: CheckpointEvaluated, partition: int) -> list[Decided]:
        at = event.checkpoint_time
        self._marker_watermark[partition] = max(self._marker_watermark.get(partition, -math.inf), at)
        job = self._job(event.job_id)
        outputs: list[Decided] = []
        if job is not None and at > job.last_marker:
            job.last_marker = at
            decisions = list(job.buffered.pop(at, {}).values())
            for stale in [t for t in job.buffered if t < at]:
                del job.buffered[stale]  # predictions whose marker never came
            if len(decisions) != event.evaluated:
                log.warning(
                    "job %s at %s: marker counts %d predictions, %d arrived",
                    event.job_id,
                    at,
                    event.evaluated,
                    len(decisions),
                )
            job.waiting.append(_Evaluated(at, decisions))
            outputs = self._drain(event.job_id, job)
        self._close_ended(partition)
        return outputs

    def _on_task_checkpoint(self, event: TaskCheckpoint, partition: int) -> list[Decided]:
        job = self._job(event.job_id)
        if job is None:
            return []
        size = event.features.get(INPUT_FEATURE)
        if size is not None:  # a task's input is its own, whenever told: no event-time alignment needed
            self.policy.on_task_input(event.job_id, event.task_id, size)
        self.policy.on_task_machine(
            event.job_id, event.task_id, event.attempt, event.machine_id
        )  # so is its machine
        ended = event.status == "finished" and event.latency is not None
        if ended or event.status in ("failed", "killed"):
            run = (event.task_id, event.attempt)
            if run not in job.finished_runs:  # a repeated end must not count twice (Mantri's median)
                job.finished_runs.add(run)
                latency = event.latency if ended else None
                job.finishes.append(_TaskEnd(event.checkpoint_time, event.task_id, latency, event.attempt))
        if event.status == "running":
            return self._advance(event.job_id, job, event.checkpoint_time, partition)
        return []

    def _advance(self, job_id: str, job: _Job, at: float, partition: int) -> list[Decided]:
        if at <= job.watermark:
            return []
        job.watermark = at
        outputs = self._drain(job_id, job)
        self._close_ended(partition)
        return outputs

    def _drain(self, job_id: str, job: _Job) -> list[Decided]:
        """Act on every waiting marker the job's task events have caught up with, in order."""
        outputs: list[Decided] = []
        while job.waiting and job.waiting[0].at <= job.watermark:
            evaluated = job.waiting.popleft()
            at, decisions = evaluated.at, evaluated.decisions
            later = []
            for end in job.finishes:
                if end.at > at:
                    later.append(end)
                elif end.latency is None:
                    self.policy.on_task_gone(job_id, end.task_id, end.at, end.attempt)
                else:
                    self.policy.on_task_finished(job_id, end.task_id, end.at, end.latency, end.attempt)
            job.finishes = later
            self.checkpoints += 1
            for action in self.policy.on_checkpoint(job_id, at, decisions):
                identity = command_id(job_id, action.task_id, action.action, action.decision_key)
                if identity in job.issued:
                    continue
                job.issued.add(identity)
                self.commands += 1
                outputs.append(
                    RelaunchCommand(
                        command_id=identity,
                        job_id=job_id,
                        task_id=action.task_id,
                        action=action.action,
                        reason=action.reason,
                        policy=self.policy_spec,
                        issued_at=self.clock(),
                        checkpoint_time=at,
                        attempt=action.attempt,
                    )
                )
            for hold in self.policy.holds(job_id):
                self.notes += 1
                p = hold.probability
                outputs.append(
                    MitigationNote(
                        job_id=job_id,
                        task_id=hold.task_id,
                        attempt=hold.attempt,
                        checkpoint_time=at,
                        kind=hold.kind,
                        reason=hold.reason,
                        policy=self.policy_spec,
                        issued_at=self.clock(),
                        straggle_probability=None if math.isnan(p) else min(max(p, 0.0), 1.0),
                    )
                )
        return outputs

    def _on_job_ended(self, event: JobEvent, partition: int) -> None:
        job = self._job(event.job_id)
        if job is None:
            return
        job.ended_at = event.time
        self._ended_by_partition.setdefault(partition, set()).add(event.job_id)
        self._close_ended(partition)

    def _close_ended(self, partition: int) -> None:
        ended = self._ended_by_partition.get(partition)
        if not ended:
            return
        seen_until = self._marker_watermark.get(partition, -math.inf)
        for job_id in list(ended):
            job = self._jobs[job_id]
            if job.ended_at is not None and not job.waiting and seen_until > job.ended_at:
                self.policy.on_job_ended(job_id)
                del self._jobs[job_id]
                self._closed.add(job_id)
                ended.discard(job_id)


TopicAndPartition = tuple[str, int]
"""An input partition: (topic, partition), as in a `confluent_kafka.TopicPartition`."""


class Rebuild:
    """A state as of given input offsets: the fold of every record before them, outputs dropped.

    After a restart or an abort the consumer reads its partitions from the beginning and hands each
    record to `fold`; the records at or after a partition's end (the group's committed offset) are
    left to the live consumer. The state is then the one the live run had at those offsets, issued
    command ids included, so no command is lost or repeated.
    """

    def __init__(self, state: MitigationState, ends: dict[TopicAndPartition, int]) -> None:
        self.state = state
        self.remaining = dict(ends)
        """Partitions not yet read up to their end (an exclusive offset)."""
        self.records = 0
        """Records folded."""

    def fold(self, value: bytes | None, topic: str, partition: int, offset: int, key: bytes | None) -> None:
        """Fold one record read back, if it comes before its partition's end."""
        where = (topic, partition)
        end = self.remaining.get(where)
        if end is None:
            return  # a partition already done (or not to rebuild)
        if offset < end:
            self.state.process(value, topic, partition, offset, key)
            self.records += 1
        if offset + 1 >= end:
            self.reached(where)

    def reached(self, where: TopicAndPartition) -> None:
        """Nothing more to read on ``where`` (its end, or the partition's end of data)."""
        self.remaining.pop(where, None)
