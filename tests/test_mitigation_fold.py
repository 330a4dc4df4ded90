"""The mitigation consumer's fold without a broker: the offline policy's commands, idempotence, the
rebuild a restart runs, and the end of a job."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from stream_events import prediction

from consumers.fold import MitigationState, Output, Rebuild
from schemas import (
    INPUT_FEATURE,
    CheckpointBoundary,
    CheckpointEvaluated,
    Event,
    JobEvent,
    MitigationNote,
    Prediction,
    RelaunchCommand,
    TaskCheckpoint,
    command_id,
    encode,
)
from straggler.core.decision_event import decision_of
from straggler.core.online import Decision
from straggler.core.policies import Action, MitigationPolicy
from straggler.core.policy_spec import make_policy
from straggler.kafka.names import TopicNames

INTERVAL = 300.0
TOPICS = TopicNames()
POLICIES = ["unlimited", "limited:1", "mantri", "speculate"]
ISSUED_AT = 12.5


def fold(policy: str) -> MitigationState:
    return MitigationState(policy, INTERVAL, clock=lambda: ISSUED_AT)


@dataclass(frozen=True)
class Checkpoint:
    """What one job's producers and agent write for checkpoint ``at``."""

    job: str
    at: float
    finishes: list[TaskCheckpoint]
    """Ends in ``(at - interval, at]``, written before the boundary."""
    predictions: list[Prediction]

    def events(self) -> list[Event]:
        boundary = CheckpointBoundary(
            job_id=self.job,
            checkpoint_time=self.at,
            checkpoint_index=int(self.at // INTERVAL),
            produced_at=0.0,
        )
        marker = CheckpointEvaluated(
            job_id=self.job,
            checkpoint_time=self.at,
            evaluated=len(self.predictions),
            flagged=0,
            model_version=1,
            boundary_produced_at=None,
            produced_at=0.0,
        )
        return [*self.finishes, boundary, *self.predictions, marker]


def checkpoints(job: str, seed: int, tasks: int = 12) -> list[Checkpoint]:
    """A job's checkpoints: random task spans, a few long ones, random verdicts on the running tasks."""
    rng = random.Random(seed)
    starts = {f"t{i}": rng.uniform(0.0, 300.0) for i in range(tasks)}
    ends = {t: s + rng.uniform(100.0, 700.0) * (5 if rng.random() < 0.25 else 1) for t, s in starts.items()}
    out = []
    at = 0.0
    while any(end > at - INTERVAL for end in ends.values()):
        previous, at = at, at + INTERVAL
        finishes = [
            TaskCheckpoint(
                job_id=job,
                task_id=task,
                attempt=0,
                checkpoint_time=ends[task],
                status="finished",
                machine_id="m",
                features={},
                latency=ends[task] - starts[task],
                start_time=starts[task],
            )
            for task in sorted(ends, key=ends.__getitem__)
            if previous < ends[task] <= at
        ]
        verdicts = [
            prediction(
                job,
                task,
                at,
                flagged=rng.random() < 0.3,
                latency=at - starts[task] + rng.uniform(0.0, 2500.0),
                elapsed=at - starts[task],
                attempt=0,
            )
            for task in starts
            if starts[task] <= at < ends[task]
        ]
        out.append(Checkpoint(job, at, finishes, verdicts))
    return out


def stream(jobs: int = 3, seed: int = 3) -> list[Event]:
    """Several jobs' checkpoints interleaved in time, each job started first and ended last."""
    plans = {f"job-{j}": checkpoints(f"job-{j}", seed + j) for j in range(jobs)}
    events: list[Event] = [
        JobEvent(job_id=job, event="started", time=0.0, expected_tasks=12) for job in plans
    ]
    for index in range(max(len(plan) for plan in plans.values())):
        for job, plan in plans.items():
            if index < len(plan):
                events += plan[index].events()
            if index == len(plan) - 1:
                events.append(JobEvent(job_id=job, event="ended", time=plan[-1].at - 1.0))
    return events


def topic_of(event: Event) -> str:
    if isinstance(event, CheckpointEvaluated | Prediction):
        return TOPICS.predictions
    if isinstance(event, JobEvent):
        return TOPICS.job_events
    return TOPICS.checkpoints


def records(events: Sequence[Event]) -> list[tuple[bytes, str, int]]:
    """The events as records of one partition per topic: (value, topic, offset)."""
    offsets: dict[str, int] = {}
    out = []
    for event in events:
        topic = topic_of(event)
        out.append((encode(event), topic, offsets.get(topic, 0)))
        offsets[topic] = offsets.get(topic, 0) + 1
    return out


def outputs(state: MitigationState, recs: Sequence[tuple[bytes, str, int]]) -> list[Output]:
    return [output for value, topic, offset in recs for output in state.process(value, topic, 0, offset)]


def commands(state: MitigationState, recs: Sequence[tuple[bytes, str, int]]) -> list[Output]:
    """The commands and dead letters the records cause (the notes left out)."""
    return [output for output in outputs(state, recs) if not isinstance(output, MitigationNote)]


# ---------------------------------------------------------------- the offline policy's commands


def offline_commands(
    policy: str, plan: list[Checkpoint], holds: list[tuple[str, str, str]] | None = None
) -> list[RelaunchCommand]:
    """What the policy decides when driven directly, checkpoint by checkpoint (as the evaluator does);
    ``holds`` gets the (task, kind, reason) of each flagged task it leaves without a command."""
    driven = make_policy(policy, INTERVAL)
    out = []
    for checkpoint in plan:
        for finish in checkpoint.finishes:
            assert finish.latency is not None
            driven.on_task_finished(checkpoint.job, finish.task_id, finish.checkpoint_time, finish.latency)
        decisions = [decision_of(p) for p in checkpoint.predictions]
        for action in driven.on_checkpoint(checkpoint.job, checkpoint.at, decisions):
            out.append(command(policy, action))
        if holds is not None:
            holds += [(h.task_id, h.kind, h.reason) for h in driven.holds(checkpoint.job)]
    return out


def command(policy: str, action: Action) -> RelaunchCommand:
    return RelaunchCommand(
        command_id=command_id(action.job_id, action.task_id, action.action, action.decision_key),
        job_id=action.job_id,
        task_id=action.task_id,
        action=action.action,
        reason=action.reason,
        policy=policy,
        issued_at=ISSUED_AT,
        checkpoint_time=action.at,
        attempt=action.attempt,
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_the_fold_issues_the_commands_the_offline_policy_decides(policy: str) -> None:
    plan = checkpoints("j", seed=11)
    holds: list[tuple[str, str, str]] = []
    expected = offline_commands(policy, plan, holds)
    assert expected, "the scenario must cause commands"
    events = [event for checkpoint in plan for event in checkpoint.events()]
    caused = outputs(fold(policy), records(events))
    assert [o for o in caused if not isinstance(o, MitigationNote)] == expected
    notes = [(o.task_id, o.kind, o.reason) for o in caused if isinstance(o, MitigationNote)]
    assert notes == holds, "a note for each flagged task the policy left without a command"


# ---------------------------------------------------------------- repeated and out-of-order records


@pytest.mark.parametrize("policy", POLICIES)
def test_a_repeated_or_late_record_changes_nothing(policy: str) -> None:
    recs = records(stream())
    clean_state = fold(policy)
    clean = commands(clean_state, recs)
    assert clean, "the scenario must cause commands"
    rng = random.Random(5)
    noisy: list[tuple[bytes, str, int]] = []
    for index, record in enumerate(recs):
        noisy.append(record)
        if rng.random() < 0.3:
            noisy.append(record)  # redelivered at once
        if rng.random() < 0.3:
            noisy.append(recs[rng.randrange(index + 1)])  # an older record, read again late
    noisy_state = fold(policy)
    assert commands(noisy_state, noisy) == clean
    assert noisy_state.active_jobs == clean_state.active_jobs
    assert (noisy_state.checkpoints, noisy_state.commands) == (clean_state.checkpoints, clean_state.commands)


# ---------------------------------------------------------------- restart: the rebuild


@pytest.mark.parametrize("policy", POLICIES)
def test_a_rebuild_to_the_committed_offsets_continues_as_the_live_run_would(policy: str) -> None:
    """Live: fold a prefix of each partition (committed), then the rest. Restarted: a fresh state
    rebuilt from everything read back from the beginning (records after the committed offsets
    included, which the rebuild must leave out), then the rest: the same commands, none repeated,
    none lost."""
    recs = records(stream())
    for cut in range(0, len(recs) + 1, 7):
        live = fold(policy)
        before = commands(live, recs[:cut])
        at_cut = (live.predictions, live.checkpoints, live.commands)
        after = commands(live, recs[cut:])
        committed: dict[tuple[str, int], int] = {}
        for _, topic, offset in recs[:cut]:
            committed[(topic, 0)] = offset + 1
        rebuild = Rebuild(fold(policy), committed)
        for value, topic, offset in recs:
            rebuild.fold(value, topic, 0, offset, None)
        assert rebuild.remaining == {}
        assert rebuild.records == cut
        restarted = rebuild.state
        assert (restarted.predictions, restarted.checkpoints, restarted.commands) == at_cut
        assert at_cut[2] == len(before)
        assert commands(restarted, recs[cut:]) == after, f"cut at {cut}"
        assert restarted.active_jobs == live.active_jobs


# ---------------------------------------------------------------- the end of a job


class Recorder(MitigationPolicy):
    """Relaunches every flagged task, and records which jobs it was told to forget."""

    def __init__(self) -> None:
        self.forgotten: list[str] = []
        self.inputs: list[tuple[str, str, float]] = []

    def on_checkpoint(self, job_id: str, at: float, decisions: Sequence[Decision]) -> list[Action]:
        return make_policy("unlimited").on_checkpoint(job_id, at, decisions)

    def on_job_ended(self, job_id: str) -> None:
        self.forgotten.append(job_id)

    def on_task_input(self, job_id: str, task_id: str, size: float) -> None:
        self.inputs.append((job_id, task_id, size))


def test_a_jobs_end_drops_its_state_once_no_marker_of_it_can_come() -> None:
    old = checkpoints("old", seed=1)
    state = fold("unlimited")
    recorder = state.policy = Recorder()
    commands(state, records([e for c in old for e in c.events()]))
    ended = JobEvent(job_id="old", event="ended", time=old[-1].at + 1.0)
    assert state.process(encode(ended), TOPICS.job_events, 0, 0) == []
    assert state.active_jobs == {"old"} and recorder.forgotten == []  # a marker of it might still come
    later = Checkpoint("other", old[-1].at + INTERVAL, [], []).events()
    commands(state, records(later))  # its marker: "old" has no marker left to come on this partition
    assert state.active_jobs == {"other"}
    assert recorder.forgotten == ["old"]
    replayed = [e for c in old for e in c.events()]  # the old job's records, read again
    assert commands(state, records(replayed)) == []
    assert state.active_jobs == {"other"}
    assert recorder.forgotten == ["old"]


def test_a_tasks_reported_input_reaches_the_policy() -> None:
    state = fold("unlimited")
    recorder = state.policy = Recorder()
    told = {"cpu": 0.5, INPUT_FEATURE: 3.0}
    reports = [
        TaskCheckpoint(job_id="j", task_id=t, attempt=0, checkpoint_time=1.0, status="running",
                       machine_id="m", features=features)
        for t, features in (("told", told), ("untold", {"cpu": 0.5}))
    ]  # fmt: skip
    commands(state, records(reports))
    assert recorder.inputs == [("j", "told", 3.0)]
