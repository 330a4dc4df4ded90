"""NURD's update + predict time per checkpoint against the reference protocol, with both F1s.

Drivers ``nurd``, ``nurd-warm``, ``nurd-every`` and ``reference`` (the paper's scikit-learn models
refitted at every checkpoint, `bench/reference.py`) run on the same synthetic jobs; the headline
``speedup`` is reference / nurd-warm. Method: docs/performance.md, "How to run each benchmark".

    .venv/bin/python bench/model_cost.py [--quick] [--json runs/bench/model_cost.json]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import machine, table, write_outputs
from matplotlib.figure import Figure
from reference import PaperReference
from tqdm import tqdm

from straggler.core.jobtrace import JobTrace
from straggler.core.method import StragglerMethod
from straggler.core.metrics import confusion
from straggler.core.nurd import make_nurd
from straggler.core.online import OnlineJob
from straggler.core.threshold import oracle_threshold
from straggler.native_calls import install as install_native_calls
from straggler.simulation import JobSimulation, observe_step, steps
from straggler.traces.synthetic import generate_jobs

DRIVERS: dict[str, tuple[Callable[[int], StragglerMethod], float]] = {
    "nurd": (lambda seed: make_nurd("nurd", random_state=seed), 0.25),
    "nurd-warm": (lambda seed: make_nurd("nurd-warm", random_state=seed), 0.25),
    "nurd-every": (lambda seed: make_nurd("nurd", random_state=seed), 0.0),
    "reference": (lambda seed: PaperReference(random_state=seed), 0.0),
}
"""Driver name -> (method factory, refit_growth)."""


def run_job(trace: JobTrace, driver: str, seed: int) -> dict[str, float]:
    """One job through one driver: seconds per checkpoint (mean, p95), total, refits, and F1."""
    factory, growth = DRIVERS[driver]
    latency = trace.latency
    scored = trace.scored
    oracle = oracle_threshold(latency[scored], 0.9)
    job = OnlineJob(
        trace.job_id,
        factory(seed),
        len(trace.feature_names),
        trace.expected_tasks,
        threshold=oracle,
        refit_growth=growth,
    )
    index = {task: i for i, task in enumerate(trace.task_ids)}
    flagged = np.zeros(trace.n_tasks, dtype=bool)
    per_checkpoint: list[float] = []
    sim = JobSimulation(trace, seed=0)
    for step in steps(sim, None):
        t = step.at
        began = time.perf_counter()
        observe_step(job.state, sim, step)
        decisions = job.checkpoint(t)
        per_checkpoint.append(time.perf_counter() - began)
        for d in decisions:
            if d.is_straggler:
                flagged[index[d.task_id]] = True
    truth = latency[scored] >= oracle
    seconds = np.asarray(per_checkpoint)
    return {
        "checkpoints": float(len(seconds)),
        "total_seconds": float(seconds.sum()),
        "ms_per_checkpoint": 1000.0 * float(seconds.mean()),
        "ms_per_checkpoint_p95": 1000.0 * float(np.percentile(seconds, 95)),
        "refits": float(job.model_version),
        "f1": confusion(truth, flagged[scored]).f1,
    }


def main() -> int:
    install_native_calls()  # as the worker does (`straggler.cli.main`)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="jobs of 100 and 1,000 tasks only (about a minute)"
    )
    parser.add_argument("--sizes", default=None, help="comma-separated task counts (default 100,1000,10000)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per size (default 3, quick 1)")
    parser.add_argument(
        "--checkpoint-seconds", type=float, default=None, help="checkpoint interval (default 60, quick 180)"
    )
    parser.add_argument(
        "--drivers",
        default=",".join(DRIVERS),
        help="comma-separated subset of the drivers (figures needing a missing one are NaN)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json", type=Path, default=None, help="write the figures here (and a PNG beside it)"
    )
    args = parser.parse_args()
    chosen = [d for d in args.drivers.split(",") if d]
    unknown = sorted(set(chosen) - set(DRIVERS))
    if unknown:
        parser.error(f"unknown drivers {unknown}; choose from {list(DRIVERS)}")
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([100, 1000] if args.quick else [100, 1000, 10_000])
    )
    n_jobs = args.jobs or (1 if args.quick else 3)
    interval = args.checkpoint_seconds or (180.0 if args.quick else 60.0)

    runs: dict[str, dict[str, list[dict[str, float]]]] = {str(n): {d: [] for d in chosen} for n in sizes}
    bar = tqdm(total=len(sizes) * n_jobs * len(chosen), unit="run", desc="model cost")
    for size in sizes:
        traces = generate_jobs(
            n_jobs, seed=args.seed, min_tasks=size, max_tasks=size, checkpoint_seconds=interval
        )
        for trace in traces:
            for driver in chosen:
                bar.set_postfix_str(f"{size} tasks, {driver}")
                runs[str(size)][driver].append(run_job(trace, driver, args.seed))
                bar.update()
    bar.close()

    by_size: dict[str, dict[str, dict[str, float]]] = {}
    for n, drivers in runs.items():
        by_size[n] = {
            d: {key: float(np.mean([r[key] for r in rows])) for key in rows[0]} for d, rows in drivers.items()
        }

    def ratio(numerator: str, denominator: str) -> dict[str, float]:
        if not {numerator, denominator} <= set(chosen):
            return {n: float("nan") for n in by_size}
        return {
            n: rows[numerator]["total_seconds"] / rows[denominator]["total_seconds"]
            for n, rows in by_size.items()
        }

    def f1_gap(driver: str, against: str) -> dict[str, float]:
        if not {driver, against} <= set(chosen):
            return {n: float("nan") for n in by_size}
        return {n: rows[driver]["f1"] - rows[against]["f1"] for n, rows in by_size.items()}

    speedups = ratio("reference", "nurd-warm")
    figures: dict[str, Any] = {
        "speedup": min(speedups.values()),
        "drivers": chosen,
        "speedup_by_size": speedups,
        "speedup_nurd_by_size": ratio("reference", "nurd"),
        "nurd_warm_saves_by_size": ratio("nurd", "nurd-warm"),
        "refit_rule_speedup_by_size": ratio("nurd-every", "nurd"),
        "f1_warm_minus_every_by_size": f1_gap("nurd-warm", "nurd-every"),
        "f1_nurd_minus_every_by_size": f1_gap("nurd", "nurd-every"),
        "f1_warm_minus_reference_by_size": f1_gap("nurd-warm", "reference"),
        "targets": {"speedup": 10.0, "f1_gap_at_least": -0.01},
        "by_size": by_size,
        "runs": runs,
        "jobs_per_size": n_jobs,
        "checkpoint_seconds": interval,
        "quick": args.quick,
        "machine": machine(),
    }
    rows = [
        [
            n,
            d,
            r["checkpoints"],
            r["refits"],
            r["ms_per_checkpoint"],
            r["ms_per_checkpoint_p95"],
            r["total_seconds"],
            r["f1"],
        ]
        for n, drivers in by_size.items()
        for d, r in drivers.items()
    ]
    print()
    print(table(rows, ["tasks", "driver", "checkpoints", "fits", "ms/ckpt", "p95 ms", "s/job", "F1"]))
    print()
    for n in by_size:
        print(
            f"{n:>6} tasks: reference / nurd-warm = {speedups[n]:.1f}x (target >= 10x), "
            f"F1 nurd-warm - full refit = {figures['f1_warm_minus_every_by_size'][n]:+.3f} "
            f"(target >= -0.01), - reference = {figures['f1_warm_minus_reference_by_size'][n]:+.3f}; "
            f"reference / nurd = {figures['speedup_nurd_by_size'][n]:.1f}x at F1 - full refit "
            f"{figures['f1_nurd_minus_every_by_size'][n]:+.3f}"
        )
    print(f"load: {figures['machine']['uptime']}")

    def plot(figure: Figure) -> None:
        left = figure.add_subplot(1, 2, 1)
        x = np.arange(len(by_size))
        width = 0.8 / len(chosen)
        offset = (len(chosen) - 1) / 2
        for j, d in enumerate(chosen):
            means = [by_size[n][d]["ms_per_checkpoint"] for n in by_size]
            left.bar(x + (j - offset) * width, means, width, label=d)
        left.set_xticks(x, [f"{int(n):,}" for n in by_size])
        left.set_yscale("log")
        left.set_xlabel("tasks per job")
        left.set_ylabel("ms per checkpoint (mean)")
        left.legend()
        right = figure.add_subplot(1, 2, 2)
        for j, d in enumerate(chosen):
            right.bar(x + (j - offset) * width, [by_size[n][d]["f1"] for n in by_size], width, label=d)
        right.set_xticks(x, [f"{int(n):,}" for n in by_size])
        right.set_xlabel("tasks per job")
        right.set_ylabel("F1 (oracle p90)")
        right.set_ylim(0, 1)

    write_outputs(figures, args.json, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
