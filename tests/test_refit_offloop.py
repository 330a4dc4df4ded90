"""Refits off the event loop, without a broker: the handler hands a checkpoint's refit to the worker
(`RunRefit`), the job waits for it while other jobs go on, and `refit_done` concludes it.

The worker's thread is a deferred fake: a test decides when each refit runs and is concluded.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from job_steps import each_checkpoint
from test_agent_handler import (
    Worker,
    boundary,
    ended,
    evaluations,
    finished,
    letters,
    running,
    some_finished,
    started,
)

from pipeline.handler import Action, RunRefit, SendPredictionPart, resume
from straggler.core.online import OnlineJob
from straggler.core.registry import make_method
from straggler.simulation import JobSimulation, observe_step, steps
from straggler.traces.synthetic import generate_jobs

A, B = "a", "d"  # on different partitions


class OffLoopWorker(Worker):
    """`Worker` whose handler hands refits out; they run when the test says (`complete`)."""

    def __init__(self, offload: bool = True, inline_refit_below: int = 0) -> None:
        super().__init__()
        self.handler.offload_refits = offload
        self.handler.inline_refit_below = inline_refit_below
        self.refits: list[RunRefit] = []
        self.actions: list[Action] = []

    def feed(self, event: Any) -> list[Action]:
        return self._seen(self.event(event))

    def _seen(self, actions: list[Action]) -> list[Action]:
        self.refits += [a for a in actions if isinstance(a, RunRefit)]
        self.actions += actions
        return actions

    def complete(self, refit: RunRefit, error: BaseException | None = None) -> list[Action]:
        """Run ``refit`` (unless ``error`` says it failed), then conclude it, as the worker does."""
        self.refits.remove(refit)
        if error is None:
            refit.fit()
        actions: list[Action] = []

        async def collect(action: Action) -> None:
            actions.append(action)

        asyncio.run(resume(self.handler, self.handler.refit_done(refit, error), collect))
        return self._seen(actions)

    def pending_refit(self, job_id: str) -> RunRefit:
        (refit,) = [r for r in self.refits if r.job_id == job_id]
        return refit


def parts_of(actions: list[Action], job_id: str) -> list[bytes]:
    return [a.value for a in actions if isinstance(a, SendPredictionPart) and a.key == job_id.encode()]


def first_checkpoint(worker: OffLoopWorker, job_id: str) -> RunRefit:
    """Start ``job_id`` and send its first boundary, which refits: the refit it hands out."""
    for event in [started(job_id), *some_finished(job_id), running("r", 10.0, job_id)]:
        worker.feed(event)
    assert worker.feed(boundary(10.0, job_id)) == [worker.pending_refit(job_id)]
    return worker.pending_refit(job_id)


def test_other_jobs_records_are_handled_and_predicted_while_a_refit_runs() -> None:
    worker = OffLoopWorker()
    worker.complete(first_checkpoint(worker, B))  # B is fitted: its next boundary needs no refit
    first_checkpoint(worker, A)

    worker.feed(running("r2", 15.0, B))
    ((verdicts, marker),) = evaluations(worker.feed(boundary(20.0, B)))

    assert marker.job_id == B and {p.task_id for p in verdicts} == {"r", "r2"}
    job_b = worker.store.job(B)
    assert job_b is not None and "r2" in job_b.state.tasks
    assert worker.refits == [worker.pending_refit(A)]


def interleaved_jobs() -> list[Any]:
    """Two jobs' events, interleaved, with refits at several checkpoints and an end."""

    def job(job_id: str, shift: float) -> list[Any]:
        return [
            started(job_id),
            *some_finished(job_id),
            *(running(f"r{i}", 9.0 + i * shift, job_id) for i in range(4)),
            boundary(10.0, job_id),
            running("r4", 11.0, job_id),
            finished("r0", 11.5 + shift, job_id),
            boundary(20.0, job_id),  # 5 finished >= 4 * 1.25: a refit
            finished("r1", 21.0, job_id),
            running("r5", 22.0 + shift, job_id),
            boundary(30.0, job_id),  # no refit
            finished("r2", 31.0 + shift, job_id),
            finished("r3", 32.0, job_id),
            ended(40.0, job_id),
            boundary(40.0, job_id),  # a refit, then the job is dropped
        ]

    a, b = job(A, 0.5), job(B, 0.25)
    return [event for pair in zip(a, b, strict=True) for event in pair]


@pytest.mark.parametrize(("delay", "inline_below"), [(0, 0), (1, 0), (3, 0), (None, 0), (2, 5)])
def test_decisions_after_refit_done_are_the_inline_paths(delay: int | None, inline_below: int) -> None:
    """Each refit concluded ``delay`` records after it was handed out (None: once the input ends);
    ``inline_below``: smaller refits run in `handle` (the cut-off changes no decision)."""
    inline = OffLoopWorker(offload=False)
    for event in interleaved_jobs():
        assert not [a for a in inline.feed(event) if isinstance(a, RunRefit)]

    worker = OffLoopWorker(inline_refit_below=inline_below)
    started_at: dict[int, int] = {}
    handed_out = 0
    for n, event in enumerate(interleaved_jobs()):
        worker.feed(event)
        for refit in worker.refits:
            started_at.setdefault(id(refit), n)
        for refit in list(worker.refits):
            if delay is not None and n - started_at[id(refit)] >= delay:
                worker.complete(refit)
                handed_out += 1
    while worker.refits:
        worker.complete(worker.refits[0])
        handed_out += 1

    assert handed_out == (4 if inline_below else 6)  # two jobs, three refits each (the first two: 4 tasks)
    for job_id in (A, B):
        assert parts_of(worker.actions, job_id) == parts_of(inline.actions, job_id)
        assert (
            len(evaluations([a for a in inline.actions if getattr(a, "key", None) == job_id.encode()])) == 4
        )
    assert worker.tables == inline.tables == ({}, {}, {})  # both jobs ended and were dropped
    assert worker.handler.stats == inline.handler.stats


