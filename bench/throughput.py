"""Checkpoint events per second through the whole pipeline, against a raw consumer on the same topic.

Why this comparison: a raw confluent-kafka consumer that only decodes JSON is the ceiling one
Python process can reach on this broker; the ratio says how much of it the pipeline (Faust, schema
validation, job state, NURD at each boundary, predictions published) keeps.

Method. Synthetic jobs are replayed open loop, as fast as the broker takes them, *before* anything
reads them (production speed does not bound either reader). Then, on the same broker:

- raw: one consumer assigned every partition of the input topics drains them with
  ``consume(num_messages=...)`` and ``orjson.loads`` each value; timed from its first batch to the
  last record (the first batch is not counted);
- pipeline: ``python -m straggler.cli worker`` as a subprocess; its consumer group's committed
  offsets are polled, and the rate is timed from the first commit to the one that reaches the end
  (the worker commits every second, so start-up and rebalancing are outside the window).

    .venv/bin/python bench/throughput.py [--quick] [--json runs/bench/throughput.json] [--bootstrap B]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from benchlib import (
    GroupProgress,
    broker,
    concurrent_jobs,
    fresh_prefix,
    machine,
    rss_kib,
    table,
    topic_end_offsets,
    write_outputs,
)
from confluent_kafka import Consumer, TopicPartition
from matplotlib.figure import Figure
from tqdm import tqdm

from pipeline.app import WorkerSettings, app_id
from producers.replayer import TraceReplayer
from straggler.kafka.names import TopicNames
from straggler.kafka.topics import create_topics
from straggler.replay import child_process

BATCH = 10_000
POLL_SECONDS = 0.2
MAX_RAW_PASSES = 50


def raw_rate(
    bootstrap: str, ends: dict[tuple[str, int], int], timeout: float, min_seconds: float = 5.0
) -> dict[str, float]:
    """Drain the partitions with a bare consumer (decode only); events/s from first batch to last record.

    A small topic drains in well under a second, too short to time: the consumer then reads it again
    from the start, pass after pass, until ``min_seconds`` have passed (at most `MAX_RAW_PASSES`).
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
    passes = 0
    began: float | None = None
    decoded_bytes = 0
    deadline = time.monotonic() + timeout
    bar = tqdm(total=total, unit="ev", desc="raw consumer", unit_scale=True)
    try:
        while passes < MAX_RAW_PASSES and (began is None or time.monotonic() - began < min_seconds):
            consumer.assign(assignment)
            seen = 0
            bar.reset()
            while seen < total and time.monotonic() < deadline:
                good = 0
                # No more than what is left: consume() waits out its timeout for a batch it cannot fill.
                for message in consumer.consume(num_messages=min(BATCH, total - seen), timeout=1.0):
                    if message.error() is not None:
                        continue
                    value = message.value() or b""
                    orjson.loads(value)
                    decoded_bytes += len(value)
                    good += 1
                seen += good
                if began is None and good:
                    began = time.monotonic()  # the first batch includes connection set-up: not counted
                else:
                    counted += good
                bar.update(good)
            if seen < total:
                raise TimeoutError(f"raw consumer read {seen} of {total} events in {timeout:g} s")
            passes += 1
        ended = time.monotonic()
    finally:
        bar.close()
        consumer.close()
    assert began is not None
    seconds = ended - began
    return {
        "events": float(counted),
        "seconds": seconds,
        "events_per_second": counted / seconds if seconds > 0 else float("nan"),
        "passes": float(passes),
        "mean_event_bytes": decoded_bytes / max(passes * total, 1),
    }


