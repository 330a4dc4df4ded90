"""The oracle-fed control: a "predictor" told every task's true latency. FUTURE INFORMATION.

It measures the channel from prediction to decision, not a predictor: fed the true straggler label
(probability 1 or 0) at every checkpoint, a mitigation policy should come close to the limit (every
true straggler copied at its first checkpoint); if it does not, the policy loses the information,
whatever the predictor. The evaluator runs it beside every method (`straggler.evaluation`); it is
never a default, the worker refuses it, and `tests/test_no_future_information.py` names it as the
one method its check must catch.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import ClassVar, Self

import numpy as np

from straggler.core.method import CheckpointData, Scores, StragglerMethod


class Oracle(StragglerMethod):
    """Labels each running task with the truth, revealed by the evaluator before the job starts: a
    straggler (probability 1) when its latency reaches the job's true p90, else not (probability 0)."""

    name: ClassVar[str] = "oracle"
    predicts_latency: ClassVar[bool] = False
    uses_future_information: ClassVar[bool] = True
    predicts_before_finishes: ClassVar[bool] = True  # it needs no finished task to know the truth

    def __init__(self) -> None:
        """No parameters; the truth comes through `reveal`."""

    def reveal(
        self, latency: Mapping[str, float], threshold: float, unfinished: Collection[str] = ()
    ) -> None:
        """Every task's true latency by task id (NaN: it has none), the job's true straggler threshold
        (its p90), and the tasks whose run ends without finishing (killed, failed or lost): never a
        straggler, so labelled 0. A task still running at the trace's end stays unknown (NaN)."""
        self.latency_ = dict(latency)
        self.threshold_ = float(threshold)
        self.unfinished_ = frozenset(unfinished)

    def fit(self, data: CheckpointData) -> Self:
        if not hasattr(self, "latency_"):
            raise RuntimeError("the oracle needs the truth: call reveal() first")
        return self

    def predict(self, data: CheckpointData) -> Scores:
        if data.running_ids is None:
            raise ValueError("the oracle needs the running tasks' ids")
        # a task whose run ends unfinished is never a straggler: below every threshold
        latency = np.array(
            [-np.inf if t in self.unfinished_ else self.latency_.get(t, np.nan) for t in data.running_ids],
            dtype=np.float64,
        )
        known = ~np.isnan(latency)
        straggler = known & (latency >= self.threshold_)
        probability = np.where(known, straggler.astype(np.float64), np.nan)
        return Scores.from_labels(straggler, probability=probability)
