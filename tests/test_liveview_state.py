"""The live view's fold (`consumers.liveview_state`), from hand-made events: no broker."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import ClientSession, web
from stream_events import prediction

from consumers.liveview import TopicReader, make_app
from consumers.liveview_state import KEEP_LETTERS, SORT_KEYS, LiveViewState
from schemas import (
    CheckpointEvaluated,
    Event,
    JobEvent,
    MitigationNote,
    Prediction,
    RelaunchCommand,
    TaskCheckpoint,
    command_id,
    dead_letter_for,
    decode_each,
    encode,
    prediction_batches,
)
from straggler.cli import build_parser
from straggler.kafka.names import TopicNames


def _task(
    task: str,
    t: float,
    status: str = "running",
    attempt: int = 0,
    job: str = "j",
    start: float = 0.0,
    machine: str = "m",
) -> TaskCheckpoint:
    return TaskCheckpoint(
        job_id=job,
        task_id=task,
        attempt=attempt,
        checkpoint_time=t,
        status=status,  # type: ignore[arg-type]
        machine_id=machine,
        features={},
        latency=t - start if status == "finished" else None,
        start_time=start,
    )


def _prediction(
    task: str, t: float, elapsed: float, latency: float | None, flag: bool = True, attempt: int = 0
) -> Prediction:
    return prediction(
        "j",
        task,
        t,
        flagged=flag,
        latency=latency,
        elapsed=elapsed,
        attempt=attempt,
        threshold=50.0,
        method="nurd",
        produced_at=0.0,
    )


def _command(task: str, action: str, t: float, attempt: int = 0) -> RelaunchCommand:
    return RelaunchCommand(
        command_id=command_id("j", task, action, t),
        job_id="j",
        task_id=task,
        action=action,  # type: ignore[arg-type]
        reason="test",
        policy="speculate",
        issued_at=0.0,
        checkpoint_time=t,
        attempt=attempt,
    )


def _job(state: LiveViewState, job: str = "j") -> dict[str, Any]:
    return next(row for row in state.summary()["jobs"] if row["job_id"] == job)


def _detail(state: LiveViewState, **query: Any) -> dict[str, Any]:
    detail = state.job_detail("j", **query)
    assert detail is not None
    json.dumps(detail, allow_nan=False)  # the page parses it with JSON.parse
    return detail


def _runs(state: LiveViewState, task: str) -> list[tuple[int, str, float | None, float | None, str]]:
    lane = next(lane for lane in _detail(state)["timeline"]["shown"] if lane["task"] == task)
    return [(r["attempt"], r["kind"], r["start"], r["end"], r["outcome"]) for r in lane["runs"]]


def test_progress_flags_and_commands_follow_the_events() -> None:
    state = LiveViewState()
    state.apply(JobEvent(job_id="j", event="started", time=0.0, expected_tasks=3))
    state.apply_all([_task("a", 10.0), _task("b", 10.0), _task("c", 10.0)])
    state.apply_all([_task("a", 12.0, "finished"), _task("b", 20.0), _task("c", 20.0)])
    predictions = [_prediction("b", 20.0, 20.0, 90.0), _prediction("c", 20.0, 20.0, 30.0, flag=False)]
    marker = CheckpointEvaluated(
        job_id="j",
        checkpoint_time=20.0,
        evaluated=2,
        flagged=1,
        model_version=1,
        boundary_produced_at=None,
        produced_at=0.0,
    )
    for record in prediction_batches(predictions, marker):  # as the worker writes them
        state.apply_all(decode_each(record))
    duplicate = _command("b", "duplicate", 20.0)
    state.apply_all([duplicate, duplicate])  # a redelivery counts once
    row = _job(state)
    assert (row["status"], row["finished"], row["expected"], row["running"]) == ("running", 1, 3, 2)
    assert (row["flagged"], row["commands"], row["copies"], row["jct"]) == (1, 1, 1, None)
    assert row["checkpoints_evaluated"] == 1 and row["elapsed"] == pytest.approx(20.0)
    totals = state.summary()["totals"]
    assert totals["commands"] == 1 and totals["predictions"] == 2 and totals["jobs_in_flight"] == 1
    assert state.summary()["ended"]["jobs"] == 0, "figures over ended jobs only"
    table = {r["task"]: r for r in _detail(state)["table"]["rows"]}
    assert (table["b"]["predicted"], table["b"]["flagged"], table["b"]["copy"]) == (90.0, True, "racing")
    assert (table["a"]["status"], table["a"]["elapsed"], table["a"]["attempts"]) == ("finished", 12.0, 1)
    assert (table["c"]["status"], table["c"]["flagged"], table["b"]["attempts"]) == ("running", False, 2)
    json.dumps(state.summary(), allow_nan=False)


def _race(copy_wins: bool, killed: bool = True) -> list[Event]:
    """Task b (start 0) is copied at 20; the winner finishes, the loser is killed at the next checkpoint
    (24). Task a finishes at 30 on its own."""
    events: list[Event] = [
        JobEvent(job_id="j", event="started", time=0.0, expected_tasks=2),
        _task("a", 10.0),
        _task("b", 10.0),
        _task("a", 30.0, "finished"),
        _prediction("b", 20.0, 20.0, 90.0),
        _task("b", 20.0),
        _command("b", "duplicate", 20.0),
    ]
    if copy_wins:
        events += [_task("b", 23.0, "finished", attempt=1, start=20.0)]
        events += [_command("b", "kill", 24.0, attempt=0)] if killed else []
    else:
        events += [_task("b", 22.0, "finished", attempt=0)]
        events += [_command("b", "kill", 24.0, attempt=1)] if killed else []
    return [*events, JobEvent(job_id="j", event="ended", time=32.0)]


def test_a_copy_that_wins_finishes_the_task_and_its_original_is_killed() -> None:
    state = LiveViewState()
    state.apply_all(_race(copy_wins=True))
    assert _runs(state, "b") == [(0, "original", 0.0, 24.0, "killed"), (1, "copy", 20.0, 23.0, "finished")]
    row = _job(state)
    assert (row["copies"], row["copies_won"], row["copies_lost"]) == (1, 1, 0)
    assert row["extra_machine_seconds"] == pytest.approx(23.0 - 20.0), "the copy's run; not the original's"
    assert row["jct"] == pytest.approx(30.0)
    b = next(r for r in _detail(state)["table"]["rows"] if r["task"] == "b")
    assert (b["status"], b["copy"], b["attempts"], b["elapsed"]) == ("finished", "won", 2, 23.0)


def test_a_copy_that_loses_is_killed_or_runs_on_until_the_job_ends() -> None:
    state = LiveViewState()
    state.apply_all(_race(copy_wins=False))
    assert _runs(state, "b") == [(0, "original", 0.0, 22.0, "finished"), (1, "copy", 20.0, 24.0, "killed")]
    assert (_job(state)["copies_lost"], _job(state)["extra_machine_seconds"]) == (1, pytest.approx(4.0))
    unkilled = LiveViewState()
    unkilled.apply_all(_race(copy_wins=False, killed=False))
    assert _runs(unkilled, "b")[1] == (1, "copy", 20.0, None, "lost")
    assert _job(unkilled)["extra_machine_seconds"] == pytest.approx(32.0 - 20.0), "counted to the job's end"


def test_the_order_records_of_different_topics_arrive_in_does_not_matter() -> None:
    forward, backward = LiveViewState(), LiveViewState()
    events = _race(copy_wins=True)
    forward.apply_all(events)
    backward.apply_all([events[0], *reversed(events[1:-1]), events[-1]])
    assert _detail(forward) == _detail(backward)
    assert forward.summary() == backward.summary()


def test_a_copy_the_cluster_ignores_is_not_counted() -> None:
    """A duplicate issued after the task finished, or a second one, starts no attempt."""
    state = LiveViewState()
    state.apply_all(
        [
            JobEvent(job_id="j", event="started", time=0.0, expected_tasks=2),
            _task("a", 8.0, "finished"),
            _command("a", "duplicate", 12.0),
            _task("b", 4.0),
            _command("b", "duplicate", 4.0),
            _command("b", "duplicate", 8.0),
            _task("b", 9.0, "finished"),
            JobEvent(job_id="j", event="ended", time=12.0),
        ]
    )
    row = _job(state)
    assert (row["commands"], row["copies"], row["copies_won"], row["copies_lost"]) == (3, 1, 0, 1)
    table = {r["task"]: r for r in _detail(state)["table"]["rows"]}
    assert (table["a"]["attempts"], table["a"]["copy"]) == (1, None)
    assert (table["b"]["attempts"], table["b"]["copy"]) == (2, "lost")


def test_a_relaunch_replaces_the_running_attempt() -> None:
    state = LiveViewState()
    state.apply_all(
        [
            JobEvent(job_id="j", event="started", time=0.0, expected_tasks=1),
            _task("b", 8.0),
            _command("b", "relaunch", 8.0),
            _task("b", 12.0, attempt=1, start=8.0),
            _task("b", 15.0, "finished", attempt=1, start=8.0),
            JobEvent(job_id="j", event="ended", time=16.0),
        ]
    )
    assert _runs(state, "b") == [
        (0, "original", 0.0, 8.0, "replaced"),
        (1, "relaunch", 8.0, 15.0, "finished"),
    ]
    row = _job(state)
    assert (row["copies"], row["extra_machine_seconds"], row["jct"]) == (0, pytest.approx(7.0), 15.0)


def _table_job() -> LiveViewState:
    """Five tasks: three finished (latencies 10, 30, 20), one running (flagged), one killed."""
    state = LiveViewState()
    state.apply(JobEvent(job_id="j", event="started", time=0.0, expected_tasks=5))
    state.apply_all(
        [
            _task("t1", 10.0, "finished", machine="m1"),
            _task("t2", 30.0, "finished", machine="m2"),
            _task("t3", 20.0, "finished", machine="m1"),
            _task("t4", 40.0, machine="m3"),
            _prediction("t4", 40.0, 40.0, 80.0),
            _task("t5", 5.0, "killed", machine="m2"),
        ]
    )
    return state


def test_the_task_table_sorts_by_each_column_with_missing_values_last() -> None:
    state = _table_job()

    def order(sort: str, descending: bool) -> list[str]:
        return [r["task"] for r in _detail(state, sort=sort, descending=descending)["table"]["rows"]]

    assert order("elapsed", True) == ["t4", "t2", "t3", "t1", "t5"]
    assert order("elapsed", False) == ["t5", "t1", "t3", "t2", "t4"]
    assert order("predicted", True) == ["t4", "t1", "t2", "t3", "t5"], "no prediction: last, in task order"
    assert order("predicted", False)[0] == "t4"
    assert order("machine", False) == ["t1", "t3", "t2", "t5", "t4"]
    assert order("task", True) == ["t5", "t4", "t3", "t2", "t1"]
    for key in SORT_KEYS:
        assert sorted(order(key, True)) == ["t1", "t2", "t3", "t4", "t5"], key
    with pytest.raises(ValueError, match="sort key"):
        state.job_detail("j", sort="nonsense")


def test_the_task_table_filters_by_status_and_name_and_caps_its_rows() -> None:
    state = _table_job()

    def shown(**query: Any) -> tuple[list[str], int]:
        table = _detail(state, sort="task", descending=False, **query)["table"]
        return [r["task"] for r in table["rows"]], table["matched"]

    assert shown(show="finished") == (["t1", "t2", "t3"], 3)
    assert shown(show="running") == (["t4"], 1)
    assert shown(show="flagged") == (["t4"], 1)
    assert shown(show="killed") == (["t5"], 1)
    assert shown(show="copied") == ([], 0)
    assert shown(search="M2") == (["t2", "t5"], 2), "case-insensitive, task or machine"
    assert shown(show="finished", search="m1") == (["t1", "t3"], 2)
    assert shown(limit=2) == (["t1", "t2"], 5), "matched counts the rows left out"
    assert _detail(state)["table"]["total"] == 5
    assert state.job_detail("nobody") is None


def test_quantiles_are_of_the_finished_tasks_only() -> None:
    quantiles = _detail(_table_job())["quantiles"]
    assert quantiles["n"] == 3 and quantiles["max"] == 30.0
    assert quantiles["p50"] == pytest.approx(20.0) and quantiles["p90"] == pytest.approx(28.0)
    assert _detail(_table_job())["timeline"]["lanes"] == 1, "only t4 (flagged) has a lane"


def test_ended_jobs_figures_are_summed_and_kept_when_the_job_is_dropped() -> None:
    state = LiveViewState()
    state.apply_all(_race(copy_wins=True))
    state.apply_all(
        [
            JobEvent(job_id="k", event="started", time=100.0, expected_tasks=1),
            _task("x", 150.0, "finished", job="k", start=100.0),
            JobEvent(job_id="k", event="ended", time=150.0),
        ]
    )
    ended = state.summary()["ended"]
    assert (ended["jobs"], ended["copies"], ended["copies_won"]) == (2, 1, 1)
    assert ended["mean_jct"] == pytest.approx((30.0 + 50.0) / 2)
    state.keep_ended = 0
    state.apply(JobEvent(job_id="k2", event="ended", time=170.0))
    summary = state.summary()
    assert summary["jobs"] == []
    assert summary["ended"]["jobs"] == 3 and summary["totals"]["jobs_ended"] == 3
    assert summary["ended"]["mean_jct"] == pytest.approx(40.0), "a job with no finish has no JCT"
    assert summary["ended"]["extra_machine_seconds"] == pytest.approx(3.0)
    assert summary["totals"]["flagged_tasks"] == 1
    state.apply(_task("a", 80.0, job="j"))  # a late event of a dropped job does not bring it back
    assert state.summary()["jobs"] == []


def test_records_round_trip_through_the_codec() -> None:
    state = LiveViewState()
    for event in (JobEvent(job_id="j", event="started", time=0.0, expected_tasks=1), _task("a", 5.0)):
        state.apply_all(decode_each(encode(event)))
    assert _job(state)["running"] == 1


def test_the_service_serves_a_self_contained_page_the_summary_and_a_job() -> None:
    """The aiohttp app around the fold (no broker: the reader is never started)."""
    reader = TopicReader("127.0.0.1:1", TopicNames("t."), LiveViewState())
    reader.state = _table_job()

    async def fetch() -> tuple[str, dict[str, tuple[int, Any]]]:
        runner = web.AppRunner(make_app(reader))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        answers: dict[str, tuple[int, Any]] = {}
        try:
            async with ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/") as response:
                    page = await response.text()
                for path in (
                    "/api/summary",
                    "/api/job/j?sort=elapsed&order=asc&show=finished&limit=2",
                    "/api/job/j?q=m2",
                    "/api/job/nobody",
                    "/api/job/j?sort=nonsense",
                    "/api/job/j?limit=x",
                ):
                    async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                        answers[path] = (response.status, await response.json())
            return page, answers
        finally:
            await runner.cleanup()

    page, answers = asyncio.run(fetch())
    assert "/api/summary" in page and "/api/job/" in page and "<script>" in page
    external = re.search(r"""(src|href)\s*=\s*["']|https?://|@import""", page)
    assert external is None, "no external asset: works offline"
    status, summary = answers["/api/summary"]
    assert status == 200 and [(row["job_id"], row["expected"]) for row in summary["jobs"]] == [("j", 5)]
    assert summary["reader"] == {"records": 0, "assigned": False}
    status, job = answers["/api/job/j?sort=elapsed&order=asc&show=finished&limit=2"]
    assert status == 200 and [r["task"] for r in job["table"]["rows"]] == ["t1", "t3"]
    assert job["table"]["matched"] == 3 and not job["table"]["descending"]
    assert [r["task"] for r in answers["/api/job/j?q=m2"][1]["table"]["rows"]] == ["t2", "t5"]
    assert answers["/api/job/nobody"][0] == 404
    assert answers["/api/job/j?sort=nonsense"][0] == 400 and answers["/api/job/j?limit=x"][0] == 400


