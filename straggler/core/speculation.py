"""The cost-aware speculation rule: start a copy of a task when the job's expected completion-time
saving is worth the expected extra machine time, first finisher wins, the loser is killed.

Each running task's remaining time comes from the job's survival curve (`straggler.core.survival`)
conditioned on what the predictor said of it: the straggle probability of its verdicts (their mean
log-odds) weighs the curve's part past the threshold against the part below it, so a confident early
prediction buys a copy at once. A task that outruns the job's normal runs grows ever more likely
stuck (it never ends by itself), so its expected remaining time grows with its elapsed time. The
rule copies the prefix of candidates (ordered by the time a copy saves the task) that maximises
``saving / J - machine_price * extra / W``, under a per-job ``budget`` and optional ``machines``;
Spark's rule (`SparkRule`) is its floor. Some copies need no price (`Speculate.at_once`): before a
job has finished enough tasks to trust its curve, a likely straggler (`EARLY_CONFIDENCE`); after, a
sure one (`SURE`) whose copy is expected to end first; a task sure not to straggle is never copied
(`_sure_normal`). With ``priced_after`` (``speculate.../late``) the cost rule weighs only tasks that
have outrun the job's median finished latency by that factor. `Spark` is Spark's rule alone,
`MantriDuplicate` Mantri's duplicate test on the same estimates.

The rule's derivation: docs/architecture.md, "Policies and speculation".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from straggler.core.arrays import BoolArray, FloatArray, IntArray
from straggler.core.online import Decision, finished_needed
from straggler.core.policies import Action, Hold, HoldKind, MitigationPolicy
from straggler.core.survival import LatencySurvival

TINY = 1e-300


@dataclass
class _Running:
    start: float
    attempt: int
    at_least: float
    """A lower bound on the task's latency: its elapsed time, or the threshold it was flagged against."""
    probability: float = math.nan
    """The predictor's P(latency >= threshold) over the attempt's verdicts (NaN: none given): the mean
    of their log-odds (`_weigh_verdict`)."""
    threshold: float = math.nan
    log_odds: float = 0.0
    """The sum of the log-odds of the attempt's verdicts, and how many there were."""
    verdicts: int = 0


@dataclass
class _Race:
    original: int
    copy: int
    started: float
    original_start: float = math.nan


@dataclass
class _Job:
    finished: dict[str, float] = field(default_factory=dict)
    running: dict[str, _Running] = field(default_factory=dict)
    races: dict[str, _Race] = field(default_factory=dict)
    copied: set[str] = field(default_factory=set)
    kills: list[tuple[str, int, float]] = field(default_factory=list)
    """(task, losing attempt, finish time) of races decided since the last checkpoint."""
    spent: float = 0.0
    """Expected extra machine time of the copies issued so far, seconds."""
    first_start: float = math.inf
    flagged: set[str] = field(default_factory=set)
    """Tasks the predictor flagged."""
    held: dict[str, tuple[int, HoldKind]] = field(default_factory=dict)
    """Flagged tasks left without a copy: (attempt, why) as last said."""
    notes: list[Hold] = field(default_factory=list)
    """Holds of the last checkpoint not said yet (`Speculate.holds`)."""
    last_checkpoint: float = -math.inf
    spacing: float = math.inf
    """Seconds between the job's last two checkpoints (inf: fewer than two yet)."""
    inputs: dict[str, float] = field(default_factory=dict)
    """Tasks' input sizes, where the source reports them (`Speculate.on_task_input`)."""
    machines: dict[tuple[str, int], str] = field(default_factory=dict)
    """(task, attempt) -> the machine it runs or ran on, where the source names it."""
    finished_attempt: dict[str, int] = field(default_factory=dict)
    """Which attempt of each finished task finished it."""
    outrun: list[tuple[str, int, float]] = field(default_factory=list)
    """(task, attempt, seconds it ran) of originals a copy finished before: at least that slow."""


@dataclass(frozen=True)
class CopyPlan:
    """What the rule decided at one checkpoint of one job, with the estimates behind it."""

    tasks: list[str]
    saving: float
    """Expected cut in the job's completion time, seconds."""
    extra: float
    """Expected extra machine time, seconds."""
    completion: float
    work: float
    floor_tasks: frozenset[str] = frozenset()
    """Those of ``tasks`` the floor rule added."""
    unpriced: str = ""
    """Why ``tasks`` need no price, for their commands (`Speculate.at_once`); empty: they were priced."""
    held: dict[str, HoldKind] = field(default_factory=dict)
    """Candidates left out, and why: ``price`` (not worth its machine time), ``budget`` (over the
    job's budget) or ``machines`` (no spare machine); a running task not here had no estimate."""


NO_PLAN = CopyPlan([], 0.0, 0.0, math.nan, math.nan)


