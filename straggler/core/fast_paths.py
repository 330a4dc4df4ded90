"""The XGBoost and scikit-learn calls NURD makes at every checkpoint, bit for bit as the libraries'
own but without their per-call wrappers (parameter introspection, input validation, per-round
callbacks): at 100 tasks a job's checkpoint is mostly that overhead. `tests/test_fast_paths.py`
holds each to the library call it replaces, so a library upgrade that changes one shows there.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import xgboost as xgb
from scipy import optimize
from scipy.special import expit
from sklearn.linear_model import LogisticRegression

from straggler.core.arrays import FloatArray

try:  # the libraries' private names: a version without them takes the public calls
    from sklearn._loss.loss import HalfBinomialLoss
    from sklearn.linear_model._logistic import _LOGISTIC_SOLVER_CONVERGENCE_MSG
    from sklearn.utils.optimize import _check_optimize_result
    from xgboost._data_utils import array_interface
    from xgboost.core import _LIB, _check_call, c_bst_ulong, make_jcargs

    NATIVE = True
except ImportError:  # pragma: no cover - only with other library versions
    NATIVE = False


def fit_regressor(model: xgb.XGBRegressor, X: FloatArray, y: FloatArray) -> xgb.XGBRegressor:
    """``model.fit(X, y)``. For a ``model`` with the hist tree method and nothing the wrapper adds to
    training (callbacks, early stopping, evaluation metrics, a custom objective, categorical or
    weighted features): the same parameters, `xgboost.QuantileDMatrix` and boosting rounds, one
    native update per round without the wrapper's per-round feature checks and callbacks; otherwise
    the wrapper's own ``fit``."""
    params = _plain_params(model) if NATIVE else None
    if params is None:
        return model.fit(X, y)
    with xgb.config_context(verbosity=model.verbosity):
        train = xgb.QuantileDMatrix(
            X, y, missing=model.missing, nthread=model.n_jobs, max_bin=model.max_bin, enable_categorical=False
        )
        booster = xgb.Booster(params, [train])
        for round_ in range(model.get_num_boosting_rounds()):
            _check_call(_LIB.XGBoosterUpdateOneIter(booster.handle, ctypes.c_int(round_), train.handle))
    model._Booster = booster.reset()
    return model


_PLAIN_PARAMS: dict[tuple[tuple[str, Any], ...], dict[str, Any] | None] = {}
"""`_plain_params` by a model's constructor attributes (``get_xgb_params`` inspects signatures)."""


def _plain_params(model: xgb.XGBRegressor) -> dict[str, Any] | None:
    """``model.get_xgb_params()`` if `fit_regressor` may train ``model`` natively, else None."""
    attributes = tuple(sorted((k, v) for k, v in vars(model).items() if not k.startswith("_")))
    try:
        params = _PLAIN_PARAMS.get(attributes)
        cached = attributes in _PLAIN_PARAMS
    except TypeError:  # an unhashable parameter (a list of callbacks, a dict of constraints)
        return None
    if not cached:
        plain = (
            model.tree_method in ("hist", None, "auto")
            and model.device in (None, "cpu")
            and model.booster in (None, "gbtree")
            and model.callbacks is None
            and model.early_stopping_rounds is None
            and model.eval_metric is None
            and not callable(model.objective)
            and not model.enable_categorical
            and model.feature_types is None
            and model.feature_weights is None
            and not getattr(model, "kwargs", None)
            and type(model) is xgb.XGBRegressor
        )
        params = model.get_xgb_params() if plain else None
        if len(_PLAIN_PARAMS) >= 64:
            _PLAIN_PARAMS.clear()
        _PLAIN_PARAMS[attributes] = params
    return None if params is None else dict(params)


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
    if NATIVE
    else b""
)
"""`xgboost.Booster.inplace_predict`'s arguments for values of every tree, NaN missing."""


def regressor_predict(model: xgb.XGBRegressor, X: FloatArray) -> FloatArray:
    """``model.predict(X)``: the booster's own in-place prediction, which the scikit-learn wrapper
    calls for a NumPy array (all trees: NURD never stops early). For a C-ordered float64 ``X`` with
    the model's features, the native call `inplace_predict` makes, with its arguments built once;
    anything else goes through `inplace_predict`, which rejects it as before."""
    booster = model.get_booster()
    plain = X.dtype == np.float64 and X.ndim == 2 and len(X) > 0 and X.flags.c_contiguous
    if not (NATIVE and plain and X.shape[1] == booster.num_features()):
        return np.asarray(booster.inplace_predict(X, missing=np.nan))
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
