"""The oracle-fed control: a "predictor" told every task's true latency. FUTURE INFORMATION.

It measures the channel from prediction to decision, not a predictor: fed the true straggler label
(probability 1 or 0) at every checkpoint, a mitigation policy should come close to the limit (every
true straggler copied at its first checkpoint); if it does not, the policy loses the information,
whatever the predictor. The evaluator runs it beside every method (`straggler.evaluation`); it is
never a default, the worker refuses it, and `tests/test_no_future_information.py` names it as the
one method its check must catch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Self

import numpy as np

from straggler.core.method import CheckpointData, Scores, StragglerMethod


class Oracle(StragglerMethod):
    """Predicts each running task's true latency, revealed by the evaluator before the job starts."""

    name: ClassVar[str] = "oracle"
    predicts_latency: ClassVar[bool] = True
    uses_future_information: ClassVar[bool] = True

    def __init__(self) -> None:
        """No parameters; the latencies come through `reveal`."""

    def reveal(self, latency: Mapping[str, float]) -> None:
        """Every task's true latency, by task id (NaN: the task has none, e.g. it was killed)."""
        self.latency_ = dict(latency)

    def fit(self, data: CheckpointData) -> Self:
        if not hasattr(self, "latency_"):
            raise RuntimeError("the oracle needs the true latencies: call reveal() first")
        return self

    def predict(self, data: CheckpointData) -> Scores:
        if data.running_ids is None:
            raise ValueError("the oracle needs the running tasks' ids")
        latency = np.array([self.latency_.get(t, np.nan) for t in data.running_ids], dtype=np.float64)
        known = np.isfinite(latency)
        truth = np.where(known, latency, data.elapsed_running)  # no latency (killed, cut): as it ran
        probability = np.where(known, (truth >= data.threshold).astype(np.float64), np.nan)
        return Scores.from_latency(truth, truth.copy(), data.threshold, probability=probability)
