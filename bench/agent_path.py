"""Microseconds per task observation in each stage of the agent's path, without a broker.

The records are the replayer's own (`TraceReplayer` encodes synthetic jobs of 1,000 tasks); the
stages are the calls `pipeline.handler` makes for them: decode and check a record, apply its
observations to the job, write the job's changed task rows, the model (`JobStore.evaluate`'s steps), and
build a checkpoint's prediction parts. Each repetition runs on fresh tables; the digest of every
record written (prediction parts, task rows) must not change when the path gets cheaper: it is the
worker's decision hash (the task rows of a job are deleted when it ends, so the parts decide it).

    .venv/bin/python bench/agent_path.py [--jobs 2] [--repeat 3] [--method nurd]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from typing import Any

from benchlib import concurrent_jobs, machine

from pipeline.handler import InputRecord, JobEventHandler
from pipeline.jobstore import JobStore, new_online_job
from producers.replayer import ReplayResult, TraceReplayer, ended_event, started_event
from schemas import (
    CheckpointBoundary,
    Event,
    JobEvent,
    TaskBatch,
    TaskCheckpoint,
    TaskObservations,
    encode,
    task_batches,
)
from straggler.core.jobtrace import JobTrace
from straggler.core.registry import make_method
from straggler.native_calls import install as install_native_calls
from straggler.simulation import JobSimulation

STAGES = ("decode", "apply", "write", "model", "predictions")
WALL_CLOCK = 1.7e9
"""Every record's ``produced_at``, so the digest compares runs."""


def replayed_records(traces: Sequence[JobTrace]) -> list[InputRecord]:
    """Each job's records as the replayer produces them in open loop: start, then per checkpoint its
    task batches and boundary, then the end (jobs one after another)."""
    replayer = TraceReplayer(traces, "unused:0", progress=False)
    records: list[InputRecord] = []

    def send(topic: str, job_id: str, event: Event) -> None:
        if isinstance(event, CheckpointBoundary):
            event = replace(event, produced_at=WALL_CLOCK)
        records.append(_record(job_id, encode(event)))

    def send_tasks(topic: str, job_id: str, events: Sequence[TaskCheckpoint]) -> None:
        payloads = task_batches(job_id, events, source=events[0].source, produced_at=WALL_CLOCK)
        records.extend(_record(job_id, payload) for payload in payloads)

    result = ReplayResult(0, 0, len(traces), 0, 0.0)
    for trace in traces:
        sim = JobSimulation(trace, 0)
        send("", trace.job_id, started_event(trace))
        for k, t in enumerate(trace.checkpoints):
            replayer._publish_checkpoint(sim, sim.step(k, float(t)), send, send_tasks, result)
        send("", trace.job_id, ended_event(trace, float(trace.checkpoints[-1])))
    return records


def run_once(records: Sequence[InputRecord], method: str) -> tuple[dict[str, float], int, str]:
    """Seconds per stage, observations, and the digest of every prediction part and task row."""
    tasks: dict[bytes, bytes] = {}
    jobs: dict[bytes, bytes] = {}
    models: dict[bytes, bytes] = {}
    protocol = {"quantile": 0.9, "start_fraction": 0.04, "refit_growth": 0.25}
    store = JobStore(tasks, jobs, models, new_online_job(lambda: make_method(method, 0), protocol))
    handler = JobEventHandler(store, method, partitions=1, pending_grace=60.0, wall_clock=lambda: WALL_CLOCK)
    seconds = dict.fromkeys(STAGES, 0.0)
    digest = hashlib.sha256()
    observed = 0
    clock: Callable[[], float] = time.perf_counter
    for record in records:
        t0 = clock()
        event = handler.admit(record)
        if isinstance(event, TaskBatch | TaskCheckpoint):  # one observation, or a batch with a bad one
            event = _returned(handler._observations(record, event))
        t1 = clock()
        seconds["decode"] += t1 - t0
        if isinstance(event, JobEvent):
            list(handler._apply_job_event(event))  # a generator: its actions (none without a broker)
        elif isinstance(event, TaskObservations):
            observed += len(event.observations)
            handler._apply_tasks(event)
            t2 = clock()
            store.write_task_rows()  # as a group commit writes them
            t3 = clock()
            seconds["apply"] += t2 - t1
            seconds["write"] += t3 - t2
        elif isinstance(event, CheckpointBoundary):
            parts, model_seconds, build_seconds = _evaluate(handler, event)
            seconds["model"] += model_seconds
            seconds["predictions"] += build_seconds
            for part in parts:
                digest.update(part)
    store.write_job_rows()  # a commit deletes the ended jobs' rows
    for key in sorted(tasks):
        digest.update(key + tasks[key])
    return seconds, observed, digest.hexdigest()[:16]


def _returned(steps: Generator[Any, None, TaskObservations]) -> TaskObservations:
    """What a generator returns, once it has yielded everything (dead letters, none here)."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def _record(job_id: str, value: bytes) -> InputRecord:
    return InputRecord(job_id.encode(), value, "in", 0, 0)


def _evaluate(handler: JobEventHandler, boundary: CheckpointBoundary) -> tuple[list[bytes], float, float]:
    """The handler's checkpoint (`JobEventHandler._evaluate`), its model and its records timed apart."""
    parts: list[bytes] = []
    model_seconds = 0.0
    actions = handler._apply_boundary(boundary)
    store = handler.store
    evaluate = store.evaluate

    def timed_evaluate(*args: Any) -> Any:
        nonlocal model_seconds
        started = time.perf_counter()
        try:
            return evaluate(*args)
        finally:
            model_seconds += time.perf_counter() - started

    store.evaluate = timed_evaluate  # type: ignore[method-assign,assignment]
    started = time.perf_counter()
    try:
        for action in actions:
            value = getattr(action, "value", None)
            if isinstance(value, bytes):
                parts.append(value)
    finally:
        del store.evaluate
    total = time.perf_counter() - started
    return parts, model_seconds, total - model_seconds


def main() -> int:
    install_native_calls()  # as the worker does (`straggler.cli.main`)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--method", default="nurd")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    traces = concurrent_jobs(args.jobs, args.tasks, seed=args.seed)
    records = replayed_records(traces)
    print(f"{len(records)} records; load average {machine()['load_average'][0]:.2f}")
    print(f"{'run':>4} " + " ".join(f"{s:>12}" for s in STAGES) + f" {'outside':>9} {'digest':>17}")
    for run in range(args.repeat):
        seconds, observed, digest = run_once(records, args.method)
        per = {s: 1e6 * seconds[s] / observed for s in STAGES}
        outside = sum(v for s, v in per.items() if s != "model")
        print(f"{run:>4} " + " ".join(f"{per[s]:>12.2f}" for s in STAGES) + f" {outside:>9.2f} {digest:>17}")
    print(f"µs per observation ({observed} observations); 'outside' excludes the model")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
