"""Collaborative ADMM inside the Faust worker: the nodes are the agent's partitions (``--admm-interval``).

The math is `straggler.core.admm`, the rounds `straggler.core.admm_online`; this module only decides
when each step runs and moves vectors.
Every ``admm_interval`` seconds each node (an input partition's finished tasks) sends its next round's
message to the one-partition exchange topic; the exchange agent averages a complete round into z and
writes it, with the pooled scaler moments, to a GlobalTable, from which each job's `Admm` method
predicts (no straggler before round 1). Node state is in memory; a stalled round is sent again.

Protocol and recovery: docs/architecture.md, "Collaborative ADMM"; the records: docs/stream-protocol.md,
"ADMM exchange topics".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.settings import WorkerSettings, app_id
from straggler.core.admm import straggler_labels
from straggler.core.admm_online import ConsensusRecord, OnlineAdmm, RoundMessage, Rows, use_consensus
from straggler.core.online import OnlineJob
from straggler.core.partitioner import partition_of

if TYPE_CHECKING:
    import faust

    from pipeline.jobstore import JobStore

log = logging.getLogger(__name__)

CONSENSUS_KEY = b"consensus"
TABLE_NAME = "admm-consensus"
STALL_TICKS = 10
"""Intervals a node waits for its round to complete before it sends its message again."""


def table_changelog(app_id: str) -> str:
    """The GlobalTable's changelog topic, as Faust names it."""
    return f"{app_id}-{TABLE_NAME}-changelog"


def create_topics(settings: WorkerSettings) -> None:
    """The exchange topic and the GlobalTable's changelog: one partition each (the table is written
    by the exchange agent, in the exchange partition's changelog partition)."""
    from confluent_kafka.admin import NewTopic

    from straggler.kafka.topics import create_missing_topics

    topics = [
        NewTopic(settings.topics.admm_online_exchange, num_partitions=1, replication_factor=1),
        NewTopic(
            table_changelog(app_id(settings)),
            num_partitions=1,
            replication_factor=1,
            config={"cleanup.policy": "compact"},
        ),
    ]
    create_missing_topics(settings.bootstrap, topics)


@dataclass
class AdmmWiring:
    """What the agent calls: `prepare` before evaluating a job, `retire` before dropping one."""

    admm: OnlineAdmm
    store: JobStore
    n_partitions: int
    table: Mapping[bytes, bytes]
    _cached: tuple[bytes, ConsensusRecord] | None = None

    def consensus(self) -> ConsensusRecord | None:
        payload = self.table.get(CONSENSUS_KEY)
        if payload is None:
            return None
        if self._cached is None or self._cached[0] != payload:
            self._cached = (payload, ConsensusRecord.decode(payload))
        return self._cached[1]

    def prepare(self, job: OnlineJob | None) -> None:
        if job is not None:
            use_consensus(job.method, self.consensus(), job.state.n_features)

    def retire(self, job_id: str) -> None:
        job = self.store.peek(job_id)
        if job is not None and job.state.n_features:
            _, X, latency = job.state.finished()
            self.admm.retire(partition_of(job_id, self.n_partitions), job_id, X, latency)

    def node_rows(self, partitions: set[int]) -> Callable[[int], Callable[[int | None], list[Rows]]]:
        """Per owned partition, its rows: running jobs' finished tasks (tables), then ended jobs'."""
        by_partition: dict[int, list[str]] = {p: [] for p in partitions}
        for key in list(self.store.jobs.keys()):
            job_id = key.decode()
            p = partition_of(job_id, self.n_partitions)
            if p in by_partition:
                by_partition[p].append(job_id)

        def for_partition(p: int) -> Callable[[int | None], list[Rows]]:
            def rows(dim: int | None) -> list[Rows]:
                found: dict[str, Rows] = dict(self.admm.retained(p))
                for job_id in by_partition[p]:
                    job = self.store.peek(job_id)
                    if job is None or not job.state.n_features:
                        continue
                    if dim is not None and job.state.n_features != dim:
                        continue
                    _, X, latency = job.state.finished()
                    if len(latency):
                        found[job_id] = (X, straggler_labels(latency))
                return [found[j] for j in sorted(found)]

            return rows

        return for_partition


def install(app: faust.App, settings: WorkerSettings, store: JobStore) -> AdmmWiring:
    """Declare the exchange topic, the consensus GlobalTable, the round timer and the exchange agent."""
    assert settings.admm_interval is not None and settings.admm_interval > 0
    names = settings.topics
    exchange = app.topic(names.admm_online_exchange, partitions=1, key_type=bytes, value_type=bytes)
    table = app.GlobalTable(
        TABLE_NAME,
        partitions=1,
        key_type=bytes,
        value_type=bytes,
        recovery_buffer_size=1,
        help="collaborative ADMM: the latest consensus round (replicated to every worker)",
    )
    admm = OnlineAdmm(settings.partitions, stall_seconds=STALL_TICKS * settings.admm_interval)
    wiring = AdmmWiring(admm, store, settings.partitions, table)
    app.straggler_admm = admm  # type: ignore[attr-defined]

    def owned_partitions() -> set[int]:
        return {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == names.checkpoints}

    @app.timer(interval=settings.admm_interval)
    async def admm_round() -> None:
        """Each owned node sends its message for the round after the latest consensus; not while
        partitions move: the assignment is in flux (`keep_partitions` would drop retained rows), and
        a recovery may still be filling the tables (Faust resumes the flow before it has read them)."""
        if app.rebalancing or app.in_recovery or not app.flow_control.is_active():
            return
        owned = owned_partitions()
        admm.keep_partitions(owned)
        if not owned:
            return
        consensus = wiring.consensus()
        rows = wiring.node_rows(owned)
        for p in sorted(owned):
            payload = admm.node_step(p, consensus, rows(p))
            if payload is not None:
                await exchange.send(key=f"node-{p}".encode(), value=payload)

    @app.agent(exchange)
    async def admm_exchange(stream: faust.StreamT[bytes]) -> None:
        """Collect each round's messages; when all nodes have sent, publish the new consensus."""
        async for value in stream:
            message = RoundMessage.decode(value)
            if message is None:
                continue
            try:
                record = admm.collect(message, wiring.consensus())
            except Exception:  # one bad message must not stop the exchange
                log.exception("ADMM exchange failed on a message of node %d", message.node)
                continue
            if record is not None:
                table[CONSENSUS_KEY] = record.encode()
                log.info("ADMM consensus round %d over %d rows", record.round, record.rows)

    del admm_round, admm_exchange  # registered with the app
    return wiring
