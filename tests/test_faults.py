"""No lost or duplicated commands under crashes, restarts and bad input (issue 5).

The scenarios themselves live in ``tests/harness/fault_scenarios.py`` (``bench/faults.py`` prints the same
runs as a table); here each one runs small and its result is asserted. The first tests need no broker:
they pin down the idempotence the stream tests rely on.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path

import numpy as np
import pytest
from harness import fault_scenarios
from harness.fault_scenarios import (
    BAD_KINDS,
    README_BAD_INPUT,
    SCENARIOS,
    STOP_STATES,
    ScenarioResult,
    Sizes,
    bad_record,
    broker_restart,
    check_agent_letters,
    expected_letters,
    stream_events,
    with_repeats,
)
from harness.small_jobs import make_job

from consumers.fold import MitigationState
from schemas import (
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    RelaunchCommand,
    SchemaError,
    TaskBatch,
    TaskCheckpoint,
    dead_letter_for,
    decode,
    encode,
    observations,
)
from straggler.core.decision_event import prediction_event
from straggler.core.jobstate import JobState, TaskStatus
from straggler.core.online import Decision, OnlineJob
from straggler.core.registry import make_method
from straggler.evaluation import EvaluationConfig, method_decisions
from straggler.kafka.names import TopicNames
from straggler.kafka.routing import Reject, route
from straggler.simulation import recorded_steps

SIZES = Sizes(jobs=2, tasks=150, bad_events=450)
"""Small enough for a test run, large enough for stragglers (checked) and every kind of bad record."""
WATCHDOG_STALL_S = 20.0
"""The broker-restart test's mitigator watchdog: longer than any transactional call that returns
(`consumers.mitigation.TXN_CALL_TIMEOUT_S`, 15 s); a spurious restart would be safe, as after a kill."""


# ------------------------------------------------------------------ idempotence, without a broker


def test_a_duplicate_or_late_event_never_changes_or_resurrects_a_task() -> None:
    state = JobState("j", n_features=1, expected_tasks=2)
    x = np.array([1.0])
    assert state.observe_running("t", x, 0.0, 10.0)
    assert not state.observe_running("t", x, 0.0, 5.0), "an older checkpoint overwrote a newer one"
    assert state.observe_finished("t", x, 12.0, 12.0)
    assert not state.observe_finished("t", x, 12.0, 12.0), "a duplicate finish was applied"
    assert not state.observe_running("t", x, 0.0, 10.0), "a late running event resurrected the task"
    assert not state.observe_gone("t", 13.0), "a late kill undid a finish"
    record = state.tasks["t"]
    assert (record.status, record.latency, record.observed_at) == (TaskStatus.FINISHED, 12.0, 12.0)
    assert state.observe_running("t", x, 20.0, 20.0, attempt=1), "a relaunch (new attempt) must count"


def _decisions(trace_events: list[tuple[str, tuple[object, ...]]], expected_tasks: int) -> list[Decision]:
    job = OnlineJob("j", make_method("nurd", 0), 2, expected_tasks)
    out: list[Decision] = []
    for kind, args in trace_events:
        if kind == "running":
            job.state.observe_running(*args)  # type: ignore[arg-type]
        elif kind == "finished":
            job.state.observe_finished(*args)  # type: ignore[arg-type]
        else:
            out += job.checkpoint(float(args[0]))  # type: ignore[arg-type]
    return out


def test_an_online_job_fed_duplicates_and_late_events_decides_as_with_a_clean_stream() -> None:
    trace = make_job(160, seed=5, job_id="j", signal=0.5)
    clean: list[tuple[str, tuple[object, ...]]] = []
    noisy: list[tuple[str, tuple[object, ...]]] = []
    last_running: dict[str, tuple[object, ...]] = {}
    for _, t, finished, _, running, features in recorded_steps(trace):
        for i in finished.tolist():
            args = (trace.task_ids[i], trace.finish_features[i], float(trace.end[i] - trace.start[i]),
                    float(trace.end[i]))  # fmt: skip
            clean.append(("finished", args))
            noisy += [("finished", args), ("finished", args)]
            if trace.task_ids[i] in last_running:
                noisy.append(("running", last_running[trace.task_ids[i]]))  # late, after the finish
        for i, row in zip(running.tolist(), features, strict=True):
            args = (trace.task_ids[i], row, float(trace.start[i]), t)
            clean.append(("running", args))
            noisy += [("running", args), ("running", args)]
            last_running[trace.task_ids[i]] = args
        clean.append(("checkpoint", (t,)))
        noisy.append(("checkpoint", (t,)))
    expected = _decisions(clean, trace.n_tasks)
    assert any(d.is_straggler for d in expected), "the job must have stragglers"
    assert _decisions(noisy, trace.n_tasks) == expected


def test_every_bad_record_is_rejected_with_its_reason() -> None:
    topics = TopicNames("x-")
    for i, kind in enumerate(BAD_KINDS * 3):
        _, key, payload = bad_record(kind, i, "job", topics)
        reasons = [reason for _, reason in expected_letters(kind, i, ("t", 0, i))]
        if kind in ("no-key", "wrong-key"):  # valid: the agent's routing rejects the key
            assert isinstance(decode(payload), TaskCheckpoint)
            where = route(None if key is None else key.encode(), "job", 0, 8)
            assert isinstance(where, Reject) and reasons[0] in where.reason, kind
            continue
        if kind == "unknown-job":
            assert isinstance(decode(payload), TaskCheckpoint)  # valid: the agent's pending rule rejects it
            continue
        if kind == "bad-in-batch":  # the batch is valid; each of its observations is not
            batch = decode(payload)
            assert isinstance(batch, TaskBatch)
            errors = observations(batch)
            assert len(errors) == len(reasons) and all(isinstance(e, SchemaError) for e in errors)
            assert all(reason in str(e) for reason, e in zip(reasons, errors, strict=True))
            continue
        with pytest.raises(SchemaError) as error:
            decode(payload)
        assert reasons[0] in str(error.value), kind


def test_the_bad_kinds_are_the_readmes() -> None:
    """Every kind of bad input the README's 'Bad input' section lists is sent, and nothing else."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())
    for words in README_BAD_INPUT:
        assert words in section, f"the README's 'Bad input' no longer lists {words!r}"
    assert sorted(k for kinds in README_BAD_INPUT.values() for k in kinds) == sorted(BAD_KINDS)


