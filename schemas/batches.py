"""Many observations or verdicts per record: building and reading ``task_batch`` and ``prediction_batch``.

A Kafka record costs a Faust worker tens of microseconds whatever it carries, so one task observation
per record caps a worker far below a cell's event rate. Batches carry one job's observations (a
checkpoint, or what a live producer gathered) and one job checkpoint's verdicts, each cut into parts
within 64 KiB. Readers turn them back into the single-item events (`TaskCheckpoint`,
`Prediction`, `CheckpointEvaluated`), so everything downstream keeps one meaning per event.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from schemas.codec import SchemaError, decode, decode_object, encode
from schemas.events import CheckpointEvaluated, Event, Prediction, PredictionBatch, TaskBatch, TaskCheckpoint

_ENVELOPE = ("type", "schema_version", "job_id", "source")
"""task_checkpoint fields a batch carries once, not per observation."""

_VERDICT_COLUMNS = (
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

Item = TypeVar("Item")

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
_NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class _Observation(msgspec.Struct, forbid_unknown_fields=True):
    """The rules of task_checkpoint.v1.schema.json for a batch body, as msgspec checks them in C."""

    task_id: _Id
    attempt: Annotated[int, msgspec.Meta(ge=0)]
    checkpoint_time: _NonNegative
    status: Literal["running", "finished", "failed", "killed"]
    machine_id: Annotated[str, msgspec.Meta(max_length=256)]
    features: Annotated[dict[str, float], msgspec.Meta(max_length=256)]
    latency: _NonNegative | None = None
    start_time: _NonNegative | None = None


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["task_batch"]
    schema_version: Literal[1]
    job_id: _Id
    observations: Annotated[list[_Observation], msgspec.Meta(max_length=4096)]
    produced_at: _NonNegative | None = None
    source: Annotated[str, msgspec.Meta(max_length=256)] | None = None


_FAST_DECODER = msgspec.json.Decoder(_Batch)


def _fast_observations(payload: bytes) -> list[TaskCheckpoint | SchemaError] | None:
    """Every observation of a task_batch record, if all are valid; None if any is not (or the record
    is not a batch), and the caller takes the per-observation path, which names each error.

    msgspec is stricter than the JSON Schema (it refuses 3.0 for an integer): anything it refuses goes
    the slow way, so it never accepts what the schema rejects (tests/test_batches.py checks the rules).
    """
    try:
        batch = _FAST_DECODER.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    out: list[TaskCheckpoint | SchemaError] = []
    for o in batch.observations:
        if (o.status == "finished") != (o.latency is not None):
            return None
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

    Every observation is validated as a task_checkpoint first (raising `SchemaError`), so a producer
    never sends an observation the agent would reject.
    """
    bodies = []
    for event in events:
        if event.job_id != job_id:
            raise ValueError(f"task_batches: event of job {event.job_id!r} in a batch of {job_id!r}")
        obj = event.to_dict()
        encode(event)  # the single event's contract, with its own error messages
        bodies.append({k: v for k, v in obj.items() if k not in _ENVELOPE})
    stamp = time.time() if produced_at is None else produced_at

    def build(part: list[dict[str, Any]]) -> Event:
        return TaskBatch(job_id=job_id, observations=part, produced_at=stamp, source=source)

    return _encode_in_parts(bodies, build)


def prediction_batches(predictions: Sequence[Prediction], marker: CheckpointEvaluated) -> list[bytes]:
    """Encoded ``prediction_batch`` parts for one job checkpoint: ``predictions`` and its marker.

    The predictions must all be of the marker's job and checkpoint and share one method and threshold.
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
    pieces = _fitting(list(predictions), lambda part: _prediction_part(part, marker, method, threshold, 0, 1))
    first_chunk, first_payload = next(pieces)
    chunks = [first_chunk, *(chunk for chunk, _ in pieces)]
    if len(chunks) == 1:
        return [first_payload]  # one part: already encoded as part 0 of 1
    parts = len(chunks)
    return [
        encode(_prediction_part(chunk, marker, method, threshold, index, parts))
        for index, chunk in enumerate(chunks)
    ]


def expand_predictions(batch: PredictionBatch) -> tuple[list[Prediction], CheckpointEvaluated | None]:
    """The part's verdicts as `Prediction`s, and the checkpoint's marker if this is its last part.

    Raises `SchemaError` if the columns differ in length (a rule JSON Schema cannot state).
    """
    columns = [getattr(batch, name) for name in _VERDICT_COLUMNS]
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


def _prediction_part(
    part: Sequence[Prediction],
    marker: CheckpointEvaluated,
    method: str,
    threshold: float,
    index: int,
    parts: int,
) -> PredictionBatch:
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
        flagged_tasks=[p.task_id for p in part if p.is_straggler],
        task_id=[p.task_id for p in part],
        attempt=[0 if p.attempt is None else p.attempt for p in part],
        elapsed=[p.elapsed for p in part],
        is_straggler=[p.is_straggler for p in part],
        raw_latency=[p.raw_latency for p in part],
        adjusted_latency=[p.adjusted_latency for p in part],
        propensity=[p.propensity for p in part],
        weight=[p.weight for p in part],
        straggle_probability=[p.straggle_probability for p in part],
    )


def _encode_in_parts(items: list[Item], build: Callable[[list[Item]], Event]) -> list[bytes]:
    return [payload for _, payload in _fitting(items, build)]


def _fitting(items: list[Item], build: Callable[[list[Item]], Event]) -> Iterator[tuple[list[Item], bytes]]:
    """``items`` cut into consecutive runs whose record passes its size and item limits, by halving."""
    try:
        payload = encode(build(items))
    except SchemaError as error:
        if error.rule not in ("maxSize", "maxItems") or len(items) <= 1:
            raise
        middle = len(items) // 2
        yield from _fitting(items[:middle], build)
        yield from _fitting(items[middle:], build)
        return
    yield items, payload


__all__ = [
    "decode_each",
    "expand_predictions",
    "observations",
    "prediction_batches",
    "task_batches",
    "unbatched",
]
