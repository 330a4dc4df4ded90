"""The Dask adapter, telemetry plugin and command executor on a real broker and a real `LocalCluster`
(worker processes under nannies, one thread each): a hung task is copied and its future gets the
copy's result, the hung loser's slot is freed; telemetry reports the attempts where they run; an
executor killed and restarted applies every command once; unknown tasks are skipped and counted;
malformed commands are dead-lettered with their reason."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import cloudpickle
import pytest
from confluent_kafka import Producer
from distributed import Client, LocalCluster
from test_telemetry import read_all

from consumers.dask_executor import DaskExecutor
from producers.dask_job import SpeculativeClient
from producers.dask_telemetry import FEATURE_NAMES
from schemas import JobEvent, RelaunchCommand, TaskCheckpoint, command_id, encode
from schemas.events import Action
from straggler.dask_tasks import cancelled
from straggler.kafka.config import producer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("dask")]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import this module

WORKERS = 3
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        n_workers=WORKERS, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as local:
        yield local


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster, set_as_default=False) as dask_client:
        dask_client.wait_for_workers(WORKERS, timeout=WAIT_S)
        yield dask_client


@pytest.fixture
def topics(kafka_bootstrap: str, fresh_topic_prefix: str) -> TopicNames:
    create_topics(kafka_bootstrap, partitions=2, prefix=fresh_topic_prefix)
    return TopicNames(fresh_topic_prefix)


def hang_the_first_time(marker: str, x: int) -> int:
    """A straggler: the first attempt (the one that makes the marker) hangs without ever checking
    `cancelled()`, so only a worker restart stops it; any later attempt returns at once."""
    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return x * 10
    time.sleep(600)
    return -1


def run_until_cancelled(seconds: float) -> str:
    """A long task that checks `cancelled()`, as the docs ask, so a kill frees its slot at once."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not cancelled():
        time.sleep(0.02)
    return "done"


def send(bootstrap: str, topic: str, key: str, *payloads: bytes) -> None:
    producer = Producer(producer_config(bootstrap))
    for payload in payloads:
        producer.produce(topic, payload, key.encode())
    assert producer.flush(30) == 0


def command(job_id: str, task_id: str, action: Action, attempt: int, decision: int = 0) -> RelaunchCommand:
    return RelaunchCommand(
        command_id=command_id(job_id, task_id, action, decision),
        job_id=job_id,
        task_id=task_id,
        action=action,
        reason="test",
        policy="speculate",
        issued_at=time.time(),
        checkpoint_time=0.0,
        attempt=attempt,
    )


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class ExecutorThread:
    """A `DaskExecutor` running in a thread of the test, stopped on leaving."""

    def __init__(self, executor: DaskExecutor) -> None:
        self.executor, self.stop = executor, threading.Event()
        self.thread = threading.Thread(target=executor.run, kwargs={"stop": self.stop}, daemon=True)

    def __enter__(self) -> DaskExecutor:
        self.thread.start()
        return self.executor

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_a_hung_task_is_copied_its_future_gets_the_copys_result_and_the_kill_frees_its_slot(
    kafka_bootstrap: str, topics: TopicNames, client: Client, cluster: LocalCluster, tmp_path: Path
) -> None:
    job_id = f"dask-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "first-attempt"
    executor = DaskExecutor(kafka_bootstrap, cluster.scheduler_address, topics=topics, kill_grace=0.5)
    with (
        ExecutorThread(executor),
        SpeculativeClient(client, kafka_bootstrap, topic_prefix=topics.prefix, interval=0.3) as speculative,
        speculative.job(job_id, expected_tasks=2) as job,
    ):
        quick = job.submit(run_until_cancelled, 0.0, task_id="quick")
        hung = job.submit(hang_the_first_time, str(marker), 7, task_id="hung")
        assert quick.result(WAIT_S) == "done"
        wait_for(marker.exists, "the hung attempt to start")
        time.sleep(1.0)  # a few running reports of the hung attempt
        send(kafka_bootstrap, topics.commands, job_id, encode(command(job_id, "hung", "duplicate", 0)))
        assert hung.result(WAIT_S) == 70  # the copy's result: the original never returns
        assert hung.winner == 1
        send(kafka_bootstrap, topics.commands, job_id, encode(command(job_id, "hung", "kill", 0)))
        wait_for(lambda: executor.stats.applied == 2, "the kill")
        kills = {
            name: executor.metrics.registry.get_sample_value(
                f"straggler_executor_kill_seconds_{name}", {"freed_by": "restart"}
            )
            for name in ("count", "sum")
        }
        assert kills["count"] == 1  # it never checks cancelled(): its worker was restarted
        assert kills["sum"] is not None and kills["sum"] < 30.0  # and the slot came back in seconds
        client.wait_for_workers(WORKERS, timeout=WAIT_S)
    assert executor.stats.copies_won == 1 and executor.stats.extra_machine_seconds > 0

    reports = [event for _, event in read_all(kafka_bootstrap, topics.checkpoints)]
    hung_reports = [r for r in reports if isinstance(r, TaskCheckpoint) and r.task_id == "hung"]
    original = [r for r in hung_reports if r.attempt == 0]
    copy = [r for r in hung_reports if r.attempt == 1]
    assert len(original) >= 3 and {r.status for r in original} == {"running"}  # it never ended by itself
    assert len({r.machine_id for r in original}) == 1 and original[0].machine_id != copy[0].machine_id
    assert copy[-1].status == "finished" and copy[-1].latency is not None and copy[-1].latency < 5.0
    assert all(r.start_time == original[0].start_time for r in original)
    assert set(original[0].features) == set(FEATURE_NAMES)
    assert original[0].features["input_mb"] > 0 and original[0].features["memory_mb"] > 10
    events = [event for _, event in read_all(kafka_bootstrap, topics.job_events)]
    assert [e.event for e in events if isinstance(e, JobEvent) and e.job_id == job_id] == ["started", "ended"]
