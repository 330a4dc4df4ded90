"""Scratch variants of `Speculate` on one half of the real trace (or the synthetic set, or a usage
trace), with each copy's race counted by the reason its command gives (the harness of
docs/results.md, "Tried and not shipped").

    .venv/bin/python docs/results/equal-cost/policy_variants.py --trace ../shared/traces/google-2011 \
        --half tune --checkpoint-seconds 60 --variant gate --policies speculate@32/none/gross,spark

Each job runs `nurd` and the policy in the closed loop, as `straggler evaluate --threshold online`
does (`straggler.simulation.run_closed_loop`); a variant replaces one part of the policy in the worker
processes only. Prints, per policy: mean JCT reduction, mean gross extra machine time, copies and the
share won, and per reason (floor: Spark's rule; sure: a sure straggler; early: a likely one before the
job's curve; priced: the cost rule) copies, won and lost.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import pickle
import runpy
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson

import straggler.core.speculation as speculation
import straggler.core.survival as survival
from straggler.core.policies import HoldKind
from straggler.core.policy_spec import make_policy
from straggler.evaluation import EvaluationConfig, online_job
from straggler.simulation import checkpoint_interval, figures, mean_figures, recorded_steps, run_closed_loop
from straggler.traces.loading import job_half, load_traces


def gate() -> None:
    """The cost rule weighs only candidates whose copy more likely than not ends first."""
    estimate = speculation._estimate

    def gated(*args: Any, **kwargs: Any) -> Any:
        est = estimate(*args, **kwargs)
        if est is None or not len(est.candidates):
            return est
        keep = np.array([speculation._copy_ends_first(est, int(i)) > 0.5 for i in est.candidates])
        return dataclasses.replace(est, candidates=est.candidates[keep])

    speculation._estimate = gated


def late() -> None:
    """Every `Speculate` (not its subclasses) weighs only tasks that have run at least LATE_RATIO (env,
    1.5) times the job's median finished latency: the product's `Speculate.priced_after`, which
    ``speculate.../late`` sets to 1.5; other ratios are this harness's."""
    init = speculation.Speculate.__init__
    ratio = float(os.environ.get("LATE_RATIO", "1.5"))

    def late_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if type(self) is speculation.Speculate:
            self.priced_after = ratio

    speculation.Speculate.__init__ = late_init  # type: ignore[method-assign]


def wait() -> None:
    """A priced copy waits where the same copy a checkpoint later is worth more (the plan's other
    copies made now): it then ends the task at min(R, spacing + C) and runs only if R > spacing."""
    plan = speculation.Speculate.plan

    def waiting(self: Any, job: Any, at: float, estimate: Any) -> Any:
        chosen = plan(self, job, at, estimate)
        if not chosen.tasks or chosen.unpriced:
            return chosen
        est = estimate()
        spacing = min(self.checkpoint_interval, job.spacing)
        row = {t: i for i, t in enumerate(est.ids)}
        rows = np.array([row[t] for t in chosen.tasks])
        tail = 1.0 - est.remaining[rows]
        fresh = np.broadcast_to(est.fresh_rows(rows), tail.shape)
        later = np.array([np.interp(est.grid - spacing, est.grid, f, left=0.0) for f in fresh])
        log_now = np.log(np.maximum(1.0 - tail * (1.0 - fresh), speculation.TINY))
        log_later = np.log(np.maximum(1.0 - tail * (1.0 - later), speculation.TINY))
        all_now = est.all_done - est.log_cdf[rows].sum(axis=0) + log_now.sum(axis=0)

        def end(log_all: np.ndarray) -> float:
            return float(np.sum(1.0 - np.exp(log_all)) * est.step)

        past = est.grid >= spacing
        copy_now, saved_now = (np.sum(x, axis=1) * est.step for x in (tail * (1.0 - fresh), tail * fresh))
        copy_later = np.sum((tail * (1.0 - later))[:, past], axis=1) * est.step
        saved_later = np.sum(tail * later, axis=1) * est.step
        runs_later = np.array([np.interp(spacing, est.grid, t) for t in tail])  # P(R > spacing)
        cost_now = self.machine_time(copy_now, saved_now) + 0.5 * spacing
        cost_later = self.machine_time(copy_later, saved_later) + 0.5 * spacing * runs_later
        keep = []
        for k, task_id in enumerate(chosen.tasks):
            sooner = (end(all_now - log_now[k] + log_later[k]) - end(all_now)) / est.completion
            cheaper = self.machine_price * (cost_now[k] - cost_later[k]) / est.work
            if not cheaper > sooner:
                keep.append(task_id)
        held: dict[str, HoldKind] = {**chosen.held, **{t: "price" for t in chosen.tasks if t not in keep}}
        return dataclasses.replace(chosen, tasks=keep, held=held)

    speculation.Speculate.plan = waiting  # type: ignore[method-assign]


