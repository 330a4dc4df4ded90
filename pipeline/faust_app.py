"""The worker's Faust App as configured (broker, credentials, acknowledgements, commits, recovery),
its tables (`JobTable`, their changelog topics, the `JobStore` over them) and the method each job gets.

Apart from `pipeline.app`, which adds the worker's topics, agent and timers, so that a benchmark
(bench/faust_floor.py) can build the same App with an agent of its own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import faust

from pipeline.faust_patches import drain_fully, keep_queued_records
from pipeline.jobstore import SEPARATOR, JobStore, new_online_job
from pipeline.settings import WorkerSettings, app_id
from straggler.core.method import StragglerMethod
from straggler.core.partitioner import partition_of
from straggler.core.registry import load_trained_method, make_method
from straggler.kafka.security import current_security, faust_credentials


def method_factory(settings: WorkerSettings) -> Callable[[], StragglerMethod]:
    """A fresh method per job: from the registry, or a copy of the trained cross-job model."""
    if make_method(settings.method, settings.seed).uses_future_information:
        raise ValueError(f"{settings.method} is told the future (an evaluation control): no worker runs it")
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


TABLE_HELP = {
    "tasks": "one row per task: latest state of each task",
    "jobs": "one row per job: protocol state and model version",
    "models": "each job's fitted method, at every refit",
}
TABLES = tuple(TABLE_HELP)
MEMBER_TIMEOUT_S = 10.0
"""How soon the group notices a killed worker and hands its partitions on (Faust's default is 60 s)."""


class JobTable(faust.Table):
    """A table whose rows go to their job's changelog partition, whatever record is being handled.

    Faust writes a row to the partition of the event in hand (`Table.partition_for_key`, which it
    documents for overriding); the worker's rows are keyed by job id (``job`` or ``job \x1f ...``,
    `pipeline.jobstore`), so a group commit can write every job's rows at once, from a timer too."""

    def partition_for_key(self, key: bytes) -> int:
        job_id = key.split(SEPARATOR.encode(), 1)[0].decode()
        return partition_of(job_id, cast(int, self.partitions))


def job_tables(app: faust.App, partitions: int) -> list[JobTable]:
    """The worker's tables ``tasks``, ``jobs`` and ``models``, added to ``app``.

    Their rows are bytes the worker encodes itself: without ``key_type``/``value_type=bytes`` Faust
    writes them raw but decodes the changelog as JSON on recovery, and a restarted worker never
    finishes recovering."""
    tables = [
        JobTable(
            app,
            name=name,
            beacon=app.tables.beacon,
            partitions=partitions,
            key_type=bytes,
            value_type=bytes,
            help=TABLE_HELP[name],
        )
        for name in TABLES
    ]
    for table in tables:
        app.tables.add(table)
    return tables


def job_store(app: faust.App, settings: WorkerSettings) -> JobStore:
    """The worker's jobs over its tables, each job with a fresh method and the protocol settings."""
    protocol = {
        "quantile": settings.quantile,
        "start_fraction": settings.start_fraction,
        "refit_growth": settings.refit_growth,
    }
    tasks, jobs, models = job_tables(app, settings.partitions)
    return JobStore(tasks, jobs, models, new_online_job(method_factory(settings), protocol))


def start_uncommitted_inputs_at_their_beginning(app: faust.App, topics: set[str]) -> None:
    """After each recovery, seek every input partition the group never committed to its beginning.

    ``consumer_auto_offset_reset="earliest"`` says so already, but a worker that recovers tables
    fetches input records meanwhile, and the recovery's seek to committed offsets rewinds only the
    partitions that have one: a restarted worker whose predecessor died before its first offset
    commit then skipped those records and waited for new ones (`worker-kill-repeated`)."""

    async def seek_uncommitted(sender: Any, *args: Any, **kwargs: Any) -> None:
        consumer: Any = app.consumer  # seek_to_committed is not in ConsumerT
        committed = await consumer.seek_to_committed()
        uncommitted = [
            tp
            for tp in consumer.assignment()
            if tp.topic in topics and (committed.get(tp) is None or committed[tp] < 0)
        ]
        if uncommitted:
            for tp, offset in (await consumer.earliest_offsets(*uncommitted)).items():
                # only where records were read past: a seek races aiokafka's fetcher (it crashed a
                # worker once with a KeyError in `Fetcher.fetched_records`), so none that is not needed
                if (await consumer.position(tp) or 0) > offset:
                    await consumer.seek(tp, offset)

    app.on_rebalance_complete.connect(cast(Any, seek_uncommitted))


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


def faust_app(settings: WorkerSettings) -> faust.App:
    """An App configured as the worker's (broker, credentials, acknowledgements, commits, recovery),
    with no topic, table or agent yet: `pipeline.app.Worker` adds the worker's, bench/faust_floor.py
    its own."""
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
        broker_session_timeout=MEMBER_TIMEOUT_S,
        # No standby replicas: the memory store drops the rows of every partition that is not active
        # at the end of a recovery, while Faust's recovery remembers how far it read that partition as
        # a standby; a worker taking the partition over then skips the changelog and misses its jobs.
        # Without standbys it reads the whole changelog partition when it takes one over.
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        datadir=settings.datadir,
    )
    drain_fully(app.producer)  # every commit waits for all buffered rows (`pipeline.faust_patches`)
    keep_queued_records(app.flow_control)  # recovery's second resume must not drop fetched records
    return app
