"""START: the Pareto model, the past-only checkpoint summaries, and the encoder-LSTM method."""

from __future__ import annotations

import math
import pickle
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from harness.small_jobs import make_job

from straggler.core.jobtrace import JobTrace, checkpoint_grid
from straggler.core.method import CheckpointData
from straggler.core.registry import make_method
from straggler.core.start import (
    K_FACTOR,
    StartMethod,
    actual_stragglers,
    expected_stragglers,
    fit_pareto,
    initial_weights,
    straggler_threshold,
    summarise_checkpoint,
    summary_size,
    training_sequence,
)
from straggler.evaluation import EvaluationConfig, method_decisions

# Tests marked `torch` train START or run its PyTorch network; tests/conftest.py skips them when
# PyTorch is missing. Run them with: pip install -e '.[start]' && pytest -m torch
needs_torch = pytest.mark.torch


def population(n_jobs: int = 6, n_tasks: int = 80) -> list[JobTrace]:
    return [make_job(n_tasks, seed=i, job_id=f"job-{i}", slow_group=0.1 * (i % 3)) for i in range(n_jobs)]


def small_start(**kwargs: float) -> StartMethod:
    params: dict = {"encoder": (16, 16, 8), "hidden": 8, "epochs": 30, "patience": 30, **kwargs}
    return StartMethod(**params)


@pytest.fixture(scope="module")
def model() -> StartMethod:
    """A START ready to predict, set up without torch: training's scaling, PyTorch-style initial
    weights. Inference is NumPy alone, so what is tested with it holds for a trained START too;
    torch is made unimportable while it is built, so reaching for it would fail, not skip."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "torch", None)
        return small_start().init_population(population())


@pytest.fixture(autouse=True)
def _no_torch_in_inference(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside `torch` tests, ``import torch`` fails: inference must not need it, installed or not."""
    if request.node.get_closest_marker("torch") is None:
        monkeypatch.setitem(sys.modules, "torch", None)


@pytest.fixture(scope="module")
def trained() -> StartMethod:
    """A START trained with PyTorch (the `start` extra)."""
    return small_start().fit_population(population())


# --------------------------------------------------------------------------------------------------
# Pareto model
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("alpha", "beta"), [(1.5, 2.0), (3.0, 30.0), (0.7, 5.0)])
def test_pareto_mle_recovers_known_parameters(alpha: float, beta: float) -> None:
    rng = np.random.default_rng(0)
    x = (rng.pareto(alpha, size=50_000) + 1.0) * beta
    a, b = fit_pareto(x)
    assert b == pytest.approx(beta, rel=1e-3)
    assert a == pytest.approx(alpha, rel=0.03)
    # Eq. 3 by hand
    assert a == pytest.approx(len(x) / np.sum(np.log(x / x.min())))


def test_pareto_fit_of_equal_latencies_has_infinite_tail_index() -> None:
    assert fit_pareto(np.full(5, 7.0)) == (math.inf, 7.0)
    with pytest.raises(ValueError):
        fit_pareto(np.array([np.nan]))


@pytest.mark.parametrize("alpha", [1.2, 1.8, 3.0, 10.0])
def test_expected_stragglers_is_q_times_the_pareto_tail_beyond_k(alpha: float) -> None:
    beta, q = 4.0, 1000
    K = straggler_threshold(alpha, beta)
    assert pytest.approx(K_FACTOR * alpha * beta / (alpha - 1)) == K
    survival = (K / beta) ** -alpha  # 1 - F(K), Eq. 1
    assert expected_stragglers(alpha, q) == pytest.approx(q * survival)
    # and a Monte Carlo check: the share of Pareto samples beyond K
    rng = np.random.default_rng(1)
    x = (rng.pareto(alpha, size=400_000) + 1.0) * beta
    assert np.mean(x > K) == pytest.approx(survival, abs=3e-3)


def test_expected_stragglers_without_a_finite_mean_is_zero() -> None:
    assert expected_stragglers(1.0, 100) == 0.0
    assert expected_stragglers(0.5, 100) == 0.0
    assert straggler_threshold(0.9, 1.0) == math.inf
    assert expected_stragglers(1.0 + 1e-9, 100) < 1e-6  # continuous at alpha -> 1+


