"""Every component pointed at an address where no broker answers (issue #41, item 4): the commands
give up within ``--broker-timeout`` with one line naming the address, and print few lines in all;
the mitigator, meant to wait for its broker, says so once and stops within 10 s of SIGTERM; the SDK
raises at the call that could not deliver.

Each command runs as its own process (`harness.cli_process`; the mitigator's SIGTERM case as
``python -m straggler.cli``) against a port that refuses connections, found at test time
(`test_reachability.unused_address`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.cli_process import run_cli
from test_cli_commands import ROOT, TIMEOUT_S
from test_reachability import unused_address

from producers.telemetry import TelemetryProducer
from straggler.kafka.reachability import BrokerUnreachable

BOUND_S = 3.0
"""The ``--broker-timeout`` the commands get here."""
STARTUP_S = 10.0
"""What a command may take beyond its bound: Python, its imports, a spawned child (a busy machine)."""
MOST_LINES = 3
"""Lines a command may print in all: a start-up line of its own, the error, one more at most."""

COMMANDS = {
    "worker": ["worker"],
    "mitigate --broker-timeout": ["mitigate"],
    "dask-executor": ["dask-executor", "--scheduler", "127.0.0.1:9"],  # the broker is waited for first
    "topics create": ["topics", "create"],
    "view": ["view", "--port", "PORT"],
    "produce": ["produce", "--format", "synthetic", "--jobs", "2", "--quiet"],
    "replay --bootstrap": ["replay", "--format", "synthetic", "--jobs", "2", "--out", "OUT"],
    "smoke --bootstrap": ["smoke"],
    "train --bootstrap": [
        "train",
        "--format",
        "synthetic",
        "--jobs",
        "2",
        "--method",
        "admm",
        "--out",
        "OUT",
    ],
}


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_a_command_gives_up_within_its_bound_in_one_line_naming_the_address(
    case: str, tmp_path: Path
) -> None:
    address = unused_address()
    free_port = unused_address().rpartition(":")[2]
    argv = [{"PORT": free_port, "OUT": str(tmp_path / "out")}.get(a, a) for a in COMMANDS[case]]
    started = time.monotonic()
    result = run_cli([*argv, "--bootstrap", address, "--broker-timeout", str(BOUND_S)], ROOT, TIMEOUT_S)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert BOUND_S <= elapsed < BOUND_S + STARTUP_S, elapsed
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [
        f"error: no Kafka broker answers at {address} (connection refused) after {BOUND_S:g} s; "
        "is it running? (straggler broker start)"
    ], result.stderr
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) <= MOST_LINES, result.stdout + result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("watchdog", [True, False], ids=["under the watchdog", "without it"])
def test_the_mitigator_waits_quietly_and_stops_within_10_s_of_sigterm(watchdog: bool, tmp_path: Path) -> None:
    address = unused_address()
    log = tmp_path / "mitigate.log"
    argv = ["mitigate", "--bootstrap", address, *([] if watchdog else ["--no-watchdog"])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "straggler.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + 30.0
        while "waiting for one" not in log.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            time.sleep(0.2)
        time.sleep(3.0)  # waiting on, quietly
        process.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        code = process.wait(10.0)
        assert time.monotonic() - stopping < 10.0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    said = log.read_text().splitlines()
    assert code == 0, said
    waiting = [line for line in said if "waiting for one" in line]
    assert len(waiting) == 1 and address in waiting[0] and "connection refused" in waiting[0], said
    assert len(said) <= 3, said  # its start-up line, the waiting line, its counts
    assert said[-1].startswith('{"consumed": 0'), said


def test_the_sdk_raises_at_the_call_that_could_not_deliver(capfd: pytest.CaptureFixture[str]) -> None:
    address = unused_address()
    started = time.monotonic()
    telemetry = TelemetryProducer(address, delivery_timeout=1.5)
    with pytest.raises(
        BrokerUnreachable, match=f"no Kafka broker answers at {address} \\(connection refused\\)"
    ):
        telemetry.start_job("job-1", 4)
    assert 1.5 <= time.monotonic() - started < 5.0, "start_job waited its bound, no longer"
    again = time.monotonic()
    with pytest.raises(BrokerUnreachable):
        telemetry.report("job-1", "task-1", {"cpu": 0.5})
    with pytest.raises(BrokerUnreachable):
        telemetry.end_job("job-1")
    with pytest.raises(BrokerUnreachable):
        telemetry.close()
    assert time.monotonic() - again < 1.0, "the broker known unreachable: at once"
    out, err = capfd.readouterr()
    # its own lines: the process's stderr also carries librdkafka lines of clients that other tests
    # of this xdist worker left behind their stopped brokers (other addresses)
    own = [line for line in (out + err).splitlines() if address in line]
    assert len(own) <= 3, out + err


def test_the_sdk_reports_a_broker_that_stopped_answering_at_the_next_report() -> None:
    """Records that wait ``delivery_timeout`` without a delivery make `report` raise, without blocking."""
    telemetry = TelemetryProducer(unused_address(), delivery_timeout=1.0, linger=0.05)
    telemetry.report("job-1", "task-1", {"cpu": 0.5})  # sent by the linger thread; never delivered
    deadline = time.monotonic() + 10.0
    with pytest.raises(BrokerUnreachable):  # the loop is the wait
        while time.monotonic() < deadline:
            telemetry.report("job-1", "task-1", {"cpu": 0.5})
            time.sleep(0.2)
    with pytest.raises(BrokerUnreachable):
        telemetry.close()


def test_the_views_reader_waits_for_the_broker_instead_of_dying(caplog: pytest.LogCaptureFixture) -> None:
    """A broker gone after `straggler view` started: its reader says so once and keeps trying."""
    from consumers.liveview import TopicReader
    from consumers.liveview_state import LiveViewState
    from straggler.kafka.names import TopicNames

    address = unused_address()
    reader = TopicReader(address, TopicNames("t."), LiveViewState())
    with caplog.at_level(logging.WARNING, logger="consumers.liveview"):
        reader.start()
        time.sleep(12.0)  # past a first metadata request's 10 s
        assert reader._thread.is_alive()
        reader.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "consumers.liveview"]
    assert len(said) == 1 and address in said[0], said
    assert reader.summary()["reader"] == {"records": 0, "assigned": False}
