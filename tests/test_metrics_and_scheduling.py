import numpy as np

from straggler.core.metrics import confusion, f1_over_time, lead_time
from straggler.core.scheduling import relaunch_latencies, simulate_relaunches


def test_confusion_rates() -> None:
    truth = np.array([True, True, False, False, False])
    predicted = np.array([True, False, True, False, False])
    c = confusion(truth, predicted)
    assert (c.tp, c.fp, c.fn, c.tn) == (1, 1, 1, 2)
    assert c.tpr == 0.5 and c.fnr == 0.5 and abs(c.fpr - 1 / 3) < 1e-12 and c.f1 == 0.5


def test_f1_over_time_counts_only_flags_raised_so_far() -> None:
    truth = np.array([True, False])
    flag = np.array([6.0, np.nan])
    series = f1_over_time(truth, flag, 0.0, 10.0, points=10)
    assert series[:5].tolist() == [0.0] * 5 and series[5:].tolist() == [1.0] * 5


def test_lead_time_is_share_of_runtime_left() -> None:
    truth = np.array([True, True, False])
    flag = np.array([2.0, np.nan, 1.0])
    assert lead_time(truth, flag, np.zeros(3), np.array([10.0, 10.0, 10.0])) == 0.8


def test_unlimited_relaunch_shortens_the_job_and_counts_wasted_work() -> None:
    start = np.zeros(3)
    end = np.array([10.0, 10.0, 100.0])
    flag = np.array([np.nan, np.nan, 20.0])
    result = simulate_relaunches(start, end, flag, np.array([10.0, 10.0, 10.0]), np.arange(10.0, 110.0, 10.0))
    assert result.before == 100.0 and result.after == 30.0 and result.relaunched == 1
    assert abs(result.reduction - 0.7) < 1e-12
    assert abs(result.extra_work - 20.0 / 120.0) < 1e-12


def test_limited_machines_make_stragglers_wait() -> None:
    start = np.zeros(3)
    end = np.array([100.0, 100.0, 100.0])
    flag = np.array([10.0, 10.0, 10.0])
    new = np.array([5.0, 5.0, 5.0])
    checkpoints = np.arange(10.0, 110.0, 10.0)
    one = simulate_relaunches(start, end, flag, new, checkpoints, machines=1)
    # one spare: relaunched at 10 (done 15), 20 (done 25), 30 (done 35)
    assert one.after == 35.0 and one.relaunched == 3
    unlimited = simulate_relaunches(start, end, flag, new, checkpoints)
    assert unlimited.after == 15.0


def test_relaunch_draws_are_reproducible_per_job() -> None:
    pool = np.arange(1.0, 100.0)
    a = relaunch_latencies(pool, 50, "job-a", seed=3)
    assert np.array_equal(a, relaunch_latencies(pool, 50, "job-a", seed=3))
    assert not np.array_equal(a, relaunch_latencies(pool, 50, "job-b", seed=3))
    assert set(a) <= set(pool)
