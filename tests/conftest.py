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
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING

import pytest
from broker_marks import check_broker_marks

from straggler.kafka.embedded import embedded_kafka
from straggler.kafka.security import CONFIG_FILE_ENV, SETTING_NAMES

if TYPE_CHECKING:
    from testcontainers.community.kafka import KafkaContainer

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
# testcontainers-python's KafkaContainer drives Confluent's image scripts (it cannot start the
# apache/kafka image); Confluent Platform 7.9 ships Apache Kafka 3.9, the version embedded here.
CONTAINER_IMAGE = "confluentinc/cp-kafka:7.9.0"
ONE_NODE_BROKER_ENV = {
    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
    "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
    "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
}
"""What the embedded broker and compose's broker also run with, and KafkaContainer sets none of
(Confluent's image renders only what the environment says): without the first two the broker asks
for ``__transaction_state`` with replication factor 3 and the exactly-once mitigation hangs; with
auto-creation on, a missing topic is created by the first request that names it."""


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


def _engine_is_local() -> bool:
    """The Docker engine is this machine's (its Unix socket), so a port it publishes on 127.0.0.1 is
    this machine's loopback interface."""
    host = os.environ.get("DOCKER_HOST", "")
    return host == "" or host.startswith("unix://")


def kafka_container() -> KafkaContainer:
    """The testcontainers broker (KRaft), not started, with the one-node settings above. On a local
    engine its client port is published on 127.0.0.1 only and advertised there (testcontainers would
    pick the bridge's gateway where it believes it runs inside a container, e.g. a ``/.dockerenv``
    exists; docker-py takes ``(host_ip,)`` for "any free port there", testcontainers' typing only
    port numbers)."""
    from testcontainers.community.kafka import KafkaContainer

    class LoopbackKafkaContainer(KafkaContainer):
        def get_container_host_ip(self) -> str:
            return "127.0.0.1"

    local = _engine_is_local()
    container = (LoopbackKafkaContainer if local else KafkaContainer)(CONTAINER_IMAGE).with_kraft()
    for name, value in ONE_NODE_BROKER_ENV.items():
        container.with_env(name, value)
    if local:
        container.ports[str(container.port)] = ("127.0.0.1",)  # type: ignore[assignment]
    return container


@pytest.fixture
def without_docker_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lets a test build (not start) a testcontainers container where no Docker engine answers: its
    client is replaced by nothing (testcontainers' own asks the engine for its API version)."""
    from testcontainers.core import container

    monkeypatch.setattr(container, "DockerClient", lambda **kwargs: None)


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
        with kafka_container() as container:  # stopped and removed on leaving
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


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No security setting in this process's environment."""
    for name in (*SETTING_NAMES, CONFIG_FILE_ENV):
        # setenv first, so teardown restores the variable's absence too: `apply_kafka_config` writes
        # os.environ itself, and a setting left behind would turn the later tests' clients to TLS
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch
