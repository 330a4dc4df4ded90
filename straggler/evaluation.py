"""Offline evaluation: replay each job's checkpoints through `OnlineJob`, exactly as the stream does.

For every job and method the evaluator feeds the job's task events, checkpoint by checkpoint, into
the same `OnlineJob` the Faust agent holds, records when each task was flagged, and scores the flags
against the job's true p90 stragglers. Mitigation runs in the closed loop: per policy, the method's
verdicts drive the policy and the simulated cluster carries out its commands (`straggler.simulation`,
the stream replay's own), beside the limit on the same job and draws. The paper's open-loop relaunch
figures (`straggler.simulation.relaunch_flagged`) are kept for reproduction. Jobs run in parallel processes;
each method sees the same events.
"""

from __future__ import annotations

import copy
import math
import multiprocessing
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from tqdm import tqdm

from straggler.core.arrays import FloatArray
from straggler.core.jobtrace import JobTrace
from straggler.core.method import StragglerMethod
from straggler.core.metrics import confusion, f1_over_time, lead_time
from straggler.core.online import Decision, OnlineJob
from straggler.core.oracle import Oracle
from straggler.core.policy_spec import make_policy
from straggler.core.recorded_run import recorded_decisions
from straggler.core.registry import ORACLE, make_method
from straggler.core.threshold import oracle_threshold
from straggler.simulation import (
    checkpoint_interval,
    figures,
    limit_outcome,
    mean_figures,
    relaunch_flagged,
    run_closed_loop,
)

ThresholdMode = Literal["oracle", "online"]
MACHINE_COUNTS = (100, 200, 300, 400, 500, 600, 700, 800, 900)
MITIGATION_POLICIES = ("relaunch", "speculate", "speculate:5")
REFERENCE_METHOD = "reactive"
"""What operators run without a model; with it in an evaluation, each method's jobs that end later
than under it are counted (``jobs_below_reactive``)."""


@dataclass(frozen=True)
class EvaluationConfig:
    methods: tuple[str, ...]
    threshold: ThresholdMode = "oracle"
    quantile: float = 0.9
    seed: int = 0
    machine_counts: tuple[int, ...] = MACHINE_COUNTS
    start_fraction: float = 0.04
    refit_growth: float = 0.25
    population_folds: int = 5
    """Cross-job methods (START, ADMM) are cross-fitted: jobs fall into this many folds by a hash
    of their id, and a job is predicted by the model trained on the other folds' jobs."""
    policies: tuple[str, ...] = MITIGATION_POLICIES
    """Mitigation policies run in the closed-loop simulation (`straggler.simulation`) per method."""
    checkpoint_seconds: float = 300.0
    """Grid spacing for a job with a single checkpoint (others use their own grid's)."""


Prototypes = Mapping[str, StragglerMethod]
"""Per method name, a method already trained across jobs (``fit_population``), copied per job."""


def population_fold(job_id: str, folds: int) -> int:
    """A job's fold: a stable hash of its id, so a job's fold never depends on which jobs are loaded."""
    return zlib.crc32(job_id.encode()) % folds


def train_population_methods(
    traces: Sequence[JobTrace], config: EvaluationConfig
) -> list[dict[str, StragglerMethod]]:
    """For each trace, its cross-job methods trained on the jobs of the other folds only."""
    names = [n for n in config.methods if make_method(n, config.seed).learns_across_jobs]
    folds = [population_fold(t.job_id, config.population_folds) for t in traces]
    by_fold: dict[int, dict[str, StragglerMethod]] = {}
    for k in sorted(set(folds)) if names else []:
        training = [t for t, f in zip(traces, folds, strict=True) if f != k]
        by_fold[k] = {n: make_method(n, config.seed).fit_population(training) for n in names}
    return [by_fold.get(f, {}) for f in folds]


