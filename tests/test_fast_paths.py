"""The fast paths of `straggler.core.fast_paths` give exactly what the library calls they replace give."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xgboost as xgb
from sklearn.linear_model import LogisticRegression

from straggler.core.fast_paths import fit_booster, fit_logistic, positive_probability, regressor_predict
from straggler.core.nurd import GradientBoostedLatency


def _data(seed: int, n: int, d: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[rng.random(size=X.shape) < 0.1] = np.nan
    y = X[:, 0] * 0.5 + rng.normal(size=n)
    return X, np.nan_to_num(y)


@pytest.mark.parametrize(("seed", "n"), [(0, 3), (1, 17), (2, 80), (3, 400)])
@pytest.mark.parametrize(("depth", "rate"), [(4, 0.1), (2, 0.3)])
def test_the_latency_regressor_is_xgboosts_regressor(seed: int, n: int, depth: int, rate: float) -> None:
    """`GradientBoostedLatency.fit` (`fit_booster`, XGBoost's public ``train``) trains the very booster
    the scikit-learn wrapper with the same parameters trains, byte for byte."""
    X, y = _data(seed, n)
    library = xgb.XGBRegressor(
        n_estimators=30,
        max_depth=depth,
        learning_rate=rate,
        tree_method="hist",
        n_jobs=1,
        random_state=seed,
        verbosity=0,
    )
    library.fit(X, y)
    part = GradientBoostedLatency(n_estimators=30, max_depth=depth, learning_rate=rate, n_threads=1)
    booster = part.fit(X, y, random_state=seed)
    assert bytes(booster.save_raw("ubj")) == bytes(library.get_booster().save_raw("ubj"))
    assert np.array_equal(regressor_predict(booster, X), library.predict(X))
    params = {k: v for k, v in library.get_xgb_params().items() if v is not None}
    assert params == part.booster_params(seed)


@pytest.mark.parametrize("balanced", [True, False])
@pytest.mark.parametrize(("seed", "n", "C"), [(0, 12, 1.0), (1, 60, 1.0), (2, 300, 1e4), (3, 40, 1e4)])
def test_fit_logistic_is_scikit_learns_fit(seed: int, n: int, C: float, balanced: bool) -> None:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    y = (X[:, 1] + rng.normal(size=n) > 0.8).astype(np.float64)
    for columns in (X, X[:, :1], X[:, 1:3]):  # contiguous and strided
        library = LogisticRegression(C=C, max_iter=300, class_weight="balanced" if balanced else None)
        library.fit(columns, y)
        fast = fit_logistic(columns, y, C=C, max_iter=300, balanced=balanced)
        assert np.array_equal(fast.coef_, library.coef_)
        assert np.array_equal(fast.intercept_, library.intercept_)
        assert np.array_equal(fast.classes_, library.classes_)
        assert np.array_equal(fast.n_iter_, library.n_iter_)
        assert fast.get_params() == library.get_params()
        assert np.array_equal(positive_probability(fast, columns), library.predict_proba(columns)[:, 1])


def test_fit_logistic_leaves_other_inputs_to_scikit_learn() -> None:
    X = np.arange(12.0).reshape(6, 2)
    with pytest.raises(ValueError, match="NaN"):
        fit_logistic(
            np.where(X > 10, np.nan, X), np.array([0.0, 1.0] * 3), C=1.0, max_iter=100, balanced=True
        )
    with pytest.raises(ValueError, match="one class"):
        fit_logistic(X, np.zeros(6), C=1.0, max_iter=100, balanced=False)
    labels = np.array([2.0, 3.0] * 3)  # not 0 / 1: scikit-learn's own fit, classes as given
    assert np.array_equal(fit_logistic(X, labels, C=1.0, max_iter=100, balanced=False).classes_, [2.0, 3.0])


def test_regressor_predict_is_xgboosts_predict() -> None:
    X, y = _data(5, 60)
    model = xgb.XGBRegressor(n_estimators=20, max_depth=3, tree_method="hist", n_jobs=1, random_state=0)
    model.fit(X, y)
    booster = fit_booster(model.get_xgb_params(), X, y, 20)
    rows, _ = _data(6, 35)
    shapes: list[Any] = [
        rows,
        rows[:1],
        rows[::2],
        np.asfortranarray(rows),
        rows.astype(np.float32),
        rows[:0],
    ]
    for Z in shapes:
        fast = regressor_predict(booster, Z)
        assert fast.dtype == np.float32
        assert np.array_equal(fast, model.predict(Z))
    with pytest.raises(ValueError, match="shape mismatch"):
        regressor_predict(booster, rows[:, :3])
