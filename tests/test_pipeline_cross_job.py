"""A cross-job method in the stream: ``straggler train`` writes it, ``straggler worker --model`` loads it,
and the stream's decisions equal the offline evaluator's with the same trained model (real broker)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from harness.small_jobs import make_job

from producers.replayer import TraceReplayer
from schemas import CheckpointEvaluated, Prediction, decode_each
from straggler.core.registry import load_trained_method, make_method, save_trained_method
from straggler.evaluation import EvaluationConfig, method_decisions
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import child_process, read_topic

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_a_trained_admm_model_decides_the_same_in_the_stream_and_offline(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    model = tmp_path / "admm.pkl"
    training = [make_job(200, seed=s, job_id=f"train-{s}", signal=1.0) for s in range(6)]
    save_trained_method(make_method("admm").fit_population(training), model)  # what `straggler train` does
    trained = load_trained_method(model, "admm")
    traces = [make_job(200, seed=40 + s, job_id=f"live-{s}", signal=1.0) for s in range(2)]
    config = EvaluationConfig(methods=("admm",), threshold="online")
    offline = {
        (d.job_id, d.task_id, d.checkpoint_time, d.is_straggler)
        for trace in traces
        for verdicts in method_decisions(trace, "admm", config, {"admm": trained})
        for d in verdicts
    }
    reactive = {
        (d.job_id, d.task_id, d.checkpoint_time, d.is_straggler)
        for trace in traces
        for verdicts in method_decisions(trace, "reactive", config)
        for d in verdicts
    }
    assert offline != reactive, "the scenario must let the trained model change decisions"

    topics = TopicNames(f"xjob-{uuid.uuid4().hex[:8]}-")
    create_topics(kafka_bootstrap, prefix=topics.prefix)
    worker = [
        "worker",
        "--bootstrap",
        kafka_bootstrap,
        "--topic-prefix",
        topics.prefix,
        "--method",
        "admm",
        "--model",
        str(model),
        "--datadir",
        str(tmp_path / "faust"),
    ]
    with child_process(worker, tmp_path / "worker.log"):
        result = TraceReplayer(traces, kafka_bootstrap, topics=topics, progress=False).run()
        assert result.delivery_failures == 0
        expected = {(t.job_id, float(c)) for t in traces for c in t.checkpoints}
        deadline = time.monotonic() + 180
        while True:
            events = [e for v in read_topic(kafka_bootstrap, topics.predictions) for e in decode_each(v)]
            seen = {(e.job_id, e.checkpoint_time) for e in events if isinstance(e, CheckpointEvaluated)}
            if expected <= seen or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    assert expected <= seen, f"checkpoints never evaluated: {sorted(expected - seen)[:5]}"
    stream = {
        (e.job_id, e.task_id, e.checkpoint_time, e.is_straggler) for e in events if isinstance(e, Prediction)
    }
    assert stream == offline
