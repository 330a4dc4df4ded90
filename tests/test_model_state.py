"""Models travel through the ``models`` changelog as data, never as pickles (issue 14, point 5).

Every method the worker can run decides exactly as before once its stored row is read back, and a
row that is not such a model (a pickle that would run code, a malformed or foreign row) is refused
with `ModelRecordError` without running anything.
"""

from __future__ import annotations

import copy
import functools
import io
import math
import pickle
import sys
from dataclasses import astuple
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from harness.small_jobs import make_job
from job_steps import each_checkpoint

from straggler.core.admm import Admm
from straggler.core.jobtrace import JobTrace
from straggler.core.method import StragglerMethod
from straggler.core.model_codec import FORMAT, ModelRecordError, decode_model, encode_model
from straggler.core.online import Decision, OnlineJob
from straggler.core.registry import make_method, online_method_names
from straggler.core.start import StartMethod

FAST_PRESETS = {"nurd-paper", "nurd-nc", "gbtr"}


def population() -> list[JobTrace]:
    return [make_job(60, seed=i, job_id=f"train-{i}", slow_group=0.1 * (i % 3)) for i in range(6)]


@functools.cache
def trained(name: str) -> StragglerMethod:
    """A cross-job method as ``straggler train`` leaves it (START set up without torch)."""
    if name == "start":
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "torch", None)
            return StartMethod(encoder=(16, 16, 8), hidden=8).init_population(population())
    return Admm(n_partitions=4).fit_population(population())


def fresh(name: str) -> StragglerMethod:
    """What the worker builds per job: from the registry, or a copy of the trained cross-job model."""
    if name in ("start", "admm"):
        return copy.deepcopy(trained(name))
    return make_method(name, seed=3)


def comparable(d: Decision) -> tuple[Any, ...]:
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in astuple(d))


def run(name: str, trace: JobTrace, restore: bool) -> list[tuple[Any, ...]]:
    """The job's decisions; with ``restore``, the method is replaced by its stored row read back onto a
    fresh method after every refit, as a worker that restarts after each commit would do."""
    method = fresh(name)
    job = OnlineJob(trace.job_id, method, len(trace.feature_names), trace.expected_tasks)
    if method.needs_granted_labels:  # Wrangler, granted as the evaluator grants it
        method.grant_labels(trace.finish_features[::3], trace.latency[::3] >= np.quantile(trace.latency, 0.9))
    decisions: list[tuple[Any, ...]] = []
    restores = decided_by_restored = 0
    for made, refitted in each_checkpoint(job, trace):
        decisions += [comparable(d) for d in made]
        decided_by_restored += bool(made) and restores > 0
        if restore and refitted:
            job.method = decode_model(encode_model(job.method), fresh(name))
            restores += 1
    assert not restore or decided_by_restored >= 2, f"{name}: a restored model decided too little"
    return decisions


@pytest.fixture(scope="module")
def trace() -> JobTrace:
    return make_job(120, seed=11, slow_group=0.15, waves=30, wave_gap=8.0)  # tasks keep starting


@pytest.mark.parametrize("name", online_method_names())  # what a worker may run and store
def test_every_method_decides_the_same_after_its_model_row_is_read_back(name: str, trace: JobTrace) -> None:
    expected = run(name, trace, restore=False)
    assert expected, "no checkpoint was evaluated"
    assert run(name, trace, restore=True) == expected


def test_a_model_row_holds_no_pickle() -> None:
    """Every array of a row loads with pickle refused (object arrays would need it)."""
    method = fresh("nurd-warm")
    job = OnlineJob("j", method, 2, 90)
    trace = make_job(90, seed=5, slow_group=0.15)
    for _ in each_checkpoint(job, trace):
        pass
    row = encode_model(job.method)
    with np.load(io.BytesIO(row), allow_pickle=False) as archive:
        header = orjson.loads(archive["header"].tobytes())
        assert all(not archive[name].dtype.hasobject for name in archive.files)
    assert header["format"] == FORMAT and header["method"] == "nurd"  # the class: presets differ in params
    assert len(header["state"]["history_"]) == 3, "the reused past fits are stored as data"


