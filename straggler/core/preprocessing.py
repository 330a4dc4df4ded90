"""Feature preparation that uses only what a checkpoint has observed.

Online honesty starts here: imputation and scaling statistics come from the tasks a method is given
at a checkpoint (finished, and running where a method says so), never from a job's final values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from straggler.core.arrays import BoolArray, FloatArray


def nan_column_means(X_ref: FloatArray) -> FloatArray:
    """Column means over the finite entries of ``X_ref``; 0 where a column has none."""
    X_ref = np.asarray(X_ref, dtype=np.float64)
    finite = np.isfinite(X_ref)
    counts = finite.sum(axis=0)
    sums = np.where(finite, X_ref, 0.0).sum(axis=0)
    return np.divide(sums, counts, out=np.zeros(X_ref.shape[1]), where=counts > 0)


def fill_missing(X: FloatArray, values: FloatArray) -> FloatArray:
    """A copy of ``X`` with non-finite entries replaced by the column's value in ``values``."""
    X = np.array(X, dtype=np.float64, copy=True)
    missing = ~np.isfinite(X)
    if missing.any():
        X[missing] = np.broadcast_to(values, X.shape)[missing]
    return X


def impute_like(X_ref: FloatArray, X: FloatArray) -> FloatArray:
    """``X`` with missing entries filled by ``X_ref``'s column means (0 where ``X_ref`` has none)."""
    return fill_missing(X, nan_column_means(X_ref))


@dataclass(frozen=True)
class Standardiser:
    """Imputation values and z-scaling learned from the data a method was given, frozen for predict.

    Kept as learned state so a model refit at checkpoint k scores checkpoint k+1 with checkpoint k's
    statistics, never with statistics of data it was not trained on.
    """

    fill: FloatArray
    center: FloatArray
    scale: FloatArray
    varying: BoolArray
    """Columns with spread in the scaling data (a constant column carries no information)."""

    @classmethod
    def learn(cls, X_impute_ref: FloatArray, X_scale_ref: FloatArray | None = None) -> Standardiser:
        """Fill values from ``X_impute_ref`` (the finished tasks); centre and scale from
        ``X_scale_ref`` (default: the same rows) after filling."""
        fill = nan_column_means(X_impute_ref)
        Z = fill_missing(X_impute_ref if X_scale_ref is None else X_scale_ref, fill)
        if len(Z) == 0:
            d = len(fill)
            return cls(fill=fill, center=np.zeros(d), scale=np.ones(d), varying=np.zeros(d, dtype=bool))
        center = Z.mean(axis=0)
        spread = Z.std(axis=0)
        varying = np.asarray(spread > 1e-12 * np.maximum(1.0, np.abs(center)), dtype=bool)
        return cls(fill=fill, center=center, scale=np.where(varying, spread, 1.0), varying=varying)

    def transform(self, X: FloatArray) -> FloatArray:
        return (fill_missing(X, self.fill) - self.center) / self.scale
