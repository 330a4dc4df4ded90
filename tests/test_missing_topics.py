"""A stage whose topics are missing says once which command creates them, and waits for them:
the pure wait (`straggler.kafka.topics.wait_for_topics`), then the worker and the mitigator on a
broker, started before `straggler topics create`."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from test_prometheus_metrics import _free_port

from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_command, missing_line, wait_for_topics
from straggler.replay import child_process


def test_the_wait_says_once_which_topics_are_missing_and_the_command_that_creates_them() -> None:
    answers: list[list[str] | None] = [["zz-job-events", "zz-dead-letters"], None, ["zz-dead-letters"], []]
    said: list[str] = []

    def missing(bootstrap: str, topics: Sequence[str]) -> list[str]:
        assert bootstrap == "b:9092" and "zz-job-events" in topics
        answer = answers.pop(0)
        if answer is None:
            raise KafkaException("the broker is away for a moment")
        return answer

    assert wait_for_topics(
        "worker",
        "b:9092",
        ["zz-job-events", "zz-dead-letters"],
        "zz-",
        said.append,
        sleep=lambda _: None,
        missing=missing,
    )
    assert said == [
        "worker: topic(s) zz-job-events, zz-dead-letters missing on b:9092; create them with "
        "`straggler topics create --bootstrap b:9092 --topic-prefix zz-` (waiting for them)",
        "worker: the topics exist now",
    ]
    assert create_command("b:9092", "") == "straggler topics create --bootstrap b:9092"
    assert "`straggler topics create --bootstrap b:9092`" in missing_line("view", "b:9092", ["x"], "")
    stopped: list[str] = []
    assert not wait_for_topics("view", "b", ["x"], "", stopped.append, stopped=lambda: True, missing=missing)
    assert stopped == []


@pytest.mark.broker
@pytest.mark.scenario
def test_the_worker_and_mitigator_say_once_how_to_create_missing_topics_then_run_once_created(
    kafka_bootstrap: str, fresh_topic_prefix: str, tmp_path: Path
) -> None:
    topics = TopicNames(fresh_topic_prefix)
    common = ["--bootstrap", kafka_bootstrap, "--topic-prefix", fresh_topic_prefix]
    command = create_command(kafka_bootstrap, fresh_topic_prefix)
    worker_log, mitigator_log, view_log = (
        tmp_path / "worker.log",
        tmp_path / "mitigator.log",
        tmp_path / "view.log",
    )
    logs = (worker_log, mitigator_log, view_log)
    worker = ["worker", *common, "--partitions", "8", "--datadir", str(tmp_path / "faust")]
    mitigator = ["mitigate", *common, "--group", f"{fresh_topic_prefix}mitigation"]
    view = ["view", *common, "--port", str(_free_port())]
    with (
        child_process(worker, worker_log),
        child_process(mitigator, mitigator_log),
        child_process(view, view_log),
    ):
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and not all(
            log.exists() and command in log.read_text() for log in logs
        ):
            time.sleep(0.5)
        time.sleep(4.0)  # a few more rounds of the wait: still said once
        for log in logs:
            assert log.read_text().count(command) == 1, log.read_text()
        created = subprocess.run(
            [sys.executable, "-m", "straggler.cli", *command.split()[1:]],
            capture_output=True,
            text=True,
            check=True,
        )
        assert f"created {len(topics.all())} topic(s)" in created.stdout
        deadline = time.monotonic() + 90.0
        while time.monotonic() < deadline and not all("ready: " in log.read_text() for log in logs):
            time.sleep(0.5)
    for log in logs:
        text = log.read_text()
        assert "ready: " in text, text
        assert "the topics exist now" in text or log == view_log, text
        assert "UNKNOWN_TOPIC" not in text and "[ERROR]" not in text, text
