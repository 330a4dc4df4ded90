"""A foreign producer end to end (issue 14, point 4): kcat writes JSON lines with librdkafka's default
partitioner (``consistent_random``: CRC32 of the key, not murmur2) into a pipeline of two workers and
the mitigation consumer on a real broker; kcat reads predictions, commands and dead letters back.

Every job's id is chosen so kcat puts it on another partition than murmur2 does: without forwarding
(`straggler.kafka.routing`), a live job whose two partitions belong to different workers never gets a
prediction (its timer boundaries land where its job_event is unknown, and are dead-lettered).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from harness.consumer_groups import wait_for_stable_group
from harness.small_jobs import make_job

import producers.replayer as replayer_module
from pipeline.settings import WorkerSettings, app_id
from producers.replayer import TraceReplayer
from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    JobEvent,
    Prediction,
    RelaunchCommand,
    TaskCheckpoint,
    command_id,
    decode,
    decode_each,
    encode,
)
from straggler.core.partitioner import partition_of
from straggler.core.policies import Unlimited
from straggler.evaluation import EvaluationConfig, method_decisions
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import child_process

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.scenario]
N = 8
KCAT = shutil.which("kcat")
Record = tuple[str, str, bytes]
"""(topic, key, value) as a producer would send it."""


def crc32_partition(job_id: str) -> int:
    """Where kcat (librdkafka's ``consistent_random``) puts a record keyed by ``job_id``."""
    return zlib.crc32(job_id.encode()) % N


def misplaced_ids(stem: str, count: int, avoid: set[int]) -> list[str]:
    """Job ids kcat and murmur2 place apart, on murmur2 partitions not in ``avoid`` (which grows)."""
    ids: list[str] = []
    for i in range(10_000):
        job_id = f"{stem}-{i}"
        home = partition_of(job_id, N)
        if crc32_partition(job_id) != home and home not in avoid:
            ids.append(job_id)
            avoid.add(home)
            if len(ids) == count:
                return ids
    raise AssertionError(f"not {count} ids for {stem}")


class _Capture:
    """Stands in for confluent-kafka's Producer: the replayer's records, in send order, kept here."""

    records: ClassVar[list[Record]] = []

    def __init__(self, config: object) -> None:
        pass

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Callable[..., None]) -> None:
        self.records.append((topic, key.decode(), value))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        described = type("T", (), {"error": None, "partitions": {p: None for p in range(N)}})()
        return type("M", (), {"topics": {topic: described}})()


def replayed_records(
    traces: Sequence[Any], topics: TopicNames, monkeypatch: pytest.MonkeyPatch
) -> list[Record]:
    """What the replayer would send for ``traces`` (open loop), captured instead of produced."""
    _Capture.records = []
    monkeypatch.setattr(replayer_module, "Producer", _Capture)
    TraceReplayer(traces, "unused:9092", topics=topics, progress=False).run()
    monkeypatch.undo()
    return list(_Capture.records)


def live_records(job_id: str, topics: TopicNames, seed: int) -> list[Record]:
    """A live job as a telemetry producer reports it: started without boundaries, tasks, finishes."""
    rng = np.random.default_rng(seed)
    now = time.time()
    started = JobEvent(
        job_id=job_id, event="started", time=now - 60, expected_tasks=40, sends_boundaries=False
    )
    records: list[Record] = [(topics.job_events, job_id, encode(started))]
    for i in range(40):
        running = TaskCheckpoint(
            job_id=job_id,
            task_id=f"t{i}",
            attempt=0,
            checkpoint_time=now,
            status="running",
            machine_id=f"m{i % 5}",
            features={"cpu": float(rng.random())},
            start_time=now - 30,
        )
        records.append((topics.checkpoints, job_id, encode(running)))
    for i in range(8):
        finished = TaskCheckpoint(
            job_id=job_id,
            task_id=f"t{i}",
            attempt=0,
            checkpoint_time=now - 10 + i,
            status="finished",
            machine_id=f"m{i % 5}",
            features={"cpu": float(rng.random())},
            latency=20.0 + i,
            start_time=now - 30,
        )
        records.append((topics.checkpoints, job_id, encode(finished)))
    return records


def kcat_produce(bootstrap: str, topic: str, records: Sequence[Record]) -> None:
    """``kcat -P -K<tab>``: one ``key<tab>json`` line per record, librdkafka's default partitioner."""
    lines = b"".join(key.encode() + b"\t" + value + b"\n" for t, key, value in records if t == topic)
    assert lines, f"nothing for {topic}"
    subprocess.run(
        [str(KCAT), "-b", bootstrap, "-P", "-t", topic, "-K", "\t"], input=lines, check=True, timeout=60
    )


