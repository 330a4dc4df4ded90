"""Why checkpoint density matters: how many of a trace's true stragglers a checkpointed rule can ever see.

For every job (oracle p90 threshold over its scored tasks) and every true straggler it counts whether
the straggler is running at some checkpoint at all (an upper bound on any method's recall), and
whether it is still running at a checkpoint at which its elapsed time has already reached the
threshold (what the reactive rule ``elapsed >= p90`` needs). It ignores the 4 % start rule, so both
are upper bounds. Run from the repository root:

    .venv/bin/python docs/results/trace_stats.py --format google-2011 --trace DIR --checkpoint-seconds 300
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from straggler.core.threshold import oracle_threshold
from straggler.traces.loading import add_trace_arguments, load_traces_from_args


def job_stats(start: np.ndarray, end: np.ndarray, checkpoints: np.ndarray) -> dict[str, float]:
    """Per-job counts for the true p90 stragglers of one job's scored tasks."""
    latency = end - start
    threshold = oracle_threshold(latency, 0.9)
    straggler = latency >= threshold
    s, e = start[straggler], end[straggler]
    seen = np.array([bool(np.any((checkpoints >= a) & (checkpoints < b))) for a, b in zip(s, e, strict=True)])
    over = np.array(
        [bool(np.any((checkpoints >= a + threshold) & (checkpoints < b))) for a, b in zip(s, e, strict=True)]
    )
    return {
        "checkpoints": float(len(checkpoints)),
        "stragglers": float(straggler.sum()),
        "seen_running": float(seen.sum()),
        "seen_over_threshold": float(over.sum()),
        "median_excess_seconds": float(np.median(latency[straggler] - threshold)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_trace_arguments(parser)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.checkpoint_seconds is None:
        parser.error("--checkpoint-seconds is required")
    traces = load_traces_from_args(args, progress=False)
    rows = []
    for trace in traces:
        ok = trace.scored
        rows.append(job_stats(trace.start[ok], trace.end[ok], trace.checkpoints))
    stragglers = sum(r["stragglers"] for r in rows)
    checkpoints = np.array([r["checkpoints"] for r in rows])
    out: dict[str, Any] = {
        "format": args.format,
        "checkpoint_seconds": args.checkpoint_seconds,
        "max_jobs": args.max_jobs,
        "jobs": len(rows),
        "checkpoints_per_job": {
            q: float(np.quantile(checkpoints, p)) for q, p in (("p10", 0.1), ("median", 0.5), ("p90", 0.9))
        },
        "true_stragglers": int(stragglers),
        "share_running_at_a_checkpoint": sum(r["seen_running"] for r in rows) / stragglers,
        "share_running_past_p90_at_a_checkpoint": sum(r["seen_over_threshold"] for r in rows) / stragglers,
        "mean_over_jobs_share_running_past_p90_at_a_checkpoint": float(
            np.mean([r["seen_over_threshold"] / r["stragglers"] for r in rows if r["stragglers"]])
        ),
        "median_over_jobs_of_median_seconds_a_straggler_runs_past_p90": float(
            np.median([r["median_excess_seconds"] for r in rows])
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
