"""Collaborative ADMM inside the Faust worker: the nodes are the agent's partitions (``--admm-interval``).

The math is `straggler.core.admm`; this module only decides when each step runs and moves vectors.
Every ``admm_interval`` seconds each node (an input partition's finished tasks) sends its next round's
message to the one-partition exchange topic; the exchange agent averages a complete round into z and
writes it, with the pooled scaler moments, to a GlobalTable, from which each job's `Admm` method
predicts (no straggler before round 1). Node state is in memory; a stalled round is sent again.

Protocol, recovery and envelopes: docs/module-notes.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import orjson

from pipeline.settings import WorkerSettings, app_id
from straggler.core.admm import (
    Admm,
    Consensus,
    ConsensusNode,
    NodeData,
    node_moments,
    standardiser_from_moments,
    straggler_labels,
)
from straggler.core.method import BoolArray, FloatArray
from straggler.core.online import OnlineJob
from straggler.core.partitioner import partition_of

if TYPE_CHECKING:
    import faust

    from pipeline.jobstore import JobStore

log = logging.getLogger(__name__)

MESSAGE_SCHEMA = "straggler.admm-online-message"
CONSENSUS_SCHEMA = "straggler.admm-online-consensus"
VERSION = 1
CONSENSUS_KEY = b"consensus"
TABLE_NAME = "admm-consensus"
RETENTION_S = 600.0
"""How long a node keeps the rows of a job that ended (the agent drops the job's tables at its end)."""
STALL_TICKS = 10
"""Intervals a node waits for its round to complete before it sends its message again."""


def _vector(values: Iterable[float] | None) -> FloatArray | None:
    return None if values is None else np.asarray(list(values), dtype=np.float64)


def _list(values: FloatArray | None) -> list[float] | None:
    return None if values is None else [float(v) for v in values]


@dataclass(frozen=True)
class RoundMessage:
    """What node ``node`` sends for round ``round``: x_i + u_i and its rows' moments (raw features).

    ``dim`` is the feature count (None: a node that knows none yet, only in round 0)."""

    node: int
    round: int
    dim: int | None
    message: FloatArray | None
    moments: FloatArray | None
    rows: int

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "schema": MESSAGE_SCHEMA,
                "version": VERSION,
                "node": self.node,
                "round": self.round,
                "dim": self.dim,
                "rows": self.rows,
                "message": _list(self.message),
                "moments": _list(self.moments),
            }
        )

    @classmethod
    def decode(cls, payload: bytes) -> RoundMessage | None:
        """None for anything that is not a message of this protocol and version."""
        try:
            raw = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(raw, dict) or raw.get("schema") != MESSAGE_SCHEMA or raw.get("version") != VERSION:
            return None
        return cls(
            int(raw["node"]),
            int(raw["round"]),
            raw["dim"],
            _vector(raw["message"]),
            _vector(raw["moments"]),
            int(raw["rows"]),
        )


@dataclass(frozen=True)
class ConsensusRecord:
    """The GlobalTable's row: round ``round``'s z, fitted under the scaler of ``scaled_by``; ``moments``
    (pooled from this round's messages) give the scaler of the next round."""

    round: int
    dim: int
    z: FloatArray
    moments: FloatArray
    scaled_by: FloatArray
    rows: int
    primal: float
    dual: float
    at: float

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "schema": CONSENSUS_SCHEMA,
                "version": VERSION,
                "round": self.round,
                "dim": self.dim,
                "z": _list(self.z),
                "moments": _list(self.moments),
                "scaled_by": _list(self.scaled_by),
                "rows": self.rows,
                "primal": self.primal,
                "dual": self.dual,
                "at": self.at,
            }
        )

    @classmethod
    def decode(cls, payload: bytes) -> ConsensusRecord:
        raw = orjson.loads(payload)
        if raw.get("schema") != CONSENSUS_SCHEMA or raw.get("version") != VERSION:
            raise ValueError(f"not an ADMM consensus record of version {VERSION}")
        return cls(
            int(raw["round"]),
            int(raw["dim"]),
            np.asarray(raw["z"], dtype=np.float64),
            np.asarray(raw["moments"], dtype=np.float64),
            np.asarray(raw["scaled_by"], dtype=np.float64),
            int(raw["rows"]),
            float(raw["primal"]),
            float(raw["dual"]),
            float(raw["at"]),
        )


