"""What relaunching predicted stragglers does to a job's completion time (paper §5 and §7.3).

A relaunched task's new run takes a latency drawn from the job's own latency distribution, with
one fixed draw per task (seeded by job and seed), so every method faces the same luck and two runs
of the evaluation agree. Algorithm 2 relaunches every flagged task at once; Algorithm 3 has a pool
of ``machines`` spares: a relaunched copy holds one until it finishes, and flagged tasks wait, in
flag order, for a spare at later checkpoints.

The price is reported beside the gain: the run time of every killed original is duplicate work,
given as a fraction of the job's total work. Under Algorithm 2 false positives look free in
completion time; this number shows what they cost.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from straggler.core.online import Decision
from straggler.core.policies import Limited, MitigationPolicy, Unlimited

FloatArray = NDArray[np.float64]


def relaunch_latencies(job_latencies: FloatArray, n_tasks: int, job_id: str, seed: int) -> FloatArray:
    """One new-run latency per task, sampled from the job's latencies (fixed per job, task and seed)."""
    rng = np.random.default_rng([seed, zlib.crc32(job_id.encode())])
    pool = job_latencies[np.isfinite(job_latencies)]
    return rng.choice(pool, size=n_tasks, replace=True).astype(np.float64)


@dataclass(frozen=True)
class JobCompletion:
    before: float
    after: float
    extra_work: float
    relaunched: int

    @property
    def reduction(self) -> float:
        return (self.before - self.after) / self.before if self.before > 0 else 0.0


def simulate_relaunches(
    start: FloatArray,
    end: FloatArray,
    flag_time: FloatArray,
    new_latency: FloatArray,
    checkpoints: FloatArray,
    machines: int | None = None,
) -> JobCompletion:
    """Completion time of a job (scored tasks) before and after relaunching its flagged tasks.

    ``flag_time`` is NaN for tasks never flagged. ``machines=None`` is Algorithm 2 (unlimited),
    otherwise Algorithm 3. The decisions go through the same `MitigationPolicy` objects the
    mitigation consumer runs, checkpoint by checkpoint, with finish events in between.
    """
    policy: MitigationPolicy = Unlimited() if machines is None else Limited(machines)
    job = "job"
    begin = float(np.min(start))
    current_end = end.astype(np.float64).copy()
    relaunch_at = np.full(len(end), np.nan)
    reported = np.zeros(len(end), dtype=bool)
    previous = -np.inf
    for t in checkpoints:
        finishing = np.flatnonzero(~reported & (current_end <= t))
        for i in finishing[np.argsort(current_end[finishing], kind="stable")]:
            policy.on_task_finished(job, str(i), float(current_end[i]), float(current_end[i] - start[i]))
        reported[finishing] = True
        with np.errstate(invalid="ignore"):
            flagged_now = np.flatnonzero((flag_time > previous) & (flag_time <= t) & ~reported)
        decisions = [_flag(job, str(i), float(t)) for i in flagged_now]
        for action in policy.on_checkpoint(job, float(t), decisions):
            i = int(action.task_id)
            if not reported[i] and np.isnan(relaunch_at[i]):
                relaunch_at[i] = action.at
                current_end[i] = action.at + new_latency[i]
        previous = t
    done = np.isfinite(relaunch_at)
    total_work = float(np.sum(end - start))
    wasted = float(np.sum(relaunch_at[done] - start[done]))
    return JobCompletion(
        before=float(np.max(end)) - begin,
        after=float(np.max(current_end)) - begin,
        extra_work=wasted / total_work if total_work > 0 else 0.0,
        relaunched=int(done.sum()),
    )


def _flag(job_id: str, task_id: str, at: float) -> Decision:
    nan = float("nan")
    return Decision(job_id, task_id, at, nan, nan, nan, nan, nan, nan, True, 0)
