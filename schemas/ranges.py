"""Physical ranges of every numeric field of every event: the rules a JSON Schema file cannot hold.

A value can be a valid JSON number and still be impossible: a task that ran ``1e300`` seconds, a
checkpoint 31 million years on (``checkpoint_time=1e15``), an attempt that started after the
checkpoint that reports it. Absorbed, such a value changes what the agent decides for the rest of the
job (a latency of 1e300 makes the job's threshold 1e300, and no task is flagged again), so `decode`
and `validate` reject it like any broken schema rule: a `SchemaError` with rule ``range`` that the
stage owning the topic dead-letters.

The ranges are absolute or relative to the record itself, never to the wall clock: a replay of a 2011
trace (trace seconds from 0) passes as a live job's Unix times do, and folding the same records again
(the mitigator's rebuild) always reaches the same verdicts.

- times (``checkpoint_time``, ``time``, ``start_time``, ``produced_at``, ...): 0 to `MAX_TIME_S`;
- durations (``latency``, and ``checkpoint_time - start_time``): 0 to `MAX_TASK_SECONDS`, which a
  deployment sets with ``$STRAGGLER_MAX_TASK_SECONDS`` (default 90 days; read at import);
- ``start_time`` at most ``checkpoint_time``;
- counts, indices and attempts: up to a bound per field (`COUNT_LIMITS`);
- scores and features (propensity, weight, predicted latencies, feature values): magnitude at most
  `MAX_MAGNITUDE`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

MAX_TASK_SECONDS_ENV = "STRAGGLER_MAX_TASK_SECONDS"
DEFAULT_MAX_TASK_SECONDS = 90 * 86400.0
"""Longest a task attempt may run: beyond the 29 days of the Google 2011 trace, far below 1e300."""


def _max_task_seconds(environ: Mapping[str, str]) -> float:
    text = environ.get(MAX_TASK_SECONDS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_TASK_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise RuntimeError(f"${MAX_TASK_SECONDS_ENV} must be a positive number of seconds, not {text!r}")
    return value


MAX_TASK_SECONDS = _max_task_seconds(os.environ)
"""The deployment's bound on ``latency`` and on ``checkpoint_time - start_time`` (seconds)."""

MAX_TIME_S = 1e10
"""Latest time, seconds: the year 2286 in Unix time, later than any trace time (seconds from the
trace's start) or wall-clock time this system will see, far below ``1e15``."""

MAX_MAGNITUDE = 1e15
"""Largest absolute value of a feature, a score or a predicted latency."""

TIME_FIELDS = frozenset(
    {"checkpoint_time", "time", "start_time", "produced_at", "boundary_produced_at", "issued_at", "failed_at"}
)
DURATION_FIELDS = frozenset({"latency"})
ELAPSED_FIELDS = frozenset({"elapsed"})
"""Seconds a running attempt has run, as the agent computed them (bounded like a time: the input's
``checkpoint_time - start_time`` is already bounded by `MAX_TASK_SECONDS`)."""
MAGNITUDE_FIELDS = frozenset(
    {"raw_latency", "adjusted_latency", "propensity", "weight", "threshold", "straggle_probability"}
)
COUNT_LIMITS: Mapping[str, int] = {
    "attempt": 100_000,
    "expected_tasks": 10_000_000,
    "evaluated": 10_000_000,
    "flagged": 10_000_000,
    "checkpoint_index": 2**53,  # a live producer may number its checkpoints by their Unix time
    "model_version": 1_000_000_000,
    "part": 1_000_000,
    "parts": 1_000_000,
    "raw_size": 2**31,
    "source_partition": 1_000_000,
    "source_offset": 2**63 - 1,
}
"""Most a count, index or attempt may be (the schemas give the least)."""

_NUMBER = (int, float)


def out_of_range(event_type: str, obj: Mapping[str, Any]) -> tuple[str, str, Any] | None:
    """The first field of ``obj`` (an event of ``event_type`` that passed its schema) outside its
    physical range, as (dotted field, reason, value); None when every value is in range. A
    task_batch's observations are checked one by one when read (`schemas.batches.observations`)."""
    for name, value in obj.items():
        found = _field_out_of_range(name, value)
        if found is not None:
            return f"{event_type}.{name}{found[0]}", found[1], found[2]
    if event_type == "task_checkpoint":
        return _attempt_out_of_range(event_type, obj)
    return None


def _attempt_out_of_range(where: str, obj: Mapping[str, Any]) -> tuple[str, str, Any] | None:
    """An attempt cannot start after the checkpoint that reports it, nor run longer than a task may."""
    start, at = obj.get("start_time"), obj.get("checkpoint_time")
    if not isinstance(start, _NUMBER) or not isinstance(at, _NUMBER):
        return None
    if start > at:
        return f"{where}.start_time", f"must be <= checkpoint_time ({at})", start
    if at - start > MAX_TASK_SECONDS:
        reason = (
            f"must be within {MAX_TASK_SECONDS:g} s (${MAX_TASK_SECONDS_ENV}) before checkpoint_time ({at})"
        )
        return f"{where}.start_time", reason, start
    return None


def _field_out_of_range(name: str, value: Any) -> tuple[str, str, Any] | None:
    """(suffix of the path, reason, value) when ``value`` of field ``name`` (or an item of it, for a
    column of a prediction_batch) is out of its range."""
    if name == "features":
        return _magnitudes_out_of_range(value.items()) if isinstance(value, dict) else None
    low, high, reason = _range_of(name)
    if reason is None:
        return None
    if isinstance(value, list):
        numbers = [v for v in value if isinstance(v, _NUMBER)]
        if not numbers or (low <= min(numbers) and max(numbers) <= high):
            return None
        index = next(i for i, v in enumerate(value) if isinstance(v, _NUMBER) and not low <= v <= high)
        return f"[{index}]", reason, value[index]
    if not isinstance(value, _NUMBER) or isinstance(value, bool) or low <= value <= high:
        return None
    return "", reason, value


def _range_of(name: str) -> tuple[float, float, str | None]:
    """(least, most, reason when outside) of field ``name``; reason None for a field without a range."""
    if name in TIME_FIELDS or name in ELAPSED_FIELDS:
        return 0.0, MAX_TIME_S, f"must be a time from 0 to {MAX_TIME_S:g} s"
    if name in DURATION_FIELDS:
        return 0.0, MAX_TASK_SECONDS, f"must be from 0 to {MAX_TASK_SECONDS:g} s (${MAX_TASK_SECONDS_ENV})"
    if name in MAGNITUDE_FIELDS:
        return -MAX_MAGNITUDE, MAX_MAGNITUDE, f"must be within ±{MAX_MAGNITUDE:g}"
    limit = COUNT_LIMITS.get(name)
    if limit is not None:
        return -1.0, float(limit), f"must be at most {limit}"
    return 0.0, 0.0, None


def _magnitudes_out_of_range(items: Iterable[tuple[str, Any]]) -> tuple[str, str, Any] | None:
    for key, value in items:
        if isinstance(value, _NUMBER) and not abs(value) <= MAX_MAGNITUDE:
            return f".{key}", f"must be within ±{MAX_MAGNITUDE:g}", value
    return None
