"""The Dask adapter, telemetry plugin and command executor on a real broker and a real `LocalCluster`
(worker processes under nannies, one thread each): a hung task is copied and its future gets the
copy's result, the hung loser's slot is freed; telemetry reports the attempts where they run; an
executor killed and restarted applies every command once; unknown tasks are skipped and counted;
malformed commands are dead-lettered with their reason."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import cloudpickle
import dask
import orjson
import pytest
from confluent_kafka import Producer
from distributed import Client, LocalCluster
from test_telemetry import read_all

from consumers.dask_executor import DaskExecutor
from producers.dask_job import SpeculativeClient, SpeculativeJob
from producers.dask_telemetry import FEATURE_NAMES
from schemas import DeadLetter, JobEvent, RelaunchCommand, TaskCheckpoint, command_id, encode
from schemas.events import Action
from straggler.dask_tasks import TaskRecord, cancelled, task_record_name
from straggler.kafka.config import producer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics

pytestmark = [pytest.mark.broker, pytest.mark.scenario, pytest.mark.xdist_group("dask")]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import this module

WORKERS = 3
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # A LocalCluster closes a worker's nanny for good when, `lost-worker-timeout` after the worker
    # left, none of its name is registered: these tests restart and kill workers, sometimes 15 s apart.
    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as local,
    ):
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
        checkpoint_time=0.0,  # long before any run: only a run Dask made again after a death is compared
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


@contextlib.contextmanager
def job_under(
    executor: DaskExecutor, client: Client, tasks: int, interval: float = 2.0
) -> Iterator[SpeculativeJob]:
    """A new job of the adapter (telemetry every ``interval`` s) whose commands ``executor``, running
    in a thread meanwhile, carries out."""
    topic_prefix = executor.topics.prefix
    with (
        ExecutorThread(executor),
        SpeculativeClient(
            client, executor.bootstrap, topic_prefix=topic_prefix, interval=interval
        ) as speculative,
        speculative.job(f"dask-{uuid.uuid4().hex[:8]}", expected_tasks=tasks) as job,
    ):
        yield job


def count_run(directory: str, x: int) -> int:
    """Leaves a file for each run, so a test can tell a result computed twice."""
    (Path(directory) / f"{x}-{uuid.uuid4().hex}").touch()
    return x


def count_run_after(seconds: float, directory: str, x: int) -> int:
    """`count_run`, after ``seconds``: long enough that waiting for it polls for a while."""
    time.sleep(seconds)
    return count_run(directory, x)


def test_a_hung_task_is_copied_its_future_gets_the_copys_result_and_the_kill_frees_its_slot(
    kafka_bootstrap: str, topics: TopicNames, client: Client, cluster: LocalCluster, tmp_path: Path
) -> None:
    marker = tmp_path / "first-attempt"
    runs = tmp_path / "runs"
    runs.mkdir()
    # a finished result on every worker, the hung attempt's among them: its restart must not lose it
    held = [
        client.submit(count_run, str(runs), i, workers=[address], pure=False)
        for i, address in enumerate(sorted(client.scheduler_info()["workers"]))
    ]
    assert client.gather(held) == list(range(WORKERS))
    executor = DaskExecutor(kafka_bootstrap, cluster.scheduler_address, topics=topics, kill_grace=4.0)
    with job_under(executor, client, tasks=2, interval=0.3) as job:
        job_id = job.job_id
        quick = job.submit(run_until_cancelled, 0.0, task_id="quick")
        hung = job.submit(hang_the_first_time, str(marker), 7, task_id="hung")
        assert quick.result(WAIT_S) == "done"
        wait_for(marker.exists, "the hung attempt to start")
        time.sleep(1.0)  # a few running reports of the hung attempt
        send(kafka_bootstrap, topics.commands, job_id, encode(command(job_id, "hung", "duplicate", 0)))
        assert hung.result(WAIT_S) == 70  # the copy's result: the original never returns
        assert hung.winner == 1
        kill, next_command = command(job_id, "hung", "kill", 0), command(job_id, "quick", "duplicate", 0)
        send(kafka_bootstrap, topics.commands, job_id, encode(kill), encode(next_command))

        def restarts(name: str = "count") -> float | None:
            return executor.metrics.registry.get_sample_value(
                f"straggler_executor_kill_seconds_{name}", {"freed_by": "restart"}
            )

        wait_for(lambda: executor.stats.consumed == 3, "the kill and the next command")
        # the next command (a skip: quick has finished) was handled within the kill's grace: the
        # executor does not wait for a killed attempt's slot before it carries on
        assert (executor.stats.applied, executor.stats.skipped, restarts()) == (2, 1, 0)
        wait_for(lambda: restarts() == 1, "the hung attempt's worker to be restarted")
        # it never checks cancelled(), so its worker was restarted, and the slot came back in seconds
        took = restarts("sum")
        assert took is not None and took < 30.0
        client.wait_for_workers(WORKERS, timeout=WAIT_S)
    assert executor.stats.copies_won == 1 and executor.stats.extra_machine_seconds > 0
    assert [f.result(WAIT_S) for f in held] == list(range(WORKERS))
    assert sorted(p.name.split("-")[0] for p in runs.iterdir()) == [str(i) for i in range(WORKERS)]

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
    checkpoints = [r for r in reports if isinstance(r, TaskCheckpoint)]
    for machine in {r.machine_id for r in checkpoints}:  # a worker's past: 0 until an attempt finished there
        finished_here = False
        for report in sorted(
            (r for r in checkpoints if r.machine_id == machine), key=lambda r: r.checkpoint_time
        ):
            assert (report.features["worker_recent_s"] > 0) == finished_here, report
            finished_here |= report.status == "finished"
    events = [event for _, event in read_all(kafka_bootstrap, topics.job_events)]
    assert [e.event for e in events if isinstance(e, JobEvent) and e.job_id == job_id] == ["started", "ended"]


def exit_on_the_first_run(marker: str) -> None:
    """The first run (it makes ``marker``) kills its worker's process mid-task (its nanny starts a
    fresh one); a later run returns."""
    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return
    time.sleep(0.5)
    os._exit(1)


def die_the_first_time(marker: str, x: int) -> int:
    """The first attempt kills its worker's process mid-task; Dask's run of it elsewhere returns."""
    exit_on_the_first_run(marker)
    return x * 10


def test_a_job_whose_worker_dies_mid_task_completes_as_with_dask_alone(
    kafka_bootstrap: str, topics: TopicNames, client: Client, cluster: LocalCluster, tmp_path: Path
) -> None:
    """Dask runs a task lost with its worker again elsewhere; every argument an attempt needs must
    survive that worker (a call scattered to it once did not, and the job waited forever)."""
    marker = tmp_path / "first-attempt"
    with (
        SpeculativeClient(client, kafka_bootstrap, topic_prefix=topics.prefix, interval=0.5) as speculative,
        speculative.job(f"dies-{uuid.uuid4().hex[:8]}", expected_tasks=4) as job,
    ):
        futures = [job.submit(die_the_first_time, str(marker), 7, task_id="dies")]
        futures += [job.submit(run_until_cancelled, 0.5, task_id=f"peer-{i}") for i in range(3)]
        assert job.gather(futures, timeout=WAIT_S) == [70, "done", "done", "done"]
    assert marker.exists(), "the first attempt ran, and its worker died"
    client.wait_for_workers(WORKERS, timeout=WAIT_S)


def _job_keys(job_id: str, dask_scheduler: Any = None) -> list[Any]:
    """The keys of ``job_id``'s attempts the scheduler still holds (runs on the scheduler)."""
    return [key for key in dask_scheduler.tasks if isinstance(key, tuple) and job_id in key]


