"""The ``straggler`` subcommands run as commands (``python -m straggler.cli ...``): exit codes, output.

Broker-using commands share the session broker (``kafka_bootstrap``) and small inputs; ``broker``
runs against fake ``java`` processes (no JVM), so no test here starts a broker of its own.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from straggler.kafka.names import TopicNames
from straggler.kafka.topics import DEFAULT_PARTITIONS, create_topics, topic_specs

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 180.0
SYNTHETIC = ["--format", "synthetic", "--jobs", "1", "--seed", "2", "--min-tasks", "20"]
"""One synthetic job of 31 tasks and 30 checkpoints."""


def straggler(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m straggler.cli *args`` with this checkout first on the path."""
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "straggler.cli", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=environment,
        cwd=ROOT,
        check=False,
    )


# ---------------------------------------------------------------- broker (fake JVMs)


def fake_java(directory: Path, broker_body: str) -> Path:
    """A ``java`` that reports version 17, formats storage, and runs ``broker_body`` as the broker."""
    directory.mkdir(parents=True, exist_ok=True)
    java = directory / "java"
    java.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        "  *-version*) echo 'openjdk version \"17.0.9\"' >&2; exit 0 ;;\n"
        "  *kafka.tools.StorageTool*) exit 0 ;;\n"
        "esac\n" + broker_body + "\n"
    )
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return java


def test_broker_status_and_stop_of_no_broker(tmp_path: Path) -> None:
    status = straggler("broker", "status", "--data-dir", str(tmp_path))
    assert status.returncode == 3
    assert status.stdout.startswith("not running")
    stop = straggler("broker", "stop", "--data-dir", str(tmp_path))
    assert stop.returncode == 0
    assert stop.stdout.startswith("not running")


def test_broker_start_reports_a_jvm_that_died_and_exits_1(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    libs = cache / "straggler-stream" / "kafka-3.9.1" / "libs"
    libs.mkdir(parents=True)
    (libs.parent / ".resolved").write_text("fake\n")  # as if resolved before: no mvn
    fakes = tmp_path / "bin"
    fake_java(fakes, 'echo "FATAL fake broker: log dir locked"; exit 2')
    env = {"PATH": f"{fakes}:/usr/bin:/bin", "XDG_CACHE_HOME": str(cache)}
    data = tmp_path / "data"
    result = straggler("broker", "start", "--port", "0", "--data-dir", str(data), env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: the Kafka JVM" in result.stderr and "exited before it was ready" in result.stderr
    assert "log dir locked" in result.stderr
    assert not (data / "broker.pid").exists()


def test_broker_status_and_stop_of_a_running_broker(tmp_path: Path) -> None:
    data = (tmp_path / "data").resolve()
    data.mkdir()
    java = fake_java(tmp_path / "bin", "while :; do sleep 0.05; done")
    process = subprocess.Popen(
        [str(java), "kafka.Kafka", str(data / "server.properties")], start_new_session=True
    )
    try:
        (data / "broker.pid").write_text(f"{process.pid}\n")
        (data / "broker.port").write_text("19092\n")
        status = straggler("broker", "status", "--data-dir", str(data))
        assert status.returncode == 0
        assert f"running: pid {process.pid}, bootstrap 127.0.0.1:19092" in status.stdout
        stop = straggler("broker", "stop", "--data-dir", str(data))
        assert (stop.returncode, stop.stdout.strip()) == (0, "stopped")
        assert process.wait(timeout=10) == -signal.SIGTERM
        assert not (data / "broker.pid").exists()
        assert straggler("broker", "status", "--data-dir", str(data)).returncode == 3
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# ---------------------------------------------------------------- against the session broker


@pytest.mark.broker
def test_topics_create_declares_every_topic_and_is_idempotent(kafka_bootstrap: str) -> None:
    first = straggler("topics", "create", "--bootstrap", kafka_bootstrap)
    assert first.returncode == 0, first.stderr
    again = straggler("topics", "create", env={"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap})
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"created 0 topic(s) on {kafka_bootstrap}: (all existed)"
    listed = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    for spec in topic_specs(DEFAULT_PARTITIONS, 1, ""):
        topic = spec.new_topic().topic
        assert topic in listed, topic


@pytest.mark.broker
def test_smoke_round_trips_through_the_session_broker(kafka_bootstrap: str) -> None:
    result = straggler("smoke", "--bootstrap", kafka_bootstrap, "--messages", "20")
    assert result.returncode == 0, result.stdout + result.stderr


def records_in(bootstrap: str, topic: str) -> int:
    """Records in a topic, read to its end (read_committed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        count, ended = 0, set[int]()
        deadline = time.monotonic() + 30
        while len(ended) < len(partitions) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                ended.add(message.partition() or 0)
            else:
                count += 1
        return count
    finally:
        consumer.close()


@pytest.mark.broker
def test_produce_writes_the_trace_and_prints_its_summary(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    create_topics(kafka_bootstrap, prefix=fresh_topic_prefix)
    result = straggler(
        "produce", *SYNTHETIC, "--bootstrap", kafka_bootstrap, "--topic-prefix", fresh_topic_prefix, "--quiet"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["jobs"] == 1 and summary["delivery_failures"] == 0
    assert summary["observations_produced"] > 31  # every task at least once, most several times
    topics = TopicNames(fresh_topic_prefix)
    written = records_in(kafka_bootstrap, topics.checkpoints) + records_in(kafka_bootstrap, topics.job_events)
    assert written == summary["events_produced"]


@pytest.mark.broker
def test_produce_to_missing_topics_fails_with_exit_1(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    result = straggler(
        "produce", *SYNTHETIC, "--bootstrap", kafka_bootstrap, "--topic-prefix", fresh_topic_prefix, "--quiet"
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("error:")  # after the replayer's start line


@pytest.mark.broker
@pytest.mark.scenario
def test_replay_runs_the_pipeline_and_writes_its_report(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "replay"
    result = straggler(
        "replay", *SYNTHETIC, "--checkpoint-seconds", "300", "--method", "reactive", "--policy", "relaunch",
        "--bootstrap", kafka_bootstrap, "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == 1 and summary["dead_letters"] == 0
    assert result.stdout == (out / "report.md").read_text()  # the report alone; the rest is in OUT
    # each process says on start what it connects to and runs with, then a line per job and command
    assert f"replay: 1 jobs, method reactive, policy relaunch, broker {kafka_bootstrap}" in result.stderr
    worker, mitigator = (out / "worker.log").read_text(), (out / "mitigator.log").read_text()
    assert f"worker: broker {kafka_bootstrap}, topics replay-" in worker and "method reactive" in worker
    assert "job synthetic-2-0 started: 31 tasks, replayed" in worker and "job synthetic-2-0 ended" in worker
    assert f"mitigator: broker {kafka_bootstrap}" in mitigator and "policy relaunch" in mitigator
    assert mitigator.count(": relaunch of job synthetic-2-0 task ") == summary["commands"] > 0
