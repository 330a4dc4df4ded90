"""A hung task in a live job is copied: the README's SDK calls, a real broker, the shipped worker and
mitigator with the README's commands, at their defaults (each live job evaluated at its own tasks' pace).

39 tasks finish in 3-8 s; one hangs with low CPU and high CPI and never finishes. The reports pass
no ``start_time``, as the README's snippet does. Under the default policy, and under `spark` (the floor
the default keeps), a ``duplicate`` for the hung task must arrive within 60 s of the last peer's finish.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from harness.consumer_groups import wait_for_stable_group

from pipeline.settings import WorkerSettings, app_id
from producers.telemetry import TelemetryProducer
from schemas import RelaunchCommand, decode_each
from straggler.kafka.config import consumer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import child_process

pytestmark = [pytest.mark.broker, pytest.mark.scenario, pytest.mark.xdist_group("hung-task")]

PEERS = 39
WITHIN_S = 60.0
"""How long after the last peer's finish the copy may come."""
GIVE_UP_S = 150.0
"""The test's own bound on a run, from the job's start."""


def new_commands(consumer: Consumer) -> list[RelaunchCommand]:
    out = []
    for message in consumer.consume(100, timeout=0.2):
        if message.error() is None:
            out += [e for e in decode_each(message.value()) if isinstance(e, RelaunchCommand)]
    return out


@pytest.mark.parametrize("policy", ["speculate", "spark"])
def test_the_hung_task_of_a_live_job_is_copied(
    policy: str, kafka_bootstrap: str, fresh_topic_prefix: str, tmp_path: Path
) -> None:
    create_topics(kafka_bootstrap, partitions=2, prefix=fresh_topic_prefix)
    topics = TopicNames(fresh_topic_prefix)
    common = ["--bootstrap", kafka_bootstrap, "--topic-prefix", fresh_topic_prefix]
    worker = [
        "worker",
        *common,
        "--partitions",
        "2",
        "--datadir",
        str(tmp_path / "faust"),
    ]
    mitigator = [
        "mitigate",
        *common,
        "--group",
        f"{fresh_topic_prefix}mitigation",
    ]
    if policy != "speculate":
        mitigator += ["--policy", policy]
    rng = random.Random(3)
    latency = {f"task-{i}": rng.uniform(3.0, 8.0) for i in range(PEERS)}
    hung = "task-hung"
    reader = Consumer(consumer_config(kafka_bootstrap, f"{fresh_topic_prefix}reader"))
    reader.subscribe([topics.commands])
    copied_at = None
    with (
        child_process(worker, tmp_path / "worker.log"),
        child_process(mitigator, tmp_path / "mitigator.log"),
    ):
        group = app_id(WorkerSettings(bootstrap=kafka_bootstrap, topics=topics))
        wait_for_stable_group(kafka_bootstrap, group, timeout=120.0)
        with TelemetryProducer(kafka_bootstrap, topics=topics) as sdk:  # the README's calls from here on
            sdk.start_job("job-42", expected_tasks=PEERS + 1, feature_names=["cpu", "cpi", "disk_io"])
            began = time.time()
            reported_done: set[str] = set()
            while copied_at is None and time.time() - began < GIVE_UP_S:
                ran = time.time() - began
                for task, took in latency.items():
                    if ran < took:
                        load = {"cpu": 0.8 + rng.uniform(-0.1, 0.1), "cpi": 1.2, "disk_io": 0.02}
                        sdk.report("job-42", task, load, machine_id=f"m-{task[-1]}")
                    elif task not in reported_done:
                        load = {"cpu": 0.8, "cpi": 1.2, "disk_io": 0.02}
                        sdk.report("job-42", task, load, status="finished", latency=took)
                        reported_done.add(task)
                sdk.report("job-42", hung, {"cpu": 0.05, "cpi": 6.0, "disk_io": 0.0}, machine_id="m-bad")
                sdk.flush()
                for command in new_commands(reader):
                    if command.task_id == hung and command.action == "duplicate":
                        copied_at = time.time() - began
                time.sleep(1.0)
            sdk.end_job("job-42")
    reader.close()
    last_peer = max(latency.values())
    assert copied_at is not None, f"{policy}: no copy of the hung task in {GIVE_UP_S:g} s (logs: {tmp_path})"
    assert copied_at - last_peer <= WITHIN_S, (
        f"{policy}: copied {copied_at - last_peer:.0f}s after the last peer"
    )
