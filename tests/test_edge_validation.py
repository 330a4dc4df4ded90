"""Values that cannot poison: a record with a value outside its physical range (`schemas.ranges`),
or any other bad value of a numeric field, is dead-lettered once, with its reason, by the stage that
owns its topic, and the job's decisions are those it would have had without the record.

The end-to-end test runs the worker and the mitigator on the session broker; the others check the
rules and the fold without one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.small_jobs import make_job
from offline_expectations import offline_nurd
from test_foreign_producer import replayed_records

from consumers.fold import MitigationState
from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    Prediction,
    RelaunchCommand,
    SchemaError,
    TaskBatch,
    decode,
    decode_each,
    observations,
    read_task_batch,
    validate,
)
from schemas.ranges import MAX_TASK_SECONDS_ENV
from straggler.core.jobtrace import JobTrace
from straggler.kafka.config import consumer_config, producer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.offsets import end_offset
from straggler.kafka.smoke import SMOKE_TOPIC, smoke_check
from straggler.kafka.topics import DEFAULT_PARTITIONS, TASK_CHECKPOINTS, create_topics
from straggler.replay import child_process, read_topic

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 240.0
"""Longest a wait for the pipeline's output polls (a hang guard: each wait ends when its output is there)."""
HUGE = 1e300
BAD_NUMBERS: tuple[Any, ...] = (HUGE, -HUGE, "NaN", -1)
"""What each numeric field is tried with: ±huge, NaN as a string (JSON has no NaN), negative."""


def checkpoint_body(trace: JobTrace, at: float, **changes: Any) -> dict[str, Any]:
    """A valid running observation of the job's first task at ``at``, with ``changes``."""
    body: dict[str, Any] = {
        "task_id": trace.task_ids[0],
        "attempt": 0,
        "checkpoint_time": at,
        "status": "running",
        "machine_id": "m-bad",
        "features": {name: 0.5 for name in trace.feature_names},
        "start_time": 0.0,
    }
    body.update(changes)
    return body


def task_checkpoint(trace: JobTrace, at: float, **changes: Any) -> dict[str, Any]:
    return {
        "type": "task_checkpoint",
        "schema_version": 1,
        "job_id": trace.job_id,
        **checkpoint_body(trace, at, **changes),
    }


def bad_records(trace: JobTrace, at: float, index: int) -> list[tuple[str, bytes, str]]:
    """(topic role, payload, field its letter must name) for every bad value tried on ``trace`` at
    checkpoint ``at`` (index ``index``): the issue's cases, then each numeric field at each bad number."""
    feature = trace.feature_names[0]
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("checkpoints", task_checkpoint(trace, at, status="finished", latency=1e300), "latency"),
        ("checkpoints", task_checkpoint(trace, 1e15), "checkpoint_time"),
        ("checkpoints", task_checkpoint(trace, at, start_time=at + 1.0), "start_time"),
    ]
    for value in BAD_NUMBERS:
        for field in ("attempt", "checkpoint_time", "start_time"):
            cases.append(("checkpoints", task_checkpoint(trace, at, **{field: value}), field))
        cases.append(("checkpoints", task_checkpoint(trace, at, status="finished", latency=value), "latency"))
        if value != -1:  # a feature may be negative
            features = {**checkpoint_body(trace, at)["features"], feature: value}
            cases.append(("checkpoints", task_checkpoint(trace, at, features=features), "features"))
        job_event = {"type": "job_event", "schema_version": 1, "job_id": trace.job_id, "event": "ended"}
        cases.append(("job_events", {**job_event, "time": value}, "time"))
        started = {**job_event, "event": "started", "time": 0.0, "expected_tasks": value}
        cases.append(("job_events", started, "expected_tasks"))
        boundary = {
            "type": "checkpoint_boundary",
            "schema_version": 1,
            "job_id": trace.job_id,
            "checkpoint_time": at,
            "checkpoint_index": index,
            "produced_at": time.time(),
        }
        for field in ("checkpoint_time", "checkpoint_index", "produced_at"):
            cases.append(("checkpoints", {**boundary, field: value}, field))
        batch = {"type": "task_batch", "schema_version": 1, "job_id": trace.job_id}
        cases.append(("checkpoints", {**batch, "observations": [], "produced_at": value}, "produced_at"))
    unique = {orjson.dumps(obj): (role, field) for role, obj, field in reversed(cases)}  # the first of equals
    records = [(role, payload, field) for payload, (role, field) in reversed(unique.items())]
    # a batch whose only observation is out of range: the observation is lettered, with its own payload
    body = checkpoint_body(trace, at, status="finished", latency=1e300)
    batch_record = orjson.dumps(
        {"type": "task_batch", "schema_version": 1, "job_id": trace.job_id, "observations": [body]}
    )
    return [*records, ("checkpoints", batch_record, "observations[0].latency")]


