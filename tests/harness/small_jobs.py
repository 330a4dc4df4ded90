"""Small hand-built `JobTrace`s (no loader involved): the jobs of the tests and of the fault scenarios
(`fault_scenarios`), with a visible latency signal and, on request, a slow machine group."""

from __future__ import annotations

import numpy as np

from straggler.core.jobtrace import JobTrace, checkpoint_grid


def make_job(
    n_tasks: int = 200,
    *,
    seed: int = 0,
    signal: float = 1.0,
    interval: float = 10.0,
    job_id: str = "job-1",
    slow_group: float = 0.0,
    waves: int = 2,
    wave_gap: float = 5.0,
) -> JobTrace:
    """Tasks start in two waves; latency = exp(signal * x0 + noise); x0 is visible, x1 is noise.

    With ``slow_group`` > 0, that share of the tasks runs on slow machines: 3x longer, and their x1
    (think cycles per instruction) is visibly high, as Mantri finds for bad machines.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_tasks, 2))
    latency = np.exp(3.0 + signal * x[:, 0] + 0.3 * rng.normal(size=n_tasks))
    slow = rng.random(n_tasks) < slow_group
    latency[slow] *= 3.0
    x[slow, 1] += 4.0
    start = (wave_gap * (np.arange(n_tasks) * waves // n_tasks)).astype(np.float64)
    end = (start + latency).astype(np.float64)
    checkpoints = checkpoint_grid(0.0, float(end.max()), interval)
    running_index = []
    running_features = []
    for t in checkpoints:
        idx = np.flatnonzero((start <= t) & (t < end))
        running_index.append(idx.astype(np.int64))
        running_features.append(x[idx].astype(np.float64))
    return JobTrace(
        job_id=job_id,
        task_ids=[f"t{i}" for i in range(n_tasks)],
        machine_ids=[f"m{i % 17}" for i in range(n_tasks)],
        start=start,
        end=end,
        finished=np.ones(n_tasks, dtype=bool),
        feature_names=("x0", "x1"),
        checkpoints=checkpoints,
        running_index=running_index,
        running_features=running_features,
        finish_features=x.astype(np.float64),
    )
