"""When a live job that stopped reporting is closed as abandoned: pure, no Kafka.

A live job (one that sends no checkpoint boundaries) is evaluated on the worker's timer for as long
as its state is held. A job whose reporter died, or that was never ended (`TelemetryProducer.end_job`
not called), would be held and evaluated forever. So a live job silent for longer than its limit is
closed as abandoned. The limit is fixed (``straggler worker --abandon-after SECONDS``) or, by default,
taken from the job's own task lengths: `TASK_MULTIPLE` times the longest task time it has shown (a
finished task's latency, a running task's elapsed time at its last report), at least `FLOOR_S` and at
most `CAP_S`. A reporter may report a task only when it starts and when it finishes, so a silence as
long as a task is normal; several times the longest is not.

Times are the reports' own (the cluster's clock, as the worker's timer boundaries of live jobs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from straggler.core.jobstate import JobState, TaskStatus

FLOOR_S = 300.0
"""The shortest default limit: a job of short tasks may still pause for a few minutes."""
CAP_S = 6 * 3600.0
"""The longest default limit: a job of day-long tasks is not held for days after its reporter died."""
TASK_MULTIPLE = 4.0
"""How many of its longest task time a job may stay silent by default."""


@dataclass(frozen=True)
class Silence:
    """How long a job has been silent, and its limit."""

    last_report: float
    """The latest time the job reported (a task report, or its start)."""
    silent_for: float
    limit: float

    @property
    def abandoned(self) -> bool:
        return self.silent_for > self.limit

    def describe(self) -> str:
        return f"no report for {self.silent_for:.0f} s (limit {self.limit:.0f} s)"


def default_limit(longest_task: float | None) -> float:
    """The default silence limit for a job whose longest task time so far is ``longest_task``
    (None: it has shown none): `TASK_MULTIPLE` times it, within [`FLOOR_S`, `CAP_S`]."""
    longest = 0.0 if longest_task is None or not math.isfinite(longest_task) else max(0.0, longest_task)
    return min(CAP_S, max(FLOOR_S, TASK_MULTIPLE * longest))


def limit_for(longest_task: float | None, fixed: float | None) -> float:
    """``fixed`` (``--abandon-after``) when given, else `default_limit`."""
    return default_limit(longest_task) if fixed is None else fixed


def silence(
    last_report: float, now: float, longest_task: float | None, fixed: float | None = None
) -> Silence:
    """The job's silence at ``now`` (a clock running backwards counts as no silence)."""
    return Silence(last_report, max(0.0, now - last_report), limit_for(longest_task, fixed))


def task_lengths(state: JobState) -> Iterable[float]:
    """Each task's time as the job has shown it: a finished task's latency, a running (or ended)
    task's elapsed time at its last report (not at now: the silence must not lengthen the limit)."""
    for record in state.tasks.values():
        if record.status == TaskStatus.FINISHED:
            yield record.latency
        else:
            yield record.observed_at - record.start


def job_silence(
    state: JobState, started_at: float | None, now: float, fixed: float | None = None
) -> Silence | None:
    """The silence of a job whose state is ``state`` and which started at ``started_at`` (its
    ``started`` event's time); None when it has neither reported nor a known start."""
    reports = [t for t in (state.latest_report(), started_at) if t is not None]
    if not reports:
        return None
    longest = max(task_lengths(state), default=None)
    return silence(max(reports), now, longest, fixed)
