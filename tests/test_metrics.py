import numpy as np

from straggler.core.metrics import confusion, f1_over_time, lead_time


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
