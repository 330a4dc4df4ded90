"""One entry point from a ``--format`` name to a list of `JobTrace`s."""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path
from typing import Any, Literal

from straggler.argtypes import existing_dir, non_negative_int, positive_float, positive_int
from straggler.core.jobtrace import JobTrace

TraceFormat = Literal["google-2011", "google-2011-usage", "alibaba-2018", "synthetic"]
FORMATS: tuple[TraceFormat, ...] = ("google-2011", "google-2011-usage", "alibaba-2018", "synthetic")


def load_traces(
    fmt: str,
    trace: Path | None,
    *,
    checkpoint_seconds: float | None = None,
    checkpoints_per_job: int | None = None,
    min_tasks: int = 100,
    max_jobs: int | None = None,
    jobs: int = 20,
    seed: int = 0,
    progress: bool = True,
) -> list[JobTrace]:
    """Load (or, for ``synthetic``, generate) the jobs an evaluation or a replay runs on."""
    if checkpoints_per_job is not None and fmt != "google-2011":
        raise ValueError("--checkpoints-per-job is implemented for --format google-2011 only")
    if fmt == "synthetic":
        from straggler.traces.synthetic import generate_jobs

        traces = generate_jobs(
            jobs, seed=seed, min_tasks=min_tasks, checkpoint_seconds=checkpoint_seconds or 60.0
        )
        return traces[:max_jobs] if max_jobs else traces
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    if trace is None:
        raise ValueError(f"--trace DIR is required for {fmt}")
    shared: dict[str, Any] = {"min_tasks": min_tasks, "max_jobs": max_jobs, "progress": progress}
    if fmt == "google-2011":
        from straggler.traces.google2011 import load_google2011

        shared["checkpoints_per_job"] = checkpoints_per_job
        return list(load_google2011(trace, checkpoint_seconds=checkpoint_seconds or 300.0, **shared))
    if fmt == "google-2011-usage":
        from straggler.traces.usage import load_google2011_usage

        return list(load_google2011_usage(trace, checkpoint_seconds=checkpoint_seconds or 300.0, **shared))
    from straggler.traces.alibaba2018 import load_alibaba2018

    return list(load_alibaba2018(trace, checkpoint_seconds=checkpoint_seconds or 60.0, **shared))


def add_trace_arguments(parser: argparse.ArgumentParser, *, evaluation: bool = False) -> None:
    """The options every command that reads a trace shares (evaluate, replay, produce); ``evaluation``
    adds the per-job checkpoint grid, which a replay cannot use (its checkpoints are cluster-wide)."""
    parser.add_argument("--format", required=True, choices=FORMATS, help="the trace's format")
    parser.add_argument(
        "--trace", type=existing_dir, default=None, help="trace directory (required unless synthetic)"
    )
    parser.add_argument("--jobs", type=positive_int, default=20, help="synthetic: number of jobs to generate")
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="synthetic jobs, relaunch draws, model seeds"
    )
    parser.add_argument(
        "--max-jobs", type=positive_int, default=None, help="only the N largest jobs (default: all)"
    )
    parser.add_argument(
        "--min-tasks", type=positive_int, default=100, help="jobs with fewer finished tasks are left out"
    )
    parser.add_argument(
        "--checkpoint-seconds",
        type=positive_float,
        default=None,
        help="seconds between checkpoints (default: 300 for Google, 60 for alibaba-2018 and synthetic)",
    )
    if not evaluation:
        return
    parser.add_argument(
        "--half",
        choices=HALVES,
        default=None,
        help="only one half of the jobs, by a stable hash of the job id (after --max-jobs): choose on "
        "'tune', report on 'report' (default: every job)",
    )
    parser.add_argument(
        "--checkpoints-per-job",
        type=positive_int,
        default=None,
        help="google-2011, evaluation only: N checkpoints evenly over each job's span (the paper's "
        "normalised time; placing them uses the job's end) instead of every --checkpoint-seconds",
    )


HALVES = ("tune", "report")


def job_half(job_id: str) -> str:
    """The half a job falls in, ``tune`` or ``report``: a stable hash of its id, so it never depends on
    which other jobs are loaded. A choice made on a trace's ``tune`` half is reported on the other."""
    return HALVES[zlib.crc32(job_id.encode()) % 2]


def load_traces_from_args(args: argparse.Namespace, *, progress: bool = True) -> list[JobTrace]:
    """`load_traces` with the options of `add_trace_arguments` (and ``--half``, for an evaluation)."""
    traces = load_traces(
        args.format,
        args.trace,
        checkpoint_seconds=args.checkpoint_seconds,
        checkpoints_per_job=getattr(args, "checkpoints_per_job", None),
        min_tasks=args.min_tasks,
        max_jobs=args.max_jobs,
        jobs=args.jobs,
        seed=args.seed,
        progress=progress,
    )
    half = getattr(args, "half", None)
    return traces if half is None else [t for t in traces if job_half(t.job_id) == half]


def traces_for_command(args: argparse.Namespace, *, progress: bool = True) -> list[JobTrace] | None:
    """`load_traces_from_args` for a command: None, said on stderr in one line, when the trace cannot be
    read or no job meets --min-tasks."""
    try:
        traces = load_traces_from_args(args, progress=progress)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    if not traces:
        print("no job in the trace meets --min-tasks", file=sys.stderr)
        return None
    return traces
