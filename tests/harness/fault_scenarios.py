"""Fault scenarios against a real broker: crashes, restarts, a broker outage, bad input, duplicates.

Each scenario runs the real processes as children, injects one fault in the middle of a replay and
checks the output topics against the offline evaluator: the same first flags, and every command of
the default policy committed exactly once. One module of the test harness (``tests/harness/``), because
``tests/test_faults.py`` and ``bench/faults.py`` share it; a scenario fails unless its fault landed.
Details and results: docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from harness.small_jobs import make_job
from producers.replayer import (
    ReplayResult,
    TraceReplayer,
    ended_event,
    replay_producer_config,
    started_event,
)
from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    Event,
    JobEvent,
    Prediction,
    RelaunchCommand,
    SchemaError,
    TaskCheckpoint,
    command_id,
    decode,
    decode_each,
    encode,
    task_batches,
)
from straggler.core.jobtrace import JobTrace
from straggler.core.policy_spec import DEFAULT_POLICY, make_policy
from straggler.evaluation import EvaluationConfig, method_decisions, online_job
from straggler.kafka.config import consumer_config
from straggler.kafka.names import TopicNames
from straggler.kafka.produce import produce_with_backpressure
from straggler.kafka.topics import create_topics
from straggler.replay import STRAGGLER_COMMAND, read_topic, start_cli, stop_child
from straggler.simulation import JobSimulation, recorded_steps, run_closed_loop

REPO = Path(__file__).resolve().parents[2]
"""The checkout the scenarios start their child processes in (the package is installed editable)."""
CHECKPOINT_SECONDS = 10.0
"""`make_job`'s checkpoint interval (the mitigator's horizon)."""
POLICY = DEFAULT_POLICY
PENDING_GRACE_S = 120.0
"""How long the worker holds events of a job whose 'started' event has not arrived: far longer than
any skew between the input topics, so no valid event is dead-lettered however loaded the machine."""
BAD_INPUT_PENDING_GRACE_S = 10.0
"""The bad-input scenario's grace: its events for never-started jobs must expire within the run; the
scenario waits for their letters (a condition), and fails if a valid event was lettered."""
SETTLE_TIMEOUT_S = 240.0
"""Longest wait for the pipeline to emit every expected marker and command after the last fault."""
PROGRESS_TIMEOUT_S = 180.0
"""Longest wait for a stage to show progress (first marker, first command) before a fault."""
MITIGATOR_STALL_TIMEOUT_S = 45.0
"""The mitigator's watchdog (`consumers.watchdog`), shortened from its 90 s default so that a stuck
consumer is restarted well within `PROGRESS_TIMEOUT_S`."""
STOP_TIMEOUT_S = 30.0
"""How long a child may take to end at the close of a scenario before it is killed."""
WORKER_STOP_LIMIT_S = 10.0
"""SIGTERM ends a worker within this, in every state (docs/reliability.md, "A worker stops within
10 s"): `worker_leaves` and `worker_stops` fail otherwise."""
HELD_WORKER = REPO / "tests" / "fixtures" / "held_worker.py"
"""The shipped worker held in one state at a time (a slow commit, a long fit), for `worker_stops`."""
POLL_S = 0.25

Outgoing = tuple[str, str | None, bytes]
"""``(topic, key, value)`` of one record to produce (``None``: a record without a key)."""


class ScenarioFailed(RuntimeError):
    """A scenario's fault did not land as planned (`bench/faults.py` reports the scenario as failed,
    the tests raise)."""


class ScenarioTimeout(ScenarioFailed):
    """A scenario waited in vain: for progress before its fault, for evidence of the fault, or for
    recovery."""


# ------------------------------------------------------------------------------------- results


@dataclass
class ScenarioResult:
    """What one scenario measured; ``ok`` when nothing was lost, duplicated, changed or crashed."""

    name: str
    events_in: int = 0
    faults: int = 0
    commands_expected: int = 0
    commands_delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    """Commands the offline policy does not issue (a changed decision reached the mitigator)."""
    dead_letters: int = 0
    recovery_seconds: float = math.nan
    crashed: int = 0
    decisions_expected: int = 0
    decisions_missing: int = 0
    decisions_extra: int = 0
    conflicting: int = 0
    """(job, task, checkpoint) with both a True and a False verdict."""
    markers_missing: int = 0
    bad_events: int = 0
    bad_not_dead_lettered: int = 0
    """Bad records (or bad observations of a batch) the agent did not dead-letter."""
    bad_wrong_reason: int = 0
    bad_lettered_twice: int = 0
    """Bad records the agent dead-lettered more than once."""
    letters_unexpected: int = 0
    """Agent letters for records that were not bad (a valid record was rejected)."""
    bad_by_kind: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Bad-input kind -> (bad records or observations sent, those the agent lettered once, rightly)."""
    timeouts: list[str] = field(default_factory=list)
    """Waits of the final check that timed out (each fails the scenario)."""
    notes: list[str] = field(default_factory=list)

    @property
    def decisions_equal(self) -> bool:
        return not (self.decisions_missing or self.decisions_extra or self.conflicting)

    @property
    def ok(self) -> bool:
        return (
            self.decisions_equal
            and not (self.lost or self.duplicated or self.unexpected or self.crashed)
            and not (self.markers_missing or self.bad_not_dead_lettered or self.bad_wrong_reason)
            and not (self.bad_lettered_twice or self.letters_unexpected or self.timeouts)
        )


@dataclass(frozen=True)
class Sizes:
    """How big a run is: jobs, tasks per job, bad events in the bad-input scenario."""

    jobs: int = 3
    tasks: int = 150
    bad_events: int = 1000

    @classmethod
    def quick(cls) -> Sizes:
        return cls(jobs=3, tasks=150, bad_events=1000)

    @classmethod
    def full(cls) -> Sizes:
        return cls(jobs=4, tasks=250, bad_events=10_000)


def make_traces(sizes: Sizes, tag: str) -> list[JobTrace]:
    """Small synthetic jobs (`harness.small_jobs.make_job`), with stragglers and a slow machine
    group."""
    return [
        make_job(
            sizes.tasks + 50 * (i % 3),
            seed=100 + i,
            job_id=f"{tag}-job{i}",
            signal=0.5,
            slow_group=0.1 if i % 2 else 0.0,
            waves=2 + i % 3,
        )
        for i in range(sizes.jobs)
    ]


# ------------------------------------------------------------------------------ what to expect


@dataclass(frozen=True)
class Expectation:
    flags: frozenset[tuple[str, str, float]]
    """(job, task, checkpoint) of each task's first straggler flag, offline."""
    commands: frozenset[str]
    markers: frozenset[tuple[str, float]]


def offline_expectation(traces: Sequence[JobTrace]) -> Expectation:
    """The offline evaluator's flags and `POLICY`'s commands for the same (open-loop) traces."""
    config = EvaluationConfig(methods=("nurd",), threshold="online")
    flags: set[tuple[str, str, float]] = set()
    commands: set[str] = set()
    for trace in traces:
        for verdicts in method_decisions(trace, "nurd", config):
            flags |= {(d.job_id, d.task_id, d.checkpoint_time) for d in verdicts if d.is_straggler}
        policy = make_policy(POLICY, CHECKPOINT_SECONDS)
        job = online_job(trace, "nurd", config)
        run = run_closed_loop(trace, job, policy, config.seed, CHECKPOINT_SECONDS, carry_out=False)
        commands |= {command_id(a.job_id, a.task_id, a.action, a.decision_key) for a in run.commands}
    markers = {(t.job_id, float(c)) for t in traces for c in t.checkpoints}
    return Expectation(frozenset(flags), frozenset(commands), frozenset(markers))


# --------------------------------------------------------------------------- the input stream


def stream_events(traces: Sequence[JobTrace], topics: TopicNames, batch: bool = True) -> list[Outgoing]:
    """The records an open-loop `TraceReplayer` would produce, in its order, as a list.

    Built with the replayer's own event code (so the stream is the same), but held in memory so a
    scenario can cut it where it wants, interleave bad records or repeat records. ``batch``: task
    observations in ``task_batch`` records (the replayer's default), else one record each.
    """
    records: list[Outgoing] = []
    sims = [JobSimulation(trace, 0) for trace in traces]
    steps = [recorded_steps(trace) for trace in traces]
    instants = sorted({float(t) for trace in traces for t in trace.checkpoints})
    scratch = ReplayResult(0, 0, len(traces), 0, 0.0)
    replayer = TraceReplayer(traces, "127.0.0.1:0", topics=topics, progress=False)  # never connects

    def send(topic: str, job_id: str, event: Event) -> None:
        records.append((topic, job_id, encode(event)))

    def send_tasks(topic: str, job_id: str, events: Sequence[TaskCheckpoint]) -> None:
        if not batch:
            records.extend((topic, job_id, encode(event)) for event in events)
        elif events:
            records.extend((topic, job_id, p) for p in task_batches(job_id, events, source=events[0].source))

    for t in instants:
        for j, trace in enumerate(traces):
            checkpoints = [float(c) for c in trace.checkpoints]
            if t not in checkpoints:
                continue
            k = checkpoints.index(t)
            if k == 0:
                send(topics.job_events, trace.job_id, started_event(trace))
            replayer._publish_checkpoint(sims[j], next(steps[j]), send, send_tasks, scratch)
            if k == len(checkpoints) - 1:
                send(topics.job_events, trace.job_id, ended_event(trace, t))
    return records


def is_boundary(record: Outgoing) -> bool:
    return b'"checkpoint_boundary"' in record[2]


class Publisher:
    """An idempotent producer (the replayer's configuration) that remembers where records landed."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(replay_producer_config(bootstrap))
        self.placed: list[tuple[str, int, int]] = []
        self.failed = 0

    def publish(self, records: Sequence[Outgoing]) -> list[tuple[str, int, int]]:
        """Produce ``records`` in order and wait for them; return their (topic, partition, offset)."""
        placed: list[tuple[str, int, int] | None] = [None] * len(records)

        def report(i: int) -> Callable[[KafkaError | None, Message], None]:
            def on_delivery(error: KafkaError | None, message: Message) -> None:
                if error is not None:
                    self.failed += 1
                    return
                placed[i] = (message.topic() or "", message.partition() or 0, message.offset() or 0)

            return on_delivery

        for i, (topic, key, value) in enumerate(records):
            encoded = None if key is None else key.encode()
            produce_with_backpressure(self.producer, topic, value, encoded, report(i))
            if i % 1000 == 0:
                self.producer.poll(0)
        remaining = self.producer.flush(120)
        if remaining:
            raise RuntimeError(f"{remaining} records undelivered after 120 s")
        done = [p for p in placed if p is not None]
        self.placed += done
        return [p if p is not None else ("", -1, -1) for p in placed]


# ------------------------------------------------------------------------------- the processes


class Processes:
    """The pipeline's child processes; counts those that died without being told to."""

    def __init__(self, bootstrap: str, topics: TopicNames, workdir: Path) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.workdir = workdir
        self.group = f"{topics.prefix}mitigation"
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.crashed: list[str] = []
        self._logs: list[Path] = []
        self._starts: Counter[str] = Counter()

    def _spawn(
        self,
        name: str,
        args: Sequence[str],
        program: Sequence[str] = STRAGGLER_COMMAND,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        self._starts[name] += 1
        log_path = self.workdir / f"{name}.{self._starts[name]}.log"
        self._logs.append(log_path)
        process = start_cli(
            args, log_path, cwd=REPO, env={"PYTHONFAULTHANDLER": "1", **(env or {})}, program=program
        )
        self.running[name] = process
        return process

    def start_worker(
        self,
        name: str = "worker",
        pending_grace: float = PENDING_GRACE_S,
        *,
        program: Sequence[str] = STRAGGLER_COMMAND,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """A Faust worker (``program``: the command that runs it); the same ``name`` reuses the same
        data directory (a restart)."""
        return self._spawn(
            name,
            [
                "worker",
                "--bootstrap",
                self.bootstrap,
                "--topic-prefix",
                self.topics.prefix,
                "--datadir",
                str(self.workdir / f"faust-{name}"),
                "--pending-grace",
                str(pending_grace),
                "--loglevel",
                "info",
            ],
            program,
            env,
        )

    def start_mitigator(self, name: str = "mitigator") -> subprocess.Popen[bytes]:
        return self._spawn(
            name,
            [
                "mitigate",
                "--bootstrap",
                self.bootstrap,
                "--topic-prefix",
                self.topics.prefix,
                "--policy",
                POLICY,
                "--group",
                self.group,
                "--checkpoint-seconds",
                str(CHECKPOINT_SECONDS),
                "--batch-size",
                "200",
                "--stall-timeout",
                str(MITIGATOR_STALL_TIMEOUT_S),
                "--verbose",
            ],
        )

    def signal(self, name: str, sig: signal.Signals, timeout: float = STOP_TIMEOUT_S) -> int:
        """Send ``sig`` to one child (a fault we inject, not a crash) and wait for it to exit; return
        its exit code. Raises `ScenarioFailed` if it was already gone (the fault would not land) or
        outlives the signal by ``timeout`` seconds (it is then killed)."""
        process = self.running.pop(name)
        if process.poll() is not None:
            self.crashed.append(f"{name} exited with {process.returncode}")
            raise ScenarioFailed(f"{name} had exited ({process.returncode}) before {sig.name}")
        code = stop_child(process, timeout, sig)
        if code is None:
            raise ScenarioFailed(f"{name} did not exit within {timeout:g} s of {sig.name}")
        return code

    def stop_worker(self, name: str) -> float:
        """SIGTERM one worker; the seconds it took to exit with status 0. Raises `ScenarioFailed` if it
        takes longer than `WORKER_STOP_LIMIT_S` (it is then killed) or exits otherwise."""
        started = time.monotonic()
        code = self.signal(name, signal.SIGTERM, WORKER_STOP_LIMIT_S)
        if code != 0:
            raise ScenarioFailed(f"{name} exited with {code} after SIGTERM")
        return time.monotonic() - started

    def lines(self, name: str, text: str) -> int:
        """How many lines of ``name``'s current log contain ``text``."""
        path = self.workdir / f"{name}.{self._starts[name]}.log"
        with contextlib.suppress(OSError):
            return sum(text in line for line in path.read_text(errors="replace").splitlines())
        return 0

    def wait_for_line(self, name: str, text: str, timeout: float, seen: int = 0) -> None:
        """Wait until ``name``'s log has more than ``seen`` lines containing ``text``."""
        started = time.monotonic()
        while self.lines(name, text) <= seen:
            self.check_alive()
            if name not in self.running:
                raise ScenarioFailed(f"{name} exited while waiting for {text!r}\n{self.log_tail()}")
            if time.monotonic() - started > timeout:
                raise ScenarioTimeout(f"no {text!r} in {name}'s log after {timeout:g} s\n{self.log_tail()}")
            time.sleep(0.02)

    def check_alive(self) -> None:
        for name, process in list(self.running.items()):
            if process.poll() is not None:
                self.crashed.append(f"{name} exited with {process.returncode}")
                del self.running[name]

    def close(self) -> None:
        self.check_alive()
        for name in list(self.running):
            with contextlib.suppress(ScenarioFailed):  # reported by the scenario's own checks
                self.signal(name, signal.SIGTERM)

    def kill(self, name: str) -> None:
        """SIGKILL one child; returns once its death by SIGKILL is observed (the evidence of the fault)."""
        code = self.signal(name, signal.SIGKILL)
        if code != -signal.SIGKILL:
            raise ScenarioFailed(f"{name} exited with {code} before SIGKILL reached it")

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for path in self._logs:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)


# ---------------------------------------------------------------------------- watching outputs


class Watch:
    """Incremental readers of the markers (predictions topic) and committed commands."""

    def __init__(self, bootstrap: str, topics: TopicNames) -> None:
        group = f"fault-watch-{uuid.uuid4().hex[:8]}"
        self.markers: set[tuple[str, float]] = set()
        self.newest_marker_at = -math.inf
        """The latest ``produced_at`` (the worker's wall clock) of the markers read."""
        self.commands: list[str] = []
        self.letters: list[DeadLetter] = []
        self._predictions = self._reader(bootstrap, group, topics.predictions)
        self._commands = self._reader(bootstrap, group, topics.commands)
        self._letters = self._reader(bootstrap, group, topics.dead_letters)

    @staticmethod
    def _reader(bootstrap: str, group: str, topic: str) -> Consumer:
        consumer = Consumer(consumer_config(bootstrap, group, read_committed=True))
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        return consumer

    def poll(self) -> None:
        for message in self._predictions.consume(num_messages=5000, timeout=POLL_S):
            if message.error() is None:
                with contextlib.suppress(SchemaError):
                    for event in decode_each(message.value()):
                        if isinstance(event, CheckpointEvaluated):
                            self.markers.add((event.job_id, event.checkpoint_time))
                            self.newest_marker_at = max(self.newest_marker_at, event.produced_at)
        for message in self._commands.consume(num_messages=5000, timeout=POLL_S):
            if message.error() is None:
                with contextlib.suppress(SchemaError):
                    event = decode(message.value())
                    if isinstance(event, RelaunchCommand):
                        self.commands.append(event.command_id)
        for message in self._letters.consume(num_messages=5000, timeout=0):
            if message.error() is None:
                with contextlib.suppress(SchemaError):
                    event = decode(message.value())
                    if isinstance(event, DeadLetter):
                        self.letters.append(event)

    def wait(self, done: Callable[[], bool], timeout: float, processes: Processes | None, what: str) -> float:
        """Poll until ``done()``; return the seconds it took. Raises `ScenarioTimeout`, naming ``what``
        it waited for and ending with the children's logs, when ``timeout`` passes first."""
        started = time.monotonic()
        for _ in range(int(timeout / POLL_S) + 1):
            self.poll()
            if done():
                return time.monotonic() - started
            if processes is not None:
                processes.check_alive()
            if time.monotonic() - started > timeout:
                break
        logs = "" if processes is None else "\n" + processes.log_tail()
        crashed = "" if processes is None or not processes.crashed else f" ({'; '.join(processes.crashed)})"
        raise ScenarioTimeout(f"timed out after {timeout:g} s waiting for {what}{crashed}{logs}")

    def close(self) -> None:
        self._predictions.close()
        self._commands.close()
        self._letters.close()


# --------------------------------------------------------------------------------- verification


def verify(
    result: ScenarioResult,
    bootstrap: str,
    topics: TopicNames,
    expectation: Expectation,
    watch: Watch,
    processes: Processes,
    jobs: set[str],
) -> list[DeadLetter]:
    """Wait (bounded) for every expected marker and command, count what differs; return the dead letters.

    A timeout is listed in ``result.timeouts`` (failing the scenario) and the counts say what is missing.
    """
    try:
        watch.wait(
            lambda: expectation.markers <= watch.markers and expectation.commands <= set(watch.commands),
            SETTLE_TIMEOUT_S,
            processes,
            "every expected checkpoint marker and command",
        )
    except ScenarioTimeout as timeout:
        result.timeouts.append(str(timeout).split("\n", 1)[0])
    watch.poll()
    predictions: list[Prediction] = []
    letters: list[DeadLetter] = []
    for topic in (topics.predictions, topics.dead_letters):
        for value in read_topic(bootstrap, topic, timeout=60.0):
            with contextlib.suppress(SchemaError):
                for event in decode_each(value):
                    if isinstance(event, Prediction) and event.job_id in jobs:
                        predictions.append(event)
                    elif isinstance(event, DeadLetter):
                        letters.append(event)
    verdicts: dict[tuple[str, str, float], set[bool]] = {}
    for p in predictions:
        verdicts.setdefault((p.job_id, p.task_id, p.checkpoint_time), set()).add(p.is_straggler)
    first: dict[tuple[str, str], float] = {}
    for (job, task, at), seen in verdicts.items():
        if True in seen and at < first.get((job, task), math.inf):
            first[(job, task)] = at
    flags = {(job, task, at) for (job, task), at in first.items()}
    result.conflicting = sum(1 for seen in verdicts.values() if len(seen) > 1)
    result.decisions_expected = len(expectation.flags)
    result.decisions_missing = len(expectation.flags - flags)
    result.decisions_extra = len(flags - expectation.flags)
    result.markers_missing = len(expectation.markers - watch.markers)
    counts = Counter(watch.commands)
    result.commands_expected = len(expectation.commands)
    result.commands_delivered = sum(counts.values())
    result.lost = len(expectation.commands - set(counts))
    result.duplicated = sum(n - 1 for n in counts.values() if n > 1)
    result.unexpected = len(set(counts) - expectation.commands)
    result.dead_letters = len(letters)
    if letters:
        why = Counter(letter.error.split(";")[0][:70] for letter in letters)
        result.notes.append(
            "dead letters: " + "; ".join(f"{n}x {reason}" for reason, n in why.most_common(4))
        )
    processes.check_alive()
    result.crashed = len(processes.crashed)
    result.notes += processes.crashed
    result.notes += result.timeouts
    if not result.ok:
        result.notes.append("logs:\n" + processes.log_tail())
    return letters


@dataclass
class Run:
    """One scenario's fresh topics and traces, their offline expectation, its children and readers."""

    bootstrap: str
    result: ScenarioResult
    topics: TopicNames
    traces: list[JobTrace]
    expected: Expectation
    procs: Processes
    watch: Watch

    def stream(self, batch: bool = True) -> list[Outgoing]:
        """The replay's records (`stream_events`), counted as the scenario's input."""
        records = stream_events(self.traces, self.topics, batch)
        self.result.events_in = len(records)
        return records

    def verify(self) -> ScenarioResult:
        """`verify` the scenario's outputs against its expectation, over all its jobs; the result."""
        jobs = {t.job_id for t in self.traces}
        verify(self.result, self.bootstrap, self.topics, self.expected, self.watch, self.procs, jobs)
        return self.result


@contextlib.contextmanager
def pipeline_run(name: str, bootstrap: str, workdir: Path, sizes: Sizes) -> Iterator[Run]:
    """Fresh topics and traces for one scenario; stops its processes and readers at the end."""
    token = uuid.uuid4().hex[:6]
    topics = TopicNames(f"fault-{name}-{token}-")
    create_topics(bootstrap, prefix=topics.prefix)
    traces = make_traces(sizes, f"{name}-{token}")
    expectation = offline_expectation(traces)
    scenario_dir = workdir / f"{name}-{token}"
    scenario_dir.mkdir(parents=True, exist_ok=True)
    processes = Processes(bootstrap, topics, scenario_dir)
    watch = Watch(bootstrap, topics)
    try:
        yield Run(bootstrap, ScenarioResult(name), topics, traces, expectation, processes, watch)
    finally:
        processes.close()
        watch.close()


def _split_at_boundaries(records: list[Outgoing], fractions: Sequence[float]) -> list[list[Outgoing]]:
    """Cut the stream right after each boundary that completes one of ``fractions`` of all boundaries."""
    boundaries = [i for i, record in enumerate(records) if is_boundary(record)]
    cuts = [0] + [boundaries[max(0, int(len(boundaries) * f) - 1)] + 1 for f in fractions] + [len(records)]
    return [records[a:b] for a, b in itertools.pairwise(cuts)]


def _head_and_tail(records: list[Outgoing], fraction: float) -> tuple[list[Outgoing], list[Outgoing]]:
    """Cut the stream right after the boundary that completes ``fraction`` of all boundaries."""
    head, tail = _split_at_boundaries(records, [fraction])
    return head, tail


def _committed_inputs(bootstrap: str, group: str, topics: TopicNames) -> int:
    """How many input records ``group`` has committed (summed over the partitions)."""
    consumer = Consumer(consumer_config(bootstrap, group))
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in (topics.checkpoints, topics.job_events)
            for p in consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ]
        return sum(max(tp.offset, 0) for tp in consumer.committed(partitions, timeout=30))
    finally:
        consumer.close()


def _records_in(bootstrap: str, topics: Sequence[str]) -> int:
    """How many records ``topics`` hold (end offsets summed over their partitions)."""
    from straggler.kafka.offsets import end_offsets

    consumer = Consumer(consumer_config(bootstrap, f"records-in-{uuid.uuid4().hex[:8]}"))
    try:
        total = 0
        for topic in topics:
            partitions = list(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
            total += sum(end_offsets(consumer, topic, partitions, timeout=30).values())
        return total
    finally:
        consumer.close()


def _marked_in(records: Sequence[Outgoing]) -> set[tuple[str, float]]:
    found = set()
    for _, _, value in records:
        if b'"checkpoint_boundary"' in value:
            event = decode(value)
            assert isinstance(event, CheckpointBoundary)
            found.add((event.job_id, event.checkpoint_time))
    return found


def _first_command(watch: Watch, processes: Processes) -> float:
    """Seconds until one more committed command appears than there is now."""
    before = len(watch.commands)
    return watch.wait(lambda: len(watch.commands) > before, PROGRESS_TIMEOUT_S, processes, "a new command")


def _every_job_progresses(watch: Watch, processes: Processes, traces: Sequence[JobTrace]) -> float:
    """Seconds until every job has a checkpoint evaluated after now, or has none left.

    Counting every job, not the first marker, times the slowest path: after a worker left, the jobs
    it owned move last."""

    def latest() -> dict[str, float]:
        out: dict[str, float] = {}
        for job, at in watch.markers:
            out[job] = max(out.get(job, -math.inf), at)
        return out

    watch.poll()
    before = latest()
    last = {t.job_id: float(t.checkpoints[-1]) for t in traces}

    def not_moved() -> list[str]:
        now = latest()
        return [
            j
            for j in last
            if not (now.get(j, -math.inf) > before.get(j, -math.inf) or before.get(j) == last[j])
        ]

    try:
        return watch.wait(
            lambda: not not_moved(),
            PROGRESS_TIMEOUT_S,
            processes,
            "every job to have a new checkpoint evaluated",
        )
    except ScenarioTimeout as timeout:  # name the jobs that did not move, and where they stopped
        stuck = "; ".join(f"{j} evaluated to {before.get(j, '-')} s of {last[j]:g} s" for j in not_moved())
        raise ScenarioTimeout(f"{stuck}: {timeout}") from None


# ------------------------------------------------------------------------------------ scenarios


def worker_sigkill(bootstrap: str, workdir: Path, sizes: Sizes) -> ScenarioResult:
    """SIGKILL the Faust worker while it works through a replay; restart it on the same data dir."""
    from pipeline.settings import WorkerSettings, app_id

    with pipeline_run("worker-kill", bootstrap, workdir, sizes) as run:
        records = run.stream()
        head, tail = _head_and_tail(records, 0.6)
        head_markers = _marked_in(head)
        run.procs.start_mitigator()
        run.procs.start_worker()
        publisher = Publisher(bootstrap)
        publisher.publish(head)
        goal = max(1, len(head_markers) // 2)
        run.watch.wait(
            lambda: len(run.watch.markers) >= goal, PROGRESS_TIMEOUT_S, run.procs, f"{goal} markers"
        )
        evaluated = len(run.watch.markers)
        run.procs.kill("worker")
        run.result.faults += 1
        group = app_id(WorkerSettings(bootstrap=bootstrap, topics=run.topics))
        run.result.notes.append(
            f"killed after {evaluated}/{len(run.expected.markers)} checkpoints evaluated; the restart "
            f"resumes at committed input {_committed_inputs(bootstrap, group, run.topics)}/{len(records)}"
        )
        publisher.publish(tail)
        run.procs.start_worker()
        run.result.recovery_seconds = _every_job_progresses(run.watch, run.procs, run.traces)
        return run.verify()


def recovery_loses_records(bootstrap: str, workdir: Path, sizes: Sizes) -> ScenarioResult:
    """As `worker_sigkill`, but the restarted worker loses the first delivery of every changelog record
    on its way to the table recovery (``HELD_STATE=lose-changelog``): its recovery stalls, owed
    records the fetcher has moved past, until the worker restarts it (`restart_stalled_recovery`,
    after 5 s here); then it reads them again and finishes the replay."""
    from pipeline.faust_app import changelog_topics
    from pipeline.settings import WorkerSettings

    with pipeline_run("recovery-loses", bootstrap, workdir, sizes) as run:
        head, tail = _head_and_tail(run.stream(), 0.6)
        run.procs.start_mitigator()
        run.procs.start_worker()
        publisher = Publisher(bootstrap)
        publisher.publish(head)
        run.watch.wait(lambda: len(run.watch.markers) >= 1, PROGRESS_TIMEOUT_S, run.procs, "a first marker")
        changelogs = changelog_topics(WorkerSettings(bootstrap=bootstrap, topics=run.topics))
        run.watch.wait(  # the tables have rows to recover (else the restart has nothing to lose)
            lambda: _records_in(bootstrap, changelogs) > 0, PROGRESS_TIMEOUT_S, run.procs, "changelog rows"
        )
        run.procs.kill("worker")
        publisher.publish(tail)
        run.procs.start_worker(program=(str(HELD_WORKER),), env={"HELD_STATE": "lose-changelog"})
        run.result.recovery_seconds = _every_job_progresses(run.watch, run.procs, run.traces)
        lost, restarts = (
            run.procs.lines("worker", text) for text in ("held: lose-changelog", "restarting it")
        )
        if not lost or not restarts:
            raise ScenarioFailed(
                f"the restarted worker lost changelog records: {bool(lost)}; restarted its recovery "
                f"{restarts} times\n{run.procs.log_tail()}"
            )
        run.result.faults += 1
        run.result.notes.append(f"the restarted worker's recovery was restarted {restarts} times")
        return run.verify()


KILL_DELAYS_S = (0.0, 0.15, 0.3, 0.45)
"""`worker_sigkill_repeated`'s pause between seeing the running worker evaluate and the next kill."""


def worker_sigkill_repeated(bootstrap: str, workdir: Path, sizes: Sizes) -> ScenarioResult:
    """SIGKILL the worker once per part of the replay, each time soon after it evaluates a checkpoint.

    Soon after that worker itself evaluates one: a marker it produced, not one of its killed
    predecessor's still on its way to the watch (which let a kill hit a worker still starting up).

    Every restart starts with a backlog, so its recovery races the fetcher
    (`pipeline.faust_patches.keep_queued_records`; docs/reliability.md, "A recovery keeps the records
    already fetched"); the last restart works the stream off to the end.
    """
    with pipeline_run("worker-kill-repeated", bootstrap, workdir, sizes) as run:
        records = run.stream()
        kills = len(KILL_DELAYS_S)
        parts = _split_at_boundaries(records, [(k + 1) / (kills + 1) for k in range(kills)])
        run.procs.start_mitigator()
        started = time.time()  # the wall clock a marker's produced_at is read on
        run.procs.start_worker()
        publisher = Publisher(bootstrap)
        for part, delay in zip(parts[:-1], KILL_DELAYS_S, strict=True):
            publisher.publish(part)
            evaluated = functools.partial(lambda t: run.watch.newest_marker_at > t, started)
            run.watch.wait(evaluated, PROGRESS_TIMEOUT_S, run.procs, "the running worker's marker")
            time.sleep(delay)  # the fault's timing (varied on purpose), not a wait for anything
            run.procs.kill("worker")
            run.result.faults += 1
            started = time.time()
            run.procs.start_worker()
        publisher.publish(parts[-1])
        run.result.notes.append(
            f"killed {run.result.faults} times, each after the running worker evaluated a checkpoint"
        )
        run.result.recovery_seconds = _every_job_progresses(run.watch, run.procs, run.traces)
        return run.verify()


def mitigator_sigkill(bootstrap: str, workdir: Path, sizes: Sizes) -> ScenarioResult:
    """SIGKILL the mitigation consumer once it has committed commands; restart it in the same group."""
    with pipeline_run("mitigator-kill", bootstrap, workdir, sizes) as run:
        records = run.stream()
        head, tail = _head_and_tail(records, 0.6)
        run.procs.start_worker()
        run.procs.start_mitigator()
        publisher = Publisher(bootstrap)
        publisher.publish(head)
        run.watch.wait(lambda: len(run.watch.commands) > 0, PROGRESS_TIMEOUT_S, run.procs, "a first command")
        run.result.notes.append(
            f"killed after {len(run.watch.commands)}/{len(run.expected.commands)} commands committed"
        )
        run.procs.kill("mitigator")
        run.result.faults += 1
        publisher.publish(tail)
        run.procs.start_mitigator()
        run.result.recovery_seconds = _first_command(run.watch, run.procs)
        return run.verify()


def broker_restart(workdir: Path, sizes: Sizes, outage_seconds: float = 3.0) -> ScenarioResult:
    """Stop the (embedded) broker mid-replay and start it again on the same data dir and port."""
    from straggler.kafka.embedded import EmbeddedKafka, free_port

    broker = EmbeddedKafka(port=free_port(), data_dir=workdir / "broker-restart", die_with_parent=True)
    bootstrap = broker.start()
    try:
        with pipeline_run("broker-restart", bootstrap, workdir, sizes) as run:
            run.procs.start_worker()
            run.procs.start_mitigator()
            span = max(float(t.checkpoints[-1]) for t in run.traces)
            replayer = TraceReplayer(
                run.traces, bootstrap, topics=run.topics, speed=span / 20.0, progress=False
            )
            replay: dict[str, ReplayResult | BaseException] = {}

            def run_replay() -> None:
                try:
                    replay["result"] = replayer.run()
                except BaseException as error:  # reported below, not lost in the thread
                    replay["error"] = error

            thread = threading.Thread(target=run_replay, name="replay", daemon=True)
            thread.start()
            goal = max(1, len(run.expected.markers) // 5)
            run.watch.wait(
                lambda: len(run.watch.markers) >= goal, PROGRESS_TIMEOUT_S, run.procs, f"{goal} markers"
            )
            run.result.notes.append(
                f"broker stopped after {len(run.watch.markers)}/{len(run.expected.markers)} checkpoints"
            )
            if not broker.stop() or _port_open(bootstrap):
                raise ScenarioFailed(f"the broker at {bootstrap} did not stop")
            run.result.faults += 1
            time.sleep(outage_seconds)  # the outage's length, not a wait for anything
            restarted = broker.start()
            if restarted != bootstrap:
                run.result.notes.append(f"broker came back on {restarted}, not {bootstrap}")
            run.result.recovery_seconds = _every_job_progresses(run.watch, run.procs, run.traces)
            thread.join(SETTLE_TIMEOUT_S)
            outcome = replay.get("result")
            if isinstance(outcome, ReplayResult):
                run.result.events_in = outcome.events_produced
                if outcome.delivery_failures:
                    run.result.notes.append(f"replayer: {outcome.delivery_failures} delivery failures")
                    run.result.lost += outcome.delivery_failures
            else:
                run.result.notes.append(f"replayer failed: {replay.get('error', 'did not finish in time')!r}")
                run.result.crashed += 1
            run.verify()
            run.result.crashed += 0 if isinstance(outcome, ReplayResult) else 1
            return run.result
    finally:
        broker.stop()


BAD_KINDS = (
    "not-json",
    "truncated",
    "unknown-type",
    "wrong-type",
    "missing-field",
    "unknown-version",
    "nan-latency",
    "negative-latency",
    "nan-feature",
    "huge",
    "unknown-job",
    "bad-in-batch",
    "no-key",
    "wrong-key",
)
README_BAD_INPUT = {
    "Malformed JSON": ("not-json", "truncated"),
    "unknown event types": ("unknown-type",),
    "schema versions": ("unknown-version",),
    "missing fields": ("missing-field",),
    "wrong types": ("wrong-type",),
    "negative or non-finite latency": ("negative-latency", "nan-latency"),
    "NaN features": ("nan-feature",),
    "oversize payloads": ("huge",),
    "jobs that never started": ("unknown-job",),
    "inside a `task_batch`": ("bad-in-batch",),
    "no key or a key other than their job id": ("no-key", "wrong-key"),
}
"""Each kind of bad input the README's 'Bad input' section lists (its words) -> the kinds sent."""
BAD_REASON = {
    "not-json": "(json)",
    "truncated": "(json)",
    "unknown-type": "event.type: unknown event type",
    "wrong-type": "(type)",
    "missing-field": "(required)",
    "unknown-version": "(version)",
    "nan-latency": "(json)",
    "negative-latency": "(minimum)",
    "nan-feature": "(json)",
    "huge": "(maxSize)",
    "unknown-job": "unknown job",
    "bad-in-batch": "task_batch.observations[{index}].latency: must be >= 0 (minimum)",
    "no-key": "has no key",
    "wrong-key": "is not its job id",
}
"""What each kind's dead letter must say (the rule `schemas.SchemaError` names, or the agent's reason);
``{index}``: the observation's index in its batch."""
BATCH_INDEX = re.compile(r"\btask_batch\.observations\[(\d+)\]")
"""Where the agent's reason for a bad observation names its index in the batch."""

Letter = tuple[str, int, int, int | None]
"""A dead letter's place: source topic, partition, offset and the observation's index in a batch."""


def bad_record(kind: str, i: int, job_id: str, topics: TopicNames) -> Outgoing:
    """One bad record of ``kind``; keyed by a real job so it shares that job's partitions.

    A ``bad-in-batch`` record holds `bad_observations` invalid observations (and no valid one, which
    would change the job)."""
    valid = {
        "type": "task_checkpoint",
        "schema_version": 1,
        "job_id": job_id,
        "task_id": f"bad{i}",
        "attempt": 0,
        "checkpoint_time": 1.0,
        "status": "finished",
        "machine_id": "m0",
        "features": {"x0": 0.5},
        "latency": 12.0,
    }
    payload: bytes
    if kind == "not-json":
        payload = b"\x00garbage " + str(i).encode()
    elif kind == "truncated":
        payload = orjson.dumps(valid)[: 20 + i % 40]
    elif kind == "unknown-type":
        payload = orjson.dumps({**valid, "type": "task_chekpoint"})
    elif kind == "wrong-type":
        payload = orjson.dumps({**valid, "checkpoint_time": "soon"})
    elif kind == "missing-field":
        payload = orjson.dumps({k: v for k, v in valid.items() if k != "status"})
    elif kind == "unknown-version":
        payload = orjson.dumps({**valid, "schema_version": 7})
    elif kind == "nan-latency":
        payload = orjson.dumps(valid).replace(b'"latency":12.0', b'"latency":NaN')
    elif kind == "negative-latency":
        payload = orjson.dumps({**valid, "latency": -3.0})
    elif kind == "nan-feature":
        payload = orjson.dumps(valid).replace(b'"x0":0.5', b'"x0":NaN')
    elif kind == "huge":
        payload = orjson.dumps({**valid, "machine_id": "m" * (70 * 1024)})
    elif kind == "unknown-job":
        ghost = f"ghost-{i}"
        return (
            topics.checkpoints,
            ghost,
            orjson.dumps({**valid, "job_id": ghost, "status": "running", "latency": None}),
        )
    elif kind == "bad-in-batch":
        body = {k: v for k, v in valid.items() if k not in ("type", "schema_version", "job_id")}
        batch = {"type": "task_batch", "schema_version": 1, "job_id": job_id}
        bodies = [body | {"task_id": f"bad{i}.{k}", "latency": -3.0} for k in range(bad_observations(i))]
        payload = orjson.dumps(batch | {"observations": bodies})
    elif kind in ("no-key", "wrong-key"):  # a valid event of the job, keyed as the agent cannot order
        return topics.checkpoints, None if kind == "no-key" else f"not-{job_id}", orjson.dumps(valid)
    else:
        raise ValueError(kind)
    topic = topics.job_events if i % 10 == 0 and kind != "huge" else topics.checkpoints
    return topic, job_id, payload


def bad_observations(i: int) -> int:
    """How many invalid observations the ``bad-in-batch`` record number ``i`` holds (1 to 3)."""
    return 1 + i % 3


def expected_letters(kind: str, i: int, where: tuple[str, int, int]) -> list[tuple[Letter, str]]:
    """The agent's letters bad record ``i`` of ``kind``, placed at ``where``, must cause: each letter's
    place and a fragment of its reason. One per record; one per bad observation of a batch."""
    if kind != "bad-in-batch":
        return [((*where, None), BAD_REASON[kind])]
    return [((*where, k), BAD_REASON[kind].format(index=k)) for k in range(bad_observations(i))]


def letter_place(letter: DeadLetter) -> Letter:
    """Where ``letter``'s record was read, with the observation's index if the reason names one."""
    found = BATCH_INDEX.search(letter.error)
    index = int(found.group(1)) if found else None
    return letter.source_topic, letter.source_partition, letter.source_offset, index


def check_agent_letters(
    result: ScenarioResult, expected: Sequence[tuple[str, Letter, str]], letters: Sequence[DeadLetter]
) -> None:
    """Count, per kind, the bad records the agent did not letter, lettered twice or for another reason,
    and the agent's letters for records that were not bad. ``expected``: (kind, place, reason)."""
    agent: dict[Letter, list[str]] = {}
    for letter in letters:
        if letter.stage == "agent":
            agent.setdefault(letter_place(letter), []).append(letter.error)
    sent: Counter[str] = Counter()
    right: Counter[str] = Counter()
    for kind, place, reason in expected:
        sent[kind] += 1
        found = agent.get(place, [])
        if not found:
            result.bad_not_dead_lettered += 1
        elif len(found) > 1:
            result.bad_lettered_twice += 1
        elif reason not in found[0]:
            result.bad_wrong_reason += 1
        else:
            right[kind] += 1
    result.letters_unexpected = len(set(agent) - {place for _, place, _ in expected})
    result.bad_by_kind = {kind: (sent[kind], right[kind]) for kind in BAD_KINDS if kind in sent}
    wrong = {kind: f"{right[kind]}/{n}" for kind, n in sent.items() if right[kind] != n}
    if wrong:
        result.notes.append(f"bad records not lettered once, rightly, by the agent: {wrong}")
    if result.letters_unexpected:
        result.notes.append(f"{result.letters_unexpected} records the agent lettered were not bad")


def bad_input(bootstrap: str, workdir: Path, sizes: Sizes) -> ScenarioResult:
    """Interleave ``sizes.bad_events`` bad records with a valid replay: the agent letters each bad
    record (each bad observation of a batch) once, with its reason, and the decisions do not change."""
    with pipeline_run("bad-input", bootstrap, workdir, sizes) as run:
        records = stream_events(run.traces, run.topics)
        jobs = [t.job_id for t in run.traces]
        bad = [
            bad_record(BAD_KINDS[i % len(BAD_KINDS)], i, jobs[i % len(jobs)], run.topics)
            for i in range(sizes.bad_events)
        ]
        after: dict[int, list[int]] = {}
        for b in range(len(bad)):
            after.setdefault(b * len(records) // len(bad), []).append(b)
        mixed: list[Outgoing] = []
        which: list[int | None] = []
        for n, record in enumerate(records):
            mixed.append(record)
            which.append(None)
            for b in after.get(n, []):
                mixed.append(bad[b])
                which.append(b)
        run.result.events_in = len(mixed)
        run.procs.start_worker(pending_grace=BAD_INPUT_PENDING_GRACE_S)
        run.procs.start_mitigator()
        placed = Publisher(bootstrap).publish(mixed)
        expected = [
            (BAD_KINDS[b % len(BAD_KINDS)], place, reason)
            for where, b in zip(placed, which, strict=True)
            if b is not None and where[1] >= 0  # delivered: the evidence the fault is on the topic
            for place, reason in expected_letters(BAD_KINDS[b % len(BAD_KINDS)], b, where)
        ]
        run.result.bad_events = run.result.faults = len({place[:3] for _, place, _ in expected})
        if run.result.bad_events != len(bad):
            raise ScenarioFailed(f"only {run.result.bad_events}/{len(bad)} bad records were delivered")
        run.verify()
        places = {place for _, place, _ in expected}
        try:
            run.watch.wait(
                lambda: places <= {letter_place(x) for x in run.watch.letters if x.stage == "agent"},
                PROGRESS_TIMEOUT_S,
                run.procs,
                "the agent's dead letters of every bad record",
            )
        except ScenarioTimeout as timeout:
            run.result.timeouts.append(str(timeout).split("\n", 1)[0])
            run.result.notes.append(run.result.timeouts[-1])
        run.result.dead_letters = len(run.watch.letters)
        check_agent_letters(run.result, expected, run.watch.letters)
        run.procs.check_alive()
        run.result.crashed = len(run.procs.crashed)
        return run.result


def with_repeats(records: Sequence[Outgoing]) -> tuple[list[Outgoing], int]:
    """The stream with every record sent twice, each finish followed by a stale ``running`` event of
    the same task, and each boundary followed by the job's previous boundary; returns (stream, faults)."""
    out: list[Outgoing] = []
    faults = 0
    last_running: dict[tuple[str, str], Outgoing] = {}
    last_boundary: dict[str, Outgoing] = {}
    for record in records:
        out += [record, record]
        faults += 1
        event = decode(record[2])
        if isinstance(event, TaskCheckpoint):
            key = (event.job_id, event.task_id)
            if event.status == "running":
                last_running[key] = record
            elif event.status == "finished" and key in last_running:
                out.append(last_running[key])  # late: the task already finished
                faults += 1
        elif isinstance(event, CheckpointBoundary):
            previous = last_boundary.get(event.job_id)
            if previous is not None:
                out.append(previous)  # an older checkpoint's boundary, again
                faults += 1
            last_boundary[event.job_id] = record
        elif isinstance(event, JobEvent) and event.event == "started":
            pass
    return out, faults


def duplicates_out_of_order(bootstrap: str, workdir: Path, sizes: Sizes) -> ScenarioResult:
    """Every record twice, late ``running`` events after finishes, old boundaries again."""
    with pipeline_run("duplicates", bootstrap, workdir, sizes) as run:
        records, faults = with_repeats(run.stream(batch=False))  # single events: late ones
        run.result.events_in, run.result.faults = len(records), faults
        run.procs.start_worker()
        run.procs.start_mitigator()
        Publisher(bootstrap).publish(records)
        return run.verify()


def _input_partitions_by_member(bootstrap: str, group: str, topics: TopicNames) -> list[int]:
    """How many input partitions each member of ``group`` is assigned (none: no group yet)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    inputs = {topics.checkpoints, topics.job_events}
    try:
        described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    except Exception:  # the group does not exist yet
        return []
    return [
        sum(tp.topic in inputs for tp in member.assignment.topic_partitions) for member in described.members
    ]


def _port_open(bootstrap: str) -> bool:
    """Whether something accepts connections at ``host:port``."""
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            return True
    except OSError:
        return False


def worker_leaves(bootstrap: str, workdir: Path, sizes: Sizes) -> ScenarioResult:
    """Two workers share the partitions; one leaves (SIGTERM) mid-replay and the other takes its jobs."""
    from pipeline.settings import WorkerSettings, app_id

    with pipeline_run("worker-leaves", bootstrap, workdir, sizes) as run:
        records = run.stream()
        head, tail = _head_and_tail(records, 0.6)
        group = app_id(WorkerSettings(bootstrap=bootstrap, topics=run.topics))
        run.procs.start_worker("worker-a")
        run.procs.start_worker("worker-b")
        run.procs.start_mitigator()
        shares = functools.partial(_input_partitions_by_member, bootstrap, group, run.topics)
        run.watch.wait(
            lambda: len(shares()) == 2 and all(shares()),
            PROGRESS_TIMEOUT_S,
            run.procs,
            "both workers' partitions",
        )
        publisher = Publisher(bootstrap)
        publisher.publish(head)
        goal = max(1, len(_marked_in(head)) // 2)
        run.watch.wait(
            lambda: len(run.watch.markers) >= goal, PROGRESS_TIMEOUT_S, run.procs, f"{goal} markers"
        )
        run.result.notes.append(
            f"worker-b left after {len(run.watch.markers)}/{len(run.expected.markers)} checkpoints"
        )
        before = shares()
        if len(before) != 2 or not all(before):
            raise ScenarioFailed(f"worker-b no longer shares the work before it leaves: {before}")
        seconds = run.procs.stop_worker("worker-b")
        run.result.notes.append(f"worker-b exited {seconds:.1f} s after SIGTERM")
        everything = sum(before)
        run.watch.wait(
            lambda: shares() == [everything],
            PROGRESS_TIMEOUT_S,
            run.procs,
            "worker-a to take every partition",
        )
        run.result.faults += 1
        publisher.publish(tail)
        run.result.recovery_seconds = _every_job_progresses(run.watch, run.procs, run.traces)
        return run.verify()


STOP_STATES = {
    "commit": "held: commit",  # records arrive meanwhile
    "fit": "held: fit",
    "joining": "(Re-)joining group",
    "revoking": "Revoking previously assigned partitions",
}
"""The states `worker_stops` stops a worker in, each with the line of the worker's log that says it is
there: a group commit under way (held 3 s, `HELD_WORKER`), a NURD fit holding the event loop (3 s),
joining the group as a second worker joins (the join waits at the broker for every member), and
giving its partitions up to that second worker."""


TRICKLE_GAP_S = 0.2
"""`_trickle_until`'s spacing: under the commit interval (0.5 s), near its timer's (0.25 s)."""


def _trickle_until(publisher: Publisher, records: list[Outgoing], done: Callable[[], bool]) -> list[Outgoing]:
    """Publish ``records`` one at a time, `TRICKLE_GAP_S` apart, until ``done()``; return the rest.

    The worker's timer commits only what a burst left behind. The head ends with a boundary whose fit
    can outlast the commit interval, and the agent then commits everything itself: no timer commit is
    left to hold. A trickle leaves records behind between the agent's commits, so the timer soon finds
    one due with no record in hand."""
    started = time.monotonic()
    records = list(records)
    while records and not done() and time.monotonic() - started < PROGRESS_TIMEOUT_S:
        publisher.publish(records[:1])
        records = records[1:]
        time.sleep(TRICKLE_GAP_S)
    return records


def worker_stops(state: str, bootstrap: str, workdir: Path, sizes: Sizes) -> ScenarioResult:
    """SIGTERM a worker in ``state`` (`STOP_STATES`) mid-replay: it exits within `WORKER_STOP_LIMIT_S`,
    having committed what it could and given the rest back; the worker that remains (or a new one)
    finishes the replay with nothing lost, repeated or changed."""
    with pipeline_run(f"stop-{state}", bootstrap, workdir, sizes) as run:
        head, tail = _head_and_tail(run.stream(), 0.6)
        run.procs.start_mitigator()
        held = {"HELD_STATE": state} if state in ("commit", "fit") else None
        if held:
            run.procs.start_worker("first", program=(str(HELD_WORKER),), env=held)
        else:
            run.procs.start_worker("first")
        publisher = Publisher(bootstrap)
        publisher.publish(head)
        run.watch.wait(lambda: len(run.watch.markers) >= 1, PROGRESS_TIMEOUT_S, run.procs, "a first marker")
        line = STOP_STATES[state]
        if held:
            target = "first"
            seen = run.procs.lines(target, line)
            if state == "commit":
                tail = _trickle_until(publisher, tail, lambda: run.procs.lines(target, line) > seen)
            run.procs.wait_for_line(target, line, PROGRESS_TIMEOUT_S, seen)
            if state == "commit":  # records arrive while the commit holds the lock
                publisher.publish(tail)
                tail = []
                time.sleep(1.0)
        else:
            target = "second" if state == "joining" else "first"
            seen = run.procs.lines(target, line) if target == "first" else 0
            run.procs.start_worker("second")
            run.procs.wait_for_line(target, line, PROGRESS_TIMEOUT_S, seen)
        seconds = run.procs.stop_worker(target)
        run.result.faults += 1
        run.result.notes.append(f"{target} exited {seconds:.1f} s after SIGTERM while in state {state!r}")
        if held:
            run.procs.start_worker("second")
        publisher.publish(tail)
        run.result.recovery_seconds = _every_job_progresses(run.watch, run.procs, run.traces)
        return run.verify()


SCENARIOS: dict[str, Callable[[str, Path, Sizes], ScenarioResult]] = {
    "worker-kill": worker_sigkill,
    "worker-kill-repeated": worker_sigkill_repeated,
    "mitigator-kill": mitigator_sigkill,
    "broker-restart": lambda bootstrap, workdir, sizes: broker_restart(workdir, sizes),
    "bad-input": bad_input,
    "duplicates": duplicates_out_of_order,
    "worker-leaves": worker_leaves,
    "recovery-loses-records": recovery_loses_records,
    **{f"worker-stops-{state}": functools.partial(worker_stops, state) for state in STOP_STATES},
}
"""Scenario name -> runner. ``broker-restart`` ignores the given broker: it needs one it may stop."""
