"""A job rebuilt from whatever part of a checkpoint's writes survived decides as if nothing happened.

The worker-kill fault test (tests/test_faults.py) shows this end to end, but a kill lands at a random
moment; here each cut between the writes of one checkpoint is made on purpose, on plain dicts
standing in for the three tables.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.jobstore import JobStore, model_key, new_online_job
from straggler.core.jobtrace import JobTrace
from straggler.core.model_codec import decode_model
from straggler.core.nurd import make_nurd
from straggler.core.online import Decision
from straggler.simulation import JobSimulation, observe_step, steps
from straggler.traces.synthetic import generate_jobs

Tables = tuple[dict[bytes, bytes], dict[bytes, bytes], dict[bytes, bytes]]


def store_over(tables: Tables) -> JobStore:
    """A worker's store, with nothing cached: what a restarted worker has after recovery."""
    factory = new_online_job(lambda: make_nurd("nurd"), {"quantile": 0.9, "refit_growth": 0.25})
    return JobStore(*tables, make_job=factory)


def copy_of(tables: Tables) -> Tables:
    return (dict(tables[0]), dict(tables[1]), dict(tables[2]))


def verdicts(decisions: list[Decision]) -> list[tuple[str, bool, float]]:
    return [(d.task_id, d.is_straggler, round(d.adjusted_latency, 9)) for d in decisions]


@pytest.fixture(scope="module")
def trace() -> JobTrace:
    return generate_jobs(1, seed=0, min_tasks=400, max_tasks=400)[0]


def checkpoints(trace: JobTrace, tables: Tables) -> Iterator[tuple[float, JobStore]]:
    """Feed the job's task events through a store (each checkpoint's changes as one row, as the agent
    writes a batch of them) and yield before each checkpoint is evaluated."""
    store = store_over(tables)
    store.start(trace.job_id, trace.expected_tasks, list(trace.feature_names), live=False)
    sim = JobSimulation(trace, seed=0)
    for step in steps(sim, None):
        t = step[1]
        job = store.job(trace.job_id)
        assert job is not None
        observe_step(job.state, sim, step)
        for task_id in job.state.tasks:
            store.put_task(job, task_id)
        store.write_changes(trace.job_id)  # one row per input record, as the agent writes a batch
        yield t, store


def commit(store: JobStore, job_id: str, t: float) -> None:
    """What the agent does once the checkpoint's writes are acknowledged."""
    job, meta = store.job(job_id), store.meta(job_id)
    assert job is not None and meta is not None
    store.record_evaluation(t, job, meta)
    store.retire_models(job_id, keep=job.model_version)


def cut_at_refit_with_flags(trace: JobTrace) -> tuple[Tables, Tables, float, list[Decision]]:
    """Run the job to its first checkpoint that refits *and* flags; return the tables as they were
    before that checkpoint's job row (the cut), as they are after it commits, its time and decisions."""
    tables: Tables = ({}, {}, {})
    for t, store in checkpoints(trace, tables):
        version = store.job(trace.job_id).model_version  # type: ignore[union-attr]
        decisions = store.evaluate(trace.job_id, t)
        refitted = store.job(trace.job_id).model_version != version  # type: ignore[union-attr]
        if refitted and version > 0 and any(d.is_straggler for d in decisions):
            cut = copy_of(tables)
            commit(store, trace.job_id, t)
            return cut, tables, t, decisions
        commit(store, trace.job_id, t)
    raise AssertionError("the synthetic job never refitted at a checkpoint with a flag")


def test_a_checkpoint_whose_job_row_was_lost_is_evaluated_again_to_the_same_decisions(
    trace: JobTrace,
) -> None:
    cut, _, t, decisions = cut_at_refit_with_flags(trace)
    rebuilt = store_over(cut)
    job = rebuilt.job(trace.job_id)
    assert job is not None
    flagged_now = {d.task_id for d in decisions if d.is_straggler}
    assert not flagged_now & set(job.state.flagged), "flags of the uncommitted checkpoint came back"
    assert len(cut[2]) == 2, "the new model and the one the job row names are both kept"
    assert verdicts(rebuilt.evaluate(trace.job_id, t)) == verdicts(decisions)


