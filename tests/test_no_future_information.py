"""No method may use information from the future: the decision-level check, for every registered method.

A job is replayed twice through the evaluator's online driver (`method_decisions`, what the stream
does): once as it happened, once with the future of the tasks running at a cutoff checkpoint
rewritten (when they end, the features they finish with, their later snapshots). Every verdict given
up to the cutoff must be identical in both runs. A deliberately leaky method is the negative control:
the same check must catch it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import sys
from collections.abc import Iterator
from typing import Any, ClassVar, Self

import numpy as np
import pytest
from harness.small_jobs import make_job

from straggler.core.jobtrace import JobTrace
from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.online import Decision
from straggler.core.registry import ORACLE, make_method, method_names
from straggler.core.start import StartMethod
from straggler.evaluation import EvaluationConfig, Prototypes, method_decisions

HAS_PYOD = importlib.util.find_spec("pyod") is not None
OUTLIER_PREFIX = "od-"

CONFIG = EvaluationConfig(methods=(), threshold="online")
"""Online threshold: the oracle p90 is the whole job's, future information by construction."""


def _param(name: str) -> Any:
    marks = []
    if name.startswith(OUTLIER_PREFIX):
        marks.append(pytest.mark.skipif(not HAS_PYOD, reason="PyOD not installed: the outliers extra"))
    return pytest.param(name, id=name, marks=marks)


def the_job() -> JobTrace:
    return make_job(160, signal=1.0, seed=6, slow_group=0.1, interval=5.0)


def cutoff_index(trace: JobTrace) -> int:
    """The first checkpoint by which 40 % of the tasks have finished: every method is deciding."""
    finished_by = np.array([np.count_nonzero(trace.end <= t) for t in trace.checkpoints])
    return int(np.argmax(finished_by >= 0.4 * trace.n_tasks))


def with_rewritten_future(trace: JobTrace, k: int, seed: int = 11) -> JobTrace:
    """``trace`` with the future of every task running at checkpoint ``k`` rewritten: its remaining run
    scaled by a random factor in [0.2, 5] (it still ends after the checkpoint), its finish features
    and its snapshots at later checkpoints replaced by noise. Everything up to checkpoint ``k`` stays."""
    rng = np.random.default_rng(seed)
    c = float(trace.checkpoints[k])
    changed = np.flatnonzero((trace.start <= c) & (c < trace.end))
    end = trace.end.copy()
    end[changed] = c + (end[changed] - c) * rng.uniform(0.2, 5.0, size=len(changed))
    later_x = trace.finish_features.copy()
    later_x[changed] = rng.normal(0.0, 3.0, size=(len(changed), later_x.shape[1]))
    running_index, running_features = [], []
    for j, t in enumerate(trace.checkpoints):
        if j <= k:
            running_index.append(trace.running_index[j])
            running_features.append(trace.running_features[j])
            continue
        idx = np.flatnonzero((trace.start <= t) & (t < end))
        running_index.append(idx)
        running_features.append(later_x[idx])
    # a task now ending past the last checkpoint needs checkpoints up to its end
    interval = float(trace.checkpoints[1] - trace.checkpoints[0])
    extra = interval * np.arange(1, math.ceil((end.max() - trace.checkpoints[-1]) / interval) + 1)
    checkpoints = np.concatenate([trace.checkpoints, trace.checkpoints[-1] + extra])
    for t in checkpoints[len(trace.checkpoints) :]:
        idx = np.flatnonzero((trace.start <= t) & (t < end))
        running_index.append(idx)
        running_features.append(later_x[idx])
    return dataclasses.replace(
        trace,
        end=end,
        finish_features=later_x,
        checkpoints=checkpoints,
        running_index=running_index,
        running_features=running_features,
    )


@functools.cache
def population_prototype(name: str) -> StragglerMethod:
    """``name`` trained across other jobs (never the one replayed); START set up without torch."""
    jobs = [make_job(80, seed=100 + i, job_id=f"other-{i}", slow_group=0.1 * (i % 3)) for i in range(6)]
    method = make_method(name)
    if isinstance(method, StartMethod):
        saved = sys.modules.get("torch")
        sys.modules["torch"] = None  # type: ignore[assignment]  # inference and set-up without torch
        try:
            return method.init_population(jobs)
        finally:
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved
    return method.fit_population(jobs)


def prototypes_for(name: str) -> Prototypes | None:
    return {name: population_prototype(name)} if make_method(name).learns_across_jobs else None


