"""The supervisor's decisions, on real spawned children whose body fails as a consumer's would.

The consumer itself is replaced by a small body (`supervise`'s ``target``): these tests are about
which failures the supervisor replaces, not about Kafka; the broker-backed restarts are in
tests/test_mitigation.py and the `broker-restart` fault scenario.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import asdict
from multiprocessing.sharedctypes import Synchronized
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers.mitigation import MitigationStats
from consumers.watchdog import failure_kind, supervise

TIMED_OUT = KafkaException(KafkaError(KafkaError._TIMED_OUT, "retry call to resume", retriable=True))
FENCED = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (TIMED_OUT, "transient"),
        (KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True, retriable=True)), "error"),
        (FENCED, "error"),
        (KafkaException(KafkaError(KafkaError._INVALID_ARG, "bad")), "error"),
        (KafkaException("cannot describe input topic 'x'"), "error"),
        (ValueError("bad option"), "error"),
    ],
    ids=["retriable", "retriable but fatal", "fatal", "neither", "no KafkaError", "not Kafka"],
)
def test_only_a_retriable_non_fatal_kafka_error_is_transient(exc: BaseException, kind: str) -> None:
    assert failure_kind(exc) == kind


def _failing_then_done(
    options: dict[str, Any],
    beat: Synchronized,
    results: multiprocessing.Queue,
    idle_timeout: float | None,
    parent: int,
    restarts: int = 0,
    verbose: bool = False,
) -> None:
    """A child that fails as ``options["fail_with"]`` says for its first ``options["failures"]``
    runs, then reports one command: what `_child` puts on ``results`` in each case."""
    if restarts < options["failures"]:
        exc = {"timed out": TIMED_OUT, "fenced": FENCED}[options["fail_with"]]
        results.put((failure_kind(exc), f"KafkaException: {exc}"))
        raise SystemExit(1)
    results.put(("stats", asdict(MitigationStats(commands=1))))


@pytest.mark.slow  # spawns up to three interpreters
def test_a_child_failing_with_a_transient_kafka_error_is_replaced() -> None:
    run = supervise({"failures": 2, "fail_with": "timed out"}, target=_failing_then_done)
    assert (run.restarts, run.exit_code, run.stats.commands) == (2, 0, 1)


@pytest.mark.slow
def test_a_child_failing_with_a_fatal_kafka_error_is_not_replaced() -> None:
    run = supervise({"failures": 1, "fail_with": "fenced"}, target=_failing_then_done)
    assert (run.restarts, run.exit_code, run.stats.commands) == (0, 1, 0)


@pytest.mark.slow
def test_transient_failures_stop_after_max_restarts() -> None:
    run = supervise({"failures": 5, "fail_with": "timed out"}, max_restarts=1, target=_failing_then_done)
    assert (run.restarts, run.exit_code, run.stats.commands) == (1, 1, 0)
