"""NURD's library calls through the libraries' internals, outside the core: an adapter the entry points
install (`install`) into `straggler.core.fast_paths`.

XGBoost: `fit_booster` runs the boosting rounds as native updates (``XGBoosterUpdateOneIter``) on the
same `xgboost.QuantileDMatrix` and parameters as ``xgboost.train``, without its per-round feature
checks and callbacks; `regressor_predict` is the native dense prediction ``Booster.inplace_predict``
makes, with its arguments built once. scikit-learn: `fit_logistic` is its own L-BFGS run on its own
loss (``HalfBinomialLoss``), without ``LogisticRegression.fit``'s input validation and array-API
dispatch. Bit for bit what the public calls give (`tests/test_fast_paths.py` holds them to it), and
cheaper: at 100 tasks a job's checkpoint costs about 16 % more with XGBoost's public calls, and a
logistic fit about four times as much with scikit-learn's (docs/performance.md). Each relies on
private names of its library (``xgboost.core._LIB``, ``_check_call``, ``c_bst_ulong``,
``make_jcargs``, ``xgboost._data_utils.array_interface``; ``sklearn._loss.loss.HalfBinomialLoss``,
``_LOGISTIC_SOLVER_CONVERGENCE_MSG``, ``_check_optimize_result``); a version without them takes the
public call instead, and `tests/test_fast_paths.py` fails.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import numpy as np
import xgboost as xgb
from scipy import optimize
from sklearn.linear_model import LogisticRegression

from straggler.core.arrays import FloatArray
from straggler.core.fast_paths import (
    LibraryCalls,
    public_fit_booster,
    public_fit_logistic,
    public_regressor_predict,
    use_library_calls,
)

try:  # XGBoost's private names: a version without them keeps the public calls
    from xgboost._data_utils import array_interface
    from xgboost.core import _LIB, _check_call, c_bst_ulong, make_jcargs

    NATIVE_XGBOOST = True
except ImportError:  # pragma: no cover - only with other library versions
    NATIVE_XGBOOST = False

try:  # scikit-learn's private names: likewise
    from sklearn._loss.loss import HalfBinomialLoss
    from sklearn.linear_model._logistic import _LOGISTIC_SOLVER_CONVERGENCE_MSG
    from sklearn.utils.optimize import _check_optimize_result

    NATIVE_SKLEARN = True
except ImportError:  # pragma: no cover - only with other library versions
    NATIVE_SKLEARN = False


def fit_booster(params: Mapping[str, Any], X: FloatArray, y: FloatArray, rounds: int) -> xgb.Booster:
    """`public_fit_booster`, one native update per round."""
    if not NATIVE_XGBOOST:
        return public_fit_booster(params, X, y, rounds)
    with xgb.config_context(verbosity=params.get("verbosity")):
        train = xgb.QuantileDMatrix(X, y, missing=np.nan, nthread=params.get("n_jobs"))
        booster = xgb.Booster(dict(params), [train])
        for round_ in range(rounds):
            _check_call(_LIB.XGBoosterUpdateOneIter(booster.handle, ctypes.c_int(round_), train.handle))
    return booster.reset()


_PREDICT_ARGS = (
    make_jcargs(
        type=0,
        training=False,
        iteration_begin=0,
        iteration_end=0,
        missing=np.nan,
        strict_shape=False,
        cache_id=0,
    )
    if NATIVE_XGBOOST
    else b""
)
"""`xgboost.Booster.inplace_predict`'s arguments for values of every tree, NaN missing."""


def regressor_predict(booster: xgb.Booster, X: FloatArray) -> FloatArray:
    """`public_regressor_predict`: for a C-ordered float64 ``X`` with the booster's features, the
    native call `inplace_predict` makes; anything else goes through `inplace_predict`, which rejects
    it as before."""
    plain = X.dtype == np.float64 and X.ndim == 2 and len(X) > 0 and X.flags.c_contiguous
    if not (NATIVE_XGBOOST and plain and X.shape[1] == booster.num_features()):
        return public_regressor_predict(booster, X)
    shape = ctypes.POINTER(c_bst_ulong)()
    dims = c_bst_ulong()
    values = ctypes.POINTER(ctypes.c_float)()
    _check_call(
        _LIB.XGBoosterPredictFromDense(
            booster.handle,
            array_interface(X),
            _PREDICT_ARGS,
            ctypes.c_void_p(),
            ctypes.byref(shape),
            ctypes.byref(dims),
            ctypes.byref(values),
        )
    )
    if dims.value != 1 or shape[0] != len(X):
        raise RuntimeError(f"XGBoost predicted a {dims.value}-d output for {len(X)} rows")
    return np.ctypeslib.as_array(values, shape=(len(X),)).copy()


def fit_logistic(
    X: FloatArray, y: FloatArray, *, C: float, max_iter: int, balanced: bool
) -> LogisticRegression:
    """`public_fit_logistic`, bit for bit: for a finite float64 ``X`` and labels ``y`` of both 0.0 and 1.0 and
    nothing else, the same L-BFGS run on the same loss, sample weights and penalty as scikit-learn's
    lbfgs path, with its convergence warning; anything else goes through scikit-learn."""
    model = LogisticRegression(C=C, max_iter=max_iter, class_weight="balanced" if balanced else None)
    positive = y == 1.0
    plain = X.dtype == np.float64 and X.ndim == 2 and y.shape == (len(X),) and np.isfinite(X).all()
    if not (
        NATIVE_SKLEARN
        and plain
        and positive.any()
        and (y == 0.0).any()
        and bool(np.all(positive | (y == 0.0)))
    ):
        return public_fit_logistic(X, y, C=C, max_iter=max_iter, balanced=balanced)
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


_HALF_BINOMIAL = HalfBinomialLoss() if NATIVE_SKLEARN else None


def _binomial_loss_gradient(
    coef: FloatArray, X: FloatArray, y: FloatArray, weights: FloatArray | None, l2: float
) -> tuple[float, FloatArray]:
    """scikit-learn's ``LinearModelLoss(HalfBinomialLoss(), fit_intercept=True).loss_gradient`` for a
    NumPy ``X`` (the weighted mean loss plus ``l2 / 2 * |w|^2``, and its gradient), the same
    operations in the same order without its array-API dispatch."""
    d = X.shape[1]
    w, intercept = coef[:-1], coef[-1]
    assert _HALF_BINOMIAL is not None  # only called when NATIVE_SKLEARN
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


NATIVE_CALLS = LibraryCalls(fit_booster, regressor_predict, fit_logistic)


def install() -> None:
    """Make NURD (`straggler.core.fast_paths`) train and predict through these calls (each the
    public one where its library lacks the internals it uses)."""
    use_library_calls(NATIVE_CALLS)
