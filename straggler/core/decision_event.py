"""A `Decision` as a ``prediction`` event and back: the one mapping between the core and the stream.

The event carries the verdict's optional numbers as None where the core has NaN, and an older event
may lack the attempt (read as 0). It sits here, not in ``schemas``, because ``schemas`` is the layer
below the core and may not import `Decision`.
"""

from __future__ import annotations

from schemas import Prediction, nan_to_none, none_to_nan
from straggler.core.online import Decision


def prediction_event(d: Decision, method: str, produced_at: float) -> Prediction:
    """The event the agent publishes for ``d``."""
    return Prediction(
        job_id=d.job_id,
        task_id=d.task_id,
        checkpoint_time=d.checkpoint_time,
        raw_latency=nan_to_none(d.raw_latency),
        adjusted_latency=nan_to_none(d.adjusted_latency),
        propensity=nan_to_none(d.propensity),
        weight=nan_to_none(d.weight),
        threshold=d.threshold,
        is_straggler=d.is_straggler,
        method=method,
        model_version=d.model_version,
        elapsed=d.elapsed,
        produced_at=produced_at,
        attempt=d.attempt,
        straggle_probability=nan_to_none(d.straggle_probability),
    )


def decision_of(event: Prediction) -> Decision:
    """The policy's view of a prediction event; fields the method does not produce become NaN."""
    return Decision(
        job_id=event.job_id,
        task_id=event.task_id,
        checkpoint_time=event.checkpoint_time,
        elapsed=event.elapsed,
        raw_latency=none_to_nan(event.raw_latency),
        adjusted_latency=none_to_nan(event.adjusted_latency),
        propensity=none_to_nan(event.propensity),
        weight=none_to_nan(event.weight),
        threshold=event.threshold,
        is_straggler=event.is_straggler,
        model_version=event.model_version,
        attempt=event.attempt or 0,
        straggle_probability=none_to_nan(event.straggle_probability),
    )
