"""The testcontainers broker of tests/conftest.py runs with the one-node settings of the embedded
broker and compose's broker (checked on the container it builds, without a Docker engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import CONTAINER_IMAGE, kafka_container

from straggler.kafka.embedded import EmbeddedKafka

ROOT = Path(__file__).resolve().parents[1]
ONE_NODE = {
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "auto.create.topics.enable": "false",
}
"""Without the first two, a one-node broker cannot create ``__transaction_state`` (replication
factor 3) and the exactly-once mitigation tests hang; with auto-creation on,
test_missing_topic_has_no_partition_count fails (the lookup creates the topic)."""


def _env_name(key: str) -> str:
    return "KAFKA_" + key.upper().replace(".", "_")


@pytest.mark.usefixtures("without_docker_engine")
def test_the_testcontainers_broker_runs_the_one_node_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)  # the local engine
    container = kafka_container()
    assert container.image == CONTAINER_IMAGE
    for key, value in ONE_NODE.items():
        assert container.env.get(_env_name(key)) == value, f"the container does not set {key}={value}"
    # published on the loopback interface only, and advertised there
    assert container.ports[str(container.port)] == ("127.0.0.1",)
    assert container.get_container_host_ip() == "127.0.0.1"


def test_the_embedded_and_compose_brokers_run_the_same_settings(tmp_path: Path) -> None:
    broker = EmbeddedKafka(data_dir=tmp_path)
    broker._write_configs(9092, 9093)
    lines = (tmp_path / "server.properties").read_text().splitlines()
    properties = dict(line.split("=", 1) for line in lines if "=" in line)
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["kafka"]["environment"]
    for key, value in ONE_NODE.items():
        assert properties[key] == value
        assert str(compose[_env_name(key)]).lower() == value
