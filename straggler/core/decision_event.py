"""A `Decision` as a ``prediction`` event and back: the one mapping between the core and the stream.

The event carries the verdict's optional numbers as None where the core has NaN, and an older event
may lack the attempt (read as 0). It sits here, not in ``schemas``, because ``schemas`` is the layer
below the core and may not import `Decision`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter

from schemas import (
    VERDICT_COLUMNS,
    CheckpointEvaluated,
    Prediction,
    nan_to_none,
    none_to_nan,
    verdict_batches,
)
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


def prediction_parts(decisions: Sequence[Decision], method: str, marker: CheckpointEvaluated) -> list[bytes]:
    """The encoded ``prediction_batch`` parts of one job checkpoint's ``decisions``: the bytes
    `schemas.prediction_batches` writes for their `prediction_event`s, built column by column.

    The decisions are one checkpoint's (`OnlineJob.checkpoint`), so they share its threshold. As there,
    a checkpoint without decisions names method ``none`` and threshold 1.
    """
    if not decisions:
        method = "none"
    columns = {name: list(map(attrgetter(name), decisions)) for name in VERDICT_COLUMNS}
    thresholds = {d.threshold for d in decisions} or {1.0}
    if len(thresholds) > 1:
        raise ValueError(f"prediction_parts: one threshold per checkpoint, got {thresholds}")
    (threshold,) = thresholds
    return verdict_batches(columns, marker, method, threshold)


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


def describe_flag(d: Decision, method: str) -> str:
    """What a flag says, for the agent's log line: the task, the probability and the rule behind it
    (the predicted latency against the job's straggler threshold)."""
    p = "n/a" if math.isnan(d.straggle_probability) else f"{d.straggle_probability:.2f}"
    predicted = "n/a" if math.isnan(d.adjusted_latency) else f"{d.adjusted_latency:.3g} s"
    return (
        f"task {d.task_id} attempt {d.attempt} flagged by {method}: p = {p}, predicted {predicted} "
        f"(threshold {d.threshold:.3g} s, elapsed {d.elapsed:.3g} s)"
    )
