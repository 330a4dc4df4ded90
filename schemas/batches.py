"""Many observations or verdicts per record: building and reading ``task_batch`` and ``prediction_batch``.

A Kafka record costs a Faust worker tens of microseconds whatever it carries, so one task observation
per record caps a worker far below a cell's event rate. Batches carry one job's observations (a
checkpoint, or what a live producer gathered) and one job checkpoint's verdicts, each cut into parts
within 64 KiB. Readers turn them back into the single-item events (`TaskCheckpoint`,
`Prediction`, `CheckpointEvaluated`), so everything downstream keeps one meaning per event.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Annotated, Any, ClassVar, Literal

import msgspec
import numpy as np
import orjson

from schemas.codec import (
    MAX_PAYLOAD_BYTES,
    SchemaError,
    decode,
    decode_object,
    encode,
    payload_size,
    schema_document,
    within_limit,
    written,
)
from schemas.events import CheckpointEvaluated, Event, Prediction, PredictionBatch, TaskBatch, TaskCheckpoint
from schemas.ranges import COUNT_LIMITS, MAX_MAGNITUDE, MAX_TASK_SECONDS, MAX_TIME_S

_ENVELOPE = ("type", "schema_version", "job_id", "source")
"""task_checkpoint fields a batch carries once, not per observation."""
_MAX_OBSERVATIONS: int = schema_document("task_batch", 1)["properties"]["observations"]["maxItems"]
"""Most observations a task_batch record may carry."""
_CHECKPOINT_PREFIX = b'{"type":"task_checkpoint","schema_version":1,"job_id":'
"""How `encode` starts a task_checkpoint record, up to its job id."""
_OBSERVATIONS_KEY = b'"observations":['
"""Where an encoded task_batch's observations begin."""
_MAX_ID_CHARS = 256
"""Longest job id or source the schemas allow."""

VERDICT_COLUMNS = (
    "task_id",
    "attempt",
    "elapsed",
    "is_straggler",
    "raw_latency",
    "adjusted_latency",
    "propensity",
    "weight",
    "straggle_probability",
)
"""The columns of a ``prediction_batch``, one entry per verdict."""
_NUMBER_COLUMNS = (
    "elapsed",
    "raw_latency",
    "adjusted_latency",
    "propensity",
    "weight",
    "straggle_probability",
)
"""The float columns: ``elapsed`` (never null), then those null where a method has no value."""
_NULLABLE_COLUMNS = frozenset(_NUMBER_COLUMNS) - {"elapsed"}

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
_Time = Annotated[float, msgspec.Meta(ge=0, le=MAX_TIME_S)]
_Duration = Annotated[float, msgspec.Meta(ge=0, le=MAX_TASK_SECONDS)]
_Feature = Annotated[float, msgspec.Meta(ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE)]


