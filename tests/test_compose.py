"""What can be checked of the Docker setup without a Docker engine."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from straggler.cli import build_parser
from straggler.kafka.embedded import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]


def test_the_broker_image_is_the_version_the_embedded_broker_runs() -> None:
    assert SERVICES["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    env = SERVICES["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert all(port.startswith("127.0.0.1:") for port in SERVICES["kafka"].get("ports", []))


@pytest.mark.parametrize("name", ["topics", "worker", "mitigator", "replayer"])
def test_every_service_runs_a_real_command_of_the_package(name: str) -> None:
    service = SERVICES[name]
    assert service["build"] == "." and service["image"] == "straggler-stream:latest"
    command = service["command"]
    assert command[0] == "straggler"
    args = build_parser().parse_args(command[1:])  # exits (fails the test) on an unknown option
    assert callable(args.func)


def test_the_replayer_starts_after_the_pipeline_and_replays_the_bundled_sample() -> None:
    replayer = SERVICES["replayer"]
    assert {"worker", "mitigator", "topics"} <= set(replayer["depends_on"])
    command = replayer["command"]
    trace = command[command.index("--trace") + 1]
    assert (ROOT / trace / "task_events").is_dir()
    assert "--closed-loop" in command
    # the replayer waits for the mitigator's consumer group: both must use the same one
    mitigator = build_parser().parse_args(SERVICES["mitigator"]["command"][1:])
    produce = build_parser().parse_args(command[1:])
    assert mitigator.group == produce.mitigator_group


@pytest.mark.slow
def test_the_dockerfile_installs_in_a_plain_virtual_environment(tmp_path: Path) -> None:
    """Replay the Dockerfile's COPY and RUN steps in a fresh venv, then run the entry point."""
    context = tmp_path / "app"
    context.mkdir()
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    runs = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "COPY":
            *sources, target = words[1:]
            for source in sources:
                destination = context / (target if not target.endswith("/") and target != "./" else source)
                if (ROOT / source).is_dir():
                    subprocess.run(["cp", "-r", str(ROOT / source), str(destination)], check=True)
                else:
                    subprocess.run(["cp", str(ROOT / source), str(context / Path(source).name)], check=True)
        elif words[0] == "RUN":
            runs.append(line.split("RUN", 1)[1].strip())
    assert runs, "the Dockerfile has no RUN step"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for step in runs:
        assert step.startswith("pip install"), f"unexpected RUN step: {step}"
        subprocess.run(f"{venv}/bin/python -m {step}", shell=True, cwd=context, check=True, timeout=900)
    help_text = subprocess.run(
        [str(venv / "bin" / "straggler"), "--help"], cwd=context, capture_output=True, text=True, check=True
    ).stdout
    for command in ("broker", "topics", "worker", "mitigate", "produce", "replay", "evaluate"):
        assert command in help_text
