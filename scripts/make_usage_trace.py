"""Generate synthetic jobs and write them as a Google 2011 usage trace (task_events + task_usage).

    .venv/bin/python scripts/make_usage_trace.py --jobs 60 --seed 7 --window-seconds 300 --out /tmp/usage60

The result is read by ``straggler evaluate --format google-2011-usage --trace DIR``. What the files
hold, and what the Google format cannot hold (restarts keep their first start in the simulation), is
documented in `straggler.traces.usage_writer`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
from collections.abc import Iterable, Iterator
from pathlib import Path

from straggler.traces.synthetic import SimulatedJob, SyntheticConfig, iter_simulated_jobs
from straggler.traces.usage_writer import DROPPED_FEATURES, PART_NAME, write_usage_trace


def _counted(jobs: Iterable[SimulatedJob], counts: dict[str, int]) -> Iterator[SimulatedJob]:
    for job in jobs:
        counts["jobs"] += 1
        counts["tasks"] += job.n_tasks
        yield job


def _rows(path: Path) -> int:
    with gzip.open(path, "rb") as handle:
        return sum(1 for _ in handle)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, required=True, help="number of simulated jobs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-tasks", type=int, default=100)
    parser.add_argument("--max-tasks", type=int, default=5000)
    parser.add_argument(
        "--window-seconds", type=float, default=300.0, help="usage window length (Google: 300)"
    )
    parser.add_argument("--out", type=Path, required=True, help="trace directory to write")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    config = dataclasses.replace(SyntheticConfig(), usage_window_seconds=args.window_seconds)
    jobs = iter_simulated_jobs(
        args.jobs, seed=args.seed, min_tasks=args.min_tasks, max_tasks=args.max_tasks, config=config
    )
    counts = {"jobs": 0, "tasks": 0}
    out = write_usage_trace(_counted(jobs, counts), args.out, progress=not args.no_progress)

    print(f"wrote {out}: {counts['jobs']} jobs, {counts['tasks']} tasks")
    total = 0
    for table in ("task_events", "task_usage"):
        path = out / table / PART_NAME
        size = path.stat().st_size
        total += size
        print(f"  {table}/{PART_NAME}: {_rows(path)} rows, {size} bytes")
    print(f"  total {total} bytes; not written (no Google column): {', '.join(DROPPED_FEATURES)}")


if __name__ == "__main__":
    main()
