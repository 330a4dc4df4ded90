"""Every stage that listens, started on a port already taken (issue #42, item 3): one line on stderr
naming the port and the option that sets it, exit status 2, and nothing that says it serves there.

Each command runs as its own process (`harness.cli_process`) while this test holds a port it was just
given by the system, listening on 127.0.0.1. The bootstrap address refuses connections: a stage that
contacted Kafka before its port would give up on the broker instead (exit 1), after its
``--broker-timeout``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.cli_process import run_cli
from test_cli_commands import ROOT, TIMEOUT_S
from test_reachability import unused_address

COMMANDS = {
    "worker": (["worker"], "--metrics-port"),
    "mitigate": (["mitigate"], "--metrics-port"),
    "mitigate --no-watchdog": (["mitigate", "--no-watchdog"], "--metrics-port"),
    "dask-executor": (["dask-executor", "--scheduler", "127.0.0.1:9"], "--metrics-port"),
    "view": (["view"], "--port"),
    # the replay's worker serves at --metrics-port, its mitigator at the next: both checked first
    "replay": (["replay", "--format", "synthetic", "--jobs", "2", "--out", "OUT"], "--metrics-port"),
}
"""Each listening stage, and the option that sets its port."""


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 this test listens on for its whole length."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield holder.getsockname()[1]


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_a_stage_on_a_port_in_use_says_so_in_one_line_naming_the_port_and_its_option(
    case: str, held_port: int, tmp_path: Path
) -> None:
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in COMMANDS[case][0]]
    option = COMMANDS[case][1]
    result = run_cli(
        [*argv, "--bootstrap", unused_address(), "--broker-timeout", "3", option, str(held_port)],
        ROOT,
        TIMEOUT_S,
    )
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2, said
    assert said == [
        f"error: port {held_port} on 127.0.0.1 is in use ({option}); choose another or stop what holds it"
    ]
    assert result.stdout == ""
    assert not (tmp_path / "out").exists()
