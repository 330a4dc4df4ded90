"""The worker's Faust Worker leaves the root logger at the level asked for (no broker needed)."""

from __future__ import annotations

import logging

import faust
import pytest
from faust.worker import Worker

from pipeline.cli import quiet_worker


@pytest.fixture
def app() -> faust.App:
    return faust.App(
        "test-worker-logging", broker="kafka://127.0.0.1:9", store="memory://", web_enabled=False
    )


def _root_like() -> logging.Logger:
    """A logger standing in for the root one, with a handler as `mode` gives the root."""
    logger = logging.getLogger("test-worker-logging-root")
    logger.handlers[:] = [logging.NullHandler()]
    logger.setLevel(logging.WARNING)
    return logger


def test_quiet_worker_keeps_debug_records_off(app: faust.App) -> None:
    logger = _root_like()
    quiet_worker(app, "warning").on_setup_root_logger(logger, logging.WARNING)
    assert not logger.isEnabledFor(logging.DEBUG)
    assert len(logger.handlers) == 1


def test_faust_spinner_would_turn_debug_records_on(app: faust.App) -> None:
    """What `quiet_worker` prevents: Faust's own Worker lowers the root logger to DEBUG."""
    logger = _root_like()
    Worker(app, loglevel="warning", quiet=True).on_setup_root_logger(logger, logging.WARNING)
    assert logger.isEnabledFor(logging.DEBUG)
