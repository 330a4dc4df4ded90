"""A features ceiling for §11: how far could any predictor on a trace's features take the default policy?

Scratch harness, not shipped. ``ceiling`` is a supervised classifier of P(straggler | what a
checkpoint shows), trained on the true labels of *other* complete jobs of the same trace (cross-fitted
by job, as the evaluator does for START and ADMM: `straggler.evaluation.population_fold`). It uses
no future information of the job it predicts, but it is given what no online method of this project
has: labelled stragglers of the same generator, many of them. Its figures bound what a predictor of
this feature set can hand the policy, where the oracle-fed control bounds what the policy can do
with a perfect one. From the repository root:

    DOCS=docs/results/decision-layer/variants
    OMP_NUM_THREADS=1 PYTHONPATH=$DOCS .venv/bin/python $DOCS/ceiling_variants.py evaluate \
        --format google-2011-usage --trace /tmp/causal60 --threshold online --checkpoint-seconds 300 \
        --methods ceiling,nurd --policies speculate --workers 1 --out DIR

``CEILING_FEATURES=none`` leaves the task's features out (elapsed time and the job's progress only:
what a survival model sees); ``CEILING_FEATURES=prior`` gives it only the job's survival prior
(`Nurd.prior`, uncalibrated) and finished share, so it learns a calibration of that prior;
with it, ``CEILING_SHARES=lo,hi`` uses the learned calibration only while the job's finished share
is in [lo, hi), the raw prior elsewhere. ``CEILING_SHIFT=S`` adds S to every probability's log-odds
(a ceiling made bolder than calibrated: does spending more machine time buy the bar?).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import ClassVar, Self

import numpy as np
import xgboost
from scipy.special import expit, logit

from straggler.core import registry
from straggler.core.jobtrace import JobTrace
from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.prior_calibration import survival_prior
from straggler.core.threshold import online_threshold, oracle_threshold

ROWS_PER_FOLD = 300_000
"""Training rows kept (a uniform sample of every job's checkpoints and running tasks)."""


def checkpoint_features(
    X_running: np.ndarray,
    elapsed: np.ndarray,
    X_finished: np.ndarray,
    latency_finished: np.ndarray,
    expected_tasks: int,
) -> np.ndarray:
    """Per running task: its features, their z-scores among the finished tasks', its log elapsed
    time, that time over the finished median and p90, and the job's finished share."""
    n = len(elapsed)
    if len(latency_finished) >= 2:
        mean, std = X_finished.mean(axis=0), X_finished.std(axis=0)
        z = (X_running - mean) / np.where(std > 1e-9, std, 1.0)
        median, p90 = np.median(latency_finished), np.quantile(latency_finished, 0.9)
        rel = np.column_stack(
            [np.log(np.maximum(elapsed, 1e-3) / median), np.log(np.maximum(elapsed, 1e-3) / p90)]
        )
    else:
        z = np.full_like(X_running, np.nan)
        rel = np.full((n, 2), np.nan)
    share = np.full((n, 1), len(latency_finished) / max(expected_tasks, 1))
    timing = np.column_stack([np.log(np.maximum(elapsed, 1e-3))[:, None], rel, share])
    if os.environ.get("CEILING_FEATURES") == "none":  # elapsed time and the job's progress only
        return timing
    if os.environ.get("CEILING_FEATURES") == "prior":  # the survival prior, recalibrated
        threshold = online_threshold(latency_finished, elapsed).value if len(latency_finished) else np.inf
        if not np.isfinite(threshold):
            return np.column_stack([np.full(n, np.nan), share])
        prior = survival_prior(latency_finished, elapsed, threshold)
        return np.column_stack([logit(prior), share])
    return np.column_stack([X_running, z, timing])


class FeatureCeiling(StragglerMethod):
    """P(latency >= the job's true p90 | checkpoint features), learned from other jobs' labels."""

    name: ClassVar[str] = "ceiling"
    predicts_latency: ClassVar[bool] = False
    learns_across_jobs: ClassVar[bool] = True

    def __init__(self, random_state: int = 0) -> None:
        self.random_state = random_state

    def fit_population(self, jobs: Sequence[JobTrace]) -> Self:
        rows, labels = [], []
        for job in jobs:
            scored = job.scored
            if scored.sum() < 10:
                continue
            truth = job.latency >= oracle_threshold(job.latency[scored], 0.9)
            for k, t in enumerate(job.checkpoints.tolist()):
                index = job.running_index[k]
                keep = scored[index]
                if not keep.any():
                    continue
                done = job.finished & np.isfinite(job.end) & (job.end <= t)
                X = checkpoint_features(
                    job.running_features[k][keep],
                    t - job.start[index[keep]],
                    job.finish_features[done],
                    job.end[done] - job.start[done],
                    job.expected_tasks,
                )
                rows.append(X)
                labels.append(truth[index[keep]])
        X, y = np.concatenate(rows), np.concatenate(labels)
        rng = np.random.default_rng(self.random_state)
        if len(y) > ROWS_PER_FOLD:
            pick = rng.choice(len(y), ROWS_PER_FOLD, replace=False)
            X, y = X[pick], y[pick]
        self.classifier_ = xgboost.XGBClassifier(
            n_estimators=300,
            max_depth=5,
            learning_rate=0.05,
            subsample=0.8,
            colsample_bytree=0.8,
            tree_method="hist",
            n_jobs=1,
            random_state=self.random_state,
        ).fit(X, y.astype(int))
        print(f"ceiling: trained on {len(y)} rows, {y.mean():.3f} stragglers", file=sys.stderr)
        return self

    def fit(self, data: CheckpointData) -> Self:
        return self

    def predict(self, data: CheckpointData) -> Scores:
        if data.n_running == 0:
            return Scores.from_labels(np.zeros(0, dtype=bool), probability=np.zeros(0))
        X = checkpoint_features(
            data.X_running, data.elapsed_running, data.X_finished, data.latency_finished, data.expected_tasks
        )
        probability = self.classifier_.predict_proba(X)[:, 1]
        window = os.environ.get("CEILING_SHARES")  # "lo,hi": the raw survival prior outside them
        if window and os.environ.get("CEILING_FEATURES") == "prior":
            lo, hi = map(float, window.split(","))
            share = data.n_finished / max(data.expected_tasks, 1)
            if not lo <= share < hi:
                probability = np.where(np.isfinite(X[:, 0]), expit(X[:, 0]), probability)
        shift = float(os.environ.get("CEILING_SHIFT", "0"))  # log-odds added: a deliberately bolder ceiling
        if shift:
            probability = expit(logit(np.clip(probability, 1e-6, 1 - 1e-6)) + shift)
        return Scores.from_labels(probability >= 0.5, probability=probability)


_factories = registry._factories  # a scratch harness adds its method to the registry


def _with_ceiling():
    out = _factories()
    out["ceiling"] = lambda seed: FeatureCeiling(random_state=seed)
    return out


registry._factories = _with_ceiling

if __name__ == "__main__":
    from straggler.cli import main

    sys.exit(main(sys.argv[1:]))