@dataclass(frozen=True)
class SparkRule:
    """Spark's speculation rule (``spark.speculation.multiplier``, ``.quantile``): copy a task that has
    run longer than ``multiplier`` x the median finished latency, once ``quantile`` of the job's tasks
    (finished or running) have finished. What operators run today. The defaults here are Spark's
    before 4.0 (1.5, 0.75), the floor ``Speculate`` keeps; Spark 4.0's are `SPARK_4` (3, 0.9)."""

    multiplier: float = 1.5
    quantile: float = 0.75

    def __post_init__(self) -> None:
        if not self.multiplier > 0 or not 0 < self.quantile <= 1:
            raise ValueError("Spark's rule needs multiplier > 0 and 0 < quantile <= 1")

    def due(self, job: _Job, at: float) -> list[str]:
        """Tasks the rule copies now (never copied before), longest-running first."""
        done, running = len(job.finished), len(job.running)
        if not done or done < self.quantile * (done + running):
            return []
        limit = self.multiplier * float(np.median(np.fromiter(job.finished.values(), dtype=np.float64)))
        over = [
            (at - r.start, task_id)
            for task_id, r in job.running.items()
            if at - r.start > limit and task_id not in job.copied and task_id not in job.races
        ]
        return [task_id for _, task_id in sorted(over, key=lambda x: (-x[0], x[1]))]

    def unmet(self, job: _Job, at: float, task_id: str) -> str | None:
        """Why the rule does not copy the running ``task_id`` now (None: it does, or did)."""
        done, running = len(job.finished), len(job.running)
        if not done or done < self.quantile * (done + running):
            share = done / max(done + running, 1)
            return f"{share:.0%} of tasks finished, needs {self.quantile:.0%}"
        median = float(np.median(np.fromiter(job.finished.values(), dtype=np.float64)))
        ran = at - job.running[task_id].start
        if ran > self.multiplier * median:
            return None
        return f"ran {ran:.0f}s, not over {self.multiplier:g} x the median finished latency ({median:.0f}s)"

    def describe(self, job: _Job) -> str:
        median = float(np.median(np.fromiter(job.finished.values(), dtype=np.float64)))
        return (
            f"over {self.multiplier:g} x the median finished latency ({median:.0f}s) with "
            f"{self.quantile:.0%} of tasks finished (Spark's rule)"
        )


SPARK_LEGACY = SparkRule(1.5, 0.75)
"""Spark's defaults up to 3.5 (the floor of `Speculate`)."""
SPARK_4 = SparkRule(3.0, 0.9)
"""Spark's defaults since 4.0 (SPARK-47720): what the ``spark`` policy runs."""
EARLY_CONFIDENCE = 0.9
"""How likely a predictor must find it that a task straggles for `Speculate` to copy it at once while
its job has finished too few tasks to trust its curve (`finished_needed`): a copy is a fresh draw from
the job's tasks, at most a tenth of which straggle, so it most likely ends first, and what it saves is
the straggler's whole excess over its peers."""
SURE = 0.999
"""A straggle probability at least this (or at most 1 - this) is taken at its word by `Speculate`: a
sure straggler is copied at once where its copy is expected to end first, and a task sure not to
straggle stays bounded by the threshold where its times are scaled (`_estimate`). A method's
probabilities are clipped to [1e-4, 1 - 1e-4] (`_weigh_verdict`), so only verdicts near-certain at
every checkpoint reach it; a task sure not to straggle is no candidate of the cost rule or the floor
(`_sure_normal`)."""
LATE = SPARK_LEGACY.multiplier
"""``speculate.../late``'s ``priced_after``: the cost rule weighs a task once it has run 1.5x its job's
median finished latency, Spark's older multiplier. Before that its remaining time is read off the
curve's exponential tail, which overrates it for tasks just past the body of a one-wave job: on the
real trace's tuning half at 60 s, priced copies of tasks at 1-1.5x the median won 40 % of their races
(docs/results.md, "At equal machine time")."""
DEFAULT_MACHINE_PRICE = 8.0
"""The measured knee on the real and synthetic traces, with an earlier policy
(`git show 96386f7:docs/results.md`, §9)."""

MachineTime = Callable[[FloatArray, FloatArray], FloatArray]
"""What `Speculate` prices a copy at, from its expected running time until the race ends and the
expected machine time its win saves the original (each per candidate, seconds)."""


def net_machine_time(copy_time: FloatArray, saved: FloatArray) -> FloatArray:
    """The copy's machine time less what its win saves the original: the default. A task that looks
    hung costs nothing to copy, since a winning copy kills an original that would run on."""
    return copy_time - saved


def gross_machine_time(copy_time: FloatArray, saved: FloatArray) -> FloatArray:
    """The copy's machine time alone (``speculate.../gross``): no credit for an original it is
    expected to kill, so every copy has a price, as the reports count gross machine time. Where a
    task only looks hung and ends first, the net price's credit was never there."""
    return copy_time


