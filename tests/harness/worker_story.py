"""What a worker's log and the dead-letter topic say about records that went missing, for the message
of a failed count (`worker_story`): its rebalances, recoveries, warnings and errors, and each dead
letter's reason. Read only when the count fails: call it in the assertion's message."""

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


def worker_story(bootstrap: str, dead_letter_topic: str, log: Path, lines: int = 60) -> str:
    """Every dead letter (source topic, offset, reason), then the last ``lines`` lines of the worker's
    log that explain missing or repeated records."""
    letters = [
        (e.source_topic, e.source_offset, e.error)
        for v in read_topic(bootstrap, dead_letter_topic)
        for e in decode_each(v)
        if isinstance(e, DeadLetter)
    ]
    kept = [
        line for line in log.read_text(errors="replace").splitlines() if any(k in line.lower() for k in KEEP)
    ]
    return f"dead letters: {letters}\nworker log:\n" + "\n".join(kept[-lines:])
