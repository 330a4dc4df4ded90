"""Task observations per second through the whole pipeline, against a raw consumer on the same topics.

A raw consumer that only decodes is the ceiling of one Python process; the ratio says how much of it
the pipeline keeps. Both read the same synthetic replay, produced before either starts.
Method: docs/performance.md, "How to run each benchmark".

    .venv/bin/python bench/throughput.py [--quick] [--json runs/bench/throughput.json] [--bootstrap B]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from benchlib import (
    GroupProgress,
    broker,
    concurrent_jobs,
    cpu_seconds,
    fresh_prefix,
    machine,
    machine_busy_seconds,
    rss_kib,
    table,
    topic_end_offsets,
    write_outputs,
)
from confluent_kafka import Consumer, TopicPartition
from faust_floor import OutputShape, floor_settings
from matplotlib.figure import Figure
from tqdm import tqdm

from pipeline.faust_app import TABLES, changelog_topics, create_changelog_topics
from pipeline.settings import WorkerSettings, app_id
from producers.replayer import TraceReplayer
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import child_process, read_topic

BATCH = 10_000
POLL_SECONDS = 0.2
MAX_RAW_PASSES = 50
MIN_COMMITS = 8
"""Fewer commits than this in a window (the worker commits every second): its rate is not resolved."""


Cumulative = dict[tuple[str, int], np.ndarray]
"""Per partition, observations carried by the records before each offset (index: offset)."""


def carried_by(value: bytes) -> tuple[int, bool]:
    """One decoded record's task observations (a batch's count, 1 for a single task event, else 0) and
    whether it is a checkpoint boundary."""
    obj = orjson.loads(value)
    kind = obj.get("type") if isinstance(obj, dict) else None
    if kind == "task_batch":
        return len(obj.get("observations", ())), False
    return (1 if kind == "task_checkpoint" else 0), kind == "checkpoint_boundary"


def raw_rate(
    bootstrap: str,
    ends: dict[tuple[str, int], int],
    timeout: float,
    cumulative: Cumulative,
    min_seconds: float = 5.0,
) -> dict[str, float]:
    """Drain the partitions with a bare consumer (decode only); rates from first batch to last record.

    A small topic drains in well under a second, too short to time: the consumer then reads it again
    from the start, pass after pass, until ``min_seconds`` have passed (at most `MAX_RAW_PASSES`).
    The first pass fills ``cumulative`` (observations before each offset).
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    total = sum(ends.values())
    assignment = [TopicPartition(topic, p, 0) for (topic, p), end in ends.items() if end > 0]
    counted = 0
    counted_observations = 0
    passes = 0
    per_offset = {tp: np.zeros(end, dtype=np.int64) for tp, end in ends.items()}
    began: float | None = None
    decoded_bytes = 0
    boundaries = 0
    deadline = time.monotonic() + timeout
    bar = tqdm(total=total, unit="ev", desc="raw consumer", unit_scale=True)
    try:
        while passes < MAX_RAW_PASSES and (began is None or time.monotonic() - began < min_seconds):
            consumer.assign(assignment)
            seen = 0
            bar.reset()
            while seen < total and time.monotonic() < deadline:
                good = 0
                good_observations = 0
                # No more than what is left: consume() waits out its timeout for a batch it cannot fill.
                for message in consumer.consume(num_messages=min(BATCH, total - seen), timeout=1.0):
                    if message.error() is not None:
                        continue
                    value = message.value() or b""
                    carried, boundary = carried_by(value)
                    if passes == 0:
                        where = (message.topic() or "", message.partition() or 0)
                        per_offset[where][message.offset() or 0] = carried
                        boundaries += boundary
                    decoded_bytes += len(value)
                    good += 1
                    good_observations += carried
                seen += good
                if began is None and good:
                    began = time.monotonic()  # the first batch includes connection set-up: not counted
                else:
                    counted += good
                    counted_observations += good_observations
                bar.update(good)
            if seen < total:
                raise TimeoutError(f"raw consumer read {seen} of {total} events in {timeout:g} s")
            passes += 1
        ended = time.monotonic()
    finally:
        bar.close()
        consumer.close()
    assert began is not None
    for tp, counts in per_offset.items():
        cumulative[tp] = np.concatenate([[0], np.cumsum(counts)])
    return {
        **rates(counted, counted_observations, ended - began),
        "passes": float(passes),
        "mean_event_bytes": decoded_bytes / max(passes * total, 1),
        "boundaries": float(boundaries),
    }


def rates(events: int, observations: int, seconds: float) -> dict[str, float]:
    """Records and task observations read in ``seconds``, and their rates (NaN over no time)."""
    return {
        "events": float(events),
        "observations": float(observations),
        "seconds": seconds,
        "events_per_second": events / seconds if seconds > 0 else float("nan"),
        "observations_per_second": observations / seconds if seconds > 0 else float("nan"),
    }


@dataclass(frozen=True)
class Input:
    """The replayed input both Faust workers read, and where their logs go."""

    bootstrap: str
    topics: TopicNames
    ends: dict[tuple[str, int], int]
    cumulative: Cumulative
    out: Path
    timeout: float


