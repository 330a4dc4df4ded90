"""A job rebuilt from whatever part of a commit's writes survived decides as if nothing happened.

The worker-kill fault test (tests/test_faults.py) shows this end to end, but a kill lands at a random
moment; here each cut between the writes of a commit is made on purpose, on plain dicts standing in
for the three tables (tests/test_agent_handler.py cuts each commit step with the records read again).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    """Feed the job's task events through a store, commit them (as a group commit between the
    records and the boundary would) and yield before each checkpoint is evaluated."""
    store = store_over(tables)
    store.start(trace.job_id, trace.expected_tasks, list(trace.feature_names), live=False)
    sim = JobSimulation(trace, seed=0)
    for step in steps(sim, None):
        t = step.at
        job = store.job(trace.job_id)
        assert job is not None
        observe_step(job.state, sim, step)
        store.put_tasks(job, job.state.tasks)
        commit(store)
        yield t, store


def commit(store: JobStore) -> None:
    """A group commit's writes (`GroupCommit.commit`), each acknowledged at once."""
    written = store.write_job_rows()
    store.write_task_rows()
    store.retire_models(written)


def cut_at_refit_with_flags(trace: JobTrace) -> tuple[Tables, Tables, float, list[Decision]]:
    """Run the job to its first checkpoint that refits *and* flags; return the tables as they were
    before the commit after that checkpoint (the cut), as they are after it, its time and decisions."""
    tables: Tables = ({}, {}, {})
    for t, store in checkpoints(trace, tables):
        version = store.job(trace.job_id).model_version  # type: ignore[union-attr]
        decisions = store.evaluate(trace.job_id, t)
        refitted = store.job(trace.job_id).model_version != version  # type: ignore[union-attr]
        if refitted and version > 0 and any(d.is_straggler for d in decisions):
            cut = copy_of(tables)
            commit(store)
            return cut, tables, t, decisions
        commit(store)
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
        commit(store)
        assert len(tables[2]) <= 1, "a superseded model outlived the job row that replaced it"
        flags += sum(d.is_straggler for d in expected)
        evaluated += bool(expected)
    assert evaluated >= 5 and flags > 0


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
        commit(store)
    raise AssertionError("the synthetic job never flagged a task")


def test_a_checkpoints_flags_ride_in_the_job_row_until_a_task_row_carries_them(trace: JobTrace) -> None:
    """Killed between a commit's job rows and its task rows, a rebuilt job still has the flags."""
    _, tables, store, _, flagged = first_checkpoint_with_flags(trace)
    store.write_job_rows()  # step 2; not step 3
    meta = store.meta(trace.job_id)
    assert meta is not None and set(meta.checkpoint_flags) == flagged
    job = store_over(copy_of(tables)).job(trace.job_id)
    assert job is not None and flagged <= set(job.state.flagged)
    store.write_task_rows()
    assert meta.checkpoint_flags == {}, "a task row carries them now"


def test_flags_only_in_the_job_row_survive_a_rebuild_and_later_checkpoints(trace: JobTrace) -> None:
    """A worker rebuilt from a job row whose task row was lost gets the flags from the job row; they
    must reach a task row before a later job row (which names only the flags since) replaces them."""
    _, tables, store, t, flagged = first_checkpoint_with_flags(trace)
    store.write_job_rows()
    rebuilt = store_over(tables)
    job = rebuilt.job(trace.job_id)
    assert job is not None and flagged <= set(job.state.flagged)
    later = t + 3600.0  # a checkpoint with no new observation
    rebuilt.evaluate(trace.job_id, later)
    commit(rebuilt)
    again = store_over(copy_of(tables)).job(trace.job_id)
    assert again is not None
    assert flagged <= set(again.state.flagged), "the first checkpoint's flags were lost"


def test_models_are_retired_only_once_the_job_row_naming_the_new_one_is_written(trace: JobTrace) -> None:
    tables: Tables = ({}, {}, {})
    for t, store in checkpoints(trace, tables):
        job = store.job(trace.job_id)
        assert job is not None
        version = job.model_version
        store.evaluate(trace.job_id, t)
        if job.model_version == version or version == 0:
            commit(store)
            continue
        assert len(tables[2]) == 2, "the model the durable row names is gone before its successor is"
        written = store.write_job_rows()
        assert len(tables[2]) == 2
        store.retire_models(written)
        assert list(tables[2]) == [model_key(trace.job_id, job.model_version)]
        return
    raise AssertionError("the synthetic job never refitted")


def test_a_dropped_job_is_unknown_at_once_and_its_rows_are_deleted_by_the_next_commit(
    trace: JobTrace,
) -> None:
    """Deleted but for a closed job row, which remembers the job's end (`JobMeta.closed_at`)."""
    tables: Tables = ({}, {}, {})
    for t, store in checkpoints(trace, tables):
        if store.evaluate(trace.job_id, t):
            commit(store)
            break
    assert all(tables)
    store.drop(trace.job_id, ended_at=t, now=1.7e9)
    assert store.meta(trace.job_id) is None and store.job(trace.job_id) is None
    assert store.closed_end(trace.job_id) == t
    assert all(tables), "deleted before the commit"
    commit(store)
    tasks, jobs, models = tables
    assert not tasks and not models and list(jobs) == [trace.job_id.encode()]
    assert store.closed_end(trace.job_id) == t and store.peek_meta(trace.job_id) is None
    assert store.held_jobs() == [trace.job_id] and store.open_jobs() == 0


def test_a_job_peeked_while_its_tables_fill_is_not_what_the_agent_then_loads(trace: JobTrace) -> None:
    """The ADMM round timer reads jobs beside the agent, also while a recovery is still writing the
    changelog's rows into the tables. What it reads must not stay behind as the agent's cached truth:
    once the tables are whole, the agent's job has every task."""
    tables: Tables = ({}, {}, {})
    for _, store in checkpoints(trace, tables):
        if len(store.job(trace.job_id).state.tasks) == trace.n_tasks:  # type: ignore[union-attr]
            break
    tasks, jobs, models = tables
    assert len([k for k in tasks if k.startswith(trace.job_id.encode())]) >= 2, "one task row: no half-way"
    half = dict(sorted(tasks.items())[: len(tasks) // 2])  # a recovery half-way through the changelog
    filling = (half, dict(jobs), dict(models))
    reader = store_over(filling)
    peeked = reader.peek(trace.job_id)
    assert peeked is not None and len(peeked.state.tasks) < trace.n_tasks
    filling[0].update(tasks)  # the recovery ends
    loaded = reader.job(trace.job_id)
    assert loaded is not None and len(loaded.state.tasks) == trace.n_tasks
    assert reader.peek(trace.job_id) is loaded, "a cached job is what a reader sees"
