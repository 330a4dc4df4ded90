import numpy as np

from straggler.core.survival import kaplan_meier
from straggler.core.threshold import censored_lognormal, online_threshold, oracle_threshold


def test_kaplan_meier_matches_a_hand_computed_curve() -> None:
    # events at 1, 3; censored at 2; event at 4 -> S = 3/4, 3/4*1/2, 0
    times, survival = kaplan_meier(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 0.0, 1.0, 1.0]))
    assert times.tolist() == [1.0, 3.0, 4.0]
    np.testing.assert_allclose(survival, [0.75, 0.375, 0.0])


def test_online_threshold_is_exact_once_identifiable() -> None:
    rng = np.random.default_rng(1)
    latency = rng.lognormal(3.0, 0.5, size=500)
    at = np.quantile(latency, 0.95)  # everything below the p95 has finished
    finished = latency[latency <= at]
    elapsed = np.full(int(np.sum(latency > at)), at)
    estimate = online_threshold(finished, elapsed)
    assert estimate.identified
    assert abs(estimate.value - oracle_threshold(latency)) / oracle_threshold(latency) < 0.01


def test_online_threshold_extrapolates_above_what_it_has_seen_early() -> None:
    rng = np.random.default_rng(2)
    latency = rng.lognormal(3.0, 0.5, size=1000)
    at = np.quantile(latency, 0.3)
    finished = latency[latency <= at]
    elapsed = np.full(int(np.sum(latency > at)), at)
    estimate = online_threshold(finished, elapsed)
    assert not estimate.identified
    naive = np.quantile(finished, 0.9)
    truth = oracle_threshold(latency)
    # censoring-aware estimate is far closer to the truth than the finished tasks' own p90
    assert abs(estimate.value - truth) < 0.25 * abs(naive - truth)
    assert estimate.value >= finished.max()


def test_censored_lognormal_recovers_the_parameters_the_finished_tasks_alone_miss() -> None:
    rng = np.random.default_rng(3)
    latency = rng.lognormal(3.0, 0.5, size=2000)
    at = np.quantile(latency, 0.5)  # half still running at the checkpoint
    finished = latency[latency <= at]
    mu, sigma = censored_lognormal(finished, np.full(int(np.sum(latency > at)), at))
    assert abs(mu - 3.0) < 0.05 and abs(sigma - 0.5) < 0.05
    naive = np.log(finished)  # ignoring the running tasks biases both down
    assert naive.mean() < 2.8 and naive.std() < 0.35
