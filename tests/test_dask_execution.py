"""The Dask executor's decisions (`straggler.core.execution.ExecutionBook`), without a cluster or a
broker: which commands are carried out, which are skipped and why, each id once, races and cost."""

from __future__ import annotations

import dataclasses
import math

import pytest

from schemas import RelaunchCommand, command_id
from schemas.events import Action
from straggler.core.execution import Copy, ExecutionBook, Kill, RaceTally, Relaunch, Skip


def order(action: Action, attempt: int | None = 0, *, task: str = "t1", key: int = 0) -> RelaunchCommand:
    return RelaunchCommand(
        command_id=command_id("j", task, action, key),
        job_id="j",
        task_id=task,
        action=action,
        reason="test",
        policy="speculate",
        issued_at=1.0,
        checkpoint_time=0.0,
        attempt=attempt,
    )


def book_with_task(copyable: bool = True) -> ExecutionBook:
    book = ExecutionBook()
    book.observe("j", "t1", copyable, {0: "live"}, at=0.0)
    return book


def test_duplicate_of_a_live_attempt_copies_it_as_the_next_attempt() -> None:
    assert book_with_task().decide(order("duplicate")) == Copy("j", "t1", 0, 1)


def test_a_command_id_is_applied_once() -> None:
    book = book_with_task()
    command = order("duplicate")
    book.mark_applied(command.command_id)
    decision = book.decide(command)
    assert isinstance(decision, Skip) and decision.kind == "applied"


@pytest.mark.parametrize("action", ["duplicate", "kill", "relaunch"])
def test_a_command_for_an_unknown_task_is_skipped(action: Action) -> None:
    decision = book_with_task().decide(order(action, task="nope"))
    assert isinstance(decision, Skip) and decision.kind == "unknown_task"


def test_a_finished_task_is_neither_copied_nor_relaunched() -> None:
    book = ExecutionBook()
    book.observe("j", "t1", True, {0: "finished"}, at=5.0)
    for action in ("duplicate", "relaunch"):
        decision = book.decide(order(action))
        assert isinstance(decision, Skip) and decision.kind == "finished_task"


def test_a_side_effecting_task_is_never_copied_nor_relaunched() -> None:
    book = book_with_task(copyable=False)
    for action in ("duplicate", "relaunch"):
        decision = book.decide(order(action))
        assert isinstance(decision, Skip) and decision.kind == "not_copyable"


def test_the_loser_is_killed_after_the_winner_finished() -> None:
    book = book_with_task()
    book.attempt_added("j", "t1", 1, at=10.0, copy_of=0)
    book.attempt_ended("j", "t1", 1, "finished", at=14.0)
    assert book.decide(order("kill", 0)) == Kill("j", "t1", 0)
    assert book.tally() == RaceTally(copies_won=1, copies_lost=0, extra_machine_seconds=4.0)


def test_the_last_live_attempt_of_an_unfinished_task_is_not_killed() -> None:
    decision = book_with_task().decide(order("kill", 0))
    assert isinstance(decision, Skip) and decision.kind == "last_attempt"


def test_an_ended_attempt_is_not_killed_again() -> None:
    book = book_with_task()
    book.attempt_added("j", "t1", 1, at=10.0, copy_of=0)
    book.attempt_ended("j", "t1", 0, "finished", at=12.0)
    book.attempt_ended("j", "t1", 1, "killed", at=13.0)
    decision = book.decide(order("kill", 1))
    assert isinstance(decision, Skip) and decision.kind == "ended_attempt"
    # the copy's run, until it was killed
    assert book.tally() == RaceTally(copies_won=0, copies_lost=1, extra_machine_seconds=3.0)


def test_relaunch_restarts_the_attempt_as_the_next_one() -> None:
    assert book_with_task().decide(order("relaunch", 0)) == Relaunch("j", "t1", 0, 1)


def test_a_copy_is_not_made_twice_under_another_command_id() -> None:
    book = book_with_task()
    book.attempt_added("j", "t1", 1, at=1.0)
    decision = book.decide(order("duplicate", 0, key=7))
    assert isinstance(decision, Skip) and decision.kind == "attempt_exists"


def test_without_an_attempt_the_command_acts_on_the_latest_live_one() -> None:
    book = book_with_task()
    book.attempt_added("j", "t1", 1, at=1.0)
    assert book.decide(order("duplicate", None)) == Copy("j", "t1", 1, 2)


