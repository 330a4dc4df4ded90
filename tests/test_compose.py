"""What can be checked of the Docker setup without a Docker engine."""

from __future__ import annotations

import json
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


def _published_ports() -> list[tuple[str, str]]:
    return [(name, str(port)) for name, service in SERVICES.items() for port in service.get("ports", [])]


def test_every_published_port_is_bound_to_the_loopback_interface() -> None:
    published = _published_ports()
    assert {"kafka", "prometheus", "grafana"} <= {name for name, _ in published}
    for name, port in published:
        assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def _mounts(service: str) -> dict[str, Path]:
    """Container path -> the repository path compose mounts there (every one must exist)."""
    mounts = {}
    for volume in SERVICES[service]["volumes"]:
        source, target, *_ = volume.split(":")
        assert source.startswith("./"), f"{service} mounts {source}, not a file of the repository"
        assert (ROOT / source).exists(), f"{service} mounts {source}, which is missing"
        mounts[target] = ROOT / source
    return mounts


def test_prometheus_scrapes_the_metrics_ports_the_worker_and_mitigator_serve() -> None:
    prometheus = SERVICES["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus:v")
    flag = next(arg for arg in prometheus["command"] if arg.startswith("--config.file="))
    config = yaml.safe_load(_mounts("prometheus")[flag.split("=", 1)[1]].read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for group in job["static_configs"]
        for target in group["targets"]
    }
    served = set()
    for name in ("worker", "mitigator"):
        args = build_parser().parse_args(SERVICES[name]["command"][1:])
        assert args.metrics_port is not None and args.metrics_host == "0.0.0.0"  # reachable from prometheus
        served.add(f"{name}:{args.metrics_port}")
    assert targets == served


def test_grafana_provisions_the_prometheus_datasource_and_the_dashboard() -> None:
    grafana = SERVICES["grafana"]
    assert grafana["image"].startswith("grafana/grafana:")
    mounts = _mounts("grafana")
    provisioning = mounts["/etc/grafana/provisioning"]
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    (source,) = datasources
    assert source["type"] == "prometheus"
    port = SERVICES["prometheus"]["ports"][0].rsplit(":", 1)[1]
    assert source["url"] == f"http://prometheus:{port}"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "straggler-stream.yml").read_text())[
        "providers"
    ]
    dashboards = mounts[provider["options"]["path"]]
    dashboard = json.loads((dashboards / "straggler-stream.json").read_text())
    uids = {target["datasource"]["uid"] for panel in dashboard["panels"] for target in panel["targets"]}
    assert uids == {source["uid"]}
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/") and (dashboards / Path(home).name).is_file()
    assert {"prometheus"} <= set(grafana["depends_on"])