def test_a_jobs_records_during_its_refit_are_applied_after_it_in_order_and_acked_once_written() -> None:
    worker = OffLoopWorker()
    refit = first_checkpoint(worker, A)
    assert [r.offset for r in worker.handler.take_acks()] == [1, 2, 3, 4, 5, 6]  # the boundary (7) waits
    offsets = [worker.offset + 1 + i for i in range(3)]
    for event in (running("x", 15.0, A), boundary(20.0, A), running("late", 21.0, A)):
        assert worker.feed(event) == []

    job = worker.store.job(A)
    assert job is not None and set(job.state.tasks) == {"f0", "f1", "f2", "f3", "r"}
    assert worker.handler.take_acks() == []
    actions = worker.complete(refit)

    (first, second) = evaluations(actions)
    assert [p.task_id for p in first[0]] == ["r"] and first[1].checkpoint_time == 10.0
    assert sorted(p.task_id for p in second[0]) == ["r", "x"]  # x came before boundary 20, late after
    assert set(job.state.tasks) == {"f0", "f1", "f2", "f3", "r", "x", "late"}
    rows = b"".join(worker.tables[0].values())
    assert b'"x"' in rows and b'"late"' not in rows
    assert [r.offset for r in worker.handler.take_acks()] == [7, *offsets[:2]]  # late: not written yet
    worker.now = 10.0  # the input paused: held changes are written
    for job_id, _ in worker.handler.overdue():
        worker.handler.write_held(job_id)
    assert [r.offset for r in worker.handler.take_acks()] == offsets[2:]


def test_let_go_gives_up_a_pending_refits_records_and_its_late_completion_is_discarded() -> None:
    worker = OffLoopWorker()
    refit = first_checkpoint(worker, A)
    worker.handler.take_acks()
    worker.feed(running("x", 15.0, A))
    waiting = {refit.record.offset, worker.offset}

    given_up = {r.offset for r in worker.handler.let_go()}

    assert given_up == waiting
    worker.store.forget_cache()  # as the worker does when partitions are revoked
    tables = tuple(dict(t) for t in worker.tables)
    (again,) = worker.feed(boundary(10.0, A))  # the partition came back: its boundary is read again
    assert isinstance(again, RunRefit) and again is not refit
    assert worker.complete(refit) == [], "a refit of a job let go concludes nothing"
    assert worker.tables == tables
    ((verdicts, marker),) = evaluations(worker.complete(again))
    assert marker.checkpoint_time == 10.0 and [p.task_id for p in verdicts] == ["r"]


def test_a_failed_refit_dead_letters_its_boundary_and_the_job_goes_on() -> None:
    worker = OffLoopWorker()
    refit = first_checkpoint(worker, A)
    worker.feed(running("x", 15.0, A))

    actions = worker.complete(refit, RuntimeError("xgboost said no"))

    (letter,) = letters(actions)
    assert letter.error == "internal error: RuntimeError: xgboost said no"
    assert letter.source_offset == refit.record.offset
    assert not evaluations(actions)
    job = worker.store.job(A)
    assert job is not None and "x" in job.state.tasks and job.model_version == 0
    assert refit.record.offset in {r.offset for r in worker.handler.take_acks()}  # letter sent: done
    assert worker.feed(boundary(20.0, A)) == [worker.pending_refit(A)]  # refitted at the next one


def test_checkpoint_is_its_three_steps_with_the_fit_in_another_thread() -> None:
    """`OnlineJob.checkpoint` = `begin_checkpoint`, `CheckpointPlan.fit`, `end_checkpoint`, also with
    the fit on a thread while another job checkpoints on this one."""
    (trace,) = generate_jobs(1, seed=3, min_tasks=150, max_tasks=150, checkpoint_seconds=60)

    def new_job() -> OnlineJob:
        return OnlineJob("j", make_method("nurd", 0), len(trace.feature_names), trace.expected_tasks)

    whole = new_job()
    expected = [(repr(decisions), whole.model_version) for decisions, _ in each_checkpoint(whole, trace)]
    stepped, beside = new_job(), each_checkpoint(new_job(), trace)
    sim = JobSimulation(trace, seed=0)
    got = []
    with ThreadPoolExecutor(max_workers=1) as thread:
        for step in steps(sim, None):
            observe_step(stepped.state, sim, step)
            plan = stepped.begin_checkpoint(step[1])
            fitted = thread.submit(plan.fit)
            next(beside)  # the other job's checkpoint meanwhile
            fitted.result()
            got.append((repr(stepped.end_checkpoint(plan)), stepped.model_version))

    assert got == expected
    assert len({version for _, version in got}) > 2 and any(d != "[]" for d, _ in got)