def letter_payload(payload: bytes) -> str:
    """What a letter of ``payload`` keeps: a batch's bad observation alone, else the record."""
    obj = orjson.loads(payload)
    if obj.get("type") == "task_batch" and obj["observations"]:
        return orjson.dumps(obj["observations"][0]).decode()
    return payload.decode()


# ---------------------------------------------------------------- the rules, without a broker


def test_each_bad_value_is_refused_with_a_reason_naming_its_field() -> None:
    trace = make_job(40, seed=3, job_id="rules")
    for _, payload, field in bad_records(trace, 10.0, 1):
        try:
            batch = decode(payload)
        except SchemaError as refused:
            error = refused
        else:  # a batch is read, its bad observation refused on its own, on the fast path too
            assert isinstance(batch, TaskBatch) and read_task_batch(payload) is None, field
            (observation,) = observations(batch, payload)
            assert isinstance(observation, SchemaError), field
            error = observation
        assert field in str(error), (field, str(error))


def test_a_valid_record_at_the_edges_of_its_ranges_passes() -> None:
    trace = make_job(40, seed=3, job_id="edges")
    at = 4_000_000_000.0  # a live job's Unix time, in 2096
    validate(task_checkpoint(trace, at, start_time=at - 86400.0, status="finished", latency=86400.0))
    validate(task_checkpoint(trace, 2_500_000.0, start_time=0.0))  # a 2011 trace, 29 days in
    with pytest.raises(SchemaError, match="range"):
        validate(task_checkpoint(trace, at, start_time=0.0))  # ran 127 years


def test_the_longest_task_is_a_deployment_setting() -> None:
    check = (
        "from schemas import validate; import sys\n"
        "obj = {'type': 'task_checkpoint', 'schema_version': 1, 'job_id': 'j', 'task_id': 't', 'attempt': 0,"
        " 'checkpoint_time': 7200.0, 'status': 'finished', 'machine_id': '', 'features': {},"
        " 'latency': 7200.0}\n"
        "try:\n    validate(obj)\nexcept ValueError as e:\n    sys.exit(str(e))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), MAX_TASK_SECONDS_ENV: "3600"}
    refused = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=120
    )
    assert (
        refused.returncode == 1 and "task_checkpoint.latency" in refused.stderr and "3600" in refused.stderr
    )
    env.pop(MAX_TASK_SECONDS_ENV)
    accepted = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=120
    )
    assert accepted.returncode == 0, accepted.stderr


def test_the_mitigator_letters_only_its_own_topic() -> None:
    state = MitigationState("unlimited", 10.0, lettered_topics=["p-predictions"])
    assert state.process(b"not json", "p-checkpoints", 0, 1, b"j") == []
    (letter,) = state.process(b"not json", "p-predictions", 0, 1, b"j")
    assert isinstance(letter, DeadLetter) and letter.stage == "mitigator"
    assert state.dead_letters == 1


# ---------------------------------------------------------------- through a real broker


def committed_to_the_end(bootstrap: str, group: str, topics: list[str]) -> bool:
    """Whether ``group`` has committed every partition of ``topics`` up to its end."""
    consumer = Consumer(consumer_config(bootstrap, group))
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in range(DEFAULT_PARTITIONS)]
        for tp in consumer.committed(partitions, timeout=10):
            _, end = consumer.get_watermark_offsets(tp, timeout=10)
            if end > 0 and tp.offset < end:
                return False
        return True
    finally:
        consumer.close()


