"""Producing one record without losing it to a full local queue.

confluent-kafka raises `BufferError` when its local queue is full instead of waiting; every producer of
the project then serves deliveries for a moment (which empties the queue) and tries again.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError, Message, Producer

DeliveryCallback = Callable[[KafkaError | None, Message], None]

DRAIN_SECONDS = 0.1
"""How long to serve deliveries before trying a refused record again."""


def produce_with_backpressure(
    producer: Producer,
    topic: str,
    value: bytes | None,
    key: bytes | None = None,
    on_delivery: DeliveryCallback | None = None,
) -> None:
    """``producer.produce(topic, value, key)``, retried after `DRAIN_SECONDS` of deliveries for as
    long as the local queue is full (the record is then queued, never dropped)."""
    while True:
        try:
            if on_delivery is None:
                producer.produce(topic, value, key)
            else:
                producer.produce(topic, value, key, on_delivery=on_delivery)
            return
        except BufferError:  # local queue full: let deliveries drain it, then retry
            producer.poll(DRAIN_SECONDS)
