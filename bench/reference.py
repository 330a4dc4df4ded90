"""The reference protocol NURD's cost is compared with: the paper's code, refitted at every checkpoint.

Why here and not in ``straggler/core``: it is a yardstick for `bench/model_cost.py`, not a method the
project ships. It follows the authors' released code: a scikit-learn GradientBoostingRegressor
(default hyper-parameters) on the finished tasks' raw features and latencies, a LogisticRegression
propensity (finished vs running), and the paper's weight w = max(eps, min(z + delta, 1)) with the
centroid calibration delta computed once per job. The driver is `OnlineJob` with
``refit_growth=0.0``, so both models are trained from scratch at every checkpoint.
"""

from __future__ import annotations

from typing import Self

import numpy as np
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.linear_model import LogisticRegression

from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.nurd import centroid_calibration
from straggler.core.preprocessing import impute_like


class PaperReference(StragglerMethod):
    """GBR + logistic propensity, the paper's weighting; state learned by ``fit`` ends with ``_``."""

    name = "reference"

    def __init__(self, alpha: float = 0.5, eps: float = 0.05, random_state: int = 0) -> None:
        self.alpha = alpha
        self.eps = eps
        self.random_state = random_state

    def calibrate(self, data: CheckpointData) -> None:
        X_fin = impute_like(data.X_finished, data.X_finished)
        X_run = impute_like(data.X_finished, data.X_running)
        self.delta_ = centroid_calibration(X_fin, X_run, self.alpha)

    def fit(self, data: CheckpointData) -> Self:
        if not hasattr(self, "delta_"):
            self.calibrate(data)
        X_fin = impute_like(data.X_finished, data.X_finished)
        self.regressor_ = GradientBoostingRegressor(random_state=self.random_state).fit(
            X_fin, data.latency_finished
        )
        self.propensity_: LogisticRegression | None = None
        if data.n_running > 0:
            X_run = impute_like(data.X_finished, data.X_running)
            labels = np.r_[np.ones(len(X_fin)), np.zeros(len(X_run))]
            self.propensity_ = LogisticRegression(max_iter=300).fit(np.vstack([X_fin, X_run]), labels)
        self.X_reference_ = data.X_finished
        return self

    def predict(self, data: CheckpointData) -> Scores:
        if data.n_running == 0:
            empty = np.zeros(0)
            return Scores.from_latency(empty, empty, data.threshold, empty, empty)
        X = impute_like(self.X_reference_, data.X_running)
        latency = np.maximum(self.regressor_.predict(X).astype(np.float64), 0.0)
        z = self.propensity_.predict_proba(X)[:, 1] if self.propensity_ is not None else np.ones(len(X))
        weight = np.clip(z + self.delta_, self.eps, 1.0)
        return Scores.from_latency(latency, latency / weight, data.threshold, z, weight)