def test_the_agent_letters_check_counts_what_is_missing_repeated_or_not_the_agents() -> None:
    """`check_agent_letters` (the bad-input scenario's verdict) on hand-made letters."""
    topics = TopicNames("x-")
    kinds = ("not-json", "bad-in-batch", "unknown-job")
    expected = []
    payloads = {}
    for offset, kind in enumerate(kinds):
        i = 1 if kind == "bad-in-batch" else offset  # record 1 holds two bad observations
        topic, _, payload = bad_record(kind, i, "job", topics)
        payloads[offset] = payload
        expected += [(kind, place, reason) for place, reason in expected_letters(kind, i, (topic, 0, offset))]
    assert len(expected) == 4

    def letter(place: tuple[str, int, int, int | None], reason: str, stage: str = "agent") -> DeadLetter:
        text = (
            f"SchemaError: x: {reason}" if reason.startswith("(") else f"SchemaError: {reason}"
        )  # as the agent
        return dead_letter_for(payloads.get(place[2], b"{}"), place[0], place[1], place[2], text, stage=stage)  # type: ignore[arg-type]

    right = [letter(place, reason) for _, place, reason in expected]
    result = ScenarioResult("x")
    check_agent_letters(result, expected, right)
    assert result.ok and result.bad_by_kind == {
        "not-json": (1, 1),
        "unknown-job": (1, 1),
        "bad-in-batch": (2, 2),
    }

    cases = {
        "the mitigator's letters only": [replace_stage(x, "mitigator") for x in right],
        "one observation of the batch lettered twice": [*right, right[1]],
        "the batch's second observation missing": [x for x in right if x is not right[2]],
        "a valid record lettered": [*right, letter(("x-task-checkpoints", 0, 99, None), "oops")],
        "another reason": [right[0], right[1], right[2], letter(expected[3][1], "(json)")],
    }
    for case, letters in cases.items():
        result = ScenarioResult("x")
        check_agent_letters(result, expected, letters)
        assert not result.ok, case


def replace_stage(letter: DeadLetter, stage: str) -> DeadLetter:
    return dataclasses.replace(letter, stage=stage)  # type: ignore[arg-type]


def test_the_repeated_stream_holds_duplicates_late_running_events_and_old_boundaries() -> None:
    records = stream_events([make_job(60, seed=2, job_id="j")], TopicNames("x-"), batch=False)
    repeated, faults = with_repeats(records)
    assert faults > len(records)
    events = [decode(value) for _, _, value in repeated]
    boundaries = [e.checkpoint_time for e in events if isinstance(e, CheckpointBoundary)]
    assert any(later < earlier for earlier, later in itertools.pairwise(boundaries))
    finished: set[str] = set()
    late = 0
    for e in events:
        if isinstance(e, TaskCheckpoint):
            if e.status == "finished":
                finished.add(e.task_id)
            elif e.status == "running" and e.task_id in finished:
                late += 1
    assert late > 0


# ----------------------------------------------------------------- the scenarios, on a real broker


