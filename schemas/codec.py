"""Bytes on a topic <-> validated events: the only place the pipeline parses or writes an event.

Every producer calls `encode` and every consumer calls `decode`, so nothing reaches a topic, or leaves
one, without passing the JSON Schema of its ``type`` and ``schema_version``. Anything `decode` rejects
raises `SchemaError`, whose message names the field and the broken rule; consumers send the record
to the dead-letter topic with `dead_letter_for` and move on.

The schemas are compiled once, at import, by fastjsonschema into plain Python functions: decoding is
one orjson parse, one compiled check and one dataclass construction, with no copies.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import fastjsonschema
import orjson

from schemas.events import EVENT_CLASSES, DeadLetter, Event, Stage
from schemas.ranges import out_of_range

MAX_PAYLOAD_BYTES = 64 * 1024
"""Largest encoded event, in bytes; larger payloads are rejected before they are parsed."""

DEAD_LETTER_MAX_RAW_BYTES = 8 * 1024
"""How much of a rejected record a dead letter keeps. Even if every byte is escaped (6 bytes for a
control character in JSON), the dead letter stays under `MAX_PAYLOAD_BYTES`."""

DEAD_LETTER_MAX_ERROR_CHARS = 1024
"""Longest error text a dead letter keeps (the schema's ``maxLength``)."""

_SCHEMA_SUFFIX = ".schema.json"
_JSON_TYPE_NAMES = {
    dict: "object",
    list: "array",
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}
_NO_VALUE: Any = object()
"""Marks a `SchemaError` that has no offending value to show (a missing field, a bad payload)."""


class SchemaError(ValueError):
    """An event broke its contract. ``field`` is a dotted path (``task_checkpoint.latency``, or
    ``payload``/``event`` for problems before a type is known); ``rule`` names the broken rule."""

    def __init__(self, field: str, rule: str, reason: str, value: Any = _NO_VALUE) -> None:
        message = f"{field}: {reason} ({rule})"
        if value is not _NO_VALUE:
            message += f"; got {_short_repr(value)}"
        super().__init__(message)
        self.field = field
        self.rule = rule
        self.reason = reason
        self.value = value

    def moved(self, old_prefix: str, new_prefix: str) -> SchemaError:
        """The same error for a field found under ``new_prefix`` (an observation inside a batch)."""
        field = self.field
        if field == old_prefix or field.startswith(old_prefix + "."):
            field = new_prefix + field[len(old_prefix) :]
        return SchemaError(field, self.rule, self.reason, self.value)


Validator = Callable[..., Any]


def _load_documents() -> dict[str, dict[int, dict[str, Any]]]:
    """Read every ``<type>.v<version>.schema.json`` shipped in this package."""
    documents: dict[str, dict[int, dict[str, Any]]] = {}
    for entry in resources.files(__package__ or "schemas").iterdir():
        if not entry.name.endswith(_SCHEMA_SUFFIX):
            continue
        document = orjson.loads(entry.read_bytes())
        event_type = document["properties"]["type"]["const"]
        version = document["properties"]["schema_version"]["const"]
        if entry.name != f"{event_type}.v{version}{_SCHEMA_SUFFIX}":
            raise RuntimeError(f"schema file {entry.name} declares {event_type} version {version}")
        documents.setdefault(event_type, {})[version] = document
    return documents


_DOCUMENTS = _load_documents()
_VALIDATORS: dict[str, dict[int, Validator]] = {
    event_type: {
        version: fastjsonschema.compile(document, use_default=False, use_formats=False)
        for version, document in by_version.items()
    }
    for event_type, by_version in _DOCUMENTS.items()
}

KNOWN_VERSIONS: Mapping[str, tuple[int, ...]] = {
    event_type: tuple(sorted(by_version)) for event_type, by_version in _DOCUMENTS.items()
}
"""Schema versions this code can read, by event type."""

if set(_VALIDATORS) != set(EVENT_CLASSES):
    raise RuntimeError(f"schema files {sorted(_VALIDATORS)} != event classes {sorted(EVENT_CLASSES)}")


def schema_document(event_type: str, version: int) -> dict[str, Any]:
    """The JSON Schema of one event type and version, as shipped (for tools and tests)."""
    return orjson.loads(orjson.dumps(_DOCUMENTS[event_type][version]))  # a copy callers may mutate


def validate(obj: Any) -> None:
    """Check ``obj`` against the schema its ``type`` and ``schema_version`` select.

    Raises `SchemaError` for anything but an object, an unknown type or version, and every rule of
    the schema; also for NaN and infinities, which JSON cannot carry (orjson would write them as null),
    and for values outside their physical range (`schemas.ranges`).
    """
    event_type = _check_schema(obj)
    bad_path = _non_finite_path(obj, event_type)
    if bad_path is not None:
        raise SchemaError(bad_path[0], "finite", "must be a finite number", bad_path[1])
    _check_ranges(event_type, obj)


def encode(event: Event) -> bytes:
    """Validate ``event`` and serialise it, so a producer can never publish what consumers reject."""
    if event.type != event.EVENT_TYPE:
        raise SchemaError(f"{event.EVENT_TYPE}.type", "const", f"must be '{event.EVENT_TYPE}'", event.type)
    obj = event.to_dict()
    validate(obj)
    return written(event.EVENT_TYPE, obj)


def written(event_type: str, obj: Mapping[str, Any]) -> bytes:
    """``obj`` as JSON, unchecked but for the size limit (`SchemaError` ``maxSize``): the writing half
    of `encode`, for output the agent builds itself on its hot path and tests validate instead.
    orjson writes NaN (a number a method does not produce) as null."""
    try:
        payload = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise SchemaError(event_type, "json", f"cannot be written as JSON: {exc}") from None
    return within_limit(event_type, payload)


def within_limit(event_type: str, payload: bytes) -> bytes:
    """``payload``, an encoded ``event_type``, if it is within `MAX_PAYLOAD_BYTES`; else `SchemaError`
    ``maxSize``."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        reason = f"encodes to {len(payload)} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit"
        raise SchemaError(event_type, "maxSize", reason)
    return payload


def decode(payload: bytes | bytearray | memoryview | str | None) -> Event:
    """Parse and validate one record, returning its event; raise `SchemaError` if it breaks the contract.

    ``None`` (a Kafka record without a value) is rejected like any other bad payload.

    orjson refuses NaN, Infinity and numbers that overflow a double, so a parsed payload holds only
    finite numbers and the finite check of `validate` is not repeated here.
    """
    if payload is None:
        raise SchemaError("payload", "json", "is missing (a record without a value)")
    size = payload_size(payload)
    if size > MAX_PAYLOAD_BYTES:
        raise SchemaError("payload", "maxSize", f"is {size} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit")
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise SchemaError("payload", "json", f"is not valid JSON{_non_finite_hint(payload)}: {exc}") from None
    return decode_object(obj)


_UPGRADES: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("dead_letter", 1): lambda obj: {**obj, "stage": None},  # version 1 did not name the stage
}
"""Older versions still read, as dicts of the current dataclass's fields (by type and version)."""


def decode_object(obj: Any) -> Event:
    """Validate an already parsed JSON value and build its event (`decode` after the parse)."""
    event_type = _check_schema(obj)
    _check_ranges(event_type, obj)
    upgrade = _UPGRADES.get((event_type, int(obj["schema_version"])))
    return EVENT_CLASSES[event_type].from_dict(obj if upgrade is None else upgrade(obj))


def dead_letter_for(
    payload: bytes | bytearray | memoryview | str | None,
    topic: str | None,
    partition: int | None,
    offset: int | None,
    error: str | BaseException,
    failed_at: float | None = None,
    *,
    stage: Stage,
) -> DeadLetter:
    """The dead letter ``stage`` writes for a record it could not process. Never raises on odd input:
    it is the error path, and whatever it returns encodes.

    ``raw_payload`` keeps the first `DEAD_LETTER_MAX_RAW_BYTES` bytes decoded as UTF-8, invalid bytes
    written as ``\\xNN`` (readable for the usual JSON payload, and no byte value is lost);
    ``truncated`` says whether bytes were cut and ``raw_size`` gives the original length. Unknown
    partitions and offsets (None or negative, as Kafka's OFFSET_INVALID) become -1.
    """
    if payload is None:
        raw = b""
    elif isinstance(payload, str):
        raw = payload.encode("utf-8", "surrogatepass")
    else:
        raw = bytes(payload)
    kept = raw[:DEAD_LETTER_MAX_RAW_BYTES]
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}"
    error_text = _clean_text(error or "unspecified error")
    if len(error_text) > DEAD_LETTER_MAX_ERROR_CHARS:
        error_text = error_text[: DEAD_LETTER_MAX_ERROR_CHARS - 3] + "..."
    return DeadLetter(
        raw_payload=kept.decode("utf-8", "backslashreplace"),
        truncated=len(raw) > len(kept),
        raw_size=len(raw),
        source_topic=_clean_text(topic or "")[:249],
        source_partition=partition if partition is not None and partition >= 0 else -1,
        source_offset=offset if offset is not None and offset >= 0 else -1,
        error=error_text,
        failed_at=time.time() if failed_at is None else failed_at,
        stage=stage,
    )


