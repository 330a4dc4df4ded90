"""`broker_marks`: a test that uses the broker fixture without the ``broker`` mark fails the collection,
in either half of the suite; marked tests, and tests that need no broker, collect."""

from __future__ import annotations

import pytest

CONFTEST = """
import pytest
from broker_marks import check_broker_marks


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    check_broker_marks(items)


@pytest.fixture(scope="session")
def kafka_bootstrap():
    yield "127.0.0.1:9"  # never contacted: these tests are only collected


@pytest.fixture
def topic(kafka_bootstrap):
    return kafka_bootstrap + "/t"
"""


@pytest.mark.parametrize("half", ["broker", "not broker"])
def test_an_unmarked_test_using_the_broker_fails_the_collection(pytester: pytest.Pytester, half: str) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_x="""
        import pytest

        @pytest.mark.broker
        def test_marked(kafka_bootstrap): pass

        def test_pure(): pass

        def test_through_another_fixture(topic): pass
        """
    )
    result = pytester.runpytest("--collect-only", "-q", "-m", half)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*1 test(s) use the kafka_bootstrap fixture without the 'broker' mark*"])
    assert "test_through_another_fixture" in result.stderr.str()
    assert "test_marked" not in result.stderr.str()


def test_marked_broker_tests_and_pure_tests_collect_into_their_halves(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_x="""
        import pytest

        pytestmark = pytest.mark.broker

        def test_module_marked(topic): pass
        """,
        test_y="""
        def test_pure(): pass
        """,
    )
    broker = pytester.runpytest("--collect-only", "-q", "-m", "broker")
    assert broker.ret == pytest.ExitCode.OK
    broker.stdout.fnmatch_lines(["test_x.py::test_module_marked", "1/2 tests collected (1 deselected)*"])
    pure = pytester.runpytest("--collect-only", "-q", "-m", "not broker")
    assert pure.ret == pytest.ExitCode.OK
    pure.stdout.fnmatch_lines(["test_y.py::test_pure", "1/2 tests collected (1 deselected)*"])