class RunsCode:
    """A pickle that runs code when loaded: it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_the_crafted_pickle_runs_code_when_unpickled(tmp_path: Path) -> None:
    """The payload the rejection tests use is a real exploit, not an inert blob."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(RunsCode(marker)))
    assert marker.exists()


def fitted_row(name: str = "gbtr") -> bytes:
    method = make_method(name)
    job = OnlineJob("j", method, 2, 90)
    trace = make_job(90, seed=5)
    for decisions, _ in each_checkpoint(job, trace):
        if decisions:
            break
    return encode_model(job.method)


def npz(header: Any, **arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, header=np.frombuffer(orjson.dumps(header), dtype=np.uint8), **arrays)
    return buffer.getvalue()


def header_of(row: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    with np.load(io.BytesIO(row), allow_pickle=False) as archive:
        arrays = {k: archive[k] for k in archive.files}
    return orjson.loads(arrays.pop("header").tobytes()), arrays


def test_a_pickled_model_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(ModelRecordError, match=r"is a pickle; model rows are \.npz archives"):
        decode_model(pickle.dumps(RunsCode(marker)), make_method("gbtr"))
    assert not marker.exists()


def test_a_pickle_hidden_in_an_object_array_of_the_archive_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    header, arrays = header_of(fitted_row())
    arrays["0"] = np.array([RunsCode(marker)], dtype=object)  # np.savez pickles it into the .npy
    with pytest.raises(ModelRecordError, match="unreadable model archive: Object arrays cannot be loaded"):
        decode_model(npz(header, **arrays), make_method("gbtr"))
    assert not marker.exists()


def malformed_rows() -> dict[str, tuple[bytes, str]]:
    row = fitted_row()
    header, arrays = header_of(row)

    def edited(**changes: Any) -> bytes:
        return npz({**header, **changes}, **arrays)

    state = header["state"]
    scaler = state["scaler_"]
    short = {**arrays, scaler["fill"]["$array"]: np.zeros(1)}
    return {
        "truncated": (row[: len(row) // 2], "unreadable model archive"),
        "garbage": (b"\x00" * 64, "not an .npz archive"),
        "no header": (npz({}, **arrays)[:0] + _without_header(arrays), "no header"),
        "other format": (edited(format="straggler-model/0"), "not a straggler-model/2 row"),
        "other method": (edited(method="tobit"), "holds a 'tobit' model, this worker runs 'nurd'"),
        "other params": (edited(params={**header["params"], "n_estimators": 1}), "parameters"),
        "dangling array": (
            edited(state={**state, "mean_target_": {"$array": "99"}}),
            "bad \\$array reference",
        ),
        "a method name": (edited(state={**state, "fit": 2}), "not a learned attribute"),
        "a dunder": (edited(state={**state, "__class__": 1}), "would shadow Nurd.__class__"),
        "bad scaler": (npz(header, **short), "malformed model row: ValueError"),
        "bad booster": (
            edited(state={**state, "regressor_": {"$bytes": scaler["fill"]["$array"]}}),
            "malformed model row",
        ),
    }


def _without_header(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


@pytest.mark.parametrize("case", list(malformed_rows()))
def test_a_malformed_model_row_is_refused_with_the_reason(case: str) -> None:
    row, reason = malformed_rows()[case]
    with pytest.raises(ModelRecordError, match=reason):
        decode_model(row, make_method("gbtr"))


def test_a_well_formed_row_is_accepted() -> None:
    """The malformed rows above are edits of this one: it alone must pass."""
    restored = decode_model(fitted_row(), make_method("gbtr"))
    assert restored.regressor_ is not None  # type: ignore[attr-defined]
