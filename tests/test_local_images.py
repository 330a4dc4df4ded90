"""The local stand-in images (deploy/images/, scripts/build-local-images.sh), checked without a Docker
engine: the broker's KAFKA_* renderer, compose's healthcheck tool, and the start-up that
testcontainers' KafkaContainer drives in the Confluent-compatible image."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import kafka_container

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "deploy" / "images"
KAFKA_BIN = IMAGES / "kafka" / "bin"
CONFLUENT = IMAGES / "cp-kafka" / "confluent"


def _render(environment: dict[str, str], tmp_path: Path) -> dict[str, str]:
    out = tmp_path / "server.properties"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    subprocess.run([str(KAFKA_BIN / "render-properties"), str(out)], env={**clean, **environment}, check=True)
    return dict(line.split("=", 1) for line in out.read_text().splitlines())


def test_the_broker_renders_kafka_variables_as_the_official_images_do(tmp_path: Path) -> None:
    rendered = _render(
        {
            "KAFKA_LOG_DIRS": "/data",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
            "KAFKA_LISTENER_NAME_INTERNAL_SASL__ENABLED": "x",  # `__` stands for `_`
            "KAFKA_SOME___DASHED": "y",  # `___` for `-`
            "KAFKA_HEAP_OPTS": "-Xmx1g",  # the JVM's, not the broker's
            "OTHER": "z",
        },
        tmp_path,
    )
    assert rendered == {
        "log.dirs": "/data",
        "transaction.state.log.min.isr": "1",
        "listener.name.internal.sasl_enabled": "x",
        "some-dashed": "y",
    }


def test_compose_broker_environment_renders_to_the_embedded_brokers_settings(tmp_path: Path) -> None:
    kafka = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["kafka"]
    rendered = _render({k: str(v) for k, v in kafka["environment"].items()}, tmp_path)
    assert rendered["process.roles"] == "broker,controller"
    assert rendered["transaction.state.log.replication.factor"] == "1"
    assert rendered["auto.create.topics.enable"] == "false"
    # the healthcheck runs a tool the stand-in ships
    tool = re.search(r"/opt/kafka/bin/(\S+)", " ".join(kafka["healthcheck"]["test"]))
    assert tool is not None and os.access(KAFKA_BIN / tool.group(1), os.X_OK)


@pytest.mark.usefixtures("without_docker_engine")
def test_the_confluent_stand_in_has_what_testcontainers_start_script_runs() -> None:
    """KafkaContainer writes a start script into the container and runs it: every file of Confluent's
    layout it sources or runs is in the stand-in, and so is every command it appends to configure."""
    container = kafka_container()
    scripts: list[bytes] = []
    container.get_container_host_ip = lambda: "127.0.0.1"  # type: ignore[method-assign]
    container.get_exposed_port = lambda port: 40000  # type: ignore[method-assign]
    container.create_file = lambda content, path: scripts.append(content)  # type: ignore[method-assign]
    container.configure()
    container.tc_start()
    (script,) = scripts
    text = script.decode()
    used = set(re.findall(r"/etc/confluent/docker/([\w-]+)", text))
    assert {"configure", "launch", "bash-config"} <= used
    for name in used:
        assert (CONFLUENT / name).is_file(), f"the start script uses /etc/confluent/docker/{name}"
    dockerfile = (IMAGES / "cp-kafka" / "Dockerfile").read_text()
    for command in re.findall(r"echo '(kafka-[\w-]+) ", text):
        assert command in dockerfile and (KAFKA_BIN / f"{command}.sh").is_file()
