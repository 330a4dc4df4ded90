"""How often the worker evaluates a live job: from the job's own task lengths (pure, no Kafka).

A live job sends no checkpoint boundaries, so the worker's timer gives it one. A copy can start only
at an evaluation: a job of 3 s tasks evaluated every 30 s has its hung task copied up to 30 s after
the rule that copies it is met, while a job of hour-long tasks gains nothing from an evaluation every
second. So a live job is evaluated every `TASK_SHARE` of its median finished latency, at least every
`FLOOR_S` and at most every ``longest`` (``straggler worker --live-interval``); before any of its
tasks finished (it cannot be predicted yet), every ``longest``.
"""

from __future__ import annotations

import math

import numpy as np

from straggler.core.jobstate import JobState

FLOOR_S = 1.0
"""The shortest default spacing: an evaluation refits the job's model now and then, so not faster."""
TASK_SHARE = 0.1
"""A live job is evaluated about ten times per typical task."""


def evaluation_interval(median_finished: float | None, longest: float) -> float:
    """Seconds between evaluations of a job whose median finished latency is ``median_finished``
    (None: no task finished yet): `TASK_SHARE` of it, within [`FLOOR_S`, ``longest``] (``longest``
    alone when it is below the floor: the operator asked for that)."""
    if median_finished is None or not math.isfinite(median_finished):
        return longest
    return min(longest, max(FLOOR_S, TASK_SHARE * median_finished))


def median_finished_latency(state: JobState) -> float | None:
    """The median latency of the job's finished tasks (None: none finished)."""
    latency = state.finished_view().latency
    return float(np.median(latency)) if len(latency) else None


TIMER_SLACK_S = 0.1 * FLOOR_S
"""How early a timer may fire and still count as on time: the worker's timer comes a few
milliseconds early now and then, and a job due each tick would otherwise wait for the next one (a
job of 1 s evaluations was evaluated every 2 s)."""


def due(last_evaluation: float | None, now: float, interval: float) -> bool:
    """Is a job last evaluated at ``last_evaluation`` (its start, before its first evaluation; None:
    not known) due at ``now`` (within `TIMER_SLACK_S`)?"""
    return last_evaluation is None or now - last_evaluation >= interval - TIMER_SLACK_S
