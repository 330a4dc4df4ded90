"""How much of the limit can a rule reach, and at what machine time? Reference rules on the same
jobs, checkpoints and relaunch draws as `straggler evaluate` (docs/results.md, "Why the real trace stays
near Spark's rule").

Each rule copies tasks in `straggler.simulation`'s cluster (first finisher wins, the loser killed at
the next checkpoint) and is scored like the evaluator's policies:

- ``limit``: every true p90 straggler at the first checkpoint it runs (the evaluator's limit);
- ``stragglers at x``: every true straggler once its elapsed time reaches x times the job's true p90
  (perfect knowledge of *which* tasks, varying *when*);
- ``all at x``: every task once its elapsed time reaches x times the true p90: what a rule that sees
  only elapsed times can do at that timing (without predictive features it cannot tell a straggler
  from a task that merely started early);
- ``spark``: Spark's default speculation (once 75 % of the job's tasks finished, copy tasks running
  longer than 1.5 x the median finished latency), online;
- ``copy every flag``: a copy of each task the reactive rule flags (online p90), online;
- ``speculate price p budget b``: the default policy's rule with other settings, on the reactive
  rule's flags (NURD decides exactly like it on the real trace, and it is fast).

    OMP_NUM_THREADS=1 .venv/bin/python docs/results/mitigation/frontier.py --format google-2011 \
        --trace ../shared/traces/google-2011 --checkpoint-seconds 60 \
        --out docs/results/mitigation/frontier-60s.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from straggler.core.arrays import BoolArray, IntArray
from straggler.core.jobtrace import JobTrace
from straggler.core.online import Decision
from straggler.core.policies import Action, MitigationPolicy
from straggler.core.speculation import Speculate
from straggler.core.threshold import oracle_threshold
from straggler.evaluation import EvaluationConfig, online_job
from straggler.simulation import (
    Chooser,
    JobSimulation,
    checkpoint_interval,
    copy_when,
    limit_outcome,
    run_closed_loop,
)
from straggler.traces.loading import add_trace_arguments, load_traces_from_args

ELAPSED_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
SPECULATE_SETTINGS = ((2.0, 1.0), (4.0, 1.0), (8.0, 1.0), (16.0, 1.0), (4.0, 0.1), (8.0, 0.1), (4.0, 0.03))


def at_elapsed(x: float, stragglers_only: bool) -> Chooser:
    def choose(sim: JobSimulation, t: float, running: IntArray) -> BoolArray:
        trace = sim.trace
        scored = trace.scored
        p90 = oracle_threshold(trace.latency[scored])
        due = (t - sim.start[running]) >= x * p90
        if stragglers_only:
            with np.errstate(invalid="ignore"):
                due &= scored[running] & (trace.latency[running] >= p90)
        return np.asarray(due, dtype=bool)

    return choose


def spark(sim: JobSimulation, t: float, running: IntArray) -> BoolArray:
    done = sim.reported & sim.finished
    if done.sum() < 0.75 * sim.trace.expected_tasks:
        return np.zeros(len(running), dtype=bool)
    median = float(np.median((sim.end - sim.start)[done]))
    return np.asarray((t - sim.start[running]) > 1.5 * median, dtype=bool)


class CopyEveryFlag(MitigationPolicy):
    """Copy each flagged task once; kill the loser when one attempt finishes."""

    name = "copy-every-flag"

    def __init__(self) -> None:
        self.races: dict[str, int] = {}
        self.kills: list[Action] = []

    def on_task_finished(
        self, job_id: str, task_id: str, at: float, latency: float, attempt: int = 0
    ) -> None:
        original = self.races.pop(task_id, None)
        if original is not None:
            loser = original + 1 if attempt == original else original
            self.kills.append(Action(job_id, task_id, "kill", at, "lost", at, loser))

    def on_checkpoint(self, job_id: str, at: float, decisions: Sequence[Decision]) -> list[Action]:
        actions, self.kills = self.kills, []
        for d in decisions:
            if d.is_straggler and d.task_id not in self.races:
                self.races[d.task_id] = d.attempt
                actions.append(Action(job_id, d.task_id, "duplicate", at, "flagged", at, d.attempt))
        return actions


def rules_on(trace: JobTrace, default_interval: float) -> dict[str, tuple[float, float]]:
    """Every rule's (JCT reduction, extra machine time) on one job."""
    interval = checkpoint_interval(trace, default_interval)
    found = {"limit": limit_outcome(trace, 0, interval)}
    for x in ELAPSED_SHARES:
        found[f"stragglers at {x:g} x p90"] = copy_when(trace, 0, interval, at_elapsed(x, True))
        found[f"all at {x:g} x p90"] = copy_when(trace, 0, interval, at_elapsed(x, False))
    found["spark (75 %, 1.5 x median)"] = copy_when(trace, 0, interval, spark)
    config = EvaluationConfig(methods=("reactive",), threshold="online")
    policies: dict[str, MitigationPolicy] = {"copy every flag": CopyEveryFlag()}
    for price, budget in SPECULATE_SETTINGS:
        policies[f"speculate price {price:g} budget {budget:g}"] = Speculate(
            machine_price=price, budget=budget, checkpoint_interval=interval
        )
    for name, policy in policies.items():
        found[name] = run_closed_loop(
            trace, online_job(trace, "reactive", config), policy, 0, interval
        ).outcome
    return {name: (o.reduction, o.extra_machine_time) for name, o in found.items()}


def _rules_star(args: tuple[JobTrace, float]) -> dict[str, tuple[float, float]]:
    return rules_on(*args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_arguments(parser)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    traces = load_traces_from_args(args)
    work = [(t, args.checkpoint_seconds or 300.0) for t in traces]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        per_job = list(tqdm(pool.map(_rules_star, work, chunksize=4), total=len(work), unit="job"))
    limit = float(np.mean([r["limit"][0] for r in per_job]))
    rows = {}
    for name in per_job[0]:
        jct = float(np.mean([r[name][0] for r in per_job]))
        rows[name] = {
            "jct_reduction": jct,
            "extra_machine_time": float(np.mean([r[name][1] for r in per_job])),
            "share_of_limit": jct / limit if limit > 0 else float("nan"),
            "jobs_longer": int(sum(r[name][0] < -1e-12 for r in per_job)),
        }
    args.out.write_text(json.dumps({"jobs": len(traces), "rules": rows}, indent=2))
    print("| rule | JCT reduction | extra machine time | share of the limit |\n|---|---|---|---|")
    for name, row in rows.items():
        print(
            f"| {name} | {row['jct_reduction']:+.2%} | {row['extra_machine_time']:+.2%} "
            f"| {row['share_of_limit']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
