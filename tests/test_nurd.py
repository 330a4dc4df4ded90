import dataclasses
from typing import Any

import numpy as np
import pytest
from job_steps import each_checkpoint
from jobs_for_tests import make_job

from straggler.core.jobtrace import JobTrace
from straggler.core.method import CheckpointData
from straggler.core.nurd import (
    PRESETS,
    USED_ONLY_WHEN,
    Nurd,
    _judged,
    _Ranking,
    centroid_calibration,
    make_nurd,
    mostly_right,
)
from straggler.core.online import OnlineJob
from straggler.core.preprocessing import impute_like
from straggler.evaluation import EvaluationConfig, evaluate_job, flag_times


def _checkpoint(n_fin: int = 20, n_run: int = 480, signal: float = 1.0, seed: int = 0) -> CheckpointData:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_fin + n_run, 3))
    latency = np.exp(3 + signal * X[:, 0] + 0.3 * rng.normal(size=len(X)))
    order = np.argsort(latency)
    fin, run = order[:n_fin], order[n_fin:]
    elapsed = np.full(n_run, latency[fin].max())
    return CheckpointData(X[fin], latency[fin], X[run], elapsed, float(np.quantile(latency, 0.9)), len(X))


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_are_deterministic_and_shaped(preset: str) -> None:
    data = _checkpoint()
    a = make_nurd(preset, random_state=3).fit(data).predict(data)
    b = make_nurd(preset, random_state=3).fit(data).predict(data)
    assert a.adjusted.shape == (data.n_running,)
    np.testing.assert_array_equal(a.adjusted, b.adjusted)
    assert np.all(a.adjusted >= a.latency - 1e-9)  # weights are in (0, 1]


def test_paper_formula_inflates_everything_early_and_nurd_does_not() -> None:
    """The measured failure that motivates `nurd`: with 4% finished, z ~ 0.04 and w sits at eps."""
    data = _checkpoint(n_fin=20, n_run=480, signal=0.0)
    paper = make_nurd("nurd-paper").fit(data).predict(data)
    ours = make_nurd("nurd").fit(data).predict(data)
    assert np.median(paper.weight) < 0.2
    assert paper.is_straggler.mean() > 0.5
    assert ours.is_straggler.mean() < 0.05


def test_centroid_calibration_depends_on_feature_origin() -> None:
    rng = np.random.default_rng(0)
    X_fin, X_run = rng.normal(size=(50, 2)), rng.normal(0.5, 1, size=(500, 2))
    assert centroid_calibration(X_fin, X_run, 0.5) != pytest.approx(
        centroid_calibration(X_fin + 10, X_run + 10, 0.5)
    )


def test_nurd_without_signal_is_the_reactive_rule() -> None:
    trace = make_job(300, signal=0.0, seed=4)
    config = EvaluationConfig(methods=("nurd",), threshold="oracle")
    flags, _ = flag_times(trace, "nurd", config)
    p90 = np.quantile(trace.latency, 0.9)
    # reactive: flagged at the first checkpoint where elapsed >= p90
    for i in np.flatnonzero(np.isfinite(flags)):
        assert flags[i] - trace.start[i] >= p90 - 1e-9


@pytest.mark.parametrize(("method", "seed"), [("nurd", 2), ("nurd", 3), ("nurd-warm", 2)])
def test_nurd_flags_a_visible_slow_machine_group_early_once_its_history_shows_it_works(
    method: str, seed: int
) -> None:
    """Tasks on slow machines (visible x1) straggle; later waves are flagged before they pass p90.

    1,200 tasks: with 600 the backtests confirm too few slow tasks for the evidence rule
    (`mostly_right`) to admit the weight, and NURD stays the reactive rule, as it should.
    ``nurd-warm`` only on seed 2: on seed 3 it gains no lead over reactive (docs/results.md §8)."""
    trace = make_job(1200, signal=0.3, seed=seed, slow_group=0.08, interval=2.0, waves=6, wave_gap=40.0)
    config = EvaluationConfig(methods=(method, "reactive"), threshold="online", machine_counts=())
    result = evaluate_job(trace, config).per_method
    assert result[method]["lead_time"] > result["reactive"]["lead_time"] + 0.05
    assert result[method]["fpr"] < 0.05
    assert result[method]["f1"] > 0.85


