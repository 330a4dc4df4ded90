"""``straggler replay``: a whole closed-loop replay through Apache Kafka, and its report.

Starts what is missing (an embedded broker unless ``--bootstrap`` is given), creates the topics
under a fresh prefix, runs the Faust worker and the mitigation consumer as child processes (as
compose runs them), replays the trace in-process with the closed loop on, then reads the output
topics back and measures: straggler F1 against each job's true p90, completion-time reduction from
the relaunches the loop actually applied, and decision latency from each checkpoint boundary's
produce time to the last prediction or command it caused. Everything it started, it stops.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, TopicPartition

from producers.replayer import PipelineCheck, ReplayResult, TraceReplayer
from schemas import (
    CheckpointEvaluated,
    DeadLetter,
    Prediction,
    RelaunchCommand,
    SchemaError,
    decode_each,
    encode,
)
from straggler.core.jobtrace import JobTrace
from straggler.core.metrics import confusion
from straggler.core.threshold import oracle_threshold
from straggler.kafka.config import consumer_config
from straggler.kafka.consume import arrived
from straggler.kafka.names import TopicNames
from straggler.kafka.offsets import end_offset
from straggler.kafka.reachability import LIBRDKAFKA_LOGGER
from straggler.simulation import checkpoint_interval, figures, limit_outcome, mean_figures

log = logging.getLogger(__name__)

STRAGGLER_COMMAND = ("-m", "straggler.cli")
"""What Python runs for ``straggler ARGS``."""


def start_cli(
    args: Sequence[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    program: Sequence[str] = STRAGGLER_COMMAND,
) -> subprocess.Popen[bytes]:
    """Start ``python -m straggler.cli ARGS`` (or ``python PROGRAM ARGS``), unbuffered, its stdout and
    stderr written to ``log_path`` (``env``: variables added to this process's environment)."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, *program, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )


def stop_child(
    process: subprocess.Popen[bytes], timeout: float, sig: signal.Signals = signal.SIGTERM
) -> int | None:
    """Send ``sig`` and wait up to ``timeout`` seconds for the exit code; None if the child outlived
    that and was killed (SIGKILL)."""
    process.send_signal(sig)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)
        return None


