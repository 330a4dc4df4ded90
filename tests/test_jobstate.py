from typing import Any

import numpy as np
import pytest

from straggler.core.jobstate import JobState, TaskStatus


def test_finished_task_is_never_resurrected_by_a_late_running_event() -> None:
    state = JobState("j", n_features=2)
    assert state.observe_running("a", np.array([1.0, 2.0]), start=0.0, observed_at=10.0)
    assert state.observe_finished("a", np.array([1.0, 2.0]), latency=15.0, observed_at=15.0)
    assert not state.observe_running("a", np.array([9.0, 9.0]), start=0.0, observed_at=12.0)
    assert not state.observe_running("a", np.array([9.0, 9.0]), start=0.0, observed_at=20.0)
    assert state.tasks["a"].status == TaskStatus.FINISHED
    ids, _, y = state.finished()
    assert ids == ["a"] and y.tolist() == [15.0]


def test_duplicates_and_reordering_are_idempotent() -> None:
    state = JobState("j", n_features=1)
    state.observe_running("a", np.array([2.0]), start=0.0, observed_at=20.0)
    assert not state.observe_running("a", np.array([1.0]), start=0.0, observed_at=10.0)  # older checkpoint
    assert state.tasks["a"].features.tolist() == [2.0]
    assert state.observe_finished("a", np.array([2.0]), latency=30.0, observed_at=30.0)
    assert not state.observe_finished("a", np.array([2.0]), latency=30.0, observed_at=30.0)
    assert state.n_finished == 1


def test_a_new_attempt_replaces_a_failed_run() -> None:
    state = JobState("j", n_features=1)
    state.observe_running("a", np.array([1.0]), start=0.0, observed_at=5.0)
    assert state.observe_gone("a", observed_at=6.0)
    assert not state.observe_running("a", np.array([1.0]), start=0.0, observed_at=7.0, attempt=0)
    assert state.observe_running("a", np.array([3.0]), start=8.0, observed_at=9.0, attempt=1)
    ids, _, elapsed = state.running(at=10.0)
    assert ids == ["a"] and elapsed.tolist() == [2.0]


def test_flagged_tasks_are_not_evaluated_again_and_bad_input_is_rejected() -> None:
    state = JobState("j", n_features=1)
    state.observe_running("a", np.array([1.0]), start=0.0, observed_at=5.0)
    state.observe_running("b", np.array([1.0]), start=0.0, observed_at=5.0)
    state.flag("a", 5.0)
    assert state.running(at=6.0)[0] == ["b"]
    assert state.running(at=6.0, unflagged_only=False)[0] == ["a", "b"]
    state.observe_running("0", np.array([1.0]), start=0.0, observed_at=5.0)
    assert state.running(at=6.0)[0] == ["0", "b"]  # canonical order: (start, task id)
    with pytest.raises(ValueError, match="latency"):
        state.observe_finished("b", np.array([1.0]), latency=float("nan"), observed_at=7.0)
    with pytest.raises(ValueError, match="expected 1 features"):
        state.observe_running("c", np.array([1.0, 2.0]), start=0.0, observed_at=5.0)


def test_cached_views_equal_a_rebuild_after_any_sequence_of_events() -> None:
    """The finished view is extended in place when new finishes come last, rebuilt otherwise, and
    n_finished is counted as events arrive: after every event both must equal a rebuild from the
    task records (out-of-order finishes, re-runs of finished tasks and newer attempts included)."""
    rng = np.random.default_rng(3)
    state = JobState("j", n_features=2, expected_tasks=40)
    extended = []
    extend = state._extended

    def counting(*args: Any) -> Any:
        result = extend(*args)
        extended.append(result is not None)
        return result

    state._extended = counting  # type: ignore[method-assign,assignment]
    for step in range(600):
        task = f"t{rng.integers(40)}"
        attempt = int(rng.integers(3))
        at = float(step + rng.normal(0, 2))  # finishes sometimes arrive out of time order
        kind = rng.choice(["running", "finished", "gone"], p=[0.45, 0.45, 0.1])
        x = rng.normal(size=2)
        if kind == "running":
            state.observe_running(task, x, at - 5.0, at, attempt)
        elif kind == "finished":
            state.observe_finished(task, x, float(rng.uniform(0, 10)), at, attempt)
        else:
            state.observe_gone(task, at, attempt)
        ids, X, y = state.finished()
        fresh = JobState("j", n_features=2, expected_tasks=40, tasks=dict(state.tasks))
        fresh_ids, fresh_X, fresh_y = fresh.finished()
        assert ids == fresh_ids
        assert np.array_equal(X, fresh_X) and np.array_equal(y, fresh_y)
        assert state.n_finished == fresh.n_finished == len(fresh_ids)
        assert not X.flags.writeable and not y.flags.writeable
    assert sum(extended) >= 20 and not all(extended)  # both paths ran, each many times


