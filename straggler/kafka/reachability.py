"""Whether a Kafka broker answers at a bootstrap address, and one line that says so when none does.

Why: a librdkafka client pointed at an address where no broker answers retries for ever, logging
every failed connect (hundreds of lines a minute), and fails, if at all, much later with a generic
"transport failure". So every command first waits here, a bounded time (``--broker-timeout``, 10 s
by default), for one metadata answer, quietly, and ends with `BrokerUnreachable`'s one line, which
names the address and the cause. The mitigator, meant to wait for its broker, waits here without a
bound and says so once (README, "When the broker cannot be reached").

The pure parts: `failure_cause` (librdkafka's error texts -> a few words) and `RepeatFilter` (drops
a connection failure that was logged a moment ago), which `quiet_librdkafka_logger` puts on the
logger long-running clients hand librdkafka.
"""

from __future__ import annotations

import argparse
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from straggler.argtypes import positive_float
from straggler.kafka.config import admin_config

DEFAULT_BROKER_TIMEOUT_S = 10.0
"""How long a command waits for a broker before it gives up: with the interpreter's start, a command
that cannot reach its broker ends within 15 s."""
PROBE_INTERVAL_S = 0.5
"""Longest one metadata request waits: a stop, a heartbeat and the deadline are seen this often."""
SILENT = 0
"""librdkafka's ``log_level`` of the probe: nothing below emergency (its errors go to ``error_cb``)."""
REPEAT_SECONDS = 300.0
"""How long `RepeatFilter` keeps quiet about a connection failure it has let through."""

CAUSES = (
    ("connection refused", "connection refused"),
    ("failed to resolve", "host not found"),
    ("timed out", "connection timed out"),
    ("invalid response size", "something that is not a Kafka broker answers there"),
    ("no route to host", "no route to host"),
    ("network is unreachable", "network unreachable"),
    ("connection reset", "connection reset"),
)
"""Text of a librdkafka connection error (lower case) -> what `BrokerUnreachable` calls its cause."""
_ORIGIN = re.compile(r"^\S+/(?:bootstrap|\d+): ")
"""librdkafka's prefix of a broker's error (``host:port/bootstrap: ``)."""
_WHEN = re.compile(r" \(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)")
"""librdkafka's suffix saying when in the connection the error came, and how many repeats it left out
(it logs a repeated error at most every 30 s); it differs at every attempt."""
LIBRDKAFKA_LOGGER = "straggler.kafka.librdkafka"
"""The Python logger librdkafka's lines go through in the clients given `quiet_librdkafka_logger`."""
CONNECTION_FACILITIES = ("FAIL", "ERROR")
"""librdkafka's log facilities of a failed connection (``ERROR``: the error, when no ``error_cb``)."""


class BrokerUnreachable(RuntimeError):
    """No broker answered at ``address`` within ``seconds``; ``cause`` says why, in a few words."""

    def __init__(self, address: str, cause: str, seconds: float) -> None:
        super().__init__(
            f"no Kafka broker answers at {address} ({cause}) after {seconds:g} s; "
            "is it running? (straggler broker start)"
        )
        self.address = address
        self.cause = cause
        self.seconds = seconds


class TopicsMissing(BrokerUnreachable):
    """The broker at ``address`` answers, but lacks ``topics``: records for them are never delivered.
    A `BrokerUnreachable`, so that code that stops sending on one stops on this too."""

    def __init__(self, address: str, topics: Sequence[str], create_command: str, seconds: float) -> None:
        RuntimeError.__init__(
            self,
            f"topic(s) {', '.join(topics)} missing on the broker at {address}, so nothing was delivered "
            f"in {seconds:g} s; create them with `{create_command}`",
        )
        self.address = address
        self.cause = "topics missing"
        self.seconds = seconds
        self.topics = list(topics)


def failure_cause(errors: Sequence[str]) -> str:
    """What the last of librdkafka's connection errors says, in a few words: the cause it names
    (`CAUSES`), else its own text without the broker and the timing, else "no answer"."""
    for error in reversed(errors):
        lowered = error.lower()
        for text, cause in CAUSES:
            if text in lowered:
                return cause
    return bare_error(errors[-1]) if errors else "no answer"


