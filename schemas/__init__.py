"""Versioned event contracts: JSON Schemas, the dataclasses that mirror them, and the codec.

Producers publish only what `encode` accepts and consumers read only what `decode` accepts; see
``schemas/README.md`` for the event types and the versioning policy.
"""

from schemas.batches import (
    decode_each,
    expand_predictions,
    observations,
    prediction_batches,
    task_batches,
    unbatched,
)
from schemas.codec import (
    DEAD_LETTER_MAX_ERROR_CHARS,
    DEAD_LETTER_MAX_RAW_BYTES,
    KNOWN_VERSIONS,
    MAX_PAYLOAD_BYTES,
    SchemaError,
    dead_letter_for,
    decode,
    decode_object,
    encode,
    schema_document,
    validate,
)
from schemas.events import (
    EVENT_CLASSES,
    SCHEMA_VERSION,
    CheckpointBoundary,
    CheckpointEvaluated,
    DeadLetter,
    Event,
    JobEvent,
    Prediction,
    PredictionBatch,
    RelaunchCommand,
    Stage,
    TaskBatch,
    TaskCheckpoint,
    command_id,
    none_if_nan,
)

__all__ = [
    "DEAD_LETTER_MAX_ERROR_CHARS",
    "DEAD_LETTER_MAX_RAW_BYTES",
    "EVENT_CLASSES",
    "KNOWN_VERSIONS",
    "MAX_PAYLOAD_BYTES",
    "SCHEMA_VERSION",
    "CheckpointBoundary",
    "CheckpointEvaluated",
    "DeadLetter",
    "Event",
    "JobEvent",
    "Prediction",
    "PredictionBatch",
    "RelaunchCommand",
    "SchemaError",
    "Stage",
    "TaskBatch",
    "TaskCheckpoint",
    "command_id",
    "dead_letter_for",
    "decode",
    "decode_each",
    "decode_object",
    "encode",
    "expand_predictions",
    "none_if_nan",
    "observations",
    "prediction_batches",
    "schema_document",
    "task_batches",
    "unbatched",
    "validate",
]
