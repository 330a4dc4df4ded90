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
from consumers.liveview_state import LiveViewState
from schemas import (
    CheckpointEvaluated,
    JobEvent,
    Prediction,
    RelaunchCommand,
    TaskCheckpoint,
    command_id,
    decode_each,
    encode,
    prediction_batches,
)
from straggler.cli import build_parser
from straggler.kafka.names import TopicNames


def _task(task: str, t: float, status: str = "running", attempt: int = 0, job: str = "j") -> TaskCheckpoint:
    return TaskCheckpoint(
        job_id=job,
        task_id=task,
        attempt=attempt,
        checkpoint_time=t,
        status=status,  # type: ignore[arg-type]
        machine_id="m",
        features={},
        latency=t if status == "finished" else None,
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
    assert row["flagged"] == ["b"]
    assert [(c["action"], c["task_id"]) for c in row["commands"]] == [("duplicate", "b")]
    assert row["checkpoints_evaluated"] == 1 and row["saving"] is None
    totals = state.summary()["totals"]
    assert totals["commands"] == 1 and totals["predictions"] == 2 and totals["jobs_in_flight"] == 1
    json.dumps(state.summary(), allow_nan=False)  # the page parses it with JSON.parse


def _ended_job(copy_wins: bool, latency: float | None = 90.0) -> LiveViewState:
    """Task b is flagged at 20 (elapsed 20, predicted latency 90: it would end at 90) and copied."""
    state = LiveViewState()
    state.apply(JobEvent(job_id="j", event="started", time=0.0, expected_tasks=2))
    state.apply_all([_task("a", 30.0, "finished"), _prediction("b", 20.0, 20.0, latency)])
    state.apply(_command("b", "duplicate", 20.0))
    if copy_wins:
        state.apply_all([_task("b", 45.0, "finished", attempt=1), _command("b", "kill", 45.0)])
    else:
        state.apply(_task("b", 60.0, "finished", attempt=0))
    state.apply(JobEvent(job_id="j", event="ended", time=60.0))
    return state


def test_saving_uses_the_predicted_end_of_a_replaced_attempt() -> None:
    saving = _job(_ended_job(copy_wins=True))["saving"]
    assert saving["seconds"] == pytest.approx(90.0 - 45.0)
    assert saving["jct_observed"] == pytest.approx(45.0)
    assert saving["share"] == pytest.approx(45.0 / 90.0)
    assert _ended_job(copy_wins=True).summary()["totals"]["saved_seconds"] == pytest.approx(45.0)


def test_the_latest_verdict_on_the_original_attempt_counts_flagged_or_not() -> None:
    state = LiveViewState()
    state.apply(JobEvent(job_id="j", event="started", time=0.0, expected_tasks=1))
    state.apply_all([_prediction("b", 20.0, 20.0, 90.0, flag=False), _command("b", "duplicate", 20.0)])
    state.apply(_prediction("b", 40.0, 40.0, 120.0, flag=False))  # a later, better informed verdict
    state.apply(_prediction("b", 30.0, 30.0, 70.0, flag=False))  # read late: older, ignored
    state.apply(_prediction("b", 40.0, 20.0, 25.0, flag=False, attempt=1))  # about the copy
    state.apply_all([_task("b", 45.0, "finished", attempt=1), JobEvent(job_id="j", event="ended", time=48.0)])
    assert _job(state)["saving"]["seconds"] == pytest.approx(120.0 - 45.0)
    assert _job(state)["flagged"] == []


def test_a_replacement_slower_than_the_predicted_original_costs_time() -> None:
    saving = _job(_ended_job(copy_wins=True, latency=40.0))["saving"]  # b would have ended at 40, not 45
    assert saving["seconds"] == pytest.approx(40.0 - 45.0)


def test_no_saving_when_the_original_wins_its_race() -> None:
    assert _job(_ended_job(copy_wins=False))["saving"]["seconds"] == pytest.approx(0.0)


def test_no_estimate_without_a_predicted_latency() -> None:
    state = _ended_job(copy_wins=True, latency=None)
    assert _job(state)["saving"] is None
    assert state.summary()["totals"]["jobs_with_estimate"] == 0


def test_old_ended_jobs_are_dropped_but_their_saving_is_kept() -> None:
    state = _ended_job(copy_wins=True)
    state.keep_ended = 0
    state.apply(JobEvent(job_id="j2", event="ended", time=70.0))
    summary = state.summary()
    assert summary["jobs"] == []
    assert summary["totals"]["jobs_ended"] == 2
    assert summary["totals"]["saved_seconds"] == pytest.approx(45.0)
    state.apply(_task("a", 80.0, job="j"))  # a late event of a dropped job does not bring it back
    assert state.summary()["jobs"] == []


def test_records_round_trip_through_the_codec() -> None:
    state = LiveViewState()
    for event in (JobEvent(job_id="j", event="started", time=0.0, expected_tasks=1), _task("a", 5.0)):
        state.apply_all(decode_each(encode(event)))
    assert _job(state)["running"] == 1


def test_the_service_serves_a_self_contained_page_and_the_summary() -> None:
    """The aiohttp app around the fold (no broker: the reader is never started)."""
    reader = TopicReader("127.0.0.1:1", TopicNames("t."), LiveViewState())
    reader.state.apply(JobEvent(job_id="j", event="started", time=0.0, expected_tasks=4))

    async def fetch() -> tuple[str, dict[str, Any]]:
        runner = web.AppRunner(make_app(reader))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/") as response:
                    page = await response.text()
                async with session.get(f"http://127.0.0.1:{port}/api/summary") as response:
                    return page, await response.json()
        finally:
            await runner.cleanup()

    page, summary = asyncio.run(fetch())
    assert "/api/summary" in page and "<script>" in page
    assert not re.search(r"""(src|href)\s*=|https?://|@import""", page), "no external asset: works offline"
    assert [(row["job_id"], row["expected"]) for row in summary["jobs"]] == [("j", 4)]
    assert summary["reader"] == {"records": 0, "assigned": False}


def test_compose_serves_the_view_on_the_host_loopback_only() -> None:
    compose = yaml.safe_load((Path(__file__).resolve().parents[1] / "compose.yaml").read_text())
    service = compose["services"]["view"]
    args = build_parser().parse_args(service["command"][1:])
    assert args.func.__module__ == "consumers.liveview"
    assert service["ports"] == [f"127.0.0.1:{args.port}:{args.port}"]
