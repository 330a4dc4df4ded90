"""Does a `LocalCluster` worker that dies come back? Kill one worker process after another (a task
that exits its process, as `bench/dask_jobs.py`'s worker-dies scenario does) and time each return.

A `LocalCluster` closes a worker's nanny for good when, ``distributed.deploy.lost-worker-timeout``
(15 s by default) after a worker left, no worker of its name is registered: one that is restarting
again at that moment never comes back. Deaths a few seconds apart meet it within a minute or so with
a short timeout, and `bench/dask_jobs.py`'s runs (one every 14-15 s) met it at the default.

    .venv/bin/python bench/dask_worker_restarts.py --deaths 10 --lost-worker-timeout 3s
    .venv/bin/python bench/dask_worker_restarts.py --deaths 10 --lost-worker-timeout 1h

Prints each death's return time (``never`` past ``--wait`` seconds) and how many came back.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import dask_cluster

WORKERS = 4


def die_the_first_time(marker: str) -> int:
    """The first run exits its worker's process; Dask's run of it elsewhere returns."""
    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return 1
    time.sleep(0.5)
    os._exit(1)


def workers(client: Any) -> int:
    return len(client.scheduler_info()["workers"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deaths", type=int, default=10)
    parser.add_argument("--lost-worker-timeout", default="15s", help="Dask's setting (default: Dask's own)")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds a worker may take to come back")
    args = parser.parse_args(argv)
    if args.deaths < 1 or not args.wait > 0:
        print("error: --deaths must be >= 1 and --wait > 0", file=sys.stderr)
        return 2

    import dask

    back = 0
    with (
        tempfile.TemporaryDirectory(prefix="worker-restarts-") as tmp,
        dask.config.set({"distributed.deploy.lost-worker-timeout": args.lost_worker_timeout}),
        dask_cluster(WORKERS) as client,
    ):
        print(f"{WORKERS} workers, lost-worker-timeout {args.lost_worker_timeout}", flush=True)
        for death in range(args.deaths):
            future = client.submit(die_the_first_time, str(Path(tmp) / uuid.uuid4().hex), pure=False)
            started = time.monotonic()
            while workers(client) == WORKERS and time.monotonic() - started < 10.0:
                time.sleep(0.02)  # the worker dies
            died = time.monotonic()
            while workers(client) < WORKERS and time.monotonic() - died < args.wait:
                time.sleep(0.05)
            returned = workers(client) == WORKERS
            back += returned
            took = f"came back after {time.monotonic() - died:.1f} s" if returned else "never came back"
            print(f"death {death + 1}: the worker {took}", flush=True)
            client.cancel([future], force=True)
            if not returned:
                break
    print(f"{back} of {death + 1} deaths came back (lost-worker-timeout {args.lost_worker_timeout})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
