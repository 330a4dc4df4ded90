"""Collaborative ADMM straggler prediction: the consensus math, the node data, the method, and the
exchange over a real Kafka broker."""

from __future__ import annotations

import pickle
import time
import uuid
from dataclasses import replace

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.small_jobs import make_job

from straggler.core.admm import (
    DEFAULT_NODES,
    Admm,
    NodeData,
    centralised_logistic,
    fit_consensus,
    job_training_rows,
    node_moments,
    partition_datasets,
    standardiser_from_moments,
    straggler_labels,
)
from straggler.core.jobtrace import JobTrace
from straggler.core.method import CheckpointData
from straggler.core.partitioner import murmur2, partition_of
from straggler.core.preprocessing import Standardiser
from straggler.core.registry import make_method
from straggler.evaluation import EvaluationConfig, evaluate, summarise
from straggler.kafka.config import consumer_config, producer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import DEFAULT_PARTITIONS, create_topics

# Kafka's own test vectors for Utils.murmur2 (clients/src/test/.../UtilsTest.java), as signed ints.
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def node_sets(seed: int = 0, nodes: int = 5, d: int = 4, empty_node: bool = True) -> list[NodeData]:
    """Nodes of different sizes and class balance (one with no row at all, one tiny)."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=d)
    out = []
    for i in range(nodes):
        m = 6 if i == 1 else int(rng.integers(40, 300))
        X = rng.normal(size=(m, d)) + 0.2 * i
        y = X @ beta + rng.logistic(size=m) - 1.0 > 0
        out.append(NodeData(X, y))
    if empty_node:
        out.append(NodeData(np.zeros((0, d)), np.zeros(0, dtype=bool)))
    return out


def training_jobs(n: int = 12, tasks: int = 120) -> list[JobTrace]:
    return [make_job(tasks, seed=s, job_id=f"train-{s}", slow_group=0.15) for s in range(n)]


def checkpoint_of(trace: JobTrace, k: int) -> CheckpointData:
    t = float(trace.checkpoints[k])
    idx = trace.running_index[k]
    done = trace.finished & (trace.end <= t)
    return CheckpointData(
        X_finished=trace.finish_features[done],
        latency_finished=trace.latency[done],
        X_running=trace.running_features[k],
        elapsed_running=t - trace.start[idx],
        threshold=float(np.quantile(trace.latency, 0.9)),
        expected_tasks=trace.n_tasks,
        at=t,
    )


# --------------------------------------------------------------------------------------------------
# Nodes = partitions
# --------------------------------------------------------------------------------------------------


def test_murmur2_matches_kafkas_test_vectors() -> None:
    for data, expected in KAFKA_MURMUR2.items():
        assert np.int32(np.uint32(murmur2(data))) == expected, data


def test_partition_is_the_positive_hash_modulo_the_count() -> None:
    assert DEFAULT_NODES == DEFAULT_PARTITIONS
    for job_id in ("21", "foobar", "6251995937", "job-1"):
        assert partition_of(job_id, 8) == (murmur2(job_id.encode()) & 0x7FFFFFFF) % 8
    # -973932308 & 0x7fffffff = 1173551340
    assert partition_of("21", 8) == 1173551340 % 8
    with pytest.raises(ValueError):
        partition_of("x", 0)


def test_each_jobs_rows_go_to_its_partition() -> None:
    jobs = training_jobs(10, tasks=50)
    nodes = partition_datasets(jobs, 4)
    sizes = [0] * 4
    for job in jobs:
        sizes[partition_of(job.job_id, 4)] += int(job.scored.sum())
    assert [d.n for d in nodes] == sizes


# --------------------------------------------------------------------------------------------------
# Labels and features: finished tasks only, training statistics only
# --------------------------------------------------------------------------------------------------


def test_labels_are_latency_over_1_3_times_the_jobs_median() -> None:
    latency = np.array([10.0, 11.0, 12.0, 13.0, 16.0, 100.0])
    np.testing.assert_array_equal(straggler_labels(latency), latency > 1.3 * 12.5)
    assert straggler_labels(np.zeros(0)).shape == (0,)


def test_labels_and_rows_come_only_from_finished_tasks() -> None:
    job = make_job(100, seed=3, job_id="partial")
    finished = job.finished.copy()
    finished[::4] = False  # killed or cut: no latency, no row, no share of the median
    partial = replace(job, finished=finished)
    X, y = job_training_rows(partial)
    keep = finished
    np.testing.assert_array_equal(X, job.finish_features[keep])
    latency = job.latency[keep]
    np.testing.assert_array_equal(y, latency > 1.3 * np.median(latency))
    # what unfinished tasks did, and any running snapshot, changes nothing
    end = partial.end.copy()
    end[~keep] *= 10.0
    running = [x + 100.0 for x in partial.running_features]
    X2, y2 = job_training_rows(replace(partial, end=end, running_features=running))
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)


def test_pooled_scaler_from_moments_equals_learning_on_the_pooled_rows() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(3.0, 2.0, size=(m, 4)) for m in (30, 0, 55, 7)]
    parts[0][rng.random(parts[0].shape) < 0.2] = np.nan
    parts[2][:, 3] = 5.0  # a constant column
    parts[3][:, 3] = 5.0
    parts[0][:, 3] = 5.0
    pooled = Standardiser.learn(np.vstack(parts))
    assembled = standardiser_from_moments([node_moments(p) for p in parts])
    for name in ("fill", "center", "scale"):
        np.testing.assert_allclose(getattr(assembled, name), getattr(pooled, name), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(assembled.varying, pooled.varying)


# --------------------------------------------------------------------------------------------------
# Consensus ADMM
# --------------------------------------------------------------------------------------------------


def test_consensus_reaches_the_centralised_l2_logistic_solution() -> None:
    nodes = node_sets()
    weights, history = fit_consensus(nodes, rounds=3000, eps_abs=1e-10, eps_rel=1e-10)
    central = centralised_logistic(nodes)
    assert history.converged and len(history.rounds) < 3000
    np.testing.assert_allclose(weights, central, atol=1e-6)


def test_default_tolerances_stop_early_close_to_the_solution() -> None:
    nodes = node_sets(seed=1)
    weights, history = fit_consensus(nodes)
    assert history.converged and len(history.rounds) < 200
    assert np.max(np.abs(weights - centralised_logistic(nodes))) < 0.02
    primal = [r.primal for r in history.rounds]
    assert primal[-1] < primal[0]


def test_a_round_budget_stops_the_run() -> None:
    _, history = fit_consensus(node_sets(), rounds=3, eps_abs=0.0, eps_rel=0.0)
    assert len(history.rounds) == 3 and not history.converged


def test_bytes_accounting() -> None:
    nodes = node_sets(d=4)  # 6 nodes, 4 features + intercept
    _, history = fit_consensus(nodes, rounds=10, eps_abs=0.0, eps_rel=0.0)
    rows = sum(d.n for d in nodes)
    s = history.summary()
    assert s["vector_bytes"] == 5 * 8
    assert s["bytes_up_per_round"] == 6 * 40
    assert s["bytes_star_per_round"] == 2 * 6 * 40
    assert s["bytes_all_to_all_per_round"] == 6 * 40 + 36 * 40
    assert s["scaler_bytes"] == 6 * (1 + 3 * 4) * 8
    assert s["bytes_star_total"] == s["scaler_bytes"] + 10 * 2 * 6 * 40
    assert s["data_bytes"] == rows * (4 * 8 + 1)
    assert s["rows"] == rows and s["rounds"] == 10


# --------------------------------------------------------------------------------------------------
# The method
# --------------------------------------------------------------------------------------------------


def test_method_is_registered_as_a_cross_job_classifier() -> None:
    method = make_method("admm")
    assert isinstance(method, Admm)
    assert method.learns_across_jobs and not method.predicts_latency
    with pytest.raises(RuntimeError):
        method.predict(checkpoint_of(make_job(50), 2))


def test_method_trains_across_jobs_and_predicts_deterministically() -> None:
    jobs = training_jobs()
    method = make_method("admm").fit_population(jobs)
    again = make_method("admm").fit_population(jobs)
    assert isinstance(method, Admm) and isinstance(again, Admm)
    np.testing.assert_array_equal(method.coef_, again.coef_)
    assert method.history_.converged
    # slow machines show a high x1, and x0 drives latency: both weights positive
    assert method.coef_[0] > 0 and method.coef_[1] > 0

    target = make_job(150, seed=99, job_id="target", slow_group=0.15)
    data = checkpoint_of(target, 3)
    scores = method.fit(data).predict(data)
    assert not method.fallback_
    assert scores.is_straggler.shape == (data.n_running,)
    assert np.all(np.isnan(scores.latency)) and np.all(np.isnan(scores.adjusted))
    np.testing.assert_array_equal(scores.is_straggler, scores.propensity >= 0.5)
    np.testing.assert_array_equal(scores.propensity, again.predict(data).propensity)

    restored = pickle.loads(pickle.dumps(method))
    np.testing.assert_array_equal(restored.predict(data).propensity, scores.propensity)

    # the job being predicted teaches it nothing
    np.testing.assert_array_equal(
        method.fit(checkpoint_of(target, 5)).predict(data).propensity, scores.propensity
    )

    probe = replace(
        data, X_running=np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 4.0]]), elapsed_running=np.zeros(3)
    )
    p = method.predict(probe).propensity
    assert p[1] > p[0] and p[2] > 0.5


def test_running_snapshots_of_training_jobs_are_never_used() -> None:
    jobs = training_jobs(6, tasks=80)
    noisy = [replace(j, running_features=[x * 0 + 7.0 for x in j.running_features]) for j in jobs]
    a = make_method("admm").fit_population(jobs)
    b = make_method("admm").fit_population(noisy)
    assert isinstance(a, Admm) and isinstance(b, Admm)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_a_window_with_one_class_predicts_it() -> None:
    job = make_job(60, seed=1, job_id="flat")
    flat = replace(job, end=job.start + 10.0)  # every latency equal: no straggler anywhere
    method = make_method("admm").fit_population([flat])
    assert isinstance(method, Admm)
    assert method.constant_class_ is False
    data = checkpoint_of(job, 2)
    assert not method.predict(data).is_straggler.any()


def test_cross_fitted_evaluation_runs() -> None:
    traces = [make_job(100, seed=s, job_id=f"e{s}", slow_group=0.1) for s in range(6)]
    config = EvaluationConfig(methods=("admm", "reactive"), machine_counts=(100,))
    summary = summarise(evaluate(traces, config, workers=1, progress=False), config)
    assert 0.0 <= summary["methods"]["admm"]["f1"] <= 1.0


# --------------------------------------------------------------------------------------------------
# Over Kafka
# --------------------------------------------------------------------------------------------------


def _exchange_records(bootstrap: str, topic: str, timeout: float = 30.0) -> list[dict[str, str]]:
    """Headers of every record on the exchange topic (partition 0), bounded in time."""
    consumer = Consumer(consumer_config(bootstrap, f"reader-{uuid.uuid4().hex[:8]}"))
    try:
        end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[dict[str, str]] = []
        deadline = time.monotonic() + timeout
        while len(out) < end and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=0.5):
                if message.error() is None:
                    headers = message.headers() or []
                    pairs = headers.items() if isinstance(headers, dict) else headers
                    out.append({k: v.decode() for k, v in pairs if isinstance(v, bytes)})
        return out
    finally:
        consumer.close()


@pytest.mark.broker
def test_kafka_exchange_matches_the_in_process_run(kafka_bootstrap: str, fresh_topic_prefix: str) -> None:
    from straggler.kafka.admm_exchange import run_kafka_consensus

    nodes = node_sets(seed=2, nodes=3)  # 4 nodes, one without rows
    expected, in_process = fit_consensus(nodes, rounds=40)
    topic = TopicNames(fresh_topic_prefix).admm_exchange
    weights, history = run_kafka_consensus(
        kafka_bootstrap, topic, nodes, rounds=40, round_timeout=30.0, run_id="run-a"
    )
    np.testing.assert_allclose(weights, expected, rtol=0, atol=1e-9)
    assert [r.primal for r in history.rounds] == [r.primal for r in in_process.rounds]
    rounds = len(history.rounds)
    assert history.transport == f"kafka:{topic}"
    assert history.messages_per_round == [len(nodes)] * rounds
    # every node's message of every round went through the topic, once
    records = _exchange_records(kafka_bootstrap, topic)
    seen = sorted((int(r["round"]), int(r["node"])) for r in records if r.get("run") == "run-a")
    assert seen == [(k, i) for k in range(rounds) for i in range(len(nodes))]
    assert all(r["schema"] == "straggler.admm-exchange" and r["version"] == "1" for r in records)

    # a second run on the same topic ignores the first run's records
    again, _ = run_kafka_consensus(kafka_bootstrap, topic, nodes, rounds=40, round_timeout=30.0)
    np.testing.assert_array_equal(again, weights)


@pytest.mark.broker
def test_murmur2_places_keys_where_the_producers_partitioner_does(
    kafka_bootstrap: str, fresh_topic_prefix: str
) -> None:
    topics = TopicNames(fresh_topic_prefix)
    create_topics(kafka_bootstrap, partitions=DEFAULT_PARTITIONS, prefix=fresh_topic_prefix)
    producer = Producer(producer_config(kafka_bootstrap))
    placed: dict[str, int] = {}

    def remember(error: object, message: object) -> None:
        assert error is None
        placed[message.key().decode()] = message.partition()  # type: ignore[attr-defined]

    keys = [f"{n}" for n in (6251995937, 6252305906, 4665712499, 1, 21)] + ["job-1", "train-3"]
    for key in keys:
        producer.produce(topics.job_events, b"{}", key.encode(), on_delivery=remember)
    assert producer.flush(30.0) == 0
    assert placed == {key: partition_of(key, DEFAULT_PARTITIONS) for key in keys}


@pytest.mark.broker
def test_train_command_over_kafka(kafka_bootstrap: str, fresh_topic_prefix: str, tmp_path: object) -> None:
    from pathlib import Path

    from straggler.cli import main
    from straggler.core.registry import load_trained_method

    out = Path(str(tmp_path)) / "admm.pkl"
    args = [
        "--format",
        "synthetic",
        "--jobs",
        "3",
        "--min-tasks",
        "20",
        "--method",
        "admm",
        "--out",
        str(out),
    ]
    assert main(["train", *args, "--bootstrap", kafka_bootstrap, "--topic-prefix", fresh_topic_prefix]) == 0
    over_kafka = load_trained_method(out, "admm")
    assert main(["train", *args]) == 0
    in_process = load_trained_method(out, "admm")
    assert isinstance(over_kafka, Admm) and isinstance(in_process, Admm)
    np.testing.assert_allclose(over_kafka.coef_, in_process.coef_, rtol=0, atol=1e-9)
    assert over_kafka.history_.transport.startswith("kafka:")
