"""The events of the pipeline as Python values, one frozen dataclass per JSON Schema in this package.

Field names are exactly the schema's property names (a test keeps them from drifting), so
``to_dict`` and ``from_dict`` are plain renames-free copies and the codec never deep-copies.
``from_dict`` trusts its input: `schemas.codec.decode` validates before it builds an event.

Optional fields hold ``None`` when absent; ``to_dict`` leaves them out, which the schemas accept as
"absent or null". Fields the schema requires but allows to be null (a prediction's latencies for
methods without them) are always written, as ``null``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, Self, get_type_hints

SCHEMA_VERSION = 1
"""Version most events are written with today; `RelaunchCommand` is at version 2 (it names the task
attempt), `JobEvent` at 2 (it adds ``reason``: an abandoned job), `Prediction` at 3 (it adds the
straggle probability) and `DeadLetter` at 3 (it names the stage that wrote it, since 2; the executor
is a stage since 3). `schemas.codec` reads every version
it ships a schema for."""

TaskStatus = Literal["running", "finished", "failed", "killed"]
JobEventKind = Literal["started", "ended"]
ABANDONED = "abandoned"
"""How the ``reason`` of a job the agent closed because it stopped reporting begins."""
Action = Literal["relaunch", "duplicate", "kill"]
HoldKind = Literal["no_estimate", "price", "budget", "machines", "rule"]
"""Why a flagged task got no command (`MitigationNote`; `straggler.core.policies.HoldKind`)."""
Stage = Literal["agent", "mitigator", "executor"]
"""Who wrote a dead letter: the Faust worker's agent or the mitigation consumer (both read the inputs),
or a command executor (reads ``relaunch-commands``; `consumers.dask_executor`)."""


class _EventBase:
    """Shared ``to_dict``/``from_dict`` over the field tables that `_register` fills in."""

    __slots__ = ()

    EVENT_TYPE: ClassVar[str]
    """The ``type`` discriminator; a class attribute because slots hide field defaults."""
    _FIELDS: ClassVar[tuple[str, ...]] = ()
    _OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset()
    _INT_FIELDS: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The event as a JSON-ready dict; nested values (``features``) are shared, not copied."""
        out: dict[str, Any] = {}
        for name in self._FIELDS:
            value = getattr(self, name)
            if value is None and name in self._OMIT_IF_NONE:
                continue
            out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build the event from an already validated dict (see `schemas.codec.decode`).

        JSON Schema counts ``3.0`` as an integer, so integral floats in integer fields are turned back
        into ``int`` here; nothing else is converted or copied.
        """
        for name in cls._INT_FIELDS:
            value = data.get(name)
            if isinstance(value, float):
                data = {**data, name: int(value)}
        factory: Callable[..., Self] = cls
        return factory(**data)


INPUT_FEATURE = "input_mb"
"""A feature of this name is the task's input size, the same for each of its attempts (a copy reads
the same input): the mitigator then prices a copy's time by it (`Speculate.on_task_input`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskCheckpoint(_EventBase):
    """One task's state at one checkpoint; ``latency`` only once it has finished. A feature named
    `INPUT_FEATURE` is the task's input size."""

    EVENT_TYPE: ClassVar[str] = "task_checkpoint"

    type: Literal["task_checkpoint"] = "task_checkpoint"
    schema_version: int = SCHEMA_VERSION
    job_id: str
    task_id: str
    attempt: int
    checkpoint_time: float
    status: TaskStatus
    machine_id: str
    features: dict[str, float]
    latency: float | None = None
    start_time: float | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskBatch(_EventBase):
    """Many task observations of one job in one record; see `schemas.batches` to build and read it.

    ``observations`` are task_checkpoint bodies (no type, version, job id or source), validated one by
    one when read, so one bad observation does not cost the others."""

    EVENT_TYPE: ClassVar[str] = "task_batch"

    type: Literal["task_batch"] = "task_batch"
    schema_version: int = SCHEMA_VERSION
    job_id: str
    observations: list[dict[str, Any]]
    produced_at: float | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEvent(_EventBase):
    """A job started (announcing its task count) or ended (by its producer, or abandoned)."""

    EVENT_TYPE: ClassVar[str] = "job_event"

    type: Literal["job_event"] = "job_event"
    schema_version: int = 2
    job_id: str
    event: JobEventKind
    time: float
    expected_tasks: int | None = None
    sends_boundaries: bool | None = None
    feature_names: list[str] | None = None
    reason: str | None = None
    """Version 2: why the job ended when its producer did not end it (`ABANDONED`: the agent closed a
    live job that stopped reporting); None when the producer ended it."""

    @property
    def abandoned(self) -> bool:
        return self.event == "ended" and self.reason is not None and self.reason.startswith(ABANDONED)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointBoundary(_EventBase):
    """All of a job's events for ``checkpoint_index`` have been sent before this one."""

    EVENT_TYPE: ClassVar[str] = "checkpoint_boundary"

    type: Literal["checkpoint_boundary"] = "checkpoint_boundary"
    schema_version: int = SCHEMA_VERSION
    job_id: str
    checkpoint_time: float
    checkpoint_index: int
    produced_at: float
    origin: Literal["producer", "timer"] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointEvaluated(_EventBase):
    """The agent has sent every prediction of this checkpoint of this job (a marker, not a verdict)."""

    EVENT_TYPE: ClassVar[str] = "checkpoint_evaluated"

    type: Literal["checkpoint_evaluated"] = "checkpoint_evaluated"
    schema_version: int = SCHEMA_VERSION
    job_id: str
    checkpoint_time: float
    evaluated: int
    flagged: int
    model_version: int
    boundary_produced_at: float | None
    produced_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction(_EventBase):
    """A method's verdict on one running task; latencies, propensity and weight may be ``None``."""

    EVENT_TYPE: ClassVar[str] = "prediction"

    type: Literal["prediction"] = "prediction"
    schema_version: int = 3
    job_id: str
    task_id: str
    checkpoint_time: float
    raw_latency: float | None
    adjusted_latency: float | None
    propensity: float | None
    weight: float | None
    threshold: float
    is_straggler: bool
    method: str
    model_version: int
    elapsed: float
    produced_at: float
    attempt: int | None = None
    """The attempt judged (version 2); None when read from a version-1 record."""
    straggle_probability: float | None = None
    """P(latency >= threshold) where the method estimates it (version 3)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictionBatch(_EventBase):
    """A checkpoint's verdicts on one job, by column; the last part completes the checkpoint.

    Build and read it with `schemas.batches` (`prediction_batches`, `expand_predictions`)."""

    EVENT_TYPE: ClassVar[str] = "prediction_batch"

    type: Literal["prediction_batch"] = "prediction_batch"
    schema_version: int = SCHEMA_VERSION
    job_id: str
    checkpoint_time: float
    method: str
    model_version: int
    threshold: float
    evaluated: int
    flagged: int
    part: int
    parts: int
    boundary_produced_at: float | None
    produced_at: float
    flagged_tasks: list[str]
    task_id: list[str]
    attempt: list[int]
    elapsed: list[float]
    is_straggler: list[bool]
    raw_latency: list[float | None]
    adjusted_latency: list[float | None]
    propensity: list[float | None]
    weight: list[float | None]
    straggle_probability: list[float | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class RelaunchCommand(_EventBase):
    """An order to mitigate one task; build ``command_id`` with `command_id`."""

    EVENT_TYPE: ClassVar[str] = "relaunch_command"

    type: Literal["relaunch_command"] = "relaunch_command"
    schema_version: int = 2
    command_id: str
    job_id: str
    task_id: str
    action: Action
    reason: str
    policy: str
    issued_at: float
    checkpoint_time: float
    attempt: int | None = None
    """The attempt acted on (version 2); None when read from a version-1 record."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MitigationNote(_EventBase):
    """Why the mitigator left a flagged task without a command (nothing acts on it; people read it)."""

    EVENT_TYPE: ClassVar[str] = "mitigation_note"

    type: Literal["mitigation_note"] = "mitigation_note"
    schema_version: int = SCHEMA_VERSION
    job_id: str
    task_id: str
    attempt: int
    checkpoint_time: float
    kind: HoldKind
    reason: str
    policy: str
    issued_at: float
    straggle_probability: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter(_EventBase):
    """A record that could not be processed; build it with `schemas.codec.dead_letter_for`."""

    EVENT_TYPE: ClassVar[str] = "dead_letter"

    type: Literal["dead_letter"] = "dead_letter"
    schema_version: int = 3
    raw_payload: str
    truncated: bool
    raw_size: int
    source_topic: str
    source_partition: int
    source_offset: int
    error: str
    failed_at: float
    stage: Stage | None
    """The stage that wrote the letter (version 2 and later, required); None when read from a version-1
    record."""


