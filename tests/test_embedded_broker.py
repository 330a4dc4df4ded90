"""The embedded broker's lifecycle on a real JVM: start, reuse, round trip, restart, clean stop."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from straggler.kafka import embedded
from straggler.kafka.embedded import (
    BrokerPrerequisiteError,
    BrokerStartError,
    BrokerTls,
    EmbeddedKafka,
    embedded_kafka,
    java_major_version,
)
from straggler.kafka.smoke import smoke_check
from straggler.kafka.topics import TASK_CHECKPOINTS, partition_count


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _port_accepts(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, int(port))) == 0


@pytest.mark.broker
def test_lifecycle_round_trip_reuse_restart_and_clean_stop(tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    broker = EmbeddedKafka(port=0, data_dir=data_dir)
    try:
        bootstrap = broker.start()
        assert bootstrap.startswith("127.0.0.1:")
        assert broker.started_here

        status = broker.status()
        assert status.running
        assert status.pid is not None
        assert status.bootstrap == bootstrap
        assert status.log_file.exists()
        pid = status.pid

        result = smoke_check(bootstrap, messages=60, keys=6, echo=False)
        assert result.ok, result.problems
        assert result.consumed == 60

        second = EmbeddedKafka(port=0, data_dir=data_dir)
        assert second.start() == bootstrap
        assert not second.started_here
        assert second.status().pid == pid

        assert broker.stop()
        assert _process_gone(pid)
        assert not broker.pid_file.exists()
        assert not broker.status().running
        assert not second.status().running

        restarted = broker.start()  # same data dir: storage kept, topics survive
        assert partition_count(restarted, TASK_CHECKPOINTS) == 8
    finally:
        broker.stop()
    assert not broker.status().running


@pytest.mark.broker
def test_context_manager_stops_the_broker_it_started(tmp_path: Path) -> None:
    data_dir = tmp_path / "cm"
    with embedded_kafka(data_dir=data_dir) as bootstrap:
        status = EmbeddedKafka(data_dir=data_dir).status()
        assert status.running and status.pid is not None
        pid = status.pid
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
        assert len(metadata.brokers) == 1
    assert not EmbeddedKafka(data_dir=data_dir).status().running
    assert _process_gone(pid)
    assert not _port_accepts(bootstrap)


@pytest.mark.broker
def test_context_manager_without_data_dir_removes_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with embedded_kafka() as bootstrap:
        (data_dir,) = tmp_path.glob("straggler-kafka-*")
        assert EmbeddedKafka(data_dir=data_dir).status().bootstrap == bootstrap
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
        assert len(metadata.brokers) == 1
    assert not data_dir.exists()
    assert not _port_accepts(bootstrap)


_OWNER_SCRIPT = """
import sys, time
from pathlib import Path
from straggler.kafka.embedded import embedded_kafka
with embedded_kafka(data_dir=Path(sys.argv[1])) as bootstrap:
    print(bootstrap, flush=True)
    time.sleep(600)
"""


@pytest.mark.broker
def test_broker_of_a_killed_context_manager_owner_does_not_outlive_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "orphan"
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER_SCRIPT, str(data_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        bootstrap = owner.stdout.readline().strip()
        status = EmbeddedKafka(data_dir=data_dir).status()
        assert status.running and status.bootstrap == bootstrap
        owner.kill()  # no cleanup runs in the owner
        owner.wait(timeout=30)
        deadline = time.monotonic() + 60
        while EmbeddedKafka(data_dir=data_dir).status().running and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not EmbeddedKafka(data_dir=data_dir).status().running
    finally:
        owner.kill()
        EmbeddedKafka(data_dir=data_dir).stop()


@pytest.mark.broker
def test_port_in_use_is_reported(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = EmbeddedKafka(port=port, data_dir=tmp_path / "busy")
        with pytest.raises(BrokerStartError, match="in use"):
            broker.start()
    assert not broker.status().running


@pytest.mark.broker
def test_a_picked_port_taken_before_the_broker_binds_it_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports picked as free can be taken before the JVM binds them (two xdist workers start brokers,
    Dask workers pick ports): the broker starts again on new ones instead of failing the session."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        picks: list[list[int]] = []
        real = embedded._other_free_ports

        def first_one_held(port: int, count: int) -> list[int]:
            ports = [held, *real(port, count)[1:]] if not picks else real(port, count)
            picks.append(ports)
            return ports

        monkeypatch.setattr(embedded, "_other_free_ports", first_one_held)
        with embedded_kafka(data_dir=tmp_path / "raced") as bootstrap:
            metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
            assert len(metadata.brokers) == 1
    assert len(picks) == 2 and picks[0][0] == held and held not in picks[1]
    assert "Address already in use" in (tmp_path / "raced" / "broker.log").read_text()


def test_missing_java_names_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(BrokerPrerequisiteError, match="java"):
        EmbeddedKafka(port=0, data_dir=tmp_path / "never").start()
    assert not (tmp_path / "never" / "broker.pid").exists()


def _fake_java(directory: Path, version_line: str) -> Path:
    """A ``java`` that only answers ``-version`` (the broker is never started with it)."""
    directory.mkdir()
    script = directory / "java"
    script.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_java_8_is_rejected_with_the_version_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _fake_java(tmp_path / "bin", 'java version "1.8.0_392"')
    assert java_major_version(str(script)) == 8
    monkeypatch.setenv("PATH", str(script.parent))
    with pytest.raises(BrokerPrerequisiteError, match="Java 17 or newer"):
        EmbeddedKafka(port=0, data_dir=tmp_path / "never").start()


def test_java_version_parsing_reads_the_major(tmp_path: Path) -> None:
    script = _fake_java(tmp_path / "bin", 'openjdk version "21.0.2" 2024-01-16')
    assert java_major_version(str(script)) == 21


def test_the_tls_listeners_and_pem_files_reach_server_properties(tmp_path: Path) -> None:
    pem = {
        name: f"-----BEGIN {name}-----\nAAAA\nBBBB\n-----END {name}-----\n" for name in ("CHAIN", "KEY", "CA")
    }
    for name, text in pem.items():
        (tmp_path / name).write_text(text)
    broker = EmbeddedKafka(
        data_dir=tmp_path, tls=BrokerTls(tmp_path / "CHAIN", tmp_path / "KEY", tmp_path / "CA")
    )
    broker._write_configs(9092, 9093, [9094, 9095])
    path = tmp_path / "server.properties"
    properties = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    assert properties["listeners"] == (
        "PLAINTEXT://127.0.0.1:9092,TLS://127.0.0.1:9094,MTLS://127.0.0.1:9095,CONTROLLER://127.0.0.1:9093"
    )
    assert properties["advertised.listeners"] == (
        "PLAINTEXT://127.0.0.1:9092,TLS://127.0.0.1:9094,MTLS://127.0.0.1:9095"
    )
    assert (
        properties["listener.security.protocol.map"]
        == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,TLS:SSL,MTLS:SSL"
    )
    assert properties["inter.broker.listener.name"] == "PLAINTEXT"
    # one line each, as Java's Properties reads them back (an escaped newline is a newline)
    for key, name in (
        ("ssl.keystore.certificate.chain", "CHAIN"),
        ("ssl.keystore.key", "KEY"),
        ("listener.name.mtls.ssl.truststore.certificates", "CA"),
    ):
        assert properties[key].replace("\\n", "\n") == pem[name].strip()
    assert properties["listener.name.mtls.ssl.client.auth"] == "required"
    assert "listener.name.tls.ssl.client.auth" not in properties  # TLS alone asks for no client certificate
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds the private key