def test_an_unknown_attempt_is_skipped() -> None:
    decision = book_with_task().decide(order("duplicate", 4))
    assert isinstance(decision, Skip) and decision.kind == "unknown_attempt"


def test_an_end_is_counted_once() -> None:
    book = book_with_task()
    book.attempt_added("j", "t1", 1, at=0.0, copy_of=0)
    book.attempt_ended("j", "t1", 1, "finished", at=2.0)
    book.attempt_ended("j", "t1", 1, "finished", at=9.0)
    book.observe("j", "t1", True, {0: "killed", 1: "finished"}, at=9.0)
    assert book.tally() == RaceTally(copies_won=1, copies_lost=0, extra_machine_seconds=2.0)
    task = book.task("j", "t1")
    assert task is not None and task.winner == 1 and task.live() == []


@pytest.mark.parametrize(("action", "kind"), [("duplicate", "finished_task"), ("kill", "ended_attempt")])
def test_a_task_dropped_with_its_job_is_skipped_and_its_copy_priced_until_then(
    action: Action, kind: str
) -> None:
    book = book_with_task()
    book.attempt_added("j", "t1", 1, at=2.0, copy_of=0)  # a copy, still running when the job ended
    book.dropped("j", "t1", at=5.0)
    decision = book.decide(order(action, attempt=1 if action == "kill" else 0))
    assert isinstance(decision, Skip) and decision.kind == kind
    assert book.tally().extra_machine_seconds == 3.0
    book.dropped("j", "nope", at=6.0)  # a task never seen: nothing to end
    assert book.tracked == 1


def test_a_copy_decided_before_the_attempts_current_run_began_is_skipped() -> None:
    """Dask ran the attempt again (its worker died) after the command was decided, at 0.0."""
    book = ExecutionBook()
    book.observe("j", "t1", True, {0: "live"}, at=0.0, run_started={0: 2.0})
    for action in ("duplicate", "relaunch"):
        decision = book.decide(order(action))
        assert isinstance(decision, Skip) and decision.kind == "restarted", action


def test_a_copy_of_an_attempt_whose_new_run_has_not_begun_is_skipped() -> None:
    """Dask runs the attempt again (its worker died), but the new run is still queued (`math.inf`):
    the command can only have been decided on the run that died."""
    book = ExecutionBook()
    book.observe("j", "t1", True, {0: "live"}, at=5.0, run_started={0: math.inf})
    decision = book.decide(dataclasses.replace(order("duplicate"), checkpoint_time=4.0))
    assert isinstance(decision, Skip) and decision.kind == "restarted"
    assert "has not begun its new run" in decision.reason
    book.observe("j", "t1", True, {0: "live"}, at=7.0, run_started={0: 6.0})  # it began at 6.0
    assert book.decide(dataclasses.replace(order("duplicate"), checkpoint_time=6.5)) == Copy("j", "t1", 0, 1)


def test_a_copy_decided_during_the_attempts_current_run_is_made() -> None:
    book = ExecutionBook()
    book.observe("j", "t1", True, {0: "live"}, at=0.0, run_started={0: -1.0})
    assert book.decide(order("duplicate")) == Copy("j", "t1", 0, 1)
    book.observe("j", "t1", True, {0: "live"}, at=1.0)  # a later look that cannot tell keeps what was known
    assert book.decide(order("relaunch")) == Relaunch("j", "t1", 0, 1)


def test_a_relaunch_is_no_race_and_its_run_is_extra_machine_time() -> None:
    book = book_with_task()
    book.attempt_ended("j", "t1", 0, "killed", at=3.0)
    book.attempt_added("j", "t1", 1, at=3.0)  # a relaunch: copies nothing
    book.attempt_ended("j", "t1", 1, "finished", at=8.0)
    assert book.tally() == RaceTally(copies_won=0, copies_lost=0, extra_machine_seconds=5.0)


def test_a_copy_of_a_relaunched_attempt_races_that_attempt_only() -> None:
    book = book_with_task()
    book.attempt_ended("j", "t1", 0, "killed", at=1.0)
    book.attempt_added("j", "t1", 1, at=1.0)
    book.attempt_added("j", "t1", 2, at=4.0, copy_of=1)
    book.attempt_ended("j", "t1", 1, "finished", at=6.0)  # the relaunched attempt beats its copy
    book.attempt_ended("j", "t1", 2, "killed", at=7.0)
    assert book.tally() == RaceTally(copies_won=0, copies_lost=1, extra_machine_seconds=5.0 + 3.0)
