"""A port a stage cannot listen on, said in one line that names the port and the option that sets it.

The stages that listen (the worker's, the mitigator's and the Dask executor's metrics endpoints, the
live view) bind their port before they contact Kafka: a port already taken then ends the command at
once, ``error: ...`` and exit status 2 (`straggler.cli.main`), before anything said it serves there
and whether or not a broker answers.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

REASONS = {
    errno.EADDRINUSE: ("is in use", "choose another or stop what holds it"),
    errno.EACCES: ("may not be bound by this user", "choose one above 1023"),
}
"""The bind errors that mean "this port, here, is not to be had", with what to do about each."""


class PortUnavailable(Exception):
    """Binding ``host:port`` failed for a reason the user fixes with ``option`` (see `REASONS`)."""

    def __init__(self, host: str, port: int, option: str, code: int = errno.EADDRINUSE) -> None:
        super().__init__(host, port, option, code)
        self.host, self.port, self.option, self.code = host, port, option, code

    def __str__(self) -> str:
        reason, remedy = REASONS.get(self.code, REASONS[errno.EADDRINUSE])
        return f"port {self.port} on {self.host} {reason} ({self.option}); {remedy}"


def unavailable(error: OSError, host: str, port: int, option: str) -> PortUnavailable | None:
    """The one-line error for ``error``, raised by binding ``host:port``; None when the cause is
    another one (an unknown host, say), which is left to its own message."""
    if error.errno in REASONS:
        return PortUnavailable(host, port, option, error.errno)
    return None


@contextmanager
def binding(host: str, port: int, option: str) -> Iterator[None]:
    """Around a bind of ``host:port``: an `OSError` that means the port is not to be had leaves it
    as `PortUnavailable` (any other as it was)."""
    try:
        yield
    except OSError as error:
        refusal = unavailable(error, host, port, option)
        if refusal is None:
            raise
        raise refusal from error


def listening_socket(host: str, port: int, option: str) -> socket.socket:
    """A socket listening on ``host:port``, bound as the HTTP servers bind (``SO_REUSEADDR``: the
    connections of a previous run, closing, do not hold the port); raises `PortUnavailable`."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    with binding(host, port, option):
        return socket.create_server((host, port), family=family)


def check_port(host: str, port: int, option: str) -> None:
    """Raise `PortUnavailable` unless ``host:port`` can be listened on now. The port is let go at
    once: a stage checks it before Kafka and binds it for good once it has what it serves there (a
    bind that then loses a race raises the same error)."""
    listening_socket(host, port, option).close()
