"""What a worker's log and the dead-letter topic say about records that went missing, for the message
of a failed count: its rebalances, recoveries, warnings and errors, and each dead letter's reason."""

from __future__ import annotations

from pathlib import Path

from schemas import DeadLetter, decode_each
from straggler.replay import read_topic

KEEP = (
    "rebalanc",
    "recover",
    "assign",
    "revok",
    "generation",
    "dead",
    "warning",
    "error",
    "started:",
    "ended at",
)
"""Lowercase words of the lines kept (the worker logs Faust at ``--loglevel info`` for them)."""


def worker_story(log: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of the worker's log that explain missing or repeated records."""
    kept = [
        line for line in log.read_text(errors="replace").splitlines() if any(k in line.lower() for k in KEEP)
    ]
    return "worker log:\n" + "\n".join(kept[-lines:])


def dead_letters(bootstrap: str, topic: str) -> list[tuple[str, int, str]]:
    """(source topic, source offset, reason) of every dead letter on ``topic``."""
    return [
        (e.source_topic, e.source_offset, e.error)
        for v in read_topic(bootstrap, topic)
        for e in decode_each(v)
        if isinstance(e, DeadLetter)
    ]
