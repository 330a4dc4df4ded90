"""What the worker says and measures about live jobs, without a broker: a log line per flag, readable
UTC times, and the decision latency of a live job's timer tick (from its newest report)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import pytest
from test_abandonment import T0, live_started, report
from test_agent_handler import Worker, evaluations

from pipeline.cli import COORDINATOR_LOGGER, ExpectedAtStart
from schemas import CheckpointBoundary, decode
from straggler.argtypes import readable_time
from straggler.core.decision_event import describe_flag
from straggler.core.online import Decision
from straggler.kafka.names import ready_line


class Recorded:
    """The `pipeline.handler.AgentMetrics` calls the handler makes."""

    def __init__(self) -> None:
        self.decided_from: list[float | None] = []

    def dead_lettered(self, error: str | BaseException) -> None:
        pass

    def evaluated(
        self, decisions: Sequence[Decision], refit: float | None, decided_from: float | None, sent_at: float
    ) -> None:
        self.decided_from.append(decided_from)


def test_times_read_as_utc_for_unix_times_and_as_trace_seconds_otherwise() -> None:
    assert readable_time(1795850000.25) == "2026-11-28 07:13:20.2 UTC"
    assert readable_time(600.0) == "trace 600 s"
    assert readable_time(math.nan) == "trace nan s"


def test_a_flag_is_described_with_its_probability_and_rule() -> None:
    d = Decision(
        "j", "t7", 100.0, 80.0, 90.0, 412.0, 0.1, 0.5, 300.0, True, 1, attempt=0, straggle_probability=0.93
    )
    assert describe_flag(d, "nurd") == (
        "task t7 attempt 0 flagged by nurd: p = 0.93, predicted 412 s (threshold 300 s, elapsed 80 s)"
    )
    assert "p = n/a" in describe_flag(Decision("j", "t", 1, 1, 1, math.nan, 1, 1, 1, True, 0), "reactive")


def test_a_live_jobs_tick_measures_its_decision_from_the_newest_report_and_logs_each_flag(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = Worker()
    recorded = Recorded()
    worker.handler.metrics = recorded
    caplog.set_level(logging.INFO, logger="pipeline.handler")
    reports = [report(f"f{i}", T0 + 2.0 + i, latency=2.0 + i) for i in range(4)]
    for event in [live_started(), *reports, report("r", T0 + 30.0)]:
        worker.event(event)
    worker.now = 31.5  # the test worker's wall clock: 1.7e9 + now
    (tick,) = worker.handler.live_ticks()
    timer = decode(tick.value)
    assert isinstance(timer, CheckpointBoundary)

    ((_, marker),) = evaluations(worker.event(timer))

    assert marker.boundary_produced_at is None
    assert recorded.decided_from == [T0 + 30.0], "latency = sent - the newest report"
    flags = [r.getMessage() for r in caplog.records if "flagged by nurd" in r.getMessage()]
    assert flags and all("job live at 2023-11-14 22:13:51.5 UTC: task r" in f for f in flags), flags
    assert "job live started: 10 tasks, live, at 2023-11-14 22:13:20.0 UTC" in caplog.text


def _coordinator_error(name: str = "GroupCoordinatorNotAvailableError") -> logging.LogRecord:
    error = type(name, (Exception,), {})("[Error 15]")
    return logging.LogRecord(
        COORDINATOR_LOGGER, logging.ERROR, "x.py", 1, ExpectedAtStart.MESSAGE, (error,), None
    )


def test_the_coordinator_not_available_at_a_first_start_is_no_error_but_later_it_is() -> None:
    now = [0.0]
    quiet = ExpectedAtStart(grace=60.0, clock=lambda: now[0])
    logging.getLogger(COORDINATOR_LOGGER).setLevel(logging.INFO)
    record = _coordinator_error()
    assert not quiet.filter(record) and record.levelname == "DEBUG"  # dropped: not a debug run
    other = _coordinator_error("NotCoordinatorForGroupError")
    assert quiet.filter(other) and other.levelno == logging.ERROR
    now[0] = 61.0
    late = _coordinator_error()
    assert quiet.filter(late) and late.levelno == logging.ERROR, "the coordinator never came: an error"


def test_a_ready_line_names_the_broker_and_the_topics() -> None:
    line = ready_line("worker", "b:9092", ["task-checkpoints", "job-events"], ["straggler-predictions"], 8)
    assert line == (
        "worker ready: broker b:9092, reading task-checkpoints, job-events (8 partitions here), "
        "writing straggler-predictions"
    )
