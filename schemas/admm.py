"""The ADMM exchange record: one node's consensus-round message, as `straggler.kafka.admm_exchange` sends it.

Not a JSON event: the value is the message vector as raw little-endian float64 (exactly ``dim * 8``
bytes), and the headers carry the schema name, its version, the run id, the node id and the round.
A reader skips records of another schema and refuses another version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

EXCHANGE_SCHEMA = "straggler.admm-exchange"
EXCHANGE_VERSION = 1
WIRE_DTYPE = np.dtype("<f8")

Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True)
class ExchangeRecord:
    run: str
    node: int
    round: int
    vector: NDArray[np.float64]


def encode_exchange(vector: NDArray[np.float64], run: str, node: int, round_: int) -> tuple[bytes, Headers]:
    """The record's value and headers for ``vector``, node ``node``'s message of round ``round_``."""
    headers: Headers = [
        ("schema", EXCHANGE_SCHEMA.encode()),
        ("version", str(EXCHANGE_VERSION).encode()),
        ("run", run.encode()),
        ("node", str(node).encode()),
        ("round", str(round_).encode()),
    ]
    return np.asarray(vector, dtype=WIRE_DTYPE).tobytes(), headers


def decode_exchange(
    headers: Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None],
    value: bytes | str,
) -> ExchangeRecord | None:
    """The record's vector and coordinates; None for a record of another schema."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    text = {k: v.decode() if isinstance(v, bytes) else v for k, v in pairs if v is not None}
    if text.get("schema") != EXCHANGE_SCHEMA:
        return None
    if int(text["version"]) != EXCHANGE_VERSION:
        raise ValueError(
            f"exchange record of version {text['version']!r}; this node speaks {EXCHANGE_VERSION}"
        )
    if isinstance(value, str):
        raise TypeError("exchange record values are bytes")
    return ExchangeRecord(
        run=text["run"],
        node=int(text["node"]),
        round=int(text["round"]),
        vector=np.frombuffer(value, dtype=WIRE_DTYPE).astype(np.float64),
    )