def test_a_job_that_ended_leaves_only_its_winners_results_on_the_cluster(
    kafka_bootstrap: str, topics: TopicNames, client: Client, tmp_path: Path
) -> None:
    """Its futures dropped, a job's results leave the workers at once, not when Python's garbage
    collector happens to run (a worker that died later made Dask compute them all again); a task
    not done when its job ended raises `CancelledError` rather than wait forever. The tasks take a
    while, so their results are waited for through several polls (a poll that timed out once kept
    its future alive until the garbage collector ran)."""
    gc.disable()  # what the job leaves must go by reference counting alone
    try:
        with SpeculativeClient(client, kafka_bootstrap, topic_prefix=topics.prefix) as speculative:
            with speculative.job(f"ended-{uuid.uuid4().hex[:8]}", expected_tasks=4) as job:
                job_id = job.job_id
                futures = [job.submit(count_run_after, 1.0, str(tmp_path), i) for i in range(3)]
                unfinished = job.submit(run_until_cancelled, 600.0, task_id="unfinished")
                assert job.gather(futures, timeout=WAIT_S) == [0, 1, 2]
            kept = futures[1]
            del futures, job
            wait_for(
                lambda: client.run_on_scheduler(_job_keys, job_id) == [kept.attempts[0].key],
                "the scheduler to forget every attempt but the kept future's",
                timeout=10.0,
            )
            assert kept.result(WAIT_S) == 1
            with pytest.raises(CancelledError, match="not done when its job ended"):
                unfinished.result(WAIT_S)
    finally:
        gc.enable()