@contextmanager
def child_process(
    args: Sequence[str],
    log_path: Path,
    *,
    stop_timeout: float = 30.0,
    program: Sequence[str] = STRAGGLER_COMMAND,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m straggler.cli ARGS`` (or ``python PROGRAM ARGS``) until the block ends, then
    SIGTERM (SIGKILL if it hangs)."""
    process = start_cli(args, log_path, program=program)
    try:
        yield process
    finally:
        if process.poll() is None:
            stop_child(process, stop_timeout)


@dataclass
class Outputs:
    """What the pipeline wrote during one replay, read back from the broker."""

    predictions: list[Prediction]
    markers: list[CheckpointEvaluated]
    commands: list[RelaunchCommand]
    dead_letters: list[DeadLetter]
    undecodable: int


def read_topic(
    bootstrap: str, topic: str, *, read_committed: bool = True, timeout: float = 30.0
) -> list[bytes]:
    """Every record value of ``topic`` from the beginning to its current end (bounded in time).

    A partition is done once the consumer's position reaches the end offset: with transactions the
    last offsets are commit markers, which no record carries, so the last record's offset cannot say."""
    consumer = Consumer(
        consumer_config(bootstrap, f"reader-{uuid.uuid4().hex[:8]}", read_committed=read_committed)
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        partitions = list(metadata.topics[topic].partitions)
        ends = {p: end_offset(consumer, TopicPartition(topic, p), timeout) for p in partitions}
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for message in arrived(consumer, 1000, 0.5):
                if not message.error():
                    values.append(message.value() or b"")
            positions = consumer.position([TopicPartition(topic, p) for p in todo])
            todo -= {tp.partition for tp in positions if tp.offset >= ends[tp.partition]}
        return values
    finally:
        consumer.close()


def read_outputs(bootstrap: str, topics: TopicNames) -> Outputs:
    predictions: list[Prediction] = []
    markers: list[CheckpointEvaluated] = []
    commands: list[RelaunchCommand] = []
    letters: list[DeadLetter] = []
    undecodable = 0
    for topic in (topics.predictions, topics.commands, topics.dead_letters):
        for value in read_topic(bootstrap, topic):
            try:
                events = decode_each(value)
            except SchemaError:
                undecodable += 1
                continue
            for event in events:
                if isinstance(event, Prediction):
                    predictions.append(event)
                elif isinstance(event, CheckpointEvaluated):
                    markers.append(event)
                elif isinstance(event, RelaunchCommand):
                    commands.append(event)
                elif isinstance(event, DeadLetter):
                    letters.append(event)
    return Outputs(predictions, markers, commands, letters, undecodable)


def flag_times_from_stream(
    traces: Sequence[JobTrace], predictions: Sequence[Prediction]
) -> dict[str, np.ndarray]:
    """Per job, when each task was first predicted to straggle (NaN: never), from the prediction events."""
    index = {t.job_id: {task: i for i, task in enumerate(t.task_ids)} for t in traces}
    flags = {t.job_id: np.full(t.n_tasks, np.nan) for t in traces}
    for p in predictions:
        if p.is_straggler and p.job_id in flags:
            i = index[p.job_id].get(p.task_id)
            if i is not None and not np.isfinite(flags[p.job_id][i]):
                flags[p.job_id][i] = p.checkpoint_time
    return flags


def decision_latencies_ms(outputs: Outputs) -> list[float]:
    """From each boundary's produce time to the last prediction or command it caused, in ms."""
    last: dict[tuple[str, float], float] = {}
    started: dict[tuple[str, float], float] = {}
    for m in outputs.markers:
        if m.boundary_produced_at is not None:
            key = (m.job_id, m.checkpoint_time)
            started[key] = m.boundary_produced_at
            last[key] = max(last.get(key, 0.0), m.produced_at)
    for c in outputs.commands:
        key = (c.job_id, c.checkpoint_time)
        if key in last:
            last[key] = max(last[key], c.issued_at)
    return [1000.0 * (last[k] - started[k]) for k in started]


def score(traces: Sequence[JobTrace], outputs: Outputs, quantile: float = 0.9) -> dict[str, float]:
    """Mean per-job F1/TPR/FPR of the stream's flags against each job's true p90 stragglers."""
    flags = flag_times_from_stream(traces, outputs.predictions)
    rows = []
    for trace in traces:
        scored = trace.scored
        latency = trace.latency[scored]
        truth = latency >= oracle_threshold(latency, quantile)
        rows.append(confusion(truth, np.isfinite(flags[trace.job_id][scored])))
    return {
        "f1": float(np.mean([c.f1 for c in rows])),
        "tpr": float(np.mean([c.tpr for c in rows])),
        "fpr": float(np.mean([c.fpr for c in rows])),
    }


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


@contextmanager
def pipeline_processes(
    bootstrap: str,
    topics: TopicNames,
    group: str,
    *,
    method: str = "nurd",
    policy: str,
    seed: int = 0,
    checkpoint_seconds: float,
    datadir: Path,
    logs: Path,
    metrics_port: int | None = None,
    verbose: bool = False,
) -> Iterator[PipelineCheck]:
    """The worker and the mitigation consumer (group ``group``) as child processes on ``topics``,
    logging to ``logs``/worker.log and mitigator.log (at debug level with ``verbose``); with
    ``metrics_port``, the worker serves Prometheus metrics there and the mitigator at the next port.
    Yields the check that says which of them has exited, and with what last words."""
    common = ["--bootstrap", bootstrap, "--topic-prefix", topics.prefix]
    ports = {} if metrics_port is None else {"worker": metrics_port, "mitigate": metrics_port + 1}
    metrics = {name: ["--metrics-port", str(port)] for name, port in ports.items()}
    worker = ["worker", *common, "--method", method, "--seed", str(seed), "--datadir", str(datadir)]
    mitigate = ["mitigate", *common, "--policy", policy, "--group", group]
    mitigate += ["--checkpoint-seconds", str(checkpoint_seconds)]
    if verbose:
        worker += ["--loglevel", "debug"]
        mitigate += ["--verbose"]
    logged = {"worker": logs / "worker.log", "mitigator": logs / "mitigator.log"}
    with (
        child_process([*worker, *metrics.get("worker", [])], logged["worker"]) as worker_process,
        child_process([*mitigate, *metrics.get("mitigate", [])], logged["mitigator"]) as mitigator_process,
    ):
        processes = {"worker": worker_process, "mitigator": mitigator_process}
        yield partial(exited_child, processes, logged)


def exited_child(processes: Mapping[str, subprocess.Popen[bytes]], logs: Mapping[str, Path]) -> str | None:
    """Which of ``processes`` has exited, its status and the last line it logged; None while all run."""
    for name, process in processes.items():
        code = process.poll()
        if code is not None:
            return f"the {name} exited with status {code}: {last_words(logs[name])} (log: {logs[name]})"
    return None


def last_words(log: Path) -> str:
    """The last line of a child's log that is not librdkafka's own, or a note that none is."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    said = [line.strip() for line in lines if line.strip() and not _librdkafkas(line)]
    return said[-1] if said else "nothing logged"


def _librdkafkas(line: str) -> bool:
    """A line of librdkafka's: printed by it (``%N|...``) or through the quiet logger."""
    return line.startswith("%") or f" {LIBRDKAFKA_LOGGER}: " in line


def closed_loop_replay(
    traces: Sequence[JobTrace],
    bootstrap: str,
    topics: TopicNames,
    group: str,
    *,
    checkpoint_seconds: float,
    speed: float = 0.0,
    seed: int = 0,
    progress: bool = False,
    pipeline_check: PipelineCheck | None = None,
) -> ReplayResult:
    """The closed-loop replay of ``traces`` through the running pipeline whose mitigator consumes as
    ``group``; ``checkpoint_seconds`` is the pipeline's checkpoint grid; ``pipeline_check`` (from
    `pipeline_processes`) ends it at once when a stage has exited."""
    return TraceReplayer(
        traces,
        bootstrap,
        topics=topics,
        speed=speed,
        closed_loop=True,
        seed=seed,
        mitigator_group=group,
        progress=progress,
        checkpoint_seconds=checkpoint_seconds,
        pipeline_check=pipeline_check,
    ).run()


def run_replay(
    traces: Sequence[JobTrace],
    *,
    policy: str,
    out: Path,
    bootstrap: str | None = None,
    method: str = "nurd",
    speed: float = 0.0,
    seed: int = 0,
    checkpoint_seconds: float = 300.0,
    progress: bool = True,
    metrics_port: int | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """Replay ``traces`` through the whole pipeline; write ``summary.json`` and ``report.md`` in ``out``.

    ``metrics_port``: the worker serves Prometheus metrics there, the mitigator at the next port;
    ``verbose``: both log at debug level. Raises `producers.replayer.PipelineDown` as soon as either
    exits, with its last log line."""
    from straggler.kafka.embedded import embedded_kafka
    from straggler.kafka.topics import create_topics

    out.mkdir(parents=True, exist_ok=True)
    topics = TopicNames(f"replay-{uuid.uuid4().hex[:8]}-")
    group = f"{topics.prefix}mitigation"
    with ExitStack() as stack:
        if bootstrap is None:
            bootstrap = stack.enter_context(embedded_kafka())
        create_topics(bootstrap, prefix=topics.prefix)
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="straggler-replay-")))
        log.info(
            "replay: %d jobs, method %s, policy %s, broker %s, topics %s*, logs in %s",
            len(traces),
            method,
            policy,
            bootstrap,
            topics.prefix,
            out,
        )
        check = stack.enter_context(
            pipeline_processes(
                bootstrap,
                topics,
                group,
                method=method,
                policy=policy,
                seed=seed,
                checkpoint_seconds=checkpoint_seconds,
                datadir=workdir / "faust",
                logs=out,
                metrics_port=metrics_port,
                verbose=verbose,
            )
        )
        result = closed_loop_replay(
            traces,
            bootstrap,
            topics,
            group,
            checkpoint_seconds=checkpoint_seconds,
            speed=speed,
            seed=seed,
            progress=progress,
            pipeline_check=check,
        )
        outputs = read_outputs(bootstrap, topics)
    summary = replay_summary(
        traces,
        result,
        outputs,
        method=method,
        policy=policy,
        seed=seed,
        checkpoint_seconds=checkpoint_seconds,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "commands.jsonl").write_bytes(b"".join(encode(c) + b"\n" for c in outputs.commands))
    (out / "report.md").write_text(_report(summary))
    return summary


