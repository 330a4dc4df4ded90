"""The pipeline's topic names under one optional prefix, passed to every component.

A prefix lets several replays or tests share one broker without seeing each other's events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from straggler.kafka.topics import (
    DEAD_LETTERS,
    JOB_EVENTS,
    MITIGATION_NOTES,
    RELAUNCH_COMMANDS,
    STRAGGLER_PREDICTIONS,
    TASK_CHECKPOINTS,
)


@dataclass(frozen=True)
class TopicNames:
    prefix: str = ""

    @property
    def checkpoints(self) -> str:
        return self.prefix + TASK_CHECKPOINTS

    @property
    def job_events(self) -> str:
        return self.prefix + JOB_EVENTS

    @property
    def predictions(self) -> str:
        return self.prefix + STRAGGLER_PREDICTIONS

    @property
    def commands(self) -> str:
        return self.prefix + RELAUNCH_COMMANDS

    @property
    def notes(self) -> str:
        """Why the mitigator left a flagged task without a command (`schemas.MitigationNote`)."""
        return self.prefix + MITIGATION_NOTES

    @property
    def dead_letters(self) -> str:
        return self.prefix + DEAD_LETTERS

    @property
    def admm_exchange(self) -> str:
        """ADMM's consensus rounds (``straggler train --method admm --bootstrap``): one partition, made
        by ``straggler.kafka.admm_exchange`` on first use, so not among the pipeline's topics in ``all()``."""
        return self.prefix + "admm-exchange"

    @property
    def admm_online_exchange(self) -> str:
        """ADMM rounds inside the worker (``straggler worker --admm-interval``): one partition, made by
        ``pipeline.admm_online.create_topics``; a topic of its own, apart from the training exchange."""
        return self.prefix + "admm-online-exchange"

    def all(self) -> tuple[str, ...]:
        return (
            self.checkpoints,
            self.job_events,
            self.predictions,
            self.commands,
            self.dead_letters,
            self.notes,
        )


def ready_line(
    stage: str, bootstrap: str, reads: Sequence[str], writes: Sequence[str], partitions: int
) -> str:
    """The line a stage logs once it consumes: where, what it reads (``partitions`` of them assigned
    to it) and what it writes."""
    wrote = f", writing {', '.join(writes)}" if writes else ""
    return (
        f"{stage} ready: broker {bootstrap}, reading {', '.join(reads)} ({partitions} partitions here){wrote}"
    )