def test_no_prediction_before_four_percent_finished_and_refit_rule() -> None:
    job = OnlineJob("j", make_nurd("gbtr"), n_features=1, expected_tasks=100, threshold=50.0)
    for i in range(100):
        job.state.observe_running(f"t{i}", np.array([float(i)]), start=0.0, observed_at=1.0)
    for i in range(3):
        job.state.observe_finished(f"t{i}", np.array([float(i)]), latency=5.0 + i, observed_at=5.0 + i)
    assert job.checkpoint(10.0) == []
    job.state.observe_finished("t3", np.array([3.0]), latency=9.0, observed_at=9.0)
    assert len(job.checkpoint(10.0)) == 96 and job.model_version == 1
    job.state.observe_finished("t4", np.array([4.0]), latency=11.0, observed_at=11.0)
    job.checkpoint(12.0)
    assert job.model_version == 2  # 5 >= 4 * 1.25
    job.state.observe_finished("t5", np.array([5.0]), latency=12.0, observed_at=12.5)
    job.checkpoint(13.0)
    assert job.model_version == 2  # 6 < 5 * 1.25


def _with_longer_task(trace: JobTrace, task: int, extra: float) -> JobTrace:
    end = trace.end.copy()
    end[task] += extra
    running_index, running_features = [], []
    x = trace.finish_features
    for t in trace.checkpoints:
        idx = np.flatnonzero((trace.start <= t) & (t < end))
        running_index.append(idx)
        running_features.append(x[idx])
    return dataclasses.replace(trace, end=end, running_index=running_index, running_features=running_features)


@pytest.mark.parametrize("method", ["nurd", "nurd-warm", "nurd-paper", "gbtr"])
def test_decisions_never_depend_on_a_running_task_future(method: str) -> None:
    """Honesty: lengthening a task's future run changes nothing decided before it would have finished."""
    trace = make_job(200, signal=1.0, seed=6)
    config = EvaluationConfig(methods=(method,), threshold="online")
    task = int(np.argmax(trace.latency))
    before, _ = flag_times(trace, method, config)
    after, _ = flag_times(_with_longer_task(trace, task, 500.0), method, config)
    cutoff = trace.end[task]
    decided_early = np.isfinite(before) & (before < cutoff)
    np.testing.assert_array_equal(before[decided_early], after[decided_early])
    assert np.all(~np.isfinite(after) | (after >= cutoff) | np.isfinite(before))


def test_a_strength_needs_confident_evidence_that_its_added_flags_are_mostly_right() -> None:
    # the backtests that admitted the only two model flags on the real trace (both wrong)
    assert not any(mostly_right(right, wrong, 0.85) for right, wrong in [(2, 2), (3, 1), (6, 4)])
    assert all(mostly_right(right, wrong, 0.85) for right, wrong in [(2, 0), (4, 1), (7, 3), (40, 10)])
    assert not mostly_right(0, 0, 0.85)
    # more confidence asks for more evidence
    assert mostly_right(2, 0, 0.85) and not mostly_right(2, 0, 0.9)


def _fits_and_final_method(
    trace: JobTrace, preset: str, monkeypatch: pytest.MonkeyPatch, **overrides: object
) -> tuple[int, int, Nurd]:
    """Replay ``trace`` through an `OnlineJob`; count XGBoost regressors built and refits made."""
    built = 0
    make_regressor = Nurd._regressor

    def counting(self: Nurd) -> object:
        nonlocal built
        built += 1
        return make_regressor(self)

    monkeypatch.setattr(Nurd, "_regressor", counting)
    method = make_nurd(preset, **overrides)
    job = OnlineJob(trace.job_id, method, len(trace.feature_names), trace.expected_tasks)
    for _ in each_checkpoint(job, trace):
        pass
    monkeypatch.undo()
    return built, job.model_version, method


