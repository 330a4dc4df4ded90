"""The XGBoost and scikit-learn calls NURD makes at every checkpoint, through the libraries' public API.

`public_fit_booster` is what ``XGBRegressor.fit`` does for NURD's plain parameters (``xgboost.train``
on a `xgboost.QuantileDMatrix`), `public_regressor_predict` the booster's own in-place prediction,
`public_fit_logistic` scikit-learn's ``LogisticRegression.fit``, and `positive_probability` its
``predict_proba`` from the fitted coefficients. NURD calls the first three through `fit_booster`,
`regressor_predict` and `fit_logistic`, which an adapter outside the core may point at faster
equivalents (`use_library_calls`; `straggler/native_calls.py`, bit for bit the same models through
the libraries' internals, which at 100 tasks cost a job's checkpoint a good deal less: docs/performance.md).
`tests/test_fast_paths.py` holds each to the library call it replaces, so a library upgrade that
changes one shows there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np
import xgboost as xgb
from scipy.special import expit
from sklearn.linear_model import LogisticRegression

from straggler.core.arrays import FloatArray


def public_fit_booster(params: Mapping[str, Any], X: FloatArray, y: FloatArray, rounds: int) -> xgb.Booster:
    """``rounds`` rounds of ``xgboost.train`` with booster ``params`` on ``X`` (NaN missing) and ``y``,
    through a `xgboost.QuantileDMatrix` with XGBoost's default bins: the booster that
    ``XGBRegressor(**params, n_estimators=rounds).fit(X, y)`` holds, for the hist tree method and
    nothing the wrapper adds to training (callbacks, early stopping, evaluation sets, weights)."""
    with xgb.config_context(verbosity=params.get("verbosity")):
        train = xgb.QuantileDMatrix(X, y, missing=np.nan, nthread=params.get("n_jobs"))
        return xgb.train(dict(params), train, num_boost_round=rounds, verbose_eval=False)


def public_regressor_predict(booster: xgb.Booster, X: FloatArray) -> FloatArray:
    """``XGBRegressor.predict(X)`` of the regressor holding ``booster``: the booster's in-place
    prediction with every tree (NURD never stops early), NaN missing; float32, as XGBoost gives it."""
    return np.asarray(booster.inplace_predict(X, missing=np.nan))


def public_fit_logistic(
    X: FloatArray, y: FloatArray, *, C: float, max_iter: int, balanced: bool
) -> LogisticRegression:
    """``LogisticRegression(C=C, max_iter=max_iter, class_weight="balanced" if balanced else None)
    .fit(X, y)``: scikit-learn's own fit."""
    model = LogisticRegression(C=C, max_iter=max_iter, class_weight="balanced" if balanced else None)
    return model.fit(X, y)


class LogisticFit(Protocol):
    def __call__(
        self, X: FloatArray, y: FloatArray, *, C: float, max_iter: int, balanced: bool
    ) -> LogisticRegression: ...


class LibraryCalls(NamedTuple):
    """How NURD trains and predicts with XGBoost and fits its logistic regressions: the public calls
    (`PUBLIC_CALLS`), or functions that give bit for bit the same models and predictions."""

    fit_booster: Callable[[Mapping[str, Any], FloatArray, FloatArray, int], xgb.Booster]
    regressor_predict: Callable[[xgb.Booster, FloatArray], FloatArray]
    fit_logistic: LogisticFit


PUBLIC_CALLS = LibraryCalls(public_fit_booster, public_regressor_predict, public_fit_logistic)
_calls = [PUBLIC_CALLS]


def use_library_calls(calls: LibraryCalls) -> None:
    """Make `fit_booster`, `regressor_predict` and `fit_logistic` use ``calls`` from now on, in this
    process (`PUBLIC_CALLS`: the libraries' public API)."""
    _calls[0] = calls


def library_calls() -> LibraryCalls:
    """The calls `fit_booster`, `regressor_predict` and `fit_logistic` use now."""
    return _calls[0]


def fit_booster(params: Mapping[str, Any], X: FloatArray, y: FloatArray, rounds: int) -> xgb.Booster:
    """`public_fit_booster`, through the calls in use (`use_library_calls`)."""
    return _calls[0].fit_booster(params, X, y, rounds)


def regressor_predict(booster: xgb.Booster, X: FloatArray) -> FloatArray:
    """`public_regressor_predict`, through the calls in use (`use_library_calls`)."""
    return _calls[0].regressor_predict(booster, X)


def fit_logistic(
    X: FloatArray, y: FloatArray, *, C: float, max_iter: int, balanced: bool
) -> LogisticRegression:
    """`public_fit_logistic`, through the calls in use (`use_library_calls`)."""
    return _calls[0].fit_logistic(X, y, C=C, max_iter=max_iter, balanced=balanced)


def positive_probability(model: LogisticRegression, X: FloatArray) -> FloatArray:
    """``model.predict_proba(X)[:, 1]`` of a binary ``model``, bit for bit: the same product, sum
    and `expit`, without scikit-learn's input checks for the finite float arrays NURD scores
    (anything else goes through scikit-learn, which rejects it as before)."""
    plain = X.dtype == np.float64 and X.ndim == 2 and len(X) > 0 and X.shape[1] == model.coef_.shape[1]
    if not (plain and len(model.classes_) == 2 and np.isfinite(X).all()):
        return np.asarray(model.predict_proba(X)[:, 1], dtype=np.float64)
    scores = X @ model.coef_.T + model.intercept_
    return np.asarray(expit(scores.reshape(-1)), dtype=np.float64)
