"""How much of the slow worker's cost any policy could win back in `bench/dask_jobs.py`'s jobs: the
completion time of the best schedule of each job's tasks on its workers, knowing in advance which
worker is slow and every task's time (a clairvoyant bound no online policy reaches), beside the same
jobs placed as Dask places them.

Each job of the bench (its seed, its planned task times) is scheduled on 4 workers, one 4x slow:

- ``dask``: each task, in submission order, to the first worker free (Dask with nothing queued);
- ``clean``: the same on 4 usual workers;
- ``best``: longest task first, each to the worker that would finish it soonest, the slow one
  included: the job's completion time if placement knew everything (a good schedule; with a copy
  allowed to start only once its original has run, an online policy does worse);
- ``three``: the same on the 3 usual workers only (the slow worker left idle).

With ``--json`` (a `bench/dask_jobs.py` result), the recovered share the best schedule would give
against the measured Dask-alone and clean completion times, which is what the bench's bar is
judged on:

    .venv/bin/python bench/dask_slow_worker_bound.py --json docs/results/dask/dask_jobs.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from dask_work import SLOWDOWN, planned_seconds

WORKERS = 4


def first_free(tasks: Sequence[float], slowness: Sequence[float]) -> float:
    """Completion time when each task, in order, goes to the first worker free."""
    free = [0.0] * len(slowness)
    for seconds in tasks:
        worker = min(range(len(slowness)), key=lambda k: free[k])
        free[worker] += seconds * slowness[worker]
    return max(free)


def soonest_finish(tasks: Sequence[float], slowness: Sequence[float]) -> float:
    """Completion time when each task, longest first, goes to the worker that finishes it soonest."""
    free = [0.0] * len(slowness)
    for seconds in sorted(tasks, reverse=True):
        worker = min(range(len(slowness)), key=lambda k: free[k] + seconds * slowness[k])
        free[worker] += seconds * slowness[worker]
    return max(free)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--json", type=Path, default=None, help="a bench/dask_jobs.py result")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.tasks < WORKERS:
        print("error: --reps must be >= 1 and --tasks >= 4", file=sys.stderr)
        return 2
    slow = [SLOWDOWN] + [1.0] * (WORKERS - 1)
    rows = []
    print(f"{'rep':>3} {'work, s':>8} {'clean':>6} {'dask':>6} {'best':>6} {'three':>6}")
    for rep in range(args.reps):
        seconds = planned_seconds(args.tasks, seed=1000 + rep)  # the bench's jobs, rep by rep
        row = (
            first_free(seconds, [1.0] * WORKERS),
            first_free(seconds, slow),
            soonest_finish(seconds, slow),
            soonest_finish(seconds, [1.0] * (WORKERS - 1)),
        )
        rows.append(row)
        print(f"{rep:>3} {sum(seconds):>8.1f} " + " ".join(f"{x:>6.2f}" for x in row))
    clean, dask, best, three = np.mean(rows, axis=0)
    print(f"{'mean':>3} {'':>8} {clean:>6.2f} {dask:>6.2f} {best:>6.2f} {three:>6.2f}")
    share = (dask - best) / (dask - clean)
    print(f"in the model: the best schedule recovers {share:.0%} of the slow worker's cost")
    if args.json is not None:
        measured = {(r["scenario"], r["policy"]): r for r in json.loads(args.json.read_text())["rows"]}
        alone = measured[("slow-worker", "alone")]["jct_mean"]
        clean_measured = measured[("slow-worker", "alone")]["clean_mean"]
        print(
            f"measured: Dask alone {alone:.2f} s, clean {clean_measured:.2f} s; the best schedule "
            f"({best:.2f} s) would recover {(alone - best) / (alone - clean_measured):.0%}; "
            f"60 % needs {alone - 0.6 * (alone - clean_measured):.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
