"""Collaborative ADMM inside the worker (``straggler worker --method admm --admm-interval``).

The pure part (`OnlineAdmm`: node steps and aggregator) must replay `fit_consensus` bit for bit on
fixed data; the broker test runs a real worker, replays jobs keyed to several partitions and checks
that the consensus it publishes converges to `fit_consensus` on the same partition datasets.
"""

from __future__ import annotations

import functools
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from harness.small_jobs import make_job
from harness.worker_story import worker_story

from pipeline.admm_online import table_changelog
from pipeline.settings import WorkerSettings, app_id
from producers.replayer import TraceReplayer
from schemas import CheckpointEvaluated, decode_each
from straggler.core.admm import (
    NodeData,
    fit_consensus,
    node_moments,
    partition_datasets,
    standardiser_from_moments,
)
from straggler.core.admm_online import ConsensusRecord, OnlineAdmm, RoundMessage
from straggler.core.partitioner import partition_of
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import DEFAULT_PARTITIONS, create_topics
from straggler.replay import child_process, read_topic

N = DEFAULT_PARTITIONS
CONVERGED = 1e-6
"""How close the worker's consensus must come to `fit_consensus`'s fixed point (about 130 rounds)."""


def _jobs() -> list:
    return [make_job(60, seed=s, job_id=f"admm-{s}", signal=1.0) for s in range(4)]


def _reference(jobs: list, rounds: int) -> tuple[np.ndarray, np.ndarray, list]:
    """`fit_consensus` for exactly ``rounds`` rounds on the jobs' partition datasets, standardised by
    their pooled moments; with the pooled moments and the raw datasets."""
    raw = partition_datasets(jobs, N)
    moments = [node_moments(d.X) for d in raw]
    scaler = standardiser_from_moments(moments)
    datasets = [NodeData(scaler.transform(d.X), d.y) for d in raw]
    z, _ = fit_consensus(datasets, rounds, eps_abs=0.0, eps_rel=0.0)
    return z, np.sum(np.stack(moments), axis=0), raw


def test_online_rounds_replay_fit_consensus_exactly_on_fixed_data() -> None:
    jobs = _jobs()
    rounds = 25
    z_ref, pooled, raw = _reference(jobs, rounds)
    admm = OnlineAdmm(N)
    consensus: ConsensusRecord | None = None
    for _ in range(rounds + 1):  # round 0 carries only the moments of the shared scaler
        record = None
        for p in range(N):
            rows = [(raw[p].X, raw[p].y)] if raw[p].n else []
            payload = admm.node_step(p, consensus, functools.partial(lambda rows, dim: rows, rows))
            assert payload is not None
            message = RoundMessage.decode(payload)
            assert message is not None
            record = admm.collect(message, consensus)
            assert (record is None) == (p < N - 1), "a round completes with its last node"
        assert record is not None
        # what every worker reads back from the GlobalTable
        consensus = ConsensusRecord.decode(record.encode())
    assert consensus is not None and consensus.round == rounds
    assert np.array_equal(consensus.z, z_ref)
    assert np.array_equal(consensus.moments, pooled)