def replay_summary(
    traces: Sequence[JobTrace],
    result: ReplayResult,
    outputs: Outputs,
    *,
    method: str,
    policy: str,
    seed: int,
    checkpoint_seconds: float,
) -> dict[str, Any]:
    """What ``summary.json`` holds for a closed-loop replay of ``traces`` (``result``) whose output
    topics read back as ``outputs``."""
    accuracy = score(traces, outputs)
    latencies = decision_latencies_ms(outputs)
    outcomes = [result.outcomes[t.job_id] for t in traces]
    limits = [limit_outcome(t, seed, checkpoint_interval(t, checkpoint_seconds)) for t in traces]
    cost = mean_figures([figures(o) for o in outcomes])
    jct = float(np.mean([o.reduction for o in outcomes])) if outcomes else 0.0
    limit = float(np.mean([o.reduction for o in limits])) if limits else 0.0
    actions: dict[str, int] = {}
    for command in outputs.commands:
        actions[command.action] = actions.get(command.action, 0) + 1
    machine = [o.machine for o in outcomes if o.machine is not None]
    summary: dict[str, Any] = {
        "method": method,
        "policy": policy,
        "jobs": len(traces),
        "jct_reduction": jct,
        "mean_jct_before": _finite_mean([o.jct_before for o in outcomes]),
        "mean_jct_after": _finite_mean([o.jct_after for o in outcomes]),
        "extra_machine_time": float(np.mean([o.extra_machine_time for o in outcomes])) if outcomes else 0.0,
        **{key: cost[key] for key in ("gross_extra_machine_time", "net_extra_machine_time")},
        "extra_machine_seconds": float(sum(m.extra_attempts for m in machine)),
        **{key: cost[key] for key in ("copies", "copies_won", "copies_lost")},
        "limit_jct_reduction": limit,
        "fraction_of_limit": jct / limit if limit > 0 else None,
        "jobs_longer": sum(o.reduction < -1e-12 for o in outcomes),
        "events_produced": result.events_produced,
        "predictions": len(outputs.predictions),
        "commands": len(outputs.commands),
        "commands_by_action": actions,
        "dead_letters": len(outputs.dead_letters),
        **accuracy,
        "decision_latency_ms": {"p50": _percentile(latencies, 50), "p99": _percentile(latencies, 99)},
        "replay_seconds": result.wall_seconds,
    }
    return summary


