"""A Faust worker that moves the worker's records and does nothing else: what Faust alone costs.

`bench/throughput.py` runs it after the real worker, on the same input, with the real worker's App
configuration (`pipeline.faust_app.faust_app`: acknowledgements from every replica, 1 s commits, memory
tables with changelogs). Per input record it decodes the JSON (as the raw consumer does); per
checkpoint boundary it writes what the real worker wrote per boundary in that run (prediction records
and table rows, same counts and mean sizes, `OutputShape`), and every `COMMIT_SECONDS` it waits for
the broker to acknowledge everything sent, as the worker's group commit does. No state, no
validation, no model: its rate is a ceiling for any worker on Faust with this output, on this machine.

    .venv/bin/python bench/faust_floor.py --bootstrap B --topic-prefix P --shape JSON [--datadir D]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file, not as a module of the package
    sys.path.insert(0, str(REPO))

import faust  # noqa: E402
import orjson  # noqa: E402

from pipeline.cli import quiet_worker  # noqa: E402
from pipeline.faust_app import TABLES, faust_app  # noqa: E402
from pipeline.faust_patches import acknowledged  # noqa: E402
from pipeline.group_commit import COMMIT_SECONDS  # noqa: E402
from pipeline.settings import WorkerSettings  # noqa: E402
from straggler.kafka.names import TopicNames  # noqa: E402

APP_ID = "straggler-faust-floor"
"""Its own consumer group and changelog topics, beside the real worker's."""


@dataclass(frozen=True)
class OutputShape:
    """What the real worker wrote per checkpoint boundary: records and their mean size, per output."""

    predictions: tuple[float, int]
    """Prediction records per boundary, mean bytes."""
    rows: dict[str, tuple[float, int]]
    """Per table (`pipeline.faust_app.TABLES`): changelog rows per boundary, mean bytes."""

    def to_json(self) -> str:
        return json.dumps({"predictions": self.predictions, "rows": self.rows})

    @classmethod
    def from_json(cls, text: str) -> OutputShape:
        obj = json.loads(text)
        rows = {name: (float(n), int(size)) for name, (n, size) in obj["rows"].items()}
        return cls((float(obj["predictions"][0]), int(obj["predictions"][1])), rows)


class Due:
    """Whole records due so far at a fractional rate per boundary (so the totals match the run's)."""

    def __init__(self, per_boundary: float) -> None:
        self.per_boundary = per_boundary
        self.owed = 0.0

    def take(self) -> int:
        self.owed += self.per_boundary
        whole = int(self.owed)
        self.owed -= whole
        return whole


def floor_settings(bootstrap: str, prefix: str, datadir: str | None) -> WorkerSettings:
    settings = WorkerSettings(bootstrap=bootstrap, topics=TopicNames(prefix), datadir=datadir)
    return replace(settings, app_id=APP_ID)


def create_floor_app(settings: WorkerSettings, shape: OutputShape) -> faust.App:
    """The real worker's App configuration with an agent that only decodes and writes ``shape``."""
    app = faust_app(settings)
    names = settings.topics
    inputs = app.topic(names.checkpoints, names.job_events, key_type=bytes, value_type=bytes)
    predictions = app.topic(names.predictions, key_type=bytes, value_type=bytes)
    tables = {
        name: app.Table(name, partitions=settings.partitions, key_type=bytes, value_type=bytes)
        for name in TABLES
    }
    prediction_value = b"x" * shape.predictions[1]
    predictions_due = Due(shape.predictions[0])
    rows = [(tables[name], Due(n), b"x" * size) for name, (n, size) in shape.rows.items()]
    last_commit = time.monotonic()

    @app.agent(inputs)
    async def floor_agent(stream: faust.StreamT[bytes]) -> None:
        nonlocal last_commit
        async for event in cast(faust.Stream[bytes], stream).events():
            record: Any = orjson.loads(event.message.value or b"null")
            if not isinstance(record, dict) or record.get("type") != "checkpoint_boundary":
                continue
            key = event.message.key or b""
            for _ in range(predictions_due.take()):
                await predictions.send(key=key, value=prediction_value)
            for table, due, value in rows:
                for i in range(due.take()):
                    table[key + b"/%d" % i] = value
            if time.monotonic() - last_commit >= COMMIT_SECONDS:
                last_commit = time.monotonic()
                await acknowledged(app.producer)

    return app


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic-prefix", default="")
    parser.add_argument("--datadir", default=None)
    parser.add_argument("--shape", required=True, help="`OutputShape.to_json` of the real worker's run")
    args = parser.parse_args()
    settings = floor_settings(args.bootstrap, args.topic_prefix, args.datadir)
    app = create_floor_app(settings, OutputShape.from_json(args.shape))
    quiet_worker(app, "warning").execute_from_commandline()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
