"""Accuracy of straggler flags for one job: the paper's TPR/FPR/FNR/F1, F1 over time, and lead time.

Only scored tasks (with a latency) count. A task flagged at some checkpoint is a predicted
straggler from then on; a task never flagged is a predicted non-straggler.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from straggler.core.arrays import BoolArray, FloatArray


@dataclass(frozen=True)
class Confusion:
    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def tpr(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def fpr(self) -> float:
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else 0.0

    @property
    def fnr(self) -> float:
        return self.fn / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        denominator = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / denominator if denominator else 0.0


def confusion(truth: BoolArray, predicted: BoolArray) -> Confusion:
    truth = np.asarray(truth, dtype=bool)
    predicted = np.asarray(predicted, dtype=bool)
    return Confusion(
        tp=int(np.sum(truth & predicted)),
        fp=int(np.sum(~truth & predicted)),
        fn=int(np.sum(truth & ~predicted)),
        tn=int(np.sum(~truth & ~predicted)),
    )


def f1_over_time(
    truth: BoolArray, flag_time: FloatArray, begin: float, finish: float, points: int = 10
) -> FloatArray:
    """F1 of the flags raised by each of ``points`` normalised times in (begin, finish] (paper Fig. 2)."""
    times = begin + (finish - begin) * np.arange(1, points + 1) / points
    with np.errstate(invalid="ignore"):
        return np.array([confusion(truth, flag_time <= t).f1 for t in times])


def lead_time(truth: BoolArray, flag_time: FloatArray, start: FloatArray, end: FloatArray) -> float:
    """Mean over true positives of (finish - flag) / latency: the share of a straggler's run left to save."""
    caught = truth & np.isfinite(flag_time)
    if not caught.any():
        return float("nan")
    latency = end[caught] - start[caught]
    return float(np.mean((end[caught] - flag_time[caught]) / np.maximum(latency, 1e-9)))