def _finite_mean(values: Sequence[float]) -> float | None:
    """Mean of the finite ``values``; None when there is none (JSON has no NaN)."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def _report(summary: dict[str, Any]) -> str:
    latency = summary["decision_latency_ms"]
    fmt = lambda v: "n/a" if v is None else f"{v:.1f}"  # noqa: E731
    share = summary["fraction_of_limit"]
    by_action = ", ".join(f"{n} {a}" for a, n in sorted(summary["commands_by_action"].items())) or "none"
    return (
        f"# Closed-loop replay through Kafka\n\n"
        f"Method `{summary['method']}`, policy `{summary['policy']}`, {summary['jobs']} jobs.\n\n"
        f"**Completion time {summary['jct_reduction']:+.1%}** (mean over jobs; positive is sooner) for "
        f"**{summary['gross_extra_machine_time']:+.1%} machine time gross** "
        f"({summary['net_extra_machine_time']:+.1%} net of what winning copies saved; every task, scored "
        f"or not); the limit on the same jobs and draws is {summary['limit_jct_reduction']:+.1%}, so this "
        f"reaches {'n/a' if share is None else f'{share:.0%}'} of it. Copies: {summary['copies']}, "
        f"{summary['copies_won']} won their race, {summary['copies_lost']} lost; attempts beyond each "
        f"task's first ran {summary['extra_machine_seconds'] / 3600:,.1f} machine-hours in all. "
        f"Mean completion time {fmt(summary['mean_jct_after'])} s "
        f"({fmt(summary['mean_jct_before'])} s as traced). Jobs made longer: {summary['jobs_longer']}.\n\n"
        "| events produced | predictions | commands | dead letters | F1 | TPR | FPR "
        "| decision latency p50 / p99 (ms) |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| {summary['events_produced']} | {summary['predictions']} | {summary['commands']} ({by_action}) "
        f"| {summary['dead_letters']} | {summary['f1']:.3f} | {summary['tpr']:.3f} | {summary['fpr']:.3f} "
        f"| {fmt(latency['p50'])} / {fmt(latency['p99'])} |\n\n"
        "Completion time: from the commands the closed loop carried out (a new run's latency is drawn "
        "from the job's latencies, fixed seed; a speculative copy races the original, first finisher "
        "wins). Machine time gross: the runs of every attempt beyond each task's first (copies, "
        "relaunches) until it ended or was killed, as a share of the trace's own runs; net: all runs after "
        "the commands less the trace's own. Limit: a copy of every true p90 straggler at the first "
        "checkpoint it runs (future information). F1/TPR/FPR: the stream's first straggler prediction "
        "per task against the job's true p90 stragglers, mean over jobs. Decision latency: from a "
        "checkpoint boundary's produce time to the last prediction or command it caused.\n"
    )