def test_compose_serves_the_view_on_the_host_loopback_only() -> None:
    compose = yaml.safe_load((Path(__file__).resolve().parents[1] / "compose.yaml").read_text())
    service = compose["services"]["view"]
    args = build_parser().parse_args(service["command"][1:])
    assert args.func.__module__ == "consumers.liveview"
    assert service["ports"] == [f"127.0.0.1:{args.port}:{args.port}"]


def test_a_job_the_agent_closed_as_abandoned_shows_as_abandoned_with_its_reason() -> None:
    state = LiveViewState()
    reason = "abandoned: no report for 301 s (limit 300 s), since 2026-11-28 12:00:30.0 UTC"
    state.apply_all(
        [
            JobEvent(job_id="j", event="started", time=0.0, expected_tasks=3),
            _task("a", 10.0),
            JobEvent(job_id="j", event="ended", time=10.0, reason=reason),
        ]
    )
    row = _job(state)
    assert (row["status"], row["abandoned"], row["running"]) == ("abandoned", reason, 0)
    assert state.summary()["totals"]["jobs_in_flight"] == 0
    assert _detail(state)["table"]["rows"][0]["status"] == "unfinished"
    state.apply(JobEvent(job_id="k", event="started", time=0.0, expected_tasks=1))
    state.apply(JobEvent(job_id="k", event="ended", time=5.0))
    assert (_job(state, "k")["status"], _job(state, "k")["abandoned"]) == ("ended", None)