def die_then_run_until_cancelled(marker: str, rerun: str) -> str:
    """The first run kills its worker's process; Dask runs the attempt again elsewhere, and that run
    (it makes ``rerun``) goes on until it is cancelled."""
    exit_on_the_first_run(marker)
    Path(rerun).touch()
    return run_until_cancelled(60.0)


def test_a_copy_decided_before_dask_ran_the_attempt_again_is_skipped(
    kafka_bootstrap: str, topics: TopicNames, client: Client, cluster: LocalCluster, tmp_path: Path
) -> None:
    """The stream decided on the run that died with its worker; Dask's new run of the same attempt
    has not been seen straggling, so the copy is skipped as ``restarted``. Decided after the new run
    began, the same copy is made."""
    marker, rerun = tmp_path / "first-run", tmp_path / "rerun"
    executor = DaskExecutor(kafka_bootstrap, cluster.scheduler_address, topics=topics)
    with job_under(executor, client, tasks=1) as job:
        job_id = job.job_id
        task = job.submit(die_then_run_until_cancelled, str(marker), str(rerun), task_id="dies")
        wait_for(marker.exists, "the first run")
        decided = time.time()  # before the new run: the first one is still going, or just died
        wait_for(rerun.exists, "Dask's new run of the attempt")
        stale = dataclasses.replace(command(job_id, "dies", "duplicate", 0), checkpoint_time=decided)
        send(kafka_bootstrap, topics.commands, job_id, encode(stale))
        wait_for(lambda: executor.stats.consumed == 1, "the stale copy")
        assert (executor.stats.applied, executor.stats.skipped) == (0, 1)
        skips = executor.metrics.registry.get_sample_value
        assert skips("straggler_executor_skips_total", {"kind": "restarted"}) == 1
        fresh = dataclasses.replace(
            command(job_id, "dies", "duplicate", 0, decision=1), checkpoint_time=time.time()
        )
        send(kafka_bootstrap, topics.commands, job_id, encode(fresh))
        wait_for(lambda: executor.stats.applied == 1, "the copy decided on the new run")
        assert task.result(WAIT_S) == "done"
    client.wait_for_workers(WORKERS, timeout=WAIT_S)


def wait_until_cancelled_the_first_time(marker: str, x: int) -> int:
    """A straggler that checks `cancelled()`: the first attempt waits until it is stopped."""
    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return x * 10
    return -1 if run_until_cancelled(600) else -2


def test_a_relaunch_restarts_the_task_and_a_cooperative_attempt_frees_its_slot_without_a_restart(
    kafka_bootstrap: str, topics: TopicNames, client: Client, cluster: LocalCluster, tmp_path: Path
) -> None:
    marker = tmp_path / "first-attempt"
    executor = DaskExecutor(kafka_bootstrap, cluster.scheduler_address, topics=topics, kill_grace=10.0)
    with job_under(executor, client, tasks=1) as job:
        job_id = job.job_id
        slow = job.submit(wait_until_cancelled_the_first_time, str(marker), 4, task_id="slow")
        wait_for(marker.exists, "the first attempt to start")
        send(kafka_bootstrap, topics.commands, job_id, encode(command(job_id, "slow", "relaunch", 0)))
        assert slow.result(WAIT_S) == 40
        assert slow.winner == 1 and slow.attempts[0].status == "cancelled"
        wait_for(lambda: executor.stats.applied == 1, "the relaunch")
    registry = executor.metrics.registry
    freed = {"freed_by": "returned"}
    # The attempt saw cancelled() and returned within the kill grace: its slot was freed by its own
    # thread, and the worker was not restarted (how long that took is a benchmark's figure, not this test's).
    assert registry.get_sample_value("straggler_executor_kill_seconds_count", freed) == 1
    assert registry.get_sample_value("straggler_executor_kill_seconds_count", {"freed_by": "restart"}) == 0