def fitted_tail() -> None:
    """The curve's exponential tail scaled by the excesses over the finished latencies' upper decile
    (``TAIL_QUANTILE``): its censored maximum-likelihood scale, finished excesses as events and running
    tasks' as exposure, with ``TAIL_PRIOR`` pseudo-excesses at the restricted mean (the shipped scale)."""
    quantile = float(os.environ.get("TAIL_QUANTILE", "0.9"))
    prior = float(os.environ.get("TAIL_PRIOR", "1"))
    init = survival.LatencySurvival.__init__

    def fitted(self: Any, finished: Any, running_elapsed: Any, stuck_prior: float = 0.0) -> None:
        init(self, finished, running_elapsed, stuck_prior)
        self.restricted_mean = self.tail_scale
        done, running = np.asarray(finished, dtype=float), np.asarray(running_elapsed, dtype=float)
        self.tail_scale = max(excess_scale(done, running, self.restricted_mean, quantile, prior), 1e-9)

    survival.LatencySurvival.__init__ = fitted  # type: ignore[method-assign]

    def mean(self: Any) -> float:
        return float(self.restricted_mean + self.last_value * self.tail_scale)

    survival.LatencySurvival.mean = mean  # type: ignore[method-assign]


def excess_scale(
    done: np.ndarray, running: np.ndarray, shipped: float, quantile: float, prior: float
) -> float:
    """`fitted_tail`'s scale."""
    u = float(np.quantile(done, quantile))
    exposure = float(np.sum(np.maximum(done - u, 0.0)) + np.sum(np.maximum(running - u, 0.0)))
    return (exposure + prior * shipped) / (float(np.sum(done > u)) + prior)


def tail_likelihood(traces: list[Any]) -> None:
    """Mean log-likelihood of each task's remaining run, where it first outran the last finished
    latency at a checkpoint of the recorded trace, under the exponential tail of each scale (tasks
    that end otherwise than by finishing left out)."""
    settings = [(q, k) for q in (0.5, 0.75, 0.9, 0.95) for k in (1.0, 5.0, 20.0, 100.0)]
    total = np.zeros(1 + len(settings))
    looks = 0
    for trace in traces:
        latency = trace.end - trace.start
        seen: set[int] = set()
        for step in recorded_steps(trace):
            done = np.flatnonzero(trace.finished & (trace.end <= step.at))
            if not len(done) or not len(step.running):
                continue
            elapsed = step.at - trace.start[step.running]
            curve = survival.LatencySurvival(latency[done], elapsed)
            shipped = curve.tail_scale
            scales = np.array(
                [shipped, *(excess_scale(latency[done], elapsed, shipped, q, k) for q, k in settings)]
            )
            for i, ran in zip(step.running.tolist(), elapsed.tolist(), strict=True):
                if ran > curve.last_time and i not in seen and trace.finished[i]:
                    seen.add(i)
                    total += -np.log(scales) - (trace.end[i] - step.at) / scales
                    looks += 1
    print(f"{len(traces)} jobs, {looks} tasks past the last finish; mean log-likelihood per task:")
    print(f"  shipped (the restricted mean): {total[0] / looks:.3f}")
    for (q, k), value in zip(settings, total[1:], strict=True):
        print(f"  excesses over the {q:g} quantile, {k:g} pseudo-excesses: {value / looks:.3f}")


PRICED: list[dict[str, Any]] = []
"""The priced copies of the job this process runs, as `record_priced` notes them."""


def record_priced() -> None:
    """Note each priced copy's estimates as the cost rule makes it (``--copies``)."""
    plan = speculation.Speculate.plan

    def noting(self: Any, job: Any, at: float, estimate: Any) -> Any:
        chosen = plan(self, job, at, estimate)
        if chosen.tasks and not chosen.unpriced:
            est = estimate()
            row = {t: i for i, t in enumerate(est.ids)}
            finished = np.fromiter(job.finished.values(), dtype=float)
            median, longest = float(np.median(finished)), float(finished.max())
            for task_id in chosen.tasks:
                PRICED.append(
                    {
                        "task": task_id,
                        "attempt": job.running[task_id].attempt,
                        "at": at,
                        "ran": at - job.running[task_id].start,
                        "median_finished": median,
                        "longest_finished": longest,
                        "share_finished": len(job.finished) / (len(job.finished) + len(job.running)),
                        "running": len(job.running),
                        "probability": job.running[task_id].probability,
                        "copy_ends_first": speculation._copy_ends_first(est, row[task_id]),
                    }
                )
        return chosen

    speculation.Speculate.plan = noting  # type: ignore[method-assign]


def start_worker(variant: str, copies: bool) -> None:
    for name in variant.split("+"):
        if name != "none":
            VARIANTS[name]()
    if copies:
        record_priced()


VARIANTS: dict[str, Callable[[], None]] = {"gate": gate, "wait": wait, "tail": fitted_tail, "late": late}


def reason_of(text: str) -> str:
    if "Spark's rule" in text:
        return "floor"
    if "sure straggler" in text:
        return "sure"
    if "likely straggler" in text:
        return "early"
    return "priced"