def kcat_read(bootstrap: str, topic: str) -> list[tuple[str, int, bytes]]:
    """``kcat -C -e``: every record of ``topic`` as (key, partition, value), read to the end."""
    out = subprocess.run(
        [str(KCAT), "-b", bootstrap, "-C", "-t", topic, "-e", "-q", "-f", "%k\t%p\t%s\n"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    rows = []
    for line in out.splitlines():
        if line:
            key, partition, value = line.split(b"\t", 2)
            rows.append((key.decode(), int(partition), value))
    return rows


def test_kcat_jobs_are_all_predicted_by_two_workers_without_dead_letters(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert KCAT is not None, "kcat is not installed: run scripts/setup.sh as root, or apt-get install kcat"
    topics = TopicNames(f"kcat-{uuid.uuid4().hex[:8]}-")
    create_topics(kafka_bootstrap, N, prefix=topics.prefix)
    homes: set[int] = set()
    replayed_ids = misplaced_ids("batch", 2, homes)
    live_ids = misplaced_ids("golf", 4, homes)
    for job_id in replayed_ids + live_ids:  # the premise: kcat misplaces every one of them
        assert crc32_partition(job_id) != partition_of(job_id, N), job_id
    traces = [
        make_job(160, seed=11, job_id=replayed_ids[0], signal=0.5),
        make_job(120, seed=12, job_id=replayed_ids[1], signal=0.3, slow_group=0.1, interval=4.0),
    ]
    replayed = replayed_records(traces, topics, monkeypatch)
    started = [r for r in replayed if r[0] == topics.job_events and b'"started"' in r[2]]
    ended = [r for r in replayed if r[0] == topics.job_events and b'"ended"' in r[2]]
    tasks = [r for r in replayed if r[0] == topics.checkpoints]
    live = [r for seed, job_id in enumerate(live_ids) for r in live_records(job_id, topics, seed)]

    expected_markers = {(t.job_id, float(c)) for t in traces for c in t.checkpoints}
    config = EvaluationConfig(methods=("nurd",), threshold="online")
    policy = Unlimited()
    expected_commands = set()
    for trace in traces:
        for verdicts in method_decisions(trace, "nurd", config):
            if not verdicts:
                continue
            for action in policy.on_checkpoint(trace.job_id, verdicts[0].checkpoint_time, verdicts):
                expected_commands.add(
                    command_id(action.job_id, action.task_id, action.action, action.decision_key)
                )
    assert expected_commands, "the replayed jobs must contain stragglers"

    logs = tmp_path
    common = ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.prefix]

    def worker(n: int) -> list[str]:
        datadir = str(logs / f"faust-{n}")
        return ["worker", *common, "--datadir", datadir, "--live-interval", "2", "--pending-grace", "30"]

    mitigator = ["mitigate", *common, "--policy", "unlimited", "--group", f"{topics.prefix}mitigation"]
    group = app_id(WorkerSettings(bootstrap=kafka_bootstrap, topics=topics))
    with (
        child_process(worker(1), logs / "worker-1.log"),
        child_process(worker(2), logs / "worker-2.log"),
        child_process([*mitigator, "--checkpoint-seconds", "10"], logs / "mitigator.log"),
    ):
        wait_for_stable_group(kafka_bootstrap, group, 2, timeout=180.0)
        kcat_produce(kafka_bootstrap, topics.job_events, started + live)
        kcat_produce(kafka_bootstrap, topics.checkpoints, tasks + live)
        kcat_produce(kafka_bootstrap, topics.job_events, ended)

        deadline = time.monotonic() + 150.0
        while True:
            events = [e for _, _, v in kcat_read(kafka_bootstrap, topics.predictions) for e in decode_each(v)]
            markers = [e for e in events if isinstance(e, CheckpointEvaluated)]
            seen = {(m.job_id, m.checkpoint_time) for m in markers}
            live_done = {m.job_id for m in markers if m.job_id in live_ids and m.evaluated > 0}
            commands = [e for _, _, v in kcat_read(kafka_bootstrap, topics.commands) for e in decode_each(v)]
            issued = {c.command_id for c in commands if isinstance(c, RelaunchCommand)}
            done = expected_markers <= seen and live_done == set(live_ids) and expected_commands <= issued
            if done or time.monotonic() > deadline:
                break
            time.sleep(2.0)
        letters = [e for _, _, v in kcat_read(kafka_bootstrap, topics.dead_letters) for e in decode_each(v)]
        inputs = kcat_read(kafka_bootstrap, topics.checkpoints)

    reasons = sorted({e.error for e in letters if isinstance(e, DeadLetter)})
    predicted = {e.job_id for e in events if isinstance(e, Prediction)}
    missing = sorted(set(live_ids + replayed_ids) - predicted)
    assert not missing, f"jobs never predicted: {missing}; dead letters: {reasons}"
    assert live_done == set(live_ids), f"live jobs never evaluated: {sorted(set(live_ids) - live_done)}"
    assert not expected_markers - seen, f"checkpoints never evaluated: {sorted(expected_markers - seen)[:5]}"
    assert letters == [], f"dead letters: {reasons}"
    assert issued == expected_commands
    assert len(issued) == len(commands), "a relaunch command was produced twice"

    # kcat put each job's records on its CRC32 partition; the worker copied them, once and in order,
    # to its murmur2 partition, where the timer's boundaries of the live jobs are too
    for job_id in live_ids + replayed_ids:
        sent = [value for topic, key, value in tasks + live if key == job_id and topic == topics.checkpoints]
        on = defaultdict(list)
        for key, partition, value in inputs:
            if key == job_id and not (
                isinstance(e := decode(value), CheckpointBoundary) and e.origin == "timer"
            ):
                on[partition].append(value)
        assert set(on) == {crc32_partition(job_id), partition_of(job_id, N)}, job_id
        assert on[crc32_partition(job_id)] == sent, job_id
        assert on[partition_of(job_id, N)] == sent, job_id
