"""Decision latency under load, and the agent's memory per job.

Latency: from a checkpoint boundary's produce time to the last prediction or command it causes, the
worker and the mitigation consumer as subprocesses, the replay at a constant speed whose mean load is
``--rate`` task observations per second (the trace's own shape: the jobs start together, so most
observations come in a burst far above the mean; the run prints its peak), or with ``--pace steady``
at that rate every second (which crosses the trace's quiet tail fast: a storm of boundaries).
Memory: per tracked task (tracemalloc) and the worker's VmRSS. Method: docs/performance.md, "How to run
each benchmark".

    .venv/bin/python bench/latency.py [--quick] [--json runs/bench/latency.json] [--bootstrap B]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import (
    GroupProgress,
    broker,
    concurrent_jobs,
    fresh_prefix,
    machine,
    percentile,
    rss_kib,
    table,
    topic_end_offsets,
    wait_group_stable,
    write_outputs,
)
from matplotlib.figure import Figure

from pipeline.settings import WorkerSettings, app_id
from producers.replayer import TraceReplayer
from straggler.core.jobstate import JobState
from straggler.core.jobtrace import JobTrace
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import Outputs, child_process, decision_latencies_ms, read_outputs

N_FEATURES = 9
"""The synthetic generator's feature count (7 usage rates + 2 event counts)."""


def bytes_per_task(n_tasks: int, n_features: int = N_FEATURES) -> float:
    """Python heap held by one job's state per tracked task (ids, records, feature vectors)."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(n_tasks, n_features))
    ids = [f"task-{i:06d}" for i in range(n_tasks)]  # built before tracing: the stream's decoded ids
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    state = JobState("job-memory", n_features, n_tasks)
    for i, task_id in enumerate(ids):
        state.observe_running(task_id, features[i], 0.0, 60.0)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(state.tasks) == n_tasks
    return (after - before) / n_tasks


class RssSampler:
    """Samples a process's VmRSS in the background: the peak, and the series for the plot."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._began = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = rss_kib(self.pid)
            if rss is None:
                return
            self.samples.append((time.monotonic() - self._began, rss))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def peak_kib(self) -> int:
        return max((rss for _, rss in self.samples), default=0)


def speed_for_rate(traces: list[JobTrace], rate: float) -> tuple[float, int, float]:
    """The replay speed that makes the open loop carry ``rate`` events/s; also events and trace span."""
    events = sum(sum(len(r) for r in t.running_index) + t.n_tasks + len(t.checkpoints) + 2 for t in traces)
    first = min(float(t.checkpoints[0]) for t in traces)
    last = max(float(t.checkpoints[-1]) for t in traces)
    span = last - first
    return rate * span / events, events, span


def offered_peaks(traces: list[JobTrace], steady: bool, rate: float, speed: float) -> dict[str, float]:
    """The most observations and boundaries the replay offers in one second of wall time.

    Each instant's wall time is where the pacing puts it: ``(T - first T) / speed``, or for a steady
    replay the observations before it divided by ``rate``. The jobs start together, so the trace's own
    shape offers most observations in its first minutes, and a steady replay crosses the quiet tail of
    the trace (a few running tasks per job) so fast that its boundaries come by the thousand per second.
    """
    counts: dict[float, list[int]] = {}
    for trace in traces:
        for t, running in zip(trace.checkpoints, trace.running_index, strict=True):
            entry = counts.setdefault(float(t), [0, 0])
            entry[0] += len(running)
            entry[1] += 1
    instants = sorted(counts)
    observations = np.array([counts[t][0] for t in instants], dtype=float)
    boundaries = np.array([counts[t][1] for t in instants], dtype=float)
    if steady:
        wall = np.concatenate([[0.0], np.cumsum(observations)[:-1]]) / rate
    else:
        wall = (np.array(instants) - instants[0]) / speed
    second = np.floor(wall).astype(np.int64)
    return {
        "peak_observations_per_second": float(np.bincount(second, weights=observations).max()),
        "peak_boundaries_per_second": float(np.bincount(second, weights=boundaries).max()),
    }


OVERLOAD_GROWTH_MS = 1000.0
"""Median latency growing by more than this over a run means a backlog, not a steady state."""
OVERLOAD_MEDIAN_MS = 1000.0
"""A median decision over a second means boundaries wait in a queue (or the worker gets no CPU)."""


def queueing_growth(outputs: Outputs) -> float | None:
    """Median latency of the last quarter of boundaries minus that of the first quarter (ms)."""
    markers = sorted(
        (m for m in outputs.markers if m.boundary_produced_at is not None),
        key=lambda m: m.boundary_produced_at or 0.0,
    )
    if len(markers) < 8:
        return None
    quarter = len(markers) // 4
    first = [1000.0 * (m.produced_at - (m.boundary_produced_at or 0.0)) for m in markers[:quarter]]
    last = [1000.0 * (m.produced_at - (m.boundary_produced_at or 0.0)) for m in markers[-quarter:]]
    return float(np.median(last) - np.median(first))


