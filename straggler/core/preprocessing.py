"""Feature preparation that uses only what a checkpoint has observed.

Online honesty starts here: imputation and scaling statistics come from the finished and running
tasks visible at the checkpoint, never from a job's final values.
"""

from __future__ import annotations

import warnings

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


def column_means(X: FloatArray) -> FloatArray:
    """NaN-ignoring column means; 0 for a column with no value at all."""
    if X.size == 0:
        return np.zeros(X.shape[1] if X.ndim == 2 else 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns are handled below
        means = np.nanmean(X, axis=0)
    return np.where(np.isfinite(means), means, 0.0)


def impute_like(reference: FloatArray, X: FloatArray) -> FloatArray:
    """Replace NaN in ``X`` with the column means of ``reference`` (the observed data)."""
    if not np.isnan(X).any():
        return X
    means = column_means(reference)
    return np.where(np.isnan(X), means[np.newaxis, :], X)


class ObservedScaler:
    """Standardise with the mean and spread of the tasks observed at one checkpoint.

    Fitted on finished and running features together (what the checkpoint shows); constant
    columns get unit spread so they stay constant instead of becoming NaN.
    """

    def fit(self, *blocks: FloatArray) -> ObservedScaler:
        stacked = np.vstack([b for b in blocks if len(b)]) if any(len(b) for b in blocks) else blocks[0]
        self.mean_ = column_means(stacked)
        filled = np.where(np.isnan(stacked), self.mean_, stacked) if stacked.size else stacked
        std = filled.std(axis=0) if filled.size else np.ones_like(self.mean_)
        self.scale_ = np.where(std > 1e-12, std, 1.0)
        return self

    def transform(self, X: FloatArray) -> FloatArray:
        filled = np.where(np.isnan(X), self.mean_, X)
        return (filled - self.mean_) / self.scale_