def online_job(
    trace: JobTrace, method_name: str, config: EvaluationConfig, prototypes: Prototypes | None = None
) -> OnlineJob:
    """The `OnlineJob` the stream would hold for ``trace`` under ``method_name`` and ``config``."""
    if prototypes and method_name in prototypes:
        method = copy.deepcopy(prototypes[method_name])
    else:
        method = make_method(method_name, config.seed)
        if method.learns_across_jobs:
            raise ValueError(f"{method_name} learns across jobs: pass it trained (train_population_methods)")
    latency = trace.latency
    scored = trace.scored
    oracle = oracle_threshold(latency[scored], config.quantile)
    job = OnlineJob(
        trace.job_id,
        method,
        len(trace.feature_names),
        trace.expected_tasks,
        # the control is told the true p90 with the truth, so its job is judged against it too
        threshold=oracle if config.threshold == "oracle" or isinstance(method, Oracle) else None,
        quantile=config.quantile,
        start_fraction=config.start_fraction,
        refit_growth=config.refit_growth,
    )
    if isinstance(method, Oracle):  # the control told the future (evaluation only)
        ended = ~trace.finished & np.isfinite(trace.end)
        unfinished = [t for t, e in zip(trace.task_ids, ended.tolist(), strict=True) if e]
        method.reveal(dict(zip(trace.task_ids, latency.tolist(), strict=True)), oracle, unfinished)
    if method.needs_granted_labels:
        # The paper grants Wrangler true labels of a random 2/3 of each job's tasks.
        rng = np.random.default_rng(config.seed)
        candidates = np.flatnonzero(scored)
        granted = rng.choice(candidates, size=max(2, (2 * len(candidates)) // 3), replace=False)
        method.grant_labels(trace.finish_features[granted], latency[granted] >= oracle)
    return job


def method_decisions(
    trace: JobTrace, method_name: str, config: EvaluationConfig, prototypes: Prototypes | None = None
) -> Iterator[list[Decision]]:
    """Feed ``trace`` to an `OnlineJob` event by event, as the stream does; yield per-checkpoint verdicts."""
    yield from recorded_decisions(online_job(trace, method_name, config, prototypes), trace)


def flag_times(
    trace: JobTrace, method_name: str, config: EvaluationConfig, prototypes: Prototypes | None = None
) -> tuple[FloatArray, int]:
    """When each task of ``trace`` was first flagged by ``method_name`` (NaN: never), and #decisions."""
    index = {task_id: i for i, task_id in enumerate(trace.task_ids)}
    flagged = np.full(trace.n_tasks, np.nan)
    decisions = 0
    for verdicts in method_decisions(trace, method_name, config, prototypes):
        decisions += len(verdicts)
        for d in verdicts:
            if d.is_straggler:
                flagged[index[d.task_id]] = d.checkpoint_time
    return flagged, decisions


@dataclass
class JobResult:
    job_id: str
    tasks: int
    scored: int
    excluded: int
    per_method: dict[str, dict[str, Any]] = field(default_factory=dict)
    limit: dict[str, float] = field(default_factory=dict)
    """The achievable reference on this job (`outcome_figures`)."""
    oracle: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per policy, the policy fed the true labels (`straggler.core.oracle`, future information): how
    much of the limit the policy can reach at all."""


def evaluate_job(
    trace: JobTrace, config: EvaluationConfig, prototypes: Prototypes | None = None
) -> JobResult:
    """All methods on one job: accuracy, F1 over time, lead time, completion time and its cost."""
    scored = trace.scored
    latency = trace.latency
    truth = latency[scored] >= oracle_threshold(latency[scored], config.quantile)
    start, end = trace.start[scored], trace.end[scored]
    result = JobResult(trace.job_id, trace.n_tasks, int(scored.sum()), trace.excluded_tasks)
    interval = checkpoint_interval(trace, config.checkpoint_seconds)
    limit = limit_outcome(trace, config.seed, interval, config.quantile)
    result.limit = figures(limit)
    result.oracle = mitigate_job(trace, ORACLE, config, interval)
    for name in config.methods:
        flagged_all, decisions = flag_times(trace, name, config, prototypes)
        flagged = flagged_all[scored]
        c = confusion(truth, np.isfinite(flagged))
        unlimited = relaunch_flagged(trace, flagged_all, config.seed)
        limited = {
            m: relaunch_flagged(trace, flagged_all, config.seed, machines=m) for m in config.machine_counts
        }
        result.per_method[name] = {
            "tpr": c.tpr,
            "fpr": c.fpr,
            "fnr": c.fnr,
            "f1": c.f1,
            "lead_time": lead_time(truth, flagged, start, end),
            "f1_over_time": f1_over_time(truth, flagged, float(start.min()), float(end.max())).tolist(),
            "decisions": decisions,
            "jct_unlimited": unlimited.reduction,
            "extra_work_unlimited": unlimited.relaunch_waste,
            "jct_limited": {str(m): r.reduction for m, r in limited.items()},
            "extra_work_limited": {str(m): r.relaunch_waste for m, r in limited.items()},
            "mitigation": mitigate_job(trace, name, config, interval, prototypes),
        }
    return result


def mitigate_job(
    trace: JobTrace,
    method_name: str,
    config: EvaluationConfig,
    interval: float,
    prototypes: Prototypes | None = None,
) -> dict[str, dict[str, float]]:
    """Per policy, the job's completion-time reduction and extra machine time in the closed loop."""
    out = {}
    for spec in config.policies:
        job = online_job(trace, method_name, config, prototypes)
        run = run_closed_loop(trace, job, make_policy(spec, interval), config.seed, interval)
        out[spec] = {**figures(run.outcome), "commands": len(run.commands)}
    return out


def _evaluate_star(args: tuple[JobTrace, EvaluationConfig, Prototypes]) -> JobResult:
    return evaluate_job(*args)


def evaluate(
    traces: Sequence[JobTrace], config: EvaluationConfig, *, workers: int | None = None, progress: bool = True
) -> list[JobResult]:
    """Evaluate every job, in parallel processes, with a progress bar."""
    workers = workers or max(1, min(len(traces), os.cpu_count() or 1))
    prototypes = train_population_methods(traces, config)
    jobs: Iterable[JobResult]
    bar = tqdm(total=len(traces), desc="jobs", unit="job", disable=not progress)
    results: list[JobResult] = []
    if workers == 1:
        for trace, trained in zip(traces, prototypes, strict=True):
            results.append(evaluate_job(trace, config, trained))
            bar.update()
    else:
        # spawn, not fork: the parent may already run OpenMP (XGBoost) or librdkafka threads, and a
        # forked child inherits their locks held; it then deadlocks in its first XGBoost fit.
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            jobs = pool.map(
                _evaluate_star, [(t, config, p) for t, p in zip(traces, prototypes, strict=True)], chunksize=1
            )
            for r in jobs:
                results.append(r)
                bar.update()
    bar.close()
    return results


def _mean(values: Iterable[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def summarise(results: Sequence[JobResult], config: EvaluationConfig) -> dict[str, Any]:
    """Means over jobs, per method, in the shape of ``summary.json``."""
    methods: dict[str, Any] = {}
    jct: dict[str, Any] = {}
    for name in config.methods:
        rows = [r.per_method[name] for r in results]
        methods[name] = {
            key: _mean(row[key] for row in rows) for key in ("tpr", "fpr", "fnr", "f1", "lead_time")
        }
        methods[name]["jobs"] = len(rows)
        methods[name]["f1_over_time"] = np.mean([row["f1_over_time"] for row in rows], axis=0).tolist()
        jct[name] = {
            "unlimited": {
                "reduction": _mean(row["jct_unlimited"] for row in rows),
                "extra_work": _mean(row["extra_work_unlimited"] for row in rows),
            },
            "limited": {
                str(m): {
                    "reduction": _mean(row["jct_limited"][str(m)] for row in rows),
                    "extra_work": _mean(row["extra_work_limited"][str(m)] for row in rows),
                }
                for m in config.machine_counts
            },
        }
    mitigation = {
        name: {
            spec: mean_figures([r.per_method[name]["mitigation"][spec] for r in results])
            for spec in config.policies
        }
        for name in config.methods
    }
    if REFERENCE_METHOD in config.methods:  # per job: is any method's closed loop worse than reactive's?
        for name in config.methods:
            for spec in config.policies:
                mitigation[name][spec]["jobs_below_reactive"] = sum(
                    r.per_method[name]["mitigation"][spec]["jct_reduction"]
                    < r.per_method[REFERENCE_METHOD]["mitigation"][spec]["jct_reduction"] - 1e-12
                    for r in results
                )
    limit = mean_figures([r.limit for r in results])
    return {
        "threshold": config.threshold,
        "quantile": config.quantile,
        "seed": config.seed,
        "policies": list(config.policies),
        "mitigation": mitigation,
        "mitigation_limit": {spec: dict(limit) for spec in config.policies},
        "mitigation_oracle": {
            spec: mean_figures([r.oracle[spec] for r in results]) for spec in config.policies
        },
        "methods": methods,
        "jobs": len(results),
        "tasks": int(sum(r.scored for r in results)),
        "excluded_tasks": int(sum(r.tasks - r.scored + r.excluded for r in results)),
        "jct": jct,
    }
