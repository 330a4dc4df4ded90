"""Screenshots of the live view during a real closed-loop replay: docs/liveview.png (the figures and
the jobs list) and docs/liveview-job.png (one job's quantiles, timeline and task table).

Starts an embedded broker (or uses ``--bootstrap``), the worker, the mitigation consumer and
``straggler view``, replays a few synthetic jobs (staggered, so some are in flight while others have
ended) and takes the pictures with headless Chromium once a job has ended and another is still
running; the job shown is the one with the most copies. Run from the repository root:
``python scripts/liveview_screenshot.py``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import uuid
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the package, and the test harness (tests/harness)

from harness.liveview_run import pipeline_and_view, screenshot, wait_for  # noqa: E402
from harness.small_jobs import make_job  # noqa: E402

from straggler.core.jobtrace import JobTrace  # noqa: E402
from straggler.kafka.embedded import embedded_kafka  # noqa: E402
from straggler.kafka.names import TopicNames  # noqa: E402
from straggler.kafka.topics import create_topics  # noqa: E402
from straggler.replay import closed_loop_replay  # noqa: E402

INTERVAL = 4.0


def _shifted(trace: JobTrace, by: float) -> JobTrace:
    """The same job, started ``by`` seconds later."""
    return replace(trace, start=trace.start + by, end=trace.end + by, checkpoints=trace.checkpoints + by)


def _jobs() -> list[JobTrace]:
    """Four jobs of 150 tasks, each starting 40 s after the one before."""
    return [
        _shifted(
            make_job(150, seed=40 + k, job_id=f"job-{k + 1}", signal=0.5, interval=INTERVAL, waves=4),
            40.0 * k,
        )
        for k in range(4)
    ]


def _in_flight_with_commands(summary: dict[str, Any]) -> bool:
    totals = summary["totals"]
    return bool(totals["commands"] > 0 and totals["jobs_in_flight"] > 0 and totals["jobs_ended"] > 0)


def _most_copied(summary: dict[str, Any]) -> str:
    return str(max(summary["jobs"], key=lambda row: (row["copies"], row["job_id"]))["job_id"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", default=None, help="an existing broker (default: an embedded one)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "liveview.png")
    parser.add_argument("--job-out", type=Path, default=ROOT / "docs" / "liveview-job.png")
    parser.add_argument("--speed", type=float, default=8.0, help="replay speed (trace seconds per second)")
    args = parser.parse_args()
    with ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(embedded_kafka())
        topics = TopicNames(f"view-shot-{uuid.uuid4().hex[:8]}-")
        create_topics(bootstrap, prefix=topics.prefix)
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="liveview-shot-")))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        group = stack.enter_context(
            pipeline_and_view(bootstrap, topics, workdir, port, checkpoint_seconds=INTERVAL)
        )
        done = threading.Event()

        def run() -> None:
            try:
                closed_loop_replay(
                    _jobs(), bootstrap, topics, group, checkpoint_seconds=INTERVAL, speed=args.speed
                )
            finally:
                done.set()

        threading.Thread(target=run, daemon=True).start()
        summary = wait_for(port, _in_flight_with_commands, 300.0)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        screenshot(f"http://127.0.0.1:{port}/", args.out, size="1280,900")
        print(f"wrote {args.out}")
        job = _most_copied(summary)
        screenshot(
            f"http://127.0.0.1:{port}/?job={job}&sort=elapsed&order=desc", args.job_out, size="1280,1500"
        )
        print(f"wrote {args.job_out}")
        done.wait(300.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
