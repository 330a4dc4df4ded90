"""Which tests need a Kafka broker: those marked ``broker``. Every test that uses the broker fixture
(`conftest.kafka_bootstrap`, directly or through another fixture) must carry the mark, so that
``pytest -m "not broker"`` runs without a broker and ``pytest -m broker`` runs every test that needs one.
Tests that start a broker of their own (a secured one, one they restart) are marked by hand."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

BROKER_FIXTURE = "kafka_bootstrap"
BROKER_MARK = "broker"


def unmarked_broker_tests(items: Sequence[pytest.Item]) -> list[str]:
    """The ids of the tests that use the broker fixture without the ``broker`` mark."""
    return [
        item.nodeid
        for item in items
        if BROKER_FIXTURE in getattr(item, "fixturenames", ())
        and item.get_closest_marker(BROKER_MARK) is None
    ]


def check_broker_marks(items: Sequence[pytest.Item]) -> None:
    """Fail the collection if a test uses the broker fixture without the ``broker`` mark."""
    unmarked = unmarked_broker_tests(items)
    if unmarked:
        raise pytest.UsageError(
            f"{len(unmarked)} test(s) use the {BROKER_FIXTURE} fixture without the {BROKER_MARK!r} mark "
            f"(add `pytestmark = pytest.mark.{BROKER_MARK}` to the module, or mark the test): "
            + ", ".join(unmarked)
        )