def pipeline_rate(given: Input, method: str = "nurd") -> dict[str, float]:
    """Run the Faust worker until its committed offsets reach the end; rates between commits."""
    group = app_id(settings_for(given.bootstrap, given.topics))
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as workdir:
        args = ["worker", "--bootstrap", given.bootstrap, "--topic-prefix", given.topics.prefix]
        args += ["--datadir", workdir, "--method", method]
        with child_process(args, given.out / "throughput-worker.log") as worker:
            return committed_rate(given, group, worker, "pipeline")


def floor_rate(given: Input, shape: OutputShape) -> dict[str, float]:
    """Run `bench/faust_floor.py` (Faust moving the same records, no work) until it has committed all."""
    settings = floor_settings(given.bootstrap, given.topics.prefix, None)
    create_changelog_topics(settings)
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as workdir:
        args = ["--bootstrap", given.bootstrap, "--topic-prefix", given.topics.prefix, "--datadir", workdir]
        args += ["--shape", shape.to_json()]
        script = [str(Path(__file__).with_name("faust_floor.py"))]
        with child_process(args, given.out / "throughput-floor.log", program=script) as floor:
            return committed_rate(given, app_id(settings), floor, "floor")


def committed_rate(given: Input, group: str, worker: subprocess.Popen[bytes], name: str) -> dict[str, float]:
    """Watch ``group``'s committed offsets until they reach the end; rates between its commits."""
    bootstrap, ends, cumulative, out, timeout = (
        given.bootstrap,
        given.ends,
        given.cumulative,
        given.out,
        given.timeout,
    )
    total = sum(ends.values())
    progress = GroupProgress(bootstrap, group, list(ends))
    samples: list[tuple[float, int, int, float, float]] = []
    peak_rss = 0
    launched = time.monotonic()
    bar = tqdm(total=total, unit="ev", desc=f"{name} (committed)", unit_scale=True)
    try:
        deadline = launched + timeout
        done = 0
        while done < total and time.monotonic() < deadline:
            if worker.poll() is not None:
                raise RuntimeError(f"the {name} worker exited with {worker.returncode}; see its log in {out}")
            offsets = progress.by_partition()
            done = sum(offsets.values())
            observed = sum(int(cumulative[tp][offset]) for tp, offset in offsets.items())
            now = time.monotonic()
            if done and (not samples or done != samples[-1][1]):
                samples.append((now, done, observed, cpu_seconds(worker.pid) or 0.0, machine_busy_seconds()))
                bar.update(done - bar.n)
            peak_rss = max(peak_rss, rss_kib(worker.pid) or 0)
            time.sleep(POLL_SECONDS)
    finally:
        bar.close()
        progress.close()
    if not samples or samples[-1][1] < total:
        reached = samples[-1][1] if samples else 0
        raise TimeoutError(f"the {name} worker committed {reached} of {total} events in {timeout:g} s")
    first, last = samples[0], samples[-1]
    observed = last[2] - first[2]
    worker_cpu, machine_cpu = last[3] - first[3], last[4] - first[4]
    return {
        **rates(last[1] - first[1], observed, last[0] - first[0]),
        "worker_cpu_seconds": worker_cpu,
        "machine_cpu_seconds": machine_cpu,
        "worker_cpu_us_per_observation": 1e6 * worker_cpu / observed if observed else float("nan"),
        "machine_cpu_us_per_observation": 1e6 * machine_cpu / observed if observed else float("nan"),
        "startup_seconds": first[0] - launched,
        "worker_peak_rss_mib": peak_rss / 1024,
        "commits_observed": float(len(samples)),
    }


def output_shape(bootstrap: str, topics: TopicNames, boundaries: int) -> OutputShape:
    """What the real worker wrote per checkpoint boundary of the input (records, mean bytes)."""

    def per_boundary(topic: str) -> tuple[float, int]:
        values = read_topic(bootstrap, topic, read_committed=False)
        return len(values) / max(boundaries, 1), round(sum(map(len, values)) / max(len(values), 1))

    settings = settings_for(bootstrap, topics)
    rows = {name: per_boundary(topic) for name, topic in zip(TABLES, changelog_topics(settings), strict=True)}
    return OutputShape(per_boundary(topics.predictions), rows)


