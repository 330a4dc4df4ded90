"""Client configurations, one function per role, so every producer and consumer agrees on semantics.

Why here: delivery guarantees (acks, idempotence, read_committed, manual commits) are decided once,
not re-typed with drift in each producer and consumer of the pipeline. The same goes for security:
each config carries the process's TLS/SASL settings (`straggler.kafka.security`), none by default.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.admin import AdminClient

from straggler.kafka.security import SecuritySettings, current_security, librdkafka_config
from straggler.kafka.tls_errors import handshake_failure

ClientConfig = dict[str, str | int | float | bool]
ACCESS_POLL_S = 1.0
"""How often ``check_access`` looks at librdkafka's errors while it waits for the metadata."""


def _connection(bootstrap: str, security: SecuritySettings | None) -> ClientConfig:
    """Where and how to connect: the bootstrap servers and the security keys (``security``, else the
    process's settings from the environment / ``KAFKA_CONFIG_FILE``)."""
    return {"bootstrap.servers": bootstrap, **librdkafka_config(security or current_security())}


def producer_config(
    bootstrap: str, *, transactional_id: str | None = None, security: SecuritySettings | None = None
) -> ClientConfig:
    """An idempotent producer: no duplicates or reordering per partition on retries.

    The partitioner is murmur2, as in Java clients and aiokafka (Faust): a job id then maps to the
    same partition number on every topic, whoever writes it, which keeps the topics co-partitioned.
    """
    config: ClientConfig = {
        **_connection(bootstrap, security),
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "compression.type": "lz4",
        "partitioner": "murmur2_random",
    }
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    return config


def consumer_config(
    bootstrap: str,
    group_id: str,
    *,
    read_committed: bool = True,
    security: SecuritySettings | None = None,
) -> ClientConfig:
    """A consumer that commits only what it has processed and, by default, skips aborted transactions."""
    return {
        **_connection(bootstrap, security),
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
    }


def admin_config(bootstrap: str, *, security: SecuritySettings | None = None) -> ClientConfig:
    return _connection(bootstrap, security)


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


class KafkaAccessError(RuntimeError):
    """The brokers could not be reached or refused this client's credentials."""


class TlsHandshakeError(KafkaAccessError):
    """A TLS handshake with a broker failed; the message names its address and the cause
    (`straggler.kafka.tls_errors`)."""


def access_error_message(bootstrap: str, security: SecuritySettings, errors: list[KafkaError]) -> str:
    """Why a client could not use the cluster, naming the cause a user can fix."""
    who = f"as {security.username!r} ({security.sasl_mechanism})" if security.uses_sasl else "without SASL"
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    if auth:
        return f"the brokers at {bootstrap} refused the credentials {who}: {auth[0].str()}"
    return (
        f"no answer from the brokers at {bootstrap} over {security.security_protocol} {who}: they are down, "
        "or they expect other security settings (KAFKA_SECURITY_PROTOCOL and the rest, see README, "
        f"'Secured clusters'){'; last error: ' + errors[-1].str() if errors else ''}"
    )


def check_access(bootstrap: str, *, security: SecuritySettings | None = None, timeout: float = 10.0) -> None:
    """Fetch the cluster's metadata once, raising ``KafkaAccessError`` within ``timeout`` seconds.

    Why: a client with missing or wrong credentials otherwise retries forever in librdkafka (or
    fails much later with "transport failure"); the commands call this first to say why, at once.
    A failed TLS handshake ends the wait as soon as librdkafka reports it (``TlsHandshakeError``).
    """
    settings = security or current_security()
    errors: list[KafkaError] = []
    config: dict[str, Any] = {**admin_config(bootstrap, security=settings), "log_level": 2}
    config["error_cb"] = errors.append
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=max(0.1, min(ACCESS_POLL_S, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            admin.poll(0.2)  # serves error_cb: the authentication or TLS error, if that was the cause
            tls_failure = handshake_failure(errors, bootstrap, settings)
            if tls_failure is not None:
                raise TlsHandshakeError(tls_failure) from exc
            if time.monotonic() >= deadline:
                raise KafkaAccessError(access_error_message(bootstrap, settings, errors)) from exc
