"""`straggler replay`: the whole closed loop through a real broker, as the README's first command runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jobs_for_tests import make_job

from straggler.replay import run_replay

pytestmark = pytest.mark.broker


def test_closed_loop_replay_relaunches_stragglers_and_reports(kafka_bootstrap: str, tmp_path: Path) -> None:
    traces = [
        make_job(200, seed=21, job_id="loop-a", signal=0.5, interval=4.0, waves=4, wave_gap=30.0),
        make_job(200, seed=22, job_id="loop-b", signal=0.5, interval=4.0, waves=4, wave_gap=30.0),
    ]
    summary = run_replay(
        traces,
        policy="unlimited",
        out=tmp_path,
        bootstrap=kafka_bootstrap,
        checkpoint_seconds=4.0,
        progress=False,
    )
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    for key in (
        "events_produced",
        "predictions",
        "relaunch_commands",
        "dead_letters",
        "jobs",
        "f1",
        "jct_reduction",
    ):
        assert key in summary
    assert summary["jobs"] == 2 and summary["dead_letters"] == 0
    assert summary["relaunch_commands"] > 0 and summary["predictions"] > summary["relaunch_commands"]
    assert 0.0 < summary["f1"] <= 1.0
    latency = summary["decision_latency_ms"]
    assert latency["p50"] is not None and 0 < latency["p50"] <= latency["p99"]
    assert "| events produced |" in (tmp_path / "report.md").read_text()