class Speculate(MitigationPolicy):
    """Speculative copies chosen by expected completion-time saving against extra machine time.

    Parameters
    ----------
    machine_price
        The share of completion time one share of extra machine time must buy (module docstring).
        The default, 8, is the measured knee on the real and synthetic traces
        (`git show 96386f7:docs/results.md`, §9).
    budget
        Per job, the expected extra machine time allowed, as a share of the job's expected work: a
        safety cap. It binds rarely at the default price; a low price with a tight budget spends it
        on early copies and has none left for the last tasks.
    machines
        Spare machines per job (copies running at once); None for unlimited.
    checkpoint_interval
        Seconds between checkpoints, at most: a losing attempt runs on for about half the spacing until
        its kill. A job whose checkpoints come closer (a live job, evaluated at the pace of its own
        task lengths) is priced at its own last spacing.
    grid_points
        Resolution of the remaining-time integrals.
    stuck_prior
        The prior share of attempts that hang (never end by themselves); a task that outruns the job's
        normal runs is ever more likely one of them, so its expected remaining time grows with its
        elapsed time instead of staying that of a fresh task (`LatencySurvival.stuck_probability`).
    floor
        A rule whose copies are always made (within ``machines``, outside the budget), but of a task
        the predictor is sure does not straggle (`_sure_normal`): by default Spark's, so the policy
        never copies a hung task later than Spark's speculation would.
    machine_time
        What a copy is priced at: `net_machine_time` (the default) or `gross_machine_time`, which
        makes the cheapest points of the price sweep far cheaper (docs/results.md, "At equal machine
        time").
    priced_after
        The cost rule weighs a running task only once it has run this many times the job's median
        finished latency (0, the default: from its start; `LATE` for ``speculate.../late``). The
        copies that need no price and the floor's are made as before.
    """

    def __init__(
        self,
        machine_price: float = DEFAULT_MACHINE_PRICE,
        budget: float = 0.1,
        machines: int | None = None,
        checkpoint_interval: float = 300.0,
        grid_points: int = 256,
        stuck_prior: float = 0.001,
        floor: SparkRule | None = SPARK_LEGACY,
        machine_time: MachineTime = net_machine_time,
        priced_after: float = 0.0,
    ) -> None:
        if not 0 < machine_price < math.inf:
            raise ValueError(f"machine_price must be a positive number, got {machine_price}")
        if not budget >= 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        if machines is not None and machines < 1:
            raise ValueError(f"speculate needs at least one machine, got {machines}")
        if not 0.0 <= priced_after < math.inf:
            raise ValueError(f"priced_after must be a number >= 0, got {priced_after}")
        if not checkpoint_interval > 0 or grid_points < 8:
            raise ValueError("checkpoint_interval must be positive and grid_points >= 8")
        self.machine_price = machine_price
        self.budget = budget
        self.machines = machines
        self.checkpoint_interval = checkpoint_interval
        self.grid_points = grid_points
        if not 0.0 <= stuck_prior < 1.0:
            raise ValueError(f"stuck_prior must be in [0, 1), got {stuck_prior}")
        self.stuck_prior = stuck_prior
        self.floor = floor
        self.machine_time = machine_time
        self.priced_after = priced_after
        self.name = self._spec()
        self._jobs: dict[str, _Job] = {}

    def _spec(self) -> str:
        """The policy's name, as `straggler.core.policy_spec` spells it."""
        name = "speculate" if self.machines is None else f"speculate:{self.machines}"
        if self.machine_price != DEFAULT_MACHINE_PRICE:
            name += f"@{self.machine_price:g}"
        if self.floor != SPARK_LEGACY:
            name += "/none" if self.floor is None else "/spark" if self.floor == SPARK_4 else "/spark-rule"
        if self.machine_time is gross_machine_time:
            name += "/gross"
        if self.priced_after:
            name += "/late" if self.priced_after == LATE else f"/late-after-{self.priced_after:g}"
        return name

    unplanned: HoldKind = "no_estimate"
    """Why a flagged task the plan did not weigh gets no copy (`holds`)."""
    floor_reads_inputs = True
    """Whether the floor copies only a task whose copy is expected to end first, where the job's
    inputs scale its times (`_input_scales`)."""
    floor_reads_verdicts = True
    """Whether the floor leaves out a task the predictor is sure does not straggle (`_sure_normal`)."""

    def _job(self, job_id: str) -> _Job:
        return self._jobs.setdefault(job_id, _Job())

    def on_task_finished(
        self, job_id: str, task_id: str, at: float, latency: float, attempt: int = 0
    ) -> None:
        job = self._job(job_id)
        job.finished.setdefault(task_id, latency)
        job.finished_attempt.setdefault(task_id, attempt)
        job.first_start = min(job.first_start, at - latency)
        job.running.pop(task_id, None)
        race = job.races.pop(task_id, None)
        if race is not None:
            loser = race.copy if attempt == race.original else race.original
            job.kills.append((task_id, loser, at))
            if loser == race.original and math.isfinite(race.original_start):
                job.outrun.append((task_id, loser, at - race.original_start))

    def on_task_input(self, job_id: str, task_id: str, size: float) -> None:
        """The task reads ``size`` of input (any unit, the same for the whole job; a copy reads the
        same): where the job's inputs explain its latencies, a copy's time is scaled by its task's
        input (`_input_scales`), as Mantri prices a copy."""
        self._job(job_id).inputs.setdefault(task_id, size)

    def on_task_machine(self, job_id: str, task_id: str, attempt: int, machine: str) -> None:
        """Where an attempt runs: a job's tasks that finished slow on a machine say its next one there
        will be slow too, and that a copy elsewhere will not (`_machine_factors`)."""
        if machine:
            self._job(job_id).machines[(task_id, attempt)] = machine

    def on_task_gone(self, job_id: str, task_id: str, at: float, attempt: int = 0) -> None:
        job = self._job(job_id)
        running = job.running.get(task_id)
        if running is not None and running.attempt == attempt and task_id not in job.races:
            del job.running[task_id]  # a race goes on with its copy, which reports the task's end

    def on_job_ended(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def on_checkpoint(self, job_id: str, at: float, decisions: Sequence[Decision]) -> list[Action]:
        job = self._job(job_id)
        if at > job.last_checkpoint:
            job.spacing = at - job.last_checkpoint
            job.last_checkpoint = at
        actions = [
            Action(job_id, task_id, "kill", at, f"attempt {loser} lost the race", finished_at, loser)
            for task_id, loser, finished_at in job.kills
        ]
        job.kills = []
        for d in decisions:
            if d.task_id in job.finished:
                continue
            # A flag is a lower bound only from a method that gives no probability; a probability
            # carries what the flag says, and how sure it is.
            has_probability = not math.isnan(d.straggle_probability)
            bound = max(d.elapsed, d.threshold) if d.is_straggler and not has_probability else d.elapsed
            previous = job.running.get(d.task_id)
            if previous is None or previous.attempt != d.attempt:
                previous = _Running(at - d.elapsed, d.attempt, bound)
            bound = max(bound, previous.at_least)
            running = _Running(at - d.elapsed, d.attempt, bound, threshold=d.threshold)
            if has_probability:
                _weigh_verdict(running, previous, d.straggle_probability)
            elif d.is_straggler:
                running.probability = 1.0  # the flag of a method that gives no probability
            job.running[d.task_id] = running
            job.first_start = min(job.first_start, running.start)
            if d.is_straggler:
                job.flagged.add(d.task_id)
        # the checkpoint's estimate, made at most once and only when asked (Spark's rule never asks)
        estimate = functools.cache(lambda: _estimate(job, at, self.grid_points, self.stuck_prior))
        plan = self._with_floor(job, at, self.plan(job, at, estimate), estimate)
        for task_id in plan.tasks:
            running = job.running[task_id]
            job.races[task_id] = _Race(running.attempt, running.attempt + 1, at, running.start)
            job.copied.add(task_id)
            if self.floor is not None and task_id in plan.floor_tasks:
                reason = f"copy: ran {at - running.start:.0f}s, {self.floor.describe(job)}"
            elif plan.unpriced:
                reason = f"copy: ran {at - running.start:.0f}s, {plan.unpriced}"
            else:
                reason = (
                    f"copy: job {plan.saving:.0f}s sooner (of {plan.completion:.0f}s) "
                    f"for {plan.extra:.0f}s extra machine time (of {plan.work:.0f}s)"
                )
            actions.append(
                Action(job_id, task_id, "duplicate", at, reason + _p(running), at, running.attempt)
            )
        job.spent += plan.extra
        self._hold(job_id, job, at, plan)
        return actions

    def holds(self, job_id: str) -> list[Hold]:
        job = self._jobs.get(job_id)
        if job is None:
            return []
        notes, job.notes = job.notes, []
        return notes

    def _hold(self, job_id: str, job: _Job, at: float, plan: CopyPlan) -> None:
        """Note each flagged task still running without a copy whose reason changed (`holds`)."""
        for task_id in sorted(job.flagged):
            running = job.running.get(task_id)
            if running is None or task_id in job.copied or task_id in job.races:
                continue
            kind: HoldKind = plan.held.get(task_id, self.unplanned)
            if job.held.get(task_id) == (running.attempt, kind):
                continue
            job.held[task_id] = (running.attempt, kind)
            early = kind == "rule" and self._too_early(job, at, task_id)
            why = {
                "rule": early or f"{self.name}'s rule not met",
                "no_estimate": "no estimate of the job's remaining time yet (too few tasks finished)",
                "price": f"its expected saving is not worth its machine time at price {self.machine_price:g}",
                "budget": f"the job's copy budget ({self.budget:.0%} of its work) is spent",
                "machines": f"no spare machine ({self.machines} copies at once)",
            }[kind]
            unmet = None if self.floor is None else self.floor.unmet(job, at, task_id)
            rule = "" if unmet is None else f"Spark's rule not met: {unmet}"
            reason = f"no copy: {rule if kind == 'rule' and rule else '; '.join(filter(None, [why, rule]))}"
            reason += _p(running)
            job.notes.append(Hold(job_id, task_id, running.attempt, at, kind, reason, running.probability))

    def _too_early(self, job: _Job, at: float, task_id: str) -> str | None:
        """Why the cost rule does not weigh ``task_id`` yet (``priced_after``), or None."""
        if not self.priced_after or not job.finished:
            return None
        median = _median_latency(job)
        ran = at - job.running[task_id].start
        if ran >= self.priced_after * median:
            return None
        under = f"under {self.priced_after:g}x the job's median finished latency"
        return f"ran {ran:.0f}s, {under} ({median:.0f}s)"

    def _with_floor(self, job: _Job, at: float, plan: CopyPlan, estimate: Estimate) -> CopyPlan:
        """``plan`` with the floor rule's copies added (no budget, but within ``machines``)."""
        if self.floor is None:
            return plan
        chosen = set(plan.tasks)
        extra = [t for t in self.floor.due(job, at) if t not in chosen]
        if self.floor_reads_verdicts:
            extra = [t for t in extra if not _sure_normal(job.running[t].probability)]
        reads_inputs = self.floor_reads_inputs and extra and job.inputs
        est = estimate() if reads_inputs else None
        if est is not None and est.scaled:  # a copy that reads the same input as a slow task is as slow
            row = {task_id: i for i, task_id in enumerate(est.ids)}
            extra = [t for t in extra if _copy_ends_first(est, row[t]) > 0.5]
        if self.machines is not None:
            extra = extra[: max(self.machines - len(job.races) - len(plan.tasks), 0)]
        if not extra:
            return plan
        return dataclasses.replace(plan, tasks=[*plan.tasks, *extra], floor_tasks=frozenset(extra))

    def plan(self, job: _Job, at: float, estimate: Estimate) -> CopyPlan:
        """The copies to start now (see the module docstring), from the checkpoint's ``estimate``;
        changes nothing."""
        est = estimate()
        at_once = self.at_once(job, est)
        if at_once.tasks:
            return at_once
        if est is None or not len(est.candidates):
            return NO_PLAN
        held: dict[str, HoldKind] = {}
        candidates = est.candidates
        if self.priced_after:
            median = _median_latency(job)
            ran = np.array([at - job.running[est.ids[i]].start for i in candidates], dtype=np.float64)
            late = ran >= self.priced_after * median
            held.update(dict.fromkeys((est.ids[i] for i in candidates[~late]), "rule"))
            candidates = candidates[late]
            if not len(candidates):
                return CopyPlan([], 0.0, 0.0, math.nan, math.nan, held=held)
        tail = 1.0 - est.remaining[candidates]
        fresh = est.fresh_rows(candidates)
        gain = np.sum(tail * fresh, axis=1) * est.step  # E[(R - C)+]: what a copy saves the task
        copy_time = np.sum(tail * (1.0 - fresh), axis=1) * est.step  # E[min(R, C)]
        extra = self.machine_time(copy_time, gain) + 0.5 * min(self.checkpoint_interval, job.spacing)
        order = np.argsort(-gain, kind="stable")
        if self.machines is not None:
            free = max(self.machines - len(job.races), 0)
            held.update(dict.fromkeys((est.ids[i] for i in candidates[order[free:]]), "machines"))
            order = order[:free]
        if len(order) == 0:
            return CopyPlan([], 0.0, 0.0, math.nan, math.nan, held=held)
        with_copy = 1.0 - tail[order] * (1.0 - (fresh if fresh.ndim == 1 else fresh[order]))
        change = np.log(np.maximum(with_copy, TINY)) - est.log_cdf[candidates[order]]
        ends = np.sum(1.0 - np.exp(est.all_done + np.cumsum(change, axis=0)), axis=1) * est.step
        savings = est.expected_end - ends
        costs = np.cumsum(extra[order])
        value = savings / est.completion - self.machine_price * costs / est.work
        affordable = job.spent + costs <= self.budget * est.work
        value = np.where(affordable, value, -np.inf)
        best = int(np.argmax(value))
        left = 0 if not value[best] > 0 else best + 1
        for k in range(left, len(order)):
            held[est.ids[candidates[order[k]]]] = "price" if affordable[k] else "budget"
        if left == 0:
            return CopyPlan([], 0.0, 0.0, math.nan, math.nan, held=held)
        chosen = [est.ids[i] for i in candidates[order[:left]]]
        return CopyPlan(chosen, float(savings[best]), float(costs[best]), est.completion, est.work, held=held)

    def at_once(self, job: _Job, est: _Estimates | None) -> CopyPlan:
        """The copies that need no price, most likely stragglers first, within ``machines`` and not
        charged to the budget: until the job has finished the tasks its predictor waits for
        (`finished_needed`), each running task at least `EARLY_CONFIDENCE` likely to straggle (the
        job's curve is too thin to price a copy by, and a copy of a straggler most likely ends
        first); after, each one `SURE` to straggle whose copy is expected to end first."""
        needed = finished_needed(len(job.finished) + len(job.running))
        early = len(job.finished) < needed
        confidence = EARLY_CONFIDENCE if early else SURE
        likely = sorted(
            (-r.probability, task_id)
            for task_id, r in job.running.items()
            if r.verdicts
            and r.probability >= confidence
            and task_id not in job.copied
            and task_id not in job.races
        )
        tasks = [task_id for _, task_id in likely]
        if not early and est is not None and tasks:
            row = {task_id: i for i, task_id in enumerate(est.ids)}
            tasks = [t for t in tasks if _copy_ends_first(est, row[t]) > 0.5]
        if self.machines is not None:
            tasks = tasks[: max(self.machines - len(job.races), 0)]
        if not tasks:
            return NO_PLAN
        why = (
            f"a likely straggler before {needed} of the job's tasks finished"
            if early
            else "a sure straggler, whose copy likely ends first"
        )
        return CopyPlan(tasks, math.nan, 0.0, math.nan, math.nan, unpriced=why)


def _median_latency(job: _Job) -> float:
    """The median latency of the job's finished tasks (it has one)."""
    return float(np.median(np.fromiter(job.finished.values(), dtype=np.float64)))


@overload
def _sure_normal(probability: float) -> bool: ...
@overload
def _sure_normal(probability: FloatArray) -> BoolArray: ...
def _sure_normal(probability: float | FloatArray) -> bool | BoolArray:
    """Whether a running task's straggle probability (or each of an array's) makes the predictor
    `SURE` it does not straggle: neither the cost rule nor the floor copies it. Every verdict since
    a task passed the threshold says 1 (`OnlineJob`), so a task that runs on past it soon stops being
    sure; NaN (no verdict) is never sure."""
    return probability <= 1.0 - SURE


def _p(running: _Running) -> str:
    """The probability a decision weighed, for its reason (none from a method that gives none)."""
    return "" if not running.verdicts else f" (p = {running.probability:.2f})"


def _weigh_verdict(running: _Running, previous: _Running, probability: float) -> None:
    """Give ``running`` the mean log-odds of its attempt's verdicts, ``probability`` the latest.

    Each verdict is one noisy look at the task; a policy that acted on each look alone would copy a
    task on its luckiest one, and the more often a job is checkpointed, the more such copies (measured:
    `git show 96386f7:docs/results.md`, §11)."""
    p = min(max(probability, 1e-4), 1.0 - 1e-4)
    running.log_odds = previous.log_odds + math.log(p / (1.0 - p))
    running.verdicts = previous.verdicts + 1
    running.probability = 1.0 / (1.0 + math.exp(-running.log_odds / running.verdicts))


class Spark(Speculate):
    """Spark's speculative execution alone (`SparkRule`, Spark 4.0's defaults unless told another):
    no estimate, no price, no budget."""

    def __init__(self, rule: SparkRule = SPARK_4, machines: int | None = None) -> None:
        super().__init__(budget=math.inf, machines=machines, floor=rule)
        if rule.quantile == SPARK_4.quantile:
            name = "spark" if rule == SPARK_4 else f"spark@{rule.multiplier:g}"
        elif rule.quantile == SPARK_LEGACY.quantile:
            name = "spark-legacy" if rule == SPARK_LEGACY else f"spark-legacy@{rule.multiplier:g}"
        else:
            name = f"spark-rule({rule.multiplier:g}, {rule.quantile:g})"
        self.name = name if machines is None else f"{name}:{machines}"

    unplanned: HoldKind = "rule"
    floor_reads_inputs = False  # Spark's rule as Spark runs it, blind to a task's input
    floor_reads_verdicts = False  # and to any predictor

    def plan(self, job: _Job, at: float, estimate: Estimate) -> CopyPlan:
        return NO_PLAN


class MantriDuplicate(Speculate):
    """Mantri's duplicate test (OSDI'10 §4.2) on the same estimates, for comparison: copy a running
    task when P(remaining > 2 x a copy's time) > ``delta``, i.e. when the copy likely saves machine
    time, whatever the task's end means for the job's. Largest probability first with a pool."""

    def __init__(
        self,
        delta: float = 0.25,
        machines: int | None = None,
        checkpoint_interval: float = 300.0,
        grid_points: int = 256,
    ) -> None:
        super().__init__(
            budget=math.inf,
            machines=machines,
            checkpoint_interval=checkpoint_interval,
            grid_points=grid_points,
            floor=None,
        )
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.delta = delta
        self.name = "mantri-duplicate" if machines is None else f"mantri-duplicate:{machines}"

    unplanned: HoldKind = "rule"

    def plan(self, job: _Job, at: float, estimate: Estimate) -> CopyPlan:
        est = estimate()
        if est is None or not len(est.candidates):
            return NO_PLAN
        outlasts = np.array(
            [1.0 - np.interp(2.0 * est.grid, est.grid, est.remaining[i], right=1.0) for i in est.candidates]
        )
        fresh = est.fresh_rows(est.candidates)
        if fresh.ndim == 1:
            success = outlasts @ np.diff(np.r_[0.0, fresh])  # P(R > 2 C)
        else:
            success = np.sum(outlasts * np.diff(fresh, axis=1, prepend=0.0), axis=1)
        order = np.flatnonzero(success > self.delta)
        order = order[np.argsort(-success[order], kind="stable")]
        if self.machines is not None:
            order = order[: max(self.machines - len(job.races), 0)]
        if len(order) == 0:
            return NO_PLAN
        chosen = [est.ids[i] for i in est.candidates[order]]
        return CopyPlan(chosen, math.nan, 0.0, est.completion, est.work)


@dataclass(frozen=True)
class _Estimates:
    ids: list[str]
    grid: FloatArray
    step: float
    remaining: FloatArray
    """P(remaining <= r) per running task (rows) and grid point, its copy (if any) included."""
    fresh: FloatArray
    """P(a copy's latency <= r): one row for every task, or a row per task (`scaled`)."""
    log_cdf: FloatArray
    all_done: FloatArray
    expected_end: float
    """E[time until every running task has ended], seconds."""
    completion: float
    work: float
    candidates: IntArray
    """Rows of tasks that may be copied (never copied before, and not sure not to straggle)."""
    scaled: bool = False
    """Whether times are read on each task's own scale (`_input_scales`, `_machine_factors`)."""

    def fresh_rows(self, rows: IntArray) -> FloatArray:
        """A copy's latency CDF for those rows: the shared row, or theirs."""
        return self.fresh if self.fresh.ndim == 1 else self.fresh[rows]


Estimate = Callable[[], "_Estimates | None"]
"""A checkpoint's survival estimates (`_estimate`), computed on the first call only."""


def _estimate(job: _Job, at: float, grid_points: int, stuck_prior: float) -> _Estimates | None:
    """The survival estimates behind a plan, or None before the job has a finished and a running task.

    Where the job's inputs explain its latencies (`_input_scales`), or its finished tasks show a
    running task's machine slow or fast (`_machine_factors`), the curve is of latency per unit of
    scale, and each task's times are read on its own scale: a task with twice the input is expected
    to take twice as long, and so is its copy; a task on a machine twice as slow is expected to take
    twice as long, and its copy, on another machine, not."""
    if not job.finished or not job.running:
        return None
    ids = sorted(job.running)
    elapsed = np.array([at - job.running[t].start for t in ids], dtype=np.float64)
    at_least = np.array([job.running[t].at_least for t in ids], dtype=np.float64)
    probability = np.array([job.running[t].probability for t in ids], dtype=np.float64)
    threshold = np.array([job.running[t].threshold for t in ids], dtype=np.float64)
    sure_normal = _sure_normal(probability)
    finished = np.fromiter(job.finished.values(), dtype=np.float64)
    inputs = _input_scales(job, ids)
    finished_scale, scale = inputs if inputs is not None else (np.ones(len(finished)), np.ones(len(ids)))
    machines = _machine_factors(job, ids, finished / finished_scale)
    if inputs is None and machines is None:
        survival = LatencySurvival(finished, elapsed, stuck_prior)
        span = max(float(at_least.max()), survival.last_time) + 8.0 * survival.tail_scale
        grid = np.linspace(0.0, span, grid_points)
        remaining = survival.remaining_cdf(elapsed, at_least, grid, probability, threshold)
        fresh, copy_grid, copy_scale = survival.fresh_cdf(grid), grid, None
        work_units = float(len(finished) + len(ids))
    else:
        copy_scale = scale  # a copy reads the same input, on a machine of the job's usual speed
        if machines is not None:
            scale = scale * machines
        survival = LatencySurvival(finished / finished_scale, elapsed / scale, stuck_prior)
        top = float(scale.max())
        span = max(float(at_least.max()), survival.last_time * top) + 8.0 * survival.tail_scale * top
        grid = np.linspace(0.0, span, grid_points)
        # A threshold past the curve's last finish on the task's own scale is one only a hang reaches:
        # the predictor's probability of it (learnt on raw latencies, where its input makes a task
        # long) is not a probability of hanging, so it is left out there; the elapsed time still is.
        # A sure "ends before it" (`SURE`) still bounds the task, wherever the threshold lies.
        task_threshold = threshold / scale
        task_threshold = np.where(
            (task_threshold <= survival.last_time) | sure_normal, task_threshold, np.nan
        )
        if machines is not None:
            probability = _with_machine_evidence(survival, probability, threshold, elapsed, scale, copy_scale)
        remaining = survival.remaining_cdf(
            elapsed / scale, at_least / scale, grid[None, :] / scale[:, None], probability, task_threshold
        )
        copy_grid = grid[None, :] / copy_scale[:, None]
        fresh = 1.0 - survival.sf(copy_grid)
        work_units = float(finished_scale.sum() + scale.sum())
    step = float(grid[1] - grid[0])
    for row, task_id in enumerate(ids):
        race = job.races.get(task_id)
        if race is not None:  # the copy has run (at - started) and not finished
            ran = (at - race.started) / (1.0 if copy_scale is None else copy_scale[row])
            row_grid = copy_grid if copy_scale is None else copy_grid[row]
            copy_cdf = 1.0 - survival.sf(ran + row_grid) / max(float(survival.sf(np.array(ran))), TINY)
            remaining[row] = 1.0 - (1.0 - remaining[row]) * (1.0 - copy_cdf)
    log_cdf = np.log(np.maximum(remaining, TINY))
    all_done = log_cdf.sum(axis=0)
    expected_end = float(np.sum(1.0 - np.exp(all_done)) * step)
    completion = max(at - job.first_start, 0.0) + expected_end
    work = work_units * survival.mean()
    if completion <= 0 or work <= 0:
        return None
    candidates = np.array(
        [i for i, t in enumerate(ids) if t not in job.copied and t not in job.races and not sure_normal[i]],
        dtype=np.int64,
    )
    return _Estimates(
        ids,
        grid,
        step,
        remaining,
        fresh,
        log_cdf,
        all_done,
        expected_end,
        completion,
        work,
        candidates,
        scaled=copy_scale is not None,
    )


MIN_SCALED = 5
"""Finished tasks with a known input a job needs before its inputs may scale its times."""
MIN_INPUT_RANK_CORRELATION = 0.5
"""How closely the finished tasks' latencies must follow their inputs (Spearman's rho) for the
inputs to scale a job's times; below it, latency is not a matter of input (compute-bound tasks, a
source whose "input" is a task's arguments only)."""


def _input_scales(job: _Job, ids: Sequence[str]) -> tuple[FloatArray, FloatArray] | None:
    """Each finished and running (``ids``) task's input over the finished tasks' median input, or
    None unless every running task's input is known, ``MIN_SCALED`` finished ones' are, and their
    latencies follow their inputs (Mantri, OSDI'10 §4.2: a copy reads the same input, so a task with
    more of it is slow on any machine, and copying it saves nothing)."""
    if len(job.inputs) < MIN_SCALED or any(t not in job.inputs for t in ids):
        return None
    known = [t for t in job.finished if t in job.inputs]
    if len(known) < MIN_SCALED:
        return None
    sizes = np.array([job.inputs[t] for t in known], dtype=np.float64)
    latencies = np.array([job.finished[t] for t in known], dtype=np.float64)
    if not np.all(sizes > 0) or np.ptp(sizes) == 0 or np.ptp(latencies) == 0:
        return None
    if _rank_correlation(sizes, latencies) < MIN_INPUT_RANK_CORRELATION:
        return None
    median = float(np.median(sizes))
    finished_scale = np.array([job.inputs.get(t, median) / median for t in job.finished], dtype=np.float64)
    running_scale = np.array([max(job.inputs[t], TINY) / median for t in ids], dtype=np.float64)
    return finished_scale, running_scale


SLOW_MACHINE = 2.0
"""How much slower (or faster) than the job's usual a machine must run its tasks, after shrinkage,
before its next task is read on its own scale (LATE's slow node, OSDI'08): a machine a little off the
median is within what a job's own tasks vary by. Chosen on the synthetic and blind traces among 1
(every factor), 1.5 and 2, where 1.5 still spent more machine time than no factor at 300 s and 2 did
not; its figures on the real trace's reporting half, which it was not chosen on, are in
docs/results.md ("Copies won")."""
MIN_PEERS = 3
"""Tasks a job must have finished elsewhere before a machine's are compared with them."""


def _machine_factors(job: _Job, ids: Sequence[str], latencies: FloatArray) -> FloatArray | None:
    """How much slower than the job's other machines each running (``ids``) attempt's machine runs
    the job's tasks; None where no running attempt's machine is `SLOW_MACHINE` off the usual.

    ``latencies`` are the finished tasks' latencies (``job.finished``'s order) on their input scale. A
    machine's log factor is the mean log of its finished tasks' latencies (and of the run times of
    its attempts a copy finished before: a lower bound, taken as it is) over the median of those
    that finished elsewhere, shrunk towards 0 as a normal mean (`_machine_prior`): where the job's
    machines differ much and its tasks on one machine little, one slow finish says much about its
    machine. A slow machine (LATE, OSDI'08) keeps its next task slow, and a copy of it, on another
    machine, is not. The finished tasks' curve itself is left as it is, slow machines and all: a copy
    may land on one too, and a job whose every task ran on its own machine must not have its slow
    finishes explained away."""
    running_where = [job.machines.get((t, job.running[t].attempt), "") for t in ids]
    wanted = set(running_where) - {""}
    if not wanted:
        return None
    where = [job.machines.get((t, job.finished_attempt.get(t, 0)), "") for t in job.finished]
    log_latency = np.log(np.maximum(latencies, TINY))
    runs: dict[str, list[float]] = {}  # the job's log run times (input scale) on each machine
    here_rows: dict[str, list[int]] = {}
    for row, machine in enumerate(where):
        if machine:
            runs.setdefault(machine, []).append(float(log_latency[row]))
            if machine in wanted:
                here_rows.setdefault(machine, []).append(row)
    # an original a copy finished before ran at least this long (on its input scale) where it ran
    if job.outrun:
        scale_of = dict(
            zip(job.finished, np.fromiter(job.finished.values(), dtype=np.float64) / latencies, strict=True)
        )
        for task_id, attempt, ran in job.outrun:
            machine = job.machines.get((task_id, attempt), "")
            if machine and task_id in scale_of:
                runs.setdefault(machine, []).append(
                    math.log(max(ran / max(float(scale_of[task_id]), TINY), TINY))
                )
    judged = wanted & runs.keys()
    if not judged:
        return None
    prior = _machine_prior(list(runs.values()))
    if prior is None:
        return None
    factor: dict[str, float] = {}
    for machine in judged:
        elsewhere = np.delete(log_latency, here_rows.get(machine, []))
        if len(elsewhere) < MIN_PEERS:
            continue
        here = np.asarray(runs[machine])  # its finishes, then its outrun attempts
        excess = float(np.sum(here - np.median(elsewhere)))
        factor[machine] = math.exp(excess / (len(here) + prior))
    running = np.array([factor.get(machine, 1.0) for machine in running_where], dtype=np.float64)
    running = np.where((running < SLOW_MACHINE) & (running > 1.0 / SLOW_MACHINE), 1.0, running)
    return None if np.all(running == 1.0) else running


def _machine_prior(runs: Sequence[Sequence[float]]) -> float | None:
    """How many finishes a machine's mean log run time is shrunk by: the spread of the job's tasks
    on one machine over that of its machines' speeds (var_within / var_between), both estimated from
    the job's own runs as a one-way random-effects model (method of moments); None where no machine
    ran two of them (nothing tells a machine's speed from a task's own) or the machines differ no
    more than their tasks do."""
    sizes = np.array([len(r) for r in runs], dtype=np.float64)
    groups, total = len(runs), float(sizes.sum())
    if groups < 2 or total - groups < 1:
        return None
    means = np.array([np.mean(r) for r in runs], dtype=np.float64)
    grand = float(np.sum(sizes * means) / total)
    within = sum(float(np.sum((np.asarray(r) - np.mean(r)) ** 2)) for r in runs) / (total - groups)
    between = float(np.sum(sizes * (means - grand) ** 2)) / (groups - 1)
    typical_size = (total - float(np.sum(sizes**2)) / total) / (groups - 1)
    machine_variance = (between - within) / typical_size
    return within / machine_variance if machine_variance > 0 else None


def _with_machine_evidence(
    survival: LatencySurvival,
    probability: FloatArray,
    threshold: FloatArray,
    elapsed: FloatArray,
    scale: FloatArray,
    usual_scale: FloatArray,
) -> FloatArray:
    """The predictor's P(latency >= threshold) of each running task, with what its machine's speed
    adds: its odds times the odds of passing the threshold on the machine's scale (``scale``) over
    those on a usual machine's (``usual_scale``), from the job's curve given the task's elapsed time.

    The predictor sees a task's features, not how the job's other tasks fared on its machine; taken
    as it is, its "probably not a straggler" would outweigh a machine that ran the job's tasks 4x
    long. Two views of the same task, each with the job's base rate in it once: a product of odds,
    over the base rate's."""
    known = np.isfinite(probability) & np.isfinite(threshold) & (scale != usual_scale)
    if not known.any():
        return probability

    def beyond(on: FloatArray) -> FloatArray:
        passed = survival.sf(np.maximum(threshold, elapsed) / on) / np.maximum(
            survival.sf(elapsed / on), TINY
        )
        return np.clip(np.nan_to_num(passed, nan=0.5), 1e-4, 1.0 - 1e-4)

    def odds(p: FloatArray) -> FloatArray:
        return p / (1.0 - p)

    p = np.clip(np.nan_to_num(probability, nan=0.5), 1e-4, 1.0 - 1e-4)
    combined = odds(p) * odds(beyond(scale)) / odds(beyond(usual_scale))
    return np.where(known, combined / (1.0 + combined), probability)


def _rank_correlation(x: FloatArray, y: FloatArray) -> float:
    """Spearman's rho (average ranks for ties)."""
    rx, ry = _ranks(x), _ranks(y)
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(x: FloatArray) -> FloatArray:
    """1-based ranks, ties given their average rank."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    average = np.cumsum(counts) - (counts - 1) / 2.0
    return np.asarray(average[inverse], dtype=np.float64)


def _copy_ends_first(est: _Estimates, row: int) -> float:
    """P(a copy started now ends before the task's running attempt): E over the copy's latency C of
    P(R > C)."""
    fresh = est.fresh if est.fresh.ndim == 1 else est.fresh[row]
    return float(np.sum((1.0 - est.remaining[row]) * np.diff(fresh, prepend=0.0)))
