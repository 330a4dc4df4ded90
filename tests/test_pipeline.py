"""The streaming pipeline end to end on a real broker: replayer -> Faust agent -> mitigation consumer.

One worker and one mitigation consumer serve the whole module, each under a fresh topic prefix.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest
from harness.small_jobs import make_job
from offline_expectations import offline_nurd

from producers.replayer import TraceReplayer
from producers.telemetry import TelemetryProducer
from schemas import CheckpointEvaluated, DeadLetter, Prediction, RelaunchCommand, decode_each
from straggler.core.jobtrace import JobTrace
from straggler.kafka.config import producer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import child_process, read_topic
from straggler.traces.google2011 import load_google2011

# one module-scoped pipeline, end to end
pytestmark = [pytest.mark.broker, pytest.mark.scenario, pytest.mark.xdist_group("pipeline")]
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "google-2011-sample"
PENDING_GRACE_S = 10.0
"""The worker's wait for a job's 'started' event: long against any skew between the input topics
(so no valid event is lettered under load), short enough for the unknown-job letters, waited for."""


@dataclass
class Pipeline:
    bootstrap: str
    topics: TopicNames
    group: str
    logs: Path


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    topics = TopicNames(f"pipe-{uuid.uuid4().hex[:8]}-")
    create_topics(kafka_bootstrap, prefix=topics.prefix)
    logs = tmp_path_factory.mktemp("pipeline")
    group = f"{topics.prefix}mitigation"
    common = ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.prefix]
    worker = [
        "worker",
        *common,
        "--datadir",
        str(logs / "faust"),
        "--live-interval",
        "2",
        "--pending-grace",
        str(PENDING_GRACE_S),
    ]
    mitigator = ["mitigate", *common, "--policy", "unlimited", "--group", group, "--checkpoint-seconds", "60"]
    with child_process(worker, logs / "worker.log"), child_process(mitigator, logs / "mitigator.log"):
        yield Pipeline(kafka_bootstrap, topics, group, logs)


def _events(pipeline: Pipeline, topic: str) -> list[object]:
    return [e for v in read_topic(pipeline.bootstrap, topic) for e in decode_each(v)]


def _wait_for(pipeline: Pipeline, topic: str, done: object, timeout: float = 180.0) -> list[object]:
    """Re-read ``topic`` until ``done(events)`` holds (bounded); return the events."""
    deadline = time.monotonic() + timeout
    while True:
        events = _events(pipeline, topic)
        if done(events) or time.monotonic() > deadline:  # type: ignore[operator]
            return events
        time.sleep(1.0)


def _jobs() -> list[JobTrace]:
    """Two jobs with the same task ids (their states must never mix) and two real Google jobs."""
    jobs = [
        make_job(160, seed=11, job_id="eq-a", signal=0.5),
        make_job(
            240, seed=12, job_id="eq-b", signal=0.3, slow_group=0.1, interval=4.0, waves=4, wave_gap=30.0
        ),
    ]
    real = load_google2011(SAMPLE, checkpoint_seconds=60.0)
    return jobs + sorted(real, key=lambda t: t.n_tasks)[:2]


def test_stream_decisions_and_commands_equal_the_offline_evaluator(pipeline: Pipeline) -> None:
    traces = _jobs()
    assert traces[0].task_ids == traces[1].task_ids[: traces[0].n_tasks]
    result = TraceReplayer(traces, pipeline.bootstrap, topics=pipeline.topics, progress=False).run()
    assert result.delivery_failures == 0
    expected_markers = {(t.job_id, float(c)) for t in traces for c in t.checkpoints}

    def all_evaluated(events: list[object]) -> bool:
        seen = {(e.job_id, e.checkpoint_time) for e in events if isinstance(e, CheckpointEvaluated)}
        return expected_markers <= seen

    events = _wait_for(pipeline, pipeline.topics.predictions, all_evaluated)
    seen = {(e.job_id, e.checkpoint_time) for e in events if isinstance(e, CheckpointEvaluated)}
    assert not expected_markers - seen, f"checkpoints never evaluated: {sorted(expected_markers - seen)[:10]}"
    stream = {
        (e.job_id, e.task_id, e.checkpoint_time, e.is_straggler)
        for e in events
        if isinstance(e, Prediction) and e.job_id in {t.job_id for t in traces}
    }

    offline, expected_commands = offline_nurd(traces)
    assert any(flag for *_, flag in offline), "the scenario must contain stragglers"
    assert stream == offline

    def all_commands(events: list[object]) -> bool:
        return expected_commands <= {e.command_id for e in events if isinstance(e, RelaunchCommand)}

    commands = [
        e
        for e in _wait_for(pipeline, pipeline.topics.commands, all_commands)
        if isinstance(e, RelaunchCommand) and e.job_id in {t.job_id for t in traces}
    ]
    assert {c.command_id for c in commands} == expected_commands
    assert len(commands) == len(expected_commands), "a relaunch command was produced twice"


def test_live_jobs_without_boundaries_are_evaluated_on_the_timer(pipeline: Pipeline) -> None:
    job = f"live-{uuid.uuid4().hex[:6]}"
    rng = np.random.default_rng(0)
    now = time.time()
    with TelemetryProducer(pipeline.bootstrap, topics=pipeline.topics) as sdk:
        sdk.start_job(job, expected_tasks=40)
        for i in range(40):
            sdk.report(job, f"t{i}", {"cpu": float(rng.random())}, start_time=now - 30, at=now)
        for i in range(8):
            sdk.report(
                job,
                f"t{i}",
                {"cpu": float(rng.random())},
                status="finished",
                latency=20.0 + i,
                start_time=now - 30,
                at=now - 10 + i,
            )
        sdk.flush()

    def evaluated(events: list[object]) -> bool:
        return any(isinstance(e, CheckpointEvaluated) and e.job_id == job and e.evaluated > 0 for e in events)

    events = _wait_for(pipeline, pipeline.topics.predictions, evaluated, timeout=60.0)
    markers = [e for e in events if isinstance(e, CheckpointEvaluated) and e.job_id == job]
    assert markers and all(m.boundary_produced_at is None for m in markers)  # timer ticks, not boundaries
    predicted = {e.task_id for e in events if isinstance(e, Prediction) and e.job_id == job}
    assert predicted == {f"t{i}" for i in range(8, 40)}  # every running task, no finished one


def test_bad_input_goes_to_dead_letters_and_the_worker_carries_on(pipeline: Pipeline) -> None:
    from confluent_kafka import Producer

    producer = Producer(producer_config(pipeline.bootstrap))
    bad = {
        b"not json at all": "payload",
        orjson.dumps({"type": "task_checkpoint", "schema_version": 99}): "version",
        orjson.dumps(
            {
                "type": "task_checkpoint",
                "schema_version": 1,
                "job_id": "ghost",
                "task_id": "t",
                "attempt": 0,
                "checkpoint_time": 1.0,
                "status": "running",
                "machine_id": "m",
                "features": {},
            }
        ): "unknown job",
    }
    for payload in bad:
        producer.produce(pipeline.topics.checkpoints, key=b"ghost", value=payload)
    producer.flush(30)

    def all_dead(events: list[object]) -> bool:  # the agent's letters (the agent owns the input topics)
        reasons = " | ".join(e.error for e in events if isinstance(e, DeadLetter) and e.stage == "agent")
        return all(fragment in reasons for fragment in bad.values())

    letters = [
        e
        for e in _wait_for(pipeline, pipeline.topics.dead_letters, all_dead, 120.0)
        if isinstance(e, DeadLetter) and e.stage == "agent"
    ]
    reasons = " | ".join(letter.error for letter in letters)
    for fragment in bad.values():
        assert fragment in reasons
    # the worker is alive and still evaluates: a fresh job replays through it
    trace = make_job(60, seed=3, job_id=f"after-{uuid.uuid4().hex[:6]}")
    TraceReplayer([trace], pipeline.bootstrap, topics=pipeline.topics, progress=False).run()

    def done(events: list[object]) -> bool:
        return any(
            isinstance(e, CheckpointEvaluated)
            and e.job_id == trace.job_id
            and e.checkpoint_time == float(trace.checkpoints[-1])
            for e in events
        )

    assert done(_wait_for(pipeline, pipeline.topics.predictions, done, 120.0))
