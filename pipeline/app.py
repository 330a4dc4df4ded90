"""The Faust worker: one App, one agent partitioned by job id, NURD at every checkpoint boundary.

The agent only moves events: ``task-checkpoints`` and ``job-events`` in, decoded and validated
(`schemas`), fed to the job's `OnlineJob` (the evaluator's own), verdicts out as ``prediction_batch``
records on ``straggler-predictions``, undecodable records to ``dead-letters``. Live jobs are evaluated
on a timer that publishes a boundary into the job's own partition; a record on a foreign partition is
first forwarded to its job's (`straggler.kafka.routing`).

Topology: docs/module-notes.md, docs/stream-protocol.md.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import faust
import orjson
from faust.types import EventT

from pipeline.durability import acknowledged, drain_fully
from pipeline.flow import keep_queued_records
from pipeline.jobstore import JobStore, feature_vector, new_online_job
from pipeline.metrics import WorkerMetrics, install_lag_sampler
from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    JobEvent,
    Prediction,
    SchemaError,
    TaskBatch,
    TaskCheckpoint,
    dead_letter_for,
    decode,
    encode,
    observations,
    prediction_batches,
)
from straggler.core.method import StragglerMethod
from straggler.core.online import Decision
from straggler.core.registry import load_trained_method, make_method
from straggler.kafka.names import TopicNames
from straggler.kafka.routing import Forward, Reject, route
from straggler.kafka.security import current_security, faust_credentials

log = logging.getLogger(__name__)

TaskInput = list[TaskCheckpoint] | CheckpointBoundary
"""What a job's input record asks of it (its valid task observations, or a boundary); it needs the
job's 'started' event first."""


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker is configured with; one App per settings."""

    bootstrap: str
    method: str = "nurd"
    model_path: str | None = None
    """For a cross-job method (START, ADMM): its trained file, from ``straggler train``."""
    topics: TopicNames = field(default_factory=TopicNames)
    partitions: int = 8
    app_id: str = "straggler-agent"
    quantile: float = 0.9
    start_fraction: float = 0.04
    refit_growth: float = 0.25
    seed: int = 0
    live_interval: float = 30.0
    """Seconds between evaluations of a live job (one that sends no checkpoint boundaries)."""
    pending_grace: float = 30.0
    """How long events of a job wait for its job_event 'started' before they are dead-lettered."""
    datadir: str | None = None
    admm_interval: float | None = None
    """Collaborative ADMM in the stream (``--method admm``): seconds between consensus rounds over the
    agent's partitions (`pipeline.admm_online`); None: off, the method comes from ``--model``."""


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


def _nan_to_none(value: float) -> float | None:
    return None if value != value else value


def method_factory(settings: WorkerSettings) -> Callable[[], StragglerMethod]:
    """A fresh method per job: from the registry, or a copy of the trained cross-job model."""
    if settings.admm_interval is not None:
        if settings.method != "admm":
            raise ValueError(f"--admm-interval is for --method admm, not {settings.method}")
        if settings.model_path is not None:
            raise ValueError("--admm-interval learns the model in the stream: leave out --model")
        return lambda: make_method(settings.method, settings.seed)  # weights: the live consensus
    if settings.model_path is None:
        if make_method(settings.method, settings.seed).learns_across_jobs:
            raise ValueError(
                f"{settings.method} learns across jobs: train it (`straggler train`), pass --model"
            )
        return lambda: make_method(settings.method, settings.seed)
    trained = load_trained_method(Path(settings.model_path), settings.method)
    return lambda: copy.deepcopy(trained)


def prediction_event(d: Decision, method: str, produced_at: float) -> Prediction:
    return Prediction(
        job_id=d.job_id,
        task_id=d.task_id,
        checkpoint_time=d.checkpoint_time,
        raw_latency=_nan_to_none(d.raw_latency),
        adjusted_latency=_nan_to_none(d.adjusted_latency),
        propensity=_nan_to_none(d.propensity),
        weight=_nan_to_none(d.weight),
        threshold=d.threshold,
        is_straggler=d.is_straggler,
        method=method,
        model_version=d.model_version,
        elapsed=d.elapsed,
        produced_at=produced_at,
        attempt=d.attempt,
        straggle_probability=_nan_to_none(d.straggle_probability),
    )


TABLE_HELP = {
    "tasks": "one row per task: latest state of each task",
    "jobs": "one row per job: protocol state and model version",
    "models": "each job's fitted method, at every refit",
}
TABLES = tuple(TABLE_HELP)
SESSION_TIMEOUT_S = 10.0
"""How soon the group notices a killed worker and hands its partitions on (Faust's default is 60 s)."""