Event = (
    TaskCheckpoint
    | TaskBatch
    | JobEvent
    | CheckpointBoundary
    | CheckpointEvaluated
    | Prediction
    | PredictionBatch
    | RelaunchCommand
    | MitigationNote
    | DeadLetter
)

EVENT_CLASSES: dict[str, type[Event]] = {
    cls.EVENT_TYPE: cls
    for cls in (
        TaskCheckpoint,
        TaskBatch,
        JobEvent,
        CheckpointBoundary,
        CheckpointEvaluated,
        Prediction,
        PredictionBatch,
        RelaunchCommand,
        MitigationNote,
        DeadLetter,
    )
}
"""Event class by ``type`` discriminator."""


def _register(cls: type[_EventBase]) -> None:
    """Fill the per-class field tables ``to_dict``/``from_dict`` walk (computed once, not per call)."""
    table = fields(cls)  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    cls._FIELDS = tuple(f.name for f in table)
    # Fields with a None default are the schema's optional ones; required-but-nullable have no default.
    cls._OMIT_IF_NONE = frozenset(f.name for f in table if f.default is None)
    cls._INT_FIELDS = tuple(f.name for f in table if hints[f.name] in (int, int | None))


for _cls in EVENT_CLASSES.values():
    _register(_cls)


def nan_to_none(value: float) -> float | None:
    """A number for the wire: JSON has no NaN, so a number a method does not produce is written null."""
    return None if value != value else float(value)