def _check_schema(obj: Any) -> str:
    """Dispatch on ``type`` and ``schema_version`` and run the compiled schema; return the type."""
    if not isinstance(obj, dict):
        raise SchemaError("event", "type", f"must be a JSON object, not {_json_type(obj)}")
    event_type = obj.get("type")
    if not isinstance(event_type, str):
        if "type" not in obj:
            raise SchemaError("event.type", "required", "required field is missing")
        raise SchemaError("event.type", "type", "must be string", event_type)
    by_version = _VALIDATORS.get(event_type)
    if by_version is None:
        raise SchemaError(
            "event.type",
            "enum",
            f"unknown event type; known: {', '.join(sorted(_VALIDATORS))}",
            event_type,
        )
    if "schema_version" not in obj:
        raise SchemaError(f"{event_type}.schema_version", "required", "required field is missing")
    version = obj["schema_version"]
    integral = isinstance(version, int) or (isinstance(version, float) and version.is_integer())
    if isinstance(version, bool) or not integral:
        raise SchemaError(f"{event_type}.schema_version", "type", "must be integer", version)
    validator = by_version.get(int(version))
    if validator is None:
        known = ", ".join(str(v) for v in KNOWN_VERSIONS[event_type])
        raise SchemaError(
            f"{event_type}.schema_version",
            "version",
            f"unknown version; known versions: {known}",
            version,
        )
    try:
        validator(obj, name_prefix=event_type)
    except fastjsonschema.JsonSchemaValueException as exc:
        raise _schema_error(exc) from None
    return event_type