def test_a_job_never_started_waits_and_leaves_the_view_once_its_records_are_dead_lettered() -> None:
    state = LiveViewState()
    state.apply(_task("a", 10.0, job="ghost's"))
    assert _job(state, "ghost's")["status"] == "waiting"
    letter = dead_letter_for(
        b"{}",
        "task-checkpoints",
        0,
        7,
        "event for unknown job \"ghost's\": no job_event 'started' within 30s",
        stage="agent",
    )
    other = dead_letter_for(b"{}", "task-checkpoints", 0, 8, "event for unknown job 'j': ...", stage="agent")
    state.apply_all(decode_each(encode(other)))
    assert _job(state, "ghost's")["status"] == "waiting"
    state.apply_all(decode_each(encode(letter)))
    assert all(row["job_id"] != "ghost's" for row in state.summary()["jobs"])
    assert state.summary()["totals"]["dead_letters"] == 2
    started = LiveViewState()
    started.apply_all([JobEvent(job_id="j", event="started", time=0.0, expected_tasks=1), _task("a", 1.0)])
    late = "event for unknown job 'j': no job_event 'started' within 30s"  # a late record of an ended job
    started.apply(dead_letter_for(b"{}", "task-checkpoints", 0, 9, late, stage="agent"))
    assert _job(started)["status"] == "running", "a started job is never removed by a letter"