def none_to_nan(value: float | None) -> float:
    """A number read from the wire: null (absent) becomes NaN, so arrays of it stay float64."""
    return math.nan if value is None else float(value)


def command_id(job_id: str, task_id: str, action: str, decision_key: str | int | float) -> str:
    """Deterministic id of a mitigation decision, so consumers can apply a command exactly once.

    The id is the first 32 hex digits (128 bits) of the SHA-256 of the four fields, each written as
    ``<length>:<text>`` so no choice of ids can make two different tuples collide by concatenation.
    ``decision_key`` names the decision within the task, e.g. the checkpoint index; numbers are
    written canonically (an integral float equals the int, other floats use ``repr``), so ``3`` and
    ``3.0`` give the same id.
    """
    if isinstance(decision_key, bool):
        raise TypeError("decision_key must be a str, int or float, not bool")
    if isinstance(decision_key, float) and decision_key.is_integer():
        decision_key = int(decision_key)
    key_text = decision_key if isinstance(decision_key, str) else repr(decision_key)
    digest = hashlib.sha256()
    for part in (job_id, task_id, action, key_text):
        encoded = part.encode("utf-8", "surrogatepass")
        digest.update(f"{len(encoded)}:".encode())
        digest.update(encoded)
    return digest.hexdigest()[:32]
