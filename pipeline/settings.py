"""A worker's configuration, and the Faust app id (consumer group) it implies.

Its own module so that what the worker plugs in (`pipeline.admm_online`) and what starts or watches
it (cli, benchmarks, tests) read the settings without importing the Faust app.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from straggler.kafka.names import TopicNames


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker is configured with; one App per settings."""

    bootstrap: str
    method: str = "nurd"
    model_path: str | None = None
    """For a cross-job method (START, ADMM): its trained file, from ``straggler train``."""
    topics: TopicNames = field(default_factory=TopicNames)
    partitions: int = 8
    app_id: str = "straggler-agent"
    quantile: float = 0.9
    start_fraction: float = 0.04
    refit_growth: float = 0.25
    seed: int = 0
    live_interval: float = 30.0
    """Seconds between evaluations of a live job (one that sends no checkpoint boundaries)."""
    pending_grace: float = 30.0
    """How long events of a job wait for its job_event 'started' before they are dead-lettered."""
    abandon_after: float | None = None
    """Seconds a live job may stay silent before it is closed as abandoned; None: from the job's own
    task lengths, bounded (`straggler.core.abandonment`)."""
    datadir: str | None = None
    admm_interval: float | None = None
    """Collaborative ADMM in the stream (``--method admm``): seconds between consensus rounds over the
    agent's partitions (`pipeline.admm_online`); None: off, the method comes from ``--model``."""


def app_id(settings: WorkerSettings) -> str:
    prefix = settings.topics.prefix.rstrip("-.")
    return f"{settings.app_id}-{prefix}" if prefix else settings.app_id
