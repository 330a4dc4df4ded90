"""Mitigation policies: from straggler verdicts to relaunch actions. Pure, event-driven, per job.

The mitigation consumer and the offline simulation drive the same objects with the same calls
(``on_checkpoint``, ``on_task_finished``, ``on_task_gone``, ``on_job_ended``), so a policy cannot
behave differently in the stream and in the evaluator. Here: ``unlimited`` (Algorithm 2), ``limited:M``
(Algorithm 3) and ``mantri`` (Mantri's restart rule).

The calls and the policies in full: docs/architecture.md, "Policies and speculation".
"""

from __future__ import annotations

import math
import statistics
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from straggler.core.online import Decision

ActionName = Literal["relaunch", "duplicate", "kill"]


@dataclass(frozen=True)
class Action:
    """A command to the cluster scheduler (one relaunch-command event in the stream)."""

    job_id: str
    task_id: str
    action: ActionName
    at: float
    reason: str
    decision_key: float
    """Checkpoint time of the verdict that caused it: with job, task and action, the command's identity."""
    attempt: int = 0
    """The attempt acted on: copied (duplicate), restarted (relaunch) or stopped (kill)."""


HoldKind = Literal["no_estimate", "price", "budget", "machines", "rule"]  # = schemas.events.HoldKind
"""Why a flagged task got no copy: no estimate of the job yet (too few tasks finished), the expected
saving is not worth its machine time at the policy's price, the job's budget is spent, no spare
machine is free, or the policy's rule (Spark's, Mantri's) is not met."""


@dataclass(frozen=True)
class Hold:
    """A flagged task the policy did not act on at a checkpoint, and why (a ``mitigation_note``)."""

    job_id: str
    task_id: str
    attempt: int
    at: float
    kind: HoldKind
    reason: str
    probability: float = math.nan
    """The straggle probability the policy weighed (NaN: the method gives none)."""


class MitigationPolicy(ABC):
    """Base class; subclasses keep per-job state keyed by job id."""

    name: str = ""

    def holds(self, job_id: str) -> list[Hold]:
        """Flagged tasks of the job's last checkpoint left without a command whose reason changed
        since it was last given (each said once per reason); the policies that copy every flag: none."""
        return []

    @abstractmethod
    def on_checkpoint(self, job_id: str, at: float, decisions: Sequence[Decision]) -> list[Action]:
        """Act on one checkpoint's verdicts for one job."""

    def on_task_finished(  # noqa: B027
        self, job_id: str, task_id: str, at: float, latency: float, attempt: int = 0
    ) -> None:
        """A task (one of its attempts) finished: frees machines, informs estimates."""

    def on_task_gone(self, job_id: str, task_id: str, at: float, attempt: int = 0) -> None:  # noqa: B027
        """A task's attempt ended without finishing (failed, killed): it no longer runs."""

    def on_task_input(self, job_id: str, task_id: str, size: float) -> None:  # noqa: B027
        """The task's input size, where its source reports one (`schemas.INPUT_FEATURE`)."""

    def on_task_machine(self, job_id: str, task_id: str, attempt: int, machine: str) -> None:  # noqa: B027
        """The machine an attempt of the task runs (or ran) on, as its source names it."""

    def on_job_ended(self, job_id: str) -> None:  # noqa: B027
        """The job is over: drop its state."""


class Unlimited(MitigationPolicy):
    """Algorithm 2: relaunch every predicted straggler immediately."""

    name = "unlimited"

    def on_checkpoint(self, job_id: str, at: float, decisions: Sequence[Decision]) -> list[Action]:
        return [
            Action(job_id, d.task_id, "relaunch", at, "predicted straggler", d.checkpoint_time, d.attempt)
            for d in decisions
            if d.is_straggler
        ]


@dataclass
class _Pool:
    free: int
    holding: set[str] = field(default_factory=set)
    waiting: list[tuple[str, float, int]] = field(default_factory=list)
    done: set[str] = field(default_factory=set)


class Limited(MitigationPolicy):
    """Algorithm 3: a pool of spare machines per job."""

    def __init__(self, machines: int) -> None:
        if machines < 1:
            raise ValueError(f"limited policy needs at least one machine, got {machines}")
        self.machines = machines
        self.name = f"limited:{machines}"
        self._pools: dict[str, _Pool] = {}

    def _pool(self, job_id: str) -> _Pool:
        return self._pools.setdefault(job_id, _Pool(self.machines))

    def on_checkpoint(self, job_id: str, at: float, decisions: Sequence[Decision]) -> list[Action]:
        pool = self._pool(job_id)
        pool.waiting.extend((d.task_id, d.checkpoint_time, d.attempt) for d in decisions if d.is_straggler)
        actions = []
        still_waiting = []
        for task_id, flagged_at, attempt in pool.waiting:
            if task_id in pool.done:
                continue  # finished on its own while it waited
            if pool.free > 0:
                pool.free -= 1
                pool.holding.add(task_id)
                actions.append(
                    Action(job_id, task_id, "relaunch", at, "predicted straggler", flagged_at, attempt)
                )
            else:
                still_waiting.append((task_id, flagged_at, attempt))
        pool.waiting = still_waiting
        return actions

    def on_task_finished(
        self, job_id: str, task_id: str, at: float, latency: float, attempt: int = 0
    ) -> None:
        pool = self._pool(job_id)
        pool.done.add(task_id)
        if task_id in pool.holding:
            pool.holding.discard(task_id)
            pool.free += 1

    def on_job_ended(self, job_id: str) -> None:
        self._pools.pop(job_id, None)


class Mantri(MitigationPolicy):
    """Restart when the remaining time exceeds a new copy's expected time plus one interval."""

    name = "mantri"

    def __init__(self, checkpoint_interval: float, max_restarts: int = 3) -> None:
        self.checkpoint_interval = checkpoint_interval
        self.max_restarts = max_restarts
        self._finished: dict[str, list[float]] = {}
        self._restarts: dict[tuple[str, str], int] = {}

    def on_checkpoint(self, job_id: str, at: float, decisions: Sequence[Decision]) -> list[Action]:
        finished = self._finished.get(job_id)
        if not finished:
            return []
        new_copy = statistics.median(finished)
        actions = []
        for d in decisions:
            remaining = d.adjusted_latency - d.elapsed
            restarts = self._restarts.get((job_id, d.task_id), 0)
            worth_it = math.isfinite(remaining) and remaining > new_copy + self.checkpoint_interval
            if worth_it and restarts < self.max_restarts:
                self._restarts[(job_id, d.task_id)] = restarts + 1
                interval = self.checkpoint_interval
                reason = f"remaining {remaining:.0f}s > new copy {new_copy:.0f}s + {interval:.0f}s"
                actions.append(
                    Action(job_id, d.task_id, "relaunch", at, reason, d.checkpoint_time, d.attempt)
                )
        return actions

    def on_task_finished(
        self, job_id: str, task_id: str, at: float, latency: float, attempt: int = 0
    ) -> None:
        self._finished.setdefault(job_id, []).append(latency)

    def on_job_ended(self, job_id: str) -> None:
        self._finished.pop(job_id, None)
        self._restarts = {k: v for k, v in self._restarts.items() if k[0] != job_id}
