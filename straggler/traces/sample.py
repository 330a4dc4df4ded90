"""Cut a contiguous time window out of a Google 2011 trace, in the trace's own format.

The bundled sample (``data/google-2011-sample``) is made this way. Every event of the window is
kept, of every job: machine context (how busy a machine is, its recent failures, how slow its recent
tasks were) is only honest when no other job's events have been dropped. Lines are copied byte for
byte, so a loader reads the sample exactly as it would read the original parts.

Usage: ``python -m straggler.traces.sample --src ../shared/traces/google-2011
--dst data/google-2011-sample --hours 2``
"""

from __future__ import annotations

import argparse
import gzip
from collections.abc import Iterator
from pathlib import Path

from straggler.traces.google2011 import JOB_EVENTS_DIR, TASK_EVENTS_DIR, US_PER_S, trace_parts

SAMPLE_PART_NAME = "part-00000-of-00500.csv.gz"


def _timestamp(line: bytes) -> int:
    return int(line[: line.index(b",")])


def _first_timestamp(path: Path) -> int | None:
    with gzip.open(path, "rb") as lines:
        for line in lines:
            return _timestamp(line)
    return None


def _window_lines(directory: Path, start_us: int, end_us: int) -> Iterator[bytes]:
    """Lines with start_us <= timestamp < end_us, from the parts of ``directory`` that can hold them."""
    parts = trace_parts(directory)
    firsts = [_first_timestamp(path) for _, path in parts]
    needed = []
    for i, (number, path) in enumerate(parts):
        first = firsts[i]
        following = next((f for f in firsts[i + 1 :] if f is not None), None)
        if first is None or first >= end_us or (following is not None and following <= start_us):
            continue
        needed.append((number, path))
    numbers = [number for number, _ in needed]
    if numbers and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise ValueError(f"{directory}: parts {numbers} overlap the window but are not contiguous")
    for _, path in needed:
        with gzip.open(path, "rb") as lines:
            for line in lines:
                t = _timestamp(line)
                if start_us <= t < end_us:
                    yield line if line.endswith(b"\n") else line + b"\n"


def _write_gzip(path: Path, lines: Iterator[bytes]) -> int:
    """Write lines at gzip level 9 with a fixed header (no name, mtime 0): same input, same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with (
        path.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as out,
    ):
        for line in lines:
            out.write(line)
            count += 1
    return count


def extract_sample(src_dir: Path, dst_dir: Path, *, start_s: float, end_s: float) -> dict[str, int]:
    """Copy every task (and job) event with start_s <= time < end_s into one part per table.

    Returns the number of events written per table. ``job_events`` is copied when ``src_dir`` has it.
    """
    if end_s <= start_s:
        raise ValueError(f"empty window [{start_s}, {end_s})")
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    start_us, end_us = round(start_s * US_PER_S), round(end_s * US_PER_S)
    written = {}
    for table in (TASK_EVENTS_DIR, JOB_EVENTS_DIR):
        source = src_dir / table
        if table == JOB_EVENTS_DIR and not source.is_dir():
            continue
        lines = _window_lines(source, start_us, end_us)
        written[table] = _write_gzip(dst_dir / table / SAMPLE_PART_NAME, lines)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, required=True, help="trace directory with task_events/")
    parser.add_argument("--dst", type=Path, required=True, help="where to write the sample")
    parser.add_argument("--hours", type=float, required=True, help="length of the window")
    parser.add_argument("--start-hours", type=float, default=0.0, help="window start (default 0)")
    args = parser.parse_args(argv)
    start_s = args.start_hours * 3600.0
    written = extract_sample(args.src, args.dst, start_s=start_s, end_s=start_s + args.hours * 3600.0)
    for table, count in written.items():
        size = (args.dst / table / SAMPLE_PART_NAME).stat().st_size
        print(f"{table}: {count} events, {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