def pipeline_rate(
    bootstrap: str,
    topics: TopicNames,
    ends: dict[tuple[str, int], int],
    out: Path,
    timeout: float,
    method: str = "nurd",
) -> dict[str, float]:
    """Run the Faust worker until its committed offsets reach the end; events/s between commits."""
    total = sum(ends.values())
    group = app_id(WorkerSettings(bootstrap=bootstrap, topics=topics))
    progress = GroupProgress(bootstrap, group, list(ends))
    samples: list[tuple[float, int]] = []
    peak_rss = 0
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as workdir:
        args = ["worker", "--bootstrap", bootstrap, "--topic-prefix", topics.prefix, "--datadir", workdir]
        args += ["--method", method]
        launched = time.monotonic()
        bar = tqdm(total=total, unit="ev", desc="pipeline (committed)", unit_scale=True)
        try:
            with child_process(args, out / "throughput-worker.log") as worker:
                deadline = launched + timeout
                done = 0
                while done < total and time.monotonic() < deadline:
                    if worker.poll() is not None:
                        raise RuntimeError(
                            f"the worker exited with {worker.returncode}; see its log in {out}"
                        )
                    done = progress.committed()
                    now = time.monotonic()
                    if done and (not samples or done != samples[-1][1]):
                        samples.append((now, done))
                        bar.update(done - bar.n)
                    peak_rss = max(peak_rss, rss_kib(worker.pid) or 0)
                    time.sleep(POLL_SECONDS)
        finally:
            bar.close()
            progress.close()
    if not samples or samples[-1][1] < total:
        reached = samples[-1][1] if samples else 0
        raise TimeoutError(f"the worker committed {reached} of {total} events in {timeout:g} s")
    (first_at, first_done), (last_at, last_done) = samples[0], samples[-1]
    seconds = last_at - first_at
    counted = last_done - first_done
    return {
        "events": float(counted),
        "seconds": seconds,
        "events_per_second": counted / seconds if seconds > 0 else float("nan"),
        "startup_seconds": first_at - launched,
        "worker_peak_rss_mib": peak_rss / 1024,
        "commits_observed": float(len(samples)),
    }


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
        raw = raw_rate(bootstrap, ends, args.timeout)
        pipe = pipeline_rate(bootstrap, topics, ends, out, args.timeout, args.method)
        outputs = sum(topic_end_offsets(bootstrap, [topics.predictions]).values())

    ratio = pipe["events_per_second"] / raw["events_per_second"]
    figures: dict[str, Any] = {
        "ratio": ratio,
        "raw_events_per_second": raw["events_per_second"],
        "pipeline_events_per_second": pipe["events_per_second"],
        "targets": {"ratio": 0.25, "pipeline_events_per_second": 50_000},
        "method": args.method,
        "jobs": n_jobs,
        "tasks_per_job": args.tasks,
        "events": sum(ends.values()),
        "events_produced": produced.events_produced,
        "produce_seconds": produced.wall_seconds,
        "prediction_topic_records": outputs,
        "raw": raw,
        "pipeline": pipe,
        "quick": args.quick,
        "machine": machine(),
    }
    print()
    print(
        table(
            [
                ["raw consumer (orjson)", raw["events"], raw["seconds"], raw["events_per_second"]],
                [
                    f"pipeline (Faust worker, {args.method})",
                    pipe["events"],
                    pipe["seconds"],
                    pipe["events_per_second"],
                ],
            ],
            ["reader", "events", "seconds", "events/s"],
        )
    )
    print(f"\nratio pipeline / raw = {ratio:.3f} (target >= 0.25); pipeline target >= 50,000 events/s")
    print(f"load: {figures['machine']['uptime']}")

    def plot(figure: Figure) -> None:
        ax = figure.add_subplot(1, 1, 1)
        names = ["raw consumer", "pipeline"]
        rates = [raw["events_per_second"], pipe["events_per_second"]]
        bars = ax.bar(names, rates, color=["#888888", "#1f77b4"])
        ax.bar_label(bars, labels=[f"{r:,.0f}/s" for r in rates])
        ax.axhline(50_000, color="red", linestyle="--", label="target: 50,000 events/s")
        ax.set_ylabel("checkpoint events per second")
        ax.set_title(f"Throughput, {n_jobs} jobs x {args.tasks} tasks (ratio {ratio:.2f})")
        ax.legend()

    write_outputs(figures, args.json, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