def test_views_agree_with_the_task_records() -> None:
    """`running_view` (flagged tasks included, with their flags, starts and attempts) and the finish
    times of `finished_view` say what the task records say, in the views' canonical orders."""
    rng = np.random.default_rng(5)
    state = JobState("j", n_features=2, expected_tasks=30)
    for step in range(300):
        task = f"t{rng.integers(30)}"
        at = float(step + rng.normal(0, 2))
        kind = rng.choice(["running", "finished", "gone"], p=[0.5, 0.4, 0.1])
        if kind == "running":
            state.observe_running(task, rng.normal(size=2), at - rng.uniform(0, 20), at, int(rng.integers(2)))
        elif kind == "finished":
            state.observe_finished(
                task, rng.normal(size=2), float(rng.uniform(0, 10)), at, int(rng.integers(2))
            )
        else:
            state.observe_gone(task, at)
        if rng.random() < 0.1:
            state.flag(task, at)
        view = state.running_view(at)
        running = sorted(
            (t for t, r in state.tasks.items() if r.status == TaskStatus.RUNNING),
            key=lambda t: (state.tasks[t].start, t),
        )
        assert view.ids == running
        assert view.start.tolist() == [state.tasks[t].start for t in running]
        assert view.elapsed.tolist() == [max(at - state.tasks[t].start, 0.0) for t in running]
        assert view.flagged.tolist() == [t in state.flagged for t in running]
        assert view.attempt == [state.tasks[t].attempt for t in running]
        assert np.array_equal(view.X, np.array([state.tasks[t].features for t in running]).reshape(-1, 2))
        ids, X, elapsed = state.running(at)
        assert ids == [t for t in running if t not in state.flagged]
        assert np.array_equal(X, view.X[~view.flagged]) and np.array_equal(
            elapsed, view.elapsed[~view.flagged]
        )
        finished = state.finished_view()
        assert finished.finished_at.tolist() == [state.tasks[t].observed_at for t in finished.ids]
        assert not finished.finished_at.flags.writeable


def test_observe_all_equals_one_call_per_observation() -> None:
    """A batch of observations (the agent's path) leaves the state, its views and what it reports as
    changed exactly as one observe_* call per observation does (missing features are NaN)."""
    from schemas import TaskCheckpoint

    rng = np.random.default_rng(5)
    names = ["a", "b", "c"]
    events = []
    for step in range(800):
        status = str(rng.choice(["running", "finished", "failed", "killed"], p=[0.5, 0.35, 0.1, 0.05]))
        at = float(step // 4 + rng.normal(0, 2) + 10)
        features = {n: float(rng.normal()) for n in names if rng.random() > 0.05}
        start = None if rng.random() < 0.1 else max(at - 5.0, 0.0)
        events.append(
            TaskCheckpoint(
                job_id="j",
                task_id=f"t{rng.integers(60)}",
                attempt=int(rng.integers(3)),
                checkpoint_time=max(at, 0.0),
                status=status,  # type: ignore[arg-type]
                machine_id="",
                features=features,
                latency=float(rng.uniform(0, 10)) if status == "finished" else None,
                start_time=start,
            )
        )
    one_by_one = JobState("j", n_features=3, expected_tasks=60)
    changed_one = []
    for e in events:
        x = np.array([e.features.get(n, np.nan) for n in names])
        if e.status == "running":
            applied = one_by_one.observe_running(e.task_id, x, e.start_time, e.checkpoint_time, e.attempt)
        elif e.status == "finished":
            assert e.latency is not None
            applied = one_by_one.observe_finished(e.task_id, x, e.latency, e.checkpoint_time, e.attempt)
        else:
            applied = one_by_one.observe_gone(e.task_id, e.checkpoint_time, e.attempt)
        if applied:
            changed_one.append(e.task_id)
    batched = JobState("j", n_features=3, expected_tasks=60)
    changed = [
        t
        for start in range(0, len(events), 37)
        for t in batched.observe_all(events[start : start + 37], names)
    ]
    assert changed == changed_one
    assert batched.tasks.keys() == one_by_one.tasks.keys()
    for task_id, record in one_by_one.tasks.items():
        other = batched.tasks[task_id]
        assert np.array_equal(record.features, other.features, equal_nan=True)
        assert (record.status, record.start, record.observed_at, record.attempt) == (
            other.status,
            other.start,
            other.observed_at,
            other.attempt,
        )
        assert np.array_equal(record.latency, other.latency, equal_nan=True)
    assert batched.n_finished == one_by_one.n_finished
    for view in (lambda s: s.finished(), lambda s: s.running(500.0)):
        (ids, X, y), (ids1, X1, y1) = view(batched), view(one_by_one)
        assert ids == ids1 and np.array_equal(X, X1, equal_nan=True) and np.array_equal(y, y1)
    with pytest.raises(ValueError, match="expected 3 features"):
        batched.observe_all(events[:1], names[:2])


def test_a_running_attempt_without_a_start_time_keeps_its_first_reports_time() -> None:
    """A producer that never sends ``start_time`` (the SDK's callers) must not reset the task's start at
    every report: elapsed would stay near zero and a hung task would never look slow."""
    state = JobState("j", n_features=1, expected_tasks=3)
    x = np.zeros(1)
    state.observe_running("t", x, None, 100.0)
    state.observe_running("t", x, None, 160.0)
    assert state.tasks["t"].start == 100.0
    state.observe_running("t", x, None, 170.0, attempt=1)  # a new attempt starts anew
    assert state.tasks["t"].start == 170.0
    state.observe_running("t", x, 150.0, 180.0, attempt=1)  # a given start is taken as given
    assert state.tasks["t"].start == 150.0
