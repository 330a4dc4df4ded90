"""`GroupCommit` alone, over an empty `JobStore`: when a commit is due and which records it hands out.

The order of its writes, and recovery from a kill at each step, are tested with the handler in
tests/test_agent_handler.py."""

from __future__ import annotations

import asyncio

from pipeline.group_commit import GroupCommit, InputRecord
from pipeline.jobstore import JobStore, new_online_job
from straggler.core.registry import make_method


def record(offset: int, partition: int = 0) -> InputRecord:
    return InputRecord(b"j", b"{}", "in", partition, offset)


def commits_at(now: list[float], waiting: set[int] | None = None) -> GroupCommit:
    """``waiting``: the offsets of partition 0 whose job has not started."""
    store = JobStore({}, {}, {}, make_job=new_online_job(lambda: make_method("nurd", 0), {}))
    pending = set() if waiting is None else waiting
    return GroupCommit(store, lambda: {("in", 0, o) for o in pending}, 0.5, lambda: now[0])


async def nothing() -> None:
    return None


def commit(commits: GroupCommit) -> list[int]:
    return [r.offset for r in asyncio.run(commits.commit(nothing))]


def test_a_commit_is_due_once_records_wait_for_it_and_the_interval_has_passed() -> None:
    now = [0.0]
    commits = commits_at(now)
    assert not commits.due(), "nothing to commit"
    commits.handled(record(1))
    assert commits.due(), "the first commit waits for nothing"
    assert commit(commits) == [1]
    commits.handled(record(2))
    now[0] = 0.4
    assert not commits.due()
    now[0] = 0.5
    assert commits.due()


def test_records_are_handed_out_in_the_order_handled_but_those_waiting_for_their_jobs_start() -> None:
    waiting = {2}
    commits = commits_at([0.0], waiting)
    for offset in (1, 2, 3):
        commits.handled(record(offset, partition=offset % 2))
    assert commit(commits) == [1, 3]
    assert commit(commits) == [], "still waiting"
    waiting.clear()
    commits.handled(record(4))
    assert commit(commits) == [2, 4]


def test_a_record_behind_one_waiting_for_its_jobs_start_waits_with_it() -> None:
    """Faust would commit the partition past the waiting record on the later one's acknowledgement."""
    waiting = {2}
    commits = commits_at([0.0], waiting)
    for offset in (1, 2, 3, 4):
        commits.handled(record(offset))
    commits.handled(record(5, partition=1))
    assert commit(commits) == [1, 5], "partition 0 from offset 2 waits; partition 1 does not"
    waiting.clear()
    assert commit(commits) == [2, 3, 4]


def test_records_released_are_never_handed_out_even_by_a_commit_under_way() -> None:
    commits = commits_at([0.0])
    commits.handled(record(1))
    commits.release_unacknowledged()
    assert commit(commits) == []

    commits.handled(record(2))

    async def rebalance() -> None:
        commits.release_unacknowledged()

    assert asyncio.run(commits.commit(rebalance)) == []
    commits.handled(record(3))
    assert commit(commits) == [3]
