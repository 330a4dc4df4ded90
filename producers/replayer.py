"""Replay `JobTrace`s onto Kafka as a cluster's monitoring would have sent them (docs/stream-protocol.md).

Open loop: the trace as recorded, instant by instant of the global timeline. Closed loop: the replay
is also the cluster that obeys the pipeline; after each instant's boundaries it waits for the agent's
markers and the mitigation consumer's committed offsets, reads the commands and applies them to its
`JobSimulation` (`straggler.simulation`'s rules, shared with the evaluator).

Event order: docs/stream-protocol.md, "What a producer sends for one job (the replayer)" and
"Closed-loop replay".
"""

from __future__ import annotations

import heapq
import logging
import math
import time
import uuid
from bisect import insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from confluent_kafka import (
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from tqdm import tqdm

from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    Event,
    JobEvent,
    RelaunchCommand,
    SchemaError,
    TaskCheckpoint,
    decode_each,
    encode,
    task_batches,
)
from straggler.core.arrays import FloatArray
from straggler.core.execution import Decision as ExecutorDecision
from straggler.core.execution import Skip
from straggler.core.jobtrace import JobTrace
from straggler.kafka.config import DeliveryCounter, DeliveryError, consumer_config, producer_config
from straggler.kafka.consume import arrived
from straggler.kafka.names import TopicNames
from straggler.kafka.offsets import end_offsets
from straggler.kafka.produce import produce_with_backpressure
from straggler.simulation import CheckpointStep, JobOutcome, JobSimulation, SimulatedCluster, finish_order

MAX_SLEEP_SECONDS = 60.0
"""Longest wall-clock pause between two instants when ``speed > 0``: a trace with hours of idle time
between checkpoints must not freeze a replay for hours."""

FLUSH_TIMEOUT_SECONDS = 120.0
"""How long a flush may take before the broker is declared unreachable."""

POLL_SECONDS = 0.05
"""Longest a closed-loop read blocks while nothing arrives (it returns as soon as something does)."""

READ_BATCH = 1000
"""Records a closed-loop read takes at most at once."""

COMMITTED_POLL_SECONDS = 0.005
"""Pause between two reads of the mitigator's committed offsets: nothing announces that they moved."""

COMMANDS_FETCH_WAIT_MS = 10
"""``fetch.wait.max.ms`` of the commands reader (librdkafka's default: 500). The commands of a
transaction that committed while the reader's fetch was waiting reached the reader only when that
wait ran out: with the default, the demo's replayer spent 500 ms reading its commands at most
instants, half its replay time. Costs an idle fetch every 10 ms while the replay runs."""

OFFSETS_RETRY_BACKOFF_MS = 10
"""``retry.backoff.ms`` of the committed-offsets reader (librdkafka's default: 100). Offsets that a
transaction has sent but not yet committed are refused (unstable) and asked again after it."""

PRODUCER_SOURCE = "replayer"

log = logging.getLogger(__name__)

SendEvent = Callable[[str, str, Event], None]
"""``send(topic, job_id, event)``: encode and produce one event keyed by its job."""
SendTasks = Callable[[str, str, Sequence[TaskCheckpoint]], None]
"""``send_tasks(topic, job_id, events)``: produce one job's task observations (batched or one by one)."""


class ReplayStalled(RuntimeError):
    """The closed loop waited ``wait_timeout`` seconds for the pipeline and it did not answer."""

    def __init__(self, instant: float, waiting: dict[str, str], timeout: float) -> None:
        detail = "; ".join(f"{job}: {why}" for job, why in sorted(waiting.items()))
        super().__init__(
            f"closed-loop replay stalled at t={instant:g}: after {timeout:g} s still waiting for "
            f"{len(waiting)} job(s): {detail}"
        )
        self.instant = instant
        self.waiting = waiting


class PipelineDown(RuntimeError):
    """A stage the closed loop waits for has stopped: waiting on would only end in `ReplayStalled`."""


