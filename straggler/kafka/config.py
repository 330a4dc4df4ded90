"""Client configurations, one function per role, so every producer and consumer agrees on semantics.

Why here: delivery guarantees (acks, idempotence, read_committed, manual commits) are decided once,
not re-typed with drift in each producer and consumer of the pipeline.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, Message

ClientConfig = dict[str, str | int | float | bool]


def producer_config(bootstrap: str, *, transactional_id: str | None = None) -> ClientConfig:
    """An idempotent producer: no duplicates or reordering per partition on retries.

    The partitioner is murmur2, as in Java clients and aiokafka (Faust): a job id then maps to the
    same partition number on every topic, whoever writes it, which keeps the topics co-partitioned.
    """
    config: ClientConfig = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "compression.type": "lz4",
        "partitioner": "murmur2_random",
    }
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    return config


def consumer_config(bootstrap: str, group_id: str, *, read_committed: bool = True) -> ClientConfig:
    """A consumer that commits only what it has processed and, by default, skips aborted transactions."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
    }


def admin_config(bootstrap: str) -> ClientConfig:
    return {"bootstrap.servers": bootstrap}


class DeliveryError(RuntimeError):
    """One or more produced records were not delivered."""

    def __init__(self, errors: list[KafkaError]) -> None:
        super().__init__(f"{len(errors)} deliveries failed; first: {errors[0]}")
        self.errors = errors


class DeliveryCounter:
    """A producer delivery callback that counts outcomes and keeps every error for the caller.

    Why: a delivery failure reported only to the callback is otherwise lost; here the caller checks
    ``failed``/``errors`` or calls ``raise_on_failure()`` after ``flush()``.
    """

    def __init__(self) -> None:
        self.delivered = 0
        self.failed = 0
        self.errors: list[KafkaError] = []

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.delivered += 1
        else:
            self.failed += 1
            self.errors.append(error)

    def raise_on_failure(self) -> None:
        """Raise ``DeliveryError`` (carrying every error) if any delivery failed."""
        if self.errors:
            raise DeliveryError(self.errors)