def test_expected_stragglers_never_exceeds_about_eleven_percent() -> None:
    alphas = np.linspace(1.001, 50, 5000)
    shares = [expected_stragglers(float(a), 1.0) for a in alphas]
    assert max(shares) == pytest.approx(0.112, abs=0.002)


def test_actual_stragglers_counts_latencies_beyond_the_jobs_own_k() -> None:
    x = np.array([1.0, 1.0, 1.1, 1.2, 1.3, 10.0])
    alpha, beta = fit_pareto(x)
    K = straggler_threshold(alpha, beta)
    assert actual_stragglers(x) == int(np.sum(x > K)) == 1


# --------------------------------------------------------------------------------------------------
# Checkpoint summaries: past only, and the same offline and online
# --------------------------------------------------------------------------------------------------


def with_end(trace: JobTrace, task: int, new_end: float) -> JobTrace:
    """``trace`` with one task's end moved; running sets rebuilt (make_job's features are static)."""
    end = trace.end.copy()
    end[task] = new_end
    checkpoints = checkpoint_grid(0.0, float(end.max()), 10.0)
    running_index, running_features = [], []
    for t in checkpoints:
        idx = np.flatnonzero((trace.start <= t) & (t < end)).astype(np.int64)
        running_index.append(idx)
        running_features.append(trace.finish_features[idx])
    return replace(
        trace,
        end=end,
        checkpoints=checkpoints,
        running_index=running_index,
        running_features=running_features,
    )


def test_summary_at_a_checkpoint_ignores_what_happens_after_it() -> None:
    job = make_job(150, seed=3)
    times, before = training_sequence(job)
    assert before.shape == (len(times), summary_size(2))
    cut = times[len(times) // 2]
    # a task still running at the cut and long after: make it finish just after the cut instead
    late = int(np.flatnonzero((job.start <= cut) & (job.end > cut + 30.0))[0])
    faster = with_end(job, late, cut + 5.0)
    times_after, after = training_sequence(faster)
    past = times <= cut
    np.testing.assert_array_equal(times_after[: past.sum()], times[past])
    np.testing.assert_array_equal(after[: past.sum()], before[past])
    # ... and the summaries after the cut do see it (the test would be vacuous otherwise)
    assert not np.array_equal(after[past.sum() :], before[~past])

    # features of later checkpoints do not reach earlier summaries either
    noisy = replace(
        job,
        running_features=[
            X if t <= cut else X + 100.0 for t, X in zip(job.checkpoints, job.running_features, strict=True)
        ],
    )
    np.testing.assert_array_equal(training_sequence(noisy)[1][: past.sum()], before[past])


def test_summary_is_finite_with_missing_features_and_no_running_task() -> None:
    data = CheckpointData(
        X_finished=np.array([[1.0, np.nan], [2.0, np.nan]]),
        latency_finished=np.array([3.0, 5.0]),
        X_running=np.zeros((0, 2)),
        elapsed_running=np.zeros(0),
        threshold=4.0,
        expected_tasks=10,
    )
    z = summarise_checkpoint(data)
    assert z.shape == (summary_size(2),) and np.all(np.isfinite(z))


def test_summary_leaves_out_the_threshold() -> None:
    """The oracle threshold is the job's future (its final p90): it must not reach the model."""
    job = make_job(100, seed=2)
    data = CheckpointData(
        X_finished=job.finish_features[:20],
        latency_finished=job.latency[:20],
        X_running=job.finish_features[20:40],
        elapsed_running=np.full(20, 3.0),
        threshold=10.0,
        expected_tasks=100,
    )
    np.testing.assert_array_equal(
        summarise_checkpoint(data), summarise_checkpoint(replace(data, threshold=99.0))
    )


class _Spy(StartMethod):
    """START that the driver cannot copy, so the test can read what it predicted at each checkpoint."""

    def __deepcopy__(self, memo: dict) -> _Spy:
        return self

    def predict(self, data: CheckpointData):  # type: ignore[no-untyped-def]
        scores = super().predict(data)
        self.seen_ = [*getattr(self, "seen_", []), (self.alpha_, self.beta_)]
        return scores


def test_training_sequences_are_what_the_method_sees_online(model: StartMethod) -> None:
    job = make_job(150, seed=11, job_id="held-out")
    # k huge: E_S ~ 0, START flags nothing itself, so the driver hides the same tasks in both runs
    spy = _Spy(**{**small_start().get_params(), "k": 1e6})
    spy.__dict__.update({k: v for k, v in vars(model).items() if k.endswith("_")})
    config = EvaluationConfig(methods=("start",), threshold="online")
    for _ in method_decisions(job, "start", config, {"start": spy}):
        pass
    online = np.array(spy.seen_)
    _, summaries = training_sequence(job)
    np.testing.assert_allclose(online, spy.parameters_from_summaries(summaries), rtol=1e-12)


# --------------------------------------------------------------------------------------------------
# The method
# --------------------------------------------------------------------------------------------------


def test_registry_builds_start_without_importing_torch() -> None:
    method = make_method("start", seed=3)
    assert isinstance(method, StartMethod) and method.random_state == 3
    assert method.learns_across_jobs and not method.predicts_latency


def test_training_without_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"straggler-stream\[start\]"):
        small_start().fit_population(population(2))


