"""The job's survival prior of a straggle, and its calibration by how far the job has run.

The survival prior is P(latency >= threshold | latency >= elapsed) under the job's own Kaplan-Meier
curve (finished tasks are events, running ones censored). Read as a probability it is off in two
ways that no single job can see, because only a complete job shows which of its tasks straggled:
- early, the curve knows only the fastest tasks, the threshold is extrapolated past its last event
  and every running task gets about the same high probability (on the blind generator's trace 2027
  at 60 s, a mean of 0.54 while under a quarter of the tasks had finished, where 0.125 straggled:
  `scripts/fit_prior_calibration.py --judge`);
- late, the tasks still running straggle more often than a low prior says (they include those that
  started late, after an eviction or on a busy machine).

`PriorCalibration` is a fixed logistic map of the prior and the job's finished share that corrects
both. `fit_prior_calibration` learns it from complete jobs (labelled by their own p90); the shipped
coefficients come from the repository's synthetic generator, never from an evaluated trace
(`scripts/fit_prior_calibration.py` prints them), so at run time it uses no label.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from scipy.special import expit, logit
from sklearn.base import BaseEstimator
from sklearn.linear_model import LogisticRegression

from straggler.core.arrays import FloatArray
from straggler.core.online import finished_needed
from straggler.core.parameters import Constraint, Interval, check_own_parameters
from straggler.core.survival import LatencySurvival
from straggler.core.threshold import online_threshold, oracle_threshold

if TYPE_CHECKING:
    from straggler.core.jobtrace import JobTrace


def survival_prior(latency_finished: FloatArray, elapsed_running: FloatArray, threshold: float) -> FloatArray:
    """P(latency >= ``threshold`` | latency >= elapsed) of each running task under the job's curve."""
    survival = LatencySurvival(latency_finished, elapsed_running)
    reach = survival.sf(np.array([threshold]))[0]
    return np.clip(reach / np.maximum(survival.sf(elapsed_running), 1e-12), 1e-4, 1.0 - 1e-4)


class PriorCalibration(BaseEstimator):
    """logit p' = ``intercept`` + ``slope`` logit p + ``progress`` finished share, for a survival prior p.

    The defaults are `fit_prior_calibration` on the synthetic generator's seeds 10 and 11 at 60 s and
    300 s checkpoints (`scripts/fit_prior_calibration.py`); ``PriorCalibration(0, 1, 0)`` is the
    identity. Parameters are checked by `check` (called from the owning gate's ``fit``).
    """

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "intercept": [Real],
        "slope": [Interval(Real, 0, None, "neither")],
        "progress": [Real],
    }

    def __init__(self, intercept: float = -1.737, slope: float = 0.713, progress: float = 2.013) -> None:
        self.intercept = intercept
        self.slope = slope
        self.progress = progress

    def check(self) -> None:
        """Raise ValueError naming a parameter out of range."""
        check_own_parameters(self)

    def transform(self, prior: FloatArray, finished_share: float | FloatArray) -> FloatArray:
        """The calibrated probabilities of running tasks with survival ``prior``, when their job has
        finished ``finished_share`` of its expected tasks (one share, or one per task)."""
        z = self.intercept + self.slope * logit(prior) + self.progress * finished_share
        return np.clip(expit(z), 1e-4, 1.0 - 1e-4)


def prior_examples(job: JobTrace, quantile: float = 0.9) -> tuple[FloatArray, FloatArray]:
    """Rows (logit survival prior, finished share) and labels (the task straggled: its latency reached
    the job's true ``quantile``) of ``job``'s running, scored tasks below the online threshold, at
    every checkpoint from the one the job is first predicted at (`OnlineJob`'s, but for its flagged
    tasks, which a method's own flags take out of its curve)."""
    scored = job.scored
    latency = job.latency
    truth = latency >= oracle_threshold(latency[scored], quantile)
    needed = finished_needed(job.expected_tasks)
    rows: list[FloatArray] = []
    labels: list[FloatArray] = []
    for k, at in enumerate(job.checkpoints.tolist()):
        running = job.running_index[k]
        done = job.finished & np.isfinite(job.end) & (job.end <= at)
        if done.sum() < needed or len(running) == 0:
            continue
        finished_latency = job.end[done] - job.start[done]
        elapsed = at - job.start[running]
        threshold = online_threshold(finished_latency, elapsed, quantile).value
        if not math.isfinite(threshold):
            continue
        prior = survival_prior(finished_latency, elapsed, threshold)
        keep = scored[running] & (elapsed < threshold)
        share = done.sum() / job.expected_tasks
        rows.append(np.column_stack([logit(prior[keep]), np.full(int(keep.sum()), share)]))
        labels.append(truth[running[keep]].astype(np.float64))
    if not rows:
        return np.zeros((0, 2)), np.zeros(0)
    return np.concatenate(rows), np.concatenate(labels)


def pooled_examples(jobs: Sequence[JobTrace], quantile: float = 0.9) -> tuple[FloatArray, FloatArray]:
    """`prior_examples` of every job of ``jobs``, stacked."""
    examples = [prior_examples(job, quantile) for job in jobs]
    X = np.concatenate([np.zeros((0, 2)), *(x for x, _ in examples)])
    y = np.concatenate([np.zeros(0), *(y for _, y in examples)])
    return X, y


def fit_prior_calibration(jobs: Sequence[JobTrace], quantile: float = 0.9) -> PriorCalibration:
    """The `PriorCalibration` that best predicts (log loss) which running tasks of complete ``jobs``
    straggled, coefficients rounded to three decimals; raises ValueError with no usable example."""
    return calibration_from_examples(*pooled_examples(jobs, quantile))


def calibration_from_examples(X: FloatArray, y: FloatArray) -> PriorCalibration:
    """`fit_prior_calibration` on examples already pooled (`pooled_examples`)."""
    if len(np.unique(y)) < 2:
        raise ValueError("a prior calibration needs running tasks that straggled and some that did not")
    model = LogisticRegression(C=1e4, max_iter=2000).fit(X, y.astype(int))
    slope, progress = (round(float(c), 3) for c in model.coef_[0])
    return PriorCalibration(round(float(model.intercept_[0]), 3), slope, progress)