def wait_until(done: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(1.0)


def records_on(bootstrap: str, topic: str) -> int:
    """How many records ``topic`` has ever had (the sum of its partitions' end offsets)."""
    consumer = Consumer(consumer_config(bootstrap, "edge-validation-reader"))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(end_offset(consumer, TopicPartition(topic, p), 30.0) for p in partitions)
    finally:
        consumer.close()


@pytest.mark.broker
def test_smoke_writes_to_a_topic_of_its_own(kafka_bootstrap: str) -> None:
    create_topics(kafka_bootstrap)
    before = records_on(kafka_bootstrap, TASK_CHECKPOINTS)
    result = smoke_check(kafka_bootstrap, messages=20, echo=False)
    assert result.ok and result.topic == SMOKE_TOPIC != TASK_CHECKPOINTS
    assert records_on(kafka_bootstrap, SMOKE_TOPIC) >= 20
    assert records_on(kafka_bootstrap, TASK_CHECKPOINTS) == before


@pytest.fixture
def pipeline(kafka_bootstrap: str, fresh_topic_prefix: str, tmp_path: Path) -> Iterator[TopicNames]:
    topics = TopicNames(fresh_topic_prefix)
    create_topics(kafka_bootstrap, prefix=topics.prefix)
    common = ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.prefix]
    worker = ["worker", *common, "--datadir", str(tmp_path / "faust"), "--live-interval", "2"]
    mitigator = [
        "mitigate", *common, "--policy", "unlimited", "--group", f"{topics.prefix}mitigation",
        "--checkpoint-seconds", "10",
    ]  # fmt: skip
    with child_process(worker, tmp_path / "worker.log"), child_process(mitigator, tmp_path / "mitigator.log"):
        yield topics


@pytest.mark.broker
@pytest.mark.slow
def test_bad_values_are_lettered_once_and_change_no_decision(
    pipeline: TopicNames, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics = pipeline
    trace = make_job(160, seed=11, job_id=f"{topics.prefix}edge", signal=0.5)
    records = replayed_records([trace], topics, monkeypatch)
    boundaries = [
        i for i, (topic, _, value) in enumerate(records)
        if topic == topics.checkpoints and isinstance(decode(value), CheckpointBoundary)
    ]  # fmt: skip
    middle = boundaries[len(boundaries) // 2]
    boundary = decode(records[middle][2])
    assert isinstance(boundary, CheckpointBoundary)
    bad = bad_records(trace, boundary.checkpoint_time, boundary.checkpoint_index)
    role_topic = {"checkpoints": topics.checkpoints, "job_events": topics.job_events}
    injected = [(role_topic[role], trace.job_id, payload) for role, payload, _ in bad]
    producer = Producer(producer_config(kafka_bootstrap))
    for topic, key, value in [*records[: middle + 1], *injected, *records[middle + 1 :]]:
        producer.produce(topic, value=value, key=key.encode())
    assert producer.flush(60) == 0

    markers = {float(t) for t in trace.checkpoints}

    def predictions() -> list[object]:
        return [e for v in read_topic(kafka_bootstrap, topics.predictions) for e in decode_each(v)]

    wait_until(
        lambda: markers <= {e.checkpoint_time for e in predictions() if isinstance(e, CheckpointEvaluated)},
        "every checkpoint of the job evaluated",
    )
    inputs = [topics.checkpoints, topics.job_events, topics.predictions]
    wait_until(
        lambda: committed_to_the_end(kafka_bootstrap, f"{topics.prefix}mitigation", inputs),
        "the mitigator past every input record",
    )

    def letters() -> list[DeadLetter]:
        return [e for v in read_topic(kafka_bootstrap, topics.dead_letters) for e in decode_each(v)]  # type: ignore[misc]

    wait_until(lambda: len(letters()) >= len(bad), "a letter for each bad record")
    by_payload: dict[str, list[DeadLetter]] = {}
    for letter in letters():
        by_payload.setdefault(letter.raw_payload, []).append(letter)
    for _, payload, field in bad:
        found = by_payload.get(letter_payload(payload), [])
        assert len(found) == 1, (payload, [letter.error for letter in found])
        assert found[0].stage == "agent" and field in found[0].error, (payload, found[0].error)
    assert sum(map(len, by_payload.values())) == len(bad)

    # the job's decisions and commands are those of the offline evaluator, which never saw the bad values
    stream = {
        (e.job_id, e.task_id, e.checkpoint_time, e.is_straggler)
        for e in predictions()
        if isinstance(e, Prediction)
    }
    offline, expected_commands = offline_nurd([trace])
    assert any(flag for *_, flag in offline), "the scenario must contain stragglers"
    assert stream == offline
    commands = {
        e.command_id
        for v in read_topic(kafka_bootstrap, topics.commands)
        for e in decode_each(v)
        if isinstance(e, RelaunchCommand)
    }
    assert commands == expected_commands