def test_predict_before_training_raises() -> None:
    data = CheckpointData(np.zeros((2, 2)), np.ones(2), np.zeros((1, 2)), np.ones(1), 5.0, 10)
    with pytest.raises(RuntimeError, match="fit_population"):
        StartMethod().predict(data)


def test_a_pickled_start_predicts_the_same(model: StartMethod) -> None:
    copy = pickle.loads(pickle.dumps(model))
    _, summaries = training_sequence(make_job(100, seed=21))
    np.testing.assert_array_equal(
        copy.parameters_from_summaries(summaries), model.parameters_from_summaries(summaries)
    )


def test_the_untrained_start_has_training_scaling_and_varies_with_its_input(model: StartMethod) -> None:
    """`init_population` scales as training does; its network is not constant, so tests run on it
    can tell checkpoints apart (the parity test above would be vacuous otherwise)."""
    _, first = training_sequence(population()[0])
    assert model.x_mean_.shape == model.x_scale_.shape == (summary_size(2),)
    assert model.n_features_ == 2 and model.training_jobs_ == 6
    alpha_beta = model.parameters_from_summaries(first)
    assert np.all(np.isfinite(alpha_beta)) and np.all(alpha_beta[:, 0] > 1.0)
    assert np.ptp(alpha_beta[:, 0]) > 1e-3 and np.ptp(alpha_beta[:, 1]) > 1e-3
    again = small_start().init_population(population())
    for key, value in model.weights_.items():
        np.testing.assert_array_equal(value, again.weights_[key], err_msg=key)


@needs_torch
def test_training_is_deterministic(trained: StartMethod) -> None:
    again = small_start().fit_population(population())
    for key, value in trained.weights_.items():
        np.testing.assert_array_equal(value, again.weights_[key], err_msg=key)
    assert trained.training_jobs_ == 6 and 0 <= trained.best_epoch_ < len(trained.history_) <= 30
    # training lowered its loss: the kept (best) epoch scores below the first
    assert trained.history_[trained.best_epoch_][1] < trained.history_[0][1]


