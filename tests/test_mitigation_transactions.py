"""The mitigation consumer's transaction handling against fake Kafka clients (no broker).

What `MitigationConsumer._transact` promises: a retriable failure of ``send_offsets_to_transaction`` or
``commit_transaction`` is retried (`TXN_RETRIES` times); an abortable failure, or retries spent, aborts
the transaction and rewinds the consumer to the committed offsets with the state rebuilt as of them;
a fatal failure (fenced by a newer instance) or any other error aborts quietly and is raised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers import mitigation
from consumers.fold import MitigationState
from consumers.mitigation import TXN_RETRIES, MitigationConsumer, _retrying
from straggler.kafka.names import TopicNames

TOPICS = TopicNames()


def retriable(code: int = KafkaError._TIMED_OUT) -> KafkaException:
    return KafkaException(KafkaError(code, "injected: retriable", retriable=True))


def abortable() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._STATE, "injected: abortable", txn_requires_abort=True))


def fenced(code: int) -> KafkaException:
    return KafkaException(KafkaError(code, "injected: fenced", fatal=True))


@dataclass
class FakeMessage:
    """A consumed record: undecodable bytes on the predictions topic (so it makes one dead letter)."""

    offset_: int
    partition_: int = 0

    def value(self) -> bytes:
        return b"not json"

    def key(self) -> bytes:
        return b"job-1"

    def topic(self) -> str:
        return TOPICS.predictions

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def error(self) -> None:
        return None


@dataclass
class FakeProducer:
    """Records every transactional call; ``failures[call]`` lists what its next calls raise, in order."""

    failures: dict[str, list[BaseException]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    produced: list[tuple[str, bytes | None]] = field(default_factory=list)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        pending = self.failures.get(name)
        if pending:
            raise pending.pop(0)

    def begin_transaction(self) -> None:
        self._call("begin")

    def produce(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self._call("produce")
        self.produced.append((topic, key))

    def send_offsets_to_transaction(self, positions: Any, metadata: Any, timeout: float) -> None:
        self._call("send_offsets")

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._call("commit")

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._call("abort")

    def count(self, name: str) -> int:
        return self.calls.count(name)


@dataclass
class FakeConsumer:
    """An assignment of one predictions partition whose committed offset is ``committed_at``."""

    committed_at: int = 4
    seeks: list[TopicPartition] = field(default_factory=list)

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPICS.predictions, 0)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 10) for tp in partitions]

    def consumer_group_metadata(self) -> object:
        return object()

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.committed_at) for tp in partitions]

    def seek(self, partition: TopicPartition) -> None:
        self.seeks.append(partition)

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        """Metadata of an input topic of one partition (the rebuild asks how its jobs are placed)."""
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None})})


class Consumer(MitigationConsumer):
    """The real consumer, whose rebuild (a reader of the committed input) is recorded instead of run."""

    def __init__(self) -> None:
        super().__init__("unused:9092", "unlimited", topics=TOPICS, batch_size=10)
        self.beats = 0
        self.heartbeat = self._count_beat
        self.folded_to: list[dict[tuple[str, int], int]] = []

    def _count_beat(self) -> None:
        self.beats += 1

    def _fold_committed(self, state: MitigationState, targets: dict[tuple[str, int], int]) -> int:
        self.folded_to.append(dict(targets))
        return 0


def transact(producer: FakeProducer, consumer: FakeConsumer | None = None) -> Consumer:
    """One batch of three records through `_transact`, with the fakes."""
    live = Consumer()
    records = [FakeMessage(offset) for offset in (7, 8, 9)]
    live._transact(consumer or FakeConsumer(), producer, records)  # type: ignore[arg-type]
    return live


def test_a_clean_batch_sends_its_offsets_then_commits() -> None:
    producer = FakeProducer()
    live = transact(producer)
    assert producer.calls == ["begin", *["produce"] * 3, "send_offsets", "commit"]
    assert {topic for topic, _ in producer.produced} == {TOPICS.dead_letters}
    assert (live._stats.transactions, live._stats.consumed, live._stats.dead_letters) == (1, 3, 3)
    assert live._stats.aborts == 0


@pytest.mark.parametrize("call", ["send_offsets", "commit"])
def test_a_retriable_failure_is_retried_and_the_batch_commits(call: str) -> None:
    """E.g. a commit that times out after the offsets were sent: retried, not aborted, committed once."""
    producer = FakeProducer(failures={call: [retriable(), retriable()]})
    consumer = FakeConsumer()
    live = transact(producer, consumer)
    assert producer.count(call) == 3
    assert producer.count("send_offsets") + producer.count("commit") == 4  # the other call ran once
    assert producer.count("abort") == 0 and consumer.seeks == []
    assert (live._stats.transactions, live._stats.consumed, live._stats.aborts) == (1, 3, 0)


def test_a_commit_that_requires_abort_after_the_offsets_were_sent_aborts_and_rewinds() -> None:
    producer = FakeProducer(failures={"commit": [abortable()]})
    consumer = FakeConsumer(committed_at=4)
    live = transact(producer, consumer)
    assert producer.calls[-3:] == ["send_offsets", "commit", "abort"]
    assert live._stats.aborts == 1
    assert (live._stats.transactions, live._stats.consumed, live._stats.dead_letters) == (0, 0, 0)
    # back to the committed offsets, with the state rebuilt as of them (the batch's effects gone)
    assert [(tp.topic, tp.partition, tp.offset) for tp in consumer.seeks] == [(TOPICS.predictions, 0, 4)]
    assert live.folded_to == [{(TOPICS.predictions, 0): 4}]
    assert live._state.dead_letters == 0


def test_retries_spent_abort_the_batch_and_rewind() -> None:
    """A commit that keeps timing out: TXN_RETRIES retries, then an abort and a rewind, no exception."""
    producer = FakeProducer(failures={"commit": [retriable() for _ in range(TXN_RETRIES + 1)]})
    consumer = FakeConsumer()
    live = transact(producer, consumer)
    assert producer.count("commit") == TXN_RETRIES + 1
    assert producer.count("abort") == 1
    assert live._stats.aborts == 1 and live._stats.transactions == 0
    assert len(consumer.seeks) == 1


def test_an_abort_that_times_out_is_retried_too() -> None:
    producer = FakeProducer(failures={"commit": [abortable()], "abort": [retriable()]})
    live = transact(producer)
    assert producer.count("abort") == 2
    assert live._stats.aborts == 1


@pytest.mark.parametrize("code", [KafkaError._FENCED, KafkaError.PRODUCER_FENCED])
@pytest.mark.parametrize("call", ["send_offsets", "commit"])
def test_a_fenced_instance_aborts_quietly_and_raises(call: str, code: int) -> None:
    """Fenced by a newer instance with the same transactional id: no retry, no rewind, the error raised
    (even when the courtesy abort fails as well)."""
    producer = FakeProducer(failures={call: [fenced(code)], "abort": [fenced(code)]})
    consumer = FakeConsumer()
    with pytest.raises(KafkaException) as raised:
        transact(producer, consumer)
    assert raised.value.args[0].code() == code
    assert producer.count(call) == 1
    assert producer.count("abort") == 1
    assert consumer.seeks == []


def test_an_error_outside_kafka_aborts_quietly_and_is_raised() -> None:
    producer = FakeProducer(failures={"produce": [RuntimeError("boom")]})
    consumer = FakeConsumer()
    with pytest.raises(RuntimeError, match="boom"):
        transact(producer, consumer)
    assert producer.calls == ["begin", "produce", "abort"]
    assert consumer.seeks == []


def test_a_non_retriable_non_abortable_kafka_error_is_raised_after_an_abort() -> None:
    error = KafkaException(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "injected: plain"))
    producer = FakeProducer(failures={"commit": [error]})
    with pytest.raises(KafkaException):
        transact(producer)
    assert producer.count("commit") == 1 and producer.count("abort") == 1


# ---------------------------------------------------------------- _retrying on its own


def failing(errors: list[BaseException]) -> tuple[Callable[[], None], list[int]]:
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        if errors:
            raise errors.pop(0)

    return call, calls


def test_retrying_beats_at_every_attempt_and_stops_at_the_first_success() -> None:
    call, calls = failing([retriable(), retriable()])
    beats: list[int] = []
    _retrying(call, lambda: beats.append(1))
    assert len(calls) == 3 and len(beats) == 3


def test_retrying_gives_up_after_txn_retries_with_the_last_error() -> None:
    call, calls = failing([retriable() for _ in range(TXN_RETRIES + 2)])
    with pytest.raises(KafkaException):
        _retrying(call)
    assert len(calls) == TXN_RETRIES + 1


def test_retrying_does_not_retry_what_requires_an_abort_even_if_retriable() -> None:
    both = KafkaException(KafkaError(KafkaError._STATE, "x", retriable=True, txn_requires_abort=True))
    call, calls = failing([both])
    with pytest.raises(KafkaException):
        _retrying(call)
    assert len(calls) == 1


def test_abort_quietly_swallows_a_failed_abort() -> None:
    producer = FakeProducer(failures={"abort": [fenced(KafkaError._FENCED)]})
    mitigation._abort_quietly(producer)  # type: ignore[arg-type]
    assert producer.calls == ["abort"]