def bare_error(error: str) -> str:
    """A librdkafka error without its broker prefix and its timing suffix."""
    return _WHEN.sub("", _ORIGIN.sub("", error)).strip()


def wait_for_broker(
    bootstrap: str,
    timeout: float | None = DEFAULT_BROKER_TIMEOUT_S,
    *,
    stop: threading.Event | None = None,
    beat: Callable[[], None] | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> bool:
    """Return True once a broker at ``bootstrap`` answers a metadata request (at once when one
    runs); raise `BrokerUnreachable` when none has within ``timeout`` seconds. ``timeout`` None waits
    until one answers or ``stop`` is set (then it returns False, within `PROBE_INTERVAL_S`).

    Silent: librdkafka's errors are collected, not logged. ``on_wait`` is told the cause once, when
    the first request fails; ``beat`` is called at every request (a watchdog's heartbeat).
    """
    errors: deque[str] = deque(maxlen=20)

    def collect(error: KafkaError) -> None:
        if error.code() != KafkaError._ALL_BROKERS_DOWN:  # "1/1 brokers are down" names no cause
            errors.append(error.str())

    config: dict[str, Any] = {**admin_config(bootstrap), "log_level": SILENT, "error_cb": collect}
    admin = AdminClient(config)
    deadline = None if timeout is None else time.monotonic() + timeout
    told = False
    while stop is None or not stop.is_set():
        if beat is not None:
            beat()
        wait = PROBE_INTERVAL_S if deadline is None else min(PROBE_INTERVAL_S, deadline - time.monotonic())
        try:
            admin.list_topics(timeout=max(wait, 0.1))
            return True
        except KafkaException:
            admin.poll(0)  # serves error_cb: the causes
        if on_wait is not None and not told:
            on_wait(failure_cause(errors))
            told = True
        if deadline is not None and time.monotonic() >= deadline:
            assert timeout is not None
            raise BrokerUnreachable(bootstrap, failure_cause(errors), timeout)
    return False


def add_broker_timeout_argument(parser: argparse.ArgumentParser, *, waits: bool = False) -> None:
    """``--broker-timeout SECONDS``: how long the command waits for a broker before it gives up
    (``waits``: a command that waits for one without a bound unless told)."""
    if waits:
        parser.add_argument(
            "--broker-timeout",
            type=positive_float,
            default=None,
            metavar="SECONDS",
            help="give up when no broker has answered within SECONDS (default: wait for one, quietly)",
        )
        return
    parser.add_argument(
        "--broker-timeout",
        type=positive_float,
        default=DEFAULT_BROKER_TIMEOUT_S,
        metavar="SECONDS",
        help="give up, with one line naming the address, when no broker has answered within SECONDS",
    )


class RepeatFilter(logging.Filter):
    """Lets a connection failure of librdkafka through once per `REPEAT_SECONDS` (per broker and
    error text, its timing left out); every other line through always. A broker that is down then
    costs a line every few minutes instead of several a second."""

    def __init__(self, repeat_seconds: float = REPEAT_SECONDS, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.repeat_seconds = repeat_seconds
        self.clock = clock
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = repeat_key(record.getMessage())
        if key is None:
            return True
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.repeat_seconds:
            return False
        self._last[key] = now
        return True


def repeat_key(line: str) -> str | None:
    """What two lines of one connection failure have in common (None: not a connection failure).

    ``line`` is as confluent-kafka hands it to a Python logger: ``FACILITY [client] message``."""
    facility, _, rest = line.partition(" ")
    if facility not in CONNECTION_FACILITIES:
        return None
    message = rest.split("] ", 1)[-1]  # without the client's name: every client's failure is one
    message = re.sub(r"^\[thrd:[^\]]*\]: ", "", message)
    return f"{facility} {_WHEN.sub('', message)}"


def quiet_librdkafka_logger(name: str = LIBRDKAFKA_LOGGER) -> logging.Logger:
    """The logger to hand librdkafka (a client config's ``logger``) in a long-running client: its
    lines go through Python's logging, each connection failure once per `REPEAT_SECONDS`.

    librdkafka hands its lines over when the client is polled (consume, poll, flush)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RepeatFilter) for f in logger.filters):
        logger.addFilter(RepeatFilter())
    return logger
