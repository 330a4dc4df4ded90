"""One job as every consumer of a trace sees it: the evaluator, the replayer and the tests.

Every loader (Google 2011 task events, Google 2011 task usage, the synthetic generator) returns
`JobTrace` objects, so the protocol, the metrics and the streaming replay never depend on where a
trace came from. The type lives in the core because the cross-job methods train on complete jobs
(`StragglerMethod.fit_population`); walking a job's checkpoints is the simulation's
(`straggler.simulation`).

Honesty contract, which every loader must keep:
- ``running_features[k]`` holds, for the tasks running at ``checkpoints[k]``, features computed
  only from events strictly before ``checkpoints[k]``;
- ``finish_features`` holds, for a finished task, features computed only from events strictly before
  its finish time (in the stream, the finish event carries exactly this vector);
- no feature may use a task's own latency, a job's final statistics or anything after the time it
  describes. Elapsed time is *not* a feature: it is derived from ``start`` by whoever needs it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace

import numpy as np

from straggler.core.arrays import BoolArray, FloatArray, IntArray


def checkpoint_grid(first_start: float, last_end: float, interval: float) -> FloatArray:
    """A job's checkpoints: the cluster-wide instants ``k * interval`` after its first task started,
    up to and including the first one at or after ``last_end`` (so every finished task has finished
    by the last checkpoint).

    Checkpoints are aligned across jobs, as a cluster's monitoring ticks are: a replay can then advance
    every job to the same instant and wait for the pipeline's verdicts before going on.
    """
    if interval <= 0:
        raise ValueError(f"checkpoint interval must be positive, got {interval}")
    first = np.floor(first_start / interval) + 1
    last = np.ceil(last_end / interval) if np.isfinite(last_end) else first
    return interval * np.arange(first, max(first, last) + 1, dtype=np.float64)


@dataclass
class JobTrace:
    """A job's tasks (their last runs), and the features observable at each checkpoint.

    Times are seconds of trace time. A task is *running* at time t when ``start <= t < end`` (or
    ``end`` is NaN); it has *finished* at t when ``finished`` and ``end <= t``. Tasks whose last run
    ended by KILL/FAIL/LOST, or is cut by the trace window, are not ``scored``: they occupy machines
    and appear in the running set, but have no latency and count in no accuracy figure.
    """

    job_id: str
    task_ids: list[str]
    machine_ids: list[str]
    start: FloatArray
    """Start of each task's last run (its SCHEDULE), seconds."""
    end: FloatArray
    """End of each task's last run (FINISH, or KILL/FAIL/LOST), NaN if still running at window end."""
    finished: BoolArray
    """True where the last run ended with FINISH inside the window: the task has a latency."""
    feature_names: tuple[str, ...]
    checkpoints: FloatArray
    running_index: list[IntArray]
    """For each checkpoint k, the indices of the tasks running at ``checkpoints[k]``."""
    running_features: list[FloatArray]
    """For each checkpoint k, an array (len(running_index[k]), n_features) of their features."""
    finish_features: FloatArray
    """(n_tasks, n_features): each finished task's features as of its finish time; NaN rows otherwise."""
    expected_tasks: int = 0
    """Task count announced when the job started (the denominator of the 4 % start rule)."""
    excluded_tasks: int = 0
    """Tasks of this job the loader dropped before building the trace (e.g. scheduled before t=0)."""
    meta: dict[str, float | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.task_ids)
        if self.expected_tasks <= 0:
            self.expected_tasks = n
        for name in ("start", "end", "finished"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} tasks")
        if self.finish_features.shape != (n, len(self.feature_names)):
            raise ValueError(f"finish_features has shape {self.finish_features.shape}")
        if not (len(self.checkpoints) == len(self.running_index) == len(self.running_features)):
            raise ValueError("checkpoints, running_index and running_features differ in length")

    def without_features(self, dropped: Collection[str]) -> JobTrace:
        """The same job with some features removed (for ablations); unknown names raise KeyError."""
        unknown = set(dropped) - set(self.feature_names)
        if unknown:
            names = ", ".join(self.feature_names)
            raise KeyError(f"job {self.job_id} has no feature(s) {sorted(unknown)}; it has {names}")
        keep = [i for i, name in enumerate(self.feature_names) if name not in dropped]
        return replace(
            self,
            feature_names=tuple(self.feature_names[i] for i in keep),
            running_features=[X[:, keep] for X in self.running_features],
            finish_features=self.finish_features[:, keep],
        )

    @property
    def n_tasks(self) -> int:
        return len(self.task_ids)

    @property
    def scored(self) -> BoolArray:
        """Tasks with a latency: the only ones that enter accuracy figures."""
        return self.finished & np.isfinite(self.end) & np.isfinite(self.start)

    @property
    def latency(self) -> FloatArray:
        """Latency of each task's last run; NaN where it is not scored."""
        out = np.full(self.n_tasks, np.nan)
        ok = self.scored
        out[ok] = self.end[ok] - self.start[ok]
        return out
