"""A live job through a real broker and the shipped worker: evaluated on the worker's timer with its
decision latency measured (report to decision), then, never ended, closed as abandoned with its
state freed (`--abandon-after`, short here so the test is quick)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from harness.consumer_groups import wait_for_stable_group
from test_prometheus_metrics import _eventually, _free_port, _scrape, _total

from pipeline.settings import WorkerSettings, app_id
from producers.telemetry import TelemetryProducer
from schemas import CheckpointEvaluated, JobEvent, decode_each
from straggler.kafka.config import consumer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import child_process

pytestmark = [pytest.mark.broker, pytest.mark.scenario, pytest.mark.xdist_group("live-lifecycle")]

ABANDON_AFTER_S = 4.0
FEATURES = {"cpu": 0.5, "cpi": 1.1}


def test_a_live_job_never_ended_is_closed_as_abandoned_and_its_state_freed(
    kafka_bootstrap: str, fresh_topic_prefix: str, tmp_path: Path
) -> None:
    create_topics(kafka_bootstrap, partitions=2, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    port = _free_port()
    worker = [
        "worker",
        "--bootstrap",
        kafka_bootstrap,
        "--topic-prefix",
        fresh_topic_prefix,
        "--partitions",
        "2",
        "--datadir",
        str(tmp_path / "faust"),
        "--live-interval",
        "1",
        "--abandon-after",
        str(ABANDON_AFTER_S),
        "--metrics-port",
        str(port),
    ]
    reader = Consumer(consumer_config(kafka_bootstrap, f"{fresh_topic_prefix}reader"))
    reader.subscribe([topics.predictions, topics.job_events])
    seen: list[object] = []

    def read() -> None:
        for message in reader.consume(100, timeout=0.2):
            if message.error() is None:
                seen.extend(decode_each(message.value()))

    log = tmp_path / "worker.log"
    with child_process(worker, log):
        group = app_id(WorkerSettings(kafka_bootstrap, topics=topics))
        wait_for_stable_group(kafka_bootstrap, group, timeout=120.0)
        with TelemetryProducer(kafka_bootstrap, topics=topics) as sdk:
            sdk.start_job("job-silent", expected_tasks=10, feature_names=list(FEATURES))
            began = time.time()
            for i in range(4):
                sdk.report("job-silent", f"f{i}", FEATURES, status="finished", latency=1.0 + i / 10)
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline and not any(isinstance(e, CheckpointEvaluated) for e in seen):
                sdk.report("job-silent", "r", FEATURES, machine_id="m-1", start_time=began)
                sdk.flush()
                read()
                time.sleep(0.5)
            assert any(isinstance(e, CheckpointEvaluated) for e in seen), f"never evaluated (log: {log})"
            held = _scrape(port)
            assert _total(held, "straggler_worker_decision_latency_seconds_count") > 0
            assert _total(held, "straggler_worker_decision_latency_seconds_sum") > 0
            # the SDK stops reporting and never ends the job
            silent_since = time.monotonic()

            def closed() -> tuple[bool, object]:
                read()
                ends = [e for e in seen if isinstance(e, JobEvent) and e.event == "ended"]
                return bool(ends), ends

            ends = _eventually(closed, timeout=60.0, every=0.2)
            assert isinstance(ends, list) and ends, f"not closed (log: {log})"
            (end,) = ends
            assert end.abandoned and end.job_id == "job-silent", end
            assert time.monotonic() - silent_since >= ABANDON_AFTER_S - 1.0
            freed = _eventually(lambda: (_total(s := _scrape(port), "straggler_worker_jobs") == 0, s), 30.0)
            assert isinstance(freed, dict) and _total(freed, "straggler_worker_jobs") == 0, freed
    reader.close()
    text = log.read_text()
    assert "job job-silent closed as abandoned: no report for" in text
    assert " UTC" in text and "e+09" not in text
    assert (
        f"worker ready: broker {kafka_bootstrap}, reading {topics.checkpoints}, {topics.job_events}" in text
    )
    assert "[ERROR]" not in text
