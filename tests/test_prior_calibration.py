"""The survival prior's calibration across jobs (`straggler.core.prior_calibration`)."""

import numpy as np
import pytest
from scipy.special import expit
from sklearn.metrics import log_loss

from straggler.core.prior_calibration import PriorCalibration, fit_prior_calibration, prior_examples
from straggler.traces.synthetic import generate_jobs


def test_the_identity_keeps_the_prior_and_the_shipped_map_lowers_it_early_and_raises_it_late() -> None:
    prior = np.array([0.01, 0.1, 0.5, 0.9])
    np.testing.assert_allclose(PriorCalibration(0.0, 1.0, 0.0).transform(prior, 0.3), prior)
    shipped = PriorCalibration()
    early, late = shipped.transform(prior, 0.05), shipped.transform(prior, 0.95)
    assert np.all(np.diff(early) > 0) and np.all(np.diff(late) > 0)  # the prior's order is kept
    assert early[2] < 0.25  # a young job's 0.5 is mostly its curve's ignorance
    assert late[1] > 0.15 and np.all(late > early)  # a task still running late straggles more often
    np.testing.assert_allclose(shipped.transform(prior, np.full(4, 0.05)), early)


def test_fitted_on_complete_jobs_it_predicts_other_jobs_stragglers_better_than_the_raw_prior() -> None:
    """Learned on one set of synthetic jobs, judged on another: lower log loss than the raw prior,
    with the shape the shipped map has (a slope under 1, odds rising with the finished share)."""
    calibration = fit_prior_calibration(generate_jobs(6, seed=10, min_tasks=100, checkpoint_seconds=300.0))
    assert 0.0 < calibration.slope < 1.0 and calibration.progress > 0.0
    examples = [
        prior_examples(job) for job in generate_jobs(6, seed=11, min_tasks=100, checkpoint_seconds=300.0)
    ]
    X = np.concatenate([x for x, _ in examples])
    y = np.concatenate([y for _, y in examples])
    assert 0 < y.sum() < len(y)
    raw = expit(X[:, 0])
    assert log_loss(y, calibration.transform(raw, X[:, 1])) < log_loss(y, raw) - 0.01


def test_a_fit_without_both_outcomes_is_refused() -> None:
    with pytest.raises(ValueError, match="straggled and some that did not"):
        fit_prior_calibration([])
