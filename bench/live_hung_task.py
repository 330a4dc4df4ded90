"""How soon a hung task of a live job is copied, against stages started as the README's "Live
telemetry" section starts them (its commands, its defaults).

A job of 30 tasks of 2-6 s and one that hangs reports every second through the SDK. The script prints
when Spark's rule is met for the hung task (75 % of the tasks finished, the hung one over 1.5 x their
median finished latency: when Spark before 4.0 would copy it), both as the tasks ran (a scheduler that
sees each finish at once) and as reported (at the first round of reports that shows it), when its
``duplicate`` command arrived, and the differences (negative: the copy came first). Start the broker,
`straggler topics create`, `straggler worker` and `straggler mitigate` first (README steps 1-4), then:

    .venv/bin/python bench/live_hung_task.py --bootstrap 127.0.0.1:9092 [--reps 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid

from confluent_kafka import Consumer

from producers.telemetry import TelemetryProducer
from schemas import MitigationNote, RelaunchCommand, decode_each
from straggler.argtypes import positive_int
from straggler.kafka.config import consumer_config
from straggler.kafka.names import TopicNames

PEERS = 30
GIVE_UP_S = 120.0


def one_job(bootstrap: str, topics: TopicNames, seed: int) -> tuple[float, float, float | None, float | None]:
    """Run one job; returns (last peer's latency, Spark's rule met as the tasks ran, and as reported,
    copy arrived), seconds from its start (None: not within `GIVE_UP_S`)."""
    rng = random.Random(seed)
    latency = {f"task-{i}": rng.uniform(2.0, 6.0) for i in range(PEERS)}
    job = f"walk-{uuid.uuid4().hex[:6]}"
    reader = Consumer(consumer_config(bootstrap, f"live-hung-task-{job}"))
    reader.subscribe([topics.commands, topics.notes])
    copied: float | None = None
    reported: float | None = None
    with TelemetryProducer(bootstrap, topics=topics) as sdk:
        sdk.start_job(job, expected_tasks=PEERS + 1, feature_names=["cpu", "cpi", "disk_io"])
        began = time.time()
        done: set[str] = set()
        while copied is None and time.time() - began < GIVE_UP_S:
            ran = time.time() - began
            for task, took in latency.items():
                load = {"cpu": 0.8, "cpi": 1.2, "disk_io": 0.02}
                if ran < took:
                    sdk.report(job, task, load, machine_id="m")
                elif task not in done:
                    sdk.report(job, task, load, status="finished", latency=took)
                    done.add(task)
            sdk.report(job, "hung", {"cpu": 0.05, "cpi": 6.0, "disk_io": 0.0}, machine_id="bad")
            sdk.flush()
            if reported is None and spark_rule_holds([latency[t] for t in done], PEERS + 1, ran):
                reported = ran
            deadline = time.time() + 1.0
            while copied is None and time.time() < deadline:
                for message in reader.consume(100, timeout=0.1):
                    if message.error() is not None:
                        continue
                    for event in decode_each(message.value()):
                        if (
                            isinstance(event, RelaunchCommand)
                            and event.job_id == job
                            and event.task_id == "hung"
                        ):
                            copied = time.time() - began if event.action == "duplicate" else copied
                            print(f"  +{time.time() - began:.1f}s command: {event.action}: {event.reason}")
                        elif isinstance(event, MitigationNote) and event.job_id == job:
                            print(f"  +{time.time() - began:.1f}s note: {event.task_id}: {event.reason}")
        sdk.end_job(job)
    reader.close()
    return max(latency.values()), spark_rule_met(list(latency.values())), reported, copied


def spark_rule_holds(finished: list[float], tasks: int, at: float) -> bool:
    """Spark's rule (before 4.0, `speculate`'s floor) for the hung task, running since 0: 75 % of the
    ``tasks`` finished and ``at`` over 1.5 x their median latency."""
    return len(finished) >= 0.75 * tasks and at > 1.5 * statistics.median(finished)


def spark_rule_met(peers: list[float]) -> float:
    """When Spark's rule is first met, as the tasks ran (a scheduler that sees each finish at once)."""
    at = 0.0
    while not spark_rule_holds([took for took in peers if took <= at], len(peers) + 1, at):
        at += 0.01
    return at


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--topic-prefix", default="", help="the stages' --topic-prefix")
    parser.add_argument("--reps", type=positive_int, default=3, help="jobs, one after another")
    args = parser.parse_args()
    topics = TopicNames(args.topic_prefix)
    gaps: dict[str, list[float | None]] = {"as the tasks ran": [], "as reported": []}
    for rep in range(args.reps):
        last_peer, ran, reported, copied = one_job(args.bootstrap, topics, seed=3 + rep)
        cells = [
            f"job {rep + 1}: last peer +{last_peer:.1f}s, copy "
            + ("none" if copied is None else f"+{copied:.1f}s")
        ]
        for (name, each), met in zip(gaps.items(), (ran, reported), strict=True):
            gap = None if copied is None or met is None else copied - met
            each.append(gap)
            at = "never" if met is None else f"+{met:.1f}s"
            cells.append(f"Spark's rule met {name} {at}" + ("" if gap is None else f" (copy {gap:+.1f}s)"))
        print("; ".join(cells))
    for name, each in gaps.items():
        known = [g for g in each if g is not None]
        worst = "n/a" if len(known) < len(each) else f"{max(known):+.1f}s"
        print(f"copy after Spark's rule met {name}: worst of {len(each)} jobs {worst}")


if __name__ == "__main__":
    main()