def settings_for(bootstrap: str, topics: TopicNames) -> WorkerSettings:
    return WorkerSettings(bootstrap=bootstrap, topics=topics)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer jobs (about a minute)")
    parser.add_argument("--jobs", type=int, default=None, help="synthetic jobs (default 20, quick 3)")
    parser.add_argument("--tasks", type=int, default=1000, help="tasks per job")
    parser.add_argument(
        "--method",
        default="nurd",
        help="the worker's method; `reactive` (no model) isolates the framework's own cost",
    )
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the Faust floor (bench/faust_floor.py: the same records in and out, no work)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bootstrap", default=None, help="an existing broker (default: start an embedded one)"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the figures here (and a PNG beside it)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each reader may take, at most")
    args = parser.parse_args()
    n_jobs = args.jobs or (3 if args.quick else 20)
    out = (args.json.parent if args.json else Path(tempfile.gettempdir())) / "logs"
    out.mkdir(parents=True, exist_ok=True)

    traces = concurrent_jobs(n_jobs, args.tasks, seed=args.seed)
    topics = TopicNames(fresh_prefix("throughput"))
    with broker(args.bootstrap) as bootstrap:
        create_topics(bootstrap, prefix=topics.prefix)
        produced = TraceReplayer(traces, bootstrap, topics=topics, speed=0.0).run()
        ends = topic_end_offsets(bootstrap, [topics.checkpoints, topics.job_events])
        cumulative: Cumulative = {}
        raw = raw_rate(bootstrap, ends, args.timeout, cumulative)
        given = Input(bootstrap, topics, ends, cumulative, out, args.timeout)
        pipe = pipeline_rate(given, args.method)
        outputs = sum(topic_end_offsets(bootstrap, [topics.predictions]).values())
        tables = changelog_topics(settings_for(bootstrap, topics))
        changelogs = sum(topic_end_offsets(bootstrap, tables).values())
        shape = output_shape(bootstrap, topics, int(raw["boundaries"]))
        floor = None
        if not args.no_floor:
            floor = floor_rate(given, shape)

    observations = produced.observations_produced
    ratio = pipe["observations_per_second"] / raw["observations_per_second"]
    figures: dict[str, Any] = {
        "ratio": ratio,
        "raw_observations_per_second": raw["observations_per_second"],
        "pipeline_observations_per_second": pipe["observations_per_second"],
        "raw_events_per_second": raw["events_per_second"],
        "pipeline_events_per_second": pipe["events_per_second"],
        "observations": observations,
        "output_records_per_observation": (outputs + changelogs) / observations,
        "changelog_records": changelogs,
        "targets": {"pipeline_observations_per_second": 50_000, "output_records_per_observation": 0.05},
        "method": args.method,
        "jobs": n_jobs,
        "tasks_per_job": args.tasks,
        "events": sum(ends.values()),
        "events_produced": produced.events_produced,
        "produce_seconds": produced.wall_seconds,
        "prediction_topic_records": outputs,
        "output_shape": {"predictions": shape.predictions, "rows": shape.rows},
        "faust_floor": floor,
        "faust_floor_observations_per_second": floor["observations_per_second"] if floor else None,
        "raw": raw,
        "pipeline": pipe,
        "quick": args.quick,
        "machine": machine(),
    }
    readers = [("raw consumer (orjson)", raw)]
    readers += [("Faust floor (same records in and out, no work)", floor)] if floor else []
    readers += [(f"pipeline (Faust worker, {args.method})", pipe)]
    print()
    print(
        table(
            [
                [
                    name,
                    r["observations"],
                    r["events"],
                    r["seconds"],
                    r["observations_per_second"],
                    r["events_per_second"],
                    r.get("worker_cpu_us_per_observation", "-"),
                    r.get("machine_cpu_us_per_observation", "-"),
                ]
                for name, r in readers
            ],
            [
                "reader",
                "observations",
                "records",
                "seconds",
                "observations/s",
                "records/s",
                "worker CPU us/obs",
                "machine CPU us/obs",
            ],
        )
    )
    cores = figures["machine"]["cores"] or 1
    for name, r in readers[1:]:
        ceiling = cores * 1e6 / r["machine_cpu_us_per_observation"]
        figures[f"{'floor' if r is floor else 'pipeline'}_cpu_ceiling_observations_per_second"] = ceiling
        spent, worker_spent = r["machine_cpu_us_per_observation"], r["worker_cpu_us_per_observation"]
        print(
            f"{name}: the machine spent {spent:.1f} us of CPU per observation (worker {worker_spent:.1f}):"
            f" with all {cores} cores busy with this work, at most {ceiling:,.0f} observations/s"
        )
        if r["commits_observed"] < MIN_COMMITS:
            commits = r["commits_observed"]
            print(f"  (a window of {commits:.0f} commits, 1 s apart: too short to resolve; use --jobs 60)")
    print(
        f"\nratio pipeline / raw = {ratio:.3f} (observations); pipeline target >= 50,000 observations/s\n"
        f"output records (predictions {outputs:,} + changelogs {changelogs:,}) per input observation "
        f"= {figures['output_records_per_observation']:.4f} (target < 0.05)"
    )
    print(f"load: {figures['machine']['uptime']}")

    def plot(figure: Figure) -> None:
        ax = figure.add_subplot(1, 1, 1)
        names = ["raw consumer"] + (["Faust floor"] if floor else []) + ["pipeline"]
        rates = [r["observations_per_second"] for _, r in readers]
        bars = ax.bar(names, rates, color=["#888888"] + (["#ff7f0e"] if floor else []) + ["#1f77b4"])
        ax.bar_label(bars, labels=[f"{r:,.0f}/s" for r in rates])
        ax.axhline(50_000, color="red", linestyle="--", label="target: 50,000 observations/s")
        ax.set_ylabel("task observations per second")
        ax.set_title(f"Throughput, {n_jobs} jobs x {args.tasks} tasks (ratio {ratio:.2f})")
        ax.legend()

    write_outputs(figures, args.json, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
