"""What the benchmark scripts share: the machine's description, the broker, jobs, Kafka offsets, output.

Why one module: every figure must say on which machine and under what load it was taken, and every
script writes its figures the same way (JSON, then a PNG beside it), so the comparison in
docs/performance.md is between like and like.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # the scripts run as files, not as modules of the package
    sys.path.insert(0, str(REPO))

from straggler.core.jobtrace import JobTrace  # noqa: E402
from straggler.kafka.offsets import end_offset  # noqa: E402
from straggler.traces.synthetic import generate_jobs  # noqa: E402

HOUR = 3600.0
"""`generate_jobs` starts job j at j hours (plus up to 10 minutes): the shift that makes jobs concurrent."""


def machine() -> dict[str, Any]:
    """Cores, memory and load now: the figures mean nothing without them."""
    load1, load5, load15 = os.getloadavg()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    mem_total_kib = _meminfo_kib("MemTotal")
    mem_available_kib = _meminfo_kib("MemAvailable")
    return {
        "cores": os.cpu_count(),
        "load_average": [load1, load5, load15],
        "uptime": uptime,
        "memory_total_gib": round(mem_total_kib / 2**20, 1) if mem_total_kib else None,
        "memory_available_gib": round(mem_available_kib / 2**20, 1) if mem_available_kib else None,
        "python": platform.python_version(),
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _meminfo_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kib(pid: int) -> int | None:
    """Resident memory of a process (VmRSS), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, all threads) a process has used so far, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: fields 14 and 15 of stat


def machine_busy_seconds() -> float:
    """CPU time every core of the machine has spent not idle since boot (all processes, the broker's too)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle, iowait = ticks[3], ticks[4]
    return (sum(ticks[:8]) - idle - iowait) / _TICKS  # user .. steal; guest time is within user


@contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    """The given broker, or an embedded one on 127.0.0.1 for the duration of the block."""
    if bootstrap is not None:
        yield bootstrap
        return
    from straggler.kafka.embedded import embedded_kafka

    with embedded_kafka() as started:
        yield started


@contextmanager
def dask_cluster(workers: int) -> Iterator[Any]:
    """A `LocalCluster` of ``workers`` process workers with one thread each, every server on
    127.0.0.1, and a ``Client`` of it once every worker is up: yields the client."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(workers, timeout=120)
        yield client


def fresh_prefix(kind: str) -> str:
    """A topic prefix no earlier run used, so runs on one broker never see each other's records."""
    return f"bench-{kind}-{uuid.uuid4().hex[:8]}-"


def concurrent_jobs(
    n_jobs: int, n_tasks: int, *, seed: int, checkpoint_seconds: float = 60.0
) -> list[JobTrace]:
    """``n_jobs`` synthetic jobs of exactly ``n_tasks`` tasks, all running at once.

    Each job is moved back to the first hour, and job j's checkpoint grid is offset by
    ``j * checkpoint_seconds / n_jobs``: the jobs then take turns at the boundaries instead of all
    hitting the same instant, as jobs whose monitoring started at different moments do.
    """
    traces = generate_jobs(
        n_jobs, seed=seed, min_tasks=n_tasks, max_tasks=n_tasks, checkpoint_seconds=checkpoint_seconds
    )
    return [shifted(t, -j * HOUR + j * checkpoint_seconds / n_jobs) for j, t in enumerate(traces)]


def shifted(trace: JobTrace, offset: float) -> JobTrace:
    """The same job ``offset`` seconds later (features and order unchanged)."""
    return replace(
        trace,
        start=trace.start + offset,
        end=trace.end + offset,
        checkpoints=trace.checkpoints + offset,
    )


def topic_end_offsets(bootstrap: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
    """The high watermark of every partition of ``topics``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-ends-{uuid.uuid4().hex[:8]}"})
    try:
        ends: dict[tuple[str, int], int] = {}
        for topic in topics:
            partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
            for p in partitions:
                ends[(topic, p)] = end_offset(consumer, TopicPartition(topic, p), 30.0)
        return ends
    finally:
        consumer.close()


_NOT_READY = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError._TIMED_OUT,
)


class GroupProgress:
    """How far a consumer group has committed on a set of partitions (it does not join the group)."""

    def __init__(self, bootstrap: str, group: str, partitions: Sequence[tuple[str, int]]) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self.partitions = [TopicPartition(topic, p) for topic, p in partitions]
        self.last = 0
        self.last_by_partition: dict[tuple[str, int], int] = {}

    def committed(self) -> int:
        """Sum of committed offsets (0 where nothing is committed yet).

        While the group's coordinator is being chosen or loaded the broker answers with a retriable
        error; the last known sum is returned then, and the caller polls again.
        """
        self.last = sum(self.by_partition().values())
        return self.last

    def by_partition(self) -> dict[tuple[str, int], int]:
        """Committed offset per partition (0 where nothing is committed yet; the last known values
        while the coordinator is not ready)."""
        try:
            found = self.consumer.committed(self.partitions, timeout=10)
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and (error.retriable() or error.code() in _NOT_READY):
                return self.last_by_partition
            raise
        self.last_by_partition = {(tp.topic, tp.partition): max(tp.offset, 0) for tp in found}
        return self.last_by_partition

    def close(self) -> None:
        self.consumer.close()


def wait_group_stable(bootstrap: str, group: str, timeout: float) -> float:
    """Wait until ``group`` has members and a stable assignment; seconds waited (raises on timeout)."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
            if described.state == ConsumerGroupState.STABLE and described.members:
                return time.monotonic() - began
        except Exception:  # the group does not exist yet
            pass
        time.sleep(0.5)
    raise TimeoutError(f"consumer group {group!r} not stable after {timeout:g} s")


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def write_outputs(figures: dict[str, Any], json_path: Path | None, plot: Callable[[Figure], None]) -> None:
    """``figures`` as JSON at ``json_path`` and the plot as a PNG beside it (same name, .png)."""
    if json_path is None:
        return
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(figures, indent=2, default=float) + "\n")
    figure = plt.figure(figsize=(8, 4.5))
    plot(figure)
    figure.tight_layout()
    png = json_path.with_suffix(".png")
    figure.savefig(png, dpi=110)
    plt.close(figure)
    print(f"wrote {json_path} and {png}")


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """A small fixed-width table for the terminal."""
    cells = [[str(h) for h in header], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
