"""Batched records: observations and verdicts survive the round trip, parts fit 64 KiB, bad items alone."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import numpy as np
import orjson
import pytest

from schemas import (
    MAX_PAYLOAD_BYTES,
    CheckpointEvaluated,
    Prediction,
    PredictionBatch,
    SchemaError,
    TaskBatch,
    TaskCheckpoint,
    decode,
    encode,
    expand_predictions,
    observations,
    prediction_batches,
    read_task_batch,
    task_batches,
)
from schemas.batches import _fast_observations
from straggler.core.decision_event import prediction_event, prediction_parts
from straggler.core.online import Decision


def _running(i: int, job: str = "job-1") -> TaskCheckpoint:
    return TaskCheckpoint(
        job_id=job,
        task_id=f"task-{i:05d}",
        attempt=i % 3,
        checkpoint_time=600.0,
        status="running",
        machine_id=f"m-{i % 50}",
        features={f"f{k}": float(i * k) / 7 for k in range(9)},
        start_time=float(i % 500),
        source="replayer",
    )


def _prediction(i: int, flag: bool) -> Prediction:
    return Prediction(
        job_id="job-1",
        task_id=f"task-{i:05d}",
        checkpoint_time=600.0,
        raw_latency=100.0 + i,
        adjusted_latency=None if i % 2 else 130.0 + i / 3,
        propensity=0.25,
        weight=None,
        threshold=150.0,
        is_straggler=flag,
        method="nurd",
        model_version=4,
        elapsed=float(i % 300),
        produced_at=1.7e9,
        attempt=i % 2,
        straggle_probability=0.9 if flag else 0.05,
    )


def test_observations_survive_a_batch_in_order_and_parts_fit_the_limit() -> None:
    events = [_running(i) for i in range(1500)]
    payloads = task_batches("job-1", events, source="replayer")
    assert len(payloads) > 1 and all(len(p) <= MAX_PAYLOAD_BYTES for p in payloads)
    read = [obs for p in payloads for obs in observations(_batch(p))]
    assert read == events


def test_a_bad_observation_is_reported_alone_with_its_index() -> None:
    good = _running(1).to_dict()
    body = {k: v for k, v in good.items() if k not in ("type", "schema_version", "job_id", "source")}
    bad_latency = body | {"status": "finished", "latency": -1.0}
    batch = TaskBatch(job_id="job-1", observations=[body, bad_latency, body | {"job_id": "other"}, body])
    read = observations(decode(orjson.dumps(batch.to_dict())))  # type: ignore[arg-type]
    assert isinstance(read[0], TaskCheckpoint) and isinstance(read[3], TaskCheckpoint)
    assert isinstance(read[1], SchemaError) and read[1].field == "task_batch.observations[1].latency"
    assert isinstance(read[2], SchemaError) and read[2].field == "task_batch.observations[2].job_id"


def test_a_producer_cannot_batch_an_invalid_observation_or_another_job() -> None:
    with pytest.raises(SchemaError, match="latency"):
        task_batches("job-1", [TaskCheckpoint(**{**_running(1).to_dict(), "status": "finished"})])
    with pytest.raises(ValueError, match="job"):
        task_batches("job-1", [_running(1, job="job-2")])


def _halved_whole_batches(
    job_id: str, events: list[TaskCheckpoint], source: str | None, produced_at: float
) -> list[bytes]:
    """The records as the contract defines them: each event validated (`encode`), then the whole batch
    encoded (and validated), halved while it breaks the size or item limit."""
    for event in events:
        if event.job_id != job_id:
            raise ValueError(f"task_batches: event of job {event.job_id!r} in a batch of {job_id!r}")
        encode(event)
    bodies = [_body(event.to_dict()) for event in events]

    def cut(start: int, stop: int) -> list[bytes]:
        part = bodies[start:stop]
        batch = TaskBatch(job_id=job_id, observations=part, produced_at=produced_at, source=source)
        try:
            return [encode(batch)]
        except SchemaError as error:
            if error.rule not in ("maxSize", "maxItems") or stop - start <= 1:
                raise
            middle = start + (stop - start) // 2
            return cut(start, middle) + cut(middle, stop)

    return cut(0, len(bodies))


def _observation_of_size(i: int, size: int) -> TaskCheckpoint:
    """A running observation whose body in a task_batch record is exactly ``size`` bytes (>= ~150)."""

    def sized(features: dict[str, float], task_id: str = "t") -> TaskCheckpoint:
        return dataclasses.replace(_running(i), task_id=task_id, features=features)

    def length(event: TaskCheckpoint) -> int:
        return len(orjson.dumps(_body(event.to_dict())))

    features: dict[str, float] = {}
    while length(sized(features)) + 1200 < size:
        features[f"{len(features):04d}" + "x" * 996] = 1.0
    rest = size - length(sized(features)) - 150
    if rest > 0:
        features["k" * rest] = 2.5
    event = sized(features, "t" * (1 + size - length(sized(features))))
    assert length(event) == size
    return event


@pytest.mark.parametrize(
    ("overs", "counts"),
    [
        pytest.param((0,), [3], id="whole-batch-at-the-limit"),
        pytest.param((1,), [1, 2], id="one-byte-over"),
        pytest.param((1, 0), [1, 2, 3], id="first-half-over-second-at-the-limit"),
        pytest.param((0, 1, 0, 0), [3, 1, 2, 3, 3], id="second-quarter-over"),
    ],
)
def test_a_batch_splits_near_the_limit_where_halving_the_whole_batch_does(
    overs: tuple[int, ...], counts: list[int]
) -> None:
    """Each entry of ``overs`` is 3 observations whose record alone is the limit plus that many bytes."""
    empty = len(encode(TaskBatch(job_id="job-1", observations=[], produced_at=1.7e9, source="replayer")))
    events: list[TaskCheckpoint] = []
    for over in overs:
        room = MAX_PAYLOAD_BYTES + over - empty - 2  # two commas between three observations
        for size in (room // 3, room // 3, room - 2 * (room // 3)):
            events.append(_observation_of_size(len(events), size))
    records = task_batches("job-1", events, source="replayer", produced_at=1.7e9)
    assert records == _halved_whole_batches("job-1", events, "replayer", 1.7e9)
    assert [len(_batch(record).observations) for record in records] == counts
    whole = [len(record) for record, count in zip(records, counts, strict=True) if count == 3]
    assert whole == [MAX_PAYLOAD_BYTES] * overs.count(0)
    assert [obs for record in records for obs in observations(_batch(record))] == events


def test_an_observation_alone_over_the_limit_is_refused_as_halving_would() -> None:
    empty = len(encode(TaskBatch(job_id="job-1", observations=[], produced_at=1.7e9, source="replayer")))
    events = [_running(0), _observation_of_size(1, MAX_PAYLOAD_BYTES + 1 - empty), _running(2)]
    with pytest.raises(SchemaError) as reference:
        _halved_whole_batches("job-1", events, "replayer", 1.7e9)
    with pytest.raises(SchemaError) as refused:
        task_batches("job-1", events, source="replayer", produced_at=1.7e9)
    assert str(refused.value) == str(reference.value)
    assert (refused.value.field, refused.value.rule) == ("task_batch", "maxSize")


def test_batches_are_the_bytes_of_halving_whole_batches() -> None:
    events = [_running(i) for i in range(5000)] + [
        dataclasses.replace(_running(7), status="finished", latency=12.5, source=None),
        dataclasses.replace(_running(8), status="killed", start_time=None),
    ]
    for source in ("replayer", None, 'odd "source"'):
        records = task_batches("job-1", events, source=source, produced_at=0.5)
        assert records == _halved_whole_batches("job-1", events, source, 0.5)


def test_verdicts_and_marker_survive_the_parts() -> None:
    predictions = [_prediction(i, flag=i % 97 == 0) for i in range(2000)]
    marker = CheckpointEvaluated(
        job_id="job-1",
        checkpoint_time=600.0,
        evaluated=2000,
        flagged=sum(p.is_straggler for p in predictions),
        model_version=4,
        boundary_produced_at=1.6e9,
        produced_at=1.7e9,
    )
    payloads = prediction_batches(predictions, marker)
    assert len(payloads) > 1 and all(len(p) <= MAX_PAYLOAD_BYTES for p in payloads)
    read: list[Prediction] = []
    markers = []
    for payload in payloads:
        batch = decode(payload)
        assert isinstance(batch, PredictionBatch)
        assert batch.flagged_tasks == [t for t, f in zip(batch.task_id, batch.is_straggler, strict=True) if f]
        part, end = expand_predictions(batch)
        read += part
        markers.append(end)
    assert read == predictions
    assert markers[:-1] == [None] * (len(payloads) - 1) and markers[-1] == marker


def test_an_empty_checkpoint_still_sends_its_marker() -> None:
    marker = CheckpointEvaluated(
        job_id="job-1",
        checkpoint_time=60.0,
        evaluated=0,
        flagged=0,
        model_version=0,
        boundary_produced_at=None,
        produced_at=1.7e9,
    )
    (payload,) = prediction_batches([], marker)
    batch = decode(payload)
    assert isinstance(batch, PredictionBatch)
    assert expand_predictions(batch) == ([], marker)


def test_columns_of_different_lengths_are_rejected() -> None:
    marker = CheckpointEvaluated(
        job_id="job-1",
        checkpoint_time=600.0,
        evaluated=2,
        flagged=0,
        model_version=4,
        boundary_produced_at=None,
        produced_at=1.7e9,
    )
    (payload,) = prediction_batches([_prediction(1, False), _prediction(2, False)], marker)
    obj = orjson.loads(payload)
    obj["weight"] = [None]
    batch = decode(orjson.dumps(obj))
    assert isinstance(batch, PredictionBatch)
    with pytest.raises(SchemaError, match="columns differ"):
        expand_predictions(batch)


def _batch(payload: bytes) -> TaskBatch:
    batch = decode(payload)
    assert isinstance(batch, TaskBatch)
    return batch


def _body(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("type", "schema_version", "job_id", "source")}


def _rule_violations_of_task_checkpoint() -> list[Any]:
    """Every task_checkpoint rule case of tests/test_schemas.py, as the body of a one-item batch."""
    from test_schemas import _rule_cases  # the generator walks the shipped schema files

    bodies = []
    for case in _rule_cases():
        obj, field, _, _ = case.values
        if not field.startswith("task_checkpoint.") or not isinstance(obj, dict):
            continue
        if field.split(".")[1] in ("type", "schema_version", "job_id", "source"):
            continue  # set once per batch, not per observation
        bodies.append(pytest.param(_body(obj), id=case.id))
    return bodies


@pytest.mark.parametrize("body", _rule_violations_of_task_checkpoint())
def test_the_fast_path_accepts_nothing_the_schema_rejects(body: dict[str, Any]) -> None:
    payload = orjson.dumps({"type": "task_batch", "schema_version": 1, "job_id": "j", "observations": [body]})
    batch = decode(payload)
    assert isinstance(batch, TaskBatch)
    assert _fast_observations(payload) is None
    (slow,) = observations(batch, payload)  # falls back to the schema, which names the error
    assert isinstance(slow, SchemaError)


def _events_to_batch() -> list[Any]:
    """Task checkpoints a producer might batch: every constructible rule case of tests/test_schemas.py,
    numbers JSON cannot carry, and types the schema accepts or refuses that orjson writes anyway."""
    from test_schemas import _rule_cases

    class Status(enum.Enum):
        RUNNING = "running"

    class Level(enum.Enum):
        ONE = 1.0

    class Text(str):
        pass

    names = {f.name for f in dataclasses.fields(TaskCheckpoint)}
    cases = []
    for case in _rule_cases():
        obj = case.values[0]
        if isinstance(obj, dict) and obj.get("type") == "task_checkpoint" and set(obj) <= names:
            try:
                cases.append(pytest.param(TaskCheckpoint(**obj), id=case.id))
            except TypeError:  # a required field missing
                continue
    good = _running(1)
    finished = dataclasses.replace(good, status="finished", latency=12.5)
    odd: dict[str, TaskCheckpoint] = {
        "valid": good,
        "no-source": dataclasses.replace(good, source=None),
        "finished": finished,
        "nan-feature": dataclasses.replace(good, features={"a": math.nan}),
        "inf-feature": dataclasses.replace(good, features={"a": -math.inf}),
        "nan-time": dataclasses.replace(good, checkpoint_time=math.nan),
        "inf-start": dataclasses.replace(good, start_time=math.inf),
        "nan-latency": dataclasses.replace(finished, latency=math.nan),
        "nan-latency-running": dataclasses.replace(good, latency=math.nan),
        "int-time": dataclasses.replace(good, checkpoint_time=600),
        "int-feature": dataclasses.replace(good, features={"a": 3}),
        "bool-feature": dataclasses.replace(good, features={"a": True}),
        "numpy-feature": dataclasses.replace(good, features={"a": np.float64(2.5)}),
        "bool-attempt": dataclasses.replace(good, attempt=True),
        "float-version": dataclasses.replace(good, schema_version=1.0),  # type: ignore[arg-type]
        "enum-status": dataclasses.replace(good, status=Status.RUNNING),  # type: ignore[arg-type]
        "str-subclass": dataclasses.replace(good, task_id=Text("t"), machine_id=Text("m")),
        "enum-feature": dataclasses.replace(good, features={"a": Status.RUNNING}),  # type: ignore[dict-item]
        "number-enum-feature": dataclasses.replace(good, features={"a": Level.ONE}),  # type: ignore[dict-item]
        "number-enum-attempt": dataclasses.replace(good, attempt=Level.ONE),  # type: ignore[arg-type]
        "surrogate": dataclasses.replace(good, task_id="t\ud800"),
        "long-source": dataclasses.replace(good, source="s" * 257),
        "int-key": dataclasses.replace(good, features={1: 1.0}),  # type: ignore[dict-item]
    }
    return cases + [pytest.param(event, id=name) for name, event in odd.items()]


@pytest.mark.parametrize("event", _events_to_batch())
def test_a_producer_batches_exactly_what_encode_accepts(event: TaskCheckpoint) -> None:
    events = [_running(0, job=event.job_id), event, _running(2, job=event.job_id)]
    try:
        expected: Any = _halved_whole_batches(event.job_id, events, "replayer", 1.7e9)
    except (SchemaError, ValueError) as error:
        with pytest.raises(type(error)) as refused:
            task_batches(event.job_id, events, source="replayer", produced_at=1.7e9)
        assert str(refused.value) == str(error)
    else:
        assert task_batches(event.job_id, events, source="replayer", produced_at=1.7e9) == expected


def test_the_fast_path_reads_valid_batches_as_the_schema_does() -> None:
    events = [_running(i) for i in range(300)] + [
        TaskCheckpoint(**{**_running(7).to_dict(), "status": "finished", "latency": 12.5}),
        TaskCheckpoint(**{**_running(8).to_dict(), "status": "killed"}),
    ]
    for payload in task_batches("job-1", events, source="replayer"):
        batch = _batch(payload)
        fast = _fast_observations(payload)
        assert fast is not None and fast == observations(batch)  # same events either way


@pytest.mark.parametrize("body", _rule_violations_of_task_checkpoint())
def test_the_one_pass_reader_accepts_no_batch_with_a_bad_observation(body: dict[str, Any]) -> None:
    payload = orjson.dumps({"type": "task_batch", "schema_version": 1, "job_id": "j", "observations": [body]})
    assert read_task_batch(payload) is None  # the agent then decodes it and letters the observation


def _valid_batch(**changes: Any) -> dict[str, Any]:
    obj = orjson.loads(task_batches("job-1", [_running(1), _running(2)], source="replayer")[0])
    return {**obj, **changes}


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(_valid_batch(schema_version=2), id="unknown-version"),
        pytest.param(_valid_batch(job_id=""), id="empty-job"),
        pytest.param(_valid_batch(job_id="j" * 257), id="long-job"),
        pytest.param(_valid_batch(produced_at=-1.0), id="negative-produced-at"),
        pytest.param(_valid_batch(source="s" * 257), id="long-source"),
        pytest.param(_valid_batch(extra=1), id="unknown-field"),
        pytest.param(_valid_batch(observations=[{}] * 4097), id="too-many"),
        pytest.param(_valid_batch(observations=[1]), id="not-an-object"),
        pytest.param({k: v for k, v in _valid_batch().items() if k != "job_id"}, id="no-job"),
    ],
)
def test_the_one_pass_reader_accepts_no_batch_decode_rejects(obj: dict[str, Any]) -> None:
    payload = orjson.dumps(obj)
    with pytest.raises(SchemaError):
        decode(payload)
    assert read_task_batch(payload) is None


def test_the_one_pass_reader_refuses_what_is_not_json_or_too_large() -> None:
    good = task_batches("job-1", [_running(1)], source="replayer")[0]
    for payload in (
        good[:-1],
        good.replace(b'"task-00001"', b'"task-\xff"'),
        None,
        good + b" " * MAX_PAYLOAD_BYTES,
    ):
        with pytest.raises(SchemaError):
            decode(payload)
        assert read_task_batch(payload) is None


def test_the_one_pass_reader_reads_valid_batches_as_decode_does() -> None:
    events = [_running(i) for i in range(300)] + [
        TaskCheckpoint(**{**_running(7).to_dict(), "status": "finished", "latency": 12.5}),
        TaskCheckpoint(**{**_running(8).to_dict(), "status": "killed"}),
    ]
    for payload in task_batches("job-1", events, source="replayer"):
        read = read_task_batch(payload)
        assert read is not None and read.job_id == "job-1"
        expected = observations(_batch(payload))
        fields = (
            "task_id",
            "attempt",
            "checkpoint_time",
            "status",
            "machine_id",
            "features",
            "latency",
            "start_time",
        )
        assert [[getattr(o, f) for f in fields] for o in read.observations] == [
            [getattr(o, f) for f in fields] for o in expected
        ]
    for other in (
        orjson.dumps({"source": "x", **_valid_batch()}),
        orjson.dumps(_valid_batch(schema_version=1.0)),
    ):
        assert read_task_batch(other) is None and isinstance(decode(other), TaskBatch)  # read the slow way


def _decision(i: int, flag: bool) -> Decision:
    return Decision(
        job_id="job-1",
        task_id=f"task-{i:05d}",
        checkpoint_time=600.0,
        elapsed=float(i % 300) + 0.1 * i,
        raw_latency=100.0 + i / 7,
        adjusted_latency=math.nan if i % 2 else 130.0 + i / 3,
        propensity=0.25 + i / 1e5,
        weight=math.nan,
        threshold=150.0,
        is_straggler=flag,
        model_version=4,
        attempt=i % 2,
        straggle_probability=math.nan if i % 5 == 0 else 1 / (i + 1),
    )


def _marker_of(decisions: list[Decision], boundary_produced_at: float | None) -> CheckpointEvaluated:
    return CheckpointEvaluated(
        job_id="job-1",
        checkpoint_time=600.0,
        evaluated=len(decisions),
        flagged=sum(d.is_straggler for d in decisions),
        model_version=4,
        boundary_produced_at=boundary_produced_at,
        produced_at=1.7e9,
    )


@pytest.mark.parametrize("n", [0, 1, 37, 3000])
def test_prediction_parts_are_the_bytes_of_validated_prediction_events(n: int) -> None:
    """The agent's by-column parts (no schema check) are those of one validated `Prediction` per
    decision, and every part passes the schema."""
    decisions = [_decision(i, flag=i % 97 == 0) for i in range(n)]
    marker = _marker_of(decisions, None if n == 1 else 1.6e9)
    parts = prediction_parts(decisions, "nurd", marker)
    assert parts == prediction_batches([prediction_event(d, "nurd", 1.7e9) for d in decisions], marker)
    assert (len(parts) > 1) == (n == 3000)
    for part in parts:
        assert isinstance(decode(part), PredictionBatch)


def test_prediction_parts_refuse_numbers_json_cannot_carry() -> None:
    good = _decision(0, False)
    for name, bad in (
        ("raw_latency", dataclasses.replace(good, raw_latency=math.inf)),
        ("elapsed", dataclasses.replace(good, elapsed=math.nan)),
        ("weight", dataclasses.replace(good, weight=-math.inf)),
    ):
        with pytest.raises(SchemaError, match=rf"prediction_batch\.{name}\[1\]"):
            prediction_parts([good, bad], "nurd", _marker_of([good, bad], None))
