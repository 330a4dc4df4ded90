"""`CommitOrder` alone, over a `JobStore` of plain dicts: which input records may be acknowledged,
and the order of a checkpoint's writes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pipeline.commit_order import ACKNOWLEDGE, CommitOrder, InputRecord
from pipeline.jobstore import JobMeta, JobStore, new_online_job
from straggler.core.online import Decision
from straggler.core.registry import make_method


def store_with_job(job_id: str = "j") -> tuple[JobStore, dict[bytes, bytes]]:
    """A store with one started job; its ``jobs`` table."""
    jobs: dict[bytes, bytes] = {}
    store = JobStore({}, jobs, {}, make_job=new_online_job(lambda: make_method("nurd", 0), {}))
    store.start(job_id, 10, ["x"], live=False)
    return store, jobs


def change(store: JobStore, record: InputRecord, job_id: str = "j") -> None:
    """``record`` changes a task of the job (not written yet), as the handler applies one."""
    job = store.job(job_id)
    assert job is not None
    job.state.observe_running(f"t{record.offset}", np.array([1.0]), 0.0, 1.0, 0)
    store.put_task(job, f"t{record.offset}")
    store.hold(job_id, record.position)


def handle(commits: CommitOrder, partition: int, offset: int) -> InputRecord:
    record = InputRecord(b"j", b"{}", "in", partition, offset)
    commits.received(record)
    assert commits.handled(record)
    return record


def offsets(records: list[InputRecord]) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in records]


def test_records_are_acknowledged_in_offset_order_once_their_jobs_changes_are_written() -> None:
    store, _ = store_with_job()
    commits = CommitOrder(store)
    first = handle(commits, 0, 1)
    change(store, first)
    handle(commits, 0, 2)  # changed nothing, but comes after a record that waits
    handle(commits, 1, 1)

    assert offsets(commits.acknowledgeable()) == [(1, 1)]
    store.write_changes("j")
    assert offsets(commits.acknowledgeable()) == [(0, 1), (0, 2)]


def test_a_record_waiting_for_its_jobs_start_is_not_acknowledged() -> None:
    store, _ = store_with_job()
    waiting = {("in", 0, 1)}
    commits = CommitOrder(store, waits_for_start=lambda position: "k" if position in waiting else None)
    handle(commits, 0, 1)
    assert commits.acknowledgeable() == []
    waiting.clear()
    assert offsets(commits.acknowledgeable()) == [(0, 1)]


def test_records_let_go_are_never_acknowledged_nor_the_one_in_hand() -> None:
    store, _ = store_with_job()
    commits = CommitOrder(store)
    change(store, handle(commits, 0, 1))
    in_hand = InputRecord(b"j", b"{}", "in", 0, 2)
    commits.received(in_hand)

    assert offsets(commits.let_go()) == [(0, 1)]
    assert not commits.handled(in_hand), "its partition moved while it was handled: give it up"
    assert commits.acknowledgeable() == []


def test_a_job_holding_a_record_too_long_is_written_within_that_records_partition() -> None:
    store, _ = store_with_job()
    now = 0.0
    commits = CommitOrder(store, clock=lambda: now)
    held = handle(commits, 3, 1)
    change(store, held)
    now = commits.idle_seconds / 2
    handle(commits, 3, 2)  # records still coming: not overdue before the hold
    assert commits.overdue() == {}
    now = commits.hold_seconds

    assert commits.overdue() == {"j": held}
    assert list(commits.write_overdue(3)) == []  # no job row to wait for
    assert offsets(commits.acknowledgeable()) == [(3, 1), (3, 2)]


def test_a_checkpoint_writes_its_job_row_only_after_its_model_and_predictions_are_on_the_broker() -> None:
    store, jobs = store_with_job()
    job, meta = store.job("j"), store.meta("j")
    assert job is not None and meta is not None
    store.record_evaluation(1.0, job, meta)  # the previous checkpoint, its job row not acknowledged yet
    commits = CommitOrder(store)
    seen: list[str] = []

    def committed() -> float | None:
        return JobMeta.decode(jobs[b"j"]).last_evaluated

    def evaluate() -> list[Decision]:
        seen.append("2 evaluate")
        return []

    def publish(decisions: list[Decision]) -> Iterator[str]:
        seen.append("3 publish")
        yield "prediction"

    steps = commits.checkpoint("j", 2.0, evaluate, publish)
    for action in steps:
        seen.append(f"{action!r} while the job row says {committed()}")

    assert seen == [
        f"{ACKNOWLEDGE!r} while the job row says 1.0",  # 1: the previous job row is on the broker
        "2 evaluate",
        "3 publish",
        "'prediction' while the job row says 1.0",
        f"{ACKNOWLEDGE!r} while the job row says 1.0",  # 4: model and predictions on the broker
    ]
    assert committed() == 2.0 and store.awaiting_acknowledgement("j")  # 5, and 6 to come


def test_a_checkpoint_whose_flush_fails_is_not_committed() -> None:
    store, jobs = store_with_job()
    commits = CommitOrder(store)
    steps = commits.checkpoint("j", 2.0, lambda: [], lambda decisions: iter(()))
    assert next(steps) == ACKNOWLEDGE
    with pytest.raises(RuntimeError):
        steps.throw(RuntimeError("the broker did not acknowledge"))
    assert JobMeta.decode(jobs[b"j"]).last_evaluated is None
