"""`straggler.kafka.offsets`: end offsets asked again while a new topic elects its leaders, and only then."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from straggler.kafka.offsets import end_offset, end_offsets


class _RefusingConsumer:
    """Refuses watermark lookups with ``codes`` in turn, then answers."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)

    def get_watermark_offsets(
        self, partition: object, timeout: float, cached: bool = False
    ) -> tuple[int, int]:
        if self.codes:
            raise KafkaException(KafkaError(self.codes.pop(0)))
        return 0, 5


def test_a_watermark_refused_while_a_new_topic_elects_its_leader_is_asked_again() -> None:
    partition = TopicPartition("t", 0)
    refusing = _RefusingConsumer(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
    assert end_offset(refusing, partition, timeout=5.0) == 5  # type: ignore[arg-type]
    with pytest.raises(KafkaException):
        end_offset(_RefusingConsumer(KafkaError.TOPIC_AUTHORIZATION_FAILED), partition, timeout=5.0)  # type: ignore[arg-type]
    with pytest.raises(KafkaException):  # bounded: a leader that never comes is an error
        end_offset(_RefusingConsumer(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 100), partition, timeout=0.3)  # type: ignore[arg-type]


class _NoBatchAnswer(_RefusingConsumer):
    """Fails the one-request lookup of every partition, so each is asked alone."""

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))


class _BatchAnswer(_RefusingConsumer):
    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 7 + tp.partition) for tp in partitions]


def test_end_offsets_come_from_one_request_and_a_partition_without_an_answer_is_asked_alone() -> None:
    assert end_offsets(_BatchAnswer(), "t", [0, 1], timeout=5.0) == {0: 7, 1: 8}  # type: ignore[arg-type]
    asked_alone = _NoBatchAnswer(KafkaError.LEADER_NOT_AVAILABLE)
    assert end_offsets(asked_alone, "t", [0, 1], timeout=5.0) == {0: 5, 1: 5}  # type: ignore[arg-type]
    assert asked_alone.codes == []  # the refusal was asked again


def test_the_admm_exchange_asks_its_new_topics_end_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """`straggler.kafka.admm_exchange` reads the end of a topic it has just created: it must wait out the
    election too (it once asked once, and failed with NOT_LEADER_FOR_PARTITION under load)."""
    import straggler.kafka.admm_exchange as exchange

    class Refusing(_RefusingConsumer):
        def __init__(self, config: object) -> None:
            super().__init__(KafkaError.NOT_LEADER_FOR_PARTITION)

        def close(self) -> None:
            pass

    monkeypatch.setattr(exchange, "Consumer", Refusing)
    assert exchange.exchange_end("127.0.0.1:1", "t-exchange") == 5
