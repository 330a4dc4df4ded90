"""Algorithm 1's loop for one job: when to train, what to predict, what to flag.

`OnlineJob` holds a job's `JobState` and one `StragglerMethod`. At each checkpoint it waits until
``start_fraction`` of the tasks have finished, calibrates the method once, refits when the finished set
has grown by ``refit_growth``, floors every predicted latency at the task's elapsed time and flags the
tasks at or over the threshold (oracle p90, or estimated online by `straggler.core.threshold`); a
flagged task is not evaluated again. Details: docs/architecture.md, "Methods and the job driver".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from straggler.core.arrays import FloatArray
from straggler.core.jobstate import JobState
from straggler.core.method import CheckpointData, StragglerMethod
from straggler.core.threshold import online_threshold


@dataclass(frozen=True)
class Decision:
    """The verdict on one running task at one checkpoint (one prediction event in the stream)."""

    job_id: str
    task_id: str
    checkpoint_time: float
    elapsed: float
    raw_latency: float
    adjusted_latency: float
    propensity: float
    weight: float
    threshold: float
    is_straggler: bool
    model_version: int
    attempt: int = 0
    """The task attempt the verdict is about (the running one)."""
    straggle_probability: float = math.nan
    """The method's P(latency >= threshold) for the task (NaN if it has none); 1 once elapsed reaches it."""


START_FRACTION = 0.04
"""A job is predicted once this share of its expected tasks has finished, and at least MIN_FINISHED."""
MIN_FINISHED = 2


def finished_needed(
    expected_tasks: int, start_fraction: float = START_FRACTION, min_finished: int = MIN_FINISHED
) -> int:
    """How many of a job's tasks must have finished before it is predicted (`OnlineJob.ready`)."""
    return max(min_finished, math.ceil(start_fraction * expected_tasks))


class OnlineJob:
    """One job's online straggler prediction, fed one task event at a time."""

    def __init__(
        self,
        job_id: str,
        method: StragglerMethod,
        n_features: int,
        expected_tasks: int,
        *,
        threshold: float | None = None,
        quantile: float = 0.9,
        start_fraction: float = START_FRACTION,
        min_finished: int = MIN_FINISHED,
        refit_growth: float = 0.25,
    ) -> None:
        self.state = JobState(job_id, n_features, expected_tasks)
        self.method = method
        self.fixed_threshold = threshold
        self.quantile = quantile
        self.start_fraction = start_fraction
        self.min_finished = min_finished
        self.refit_growth = refit_growth
        self.model_version = 0
        self.fitted_on = 0
        self.calibrated = False

    @property
    def job_id(self) -> str:
        return self.state.job_id

    def ready(self) -> bool:
        """Has the job finished enough tasks to start predicting (always, for a method that predicts
        before any finish)?"""
        if self.method.predicts_before_finishes:
            return True
        needed = finished_needed(self.state.expected_tasks, self.start_fraction, self.min_finished)
        return self.state.n_finished >= needed

    def threshold_at(
        self, finished_latency: FloatArray, at: float, running_elapsed: FloatArray | None = None
    ) -> float:
        """The threshold at ``at``; ``running_elapsed``: every running task's elapsed time, flagged
        or not, in `JobState.running` order (computed here when not given)."""
        if self.fixed_threshold is not None:
            return self.fixed_threshold
        if running_elapsed is None:
            running_elapsed = self.state.running_view(at).elapsed
        return online_threshold(finished_latency, running_elapsed, self.quantile).value

    def checkpoint(self, at: float) -> list[Decision]:
        """Evaluate the job at checkpoint time ``at``; returns one decision per evaluated task."""
        prepared = self._checkpoint_data(at)
        if prepared is None:
            return []
        data, attempts = prepared
        if not self.calibrated:
            self.method.calibrate(data)
            self.calibrated = True
        if self.model_version == 0 or data.n_finished >= self.fitted_on * (1.0 + self.refit_growth):
            self.method.fit(data)
            self.model_version += 1
            self.fitted_on = data.n_finished
        return self._decide(data, attempts)

    def _checkpoint_data(self, at: float) -> tuple[CheckpointData, list[int]] | None:
        """The checkpoint's data and the attempt of each task it evaluates; None if there is nothing
        to evaluate (the job is not ready, no task is running, no threshold yet)."""
        if not self.ready():
            return None
        finished = self.state.finished_view()
        running = self.state.running_view(at)
        keep = ~running.flagged
        is_flagged = running.flagged.tolist()
        ids = [t for t, flagged in zip(running.ids, is_flagged, strict=True) if not flagged]
        elapsed = running.elapsed[keep]
        threshold = self.threshold_at(finished.latency, at, running.elapsed)
        if not ids or not math.isfinite(threshold):
            return None
        flagged_running = sorted(  # by task id (unique)
            (t, start)
            for t, start, flagged in zip(running.ids, running.start.tolist(), is_flagged, strict=True)
            if flagged
        )
        data = CheckpointData(
            finished.X,
            finished.latency,
            running.X[keep],
            elapsed,
            threshold,
            self.state.expected_tasks,
            at=at,
            finish_time=finished.finished_at,
            start_running=running.start[keep],
            running_ids=tuple(ids),
            finished_ids=finished.ids,
            flagged_ids=tuple(t for t, _ in flagged_running),
            flagged_start=np.array([start for _, start in flagged_running], dtype=np.float64),
        )
        attempts = [a for a, flagged in zip(running.attempt, is_flagged, strict=True) if not flagged]
        return data, attempts

    def _decide(self, data: CheckpointData, attempts: list[int]) -> list[Decision]:
        """Predict with the (refitted) method, floor at the elapsed time, flag."""
        assert data.at is not None
        at, elapsed, threshold = data.at, data.elapsed_running, data.threshold
        scores = self.method.predict(data)
        if self.method.predicts_latency:
            adjusted = np.maximum(scores.adjusted, elapsed)
            straggles = (adjusted >= threshold) | scores.is_straggler
        else:
            adjusted = scores.adjusted
            straggles = scores.is_straggler | (elapsed >= threshold)
        probability = np.where(elapsed >= threshold, 1.0, scores.probability)
        threshold = float(threshold)
        job_id, version = self.job_id, self.model_version
        decisions = []
        assert data.running_ids is not None
        for task_id, flagged, elapsed_i, raw, adjusted_i, propensity, weight, p, attempt in zip(
            data.running_ids,
            np.asarray(straggles, dtype=bool).tolist(),
            elapsed.tolist(),
            scores.latency.tolist(),
            adjusted.tolist(),
            scores.propensity.tolist(),
            scores.weight.tolist(),
            probability.tolist(),
            attempts,
            strict=True,
        ):
            if flagged:
                self.state.flag(task_id, at)
            decisions.append(
                Decision(
                    job_id=job_id,
                    task_id=task_id,
                    checkpoint_time=at,
                    elapsed=elapsed_i,
                    raw_latency=raw,
                    adjusted_latency=adjusted_i,
                    propensity=propensity,
                    weight=weight,
                    threshold=threshold,
                    is_straggler=flagged,
                    model_version=version,
                    attempt=attempt,
                    straggle_probability=p,
                )
            )
        return decisions