def decisions_up_to(
    trace: JobTrace, name: str, cutoff: float, prototypes: Prototypes | None
) -> list[Decision]:
    """Every verdict given at checkpoints up to ``cutoff``, in order."""
    out: list[Decision] = []
    for t, verdicts in zip(
        trace.checkpoints, method_decisions(trace, name, CONFIG, prototypes), strict=False
    ):
        if t > cutoff:
            break
        out.extend(verdicts)
    return out


def _same(a: Decision, b: Decision) -> bool:
    """Field by field, NaN equal to NaN."""
    for f in dataclasses.fields(Decision):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
            return False
    return True


def first_difference(a: list[Decision], b: list[Decision]) -> str | None:
    """A description of the first verdict that differs between two runs, or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if not _same(x, y):
            return f"verdict {i} differs:\n  as it happened: {x}\n  future changed: {y}"
    if len(a) != len(b):
        return f"{len(a)} verdicts as it happened, {len(b)} with the future changed"
    return None


@pytest.fixture
def frozen_grants(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hold a granted-labels method's grant fixed across both runs: the paper grants Wrangler true
    labels of 2/3 of the job (future information by design, the one declared exception); the check
    is that nothing *else* from the future reaches it. The first grant seen is replayed later."""
    recorded: dict[str, tuple[Any, Any]] = {}
    for name in method_names():
        cls = type(make_method(name))
        if not cls.needs_granted_labels:
            continue
        original = cls.grant_labels

        def replaying(
            self: StragglerMethod, X: Any, labels: Any, _orig: Any = original, _key: str = name
        ) -> None:
            X, labels = recorded.setdefault(_key, (X, labels))
            _orig(self, X, labels)

        monkeypatch.setattr(cls, "grant_labels", replaying)
    yield


def assert_no_future_information(name: str, prototypes: Prototypes | None = None) -> None:
    trace = the_job()
    k = cutoff_index(trace)
    cutoff = float(trace.checkpoints[k])
    changed = with_rewritten_future(trace, k)
    assert not np.array_equal(changed.end, trace.end)  # the future did change
    before = decisions_up_to(trace, name, cutoff, prototypes)
    after = decisions_up_to(changed, name, cutoff, prototypes)
    rewritten = {changed.task_ids[i] for i in np.flatnonzero(changed.end != trace.end)}
    # not vacuous: the method gave verdicts on tasks whose future was then rewritten
    assert sum(d.task_id in rewritten for d in before) >= 10
    difference = first_difference(before, after)
    assert difference is None, f"{name} decided differently once the future changed: {difference}"


@pytest.mark.parametrize("name", [_param(name) for name in method_names() if name != ORACLE])
@pytest.mark.usefixtures("frozen_grants")
def test_no_verdict_depends_on_what_running_tasks_do_later(name: str) -> None:
    """Every registered method but the oracle-fed control: rewriting running tasks' futures changes no
    verdict given before."""
    assert_no_future_information(name, prototypes_for(name))


def test_the_oracle_fed_control_is_caught_and_is_the_only_exception() -> None:
    """The oracle is told the future by design: the check catches it, and it is the only method that
    declares it."""
    with pytest.raises(AssertionError, match="decided differently"):
        assert_no_future_information(ORACLE)
    told = [n for n in method_names() if n != "start" and make_method(n).uses_future_information]
    assert told == [ORACLE]


class PeekingReactive(StragglerMethod):
    """Negative control: the reactive rule, plus a peek at each running task's true end."""

    name = "peeking"
    predicts_latency = False
    true_end: ClassVar[dict[str, float]] = {}
    """Set by the test from the trace being replayed: the future, which no method may see."""

    def fit(self, data: CheckpointData) -> Self:
        return self

    def predict(self, data: CheckpointData) -> Scores:
        assert data.running_ids is not None and data.start_running is not None
        true_latency = np.array([self.true_end[i] for i in data.running_ids]) - data.start_running
        return Scores.from_labels((data.elapsed_running >= data.threshold) | (true_latency >= data.threshold))


def test_the_check_catches_a_method_that_peeks_at_the_future(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: the same check fails for a method that reads running tasks' true ends."""
    real_replay = method_decisions

    def replay_with_peek(trace: JobTrace, *args: Any, **kwargs: Any) -> Iterator[list[Decision]]:
        monkeypatch.setattr(PeekingReactive, "true_end", dict(zip(trace.task_ids, trace.end, strict=True)))
        yield from real_replay(trace, *args, **kwargs)

    monkeypatch.setattr(sys.modules[__name__], "method_decisions", replay_with_peek)
    with pytest.raises(AssertionError, match="peeking decided differently once the future changed"):
        assert_no_future_information("peeking", {"peeking": PeekingReactive()})