PipelineCheck = Callable[[], str | None]
"""Why the pipeline cannot answer (a stage exited, and how), or None while it runs."""


def feature_map(names: Sequence[str], row: FloatArray) -> dict[str, float]:
    """A feature row as the stream carries it: unknown (non-finite) values are left out."""
    return {name: value for name, value in zip(names, row.tolist(), strict=True) if math.isfinite(value)}


def replay_producer_config(bootstrap: str) -> dict[str, str | int | float | bool]:
    """`producer_config` with the murmur2 partitioner the protocol requires (Java/aiokafka placement)."""
    config = dict(producer_config(bootstrap))
    config.setdefault("partitioner", "murmur2_random")
    return config


@dataclass
class ReplayResult:
    events_produced: int
    """Records produced (a batch of observations is one record)."""
    delivery_failures: int
    jobs: int
    instants: int
    wall_seconds: float
    observations_produced: int = 0
    """Task observations produced, batched or not."""
    commands_applied: int = 0
    commands_ignored: int = 0
    commands_duplicate: int = 0
    """Commands whose ``command_id`` had been applied already (redeliveries), not applied again."""
    undecodable: int = 0
    """Records on the predictions or commands topics that `schemas.decode` rejected (skipped)."""
    ignored_reasons: dict[str, int] = field(default_factory=dict)
    """Why the cluster skipped commands (each `Skip`'s kind), with counts."""
    delivery_errors: list[str] = field(default_factory=list)
    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    boundary_produced_at: dict[tuple[str, float], float] = field(default_factory=dict)
    """Wall-clock time each (job, checkpoint time) boundary was produced: subtract it from the marker's
    or the command's time to get the pipeline's decision latency."""

    def count(self, decision: ExecutorDecision) -> None:
        """One command the simulated cluster carried out or skipped."""
        if not isinstance(decision, Skip):
            self.commands_applied += 1
        elif decision.kind == "applied":
            self.commands_duplicate += 1
        else:
            self.commands_ignored += 1
            self.ignored_reasons[decision.kind] = self.ignored_reasons.get(decision.kind, 0) + 1

    @property
    def jct_before(self) -> dict[str, float]:
        return {job: outcome.jct_before for job, outcome in self.outcomes.items()}

    @property
    def jct_after(self) -> dict[str, float]:
        return {job: outcome.jct_after for job, outcome in self.outcomes.items()}

    @property
    def events_per_second(self) -> float:
        return self.events_produced / self.wall_seconds if self.wall_seconds > 0 else math.nan

    def summary(self) -> dict[str, float | int | str]:
        """A flat, JSON-ready digest (what ``straggler produce`` prints)."""
        before = [v for v in self.jct_before.values() if math.isfinite(v)]
        after = [v for v in self.jct_after.values() if math.isfinite(v)]
        return {
            "jobs": self.jobs,
            "instants": self.instants,
            "events_produced": self.events_produced,
            "observations_produced": self.observations_produced,
            "delivery_failures": self.delivery_failures,
            "wall_seconds": round(self.wall_seconds, 3),
            "events_per_second": round(self.events_per_second, 1),
            "commands_applied": self.commands_applied,
            "commands_ignored": self.commands_ignored,
            "commands_duplicate": self.commands_duplicate,
            "undecodable": self.undecodable,
            "relaunched_tasks": sum(o.relaunched for o in self.outcomes.values()),
            "mean_jct_before": float(np.mean(before)) if before else math.nan,
            "mean_jct_after": float(np.mean(after)) if after else math.nan,
        }


