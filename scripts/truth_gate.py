"""How much of the limit a policy told the truth can reach, once it may act: the limit against the
same copies made only from the first checkpoint at which the job has a finished task (the earliest a
survival estimate of a copy's time exists) or has 4 % of its tasks finished (when the job driver
first predicts, `straggler.core.online.finished_needed`), and the shipped policy fed the truth.

Reference rules with future information (evaluation only), on the same jobs, checkpoints and draws as
`straggler evaluate`. Prints a table per half of the jobs and writes them as JSON:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/truth_gate.py --trace ../shared/traces/google-2011 \\
        --checkpoint-seconds 60 --out docs/results/equal-cost/truth-gate-60.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from straggler.argtypes import existing_dir, positive_float
from straggler.core.arrays import BoolArray, IntArray
from straggler.core.jobtrace import JobTrace
from straggler.core.online import finished_needed
from straggler.core.policy_spec import make_policy
from straggler.evaluation import EvaluationConfig, online_job
from straggler.simulation import (
    JobSimulation,
    checkpoint_interval,
    copy_when,
    figures,
    limit_outcome,
    run_closed_loop,
    true_stragglers,
)
from straggler.traces.loading import HALVES, job_half, load_traces

RULES = (
    "limit",
    "true stragglers, once a task finished",
    "true stragglers, once 4 % finished",
    "speculate fed the truth",
)


def once_finished(straggler: BoolArray, needed: int) -> Callable[[JobSimulation, float, IntArray], BoolArray]:
    """Copy the running true stragglers once ``needed`` of the job's tasks have finished."""

    def choose(sim: JobSimulation, t: float, running: IntArray) -> BoolArray:
        if np.sum(sim.end <= t) < needed:
            return np.zeros(len(running), dtype=bool)
        return straggler[running]

    return choose


def job_rows(trace: JobTrace, config: EvaluationConfig) -> dict[str, dict[str, float]]:
    """Each rule's figures on one job."""
    straggler = true_stragglers(trace, config.quantile)
    interval = checkpoint_interval(trace, config.checkpoint_seconds)
    oracle_fed = run_closed_loop(
        trace, online_job(trace, "oracle", config), make_policy("speculate", interval), 0, interval
    )
    return {
        "limit": figures(limit_outcome(trace, 0, interval, config.quantile)),
        RULES[1]: figures(copy_when(trace, 0, interval, once_finished(straggler, 1))),
        RULES[2]: figures(
            copy_when(trace, 0, interval, once_finished(straggler, finished_needed(trace.expected_tasks)))
        ),
        RULES[3]: figures(oracle_fed.outcome),
    }


def summarise(rows: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Means over jobs of each rule's figures, copies summed, and the share of the limit."""
    out: dict[str, dict[str, float]] = {}
    for rule in RULES:
        each = [r[rule] for r in rows]
        mean = {
            k: float(np.mean([e[k] for e in each])) for k in ("jct_reduction", "gross_extra_machine_time")
        }
        won, lost = sum(e["copies_won"] for e in each), sum(e["copies_lost"] for e in each)
        mean.update(copies_won=float(won), copies_lost=float(lost), jobs=float(len(each)))
        out[rule] = mean
    limit = out["limit"]["jct_reduction"]
    for rule in RULES:
        out[rule]["share_of_limit"] = out[rule]["jct_reduction"] / limit if limit > 0 else float("nan")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=existing_dir, required=True, help="a google-2011 trace directory")
    parser.add_argument("--checkpoint-seconds", type=positive_float, default=60.0)
    parser.add_argument("--out", type=Path, required=True, help="JSON file")
    args = parser.parse_args()
    traces = load_traces("google-2011", args.trace, checkpoint_seconds=args.checkpoint_seconds)
    config = EvaluationConfig(
        methods=("oracle",), threshold="online", checkpoint_seconds=args.checkpoint_seconds
    )
    result: dict[str, Any] = {"checkpoint_seconds": args.checkpoint_seconds}
    for half in HALVES:
        jobs = [t for t in traces if job_half(t.job_id) == half]
        rows = [job_rows(t, config) for t in tqdm(jobs, desc=f"{half} half", unit="job")]
        result[half] = summarise(rows)
        print(f"{half} half, {len(jobs)} jobs, {args.checkpoint_seconds:g} s checkpoints:")
        for rule, r in result[half].items():
            won = r["copies_won"] / max(r["copies_won"] + r["copies_lost"], 1)
            print(
                f"  {rule:40s} JCT {r['jct_reduction']:+.2%} ({r['share_of_limit']:.2f} of the limit) "
                f"at {r['gross_extra_machine_time']:+.2%} gross, copies won {won:.0%}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