def test_warm_nurd_fits_one_regressor_per_refit_once_it_has_a_past(monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes nurd-warm cheap: the backtest and the skill reuse the job's previous fits."""
    trace = make_job(1200, signal=0.3, seed=2, slow_group=0.08, interval=2.0, waves=6, wave_gap=40.0)
    cold_built, cold_refits, _ = _fits_and_final_method(trace, "nurd-backtest", monkeypatch)
    warm_built, warm_refits, warm = _fits_and_final_method(trace, "nurd-warm", monkeypatch)
    assert warm_refits == cold_refits > 5
    assert cold_built > 4 * cold_refits  # regressor, 3 skill folds, and the backtest's probes
    # cold estimates only while there is no past: the first fits pay 4 (regressor + 3 folds)
    assert warm_built <= warm_refits + 3 * 3
    assert len(warm.history_) == warm.reuse_past_fits and all(not past.history_ for past in warm.history_)


@pytest.mark.parametrize(("signal", "low", "high"), [(1.0, 0.5, 1.0), (0.0, 0.0, 0.1)])
def test_warm_skill_is_how_well_past_fits_predicted_later_tasks(
    signal: float, low: float, high: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, warm = _fits_and_final_method(make_job(600, signal=signal, seed=5), "nurd-warm", monkeypatch)
    assert low <= warm.skill_ <= high


def test_parameters_are_stored_as_given_and_checked_in_fit() -> None:
    """scikit-learn's convention: ``__init__`` stores, ``fit`` refuses."""
    method = Nurd(weighting="bogus", eps=-1.0)  # type: ignore[arg-type]
    assert method.get_params()["weighting"] == "bogus" and method.eps == -1.0
    with pytest.raises(ValueError, match="weighting must be one of"):
        method.fit(_checkpoint())


@pytest.mark.parametrize(
    ("switch", "value"), [("weighting", "centroid"), ("gate", "calibrate"), ("gate", None)]
)
def test_an_unknown_choice_is_refused(switch: str, value: Any) -> None:
    params: dict[str, Any] = {switch: value}
    with pytest.raises(ValueError, match=f"{switch} must be one of .*got {value!r}"):
        Nurd(**params).fit(_checkpoint())


@pytest.mark.parametrize(
    ("preset", "name", "bad", "good"),
    [
        ("nurd-paper", "log_target", 1, True),
        ("nurd", "balanced_propensity", "yes", False),
        ("nurd-paper", "alpha", 1.5, 1.0),
        ("nurd-paper", "alpha", -0.1, 0.0),
        ("nurd", "eps", 0.0, 1.0),
        ("nurd", "eps", 1.5, 0.05),
        ("gbtr", "n_estimators", 0, 1),
        ("gbtr", "n_estimators", 2.0, 2),
        ("gbtr", "max_depth", True, 1),
        ("gbtr", "learning_rate", 0.0, 1.0),
        ("gbtr", "learning_rate", float("nan"), 0.3),
        ("nurd-backtest", "skill_folds", 1, 2),
        ("nurd", "evidence", 1.0, 0.99),
        ("nurd", "evidence", 0.0, 0.01),
        ("nurd-backtest", "reuse_past_fits", -1, 0),
        ("nurd", "significance", 0.0, 0.05),
        ("nurd", "min_stragglers", 0, 1),
        ("nurd", "flag_probability", 1.0, 0.5),
        ("nurd", "max_scored", 0, 1),
        ("gbtr", "n_threads", 0, 2),
        ("gbtr", "random_state", -1, 0),
        ("gbtr", "random_state", None, np.int64(7)),
    ],
)
def test_a_value_out_of_range_is_refused_and_the_edge_of_the_range_is_not(
    preset: str, name: str, bad: object, good: object
) -> None:
    with pytest.raises(ValueError, match=f"Nurd: {name} must be"):
        make_nurd(preset, **{name: bad}).fit(_checkpoint())
    make_nurd(preset, **{name: good}).fit(_checkpoint())


def test_the_backtest_gate_needs_the_density_weight() -> None:
    """It picks the density weight's strength; with another weighting it would be gate "skill"."""
    for weighting in ("none", "paper", "nc"):
        with pytest.raises(ValueError, match=r"gate='backtest' .* needs weighting='density'"):
            Nurd(weighting=weighting, gate="backtest").fit(_checkpoint())
        Nurd(weighting=weighting, gate="skill").fit(_checkpoint())


_UNUSED_WHEN: dict[str, tuple[dict[str, Any], Any]] = {
    "balanced_propensity": ({"weighting": "none", "gate": "none"}, False),
    "eps": ({"weighting": "none", "gate": "calibrated"}, 0.1),
    "alpha": ({"weighting": "density", "gate": "none"}, 0.4),
    "skill_folds": ({"gate": "calibrated"}, 5),
    "reuse_past_fits": ({"gate": "calibrated"}, 3),
    "evidence": ({"gate": "skill"}, 0.9),
    "significance": ({"gate": "backtest"}, 0.01),
    "min_stragglers": ({"gate": "skill"}, 10),
    "flag_probability": ({"gate": "none"}, 0.5),
    "max_scored": ({"gate": "backtest"}, 100),
}


def test_each_conditional_parameter_has_a_case_below() -> None:
    assert set(_UNUSED_WHEN) == set(USED_ONLY_WHEN)


@pytest.mark.parametrize("name", list(_UNUSED_WHEN))
def test_a_parameter_set_where_its_switches_leave_it_unused_is_refused(name: str) -> None:
    """Set away from its default where no switch reads it: refused; at its default there: accepted;
    the same value where a switch reads it: accepted."""
    switches, value = _UNUSED_WHEN[name]
    with pytest.raises(ValueError, match=f"Nurd: {name}={value!r} is unused"):
        Nurd(**switches, **{name: value}).fit(_checkpoint())
    Nurd(**switches).fit(_checkpoint())
    switch, readers = USED_ONLY_WHEN[name]
    Nurd(**{**switches, switch: readers[0], name: value}).fit(_checkpoint())


def test_a_backtest_probe_leaves_unused_parameters_at_their_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backtest refits probes with gate "skill", which reads no ``evidence``: a backtest NURD with
    its own ``evidence`` must not hand it to its probes (they would refuse it)."""
    trace = make_job(400, signal=0.3, seed=2, slow_group=0.08, interval=2.0, waves=6, wave_gap=40.0)
    built, refits, method = _fits_and_final_method(trace, "nurd-backtest", monkeypatch, evidence=0.8)
    assert method.evidence == 0.8
    assert built > 4 * refits  # the probes ran


def test_a_job_is_calibrated_once_and_fit_never_calibrates_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver calibrates at the first prediction checkpoint; fit calibrates only a model nobody did."""
    calls = []
    calibrate = Nurd.calibrate

    def counting(self: Nurd, data: CheckpointData) -> None:
        calls.append(data.n_finished)
        calibrate(self, data)

    monkeypatch.setattr(Nurd, "calibrate", counting)
    _, refits, _ = _fits_and_final_method(make_job(300, signal=1.0, seed=4), "nurd-paper", monkeypatch)
    assert refits > 2 and len(calls) == 1
    data = _checkpoint()
    alone = make_nurd("nurd-paper").fit(data)
    X_fin, X_run = impute_like(data.X_finished, data.X_finished), impute_like(data.X_finished, data.X_running)
    assert alone.delta_ == centroid_calibration(X_fin, X_run, alone.alpha)
    alone.fit(_checkpoint(n_fin=100, seed=1))
    assert alone.delta_ == centroid_calibration(X_fin, X_run, alone.alpha)


def test_a_recorded_ranking_is_judged_only_once_its_outcome_is_known_whatever_it_is() -> None:
    """`_judged` keeps a run recorded at a past fit only when it started at least a threshold ago (so
    stragglers and quick finishers are both resolved) and it is still the same run (same start)."""
    ranking = _Ranking(
        ids=("quick", "slow", "young", "restarted", "flagged", "gone"),
        start=np.array([0.0, 0.0, 60.0, 0.0, 10.0, 0.0]),
        percentile=np.array([0.1, 0.9, 0.5, 0.7, 0.8, 0.3]),
        prior_logit=np.zeros(6),
        shadow=np.array([0.2, 0.9, 0.5, 0.6, 0.8, np.nan]),
    )
    data = CheckpointData(
        X_finished=np.zeros((1, 1)),
        latency_finished=np.array([30.0]),
        X_running=np.zeros((3, 1)),
        elapsed_running=np.array([100.0, 40.0, 50.0]),
        threshold=50.0,
        expected_tasks=10,
        at=100.0,
        finish_time=np.array([30.0]),
        start_running=np.array([0.0, 60.0, 50.0]),
        running_ids=("slow", "young", "restarted"),
        finished_ids=("quick",),
        flagged_ids=("flagged",),
        flagged_start=np.array([10.0]),
    )
    rows = _judged([ranking], data)
    # quick finished under the threshold: judged 0; slow has run 100 >= 50: judged 1; young started
    # 40 s ago: not yet; restarted is another run; flagged has run 90 >= 50: 1; gone is unknown.
    np.testing.assert_array_equal(rows[:, 1], [0.1, 0.9, 0.8])
    np.testing.assert_array_equal(rows[:, 3], [0.0, 1.0, 1.0])
    np.testing.assert_array_equal(rows[:, 2], [0.2, 0.9, 0.8])


def test_a_calibrator_acts_only_once_the_flags_of_its_predecessors_proved_mostly_right() -> None:
    """The percentile is significant long before NURD acts on it: a candidate calibrator first
    predicts in the shadow, and only when those shadow flags were judged mostly right does it flag."""
    trace = make_job(1200, signal=0.3, seed=2, slow_group=0.08, interval=2.0, waves=6, wave_gap=40.0)
    method = make_nurd("nurd")
    job = OnlineJob(trace.job_id, method, len(trace.feature_names), trace.expected_tasks)
    history = []
    for decisions, refitted in each_checkpoint(job, trace):
        if refitted:
            history.append((dict(method.calibration_), method.calibrator_ is not None))
        ranked = [d for d in decisions if d.is_straggler and d.adjusted_latency < d.threshold]
        assert not ranked or method.calibrator_ is not None  # (the regressor may flag on its own)
        assert all(0.0 <= d.straggle_probability <= 1.0 for d in decisions)
    acting = [i for i, (_, admitted) in enumerate(history) if admitted]
    assert acting, "the slow machine group is visible: the calibrator must end up acting"
    first = acting[0]
    candidates_before = [i for i, (c, _) in enumerate(history[:first]) if c["p_value"] < method.significance]
    assert candidates_before, "a candidate predicted in the shadow before the first acting calibrator"
    assert history[first][0]["shadow_right"] > history[first][0]["shadow_wrong"]