def test_a_jobs_page_lists_its_commands_with_reasons_and_says_why_a_flagged_task_has_no_copy() -> None:
    state = LiveViewState()
    events = [e for e in _race(copy_wins=True) if not (isinstance(e, JobEvent) and e.event == "ended")]
    why = "no copy: its expected saving is not worth its machine time at price 8 (p = 0.62)"
    note = MitigationNote(
        job_id="j",
        task_id="c",
        attempt=0,
        checkpoint_time=20.0,
        kind="price",
        reason=why,
        policy="speculate",
        issued_at=1.7e9,
        straggle_probability=0.62,
    )
    state.apply_all([*events, _task("c", 20.0), _prediction("c", 20.0, 20.0, 90.0), note])
    state.apply_all(decode_each(encode(note)))  # read again: changes nothing
    detail = _detail(state)
    assert [(c["action"], c["task"], c["reason"]) for c in detail["commands"]] == [
        ("kill", "b", "test"),
        ("duplicate", "b", "test"),
    ], "newest first, each with its reason"
    rows = {r["task"]: r for r in detail["table"]["rows"]}
    assert rows["c"]["why"] == why and rows["c"]["flagged"] and rows["c"]["copy"] is None
    assert rows["b"]["why"] is None and rows["a"]["why"] is None
    state.apply(_task("c", 40.0, "finished"))
    assert {r["task"]: r for r in _detail(state)["table"]["rows"]}["c"]["why"] == why, (
        "still said once it ended"
    )
    state.apply(_command("c", "duplicate", 30.0))
    assert {r["task"]: r for r in _detail(state)["table"]["rows"]}["c"]["why"] is None, "copied after all"


def test_dead_letters_are_listed_newest_first_with_their_source_and_reason() -> None:
    state = LiveViewState()
    for offset in range(KEEP_LETTERS + 5):
        letter = dead_letter_for(
            b"x", "task-checkpoints", 3, offset, f"bad {offset}", failed_at=1.7e9 + offset, stage="agent"
        )
        state.apply_all(decode_each(encode(letter)))
    listed = state.summary()["dead_letters"]
    assert len(listed) == KEEP_LETTERS and state.summary()["totals"]["dead_letters"] == KEEP_LETTERS + 5
    newest = KEEP_LETTERS + 4
    assert listed[0] == {
        "failed_at": 1.7e9 + newest,
        "stage": "agent",
        "source": f"task-checkpoints[3]@{newest}",
        "reason": f"bad {newest}",
    }
    assert [d["failed_at"] for d in listed] == sorted((d["failed_at"] for d in listed), reverse=True)
