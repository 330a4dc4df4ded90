"""The fast paths of `straggler.core.fast_paths` give exactly what the library calls they replace give,
and so do the native calls of `straggler.native_calls` (outside the core), which fail here
when the library internals they rely on change (a version without them leaves NURD on the public
calls)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import xgboost as xgb
from sklearn.linear_model import LogisticRegression

from straggler import native_calls
from straggler.core import fast_paths
from straggler.core.fast_paths import (
    positive_probability,
    public_fit_booster,
    public_regressor_predict,
)
from straggler.core.method import CheckpointData
from straggler.core.nurd import GradientBoostedLatency, Nurd


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
    assert np.array_equal(public_regressor_predict(booster, X), library.predict(X))
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
        fast = native_calls.fit_logistic(columns, y, C=C, max_iter=300, balanced=balanced)
        assert np.array_equal(fast.coef_, library.coef_)
        assert np.array_equal(fast.intercept_, library.intercept_)
        assert np.array_equal(fast.classes_, library.classes_)
        assert np.array_equal(fast.n_iter_, library.n_iter_)
        assert fast.get_params() == library.get_params()
        assert np.array_equal(positive_probability(fast, columns), library.predict_proba(columns)[:, 1])


def test_fit_logistic_leaves_other_inputs_to_scikit_learn() -> None:
    X = np.arange(12.0).reshape(6, 2)
    with pytest.raises(ValueError, match="NaN"):
        native_calls.fit_logistic(
            np.where(X > 10, np.nan, X), np.array([0.0, 1.0] * 3), C=1.0, max_iter=100, balanced=True
        )
    with pytest.raises(ValueError, match="one class"):
        native_calls.fit_logistic(X, np.zeros(6), C=1.0, max_iter=100, balanced=False)
    labels = np.array([2.0, 3.0] * 3)  # not 0 / 1: scikit-learn's own fit, classes as given
    fitted = native_calls.fit_logistic(X, labels, C=1.0, max_iter=100, balanced=False)
    assert np.array_equal(fitted.classes_, [2.0, 3.0])


@pytest.mark.parametrize(
    "regressor_predict",
    [public_regressor_predict, native_calls.regressor_predict],
    ids=["public", "native"],
)
def test_regressor_predict_is_xgboosts_predict(regressor_predict: Callable[..., np.ndarray]) -> None:
    """The public call in the core and the native one of `straggler.native_calls` (outside it)."""
    X, y = _data(5, 60)
    model = xgb.XGBRegressor(n_estimators=20, max_depth=3, tree_method="hist", n_jobs=1, random_state=0)
    model.fit(X, y)
    booster = public_fit_booster(model.get_xgb_params(), X, y, 20)
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


@pytest.fixture
def installed() -> Iterator[None]:
    before = fast_paths.library_calls()
    native_calls.install()
    yield
    fast_paths.use_library_calls(before)


def test_the_library_internals_the_native_calls_use_are_there() -> None:
    """The pinned XGBoost and scikit-learn have them; an upgrade that drops or renames one fails
    here, not in a job (which would quietly take the public, slower call)."""
    assert native_calls.NATIVE_XGBOOST and native_calls.NATIVE_SKLEARN
    from sklearn._loss.loss import HalfBinomialLoss
    from sklearn.linear_model._logistic import _LOGISTIC_SOLVER_CONVERGENCE_MSG
    from sklearn.utils.optimize import _check_optimize_result
    from xgboost._data_utils import array_interface
    from xgboost.core import _LIB, _check_call, c_bst_ulong, make_jcargs

    assert callable(array_interface) and callable(_check_call) and callable(make_jcargs)
    assert hasattr(_LIB, "XGBoosterUpdateOneIter") and hasattr(_LIB, "XGBoosterPredictFromDense")
    assert c_bst_ulong is not None
    assert callable(HalfBinomialLoss().loss_gradient) and callable(_check_optimize_result)
    assert isinstance(_LOGISTIC_SOLVER_CONVERGENCE_MSG, str)


@pytest.mark.parametrize(("seed", "n"), [(0, 3), (1, 17), (2, 80), (3, 400)])
@pytest.mark.parametrize(("depth", "rate"), [(4, 0.1), (2, 0.3)])
def test_a_native_fit_is_the_public_fit(seed: int, n: int, depth: int, rate: float) -> None:
    X, y = _data(seed, n)
    params = GradientBoostedLatency(max_depth=depth, learning_rate=rate).booster_params(seed)
    public = fast_paths.public_fit_booster(params, X, y, 30)
    native = native_calls.fit_booster(params, X, y, 30)
    assert bytes(native.save_raw("ubj")) == bytes(public.save_raw("ubj"))


def test_installed_nurd_decides_as_with_the_public_calls(installed: None) -> None:
    """Installed, NURD's own fits and predictions go through the native calls, with the same result."""
    assert fast_paths.library_calls() is native_calls.NATIVE_CALLS
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    latency = np.exp(3 + X[:, 0] + 0.3 * rng.normal(size=300))
    order = np.argsort(latency)
    fin, run = order[:60], order[60:]
    data = CheckpointData(
        X[fin], latency[fin], X[run], np.full(240, latency[fin].max()), float(np.quantile(latency, 0.9)), 300
    )
    native = Nurd().fit(data).predict(data)
    fast_paths.use_library_calls(fast_paths.PUBLIC_CALLS)
    public = Nurd().fit(data).predict(data)
    np.testing.assert_array_equal(native.probability, public.probability)
    np.testing.assert_array_equal(native.latency, public.latency)