class _PipelineWatch:
    """The closed loop's view of the pipeline's output: markers, the mitigator's progress, commands.

    Both readers start at the topics' ends when the replay starts, so records of earlier runs on the
    same topics are never mistaken for this run's. The mitigator's committed offsets are read with a
    consumer that carries its group id but never subscribes, so it never joins (or disturbs) the group.
    """

    def __init__(
        self, bootstrap: str, topics: TopicNames, mitigator_group: str, check: PipelineCheck | None = None
    ) -> None:
        self.check = check
        """Asked at every turn of a wait: a stage that is down ends the wait at once (`PipelineDown`)."""
        own_group = f"straggler-replayer-{uuid.uuid4().hex[:12]}"
        self.topics = topics
        self.predictions = Consumer(dict(consumer_config(bootstrap, own_group)))
        self.commands = Consumer(
            {
                **consumer_config(bootstrap, own_group),
                "enable.partition.eof": True,
                "fetch.wait.max.ms": COMMANDS_FETCH_WAIT_MS,
            }
        )
        self.offsets = Consumer(
            {**consumer_config(bootstrap, mitigator_group), "retry.backoff.ms": OFFSETS_RETRY_BACKOFF_MS}
        )
        self.prediction_partitions = self._assign_at_end(self.predictions, topics.predictions)
        self.command_partitions = self._assign_at_end(self.commands, topics.commands)
        self.markers: dict[tuple[str, float], tuple[int, int]] = {}
        self.boundaries: dict[tuple[str, float], tuple[int, int]] = {}
        """(job, T) -> where its boundary landed on task-checkpoints, from the delivery report."""
        self.command_eof: dict[int, int] = {}
        self.undecodable = 0

    @staticmethod
    def _assign_at_end(consumer: Consumer, topic: str) -> list[int]:
        partitions = _require_topics(consumer, (topic,))[topic]
        ends = end_offsets(consumer, topic, partitions, FLUSH_TIMEOUT_SECONDS)
        consumer.assign([TopicPartition(topic, p, ends[p]) for p in partitions])
        return partitions

    def _decode(self, message: Message) -> list[Event]:
        try:
            return decode_each(message.value())
        except SchemaError:
            self.undecodable += 1
            return []

    def _read_markers(self) -> None:
        for message in arrived(self.predictions, READ_BATCH, POLL_SECONDS):
            if message.error() is not None:
                continue
            for event in self._decode(message):
                if isinstance(event, CheckpointEvaluated):
                    partition, offset = message.partition(), message.offset()
                    if partition is not None and offset is not None:
                        self.markers[(event.job_id, event.checkpoint_time)] = (partition, offset)

    def record_boundary(self, job_id: str, t: float, message: Message) -> None:
        partition, offset = message.partition(), message.offset()
        if partition is not None and offset is not None:
            self.boundaries[(job_id, t)] = (partition, offset)

    def _committed_past(self, t: float, jobs: set[str]) -> set[str]:
        """The jobs (their markers for ``t`` read) whose marker and boundary for ``t`` the mitigator
        has committed past; forgets their positions. One request for both topics."""
        wanted = {job: (self.markers[(job, t)], self.boundaries.get((job, t))) for job in jobs}
        partitions = {(self.topics.predictions, p) for (p, _), _ in wanted.values()}
        partitions |= {(self.topics.checkpoints, b[0]) for _, b in wanted.values() if b is not None}
        committed = self.offsets.committed(
            [TopicPartition(topic, p) for topic, p in sorted(partitions)], timeout=FLUSH_TIMEOUT_SECONDS
        )
        offsets = {(tp.topic, tp.partition): tp.offset for tp in committed if tp.error is None}
        done = set()
        for job, ((p, offset), bound) in wanted.items():
            if (
                bound is not None
                and offsets.get((self.topics.predictions, p), -1) > offset
                and offsets.get((self.topics.checkpoints, bound[0]), -1) > bound[1]
            ):
                done.add(job)
                del self.markers[(job, t)]
                del self.boundaries[(job, t)]
        return done

    def wait_evaluated(self, t: float, jobs: Sequence[str], timeout: float) -> None:
        """Return once every job's marker for ``t`` is read and the mitigator has committed past it,
        and past the job's boundary for ``t``.

        The mitigation consumer acts on a checkpoint only once it has read both the agent's marker
        and the job's own boundary (they are on different topics), and commits its input offsets in
        the transaction that carries the commands: past both offsets, the commands are committed.
        The markers are read as they arrive; the committed offsets, which nothing announces, are
        asked for once every marker is in, then every `COMMITTED_POLL_SECONDS`.
        """
        waiting = set(jobs)
        deadline = time.monotonic() + timeout
        while any((job, t) not in self.markers for job in waiting):
            if time.monotonic() > deadline:
                raise self._stalled(t, waiting, timeout)
            self._ensure_running()
            self._read_markers()
        while True:
            waiting -= self._committed_past(t, waiting)
            if not waiting:
                return
            self._ensure_running()
            if time.monotonic() > deadline:
                raise self._stalled(t, waiting, timeout)
            time.sleep(COMMITTED_POLL_SECONDS)

    def _ensure_running(self) -> None:
        down = None if self.check is None else self.check()
        if down is not None:
            raise PipelineDown(down)

    def _stalled(self, t: float, waiting: set[str], timeout: float) -> ReplayStalled:
        why = {
            job: (
                "mitigation consumer has not committed past the checkpoint_evaluated marker "
                "and the job's checkpoint_boundary"
                if (job, t) in self.markers
                else "no checkpoint_evaluated marker from the agent"
            )
            for job in waiting
        }
        return ReplayStalled(t, why, timeout)

    def read_commands(self, t: float, timeout: float) -> list[RelaunchCommand]:
        """Every committed command up to the end of the commands topic as it stands now."""
        # Ask a consumer that does not fetch: the fetching one's request would queue behind its long poll.
        ends = end_offsets(self.offsets, self.topics.commands, self.command_partitions, FLUSH_TIMEOUT_SECONDS)
        found: list[RelaunchCommand] = []
        deadline = time.monotonic() + timeout
        while any(self.command_eof.get(p, -1) < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                behind = sorted(p for p, end in ends.items() if self.command_eof.get(p, -1) < end)
                raise ReplayStalled(
                    t, {f"{self.topics.commands}[{p}]": "not readable to its end" for p in behind}, timeout
                )
            for message in arrived(self.commands, READ_BATCH, POLL_SECONDS):
                error = message.error()
                partition, offset = message.partition(), message.offset()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF and partition is not None:
                        self.command_eof[partition] = offset if offset is not None else -1
                    continue
                found += [e for e in self._decode(message) if isinstance(e, RelaunchCommand)]
        return found

    def close(self) -> None:
        for consumer in (self.predictions, self.commands, self.offsets):
            consumer.close()


def _record_boundary(
    deliveries: DeliveryCounter,
    watch: _PipelineWatch,
    job_id: str,
    t: float,
    error: KafkaError | None,
    message: Message,
) -> None:
    """Delivery report of a boundary: count it, and remember where it landed for the closed loop."""
    deliveries(error, message)
    if error is None:
        watch.record_boundary(job_id, t, message)


class TraceReplayer:
    """Publishes jobs' checkpoints in global time order; see the module docstring and
    docs/stream-protocol.md.

    ``speed``: 0 replays as fast as the broker takes it; ``s > 0`` waits ``(T - previous T) / s``
    seconds of wall time between instants, at most `MAX_SLEEP_SECONDS`. ``observations_per_second``
    instead offers a steady load whatever the trace's shape: each instant waits until the observations
    sent before it have taken their share of wall time (`steady_due`). ``seed`` selects the relaunch
    draws (use the evaluator's seed to compare with it). ``checkpoint_seconds`` is the grid used to add
    checkpoints when a command makes a job outlast its own; by default the smallest spacing of the
    traces' checkpoints. ``batch`` sends each job checkpoint's task observations as ``task_batch``
    records (the default); False sends one ``task_checkpoint`` record per observation.
    """

    def __init__(
        self,
        traces: Sequence[JobTrace],
        bootstrap: str,
        *,
        topics: TopicNames = TopicNames(),  # noqa: B008 - a frozen dataclass, safe as a default
        speed: float = 0.0,
        closed_loop: bool = False,
        seed: int = 0,
        mitigator_group: str = "straggler-mitigation",
        wait_timeout: float = 120.0,
        progress: bool = True,
        checkpoint_seconds: float | None = None,
        batch: bool = True,
        observations_per_second: float | None = None,
        pipeline_check: PipelineCheck | None = None,
    ) -> None:
        if speed < 0 or not math.isfinite(speed):
            raise ValueError(f"speed must be 0 (as fast as possible) or positive, got {speed}")
        if observations_per_second is not None:
            if not (observations_per_second > 0 and math.isfinite(observations_per_second)):
                raise ValueError(f"observations_per_second must be positive, got {observations_per_second}")
            if speed > 0 or closed_loop:
                raise ValueError("observations_per_second paces an open loop: not with speed, closed_loop")
        if wait_timeout <= 0:
            raise ValueError(f"wait_timeout must be positive, got {wait_timeout}")
        ids = [trace.job_id for trace in traces]
        if len(set(ids)) != len(ids):
            raise ValueError("job ids must be unique: they are the record keys")
        self.traces = list(traces)
        self.bootstrap = bootstrap
        self.topics = topics
        self.speed = speed
        self.closed_loop = closed_loop
        self.seed = seed
        self.mitigator_group = mitigator_group
        self.wait_timeout = wait_timeout
        self.progress = progress
        self.interval = checkpoint_seconds or _smallest_spacing(self.traces)
        self.batch = batch
        self.observations_per_second = observations_per_second
        self.pipeline_check = pipeline_check
        """Closed loop: asked while waiting for the pipeline, so a stage that died fails the replay at
        once with its reason, not after ``wait_timeout``."""
        if closed_loop and self.interval is None:
            raise ValueError("closed loop needs checkpoint_seconds: no trace has two checkpoints")

    def run(self) -> ReplayResult:
        log.info(
            "replayer: %d jobs to broker %s, topics %s*, %s, %s",
            len(self.traces),
            self.bootstrap,
            self.topics.prefix,
            "closed loop" if self.closed_loop else "open loop",
            "as fast as possible" if self.speed == 0 else f"{self.speed:g}x real time",
        )
        wall_start = time.monotonic()
        deliveries = DeliveryCounter()
        producer = Producer(replay_producer_config(self.bootstrap))
        _require_topics(producer, (self.topics.checkpoints, self.topics.job_events))
        sims = [JobSimulation(trace, self.seed) for trace in self.traces]
        watch = (
            _PipelineWatch(self.bootstrap, self.topics, self.mitigator_group, self.pipeline_check)
            if self.closed_loop
            else None
        )
        result = ReplayResult(0, 0, len(self.traces), 0, 0.0)
        schedule: dict[float, list[int]] = {}
        for j, trace in enumerate(self.traces):
            for t in trace.checkpoints:
                schedule.setdefault(float(t), []).append(j)
        heap = list(schedule)
        heapq.heapify(heap)
        next_k = [0] * len(self.traces)
        cluster = SimulatedCluster(sims)  # carries out the commands: the replayer publishes its steps
        bar = tqdm(total=len(heap), unit="instant", disable=not self.progress, desc="replay")
        previous: float | None = None
        paced_at = steady_from = time.monotonic()

        def produce(
            topic: str, job_id: str, payload: bytes, callback: Callable[[KafkaError | None, Message], None]
        ) -> None:
            produce_with_backpressure(producer, topic, payload, job_id.encode(), callback)
            result.events_produced += 1
            if result.events_produced % 1000 == 0:
                producer.poll(0)

        def send(topic: str, job_id: str, event: Event) -> None:
            callback: Callable[[KafkaError | None, Message], None] = deliveries
            if watch is not None and isinstance(event, CheckpointBoundary):
                callback = partial(_record_boundary, deliveries, watch, job_id, event.checkpoint_time)
            produce(topic, job_id, encode(event), callback)

        def send_tasks(topic: str, job_id: str, events: Sequence[TaskCheckpoint]) -> None:
            result.observations_produced += len(events)
            if not self.batch:
                for event in events:
                    produce(topic, job_id, encode(event), deliveries)
            elif events:
                for payload in task_batches(job_id, events, source=events[0].source):
                    produce(topic, job_id, payload, deliveries)

        try:
            while heap:
                t = heapq.heappop(heap)
                active = schedule.pop(t)
                if previous is not None and self.speed > 0:
                    due = paced_at + min((t - previous) / self.speed, MAX_SLEEP_SECONDS)
                    time.sleep(max(0.0, due - time.monotonic()))
                elif self.observations_per_second is not None:
                    due = steady_due(steady_from, result.observations_produced, self.observations_per_second)
                    time.sleep(max(0.0, due - time.monotonic()))
                paced_at, previous = time.monotonic(), t
                starting = [j for j in active if next_k[j] == 0]
                for j in starting:
                    trace = self.traces[j]
                    send(self.topics.job_events, trace.job_id, started_event(trace))
                    log.info("job %s started at %g: %d tasks", trace.job_id, t, trace.n_tasks)
                if starting:
                    _flush(producer)  # a job's start is on the broker before its first task event
                for j in active:
                    k = next_k[j]
                    step = sims[j].step(k, t)  # open loop, no command reaches it: the trace as recorded
                    next_k[j] += 1
                    self._publish_checkpoint(sims[j], step, send, send_tasks, result)
                    if not self.closed_loop and k == len(self.traces[j].checkpoints) - 1:
                        send(self.topics.job_events, self.traces[j].job_id, ended_event(self.traces[j], t))
                        log.info("job %s ended at %g", self.traces[j].job_id, t)
                if watch is not None:
                    _flush(producer)
                    if deliveries.errors:
                        raise DeliveryError(deliveries.errors)
                    jobs = [self.traces[j].job_id for j in active]
                    watch.wait_evaluated(t, jobs, self.wait_timeout)
                    cluster.take(watch.read_commands(t, self.wait_timeout))
                    for _, decision in cluster.advance(t):
                        result.count(decision)
                    for j in active:
                        added = sims[j].extend(t, self.interval or 1.0)
                        for c in added:
                            if c not in schedule:
                                schedule[c] = []
                                heapq.heappush(heap, c)
                                bar.total += 1
                            insort(schedule[c], j)
                        if not added and sims[j].checkpoints[-1] == t:
                            job_id = self.traces[j].job_id
                            send(self.topics.job_events, job_id, ended_event(self.traces[j], t))
                            log.info("job %s ended at %g", job_id, t)
                result.instants += 1
                bar.update()
            _flush(producer)
        finally:
            bar.close()
            if watch is not None:
                result.undecodable = watch.undecodable
                watch.close()
        result.delivery_failures = deliveries.failed
        result.delivery_errors = [str(error) for error in deliveries.errors]
        result.outcomes = {sim.trace.job_id: sim.outcome() for sim in sims}
        result.wall_seconds = time.monotonic() - wall_start
        return result

    def _publish_checkpoint(
        self,
        sim: JobSimulation,
        step: CheckpointStep,
        send: SendEvent,
        send_tasks: SendTasks,
        result: ReplayResult,
    ) -> None:
        """One job's events for one checkpoint: finishes, kills, running tasks, then the boundary."""
        k, t, finished, gone, running, features = step
        trace = sim.trace
        names = trace.feature_names
        source = str(trace.meta.get("source", PRODUCER_SOURCE))
        topic = self.topics.checkpoints
        events: list[TaskCheckpoint] = []
        for i in finish_order(sim, finished):
            attempt, start = sim.finish_of(i)
            event = TaskCheckpoint(
                job_id=trace.job_id,
                task_id=trace.task_ids[i],
                attempt=attempt,
                checkpoint_time=float(sim.end[i]),
                status="finished",
                machine_id=trace.machine_ids[i],
                features=feature_map(names, sim.finish_features(i)),
                latency=float(sim.end[i] - start),
                start_time=_finite_or_none(start),
                source=source,
            )
            events.append(event)
        for i in finish_order(sim, gone):
            event = TaskCheckpoint(
                job_id=trace.job_id,
                task_id=trace.task_ids[i],
                attempt=int(sim.attempt[i]),
                checkpoint_time=float(sim.end[i]),
                status="killed",
                machine_id=trace.machine_ids[i],
                features={},
                start_time=_finite_or_none(sim.start[i]),
                source=source,
            )
            events.append(event)
        for i, row in zip(running.tolist(), features, strict=True):
            event = TaskCheckpoint(
                job_id=trace.job_id,
                task_id=trace.task_ids[i],
                attempt=int(sim.attempt[i]),
                checkpoint_time=t,
                status="running",
                machine_id=trace.machine_ids[i],
                features=feature_map(names, row),
                start_time=float(sim.start[i]),
                source=source,
            )
            events.append(event)
        send_tasks(topic, trace.job_id, events)
        produced_at = time.time()
        boundary = CheckpointBoundary(
            job_id=trace.job_id, checkpoint_time=t, checkpoint_index=k, produced_at=produced_at
        )
        send(topic, trace.job_id, boundary)
        result.boundary_produced_at[(trace.job_id, t)] = produced_at


def steady_due(began: float, sent: int, observations_per_second: float) -> float:
    """When the next instant of a steady replay is due: once the ``sent`` observations have had their
    share of time at the rate since ``began``, so the trace's bursts are spread over time (an instant's
    own observations still go together)."""
    return began + sent / observations_per_second


def _require_topics(client: Producer | Consumer, names: Sequence[str]) -> dict[str, list[int]]:
    """Each topic's partitions; a clear error, before anything is sent, if one does not exist."""
    found: dict[str, list[int]] = {}
    for name in names:
        described = client.list_topics(name, timeout=FLUSH_TIMEOUT_SECONDS).topics.get(name)
        if described is None or described.error is not None or not described.partitions:
            raise RuntimeError(
                f"topic {name!r} does not exist; create the topics first (straggler topics create)"
            )
        found[name] = sorted(described.partitions)
    return found


def _smallest_spacing(traces: Sequence[JobTrace]) -> float | None:
    spacings = [float(np.diff(trace.checkpoints).min()) for trace in traces if len(trace.checkpoints) > 1]
    positive = [s for s in spacings if s > 0]
    return min(positive) if positive else None


def started_event(trace: JobTrace) -> JobEvent:
    """The job's ``started`` event: at its first task's start (its first checkpoint when no task has
    started), with its expected task count and feature names; the replayer sends checkpoint boundaries."""
    starts = trace.start[np.isfinite(trace.start)]
    first = float(starts.min()) if len(starts) else float(trace.checkpoints[0])
    return JobEvent(
        job_id=trace.job_id,
        event="started",
        time=first,
        expected_tasks=trace.expected_tasks,
        sends_boundaries=True,
        feature_names=list(trace.feature_names),
    )


def ended_event(trace: JobTrace, t: float) -> JobEvent:
    """The job's ``ended`` event, at ``t``."""
    return JobEvent(job_id=trace.job_id, event="ended", time=t)


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _flush(producer: Producer) -> None:
    remaining = producer.flush(FLUSH_TIMEOUT_SECONDS)
    if remaining:
        raise RuntimeError(f"{remaining} record(s) still undelivered after {FLUSH_TIMEOUT_SECONDS:g} s")