def app_id(settings: WorkerSettings) -> str:
    prefix = settings.topics.prefix.rstrip("-.")
    return f"{settings.app_id}-{prefix}" if prefix else settings.app_id


def changelog_topics(settings: WorkerSettings) -> list[str]:
    """The tables' changelog topics, named as Faust names them."""
    return [f"{app_id(settings)}-{table}-changelog" for table in TABLES]


def create_changelog_topics(settings: WorkerSettings) -> list[str]:
    """Create the changelogs (compacted, co-partitioned with the inputs) before Faust starts.

    Faust declares them itself at start-up, but a first table write can race its metadata refresh
    and fail with a partition mismatch; declaring them up front, like every other topic, avoids it.
    """
    from confluent_kafka.admin import NewTopic

    from straggler.kafka.topics import create_missing_topics

    topics = [
        NewTopic(
            name,
            num_partitions=settings.partitions,
            replication_factor=1,
            config={"cleanup.policy": "compact"},
        )
        for name in changelog_topics(settings)
    ]
    return create_missing_topics(settings.bootstrap, topics)


def create_app(settings: WorkerSettings) -> faust.App:
    """Build the worker's App with its topics, tables, agent and timer."""
    names = settings.topics
    app = faust.App(
        app_id(settings),
        broker=f"kafka://{settings.bootstrap}",
        broker_credentials=faust_credentials(current_security()),  # TLS/SASL, as every other client
        store="memory://",
        topic_partitions=settings.partitions,
        topic_disable_leader=True,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        producer_acks=-1,
        broker_commit_interval=1.0,
        broker_session_timeout=SESSION_TIMEOUT_S,
        # No standby replicas: the memory store drops the rows of every partition that is not active
        # at the end of a recovery, while Faust's recovery remembers how far it read that partition as
        # a standby; a worker taking the partition over then skips the changelog and misses its jobs.
        # Without standbys it reads the whole changelog partition when it takes one over.
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        datadir=settings.datadir,
    )
    drain_fully(app.producer)  # every commit waits for all buffered rows (`pipeline.durability`)
    keep_queued_records(app.flow_control)  # recovery's second resume must not drop fetched records
    inputs = app.topic(names.checkpoints, names.job_events, key_type=bytes, value_type=bytes)
    predictions = app.topic(names.predictions, key_type=bytes, value_type=bytes)
    dead_letters = app.topic(names.dead_letters, key_type=bytes, value_type=bytes)
    boundaries = app.topic(names.checkpoints, key_type=bytes, value_type=bytes)
    home_topics = {
        names.checkpoints: boundaries,
        names.job_events: app.topic(names.job_events, key_type=bytes, value_type=bytes),
    }
    # Rows are bytes we encode ourselves: without key_type/value_type=bytes Faust writes them raw but
    # decodes the changelog as JSON on recovery, and a restarted worker never finishes recovering.
    tables = {
        name: app.Table(
            name,
            partitions=settings.partitions,
            key_type=bytes,
            value_type=bytes,
            help=TABLE_HELP[name],
        )
        for name in TABLES
    }
    tasks, jobs, models = (tables[name] for name in TABLES)

    protocol = {
        "quantile": settings.quantile,
        "start_fraction": settings.start_fraction,
        "refit_growth": settings.refit_growth,
    }
    store = JobStore(tasks, jobs, models, new_online_job(method_factory(settings), protocol))
    admm = None
    if settings.admm_interval is not None:
        from pipeline.admm_online import install

        admm = install(app, settings, store)
    stats = AgentStats()
    pending: dict[str, list[tuple[float, EventT, TaskInput]]] = defaultdict(list)
    """Events of jobs whose 'started' event has not arrived yet: job-events and task-checkpoints are
    separate topics, so Kafka does not order them against each other."""
    app.straggler_stats = stats  # type: ignore[attr-defined]
    metrics = WorkerMetrics(stats, jobs=lambda: len(jobs))
    app.straggler_metrics = metrics  # type: ignore[attr-defined]  # served by `straggler worker --metrics-port`
    install_lag_sampler(app, metrics, {names.checkpoints, names.job_events})

    async def on_partitions_moved(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        """The cache may hold jobs that are no longer ours, or miss changelog updates: drop it."""
        store.forget_cache()

    app.on_partitions_revoked.connect(cast(Any, on_partitions_moved))
    app.on_partitions_assigned.connect(cast(Any, on_partitions_moved))

    async def dead_letter(event: EventT, error: str | BaseException, payload: bytes | None = None) -> None:
        """Letter the record of ``event`` (or ``payload``, one observation of its batch) with the reason."""
        stats.dead_letters += 1
        metrics.dead_lettered(error)
        message = event.message
        raw = (message.value or b"") if payload is None else payload
        letter = dead_letter_for(raw, message.topic, message.partition, message.offset, error, stage="agent")
        await dead_letters.send(key=message.key, value=encode(letter))

    def apply_task(event: TaskCheckpoint) -> None:
        """Feed one task event to its (known) job; `JobStore.write_changes` writes what it changed."""
        meta = store.meta(event.job_id)
        job = store.job(event.job_id)
        assert meta is not None and job is not None
        if not meta.feature_names:
            meta.feature_names = list(event.features)
            store.save_meta(event.job_id, meta)
            job = store.reload(event.job_id)  # rebuild with the right feature count
            assert job is not None
        x = feature_vector(meta.feature_names, event.features)
        if event.status == "running":
            start = event.start_time if event.start_time is not None else event.checkpoint_time
            changed = job.state.observe_running(event.task_id, x, start, event.checkpoint_time, event.attempt)
        elif event.status == "finished":
            assert event.latency is not None  # the schema requires it
            changed = job.state.observe_finished(
                event.task_id, x, event.latency, event.checkpoint_time, event.attempt
            )
        else:
            changed = job.state.observe_gone(event.task_id, event.checkpoint_time, event.attempt)
        if changed:
            store.put_task(job, event.task_id)
        else:
            stats.ignored += 1

    async def apply_boundary(event: CheckpointBoundary) -> None:
        meta = store.meta(event.job_id)
        assert meta is not None
        if event.origin == "timer":
            if meta.live:
                await evaluate(event.job_id, event.checkpoint_time, None)
            return
        if meta.live:  # a producer that did not say it sends boundaries does: no timer for this job
            meta.live = False
            store.save_meta(event.job_id, meta)
        await evaluate(event.job_id, event.checkpoint_time, event.produced_at)

    async def settled(job_id: str) -> None:
        """Before any write of a job: its last job row must be on the broker (`pipeline.jobstore`)."""
        if store.awaiting_acknowledgement(job_id):
            await flush()

    async def flush() -> None:
        """Wait for every write so far; the job rows among them are then durable."""
        rows = store.unacknowledged()
        await acknowledged(app.producer)
        store.acknowledged(rows)

    async def apply(decoded: TaskInput) -> None:
        await settled(decoded.job_id if isinstance(decoded, CheckpointBoundary) else decoded[0].job_id)
        if isinstance(decoded, CheckpointBoundary):
            await apply_boundary(decoded)
            return
        for observation in decoded:
            apply_task(observation)
        store.write_changes(decoded[0].job_id)  # before any await: nothing is left pending

    async def valid_observations(event: EventT, batch: TaskBatch) -> list[TaskCheckpoint]:
        """The batch's valid observations; each invalid one is dead-lettered alone, with its reason."""
        valid = []
        payload = event.message.value
        for body, observation in zip(batch.observations, observations(batch, payload), strict=True):
            if isinstance(observation, SchemaError):
                await dead_letter(event, observation, payload=orjson.dumps(body))
            else:
                valid.append(observation)
        return valid

    def drop(job_id: str) -> None:
        if admm is not None:
            admm.retire(job_id)  # ADMM's node keeps the ended job's rows for a while
        store.drop(job_id)

    async def evaluate(job_id: str, at: float, boundary_produced_at: float | None) -> None:
        meta = store.meta(job_id)
        if meta is None or (meta.last_evaluated is not None and at <= meta.last_evaluated):
            stats.ignored += 1
            return  # a duplicate or late boundary: the checkpoint was already evaluated
        job, meta = store.job(job_id), store.meta(job_id)  # the cached pair, kept current below
        assert job is not None and meta is not None
        if admm is not None:
            admm.prepare(job)  # the latest consensus weights
        # The order of writes is what makes a killed worker recover exactly (`pipeline.jobstore`).
        version, started = job.model_version, time.perf_counter()
        decisions = store.evaluate(job_id, at)
        refit = time.perf_counter() - started if job.model_version != version else None
        now = time.time()
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
        verdicts = [prediction_event(d, settings.method, now) for d in decisions]
        for part in prediction_batches(verdicts, marker):
            await predictions.send(key=key, value=part)
        await flush()  # the model and predictions are on the broker
        metrics.evaluated(decisions, refit, boundary_produced_at, time.time())
        store.record_evaluation(at, job, meta)  # acknowledged by the next flush, before the job's next write
        stats.predictions += len(decisions)
        if meta.ended_at is not None and at >= meta.ended_at:
            await settled(job_id)
            drop(job_id)

    @app.agent(inputs)
    async def straggler_agent(stream: faust.StreamT[bytes]) -> None:
        """Decode -> validate -> update the job's state -> at a boundary, NURD -> predictions."""
        async for event in stream.events():
            stats.events += 1
            try:
                decoded = decode(event.value)
            except SchemaError as error:
                await dead_letter(event, error)
                continue
            if isinstance(decoded, TaskCheckpoint | TaskBatch | CheckpointBoundary | JobEvent):
                message = event.message
                where = route(message.key, decoded.job_id, message.partition, settings.partitions)
                if isinstance(where, Forward):
                    await forward(event, where.partition)
                    continue
                if isinstance(where, Reject):
                    await dead_letter(event, where.reason)
                    continue
            try:
                await handle(event, decoded)
            except Exception as error:  # one bad event must not stop the agent
                log.exception("failed on %s event of job %r", decoded.type, getattr(decoded, "job_id", None))
                await dead_letter(event, f"internal error: {type(error).__name__}: {error}")

    async def forward(event: EventT, partition: int) -> None:
        """Copy a misplaced record, unchanged, to its job's partition of the same topic.

        Sends keep their order per partition, so one producer's records of a job stay in order; the
        source offset is committed only after the copy is on the broker (`drain_fully`), so a crash
        forwards it again at worst: a repeated observation, boundary or start changes nothing.
        """
        stats.forwarded += 1
        message = event.message
        await home_topics[message.topic].send(key=message.key, value=message.value, partition=partition)

    async def handle(event: EventT, decoded: object) -> None:
        if isinstance(decoded, TaskCheckpoint | TaskBatch | CheckpointBoundary):
            work: TaskInput
            if isinstance(decoded, TaskCheckpoint):
                stats.task_events += 1
                work = [decoded]
            elif isinstance(decoded, TaskBatch):
                stats.task_events += len(decoded.observations)
                work = await valid_observations(event, decoded)
                if not work:
                    return
            else:
                stats.boundaries += 1
                work = decoded
            if store.meta(decoded.job_id) is None or decoded.job_id in pending:
                pending[decoded.job_id].append((time.monotonic(), event, work))
            else:
                await apply(work)
        elif isinstance(decoded, JobEvent):
            await settled(decoded.job_id)
            await handle_job_event(decoded)
            if store.meta(decoded.job_id) is not None:
                for _, _, waiting in pending.pop(decoded.job_id, []):
                    await apply(waiting)
        else:
            kind = getattr(decoded, "type", type(decoded).__name__)
            await dead_letter(event, f"unexpected {kind} event on {event.message.topic}")

    async def handle_job_event(event: JobEvent) -> None:
        if event.event == "started":
            assert event.expected_tasks is not None
            live = not event.sends_boundaries
            store.start(event.job_id, event.expected_tasks, list(event.feature_names or []), live=live)
            return
        meta = store.meta(event.job_id)
        if meta is None:
            stats.ignored += 1
            return
        if meta.last_evaluated is not None and meta.last_evaluated >= event.time:
            drop(event.job_id)
        else:
            meta.ended_at = event.time
            store.save_meta(event.job_id, meta)

    @app.timer(interval=1.0)
    async def expire_pending() -> None:
        """Task events whose job never started go to dead letters once the grace period is over."""
        if not pending:
            return
        deadline = time.monotonic() - settings.pending_grace
        for job_id in [j for j, items in pending.items() if items and items[0][0] < deadline]:
            for _, event, _ in pending.pop(job_id):
                await dead_letter(
                    event,
                    f"event for unknown job {job_id!r}: no job_event 'started' within "
                    f"{settings.pending_grace:.0f}s",
                )

    @app.timer(interval=settings.live_interval)
    async def evaluate_live_jobs() -> None:
        """Jobs that send no boundaries get one from the worker, into their own partition.

        Only jobs this worker has handled since its last rebalance (its cache) are ticked, so two
        workers never tick the same job; a live job re-enters the cache with its next report.
        """
        now = time.time()
        for job_id in store.cached_jobs():
            meta = store.meta(job_id)
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
            await boundaries.send(key=job_id.encode(), value=encode(tick))

    return app
