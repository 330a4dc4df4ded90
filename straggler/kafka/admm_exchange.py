"""Consensus ADMM rounds over Kafka: one node per partition, vectors only on the wire.

The math lives in `straggler.core.admm`; this module only moves vectors. Each node (a thread) runs
synchronous rounds: local step, publish x_i + u_i to the single-partition exchange topic, read every
node's message, replay `Consensus.update`; all nodes stop at the same round with the weights of
`fit_consensus`. Records are `schemas.admm`'s (docs/stream-protocol.md, "ADMM exchange topics"); the
rounds: docs/architecture.md, "Collaborative ADMM".
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from schemas.admm import ExchangeRecord, decode_exchange, encode_exchange
from straggler.core.admm import (
    Consensus,
    ConsensusExchange,
    ConsensusHistory,
    ConsensusNode,
    NodeData,
    RoundRecord,
)
from straggler.core.arrays import FloatArray
from straggler.kafka.config import (
    DeliveryCounter,
    consumer_config,
    producer_config,
)
from straggler.kafka.offsets import end_offset
from straggler.kafka.topics import create_missing_topics

ADMIN_TIMEOUT_S = 30.0


def ensure_exchange_topic(bootstrap: str, topic: str) -> None:
    """Create the one-partition exchange topic unless it exists (the broker does not auto-create)."""
    create_missing_topics(bootstrap, [NewTopic(topic, num_partitions=1, replication_factor=1)])


def exchange_end(bootstrap: str, topic: str) -> int:
    """The exchange partition's current end: a run reads only what is written after it (asked again
    while the just-created topic has no leader yet, `straggler.kafka.offsets.end_offset`)."""
    consumer = Consumer(consumer_config(bootstrap, f"admm-probe-{uuid.uuid4().hex}"))
    try:
        return end_offset(consumer, TopicPartition(topic, 0), ADMIN_TIMEOUT_S)
    finally:
        consumer.close()


def decode(message: Message) -> ExchangeRecord | None:
    """The record's vector and coordinates; None for a record that is not an exchange message."""
    return decode_exchange(message.headers() or [], message.value() or b"")


@dataclass
class NodeOutcome:
    weights: FloatArray
    history: list[RoundRecord]
    messages_per_round: list[int] = field(default_factory=list)


def _node_loop(
    bootstrap: str,
    topic: str,
    start: int,
    run: str,
    node_id: int,
    data: NodeData,
    n_nodes: int,
    rounds: int,
    rho: float,
    lam: float,
    eps_abs: float,
    eps_rel: float,
    round_timeout: float,
    abort: threading.Event,
) -> NodeOutcome:
    node = ConsensusNode(data, n_nodes, rho=rho, lam=lam)
    state = Consensus(n_nodes, node.dim, rho=rho, eps_abs=eps_abs, eps_rel=eps_rel)
    producer = Producer(producer_config(bootstrap))
    consumer = Consumer(consumer_config(bootstrap, f"admm-{run}-{node_id}"))
    consumer.assign([TopicPartition(topic, 0, start)])
    delivery = DeliveryCounter()
    pending: dict[int, dict[int, FloatArray]] = {}
    outcome = NodeOutcome(weights=state.z, history=[])
    try:
        for k in range(rounds):
            message = node.local_step(state.z)
            value, headers = encode_exchange(message, run, node_id, k)
            producer.produce(topic, value, f"{run}/{node_id}".encode(), headers=headers, on_delivery=delivery)
            if producer.flush(round_timeout) > 0:
                raise TimeoutError(f"node {node_id}: round {k} message not delivered in {round_timeout}s")
            delivery.raise_on_failure()
            deadline = time.monotonic() + round_timeout
            got = pending.setdefault(k, {})
            while len(got) < n_nodes:
                if abort.is_set():
                    raise RuntimeError(f"node {node_id}: aborted, another node failed")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"node {node_id}: round {k} has {sorted(got)} of {n_nodes} nodes")
                msg = consumer.poll(0.1)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(error)
                record = decode(msg)
                if record is None or record.run != run:
                    continue
                pending.setdefault(record.round, {})[record.node] = record.vector
            del pending[k]
            outcome.messages_per_round.append(len(got))
            verdict = state.update([got[j] for j in range(n_nodes)])
            node.dual_step(state.z)
            if verdict.converged:
                break
    except BaseException:
        abort.set()
        raise
    finally:
        consumer.close()
    outcome.weights = state.z.copy()
    outcome.history = list(state.history)
    return outcome


def run_kafka_consensus(
    bootstrap: str,
    topic: str,
    node_datasets: Sequence[NodeData],
    rounds: int = 200,
    *,
    rho: float = 1.0,
    lam: float = 1.0,
    eps_abs: float = 1e-4,
    eps_rel: float = 1e-3,
    round_timeout: float = 60.0,
    run_id: str | None = None,
) -> tuple[FloatArray, ConsensusHistory]:
    """Consensus ADMM with one node thread per dataset, rounds exchanged over ``topic``.

    Same arguments and result as `straggler.core.admm.fit_consensus` (plus where the broker is and
    how long a round may take); raises if any node fails or a round times out, and if the nodes
    disagree on the final weights (they cannot, unless a record was lost or altered)."""
    ensure_exchange_topic(bootstrap, topic)
    start = exchange_end(bootstrap, topic)
    run = run_id or uuid.uuid4().hex
    n = len(node_datasets)
    abort = threading.Event()
    outcomes: list[NodeOutcome | None] = [None] * n
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            outcomes[i] = _node_loop(
                bootstrap, topic, start, run, i, node_datasets[i], n, rounds,
                rho, lam, eps_abs, eps_rel, round_timeout, abort,
            )  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=target, args=(i,), name=f"admm-node-{i}", daemon=True) for i in range(n)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + round_timeout * (rounds + 1)
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        abort.set()
        raise TimeoutError(f"ADMM exchange on {topic!r} did not finish in time")
    if errors:
        raise errors[0]
    done = [o for o in outcomes if o is not None]
    first = done[0]
    for i, other in enumerate(done[1:], start=1):
        if not np.array_equal(other.weights, first.weights) or len(other.history) != len(first.history):
            raise RuntimeError(f"node {i} ended with other weights than node 0")
    history = ConsensusHistory(
        n,
        len(first.weights),
        [d.n for d in node_datasets],
        first.history,
        transport=f"kafka:{topic}",
        messages_per_round=first.messages_per_round,
    )
    return first.weights, history


def kafka_exchange(bootstrap: str, topic: str, *, round_timeout: float = 60.0) -> ConsensusExchange:
    """`run_kafka_consensus` bound to a broker and topic, for ``Admm.fit_population(exchange=...)``."""

    return partial(run_kafka_consensus, bootstrap, topic, round_timeout=round_timeout)
