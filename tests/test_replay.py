"""`straggler replay`: the whole closed loop through a real broker, as the README's first command runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness.small_jobs import make_job

from producers.replayer import PipelineDown
from schemas import RelaunchCommand, command_id, decode
from straggler.core.policy_spec import make_policy
from straggler.evaluation import EvaluationConfig, online_job
from straggler.replay import run_replay
from straggler.simulation import figures, mean_figures, run_closed_loop

pytestmark = [pytest.mark.broker, pytest.mark.scenario]  # closed-loop replays through the pipeline


def test_closed_loop_speculation_through_kafka_equals_the_offline_simulation(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    traces = [
        make_job(200, seed=21, job_id="loop-a", signal=0.5, interval=4.0, waves=4, wave_gap=30.0),
        make_job(200, seed=22, job_id="loop-b", signal=0.5, interval=4.0, waves=4, wave_gap=30.0),
    ]
    summary = run_replay(
        traces,
        policy="speculate",
        out=tmp_path,
        bootstrap=kafka_bootstrap,
        checkpoint_seconds=4.0,
        progress=False,
    )
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    assert summary["jobs"] == 2 and summary["dead_letters"] == 0
    assert summary["commands_by_action"].get("duplicate", 0) > 0
    assert 0.0 < summary["f1"] <= 1.0
    latency = summary["decision_latency_ms"]
    assert latency["p50"] is not None and 0 < latency["p50"] <= latency["p99"]

    stream = [decode(line) for line in (tmp_path / "commands.jsonl").read_bytes().splitlines()]
    assert all(isinstance(c, RelaunchCommand) for c in stream)
    offline = []
    config = EvaluationConfig(methods=("nurd",), threshold="online")
    reductions = []
    runs = []
    for trace in traces:
        run = run_closed_loop(trace, online_job(trace, "nurd", config), make_policy("speculate", 4.0), 0, 4.0)
        offline += [
            (
                trace.job_id,
                a.task_id,
                a.action,
                a.attempt,
                command_id(trace.job_id, a.task_id, a.action, a.decision_key),
            )
            for a in run.commands
        ]
        reductions.append(run.outcome.reduction)
        runs.append(run)
    assert {"duplicate", "kill"} <= {action for _, _, action, _, _ in offline}, (
        "the scenario must race copies"
    )
    streamed = [(c.job_id, c.task_id, c.action, c.attempt, c.command_id) for c in stream]  # type: ignore[union-attr]
    assert sorted(streamed) == sorted(offline)
    assert summary["jct_reduction"] == pytest.approx(sum(reductions) / len(reductions))
    assert summary["jobs_longer"] == 0 and summary["jct_reduction"] > 0
    report = (tmp_path / "report.md").read_text()
    assert f"**Completion time {summary['jct_reduction']:+.1%}**" in report
    assert f"{summary['gross_extra_machine_time']:+.1%} machine time gross" in report
    offline_cost = mean_figures([figures(run.outcome) for run in runs])
    for key in ("gross_extra_machine_time", "net_extra_machine_time", "copies", "copies_won", "copies_lost"):
        assert summary[key] == pytest.approx(offline_cost[key]), key
    assert summary["copies"] == summary["copies_won"] + summary["copies_lost"] > 0
    assert f"{summary['copies_won']} won their race, {summary['copies_lost']} lost" in report


def test_a_replay_whose_pipeline_cannot_start_fails_with_the_childs_error(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The mitigator refuses its policy and exits: the replay ends at once with that line, not with
    `ReplayStalled` after the closed loop's wait (the command line refuses such a policy itself)."""
    trace = make_job(40, seed=3, job_id="cannot-start", interval=4.0)
    with pytest.raises(PipelineDown) as down:
        run_replay(
            [trace],
            policy="nonsense",
            out=tmp_path,
            bootstrap=kafka_bootstrap,
            checkpoint_seconds=4.0,
            progress=False,
        )
    message = str(down.value)
    assert "the mitigator exited with status 2" in message and "unknown policy 'nonsense'" in message
    assert str(tmp_path / "mitigator.log") in message