def run_job(
    args: tuple[Any, str, float],
) -> tuple[dict[str, float], dict[str, list[int]], list[dict[str, Any]]]:
    trace, spec, spacing = args
    config = EvaluationConfig(methods=("nurd",), threshold="online", policies=(spec,))
    interval = checkpoint_interval(trace, spacing)
    run = run_closed_loop(
        trace, online_job(trace, "nurd", config), make_policy(spec, interval), config.seed, interval
    )
    copies = {(a.task_id, a.attempt): reason_of(a.reason) for a in run.commands if a.action == "duplicate"}
    outcome: dict[tuple[str, int], bool] = {}
    for a in run.commands:  # a kill names the race's loser: the original's attempt when the copy won
        if a.action == "kill":
            if (a.task_id, a.attempt) in copies:
                outcome[(a.task_id, a.attempt)] = True
            elif (a.task_id, a.attempt - 1) in copies:
                outcome[(a.task_id, a.attempt - 1)] = False
    by_reason: dict[str, list[int]] = {}
    for key, reason in copies.items():
        count = by_reason.setdefault(reason, [0, 0, 0])
        count[0] += 1
        count[1] += outcome.get(key) is True
        count[2] += outcome.get(key) is False
    priced = [
        {"policy": spec, "job": trace.job_id, **c, "won": outcome.get((c["task"], c["attempt"]))}
        for c in PRICED
    ]
    PRICED.clear()
    return figures(run.outcome), by_reason, priced


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, help="the Google 2011 trace (not with --synthetic)")
    p.add_argument("--format", choices=("google-2011", "google-2011-usage"), default="google-2011")
    p.add_argument("--half", choices=("tune", "report"), help="one half of the real trace's jobs")
    p.add_argument("--synthetic", type=int, metavar="SEED", help="the synthetic set of this seed instead")
    p.add_argument("--jobs", type=int, default=40, help="synthetic jobs (default 40)")
    p.add_argument("--checkpoint-seconds", type=float, default=60.0)
    p.add_argument("--policies", default="", help="comma-separated policy specs")
    p.add_argument("--tail-likelihood", action="store_true", help="score the tail scales instead")
    p.add_argument(
        "--variant",
        choices=("none", *VARIANTS, *(f"{a}+{b}" for a in VARIANTS for b in VARIANTS if a < b)),
        default="none",
        help="a part of the policy replaced, or two (e.g. tail+wait)",
    )
    p.add_argument("--cache", type=Path, help="pickle of the loaded jobs, written on the first run")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--copies", type=Path, help="write each policy's priced copies: estimates and race (JSON lines)"
    )
    p.add_argument(
        "--script",
        nargs=argparse.REMAINDER,
        help="run this single-process script, with its arguments, under the variant instead "
        "(e.g. --variant tail --script scripts/truth_gate.py --trace ... --checkpoint-seconds 60)",
    )
    args = p.parse_args()
    if args.script:
        start_worker(args.variant, False)
        sys.argv = args.script
        runpy.run_path(args.script[0], run_name="__main__")
        return
    halves = args.trace is not None and args.format == "google-2011"
    if (args.synthetic is None) == (args.trace is None) or halves != bool(args.half):
        p.error("give --trace and --half (--half only with --format google-2011), or --synthetic SEED")
    if args.cache and args.cache.exists():
        traces = pickle.loads(args.cache.read_bytes())
    elif args.synthetic is not None:
        traces = load_traces(
            "synthetic", None, checkpoint_seconds=args.checkpoint_seconds, jobs=args.jobs, seed=args.synthetic
        )
    else:
        traces = load_traces(args.format, args.trace, checkpoint_seconds=args.checkpoint_seconds)
    if args.cache and not args.cache.exists():
        args.cache.write_bytes(pickle.dumps(traces))
    if args.half:
        traces = [t for t in traces if job_half(t.job_id) == args.half]
    if args.tail_likelihood:
        tail_likelihood(traces)
        return
    priced: list[dict[str, Any]] = []
    for spec in filter(None, args.policies.split(",")):
        with ProcessPoolExecutor(
            args.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=start_worker,
            initargs=(args.variant, args.copies is not None),
        ) as pool:
            rows = list(pool.map(run_job, [(t, spec, args.checkpoint_seconds) for t in traces], chunksize=4))
        priced += (c for *_, job_priced in rows for c in job_priced)
        means = mean_figures([f for f, *_ in rows])
        copies = int(means["copies"])
        total: dict[str, list[int]] = {}
        for _, by_reason, _ in rows:
            for reason, count in by_reason.items():
                total[reason] = [a + b for a, b in zip(total.get(reason, [0, 0, 0]), count, strict=True)]
        jobs = args.half or (f"synthetic {args.synthetic}" if args.trace is None else str(args.trace))
        reasons = " ".join(f"{r}: {c[0]} ({c[1]} won, {c[2]} lost)" for r, c in sorted(total.items()))
        print(
            f"{args.variant} {jobs} {args.checkpoint_seconds:g} s {spec}: {means['jct_reduction']:+.2%} at "
            f"{means['gross_extra_machine_time']:+.3%} gross, {copies} copies, "
            f"{means['copies_won'] / max(copies, 1):.0%} won, {len(rows)} jobs | {reasons}",
            flush=True,
        )
    if args.copies:
        args.copies.write_text("".join(orjson.dumps(c).decode() + "\n" for c in priced))


if __name__ == "__main__":
    main()
