"""A fitted method's learned state as plain data: what a worker stores and restores without pickle.

A method's `StragglerMethod.get_state` returns a dict whose values are *state values*: None, bool,
int, float, str, bytes, numpy arrays of a non-object dtype, and lists, tuples and str-keyed dicts of
those. Nothing in it names a class or a function, so reading it back cannot run code; the codec that
turns it into bytes (`straggler.core.model_codec`) knows these types and no others.

Fitted library models are converted by the helpers here, each into the library's own non-executable
form: XGBoost boosters to XGBoost's UBJSON model format (``Booster.save_raw("ubj")``), scikit-learn
linear models to their coefficient arrays, scikit-learn decision trees to the node arrays of their
``tree_`` (the arrays scikit-learn's own ``Tree.__getstate__`` holds).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from straggler.core.preprocessing import Standardiser

State = dict[str, Any]
"""Attribute name -> state value (see the module docstring)."""


class StateCodec(NamedTuple):
    """How one learned attribute that is not a plain state value becomes one (``dump``) and back."""

    dump: Callable[[Any], Any]
    load: Callable[[Any], Any]


def optional(codec: StateCodec) -> StateCodec:
    """``codec`` for an attribute that may also be None."""
    return StateCodec(
        lambda v: None if v is None else codec.dump(v), lambda s: None if s is None else codec.load(s)
    )


def listed(codec: StateCodec) -> StateCodec:
    """``codec`` for a list of such values."""
    return StateCodec(lambda vs: [codec.dump(v) for v in vs], lambda ss: [codec.load(s) for s in ss])


def learned_attributes(obj: object) -> dict[str, Any]:
    """Learned state, scikit-learn style: public attributes whose name ends with ``_``."""
    return {k: v for k, v in vars(obj).items() if k.endswith("_") and not k.startswith("_")}


def dump_attributes(obj: object, codecs: Mapping[str, StateCodec]) -> State:
    """``obj``'s learned attributes as state values, those named in ``codecs`` converted."""
    return {k: codecs[k].dump(v) if k in codecs else v for k, v in learned_attributes(obj).items()}


def load_attributes(obj: object, state: Mapping[str, Any], codecs: Mapping[str, StateCodec]) -> None:
    """Set ``obj``'s learned attributes from ``state``; a name that is not a learned attribute's, or
    that would shadow something of the class (a method, a property), raises ValueError."""
    for name in state:
        if not (isinstance(name, str) and name.isidentifier() and name.endswith("_")):
            raise ValueError(f"{name!r} is not a learned attribute")
        if name.startswith("_") or hasattr(type(obj), name):
            raise ValueError(f"{name!r} would shadow {type(obj).__name__}.{name}")
    for name, value in state.items():
        setattr(obj, name, codecs[name].load(value) if name in codecs else value)