@dataclass
class NodeState:
    """One node's ADMM state on the worker that owns its partition (in memory)."""

    sent_round: int
    sent_at: float
    payload: bytes
    x: FloatArray | None = None
    message: FloatArray | None = None


Rows = tuple[FloatArray, BoolArray]


@dataclass
class OnlineAdmm:
    """Node steps and the aggregator, without Faust (the wiring is `install`)."""

    n_nodes: int
    rho: float = 1.0
    lam: float = 1.0
    retention: float = RETENTION_S
    stall_seconds: float = float("inf")
    """A node sends its message again when its round has not completed after this long."""
    clock: Callable[[], float] = time.monotonic
    nodes: dict[int, NodeState] = field(default_factory=dict)
    archive: dict[int, dict[str, tuple[float, FloatArray, BoolArray]]] = field(default_factory=dict)
    """partition -> ended job -> (when it ended, finish features, labels)."""
    pending: dict[int, dict[int, RoundMessage]] = field(default_factory=dict)
    replica: Consensus | None = None

    # -- node side --------------------------------------------------------------------------------

    def retire(self, partition: int, job_id: str, X: FloatArray, latency: FloatArray) -> None:
        """Keep an ending job's labelled rows for `retention` seconds."""
        if len(latency):
            rows = (np.asarray(X, dtype=np.float64), straggler_labels(latency))
            self.archive.setdefault(partition, {})[job_id] = (self.clock(), *rows)

    def retained(self, partition: int) -> dict[str, Rows]:
        jobs = self.archive.get(partition, {})
        deadline = self.clock() - self.retention
        for job_id in [j for j, (t, _, _) in jobs.items() if t < deadline]:
            del jobs[job_id]
        return {job_id: (X, y) for job_id, (_, X, y) in jobs.items()}

    def keep_partitions(self, owned: set[int]) -> None:
        """Partitions moved away: their node state and retained rows are gone with them."""
        for p in [p for p in self.nodes if p not in owned]:
            del self.nodes[p]
        for p in [p for p in self.archive if p not in owned]:
            del self.archive[p]

    def node_step(
        self, partition: int, consensus: ConsensusRecord | None, rows: Callable[[int | None], list[Rows]]
    ) -> bytes | None:
        """The message node ``partition`` sends now (None: it already sent this round and waits).

        ``rows(dim)`` gives the node's labelled rows of jobs with ``dim`` features (None: any; the
        first job's count is then used)."""
        target = 0 if consensus is None else consensus.round + 1
        now = self.clock()
        state = self.nodes.get(partition)
        if state is not None and state.sent_round > target:
            state = None  # the consensus went back (its table was reset): start again
        if state is not None and state.sent_round == target:
            if now - state.sent_at < self.stall_seconds:
                return None
            if target > 0:
                state.sent_at = now
                return state.payload  # the round stalled: send the same message again
            # round 0 stalled: send it again with the node's current rows (it may have some now)
        if consensus is None:
            parts = rows(None)
            dim = parts[0][0].shape[1] if parts else None
            X = np.concatenate([X for X, _ in parts]) if parts else None
            message = RoundMessage(
                partition,
                0,
                dim,
                None if dim is None else np.zeros(dim + 1),
                None if X is None else node_moments(X),
                0 if X is None else len(X),
            )
            payload = message.encode()
            self.nodes[partition] = NodeState(0, now, payload, message.message, message.message)
            return payload
        dim = consensus.dim
        parts = [(X, y) for X, y in rows(dim) if X.shape[1] == dim]
        X = np.concatenate([X for X, _ in parts]) if parts else np.zeros((0, dim))
        y = np.concatenate([y for _, y in parts]) if parts else np.zeros(0, dtype=bool)
        scaler = standardiser_from_moments([consensus.moments])
        node = ConsensusNode(NodeData(scaler.transform(X), y), self.n_nodes, rho=self.rho, lam=self.lam)
        z = consensus.z
        if (
            state is not None
            and state.sent_round == consensus.round
            and state.message is not None
            and state.x is not None
            and state.message.shape == z.shape
        ):
            node.x, node.message = state.x.copy(), state.message
            node.dual_step(z)
        else:
            node.x = z.copy()  # a node new to the run: u = 0, warm start at the consensus
        vector = node.local_step(z)
        message = RoundMessage(partition, target, dim, vector.copy(), node_moments(X), len(X))
        payload = message.encode()
        self.nodes[partition] = NodeState(target, now, payload, node.x.copy(), vector.copy())
        return payload

    # -- aggregator side --------------------------------------------------------------------------

    def collect(self, message: RoundMessage, consensus: ConsensusRecord | None) -> ConsensusRecord | None:
        """Take one node's message; the next consensus record once every node has sent its round."""
        current = -1 if consensus is None else consensus.round
        if message.round <= current or not 0 <= message.node < self.n_nodes:
            return None  # stale, or not one of our nodes
        for r in [r for r in self.pending if r <= current]:
            del self.pending[r]
        got = self.pending.setdefault(message.round, {})
        got[message.node] = message
        if len(got) < self.n_nodes or message.round != current + 1:
            return None
        messages = [got[i] for i in range(self.n_nodes)]
        if consensus is None:
            dims = [m.dim for m in messages if m.dim is not None]
            if not dims:
                return None  # no node has a row yet: wait for their messages again
            dim = dims[0]
            z_prev = np.zeros(dim + 1)
            scaled_by = np.zeros(1 + 3 * dim)
        else:
            dim, z_prev, scaled_by = consensus.dim, consensus.z, consensus.moments
        vectors, moments, rows = [], [], 0
        for m in messages:
            if m.dim == dim and m.message is not None and m.moments is not None:
                vectors.append(m.message)
                moments.append(m.moments)
                rows += m.rows
            else:  # another feature count (or none yet): contributes x = z, u = 0 and no rows
                if m.dim is not None and m.dim != dim:
                    log.warning("ADMM node %d sent %s features, the consensus has %d", m.node, m.dim, dim)
                vectors.append(z_prev)
                moments.append(np.zeros(1 + 3 * dim))
        if self.replica is None or len(self.replica.z) != dim + 1:
            self.replica = Consensus(self.n_nodes, dim + 1, rho=self.rho)
            self.replica.z = z_prev.copy()
        verdict = self.replica.update(vectors)
        del self.pending[message.round]
        return ConsensusRecord(
            round=message.round,
            dim=dim,
            z=self.replica.z.copy(),
            moments=np.sum(np.stack(moments), axis=0),
            scaled_by=scaled_by,
            rows=rows,
            primal=verdict.primal,
            dual=verdict.dual,
            at=time.time(),
        )


def use_consensus(method: object, consensus: ConsensusRecord | None, n_features: int) -> None:
    """Give an `Admm` the consensus weights (no straggler predicted before round 1 has completed)."""
    if not isinstance(method, Admm):
        return
    method.n_features_ = n_features
    if consensus is None or consensus.round < 1 or consensus.dim != n_features:
        method.scaler_ = standardiser_from_moments([np.zeros(1 + 3 * n_features)])
        method.coef_ = np.zeros(n_features)
        method.intercept_ = 0.0
        method.constant_class_ = False
        return
    method.scaler_ = standardiser_from_moments([consensus.scaled_by])
    method.coef_ = np.asarray(consensus.z[:-1], dtype=np.float64)
    method.intercept_ = float(consensus.z[-1])
    method.constant_class_ = None


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
        job = self.store.job(job_id)
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
                    job = self.store.job(job_id)
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
        """Each owned node sends its message for the round after the latest consensus."""
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
