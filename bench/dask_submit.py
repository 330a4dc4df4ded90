"""How long submitting a job's tasks takes through the Dask adapter (`SpeculativeJob.submit`), against
Dask's own ``Client.submit``: the time from the first submit to the last, for jobs of a few sizes.

The adapter submits the task, then hands its record (`TaskRecord`, which the command executor reads
to copy the task) to `RecordPublisher`, which publishes the records on the scheduler in batches on a
thread of its own. "one publish per task" times the adapter's former way, a ``publish_dataset`` round
trip after each submit, on the same cluster.

    OMP_NUM_THREADS=1 .venv/bin/python bench/dask_submit.py

A local cluster of four process workers and the embedded broker (the telemetry plugin's); run it
alone on a quiet machine: every figure is wall-clock time.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable, Sequence

from benchlib import broker, dask_cluster, fresh_prefix, machine, table

WORKERS = 4


def task(x: int) -> int:
    return x


def topics(bootstrap: str) -> str:
    """A fresh topic prefix, its topics created."""
    from straggler.kafka.topics import create_topics

    prefix = fresh_prefix("submit")
    create_topics(bootstrap, prefix=prefix)
    return prefix


def median_ms(submit_all: Callable[[int], float], n: int, reps: int) -> float:
    """The median over ``reps`` of the milliseconds ``submit_all(n)`` says its submits took."""
    return statistics.median(submit_all(n) for _ in range(reps)) * 1e3


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="24,200", help="job sizes (tasks), comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--bootstrap", default=None, help="a broker to use (default: an embedded one)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    from distributed import wait

    from producers.dask_job import SpeculativeClient

    print(machine(), flush=True)
    with (
        broker(args.bootstrap) as bootstrap,
        dask_cluster(WORKERS) as client,
        SpeculativeClient(client, bootstrap, topic_prefix=topics(bootstrap)) as spec,
    ):

        def dask_alone(n: int) -> float:
            started = time.perf_counter()
            futures = [client.submit(task, i, pure=False) for i in range(n)]
            took = time.perf_counter() - started
            wait(futures)
            return took

        def adapter(n: int) -> float:
            with spec.job(f"bench-{uuid.uuid4().hex[:8]}", expected_tasks=n) as job:
                started = time.perf_counter()
                futures = [job.submit(task, i) for i in range(n)]
                took = time.perf_counter() - started
                job.gather(futures)
            return took

        def one_publish_per_task(n: int) -> float:
            started = time.perf_counter()
            futures = []
            for i in range(n):
                futures.append(client.submit(task, i, pure=False))
                client.publish_dataset({"task": i}, name=f"bench-record-{uuid.uuid4().hex}")
            took = time.perf_counter() - started
            wait(futures)
            return took

        ways = (dask_alone, adapter, one_publish_per_task)
        rows = [[n, *(f"{median_ms(way, n, args.reps):.1f}" for way in ways)] for n in sizes]
        print(f"first submit to last, median of {args.reps}:")
        print(table(rows, ["tasks", "Client.submit (ms)", "adapter (ms)", "one publish per task (ms)"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
