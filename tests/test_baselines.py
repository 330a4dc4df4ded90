"""The paper's baselines: the `StragglerMethod` contract for each, then what each one should learn."""

from __future__ import annotations

import copy
import functools
import importlib.util
import sys
from dataclasses import dataclass, replace

import numpy as np
import pytest
from scipy import optimize, stats

from straggler.core.arrays import BoolArray, FloatArray
from straggler.core.baselines import (
    BASELINES,
    _tobit_objective,
    breslow_baseline,
    conditional_log_median,
)
from straggler.core.jobtrace import JobTrace
from straggler.core.method import CheckpointData, Scores, StragglerMethod
from straggler.core.nurd import PRESETS as NURD_PRESETS
from straggler.core.outliers import OUTLIER_DETECTORS
from straggler.core.preprocessing import Standardiser, impute_like
from straggler.core.registry import make_method
from straggler.core.start import StartMethod

HAS_PYOD = importlib.util.find_spec("pyod") is not None
needs_pyod = pytest.mark.skipif(
    not HAS_PYOD, reason="PyOD not installed: pip install 'straggler-stream[outliers]'"
)

# Every registered method, NURD's presets included, passes the one contract test below.
METHOD_PARAMS = (
    [pytest.param(name, id=name) for name in [*NURD_PRESETS, *BASELINES]]
    + [pytest.param(name, id=name, marks=needs_pyod) for name in OUTLIER_DETECTORS]
    + [pytest.param("start", id="start")]
    + [pytest.param("admm", id="admm")]
)


@dataclass(frozen=True)
class SyntheticJob:
    """One checkpoint of a job whose latency grows with feature 0, plus the labels granted to Wrangler."""

    data: CheckpointData
    granted_X: FloatArray
    granted_labels: BoolArray
    """True labels of a random 2/3 of the job, the evaluator's grant to Wrangler."""