def test_a_node_with_a_stalled_round_sends_again_and_stale_rounds_are_ignored() -> None:
    clock = [0.0]
    admm = OnlineAdmm(2, stall_seconds=5.0, clock=lambda: clock[0])
    X = np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0]])
    y = np.array([False, False, True])
    first = admm.node_step(0, None, lambda dim: [(X, y)])
    assert first is not None
    assert admm.node_step(0, None, lambda dim: [(X, y)]) is None  # waits for round 0
    clock[0] = 6.0
    assert admm.node_step(0, None, lambda dim: [(X, y)]) is not None  # stalled: sends again
    m0 = RoundMessage.decode(first)
    empty = admm.node_step(1, None, lambda dim: [])
    assert m0 is not None and empty is not None
    assert admm.collect(m0, None) is None
    m1 = RoundMessage.decode(empty)
    assert m1 is not None
    record = admm.collect(m1, None)
    assert record is not None and record.round == 0 and record.rows == 3 and record.dim == 2
    assert admm.collect(m0, record) is None  # round 0 again: stale


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.scenario
def test_the_worker_runs_admm_over_its_partitions_and_reaches_fit_consensus(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Jobs end (the replayer sends 'ended'), so the nodes' rows are the retained rows of ended jobs
    (`RETENTION_S`, far longer than this test): the data is then fixed and the rounds converge."""
    jobs = _jobs()
    assert len({partition_of(j.job_id, N) for j in jobs}) >= 2
    z_ref, pooled, raw = _reference(jobs, 3000)  # converged far below 1e-6
    topics = TopicNames(f"admmon-{uuid.uuid4().hex[:8]}-")
    create_topics(kafka_bootstrap, prefix=topics.prefix)
    changelog = table_changelog(app_id(WorkerSettings(kafka_bootstrap, topics=topics)))
    worker = [
        "worker",
        "--bootstrap", kafka_bootstrap,
        "--topic-prefix", topics.prefix,
        "--method", "admm",
        "--admm-interval", "0.1",
        "--partitions", str(N),
        "--datadir", str(tmp_path / "faust"),
        "--loglevel", "info",  # Faust's rebalances and recoveries, for `worker_story`
    ]  # fmt: skip
    started = time.monotonic()
    records: list[ConsensusRecord] = []
    with child_process(worker, tmp_path / "worker.log"):
        result = TraceReplayer(jobs, kafka_bootstrap, topics=topics, progress=False).run()
        assert result.delivery_failures == 0
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            time.sleep(1.0)
            try:
                records = [ConsensusRecord.decode(v) for v in read_topic(kafka_bootstrap, changelog) if v]
            except Exception:  # the worker has not created the changelog yet
                continue
            last = records[-1] if records else None
            if last and last.rows == sum(d.n for d in raw) and np.max(np.abs(last.z - z_ref)) <= CONVERGED:
                break
        elapsed = time.monotonic() - started
        markers = [e for v in read_topic(kafka_bootstrap, topics.predictions) for e in decode_each(v)]
        messages = [RoundMessage.decode(v) for v in read_topic(kafka_bootstrap, topics.admm_online_exchange)]
    assert records, "no consensus round was published"
    final = records[-1]
    print(f"ADMM in the worker: {final.round} rounds in {elapsed:.1f}s, |z - z_ref| = "
          f"{float(np.max(np.abs(final.z - z_ref))):.2e}")  # fmt: skip
    expected = {p: d.n for p, d in enumerate(raw) if d.n}
    sent_rows = {m.node: m.rows for m in messages if m is not None and m.round == final.round and m.rows}
    assert final.rows == sum(d.n for d in raw), (
        f"rows per node, expected {expected}, in round {final.round} {sent_rows}\n"
        + worker_story(kafka_bootstrap, topics.dead_letters, tmp_path / "worker.log")
    )
    np.testing.assert_allclose(final.moments, pooled, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(final.z, z_ref, rtol=0, atol=CONVERGED)
    sent = [m for m in messages if m is not None]
    assert {m.node for m in sent} == set(range(N)), "every node's messages went over the exchange topic"
    with_rows = {m.node for m in sent if m.round == final.round}
    assert with_rows == set(range(N))
    assert {m.node for m in sent if m.rows > 0} == {partition_of(j.job_id, N) for j in jobs}
    assert any(isinstance(e, CheckpointEvaluated) for e in markers), "the agent went on evaluating"


def test_a_job_predicts_with_the_latest_consensus_and_no_straggler_before_round_1() -> None:
    from scipy import special

    from straggler.core.admm import Admm
    from straggler.core.admm_online import use_consensus
    from straggler.core.method import CheckpointData

    X = np.array([[0.0, 1.0], [3.0, -1.0], [-2.0, 0.5]])
    moments = node_moments(np.array([[0.0, 0.0], [2.0, 4.0], [1.0, -1.0]]))
    z = np.array([2.0, -0.5, 0.3])
    data = CheckpointData(np.zeros((0, 2)), np.zeros(0), X, np.zeros(3), 10.0, 5)
    method = Admm()
    for round_ in (0, 1):
        record = ConsensusRecord(round_, 2, z, moments, moments, 3, 0.0, 0.0, 0.0)
        use_consensus(method, record, 2)
        scores = method.predict(data)
        if round_ == 0:
            assert not scores.is_straggler.any()  # z of round 0 is not fitted on data yet
        else:
            scaler = standardiser_from_moments([moments])
            p = special.expit(scaler.transform(X) @ z[:-1] + z[-1])
            np.testing.assert_allclose(method.straggler_probability(X), p)
            assert np.array_equal(scores.is_straggler, p >= 0.5) and scores.is_straggler.any()