def _array(value: Any, dtype: Any, ndim: int | None = None) -> np.ndarray[Any, Any]:
    """``value`` as an array of ``dtype`` (and ``ndim``); anything else raises ValueError."""
    if not isinstance(value, np.ndarray) or value.dtype != np.dtype(dtype):
        raise ValueError(f"expected a {np.dtype(dtype)} array, got {type(value).__name__}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"expected {ndim} dimensions, got {value.ndim}")
    return value


# -- Standardiser ---------------------------------------------------------------------------------


def _dump_standardiser(s: Standardiser) -> State:
    return {"fill": s.fill, "center": s.center, "scale": s.scale, "varying": s.varying}


def _load_standardiser(state: Mapping[str, Any]) -> Standardiser:
    fill = _array(state["fill"], np.float64, 1)
    parts = [_array(state[k], np.float64, 1) for k in ("center", "scale")]
    varying = _array(state["varying"], np.bool_, 1)
    if any(len(p) != len(fill) for p in (*parts, varying)):
        raise ValueError("a standardiser's arrays differ in length")
    return Standardiser(fill=fill, center=parts[0], scale=parts[1], varying=varying)


STANDARDISER = StateCodec(_dump_standardiser, _load_standardiser)


# -- XGBoost ----------------------------------------------------------------------------------------


def _dump_booster(booster: Any) -> bytes:
    return bytes(booster.save_raw("ubj"))


def _load_xgboost(raw: bytes, model: Any) -> Any:
    """``model`` (a fresh Booster) loaded from UBJSON ``raw``."""
    if not isinstance(raw, bytes):
        raise ValueError("an XGBoost model is stored as bytes")
    model.load_model(bytearray(raw))
    return model


def _load_booster(raw: bytes) -> Any:
    import xgboost as xgb

    return _load_xgboost(raw, xgb.Booster())


BOOSTER = StateCodec(_dump_booster, _load_booster)
"""An ``xgboost.Booster`` in XGBoost's UBJSON model format."""


# -- scikit-learn -------------------------------------------------------------------------------------


def _plain_params(model: Any) -> State:
    params = model.get_params(deep=False)
    for name, value in params.items():
        if not (value is None or isinstance(value, bool | int | float | str)):
            raise TypeError(f"{type(model).__name__}.{name} = {value!r} is not a plain parameter")
    return params


def linear_model(cls: type) -> StateCodec:
    """A fitted scikit-learn linear classifier of class ``cls`` (LogisticRegression, LinearSVC): its
    parameters and the coefficients, intercept and classes its ``decision_function`` reads."""

    def dump(model: Any) -> State:
        return {
            "params": _plain_params(model),
            "coef": model.coef_,
            "intercept": np.asarray(model.intercept_, dtype=np.float64),
            "classes": model.classes_,
        }

    def load(state: Mapping[str, Any]) -> Any:
        model = cls(**state["params"])
        model.coef_ = _array(state["coef"], np.float64, 2)
        model.intercept_ = _array(state["intercept"], np.float64, 1)
        model.classes_ = state["classes"]
        if not isinstance(model.classes_, np.ndarray) or model.classes_.dtype.kind not in "biuf":
            raise ValueError("a linear model's classes are a numeric array")
        if model.coef_.shape[0] != len(model.intercept_):
            raise ValueError("a linear model's coefficients and intercept disagree")
        model.n_features_in_ = model.coef_.shape[1]
        return model

    return StateCodec(dump, load)


def _dump_tree(model: Any) -> State:
    tree = model.tree_.__getstate__()
    nodes = tree["nodes"]
    return {
        "params": _plain_params(model),
        "classes": model.classes_,
        "n_features": int(model.n_features_in_),
        "max_features": int(model.max_features_),
        "max_depth": int(tree["max_depth"]),
        "nodes": {name: np.ascontiguousarray(nodes[name]) for name in nodes.dtype.names},
        "values": tree["values"],
    }


@functools.cache
def _tree_class_and_node_dtype() -> tuple[type, Any]:
    """scikit-learn's ``Tree`` class and its nodes' dtype, read off the public ``tree_`` of a tiny
    fitted tree (not imported from the private ``sklearn.tree._tree``)."""
    from sklearn.tree import DecisionTreeClassifier

    fitted = DecisionTreeClassifier(random_state=0).fit([[0.0], [1.0]], [0, 1])
    return type(fitted.tree_), fitted.tree_.__getstate__()["nodes"].dtype


def _load_tree(state: Mapping[str, Any]) -> Any:
    from sklearn.tree import DecisionTreeClassifier

    tree_class, node_dtype = _tree_class_and_node_dtype()
    classes = state["classes"]
    if not isinstance(classes, np.ndarray) or classes.ndim != 1 or classes.dtype.kind not in "biuf":
        raise ValueError("a tree's classes are a numeric array")
    fields: Mapping[str, Any] = state["nodes"]
    count = len(fields["left_child"])
    nodes = np.zeros(count, dtype=node_dtype)
    for name in node_dtype.names:
        column = _array(fields[name], node_dtype.fields[name][0], 1)
        if len(column) != count:
            raise ValueError("a tree's node arrays differ in length")
        nodes[name] = column
    values = _array(state["values"], np.float64, 3)
    n_features = int(state["n_features"])
    index = np.arange(count)
    leaf = (nodes["left_child"] == -1) & (nodes["right_child"] == -1)
    inner = ~leaf
    forward = (nodes["left_child"] > index) & (nodes["right_child"] > index)  # so a walk ends
    if (
        not np.all(forward[inner])
        or np.any(nodes["left_child"][inner] >= count)
        or np.any(nodes["right_child"][inner] >= count)
        or np.any((nodes["feature"][inner] < 0) | (nodes["feature"][inner] >= n_features))
        or values.shape[:2] != (count, 1)
        or values.shape[2] != len(classes)
    ):
        raise ValueError("a tree's nodes do not form a tree over its features and classes")
    tree = tree_class(n_features, np.array([len(classes)], dtype=np.intp), 1)
    tree.__setstate__(
        {"max_depth": int(state["max_depth"]), "node_count": count, "nodes": nodes, "values": values}
    )
    model = DecisionTreeClassifier(**state["params"])
    model.tree_ = tree
    model.classes_ = classes
    model.n_classes_ = len(classes)
    model.n_outputs_ = 1
    model.n_features_in_ = n_features
    model.max_features_ = int(state["max_features"])
    return model


DECISION_TREE = StateCodec(_dump_tree, _load_tree)
"""A fitted single-output ``sklearn.tree.DecisionTreeClassifier``, as its parameters and node arrays."""
