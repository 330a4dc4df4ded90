"""Shared fixtures: one real Kafka broker for the whole test run, and unique names per test; the
check that every test using that broker is marked ``broker`` (`broker_marks`), the skip of `torch`
tests without PyTorch, and a closing count of skipped tests by reason.

Where the broker comes from, first that works:
1. ``$KAFKA_BOOTSTRAP_SERVERS`` (an existing broker, e.g. in CI or a developer's cluster);
2. a testcontainers Kafka container (KRaft) when a Docker engine answers;
3. the embedded broker (``straggler.kafka.embedded``): Apache Kafka's own jars on a local JVM.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Generator, Iterator

import pytest
from broker_marks import check_broker_marks

from straggler.kafka.embedded import embedded_kafka

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
# testcontainers-python's KafkaContainer drives Confluent's image scripts (it cannot start the
# apache/kafka image); Confluent Platform 7.9 ships Apache Kafka 3.9, the version embedded here.
CONTAINER_IMAGE = "confluentinc/cp-kafka:7.9.0"


NO_TORCH = "PyTorch not installed (the start extra): pip install -e '.[start]', then pytest -m torch"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: an unmarked broker test fails either half
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the collection of a test that uses the broker without the ``broker`` mark; skip tests
    marked ``torch`` when PyTorch is missing (one reason, one place to change it)."""
    check_broker_marks(items)
    if importlib.util.find_spec("torch") is not None:
        return
    skip = pytest.mark.skip(reason=NO_TORCH)
    for item in items:
        if item.get_closest_marker("torch") is not None:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Generator[None, None, None]:
    """Close every run with how many tests were skipped, grouped by reason, so a skip CI did not
    mean to make is seen (``-ra`` lists them by test location). The outermost wrapper: it prints
    after ``-ra``'s short summary, just before the final counts."""
    result = yield
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.section(f"{sum(reasons.values())} skipped, by reason", sep="-")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count:5d}  {reason}")
    return result


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, no engine: all mean "use another broker"
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The bootstrap address of the session's broker (under pytest-xdist each worker is a session, so
    each starts its own embedded broker: free ports, its own temporary data directory)."""
    from_env = os.environ.get(BOOTSTRAP_ENV)
    if from_env:
        yield from_env
        return
    if _docker_answers():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from testcontainers.kafka import KafkaContainer

        with KafkaContainer(CONTAINER_IMAGE).with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    with embedded_kafka() as bootstrap:
        yield bootstrap


@pytest.fixture
def fresh_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Makes names (topics, groups, prefixes) no other test or earlier session used on the broker."""
    token = uuid.uuid4().hex[:8]
    test = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:40].strip("-")

    def make(stem: str) -> str:
        return f"{stem}-{test}-{token}"

    return make


@pytest.fixture
def fresh_topic_prefix(fresh_name: Callable[[str], str]) -> str:
    """A topic-name prefix unique to this test, ending in a dot (``t-<test>-<token>.``)."""
    return fresh_name("t") + "."
