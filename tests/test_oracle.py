"""The oracle-fed control (evaluation only): when its job driver asks it, against which threshold,
and what it says of tasks that end without finishing."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from harness.small_jobs import make_job

from straggler.core.jobtrace import JobTrace
from straggler.core.threshold import oracle_threshold
from straggler.evaluation import EvaluationConfig, method_decisions, online_job

CONFIG = EvaluationConfig(methods=("oracle",), threshold="online")


def killed_job() -> tuple[JobTrace, set[str], str]:
    """A small job whose two slowest tasks were killed (they end, unfinished) and whose next slowest
    is cut by the trace's window (no end); and those tasks' ids."""
    trace = make_job(60, seed=3, interval=5.0)
    order = np.argsort(-trace.latency)
    finished = trace.finished.copy()
    finished[order[:3]] = False
    end = trace.end.copy()
    end[order[2]] = math.nan
    killed = {trace.task_ids[i] for i in order[:2]}
    return dataclasses.replace(trace, finished=finished, end=end), killed, trace.task_ids[order[2]]


def test_the_oracle_is_asked_from_the_first_checkpoint_against_the_true_p90() -> None:
    """The control knows the truth before any task finished, and its job judges it by the true p90
    (with the online threshold, a normal task past an early, low estimate would be flagged)."""
    trace, _, _ = killed_job()
    job = online_job(trace, "oracle", CONFIG)
    assert job.state.n_finished == 0 and job.ready()
    assert job.fixed_threshold == oracle_threshold(trace.latency[trace.scored], CONFIG.quantile)
    nurd = online_job(trace, "nurd", CONFIG)
    assert not nurd.ready() and nurd.fixed_threshold is None
    first = next(method_decisions(trace, "oracle", CONFIG))
    assert first and first[0].checkpoint_time == trace.checkpoints[0]


def test_a_task_that_ends_without_finishing_is_no_straggler_and_one_cut_by_the_window_is_unknown() -> None:
    """What the oracle says of a task before its elapsed time reaches the threshold (from there the
    job driver flags every task, whatever its method says)."""
    trace, killed, cut = killed_job()
    latency = dict(zip(trace.task_ids, trace.end - trace.start, strict=True))
    truth = oracle_threshold(trace.latency[trace.scored], CONFIG.quantile)
    said: dict[str, list[float]] = {}
    for verdicts in method_decisions(trace, "oracle", CONFIG):
        for d in verdicts:
            if d.elapsed < truth:
                said.setdefault(d.task_id, []).append(d.straggle_probability)
    assert all(latency[t] >= truth for t in killed)  # as long as stragglers: the label is the kill's
    assert all(said[t] and set(said[t]) == {0.0} for t in killed)
    assert said[cut] and all(math.isnan(p) for p in said[cut])
    scored = [t for t, ok in zip(trace.task_ids, trace.scored, strict=True) if ok and t in said]
    assert {t: set(said[t]) for t in scored} == {t: {float(latency[t] >= truth)} for t in scored}
    assert any(latency[t] >= truth for t in scored)