def _check_ranges(event_type: str, obj: Mapping[str, Any]) -> None:
    """`SchemaError` (rule ``range``) for the first value outside its physical range (`schemas.ranges`)."""
    found = out_of_range(event_type, obj)
    if found is not None:
        raise SchemaError(found[0], "range", found[1], found[2])


def _schema_error(exc: fastjsonschema.JsonSchemaValueException) -> SchemaError:
    """Turn fastjsonschema's exception into a message naming the field and the rule."""
    rule = exc.rule or "schema"
    definition = exc.definition if isinstance(exc.definition, dict) else {}
    limit = exc.rule_definition
    field = exc.name or "event"
    condition = definition.get("$comment")
    suffix = f" {condition}" if condition else ""
    if rule == "required":
        missing = sorted(set(limit) - exc.value.keys())
        return SchemaError(f"{field}.{missing[0]}", rule, f"required field is missing{suffix}")
    if rule == "additionalProperties":
        unknown = sorted(set(exc.value) - set(definition.get("properties", {})), key=str)
        return SchemaError(f"{field}.{unknown[0]}", rule, f"unknown field{suffix}")
    reasons: dict[str, Callable[[Any], str]] = {
        "type": lambda t: "must be " + (" or ".join(t) if isinstance(t, list) else str(t)),
        "minimum": lambda m: f"must be >= {m}",
        "maximum": lambda m: f"must be <= {m}",
        "exclusiveMinimum": lambda m: f"must be > {m}",
        "exclusiveMaximum": lambda m: f"must be < {m}",
        "minLength": lambda n: "must not be empty" if n == 1 else f"must have at least {n} characters",
        "maxLength": lambda n: f"must have at most {n} characters",
        "maxProperties": lambda n: f"must have at most {n} entries",
        "enum": lambda values: "must be one of " + ", ".join(repr(v) for v in values),
        "const": lambda value: f"must be {value!r}",
        "pattern": lambda pattern: f"must match {pattern}",
    }
    describe = reasons.get(rule)
    reason = describe(limit) if describe is not None else exc.message
    return SchemaError(field, rule, reason + suffix, exc.value)


def _non_finite_path(obj: Mapping[str, Any], prefix: str) -> tuple[str, float] | None:
    """Path and value of the first NaN or infinity in ``obj`` (which the schemas cannot express)."""
    for key, value in obj.items():
        found = _non_finite_in(value, f"{prefix}.{key}")
        if found is not None:
            return found
    return None


def _non_finite_in(value: Any, path: str) -> tuple[str, float] | None:
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, dict):
        return _non_finite_path(value, path)
    if isinstance(value, list):
        for index, item in enumerate(value):
            if type(item) is float:
                if item - item != 0.0:  # NaN or an infinity; cheaper than math.isfinite per item
                    return f"{path}[{index}]", item
            elif isinstance(item, dict | list | float):
                found = _non_finite_in(item, f"{path}[{index}]")
                if found is not None:
                    return found
    return None


def payload_size(payload: bytes | bytearray | memoryview | str) -> int:
    """Size in bytes, without encoding a str unless it might be over the limit."""
    if isinstance(payload, memoryview):
        return payload.nbytes
    if isinstance(payload, str) and 4 * len(payload) > MAX_PAYLOAD_BYTES:
        return len(payload.encode("utf-8", "surrogatepass"))
    return len(payload)


def _non_finite_hint(payload: bytes | bytearray | memoryview | str) -> str:
    text = payload if isinstance(payload, str) else bytes(payload).decode("utf-8", "replace")
    if "NaN" in text or "Infinity" in text:
        return " (NaN and Infinity are not JSON numbers)"
    return ""


def _clean_text(text: str) -> str:
    """``text`` with lone surrogates written as escapes, so orjson can always encode it."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "backslashreplace")


def _json_type(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