def _check(result: ScenarioResult) -> None:
    details = "\n".join(result.notes)
    assert result.commands_expected > 0, "the scenario must contain stragglers"
    assert result.faults > 0, "no fault was injected"
    assert not result.timeouts, details
    assert result.crashed == 0, details
    assert result.markers_missing == 0, f"{result.markers_missing} checkpoints never evaluated\n{details}"
    assert result.conflicting == 0, f"{result.conflicting} conflicting verdicts\n{details}"
    assert result.decisions_missing == result.decisions_extra == 0, details
    assert result.lost == 0, f"{result.lost} commands lost\n{details}"
    assert result.duplicated == 0, f"{result.duplicated} commands duplicated\n{details}"
    assert result.unexpected == 0, details
    assert result.ok, details


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.scenario
@pytest.mark.parametrize(
    "scenario",
    [
        "worker-kill",
        "worker-kill-repeated",
        "mitigator-kill",
        "duplicates",
        "worker-leaves",
        "recovery-loses-records",
    ],
)
def test_a_fault_loses_and_duplicates_nothing(scenario: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    _check(SCENARIOS[scenario](kafka_bootstrap, tmp_path, SIZES))


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.scenario
@pytest.mark.parametrize("state", list(STOP_STATES))
def test_a_worker_stops_within_10_s_of_sigterm_in_every_state(
    state: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Mid-commit (with a record waiting for the lock: before the fix, Faust waited for it forever),
    mid-fit, joining the group, giving partitions up: the worker exits with status 0 within 10 s
    (`Processes.stop_worker` raises otherwise), and the replay then ends with nothing lost or repeated."""
    _check(SCENARIOS[f"worker-stops-{state}"](kafka_bootstrap, tmp_path, SIZES))


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.scenario
def test_bad_input_is_dead_lettered_with_its_reason_and_changes_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    result = SCENARIOS["bad-input"](kafka_bootstrap, tmp_path, SIZES)
    details = "\n".join(result.notes)
    assert result.bad_events == SIZES.bad_events
    assert sorted(result.bad_by_kind) == sorted(BAD_KINDS)
    for kind, (sent, lettered_once_rightly) in result.bad_by_kind.items():
        assert sent > 0 and lettered_once_rightly == sent, (
            f"{kind}: {lettered_once_rightly}/{sent}\n{details}"
        )
    assert result.bad_not_dead_lettered == result.bad_lettered_twice == result.bad_wrong_reason == 0, details
    assert result.letters_unexpected == 0, details
    _check(result)


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.scenario
def test_a_broker_restart_mid_replay_loses_and_duplicates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka can block forever in send_offsets_to_transaction after the restart (#5456, #5511);
    the mitigator's watchdog (`consumers.watchdog`) then replaces the stuck consumer. Here it does so
    after `WATCHDOG_STALL_S` of silence rather than the scenario's 45 s: most of this test's time
    was that wait."""
    monkeypatch.setattr(fault_scenarios, "MITIGATOR_STALL_TIMEOUT_S", WATCHDOG_STALL_S)
    result = broker_restart(tmp_path, SIZES)
    _check(result)


@functools.cache  # the same input for every policy: computed once per module, not per parameter
def _mitigation_input(trace_seed: int, repeat_slow_finishes: int) -> tuple[bytes, ...]:
    """The mitigator's input for one job: the replayer's records, and after each boundary the offline
    evaluator's predictions and marker; the finishes of the slower half sent ``1 + repeat`` times."""
    trace = make_job(200, seed=trace_seed, job_id="j", signal=1.5, waves=4, wave_gap=30.0)
    config = EvaluationConfig(methods=("nurd",), threshold="online")
    by_time: dict[float, list[Decision]] = {}
    for verdicts in method_decisions(trace, "nurd", config):
        for d in verdicts:
            by_time.setdefault(d.checkpoint_time, []).append(d)
    median = float(np.median(trace.latency))
    out: list[bytes] = []
    for _, _, value in stream_events([trace], TopicNames("x-"), batch=False):
        event = decode(value)
        out.append(value)
        slow = isinstance(event, TaskCheckpoint) and (event.latency or 0.0) > median
        if slow and event.status == "finished":  # type: ignore[union-attr]
            out += [value] * repeat_slow_finishes
        if isinstance(event, CheckpointBoundary):
            decisions = by_time.get(event.checkpoint_time, [])
            out += [encode(prediction_event(d, "nurd", 0.0)) for d in decisions]
            marker = CheckpointEvaluated(
                job_id="j",
                checkpoint_time=event.checkpoint_time,
                evaluated=len(decisions),
                flagged=sum(d.is_straggler for d in decisions),
                model_version=1,
                boundary_produced_at=None,
                produced_at=0.0,
            )
            out.append(encode(marker))
    return tuple(out)


@pytest.mark.parametrize("policy", ["mantri", "limited:2", "unlimited", "speculate"])
def test_repeated_finish_events_do_not_change_the_mitigators_commands(policy: str) -> None:
    def commands(values: tuple[bytes, ...]) -> list[str]:
        state = MitigationState(policy, 1.0)
        return [
            output.command_id
            for offset, value in enumerate(values)
            for output in state.process(value, "x-task-checkpoints", 0, offset)
            if isinstance(output, RelaunchCommand)
        ]

    clean = commands(_mitigation_input(7, 0))
    assert clean, "the job must cause commands"
    assert commands(_mitigation_input(7, 2)) == clean
