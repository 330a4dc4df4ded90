"""Rows of the ``models`` table: a fitted method as bytes that cannot run code when read.

Whoever can write to the ``models`` changelog chooses what a worker reads back, so a row is a NumPy
``.npz`` read with ``allow_pickle=False``: a JSON ``header`` (method name, parameters, `get_state`)
and the numbered arrays it refers to. Nothing names a class or a function; `decode_model` raises
`ModelRecordError` for anything else. The format: docs/stream-protocol.md, "The agent's tables
(changelog topics)".
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import orjson

from straggler.core.method import StragglerMethod

FORMAT = "straggler-model/2"
ZIP_MAGIC = b"PK\x03\x04"
TAGS = ("$array", "$bytes", "$tuple", "$float")


class ModelRecordError(ValueError):
    """A row of the ``models`` table that is not a model this worker can restore; never run, never
    unpickled. The job is then refitted (`pipeline.jobstore.JobStore.job`)."""


def encode_model(method: StragglerMethod) -> bytes:
    """``method``'s name, parameters and learned state as a model row."""
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    header = {
        "format": FORMAT,
        "method": method.name,
        "params": _to_json(method.get_params(), arrays, "params"),
        "state": _to_json(method.get_state(), arrays, "state"),
    }
    buffer = io.BytesIO()
    header_bytes = np.frombuffer(orjson.dumps(header), dtype=np.uint8)
    cast(Any, np.savez)(buffer, allow_pickle=False, header=header_bytes, **arrays)
    return buffer.getvalue()


def decode_model(payload: bytes, fresh: StragglerMethod) -> StragglerMethod:
    """Restore a model row onto ``fresh`` (a new, unfitted method of the worker's configuration) and
    return it; raises `ModelRecordError` if the row is not a model of that method and parameters."""
    try:
        header, arrays = _read_archive(payload)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ModelRecordError(f"not a {FORMAT} row")
        if header.get("method") != fresh.name:
            raise ModelRecordError(
                f"the row holds a {header.get('method')!r} model, this worker runs {fresh.name!r}"
            )
        params = _from_json(header.get("params"), arrays)
        if params != _from_json(_to_json(fresh.get_params(), {}, "params"), {}):
            raise ModelRecordError(f"the row's {fresh.name} parameters {params} are not the worker's")
        state = _from_json(header.get("state"), arrays)
        if not isinstance(state, dict):
            raise ModelRecordError("the row's state is not a mapping")
        fresh.set_state(state)
    except ModelRecordError:
        raise
    except Exception as error:  # whatever malformed data makes numpy or set_state raise
        raise ModelRecordError(f"malformed model row: {type(error).__name__}: {error}") from error
    return fresh


def _read_archive(payload: bytes) -> tuple[Any, dict[str, np.ndarray[Any, Any]]]:
    """The header and arrays of an ``.npz`` row, loaded with ``allow_pickle=False``."""
    if not payload.startswith(ZIP_MAGIC):
        kind = "a pickle" if payload[:1] == b"\x80" else "not an .npz archive"
        raise ModelRecordError(f"the row is {kind}; model rows are .npz archives read without pickle")
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
        raise ModelRecordError(f"unreadable model archive: {error}") from error
    header = arrays.pop("header", None)
    if header is None or header.dtype != np.uint8 or header.ndim != 1:
        raise ModelRecordError("the model archive has no header")
    return orjson.loads(header.tobytes()), arrays


def _to_json(value: Any, arrays: dict[str, np.ndarray[Any, Any]], path: str) -> Any:
    """``value`` (a state value, see `straggler.core.state`) as JSON, its arrays moved to ``arrays``."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | np.integer) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, float | np.floating):
        number = float(value)
        return number if math.isfinite(number) else {"$float": repr(number)}
    if isinstance(value, bytes):
        arrays[name := str(len(arrays))] = np.frombuffer(value, dtype=np.uint8)
        return {"$bytes": name}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"{path}: object arrays are not state")
        arrays[name := str(len(arrays))] = value
        return {"$array": name}
    if isinstance(value, tuple):
        return {"$tuple": [_to_json(v, arrays, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_to_json(v, arrays, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for key, v in value.items():
            if not isinstance(key, str) or key.startswith("$"):
                raise TypeError(f"{path}: key {key!r} is not a plain str")
            out[key] = _to_json(v, arrays, f"{path}.{key}")
        return out
    raise TypeError(f"{path}: {type(value).__name__} is not a state value (see straggler.core.state)")


def _from_json(value: Any, arrays: Mapping[str, np.ndarray[Any, Any]]) -> Any:
    """Inverse of `_to_json`: a tagged object is rebuilt, a missing array raises ModelRecordError."""
    if isinstance(value, list):
        return [_from_json(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and (tag := next(iter(value))) in TAGS:
        inner = value[tag]
        if tag == "$tuple" and isinstance(inner, list):
            return tuple(_from_json(v, arrays) for v in inner)
        if tag == "$float" and inner in ("nan", "inf", "-inf"):
            return float(inner)
        if tag in ("$array", "$bytes") and isinstance(inner, str) and inner in arrays:
            array = arrays[inner]
            return array.tobytes() if tag == "$bytes" else array
        raise ModelRecordError(f"bad {tag} reference {inner!r}")
    return {key: _from_json(v, arrays) for key, v in value.items()}
