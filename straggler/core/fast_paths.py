"""The XGBoost and scikit-learn calls NURD makes at every checkpoint.

XGBoost through its public API: `public_fit_booster` is what ``XGBRegressor.fit`` does for NURD's
plain parameters (``xgboost.train`` on a `xgboost.QuantileDMatrix`), `public_regressor_predict` the
booster's own in-place prediction. NURD calls them through `fit_booster` and `regressor_predict`,
which an adapter outside the core may point at faster equivalents (`use_booster_calls`;
`straggler/xgboost_native.py`, bit for bit the same boosters and predictions through XGBoost's native
calls: at 100 tasks the public calls' per-round and per-call checks cost a job's checkpoint about 15 %).
scikit-learn's logistic regression bit for bit but without its per-call wrappers (input validation,
array-API dispatch): at 100 tasks a job's checkpoint is mostly that overhead. `tests/test_fast_paths.py`
holds each to the library call it replaces, so a library upgrade that changes one shows there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import xgboost as xgb
from scipy import optimize
from scipy.special import expit
from sklearn.linear_model import LogisticRegression

from straggler.core.arrays import FloatArray

try:  # the library's private names: a version without them takes the public calls
    from sklearn._loss.loss import HalfBinomialLoss
    from sklearn.linear_model._logistic import _LOGISTIC_SOLVER_CONVERGENCE_MSG
    from sklearn.utils.optimize import _check_optimize_result

    NATIVE = True
except ImportError:  # pragma: no cover - only with other library versions
    NATIVE = False


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


class BoosterCalls(NamedTuple):
    """How NURD trains and predicts with XGBoost: `public_fit_booster` and `public_regressor_predict`,
    or functions that give bit for bit the same boosters and predictions."""

    fit: Callable[[Mapping[str, Any], FloatArray, FloatArray, int], xgb.Booster]
    predict: Callable[[xgb.Booster, FloatArray], FloatArray]


PUBLIC_BOOSTER_CALLS = BoosterCalls(public_fit_booster, public_regressor_predict)
_booster_calls = [PUBLIC_BOOSTER_CALLS]


def use_booster_calls(calls: BoosterCalls) -> None:
    """Make `fit_booster` and `regressor_predict` use ``calls`` (`PUBLIC_BOOSTER_CALLS`: XGBoost's
    public API) from now on, in this process."""
    _booster_calls[0] = calls


def booster_calls() -> BoosterCalls:
    """The calls `fit_booster` and `regressor_predict` use now."""
    return _booster_calls[0]


def fit_booster(params: Mapping[str, Any], X: FloatArray, y: FloatArray, rounds: int) -> xgb.Booster:
    """`public_fit_booster`, through the calls in use (`use_booster_calls`)."""
    return _booster_calls[0].fit(params, X, y, rounds)


def regressor_predict(booster: xgb.Booster, X: FloatArray) -> FloatArray:
    """`public_regressor_predict`, through the calls in use (`use_booster_calls`)."""
    return _booster_calls[0].predict(booster, X)


def fit_logistic(
    X: FloatArray, y: FloatArray, *, C: float, max_iter: int, balanced: bool
) -> LogisticRegression:
    """``LogisticRegression(C=C, max_iter=max_iter, class_weight="balanced" if balanced else None)
    .fit(X, y)``, bit for bit: for a finite float64 ``X`` and labels ``y`` of both 0.0 and 1.0 and
    nothing else, the same L-BFGS run on the same loss, sample weights and penalty as scikit-learn's
    lbfgs path, with its convergence warning; anything else goes through scikit-learn."""
    model = LogisticRegression(C=C, max_iter=max_iter, class_weight="balanced" if balanced else None)
    positive = y == 1.0
    plain = X.dtype == np.float64 and X.ndim == 2 and y.shape == (len(X),) and np.isfinite(X).all()
    if not (NATIVE and plain and positive.any() and (y == 0.0).any() and bool(np.all(positive | (y == 0.0)))):
        return model.fit(X, y)
    n, d = X.shape
    X = np.ascontiguousarray(X)
    index = positive.astype(np.intp)
    weights = None
    weight_sum = float(n)
    if balanced:  # n / (2 * count of the class), as compute_class_weight("balanced")
        counts = np.bincount(index, weights=np.ones(n), minlength=2)
        weights = np.ones(n) * (counts.sum() / (2 * counts))[index]
        weight_sum = float(np.sum(weights))
    result = optimize.minimize(
        _binomial_loss_gradient,
        np.zeros(d + 1),
        method="L-BFGS-B",
        jac=True,
        args=(X, positive.astype(np.float64), weights, 1.0 / (C * weight_sum)),
        options={"maxiter": max_iter, "maxls": 50, "gtol": model.tol, "ftol": 64 * np.finfo(float).eps},
    )
    n_iter = _check_optimize_result(
        "lbfgs", result, max_iter, extra_warning_msg=_LOGISTIC_SOLVER_CONVERGENCE_MSG
    )
    coef = np.asarray(result.x, dtype=np.float64)
    model.classes_ = np.array([0.0, 1.0])
    model.coef_ = coef[:-1][None, :]
    model.intercept_ = coef[-1:]
    model.n_iter_ = np.asarray([n_iter], dtype=np.int32)
    model.n_features_in_ = d
    return model


_HALF_BINOMIAL = HalfBinomialLoss() if NATIVE else None


def _binomial_loss_gradient(
    coef: FloatArray, X: FloatArray, y: FloatArray, weights: FloatArray | None, l2: float
) -> tuple[float, FloatArray]:
    """scikit-learn's ``LinearModelLoss(HalfBinomialLoss(), fit_intercept=True).loss_gradient`` for a
    NumPy ``X`` (the weighted mean loss plus ``l2 / 2 * |w|^2``, and its gradient), the same
    operations in the same order without its array-API dispatch."""
    d = X.shape[1]
    w, intercept = coef[:-1], coef[-1]
    assert _HALF_BINOMIAL is not None  # only called when NATIVE
    loss, pointwise = _HALF_BINOMIAL.loss_gradient(
        y_true=y, raw_prediction=X @ w + intercept, sample_weight=weights, n_threads=1
    )
    total = len(X) if weights is None else np.sum(weights)
    value = float(np.sum(loss) / total)
    value += float(0.5 * l2 * (w @ w))
    pointwise /= total
    grad = np.empty_like(coef, dtype=w.dtype)
    grad[:d] = X.T @ pointwise + l2 * w
    grad[-1] = np.sum(pointwise)
    return value, grad


def positive_probability(model: LogisticRegression, X: FloatArray) -> FloatArray:
    """``model.predict_proba(X)[:, 1]`` of a binary ``model``, bit for bit: the same product, sum
    and `expit`, without scikit-learn's input checks for the finite float arrays NURD scores
    (anything else goes through scikit-learn, which rejects it as before)."""
    plain = X.dtype == np.float64 and X.ndim == 2 and len(X) > 0 and X.shape[1] == model.coef_.shape[1]
    if not (plain and len(model.classes_) == 2 and np.isfinite(X).all()):
        return np.asarray(model.predict_proba(X)[:, 1], dtype=np.float64)
    scores = X @ model.coef_.T + model.intercept_
    return np.asarray(expit(scores.reshape(-1)), dtype=np.float64)