def test_a_job_rebuilt_before_any_checkpoint_decides_as_the_cached_one(trace: JobTrace) -> None:
    """A worker killed between two boundaries, after the task events, before the next boundary."""
    tables: Tables = ({}, {}, {})
    flags = 0
    evaluated = 0
    for t, store in checkpoints(trace, tables):
        rebuilt = store_over(copy_of(tables))
        expected = store.evaluate(trace.job_id, t)
        assert verdicts(rebuilt.evaluate(trace.job_id, t)) == verdicts(expected), f"checkpoint {t}"
        commit(store, trace.job_id, t)
        assert len(tables[2]) <= 1, "a superseded model outlived the job row that replaced it"
        flags += sum(d.is_straggler for d in expected)
        evaluated += bool(expected)
    assert evaluated >= 5 and flags > 0


def test_a_rebalance_between_evaluation_and_commit_keeps_what_the_checkpoint_did(trace: JobTrace) -> None:
    """The agent awaits the broker between `evaluate` and `record_evaluation`; a rebalance there
    clears the cache. The commit must still record the model and flags the checkpoint produced."""
    tables: Tables = ({}, {}, {})
    for t, store in checkpoints(trace, tables):
        job, meta = store.job(trace.job_id), store.meta(trace.job_id)
        assert job is not None and meta is not None
        version = job.model_version
        decisions = store.evaluate(trace.job_id, t)
        if not (job.model_version != version and version > 0 and any(d.is_straggler for d in decisions)):
            commit(store, trace.job_id, t)
            continue
        store.forget_cache()  # partitions moved while the agent awaited the acknowledgements
        store.record_evaluation(t, job, meta)
        store.retire_models(trace.job_id, keep=job.model_version)
        rebuilt = store_over(copy_of(tables)).job(trace.job_id)
        assert rebuilt is not None
        assert (rebuilt.model_version, rebuilt.fitted_on) == (job.model_version, job.fitted_on)
        assert rebuilt.state.flagged == job.state.flagged
        assert len(tables[2]) == 1
        return
    raise AssertionError("the synthetic job never refitted at a checkpoint with a flag")


def test_a_missing_model_version_means_a_refit_not_a_crash(trace: JobTrace) -> None:
    _, committed, _, _ = cut_at_refit_with_flags(trace)
    broken = copy_of(committed)
    broken[2].clear()
    job = store_over(broken).job(trace.job_id)
    assert job is not None
    assert job.fitted_on == 0 and job.model_version > 0