def wait_drained(
    bootstrap: str, topics: TopicNames, worker_group: str, mitigator_group: str, timeout: float
) -> bool:
    """Wait until the worker has committed all its input and the mitigator all the predictions."""
    inputs = topic_end_offsets(bootstrap, [topics.checkpoints, topics.job_events])
    worker = GroupProgress(bootstrap, worker_group, list(inputs))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if worker.committed() >= sum(inputs.values()):
                break
            time.sleep(0.5)
        else:
            return False
    finally:
        worker.close()
    predictions = topic_end_offsets(bootstrap, [topics.predictions])
    mitigator = GroupProgress(bootstrap, mitigator_group, list(predictions))
    try:
        while time.monotonic() < deadline:
            if mitigator.committed() >= sum(predictions.values()):
                return True
            time.sleep(0.5)
        return False
    finally:
        mitigator.close()


def _pair(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{percentile(values, 50):,.1f} / {percentile(values, 99):,.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer, smaller jobs (about a minute)")
    parser.add_argument("--jobs", type=int, default=None, help="concurrent jobs (default 100, quick 6)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per job (default 1000, quick 150)")
    parser.add_argument(
        "--rate", type=float, default=None, help="observations per second offered (default 300, quick 80)"
    )
    parser.add_argument(
        "--pace",
        choices=("steady", "trace"),
        default="trace",
        help="trace: the trace's shape at a constant speed whose mean is --rate (the issue's figures); "
        "steady: --rate observations every second",
    )
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of boundaries left out")
    parser.add_argument("--policy", default="unlimited", help="mitigation policy")
    parser.add_argument("--method", default="nurd", help="the worker's method (`reactive`: no model)")
    parser.add_argument(
        "--checkpoint-seconds", type=float, default=60.0, help="the jobs' checkpoint interval"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bootstrap", default=None, help="an existing broker (default: start an embedded one)"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the figures here (and a PNG beside it)"
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds to wait for the pipeline to drain"
    )
    args = parser.parse_args()
    n_jobs = args.jobs or (6 if args.quick else 100)
    n_tasks = args.tasks or (150 if args.quick else 1000)
    rate = args.rate or (80.0 if args.quick else 300.0)
    out = (args.json.parent if args.json else Path(tempfile.gettempdir())) / "logs"
    out.mkdir(parents=True, exist_ok=True)

    per_task = {n: bytes_per_task(n) for n in (1000, 10_000)}
    traces = concurrent_jobs(n_jobs, n_tasks, seed=args.seed, checkpoint_seconds=args.checkpoint_seconds)
    speed, expected_events, span = speed_for_rate(traces, rate)
    print(f"{n_jobs} jobs x {n_tasks} tasks: ~{expected_events:,} events over {span:,.0f} s of trace time;")
    peaks = offered_peaks(traces, args.pace == "steady", rate, speed)
    print(
        f"offered at most {peaks['peak_observations_per_second']:,.0f} observations and "
        f"{peaks['peak_boundaries_per_second']:,.0f} boundaries in one second of the replay"
    )
    if args.pace == "trace":
        print(f"replay speed {speed:.1f}x -> ~{rate:,.0f} events/s (mean), ~{expected_events / rate:,.0f} s")
    else:
        print(f"replay paced at a steady {rate:,.0f} observations/s, ~{expected_events / rate:,.0f} s")
    topics = TopicNames(fresh_prefix("latency"))
    mitigator_group = f"{topics.prefix}mitigation"
    with broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory(prefix="bench-latency-") as workdir:
        create_topics(bootstrap, prefix=topics.prefix)
        worker_group = app_id(WorkerSettings(bootstrap=bootstrap, topics=topics))
        common = ["--bootstrap", bootstrap, "--topic-prefix", topics.prefix]
        worker_args = [
            "worker",
            *common,
            "--datadir",
            workdir,
            "--seed",
            str(args.seed),
            "--method",
            args.method,
        ]
        mitigator_args = ["mitigate", *common, "--policy", args.policy, "--group", mitigator_group]
        mitigator_args += ["--checkpoint-seconds", str(args.checkpoint_seconds)]
        with (
            child_process(worker_args, out / "latency-worker.log") as worker,
            child_process(mitigator_args, out / "latency-mitigator.log"),
            RssSampler(worker.pid) as rss,
        ):
            wait_group_stable(bootstrap, worker_group, 120.0)
            wait_group_stable(bootstrap, mitigator_group, 120.0)
            idle_rss_kib = rss_kib(worker.pid) or 0
            replay_began = time.time()
            steady = args.pace == "steady"
            pacing: dict[str, Any] = {"observations_per_second": rate} if steady else {"speed": speed}
            result = TraceReplayer(traces, bootstrap, topics=topics, seed=args.seed, **pacing).run()
            print("waiting for the worker and the mitigator to drain ...")
            drained = wait_drained(bootstrap, topics, worker_group, mitigator_group, args.timeout)
        outputs = read_outputs(bootstrap, topics)

    warm = {
        (m.job_id, m.checkpoint_time)
        for m in outputs.markers
        if m.boundary_produced_at is not None and m.boundary_produced_at >= replay_began + args.warmup
    }
    all_latencies = decision_latencies_ms(outputs)
    warm_outputs = type(outputs)(
        outputs.predictions,
        [m for m in outputs.markers if (m.job_id, m.checkpoint_time) in warm],
        outputs.commands,
        outputs.dead_letters,
        outputs.undecodable,
    )
    latencies = decision_latencies_ms(warm_outputs) or all_latencies
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    backlog = queueing_growth(warm_outputs)
    worker_only = [
        1000.0 * (m.produced_at - m.boundary_produced_at)
        for m in warm_outputs.markers
        if m.boundary_produced_at is not None
    ]
    figures: dict[str, Any] = {
        "p99_ms": p99,
        "p50_ms": p50,
        "max_ms": max(latencies) if latencies else None,
        "worker_marker_p50_ms": percentile(worker_only, 50),
        "worker_marker_p99_ms": percentile(worker_only, 99),
        "p99_ms_including_warmup": percentile(all_latencies, 99),
        "boundaries_measured": len(latencies),
        "boundaries_produced": len(result.boundary_produced_at),
        "targets": {"p99_ms": 200.0},
        "drained": drained,
        "overloaded": (backlog is not None and backlog > OVERLOAD_GROWTH_MS)
        or (p50 is not None and p50 > OVERLOAD_MEDIAN_MS),
        "latency_growth_ms": backlog,
        "method": args.method,
        "checkpoint_seconds": args.checkpoint_seconds,
        "jobs": n_jobs,
        "tasks_per_job": n_tasks,
        "pace": args.pace,
        "offered_rate_observations_per_second": rate,
        "offered_peaks": peaks,
        "achieved_rate_observations_per_second": result.observations_produced / result.wall_seconds,
        "observations_produced": result.observations_produced,
        "events_produced": result.events_produced,
        "replay_seconds": result.wall_seconds,
        "replay_speed": speed if args.pace == "trace" else None,
        "predictions": len(outputs.predictions),
        "relaunch_commands": len(outputs.commands),
        "dead_letters": len(outputs.dead_letters),
        "memory": {
            "bytes_per_task_jobstate": per_task,
            "worker_idle_rss_mib": idle_rss_kib / 1024,
            "worker_peak_rss_mib": rss.peak_kib / 1024,
            "worker_rss_per_task_in_flight_bytes": 1024 * (rss.peak_kib - idle_rss_kib) / (n_jobs * n_tasks),
        },
        "quick": args.quick,
        "machine": machine(),
    }
    print()
    print(
        table(
            [
                ["decision latency p50 (ms)", p50 if p50 is not None else "n/a"],
                ["decision latency p99 (ms), target <= 200", p99 if p99 is not None else "n/a"],
                ["worker marker only p50 / p99 (ms)", _pair(worker_only)],
                ["boundaries measured", len(latencies)],
                [
                    f"offered ({args.pace}) / achieved observations/s",
                    f"{rate:,.0f} / {figures['achieved_rate_observations_per_second']:,.0f}",
                ],
                [
                    "offered at most, in one second: observations / boundaries",
                    f"{peaks['peak_observations_per_second']:,.0f}"
                    f" / {peaks['peak_boundaries_per_second']:,.0f}",
                ],
                [
                    "JobState bytes per task (1k / 10k tasks)",
                    f"{per_task[1000]:,.0f} / {per_task[10_000]:,.0f}",
                ],
                ["worker RSS idle / peak (MiB)", f"{idle_rss_kib / 1024:,.0f} / {rss.peak_kib / 1024:,.0f}"],
                [
                    "predictions / commands / dead letters",
                    f"{len(outputs.predictions):,} / {len(outputs.commands):,} "
                    f"/ {len(outputs.dead_letters):,}",
                ],
            ],
            ["figure", "value"],
        )
    )
    if figures["overloaded"]:
        print(
            f"WARNING: median {p50:,.0f} ms, growth {backlog or 0:,.0f} ms from the first to the last "
            "quarter of the run: the offered rate exceeds what the pipeline sustains here (or the worker "
            "gets too little CPU), so these figures measure a queue; lower --rate or free the machine"
        )
    if not drained:
        print("WARNING: the pipeline had not drained within --timeout; the figures miss late boundaries")
    print(f"load: {figures['machine']['uptime']}")

    def plot(figure: Figure) -> None:
        left = figure.add_subplot(1, 2, 1)
        if latencies:
            ordered = np.sort(latencies)
            left.plot(ordered, np.arange(1, len(ordered) + 1) / len(ordered))
            left.set_xscale("log")
        left.axvline(200, color="red", linestyle="--", label="target p99: 200 ms")
        left.set_xlabel("decision latency (ms)")
        left.set_ylabel("share of boundaries")
        left.set_title(f"{n_jobs} jobs x {n_tasks} tasks, {rate:,.0f} ev/s")
        left.legend()
        right = figure.add_subplot(1, 2, 2)
        if rss.samples:
            t, kib = zip(*rss.samples, strict=True)
            right.plot(t, np.asarray(kib) / 1024)
        right.set_xlabel("seconds since the worker started")
        right.set_ylabel("worker RSS (MiB)")
        right.set_title("worker resident memory")

    write_outputs(figures, args.json, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