@needs_torch
def test_numpy_inference_matches_the_torch_network() -> None:
    """The NumPy forward pass (`numpy_step`) that serves every prediction is PyTorch's network:
    same weight names and shapes, same outputs on a batch of sequences of unequal lengths."""
    import torch

    from straggler.core.start import _build_network

    method = small_start().init_population(population())
    net = _build_network(torch, len(method.x_mean_), (16, 16, 8), 8, 2).double()
    shapes = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    assert shapes == {k: v.shape for k, v in initial_weights(len(method.x_mean_), (16, 16, 8), 8, 2).items()}
    net.load_state_dict({k: torch.from_numpy(v) for k, v in method.weights_.items()})
    long, other = (training_sequence(make_job(100, seed=seed))[1] for seed in (5, 6))
    sequences = [long, other[: len(other) // 2]]  # a job's first checkpoints: a shorter sequence
    scaled = [np.clip((z - method.x_mean_) / method.x_scale_, -10, 10) for z in sequences]
    with torch.no_grad():
        raw = net(torch.from_numpy(np.concatenate(scaled)), torch.tensor([len(z) for z in scaled])).numpy()
    for i, summaries in enumerate(sequences):
        out = raw[i, : len(summaries)]
        alpha = 1.0 + np.logaddexp(0.0, out[:, 0])
        beta = np.exp(method.log_beta_mean_ + method.log_beta_scale_ * out[:, 1])
        np.testing.assert_allclose(
            method.parameters_from_summaries(summaries), np.column_stack([alpha, beta]), rtol=1e-12
        )


def fixed_alpha(method: StartMethod, alpha: float) -> StartMethod:
    """``method`` with a head that always outputs ``alpha`` (and beta = exp(mean log beta))."""
    method.weights_ = dict(method.weights_)
    method.weights_["head.weight"] = np.zeros_like(method.weights_["head.weight"])
    method.weights_["head.bias"] = np.array([math.log(math.expm1(alpha - 1.0)), 0.0])
    return method


def checkpoint(n_finished: int, n_running: int = 5, expected: int = 95, at: float = 100.0) -> CheckpointData:
    rng = np.random.default_rng(n_finished)
    return CheckpointData(
        X_finished=rng.normal(size=(n_finished, 2)),
        latency_finished=rng.uniform(1.0, 10.0, size=n_finished),
        X_running=rng.normal(size=(n_running, 2)),
        elapsed_running=np.array([1.0, 2.0, 3.0, 4.0, 50.0])[:n_running],
        threshold=20.0,
        expected_tasks=expected,
        at=at,
    )


def test_flags_the_running_tasks_once_only_floor_es_are_unfinished(model: StartMethod) -> None:
    # alpha = 2: E_S = 95 * (1.5 * 2 / 1) ** -2 = 10.56, so floor(E_S) = 10
    method = fixed_alpha(pickle.loads(pickle.dumps(model)), 2.0)
    early = method.predict(checkpoint(n_finished=84))  # 11 unfinished > 10
    assert method.expected_stragglers_ == pytest.approx(95 / 9)
    # only the reactive rule (elapsed >= threshold 20) flags
    np.testing.assert_array_equal(early.is_straggler, [False, False, False, False, True])
    late = method.predict(checkpoint(n_finished=85, at=110.0))  # 10 unfinished <= 10
    assert late.is_straggler.all()
    np.testing.assert_allclose(late.propensity, 95 / 9)
    assert np.all(np.isnan(late.latency))


def test_no_flags_when_es_is_below_one(model: StartMethod) -> None:
    method = fixed_alpha(pickle.loads(pickle.dumps(model)), 1.01)  # E_S ~ 0
    scores = method.predict(checkpoint(n_finished=94))  # 1 unfinished
    assert method.expected_stragglers_ < 1
    np.testing.assert_array_equal(scores.is_straggler, [False, False, False, False, True])


def test_predict_is_idempotent_per_checkpoint_time(model: StartMethod) -> None:
    a = pickle.loads(pickle.dumps(model))
    b = pickle.loads(pickle.dumps(model))
    first, second = checkpoint(30, at=10.0), checkpoint(40, at=20.0)
    a.predict(first)
    a.predict(second)
    b.predict(first)
    b.predict(first)  # a repeated checkpoint replaces its step
    b.predict(second)
    b.predict(second)
    assert (a.alpha_, a.beta_, a.steps_) == (b.alpha_, b.beta_, b.steps_) == (a.alpha_, a.beta_, 2)


def test_a_job_with_other_features_is_refused(model: StartMethod) -> None:
    data = CheckpointData(np.zeros((3, 4)), np.ones(3), np.zeros((2, 4)), np.ones(2), 5.0, 10)
    with pytest.raises(ValueError, match="features"):
        model.predict(data)


def test_the_commands_say_which_extra_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from straggler.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)
    sample = Path(__file__).resolve().parents[1] / "data" / "google-2011-sample"
    common = ["--format", "google-2011", "--trace", str(sample), "--max-jobs", "2"]
    assert (
        main(["evaluate", *common, "--methods", "start", "--workers", "1", "--out", str(tmp_path / "e")]) == 2
    )
    assert main(["train", *common, "--method", "start", "--out", str(tmp_path / "m.pkl")]) == 2
    err = capsys.readouterr().err
    assert err.count("straggler-stream[start]") == 2
