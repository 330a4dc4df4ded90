"""`straggler.kafka.reachability` without a broker: librdkafka's error texts make the few words of
`BrokerUnreachable`'s line, the quiet logger lets a repeated connection failure through once, and
`wait_for_broker` gives up on a port nothing listens on within its bound, silently."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from straggler.kafka.reachability import (
    DEFAULT_BROKER_TIMEOUT_S,
    BrokerUnreachable,
    RepeatFilter,
    failure_cause,
    repeat_key,
    wait_for_broker,
)

REFUSED = (
    "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
    "(after 0ms in state CONNECT)"
)
UNRESOLVED = (
    "nohost.invalid:9092/bootstrap: Failed to resolve 'nohost.invalid:9092': Name or service not known "
    "(after 3ms in state CONNECT)"
)
NOT_KAFKA = (
    "10.0.0.1:80/bootstrap: Receive failed: Invalid response size 1213486160 (0..100000000): increase "
    "receive.message.max.bytes (after 0ms in state APIVERSION_QUERY)"
)
FAIL_LINE = "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:1/bootstrap]: " + REFUSED


def unused_address() -> str:
    """``127.0.0.1:PORT`` where nothing listens: a port the system just handed out and took back,
    checked to refuse a connection."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("errors", "cause"),
    [
        ([REFUSED], "connection refused"),
        ([UNRESOLVED], "host not found"),
        ([NOT_KAFKA], "something that is not a Kafka broker answers there"),
        (
            [
                REFUSED,
                "b:9/bootstrap: Connection setup timed out in state CONNECT (after 30029ms in state CONNECT)",
            ],
            "connection timed out",
        ),
        (
            ["b:9/bootstrap: SSL handshake failed: oddity (after 5ms in state SSL_HANDSHAKE)"],
            "SSL handshake failed: oddity",
        ),
        ([], "no answer"),
    ],
)
def test_the_cause_is_the_last_error_in_a_few_words(errors: list[str], cause: str) -> None:
    assert failure_cause(errors) == cause


def test_the_line_names_the_address_the_cause_and_the_wait() -> None:
    line = str(BrokerUnreachable("127.0.0.1:1", "connection refused", 15.0))
    assert line == (
        "no Kafka broker answers at 127.0.0.1:1 (connection refused) after 15 s; "
        "is it running? (straggler broker start)"
    )
    assert "\n" not in line


def test_a_connection_failure_is_let_through_once_per_period_other_lines_always() -> None:
    now = [0.0]
    quiet = RepeatFilter(repeat_seconds=60.0, clock=lambda: now[0])

    def passes(line: str) -> bool:
        return quiet.filter(logging.LogRecord("k", logging.ERROR, __file__, 1, "%s", (line,), None))

    again = FAIL_LINE.replace("after 0ms", "after 2ms").replace("producer-1", "consumer-2")
    again = again.replace("CONNECT)", "CONNECT, 584 identical error(s) suppressed)")
    assert repeat_key(FAIL_LINE) == repeat_key(again) is not None
    assert passes(FAIL_LINE)
    assert not passes(again), "the same failure, another client, another timing: dropped"
    assert passes(FAIL_LINE.replace("127.0.0.1:1", "127.0.0.1:2")), "another broker: its own line"
    assert passes("COMMITFAIL [rdkafka#consumer-1] [thrd:main]: something else")
    assert passes("COMMITFAIL [rdkafka#consumer-1] [thrd:main]: something else")
    now[0] = 61.0
    assert passes(again), "after the period, once more"


def test_waiting_gives_up_within_its_bound_silently_naming_the_address(
    capfd: pytest.CaptureFixture[str],
) -> None:
    address = unused_address()
    told: list[str] = []
    started = time.monotonic()
    with pytest.raises(BrokerUnreachable) as raised:
        wait_for_broker(address, 1.5, on_wait=told.append)
    assert 1.5 <= time.monotonic() - started < 5.0
    assert raised.value.address == address and raised.value.cause == "connection refused"
    assert address in str(raised.value)
    assert told == ["connection refused"], "told once"
    out, err = capfd.readouterr()
    assert out == err == "", "librdkafka said nothing"


def test_waiting_without_a_bound_ends_when_stopped() -> None:
    stop = threading.Event()
    beats: list[float] = []
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    assert (
        wait_for_broker(unused_address(), None, stop=stop, beat=lambda: beats.append(time.monotonic()))
        is False
    )
    assert time.monotonic() - started < 3.0
    assert len(beats) >= 2, "a heartbeat at every request"


def test_the_default_bound_is_15_seconds_and_a_bad_one_is_refused() -> None:
    from straggler.cli import build_parser

    parser = build_parser()
    assert DEFAULT_BROKER_TIMEOUT_S == 10.0
    for command in (["worker", "--bootstrap", "h:1"], ["topics", "create"], ["view", "--bootstrap", "h:1"]):
        assert parser.parse_args(command).broker_timeout == 10.0
    assert parser.parse_args(["mitigate", "--bootstrap", "h:1"]).broker_timeout is None, "it waits"
    assert (
        parser.parse_args(["worker", "--bootstrap", "h:1", "--broker-timeout", "2.5"]).broker_timeout == 2.5
    )