def synthetic_job(
    seed: int, n_tasks: int = 300, n_features: int = 6, finished_fraction: float = 0.6
) -> SyntheticJob:
    """latency = exp(1 + x0 + noise); tasks start over [0, 2]; the checkpoint falls when
    ``finished_fraction`` of them are done, so the running tasks are mostly the slow ones."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_tasks, n_features))
    latency = np.exp(1.0 + X[:, 0] + 0.3 * rng.normal(size=n_tasks))
    start = rng.uniform(0.0, 2.0, size=n_tasks)
    now = float(np.quantile(start + latency, finished_fraction))
    finished = start + latency <= now
    running = (start <= now) & ~finished
    threshold = float(np.quantile(latency, 0.9))
    granted = rng.permutation(n_tasks)[: 2 * n_tasks // 3]
    data = CheckpointData(
        X_finished=X[finished],
        latency_finished=latency[finished],
        X_running=X[running],
        elapsed_running=now - start[running],
        threshold=threshold,
        expected_tasks=n_tasks,
    )
    return SyntheticJob(data, X[granted], latency[granted] >= threshold)


def population(n_features: int) -> list[JobTrace]:
    """Small complete jobs with ``n_features`` features (x0 drives latency), for cross-job methods."""
    from harness.small_jobs import make_job

    jobs = []
    for i in range(6):
        job = make_job(80, seed=i, job_id=f"population-{i}")
        rng = np.random.default_rng(i)
        extra = rng.normal(size=(job.n_tasks, n_features - 2))
        jobs.append(
            replace(
                job,
                feature_names=(*job.feature_names, *(f"x{j}" for j in range(2, n_features))),
                finish_features=np.hstack([job.finish_features, extra]),
                running_features=[
                    np.hstack([X, extra[idx]])
                    for X, idx in zip(job.running_features, job.running_index, strict=True)
                ],
            )
        )
    return jobs


@functools.cache
def trained_across_jobs(name: str, n_features: int) -> StragglerMethod:
    """``name`` trained on `population`; START is set up untrained instead (its training needs
    PyTorch, tested in test_start.py; its inference, which this file's contract covers, does not)."""
    method = make_method(name)
    if isinstance(method, StartMethod):
        return method.init_population(population(n_features))
    return method.fit_population(population(n_features))


def fitted(name: str, job: SyntheticJob) -> StragglerMethod:
    """A fresh method of registry name ``name``, granted labels if it takes them, fit on ``job``
    (cross-job methods first trained on a small population of other jobs)."""
    method = make_method(name)
    if method.learns_across_jobs:
        method = copy.deepcopy(trained_across_jobs(name, job.data.X_finished.shape[1]))
    if method.needs_granted_labels:
        method.grant_labels(job.granted_X, job.granted_labels)
    return method.fit(job.data)


def assert_well_formed(method: StragglerMethod, data: CheckpointData, scores: Scores) -> None:
    n = data.n_running
    for field in ("is_straggler", "latency", "adjusted", "propensity", "weight"):
        assert getattr(scores, field).shape == (n,), field
    assert scores.is_straggler.dtype == np.bool_
    if method.predicts_latency:
        assert np.all(np.isfinite(scores.latency)) and np.all(np.isfinite(scores.adjusted))
        np.testing.assert_array_equal(scores.is_straggler, scores.adjusted >= data.threshold)
    else:
        assert np.all(np.isnan(scores.latency)) and np.all(np.isnan(scores.adjusted))


def assert_same_scores(a: Scores, b: Scores) -> None:
    for field in ("is_straggler", "latency", "adjusted", "propensity", "weight"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def with_missing_features(data: CheckpointData, seed: int) -> CheckpointData:
    """10 % of entries NaN, column 1 NaN everywhere (a usage window no task has reached yet)."""
    rng = np.random.default_rng(seed)

    def holes(X: FloatArray) -> FloatArray:
        X = X.copy()
        X[rng.random(X.shape) < 0.1] = np.nan
        X[:, 1] = np.nan
        return X

    return replace(data, X_finished=holes(data.X_finished), X_running=holes(data.X_running))


@pytest.mark.parametrize("name", METHOD_PARAMS)
def test_method_contract(name: str) -> None:
    job = synthetic_job(seed=1)
    data = job.data
    snapshot = {k: np.copy(getattr(data, k)) for k in ("X_finished", "latency_finished", "X_running")}

    # well-formed verdicts on every running task, inputs left untouched
    method = fitted(name, job)
    scores = method.predict(data)
    assert_well_formed(method, data, scores)
    for key, before in snapshot.items():
        np.testing.assert_array_equal(getattr(data, key), before, err_msg=f"{name} mutated {key}")

    # deterministic given its random_state: a second instance fit on the same data agrees exactly
    assert_same_scores(scores, fitted(name, job).predict(data))

    # scikit-learn conventions: parameters round-trip through get_params, learned state ends in _
    clone = type(method)(**method.get_params())
    assert clone.get_params() == method.get_params()
    assert not [key for key in vars(clone) if key.endswith("_")]

    # no future information: the decision-level check, for every method, is in
    # test_no_future_information.py (a method only ever receives `CheckpointData`)

    # a later checkpoint, scored without refit (the driver's refit rule may skip checkpoints)
    later = replace(data, X_running=data.X_running[::2], elapsed_running=data.elapsed_running[::2] + 1.0)
    assert_well_formed(method, later, method.predict(later))

    # missing features: imputed, never propagated
    holey = replace(job, data=with_missing_features(data, seed=3))
    assert_well_formed(method, holey.data, fitted(name, holey).predict(holey.data))

    # no running task: an empty verdict
    idle = replace(data, X_running=data.X_running[:0], elapsed_running=data.elapsed_running[:0])
    idle_scores = fitted(name, replace(job, data=idle)).predict(idle)
    assert_well_formed(method, idle, idle_scores)
    assert len(idle_scores.is_straggler) == 0

    # a single finished task: nothing to learn from, so the documented reactive fallback
    elapsed = data.elapsed_running.copy()
    elapsed[0] = data.threshold  # exactly at the threshold counts as a straggler
    early = replace(
        data,
        X_finished=data.X_finished[:1],
        latency_finished=data.latency_finished[:1],
        elapsed_running=elapsed,
    )
    early_method = fitted(name, replace(job, data=early))
    early_scores = early_method.predict(early)
    assert_well_formed(early_method, early, early_scores)
    # reactive needs no data; wrangler learns from its grant; admm from other jobs only; NURD predicts
    # the finished mean and the job driver floors it at the elapsed time (tested in test_nurd.py)
    if name not in ("reactive", "wrangler", "admm", *NURD_PRESETS):
        assert getattr(early_method, "fallback_", False)
        np.testing.assert_array_equal(early_scores.is_straggler, early.elapsed_running >= early.threshold)


# --------------------------------------------------------------------------------------------------
# Behaviour, method by method
# --------------------------------------------------------------------------------------------------


def probe(data: CheckpointData, x0: FloatArray, elapsed: float) -> CheckpointData:
    """Running tasks that differ only in feature 0, all having run ``elapsed`` seconds."""
    X = np.zeros((len(x0), data.X_finished.shape[1]))
    X[:, 0] = x0
    return replace(data, X_running=X, elapsed_running=np.full(len(x0), elapsed))


def test_reactive_flags_exactly_the_tasks_past_the_threshold() -> None:
    data = synthetic_job(seed=2).data
    elapsed = np.array([0.0, data.threshold - 1e-9, data.threshold, data.threshold + 5.0])
    data = replace(data, X_running=np.zeros((4, data.X_finished.shape[1])), elapsed_running=elapsed)
    scores = BASELINES["reactive"]().fit(data).predict(data)
    np.testing.assert_array_equal(scores.is_straggler, [False, False, True, True])
    np.testing.assert_array_equal(scores.latency, elapsed)
    # sure past the threshold; below it, elapsed time alone says nothing either way (no probability,
    # never a "sure not a straggler" a policy would take at its word)
    np.testing.assert_array_equal(scores.probability, [np.nan, np.nan, 1.0, 1.0])


@pytest.mark.parametrize("name", ["tobit", "grabit"])
def test_censored_regression_latency_grows_with_the_slow_feature(name: str) -> None:
    data = synthetic_job(seed=4, n_tasks=600).data
    x0 = np.linspace(-1.5, 1.5, 13)
    latency = BASELINES[name]().fit(data).predict(probe(data, x0, elapsed=0.01)).latency
    assert stats.spearmanr(x0, latency).statistic > 0.9
    assert latency[-1] > 3 * latency[0]  # exp(1 + x0): the truth grows 20-fold over this range


def test_tobit_learns_from_censored_tasks() -> None:
    """The running (censored) tasks are the slow ones: dropping them must lower the predictions."""
    data = synthetic_job(seed=5, n_tasks=600, finished_fraction=0.5).data
    finished_only = replace(data, X_running=data.X_running[:0], elapsed_running=data.elapsed_running[:0])
    grid = probe(data, np.linspace(0.5, 2.0, 7), elapsed=0.01)
    with_censored = BASELINES["tobit"]().fit(data).predict(grid).latency
    without = BASELINES["tobit"]().fit(finished_only).predict(grid).latency
    assert np.all(np.diff(with_censored) > 0)
    assert np.all(with_censored > without)


def test_tobit_conditional_median_halves_the_remaining_tail() -> None:
    mu = np.array([0.0, 0.0, 2.0, -1.0])
    lower = np.array([-np.inf, 1.0, 0.5, 9.0])  # the last one is 10 sigmas past its mean
    q = conditional_log_median(mu, 0.5, lower)
    assert q[0] == pytest.approx(0.0)
    assert np.all(q[1:] > lower[1:])
    tail = stats.norm.logsf(lower, loc=mu, scale=0.5)
    np.testing.assert_allclose(stats.norm.logsf(q, loc=mu, scale=0.5), tail + np.log(0.5), rtol=1e-6)


def test_tobit_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    design = np.hstack([np.ones((40, 1)), rng.normal(size=(40, 3))])
    y = rng.normal(size=40)
    censored = rng.random(40) < 0.4
    theta = 0.3 * rng.normal(size=5)

    def value(t: FloatArray) -> float:
        return _tobit_objective(t, design, y, censored, 1.0)[0]

    def gradient(t: FloatArray) -> FloatArray:
        return _tobit_objective(t, design, y, censored, 1.0)[1]

    assert optimize.check_grad(value, gradient, theta) < 1e-4 * np.linalg.norm(gradient(theta))


def test_coxph_straggler_probability_grows_with_the_slow_feature() -> None:
    data = synthetic_job(seed=6, n_tasks=600).data
    x0 = np.linspace(-1.5, 1.5, 13)
    method = BASELINES["coxph"]().fit(data)
    p = method.predict(probe(data, x0, elapsed=1.0)).propensity
    assert np.all((p >= 0) & (p <= 1))
    assert stats.spearmanr(x0, p).statistic > 0.9
    assert p[-1] > p[0] + 0.3
    # a task already past the threshold is certainly past it
    assert np.all(method.predict(probe(data, x0, elapsed=data.threshold * 1.01)).propensity == 1.0)


def test_coxph_learns_from_censored_tasks() -> None:
    """Without the running tasks the risk set empties at the last finish and every slow task looks
    certain to finish soon; with them censored, slow-looking tasks keep a real chance to straggle."""
    data = synthetic_job(seed=6, n_tasks=600).data
    finished_only = replace(data, X_running=data.X_running[:0], elapsed_running=data.elapsed_running[:0])
    grid = probe(data, np.linspace(0.5, 2.0, 7), elapsed=float(np.median(data.elapsed_running)))
    with_censored = BASELINES["coxph"]().fit(data).predict(grid).propensity
    without = BASELINES["coxph"]().fit(finished_only).predict(grid).propensity
    assert np.all(with_censored > without + 0.1)
    # at x0 = 2, log L ~ N(3, 0.3^2): P(L > threshold | L > elapsed) is about 0.94 here
    assert with_censored[-1] > 0.8


def test_breslow_is_nelson_aalen_when_risks_are_equal() -> None:
    times = np.array([3.0, 1.0, 4.0, 2.0])
    event = np.array([True, True, True, False])
    event_times, hazard = breslow_baseline(times, event, np.ones(4))
    np.testing.assert_array_equal(event_times, [1.0, 3.0, 4.0])
    np.testing.assert_allclose(hazard, [1 / 4, 1 / 4 + 1 / 2, 1 / 4 + 1 / 2 + 1])
    # a subject twice as risky counts twice in the risk set
    _, weighted = breslow_baseline(times, event, np.array([2.0, 1.0, 1.0, 1.0]))
    np.testing.assert_allclose(weighted[0], 1 / 5)


def test_wrangler_separates_a_linearly_separable_job() -> None:
    rng = np.random.default_rng(8)
    X = rng.normal(size=(400, 5))
    X = X[np.abs(X[:, 0] - 1.0) > 0.2]  # a margin around the boundary x0 = 1
    is_straggler = X[:, 0] > 1.0
    granted, running = X[: 2 * len(X) // 3], X[2 * len(X) // 3 :]
    data = CheckpointData(X[:0], np.zeros(0), running, np.ones(len(running)), 10.0, len(X))
    method = BASELINES["wrangler"]()
    method.grant_labels(granted, is_straggler[: len(granted)])
    scores = method.fit(data).predict(data)
    assert np.mean(scores.is_straggler == is_straggler[len(granted) :]) >= 0.95
    assert scores.is_straggler.any()


@pytest.mark.parametrize("grant", [[False] * 5, [True] * 5, []], ids=["all-fast", "all-slow", "empty"])
def test_wrangler_with_a_single_class_grant_predicts_it(grant: list[bool]) -> None:
    data = synthetic_job(seed=9).data
    method = BASELINES["wrangler"]()
    method.grant_labels(data.X_finished[: len(grant)], np.array(grant, dtype=bool))
    expected = bool(grant[0]) if grant else False
    assert np.all(method.fit(data).predict(data).is_straggler == expected)


def alike_and_unlike(seed: int, shift: float, scatter: bool = False) -> tuple[CheckpointData, BoolArray]:
    """Finished tasks ~ N(0, I); half the running tasks alike, half moved ``shift`` away: all along
    x0, or each in its own random direction when ``scatter``."""
    rng = np.random.default_rng(seed)
    finished = rng.normal(size=(300, 5))
    running = rng.normal(size=(200, 5))
    unlike = np.arange(200) >= 100
    if scatter:
        direction = rng.normal(size=(100, 5))
        running[unlike] += shift * direction / np.linalg.norm(direction, axis=1, keepdims=True)
    else:
        running[unlike, 0] += shift
    data = CheckpointData(finished, np.exp(rng.normal(size=300)), running, np.full(200, 0.5), 100.0, 500)
    return data, unlike


@pytest.mark.parametrize("name", ["pu-en", "pu-bg"])
def test_pu_learners_flag_running_tasks_unlike_the_finished_ones(name: str) -> None:
    data, unlike = alike_and_unlike(seed=10, shift=4.0)
    flagged = BASELINES[name]().fit(data).predict(data).is_straggler
    assert flagged[unlike].mean() > 0.8
    assert flagged[unlike].mean() > flagged[~unlike].mean() + 0.5


@needs_pyod
@pytest.mark.parametrize("name", list(OUTLIER_DETECTORS))
def test_outlier_detectors_flag_running_tasks_far_from_the_finished_ones(name: str) -> None:
    """Scattered far tasks: a tight group of far tasks is locally dense, and the transductive
    detectors (SOS, COF, SOD), which score running tasks alongside the finished ones, may miss it."""
    data, unlike = alike_and_unlike(seed=11, shift=8.0, scatter=True)
    flagged = OUTLIER_DETECTORS[name]().fit(data).predict(data).is_straggler
    assert flagged[unlike].mean() > flagged[~unlike].mean()


def test_outlier_detectors_name_the_extra_when_pyod_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in [m for m in sys.modules if m == "pyod" or m.startswith("pyod.")] + ["pyod"]:
        monkeypatch.setitem(sys.modules, module, None)  # makes `import pyod...` fail
    data, _ = alike_and_unlike(seed=12, shift=1.0)
    for cls in OUTLIER_DETECTORS.values():
        with pytest.raises(ImportError, match=r"straggler-stream\[outliers\]"):
            cls().fit(data)


def test_imputation_uses_the_reference_columns_only() -> None:
    ref = np.array([[1.0, np.nan, 5.0], [3.0, np.nan, np.inf]])
    X = np.array([[np.nan, np.nan, np.nan], [7.0, 8.0, -np.inf]])
    np.testing.assert_array_equal(impute_like(ref, X), [[2.0, 0.0, 5.0], [7.0, 8.0, 5.0]])
    assert np.isnan(X[0, 0])  # the input is not modified
    scaler = Standardiser.learn(ref)
    np.testing.assert_array_equal(scaler.varying, [True, False, False])
    assert np.all(np.isfinite(scaler.transform(X)))
