"""Feed the pipeline from a (simulated) live cluster with the telemetry SDK.

A few jobs start, their tasks report CPU, memory and CPI once per tick while they run and their latency
when they finish; a few tasks run on a slow machine and straggle. The run stops when every task has
finished or after ``--seconds`` of wall time, whichever comes first; unfinished jobs are ended anyway.

    straggler broker start                 # or any Kafka broker
    python examples/live_telemetry.py --bootstrap 127.0.0.1:9092 --jobs 3 --tasks 40 --seconds 30
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass

from producers.telemetry import TelemetryProducer
from straggler.kafka.names import TopicNames
from straggler.kafka.reachability import BrokerUnreachable, wait_for_broker
from straggler.kafka.topics import create_topics

TICK_SECONDS = 1.0
SLOW_MACHINE_SHARE = 0.1


@dataclass
class SimulatedTask:
    task_id: str
    machine_id: str
    start: float
    duration: float
    slow: bool
    finished: bool = False


def simulate_job(
    job_index: int, n_tasks: int, seconds: float, now: float, rng: random.Random
) -> list[SimulatedTask]:
    """Tasks that start over the first fifth of the run and mostly finish within it; slow ones may not."""
    tasks = []
    for i in range(n_tasks):
        slow = rng.random() < SLOW_MACHINE_SHARE
        typical = rng.uniform(0.2, 0.5) * seconds
        tasks.append(
            SimulatedTask(
                task_id=f"task-{i}",
                machine_id=f"m{job_index}-{i % 7}" if not slow else "m-slow",
                start=now + rng.uniform(0.0, 0.2 * seconds),
                duration=typical * (rng.uniform(2.0, 3.0) if slow else 1.0),
                slow=slow,
            )
        )
    return tasks


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=40, help="tasks per job")
    parser.add_argument("--seconds", type=float, default=30.0, help="longest wall time of the run")
    parser.add_argument("--topic-prefix", default="")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    topics = TopicNames(args.topic_prefix)
    try:
        wait_for_broker(args.bootstrap)  # at most 15 s, in one line, instead of librdkafka's retries
    except BrokerUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    create_topics(args.bootstrap, prefix=args.topic_prefix)  # leaves existing topics alone
    rng = random.Random(args.seed)
    begin = time.time()
    jobs = {f"live-job-{j}": simulate_job(j, args.tasks, args.seconds, begin, rng) for j in range(args.jobs)}
    reports = 0
    with TelemetryProducer(args.bootstrap, topics=topics, source="example") as telemetry:
        for job_id in jobs:
            telemetry.start_job(job_id, expected_tasks=args.tasks)
        max_ticks = int(args.seconds / TICK_SECONDS) + 1
        for _ in range(max_ticks):
            now = time.time()
            if now - begin > args.seconds:
                break
            for job_id, tasks in jobs.items():
                for task in tasks:
                    if task.finished or now < task.start:
                        continue
                    if now >= task.start + task.duration:
                        task.finished = True
                        telemetry.report(
                            job_id, task.task_id, {"cpu_usage": rng.uniform(0.1, 0.3)}, "finished",
                            machine_id=task.machine_id, latency=task.duration, start_time=task.start,
                            at=task.start + task.duration,
                        )  # fmt: skip
                    else:
                        cpi = rng.gauss(2.5 if task.slow else 1.2, 0.2)
                        features = {
                            "cpu_usage": rng.uniform(0.4, 0.9),
                            "memory_usage": rng.uniform(0.1, 0.5),
                            "cpi": max(cpi, 0.1),
                        }
                        telemetry.report(
                            job_id, task.task_id, features, machine_id=task.machine_id,
                            start_time=task.start, at=now,
                        )  # fmt: skip
                    reports += 1
            if all(task.finished for tasks in jobs.values() for task in tasks):
                break
            telemetry.flush()
            time.sleep(max(0.0, TICK_SECONDS - (time.time() - now)))
        for job_id in jobs:
            telemetry.end_job(job_id)
    finished = sum(task.finished for tasks in jobs.values() for task in tasks)
    total = args.tasks * len(jobs)
    print(f"sent {reports} task reports for {len(jobs)} jobs; {finished} of {total} tasks finished")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