def test_commands_for_unknown_finished_side_effecting_or_ended_tasks_are_skipped_and_counted(
    kafka_bootstrap: str,
    topics: TopicNames,
    client: Client,
    cluster: LocalCluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    executor = DaskExecutor(kafka_bootstrap, cluster.scheduler_address, topics=topics)
    with (
        caplog.at_level("INFO", logger="consumers.dask_executor"),
        job_under(executor, client, tasks=2) as job,
    ):
        job_id = job.job_id
        assert job.submit(run_until_cancelled, 0.0, task_id="done").result(WAIT_S) == "done"
        writer = job.submit(run_until_cancelled, 60.0, task_id="writes", pure=False)  # side effects
        skips = {
            "unknown_task": command("no-such-job", "t", "duplicate", 0),
            "finished_task": command(job_id, "done", "duplicate", 0),
            "not_copyable": command(job_id, "writes", "duplicate", 0),
        }
        for skipped_command in skips.values():
            send(kafka_bootstrap, topics.commands, skipped_command.job_id, encode(skipped_command))
        wait_for(lambda: executor.stats.consumed == 3, "the three commands")
        job.poll_added_attempts()
        record = TaskRecord.from_published(client.get_dataset(task_record_name(job_id, "writes")))
        assert sorted(writer.attempts) == [0] and record is not None and sorted(record.attempts) == [0]
        # the job ending: the adapter drops its records first, then cancels the attempts still running;
        # a kill in between, of an attempt the executor saw running, finds it ended with its job
        client.unpublish_dataset(task_record_name(job_id, "writes"))
        skips["ended_attempt"] = command(job_id, "writes", "kill", 0)
        send(kafka_bootstrap, topics.commands, job_id, encode(skips["ended_attempt"]))
        wait_for(lambda: executor.stats.consumed == 4, "the kill as the job ends")
    assert (executor.stats.applied, executor.stats.skipped) == (0, 4)
    registry = executor.metrics.registry
    for kind in skips:
        assert registry.get_sample_value("straggler_executor_skips_total", {"kind": kind}) == 1, kind
    assert registry.get_sample_value("straggler_executor_skipped_total") == 4
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    for kind, skipped_command in skips.items():
        assert any(f"{skipped_command.command_id[:12]}:" in line and f"({kind})" in line for line in lines), (
            lines
        )


def test_a_malformed_command_is_dead_lettered_with_its_reason(
    kafka_bootstrap: str, topics: TopicNames, cluster: LocalCluster
) -> None:
    valid = command("j", "t", "duplicate", 0).to_dict()
    no_action = orjson.dumps({k: v for k, v in valid.items() if k != "action"})
    bad_action = orjson.dumps({**valid, "action": "explode"})
    send(kafka_bootstrap, topics.commands, "j", b"not json", no_action, bad_action)
    executor = DaskExecutor(kafka_bootstrap, cluster.scheduler_address, topics=topics)
    with ExecutorThread(executor):
        wait_for(lambda: executor.stats.consumed == 3, "the three records")
    assert (executor.stats.dead_letters, executor.stats.applied, executor.stats.skipped) == (3, 0, 0)
    letters = [event for _, event in read_all(kafka_bootstrap, topics.dead_letters)]
    assert all(isinstance(letter, DeadLetter) and letter.stage == "executor" for letter in letters)
    by_payload = {letter.raw_payload: letter for letter in letters if isinstance(letter, DeadLetter)}
    assert set(by_payload) == {"not json", no_action.decode(), bad_action.decode()}
    assert "not valid JSON" in by_payload["not json"].error
    assert "relaunch_command.action" in by_payload[no_action.decode()].error
    assert "required" in by_payload[no_action.decode()].error
    assert "relaunch_command.action" in by_payload[bad_action.decode()].error
    assert sorted(letter.source_offset for letter in by_payload.values()) == [0, 1, 2]
    assert {letter.source_topic for letter in by_payload.values()} == {topics.commands}
    registry = executor.metrics.registry
    assert registry.get_sample_value("straggler_executor_dead_letters_total", {"kind": "payload"}) == 1
    assert registry.get_sample_value("straggler_executor_dead_letters_total", {"kind": "schema"}) == 2


class ExecutorProcess:
    """``straggler dask-executor`` as a process of its own, its log lines collected as they come."""

    def __init__(self, bootstrap: str, scheduler: str, topics: TopicNames, group: str, *extra: str) -> None:
        argv = ["--bootstrap", bootstrap, "--scheduler", scheduler, "--topic-prefix", topics.prefix]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "straggler.cli", "dask-executor", *argv, "--group", group, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        self.lines.extend(iter(self.process.stderr.readline, ""))

    def applied(self, commands: list[RelaunchCommand]) -> list[str]:
        """The ids of ``commands`` this process logged as applied, once per log line."""
        return [
            c.command_id
            for c in commands
            for line in self.lines
            if f"command {c.command_id[:12]}: applied" in line
        ]

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Send ``sig``, wait for the exit; return what it printed on stdout."""
        self.process.send_signal(sig)
        stdout, _ = self.process.communicate(timeout=WAIT_S)
        self._reader.join(10)
        return stdout


def test_a_killed_and_restarted_executor_applies_every_command_once(
    kafka_bootstrap: str, topics: TopicNames, client: Client, cluster: LocalCluster
) -> None:
    job_id = f"dask-{uuid.uuid4().hex[:8]}"
    group = f"{topics.prefix}executor"
    scheduler = cluster.scheduler_address
    with (
        SpeculativeClient(client, kafka_bootstrap, topic_prefix=topics.prefix) as speculative,
        speculative.job(job_id, expected_tasks=4) as job,
    ):
        tasks = [f"t{i}" for i in range(4)]
        for task_id in tasks:
            job.submit(run_until_cancelled, 120.0, task_id=task_id)
        commands = [command(job_id, task_id, "duplicate", 0) for task_id in tasks]

        first = ExecutorProcess(kafka_bootstrap, scheduler, topics, group)
        send(kafka_bootstrap, topics.commands, job_id, *(encode(c) for c in commands[:2]))
        wait_for(lambda: len(first.applied(commands)) == 2, "the first executor to apply two commands")
        first.stop(signal.SIGKILL)  # no clean exit: whatever it had not committed comes again
        send(kafka_bootstrap, topics.commands, job_id, *(encode(c) for c in commands[2:]))
        second = ExecutorProcess(kafka_bootstrap, scheduler, topics, group)
        wait_for(
            lambda: len(first.applied(commands) + second.applied(commands)) >= 4,
            "the rest, after the restart",
        )
        assert second.process.poll() is None
        assert second.stop() != ""  # a clean stop prints its counts

        # every command again, to an executor of a new group: the ids are known on the cluster
        again = ExecutorProcess(kafka_bootstrap, scheduler, topics, f"{group}-again", "--idle-timeout", "2")
        assert again.process.wait(WAIT_S) == 0
        again._reader.join(10)
        stats = orjson.loads(again.process.communicate()[0])

        applied = first.applied(commands) + second.applied(commands) + again.applied(commands)
        assert sorted(applied) == sorted(c.command_id for c in commands)  # each once: none twice, none lost
        assert (stats["consumed"], stats["applied"], stats["skipped"]) == (4, 0, 4)
        assert sum("skipped (applied)" in line for line in again.lines) == 4
        for task_id in tasks:
            record = TaskRecord.from_published(client.get_dataset(task_record_name(job_id, task_id)))
            assert record is not None and sorted(record.attempts) == [0, 1], task_id  # one copy each


def test_telemetry_reports_a_queued_attempts_start_when_it_begins_executing(
    kafka_bootstrap: str, topics: TopicNames, client: Client
) -> None:
    """One task more than workers: the last one waits in a queue for a free worker, and its start is
    when it began to execute there, not when it was submitted."""
    with (
        SpeculativeClient(client, kafka_bootstrap, topic_prefix=topics.prefix, interval=0.5) as speculative,
        speculative.job(f"dask-{uuid.uuid4().hex[:8]}", expected_tasks=WORKERS + 1) as job,
    ):
        submitted = time.time()
        futures = [job.submit(run_until_cancelled, 1.5, task_id=f"t{i}") for i in range(WORKERS + 1)]
        assert job.gather(futures, timeout=WAIT_S) == ["done"] * (WORKERS + 1)
    reports = [e for _, e in read_all(kafka_bootstrap, topics.checkpoints) if isinstance(e, TaskCheckpoint)]
    starts = {r.task_id: r.start_time for r in reports if r.status == "running"}
    ends = {r.task_id: r.checkpoint_time for r in reports if r.status == "finished"}
    assert set(starts) == set(ends) == {f"t{i}" for i in range(WORKERS + 1)}
    last = max(starts, key=lambda task: starts[task] or 0.0)
    last_start = starts[last]
    first_free = min(end for task, end in ends.items() if task != last)
    assert last_start is not None and last_start >= first_free - 0.05  # it started once a worker was free
    assert last_start - submitted > 1.0  # not at its submission
    assert all(r.status != "running" or r.start_time == starts[r.task_id] for r in reports)
    latencies = {r.task_id: r.latency for r in reports if r.status == "finished"}
    assert all(latency is not None and 1.4 < latency < 3.0 for latency in latencies.values()), latencies
