"""NURD's XGBoost calls through XGBoost's native library, outside the core: an adapter the entry
points install (`install`) into `straggler.core.fast_paths`.

`fit_booster` runs the boosting rounds as native updates (``XGBoosterUpdateOneIter``) on the same
`xgboost.QuantileDMatrix` and parameters as ``xgboost.train``, without its per-round feature checks
and callbacks; `regressor_predict` is the native dense prediction ``Booster.inplace_predict`` makes,
with its arguments built once. Bit for bit what the public calls give (`tests/test_fast_paths.py`
holds them to it), and cheaper: at 100 tasks a job's checkpoint costs about 15 % more through the
public calls (docs/performance.md). They rely on XGBoost's internals (``xgboost.core._LIB``,
``_check_call``, ``c_bst_ulong``, ``make_jcargs``, ``xgboost._data_utils.array_interface``); a version
without them leaves the public calls in use, and `tests/test_fast_paths.py` fails.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import numpy as np
import xgboost as xgb

from straggler.core.arrays import FloatArray
from straggler.core.fast_paths import BoosterCalls, public_regressor_predict, use_booster_calls

try:  # XGBoost's private names: a version without them keeps the public calls
    from xgboost._data_utils import array_interface
    from xgboost.core import _LIB, _check_call, c_bst_ulong, make_jcargs

    NATIVE = True
except ImportError:  # pragma: no cover - only with other library versions
    NATIVE = False


def fit_booster(params: Mapping[str, Any], X: FloatArray, y: FloatArray, rounds: int) -> xgb.Booster:
    """`public_fit_booster`, one native update per round."""
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
    if NATIVE
    else b""
)
"""`xgboost.Booster.inplace_predict`'s arguments for values of every tree, NaN missing."""


def regressor_predict(booster: xgb.Booster, X: FloatArray) -> FloatArray:
    """`public_regressor_predict`: for a C-ordered float64 ``X`` with the booster's features, the
    native call `inplace_predict` makes; anything else goes through `inplace_predict`, which rejects
    it as before."""
    plain = X.dtype == np.float64 and X.ndim == 2 and len(X) > 0 and X.flags.c_contiguous
    if not (plain and X.shape[1] == booster.num_features()):
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


NATIVE_BOOSTER_CALLS = BoosterCalls(fit_booster, regressor_predict)


def install() -> bool:
    """Make NURD (`straggler.core.fast_paths`) train and predict through the native calls, if this
    XGBoost has the internals they use; True if it did."""
    if NATIVE:
        use_booster_calls(NATIVE_BOOSTER_CALLS)
    return NATIVE
