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
- ``three``: the same on the 3 usual workers only (the slow worker left idle);
- ``copies``: Dask's placement (``dask``), and each time a usual worker frees, the better of taking
  the next task and copying the slow worker's running task (the copy wins, the original is killed),
  chosen by trying both at every such moment: the best any policy that only copies could do, with
  no detection lag and knowing every task's time.

With ``--json`` (a `bench/dask_jobs.py` result), the recovered share the best schedule would give
against the measured Dask-alone and clean completion times, which is what the bench's bar is
judged on:

    .venv/bin/python bench/dask_slow_worker_bound.py --json docs/results/dask/dask_jobs.json
"""

from __future__ import annotations

import argparse
import json
import math
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


def best_with_copies(tasks: Sequence[float], slowdown: float, workers: int = WORKERS) -> float:
    """Completion time of the best copy-only schedule (``copies`` in the module's docstring): worker
    0 is the slow one; tasks start in order, each on the first worker free."""
    best = math.inf

    def run(free: list[float], queued: int, on_slow: tuple[int, bool] | None, ends: dict[int, float]) -> None:
        nonlocal best
        worker = min(range(workers), key=lambda k: free[k])
        now = free[worker]
        if now == math.inf:  # every worker is done
            best = min(best, max(ends.values()))
            return
        if worker == 0 or queued < len(tasks):  # take the next task (the slow worker has no choice)
            after = free.copy()
            if queued < len(tasks):
                end = now + tasks[queued] * (slowdown if worker == 0 else 1.0)
                after[worker] = end
                mine = (queued, False) if worker == 0 else on_slow
                run(after, queued + 1, mine, {**ends, queued: end})
            else:
                after[worker] = math.inf
                run(after, queued, None, ends)
        if worker != 0 and on_slow is not None and not on_slow[1]:  # copy the slow worker's task
            task = on_slow[0]
            if ends[task] > now + tasks[task]:
                after = free.copy()
                after[worker] = after[0] = now + tasks[task]
                run(after, queued, (task, True), {**ends, task: now + tasks[task]})
        if worker != 0 and queued >= len(tasks):  # or stay idle
            after = free.copy()
            after[worker] = math.inf
            run(after, queued, on_slow, ends)

    run([0.0] * workers, 0, None, {})
    return best


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
    print(f"{'rep':>3} {'work, s':>8} {'clean':>6} {'dask':>6} {'best':>6} {'three':>6} {'copies':>6}")
    for rep in range(args.reps):
        seconds = planned_seconds(args.tasks, seed=1000 + rep)  # the bench's jobs, rep by rep
        row = (
            first_free(seconds, [1.0] * WORKERS),
            first_free(seconds, slow),
            soonest_finish(seconds, slow),
            soonest_finish(seconds, [1.0] * (WORKERS - 1)),
            best_with_copies(seconds, SLOWDOWN),
        )
        rows.append(row)
        print(f"{rep:>3} {sum(seconds):>8.1f} " + " ".join(f"{x:>6.2f}" for x in row))
    clean, dask, best, three, copies = np.mean(rows, axis=0)
    print(f"{'mean':>3} {'':>8} {clean:>6.2f} {dask:>6.2f} {best:>6.2f} {three:>6.2f} {copies:>6.2f}")
    share, copied = (dask - best) / (dask - clean), (dask - copies) / (dask - clean)
    print(f"in the model: the best schedule recovers {share:.0%} of the slow worker's cost")
    print(f"in the model: the best schedule that only copies recovers {copied:.0%}")
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