class Observation(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One observation of a task_batch, checked by msgspec in C against the rules of
    task_checkpoint.v1.schema.json and the ranges of `schemas.ranges` (less the finished/latency rule
    and the start/checkpoint order, `read_task_batch` checks them)."""

    task_id: _Id
    attempt: Annotated[int, msgspec.Meta(ge=0, le=COUNT_LIMITS["attempt"])]
    checkpoint_time: _Time
    status: Literal["running", "finished", "failed", "killed"]
    machine_id: Annotated[str, msgspec.Meta(max_length=256)]
    features: Annotated[dict[str, _Feature], msgspec.Meta(max_length=256)]
    latency: _Duration | None = None
    start_time: _Time | None = None


class _Batch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["task_batch"]
    schema_version: Literal[1]
    job_id: _Id
    observations: Annotated[list[Observation], msgspec.Meta(max_length=_MAX_OBSERVATIONS)]
    produced_at: _Time | None = None
    source: Annotated[str, msgspec.Meta(max_length=256)] | None = None


_FAST_DECODER = msgspec.json.Decoder(_Batch)
_OBSERVATION_LIST = msgspec.json.Decoder(list[Observation])
_BATCH_PREFIX = b'{"type":"task_batch"'
"""How `encode` starts a task_batch record (its first field is the type)."""


@dataclass(frozen=True, slots=True)
class TaskObservations:
    """Valid task observations of one job, in the order they happened: all of a task_batch record's
    (`read_task_batch`), or the valid ones of a record once the bad ones are dead-lettered."""

    job_id: str
    observations: Sequence[Observation | TaskCheckpoint]
    type: ClassVar[str] = "task_batch"
    """The record type they came in, as an event's (for log lines)."""


def read_task_batch(payload: bytes | bytearray | memoryview | str | None) -> TaskObservations | None:
    """A task_batch record whose observations are all valid, read and checked in one compiled pass;
    None for any other record, or one with a bad observation: `decode` it (and `observations`), which
    names each error. The same observations either way (tests/test_batches.py).

    msgspec is stricter than the JSON Schema (it refuses 3.0 for an integer): anything it refuses goes
    the slow way, so this never accepts what `decode` rejects. Only records that start as `encode`
    writes them are tried, so other records cost no failed attempt.
    """
    if payload is None or payload_size(payload) > MAX_PAYLOAD_BYTES:
        return None
    head = payload[: len(_BATCH_PREFIX)]
    if head != (_BATCH_PREFIX.decode() if isinstance(payload, str) else _BATCH_PREFIX):
        return None
    batch = _checked_batch(payload)
    return None if batch is None else TaskObservations(batch.job_id, batch.observations)


def _checked_batch(payload: bytes | bytearray | memoryview | str) -> _Batch | None:
    """The record as a `_Batch` if it is a task_batch whose observations are all valid, else None."""
    try:
        batch = _FAST_DECODER.decode(payload)
    except (msgspec.MsgspecError, ValueError):  # invalid UTF-8 raises UnicodeDecodeError
        return None
    for o in batch.observations:
        if (o.status == "finished") != (o.latency is not None):
            return None
        start = o.start_time
        if start is not None and not 0 <= o.checkpoint_time - start <= MAX_TASK_SECONDS:
            return None
    return batch


def _fast_observations(payload: bytes) -> list[TaskCheckpoint | SchemaError] | None:
    """Every observation of a task_batch record as a `TaskCheckpoint`, if all are valid; else None."""
    batch = _checked_batch(payload)
    if batch is None:
        return None
    out: list[TaskCheckpoint | SchemaError] = []
    for o in batch.observations:
        out.append(
            TaskCheckpoint(
                job_id=batch.job_id,
                task_id=o.task_id,
                attempt=o.attempt,
                checkpoint_time=o.checkpoint_time,
                status=o.status,
                machine_id=o.machine_id,
                features=o.features,
                latency=o.latency,
                start_time=o.start_time,
                source=batch.source,
            )
        )
    return out


def observations(batch: TaskBatch, payload: bytes | None = None) -> list[TaskCheckpoint | SchemaError]:
    """Each observation of ``batch`` as a validated `TaskCheckpoint`, or the `SchemaError` it broke.

    Errors name the observation (``task_batch.observations[3].latency``), so a dead letter says which
    one was bad; the others are unaffected. Given the record's ``payload``, a batch whose observations
    are all valid is checked in one compiled pass (`_fast_observations`) instead of one by one.
    """
    if payload is not None:
        fast = _fast_observations(payload)
        if fast is not None:
            return fast
    out: list[TaskCheckpoint | SchemaError] = []
    for index, body in enumerate(batch.observations):
        where = f"task_batch.observations[{index}]"
        reserved = [name for name in _ENVELOPE if name in body]
        if reserved:
            out.append(SchemaError(f"{where}.{reserved[0]}", "additionalProperties", "set once per batch"))
            continue
        obj = {"type": "task_checkpoint", "schema_version": 1, "job_id": batch.job_id, **body}
        if batch.source is not None:
            obj["source"] = batch.source
        try:
            event = decode_object(obj)
        except SchemaError as error:
            out.append(error.moved("task_checkpoint", where))
            continue
        assert isinstance(event, TaskCheckpoint)
        out.append(event)
    return out


def task_batches(
    job_id: str,
    events: Sequence[TaskCheckpoint],
    *,
    source: str | None = None,
    produced_at: float | None = None,
) -> list[bytes]:
    """Encoded ``task_batch`` records carrying ``events`` (all of ``job_id``), in order, each within 64 KiB.

    Every observation is validated once as a task_checkpoint (raising `SchemaError`), so a producer
    never sends an observation the agent would reject, and the batch's own fields once. A batch over a
    limit is halved until its parts fit (`_halved`); a part's size is added up from its observations'
    encoded sizes, so nothing is encoded or validated again at each halving.
    """
    bodies = _observation_bodies(job_id, events)
    stamp = time.time() if produced_at is None else produced_at
    empty = encode(TaskBatch(job_id=job_id, observations=[], produced_at=stamp, source=source))
    cut = empty.index(_OBSERVATIONS_KEY) + len(_OBSERVATIONS_KEY)
    head, tail = empty[:cut], empty[cut:]
    ends = list(accumulate((len(body) for body in bodies), initial=0))

    def fits(start: int, stop: int) -> bool:
        size = len(empty) + ends[stop] - ends[start] + (stop - start - 1)  # a comma between two
        return stop - start <= _MAX_OBSERVATIONS and size <= MAX_PAYLOAD_BYTES

    return [
        within_limit("task_batch", head + b",".join(bodies[start:stop]) + tail)
        for start, stop in _halved(0, len(bodies), fits)
    ]


def _observation_bodies(job_id: str, events: Sequence[TaskCheckpoint]) -> list[bytes]:
    """Each event as a task_batch observation, encoded and validated once as a task_checkpoint: all at
    once by msgspec (`_plain_bodies`) if it can vouch for every one, else one by one by `encode`, whose
    errors name the field."""
    plain = _plain_bodies(job_id, events)
    if plain is not None:
        return plain
    bodies: list[bytes] = []
    tails = _Tails()
    for event in events:
        if event.job_id != job_id:
            raise ValueError(f"task_batches: event of job {event.job_id!r} in a batch of {job_id!r}")
        record = encode(event)  # the single event's contract, with its own error messages
        body = _body_of(record, _CHECKPOINT_PREFIX + orjson.dumps(event.job_id) + b",", tails[event.source])
        if body is None:  # written otherwise than assumed (an unusual schema_version): encode the body
            obj = {k: v for k, v in event.to_dict().items() if k not in _ENVELOPE}
            body = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
        bodies.append(body)
    return bodies


def _plain_bodies(job_id: str, events: Sequence[TaskCheckpoint]) -> list[bytes] | None:
    """The encoded observations if every event is `_plain` and `Observation` accepts them all; else None.

    On such values msgspec is as strict as the schema (the read path's `read_task_batch` relies on it
    too), and orjson writes NaN and infinities as null, which it refuses where a number is required; a
    null latency or start_time is compared with the event's.
    """
    if not (type(job_id) is str and 0 < len(job_id) <= _MAX_ID_CHARS):
        return None
    head = _CHECKPOINT_PREFIX + orjson.dumps(job_id) + b","
    tails = _Tails()
    bodies: list[bytes] = []
    try:
        for event in events:
            if not _plain(event, job_id):
                return None
            record = orjson.dumps(event.to_dict())
            body = _body_of(record, head, tails[event.source])
            if body is None or len(record) > MAX_PAYLOAD_BYTES:
                return None
            bodies.append(body)
        checked = _OBSERVATION_LIST.decode(b"[" + b",".join(bodies) + b"]")
    except (orjson.JSONEncodeError, msgspec.MsgspecError):
        return None
    for observation, event in zip(checked, events, strict=True):
        if (observation.latency is None) != (event.latency is None):
            return None
        if (observation.start_time is None) != (event.start_time is None):
            return None
    return bodies


def _plain(event: TaskCheckpoint, job_id: str) -> bool:
    """Whether ``event`` is of ``job_id`` and holds only the plain types its schema names (no
    subclasses, enums or NumPy scalars, which orjson may write as a valid value of another type), and
    has a latency exactly if it finished."""
    return (
        type(event.job_id) is str
        and event.job_id == job_id
        and event.type == TaskCheckpoint.EVENT_TYPE
        and type(event.schema_version) is int
        and event.schema_version == 1
        and type(event.task_id) is str
        and type(event.attempt) is int
        and type(event.checkpoint_time) is float
        and type(event.status) is str
        and type(event.machine_id) is str
        and (event.latency is None or type(event.latency) is float)
        and (event.start_time is None or type(event.start_time) is float)
        and (event.source is None or (type(event.source) is str and len(event.source) <= _MAX_ID_CHARS))
        and (event.status == "finished") == (event.latency is not None)
        and type(event.features) is dict
        and all(type(value) is float for value in event.features.values())
    )


class _Tails(dict[str | None, bytes]):
    """How `encode` ends a task_checkpoint record of each source (the source is its last field)."""

    def __missing__(self, source: str | None) -> bytes:
        tail = self[source] = b"}" if source is None else b',"source":' + orjson.dumps(source) + b"}"
        return tail


def _body_of(record: bytes, head: bytes, tail: bytes) -> bytes | None:
    """The observation in a task_checkpoint ``record`` that starts with ``head`` (up to its job id) and
    ends with ``tail`` (its source): the fields between, as an object; None if it does not."""
    if record.startswith(head) and record.endswith(tail):
        return b"{" + record[len(head) : len(record) - len(tail)] + b"}"
    return None


def prediction_batches(predictions: Sequence[Prediction], marker: CheckpointEvaluated) -> list[bytes]:
    """Encoded ``prediction_batch`` parts for one job checkpoint: ``predictions`` and its marker.

    The predictions must all be of the marker's job and checkpoint and share one method and threshold.
    Each part is validated (`encode`); the agent writes the same parts with `verdict_batches`.
    """
    if any(p.job_id != marker.job_id or p.checkpoint_time != marker.checkpoint_time for p in predictions):
        raise ValueError("prediction_batches: predictions of another job or checkpoint than the marker")
    methods = {p.method for p in predictions} or {"none"}
    thresholds = {p.threshold for p in predictions} or {1.0}
    if len(methods) > 1 or len(thresholds) > 1:
        raise ValueError(
            f"prediction_batches: one method and threshold per checkpoint, got {methods}, {thresholds}"
        )
    (method,), (threshold,) = methods, thresholds
    columns = {name: [getattr(p, name) for p in predictions] for name in VERDICT_COLUMNS}
    columns["attempt"] = [0 if attempt is None else attempt for attempt in columns["attempt"]]
    return _prediction_parts(columns, marker, method, threshold, encode)


def verdict_batches(
    columns: Mapping[str, list[Any]], marker: CheckpointEvaluated, method: str, threshold: float
) -> list[bytes]:
    """The ``prediction_batch`` parts of one job checkpoint given by column: the same bytes as
    `prediction_batches` of the same verdicts, built without a `Prediction` per task.

    ``columns`` maps each of `VERDICT_COLUMNS` to a list, entry i of each being task i's; a number the
    method does not produce may be NaN (written null). Not checked against the schema: this is the
    agent's own output on its hot path (tests/test_batches.py validates it); only non-finite numbers,
    which JSON cannot carry, are refused.
    """
    for name in _NUMBER_COLUMNS:
        values = np.asarray(columns[name], dtype=np.float64)
        bad = np.isinf(values) if name in _NULLABLE_COLUMNS else ~np.isfinite(values)
        if bad.any():
            index = int(np.argmax(bad))
            raise SchemaError(
                f"prediction_batch.{name}[{index}]", "finite", "must be a finite number", float(values[index])
            )
    return _prediction_parts(columns, marker, method, threshold, _written)


def expand_predictions(batch: PredictionBatch) -> tuple[list[Prediction], CheckpointEvaluated | None]:
    """The part's verdicts as `Prediction`s, and the checkpoint's marker if this is its last part.

    Raises `SchemaError` if the columns differ in length (a rule JSON Schema cannot state).
    """
    columns = [getattr(batch, name) for name in VERDICT_COLUMNS]
    lengths = {len(column) for column in columns}
    if len(lengths) > 1:
        raise SchemaError(
            "prediction_batch.task_id", "columns", f"columns differ in length: {sorted(lengths)}"
        )
    if batch.part >= batch.parts:
        raise SchemaError("prediction_batch.part", "parts", f"must be < parts ({batch.parts})", batch.part)
    predictions = [
        Prediction(
            job_id=batch.job_id,
            task_id=task_id,
            checkpoint_time=batch.checkpoint_time,
            raw_latency=raw,
            adjusted_latency=adjusted,
            propensity=propensity,
            weight=weight,
            threshold=batch.threshold,
            is_straggler=flag,
            method=batch.method,
            model_version=batch.model_version,
            elapsed=elapsed,
            produced_at=batch.produced_at,
            attempt=int(attempt),
            straggle_probability=probability,
        )
        for task_id, attempt, elapsed, flag, raw, adjusted, propensity, weight, probability in zip(
            *columns, strict=True
        )
    ]
    if batch.part != batch.parts - 1:
        return predictions, None
    marker = CheckpointEvaluated(
        job_id=batch.job_id,
        checkpoint_time=batch.checkpoint_time,
        evaluated=batch.evaluated,
        flagged=batch.flagged,
        model_version=batch.model_version,
        boundary_produced_at=batch.boundary_produced_at,
        produced_at=batch.produced_at,
    )
    return predictions, marker


def unbatched(event: Event) -> list[Event]:
    """The single-item events a record carries, for readers that do not dead-letter: a task batch's
    valid observations, a prediction batch's verdicts and (last part) its marker, else the event."""
    if isinstance(event, TaskBatch):
        return [obs for obs in observations(event) if not isinstance(obs, SchemaError)]
    if isinstance(event, PredictionBatch):
        predictions, marker = expand_predictions(event)
        return [*predictions, marker] if marker is not None else list(predictions)
    return [event]


def decode_each(payload: bytes | None) -> list[Event]:
    """`decode` one record, then `unbatched`: raises `SchemaError` only for the record as a whole."""
    return unbatched(decode(payload))


def _prediction_parts(
    columns: Mapping[str, list[Any]],
    marker: CheckpointEvaluated,
    method: str,
    threshold: float,
    write: Callable[[Event], bytes],
) -> list[bytes]:
    """The checkpoint's parts, cut within the size limit, each written by ``write``."""

    def part(start: int, stop: int, index: int, parts: int) -> PredictionBatch:
        cut = {name: columns[name][start:stop] for name in VERDICT_COLUMNS}
        return PredictionBatch(
            job_id=marker.job_id,
            checkpoint_time=marker.checkpoint_time,
            method=method,
            model_version=marker.model_version,
            threshold=threshold,
            evaluated=marker.evaluated,
            flagged=marker.flagged,
            part=index,
            parts=parts,
            boundary_produced_at=marker.boundary_produced_at,
            produced_at=marker.produced_at,
            flagged_tasks=[t for t, flag in zip(cut["task_id"], cut["is_straggler"], strict=True) if flag],
            task_id=cut["task_id"],
            attempt=cut["attempt"],
            elapsed=cut["elapsed"],
            is_straggler=cut["is_straggler"],
            raw_latency=cut["raw_latency"],
            adjusted_latency=cut["adjusted_latency"],
            propensity=cut["propensity"],
            weight=cut["weight"],
            straggle_probability=cut["straggle_probability"],
        )

    runs = list(_fitting(0, len(columns["task_id"]), lambda start, stop: write(part(start, stop, 0, 1))))
    if len(runs) == 1:
        return [runs[0][2]]  # one part: already written as part 0 of 1
    return [write(part(start, stop, index, len(runs))) for index, (start, stop, _) in enumerate(runs)]


def _written(event: Event) -> bytes:
    return written(event.EVENT_TYPE, event.to_dict())


def _fitting(start: int, stop: int, payload: Callable[[int, int], bytes]) -> Iterator[tuple[int, int, bytes]]:
    """``[start, stop)`` cut into consecutive runs whose record passes its size and item limits, by
    halving (`_halved`); ``payload`` writes the record of a run, each run's record is written once."""
    written: dict[tuple[int, int], bytes] = {}

    def fits(first: int, end: int) -> bool:
        try:
            written[first, end] = payload(first, end)
        except SchemaError as error:
            if error.rule not in ("maxSize", "maxItems"):
                raise
            return False
        return True

    for first, end in _halved(start, stop, fits):
        # a single item is a run without being tried: writing it here raises why it does not fit
        yield first, end, written[first, end] if (first, end) in written else payload(first, end)


def _halved(start: int, stop: int, fits: Callable[[int, int], bool]) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` halved until each run ``fits`` (its record is within the size and item limits);
    a single item is a run even if it does not fit (its record then says why)."""
    if stop - start <= 1 or fits(start, stop):
        yield start, stop
        return
    middle = start + (stop - start) // 2
    yield from _halved(start, middle, fits)
    yield from _halved(middle, stop, fits)


__all__ = [
    "VERDICT_COLUMNS",
    "Observation",
    "TaskObservations",
    "decode_each",
    "expand_predictions",
    "observations",
    "prediction_batches",
    "read_task_batch",
    "task_batches",
    "unbatched",
    "verdict_batches",
]
