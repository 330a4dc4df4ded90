"""Input events of the consumers as tests write them by hand (one place for their many fields)."""

from __future__ import annotations

from schemas import Prediction


def prediction(
    job: str,
    task: str,
    at: float,
    *,
    flagged: bool,
    latency: float | None,
    elapsed: float,
    attempt: int | None = None,
    threshold: float = 1000.0,
    method: str = "test",
    produced_at: float = 1.0,
) -> Prediction:
    """A verdict on ``task`` at checkpoint ``at``; ``latency`` is both the raw and the adjusted one."""
    return Prediction(
        job_id=job,
        task_id=task,
        checkpoint_time=at,
        raw_latency=latency,
        adjusted_latency=latency,
        propensity=None,
        weight=None,
        threshold=threshold,
        is_straggler=flagged,
        method=method,
        model_version=1,
        elapsed=elapsed,
        produced_at=produced_at,
        attempt=attempt,
    )
