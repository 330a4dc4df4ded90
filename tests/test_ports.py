"""The one-line error of a port a stage cannot listen on (`straggler.ports`), and the order in which
the metrics endpoints bind: the port first, said only once bound, before Kafka or Dask is contacted.
No broker: the bootstrap addresses here refuse connections."""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from test_reachability import unused_address

from straggler.metrics_export import process_registry, serve
from straggler.ports import PortUnavailable, check_port, listening_socket, unavailable


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 this test listens on for its whole length."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield holder.getsockname()[1]


def free_port() -> int:
    return int(unused_address().rpartition(":")[2])


def test_the_error_names_the_port_the_address_and_the_option() -> None:
    assert str(PortUnavailable("127.0.0.1", 9400, "--metrics-port")) == (
        "port 9400 on 127.0.0.1 is in use (--metrics-port); choose another or stop what holds it"
    )
    assert str(PortUnavailable("0.0.0.0", 80, "--port", errno.EACCES)) == (
        "port 80 on 0.0.0.0 may not be bound by this user (--port); choose one above 1023"
    )


def test_only_a_port_taken_or_not_allowed_becomes_the_one_line_error() -> None:
    taken = unavailable(OSError(errno.EADDRINUSE, "Address already in use"), "::1", 8080, "--port")
    assert taken is not None and (taken.host, taken.port, taken.option) == ("::1", 8080, "--port")
    assert unavailable(OSError(errno.EACCES, "Permission denied"), "h", 1, "--port") is not None
    assert unavailable(OSError(errno.EADDRNOTAVAIL, "Cannot assign"), "10.9.9.9", 1, "--port") is None


def test_a_port_held_is_refused_and_a_port_checked_is_left_free(held_port: int) -> None:
    with pytest.raises(PortUnavailable, match=f"^port {held_port} on 127.0.0.1 is in use \\(--port\\)"):
        check_port("127.0.0.1", held_port, "--port")
    with pytest.raises(PortUnavailable):
        listening_socket("127.0.0.1", held_port, "--port")
    port = free_port()
    check_port("127.0.0.1", port, "--metrics-port")
    with listening_socket("127.0.0.1", port, "--metrics-port") as listening:  # the check let it go
        assert listening.getsockname()[1] == port


def test_serve_says_where_only_once_bound(held_port: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="straggler.metrics_export")
    with pytest.raises(PortUnavailable, match=f"port {held_port} .*\\(--metrics-port\\)"):
        serve(process_registry(), held_port)
    assert not [r for r in caplog.records if "metrics on" in r.getMessage()]
    port = free_port()
    stop = serve(process_registry(), port)
    try:
        said = [r.getMessage() for r in caplog.records if r.name == "straggler.metrics_export"]
        assert said == [f"metrics on http://127.0.0.1:{port}/metrics"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"straggler_build_info" in response.read()
    finally:
        stop()


def _stopped_after(seconds: float) -> threading.Event:
    """An event set ``seconds`` from now: the bound of a run that would otherwise wait on."""
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.daemon = True
    timer.start()
    return stop


def test_the_mitigation_consumer_binds_its_port_before_it_waits_for_a_broker(held_port: int) -> None:
    from consumers.mitigation import MitigationConsumer

    consumer = MitigationConsumer(unused_address(), "speculate", metrics_port=held_port)
    started = time.monotonic()
    with pytest.raises(PortUnavailable, match=f"port {held_port} "):
        consumer.run(stop=_stopped_after(5.0))  # waiting for the broker first, it would return at 5 s
    assert time.monotonic() - started < 4.0


def test_the_dask_executor_binds_its_port_before_it_contacts_the_scheduler(held_port: int) -> None:
    from consumers.dask_executor import DaskExecutor

    executor = DaskExecutor(unused_address(), unused_address(), metrics_port=held_port)
    started = time.monotonic()
    with pytest.raises(PortUnavailable, match=f"port {held_port} "):
        executor.run(stop=_stopped_after(5.0))  # contacting the scheduler first: OSError (no scheduler)
    assert time.monotonic() - started < 4.0