class RunsCode:
    """A pickle that runs code when loaded: it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


@pytest.mark.parametrize("kind", ["pickle that runs code", "malformed row"])
def test_a_crafted_model_row_is_refused_and_the_job_refitted(
    trace: JobTrace, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """Whoever writes to the models changelog cannot run code in the worker: the row the job row names
    is refused (logged), the job is rebuilt unfitted and refits at its next checkpoint, as when the
    row is missing."""
    _, committed, t, _ = cut_at_refit_with_flags(trace)
    marker = tmp_path / "ran"
    evil = copy_of(committed)
    (key,) = evil[2]
    evil[2][key] = pickle.dumps(RunsCode(marker)) if kind == "pickle that runs code" else evil[2][key][:-40]
    store = store_over(evil)
    with caplog.at_level(logging.ERROR, logger="pipeline.jobstore"):
        job = store.job(trace.job_id)
    assert not marker.exists(), "the crafted pickle ran"
    assert job is not None and job.fitted_on == 0 and not job.calibrated
    assert not hasattr(job.method, "regressor_"), "the refused row left state behind"
    assert f"model version {job.model_version} rejected" in caplog.text
    version = job.model_version
    store.evaluate(trace.job_id, t + 1.0)
    assert job.model_version == version + 1, "the job was not refitted"
    refitted = decode_model(evil[2][model_key(trace.job_id, version + 1)], make_nurd("nurd"))
    assert refitted.regressor_ is not None  # type: ignore[attr-defined]


def first_checkpoint_with_flags(trace: JobTrace) -> tuple[Tables, Tables, JobStore, float, set[str]]:
    """Run the job until a checkpoint flags some tasks; return the tables before that checkpoint's
    evaluation, the tables, the store, its time and its flags (evaluated, not yet committed)."""
    tables: Tables = ({}, {}, {})
    for t, store in checkpoints(trace, tables):
        before = copy_of(tables)
        flagged = {d.task_id for d in store.evaluate(trace.job_id, t) if d.is_straggler}
        if flagged:
            return before, tables, store, t, flagged
        commit(store, trace.job_id, t)
    raise AssertionError("the synthetic job never flagged a task")


def test_a_checkpoint_writes_no_task_row_its_flags_ride_in_the_job_row(trace: JobTrace) -> None:
    before, tables, store, t, flagged = first_checkpoint_with_flags(trace)
    assert len(tables[0]) == len(before[0]), "the evaluation wrote a task row"
    commit(store, trace.job_id, t)
    meta = store.meta(trace.job_id)
    assert meta is not None and set(meta.checkpoint_flags) == flagged
    assert set(meta.checkpoint_flags.values()) == {t}


def test_flags_only_in_the_job_row_survive_a_rebuild_and_later_checkpoints(trace: JobTrace) -> None:
    """A worker rebuilt right after the commit gets the flags from the job row alone; they must reach
    a task row before the next job row (which names only its own flags) replaces them."""
    _, tables, store, t, flagged = first_checkpoint_with_flags(trace)
    commit(store, trace.job_id, t)
    rebuilt = store_over(tables)
    job = rebuilt.job(trace.job_id)
    assert job is not None and flagged <= set(job.state.flagged)
    later = t + 3600.0  # a checkpoint with no new observation: only the evaluation writes
    rebuilt.evaluate(trace.job_id, later)
    commit(rebuilt, trace.job_id, later)
    again = store_over(copy_of(tables)).job(trace.job_id)
    assert again is not None
    assert flagged <= set(again.state.flagged), "the first checkpoint's flags were lost"


def test_models_are_retired_only_once_the_job_row_naming_the_new_one_is_acknowledged(trace: JobTrace) -> None:
    tables: Tables = ({}, {}, {})
    for t, store in checkpoints(trace, tables):
        job = store.job(trace.job_id)
        meta = store.meta(trace.job_id)
        assert job is not None and meta is not None
        version = job.model_version
        store.evaluate(trace.job_id, t)
        if job.model_version == version or version == 0:
            commit(store, trace.job_id, t)
            continue
        store.record_evaluation(t, job, meta)
        assert store.awaiting_acknowledgement(trace.job_id)
        assert len(tables[2]) == 2, "the model the durable row names is gone before its successor is"
        sent = store.unacknowledged()
        store.acknowledged(sent)
        assert not store.awaiting_acknowledgement(trace.job_id)
        assert list(tables[2]) == [model_key(trace.job_id, job.model_version)]
        return
    raise AssertionError("the synthetic job never refitted")


def test_held_records_are_released_only_by_their_jobs_task_row() -> None:
    """`hold` ties an input record to the job's unwritten changes: the job's next task row (or its
    drop) releases it, nothing else; a rebalance forgets it with the changes."""
    tables: Tables = ({}, {}, {})
    store = store_over(tables)
    for job_id in ("a", "b"):
        store.start(job_id, 10, ["x"], live=False)
        job = store.job(job_id)
        assert job is not None
        job.state.observe_running("t", np.array([1.0]), 0.0, 1.0, 0)
        store.put_task(job, "t")
        store.hold(job_id, ("in", 0, ord(job_id)))
    store.write_changes("b")
    assert store.holder(("in", 0, ord("b"))) is None and store.holder(("in", 0, ord("a"))) == "a"
    store.evaluate("a", 2.0)
    assert store.holder(("in", 0, ord("a"))) is None and len(tables[0]) == 2
    store.hold("a", ("in", 0, 1))
    store.drop("a")
    assert store.holder(("in", 0, 1)) is None
    store.hold("b", ("in", 0, 2))
    store.forget_cache()
    assert store.holder(("in", 0, 2)) is None
