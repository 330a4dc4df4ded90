"""Online consensus ADMM across a worker's partitions, without Kafka: the round messages and
consensus records (their wire form), each node's state and step, and the exchange's averaging.

The math is `straggler.core.admm`; `pipeline.admm_online` runs these steps on Faust's timer and
agent (``straggler worker --admm-interval``). Protocol and recovery: docs/architecture.md, "Collaborative
ADMM"; the records: docs/stream-protocol.md, "ADMM exchange topics".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import orjson

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

log = logging.getLogger(__name__)

MESSAGE_SCHEMA = "straggler.admm-online-message"
CONSENSUS_SCHEMA = "straggler.admm-online-consensus"
VERSION = 1
RETENTION_S = 600.0
"""How long a node keeps the rows of a job that ended (the agent drops the job's tables at its end)."""


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
