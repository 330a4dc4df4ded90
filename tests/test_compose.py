"""What can be checked of the Docker setup without a Docker engine."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import setuptools
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


SERVICE_MODULES = (
    "straggler.cli",
    "straggler.kafka.topics",
    "pipeline.app",
    "consumers.mitigation",
    "producers.replayer",
)
"""What the services run (``topics``, ``worker``, ``mitigate``, ``produce``), imported from the image."""

_IMAGE_PYTHON = """
import importlib, json, sys

class Undeclared:
    \"\"\"Installed here but not in the image: pyproject does not declare it.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not declared in pyproject)", name=name)
        return None

BLOCKED = set(json.loads(sys.argv[1]))
sys.meta_path.insert(0, Undeclared())
for name in sys.argv[2:-1]:
    importlib.import_module(name)
print(json.dumps({n: getattr(m, "__file__", None) or "" for n, m in list(sys.modules.items())}))
module, _, function = sys.argv[-1].partition(":")
getattr(importlib.import_module(module), function)(["--help"])
"""
"""A Python as the image has it: the copied files first on the path, and the installed distributions
pyproject does not declare (nor pull in) refused, so an optional import fails as in the image; then
the services' modules are imported, the module files printed and the entry point run with --help."""


def _dockerfile_context(tmp_path: Path) -> tuple[Path, list[str]]:
    """Replay the Dockerfile's COPY steps into a fresh directory; return it and the RUN steps."""
    context = tmp_path / "app"
    context.mkdir()
    runs = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "COPY":
            *sources, target = words[1:]
            for source in sources:
                destination = context / (target if not target.endswith("/") and target != "./" else source)
                if (ROOT / source).is_dir():
                    # not the wheels build-local-images.sh may have left: the test installs nothing
                    ignore = shutil.ignore_patterns("__pycache__", "*.whl")
                    shutil.copytree(ROOT / source, destination, ignore=ignore)
                else:
                    shutil.copy(ROOT / source, context / Path(source).name)
        elif words[0] == "RUN":
            runs.append(line.split("RUN", 1)[1].strip())
    return context, runs


def _requirement_closure(requirements: list[str]) -> set[str]:
    """Normalised names of the distributions ``requirements`` pull in (installed metadata, no network)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen or (
            requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})
        ):
            continue
        seen.add(name)
        with contextlib.suppress(metadata.PackageNotFoundError):
            todo += [Requirement(r) for r in metadata.requires(requirement.name) or []]
    return seen


def test_the_dockerfile_builds_the_package_from_what_it_copies(tmp_path: Path) -> None:
    """Offline (the Docker build resolves the dependencies, not the test suite): the image's first RUN
    step installs the package from the copied files (the second adds the extras of ``EXTRAS``, empty
    but for the `dask` profile); those hold every package and data file the build takes, the
    services' modules import from them, and what they import is declared in pyproject."""
    context, runs = _dockerfile_context(tmp_path)
    assert runs == [
        "pip install --no-cache-dir .",
        'if [ -n "$EXTRAS" ]; then pip install --no-cache-dir ".[$EXTRAS]"; fi',
    ], f"unexpected RUN steps: {runs}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert (context / project["project"]["readme"]).is_file()
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert setuptools.find_packages(context, include=include) == setuptools.find_packages(
        ROOT, include=include
    )
    for package, patterns in project["tool"]["setuptools"]["package-data"].items():
        for pattern in patterns:
            shipped = sorted(p.name for p in (ROOT / package).glob(pattern))
            assert shipped and sorted(p.name for p in (context / package).glob(pattern)) == shipped

    ours = set(include_names(include))
    declared = _requirement_closure(project["project"]["dependencies"])
    undeclared = {
        top
        for top, providers in metadata.packages_distributions().items()
        if top not in ours and not {canonicalize_name(d) for d in providers} & declared
    }
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            _IMAGE_PYTHON,
            json.dumps(sorted(undeclared)),
            *SERVICE_MODULES,
            project["project"]["scripts"]["straggler"],
        ],
        cwd=context,
        env={**os.environ, "PYTHONPATH": str(context)},
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    files_line, help_text = ran.stdout.split("\n", 1)
    for name, file in json.loads(files_line).items():
        if name.split(".")[0] in ours:
            assert file.startswith(str(context)), f"{name} was imported from {file}, not from the image"
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


def include_names(include: list[str]) -> list[str]:
    """Top-level package names of setuptools ``include`` patterns (``straggler*`` -> ``straggler``)."""
    return [pattern.rstrip("*").rstrip(".") for pattern in include]


def _compose_config_command(tmp_path: Path) -> list[str]:
    """``docker compose config -q`` on the stack: Compose v2 on the real file where it is installed,
    else Debian's ``docker-compose`` 1.29 (scripts/setup.sh installs it), which validates the same
    services, networks and options but predates the top-level ``name`` key: it reads a copy without
    it. Neither needs a Docker engine."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose", "-f", str(ROOT / "compose.yaml"), "config", "-q"]
    legacy = shutil.which("docker-compose")
    if legacy is None:
        pytest.fail("neither `docker compose` nor `docker-compose` is installed: run scripts/setup.sh (root)")
    stack = {key: value for key, value in COMPOSE.items() if key != "name"}
    copy = tmp_path / "compose.yaml"
    copy.write_text(yaml.safe_dump(stack, sort_keys=False))
    return [legacy, "-f", str(copy), "--project-directory", str(ROOT), "config", "-q"]


def test_docker_compose_config_validates_the_stack(tmp_path: Path) -> None:
    command = _compose_config_command(tmp_path)
    checked = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    # the validator can fail: an option no service takes is refused
    broken = {key: value for key, value in COMPOSE.items() if key != "name"}
    broken["services"] = {**SERVICES, "grafana": {**SERVICES["grafana"], "depends_onn": ["prometheus"]}}
    bad = tmp_path / "broken.yaml"
    bad.write_text(yaml.safe_dump(broken, sort_keys=False))
    refused = subprocess.run(
        [*command[:1], *(["compose"] if command[1] == "compose" else []), "-f", str(bad), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert refused.returncode != 0 and "depends_onn" in refused.stderr + refused.stdout


DASK_SERVICES = ("dask-scheduler", "dask-worker", "dask-executor", "dask-job")


def test_monitoring_is_a_profile_and_a_plain_up_runs_the_replay() -> None:
    """`docker compose up` starts what the replay needs (and can run where Prometheus' and Grafana's
    images cannot be had); `--profile monitoring` adds both, `--profile dask` the Dask cluster."""
    profiled = {name: service["profiles"] for name, service in SERVICES.items() if "profiles" in service}
    assert profiled == {
        "prometheus": ["monitoring"],
        "grafana": ["monitoring"],
        **{name: ["dask"] for name in DASK_SERVICES},
    }
    plain = set(SERVICES) - set(profiled)
    for name in plain:
        depends = SERVICES[name].get("depends_on", [])
        assert not set(depends) & set(profiled), f"{name} needs a monitoring service"
    assert {"kafka", "topics", "worker", "mitigator", "replayer"} <= plain


def test_the_dask_profile_runs_the_readme_example_on_its_own_cluster() -> None:
    """README "On a Dask cluster" in containers: one image with the `dask` extra, workers of one
    thread on the scheduler the executor and the job use, and the job's TMPDIR (the example's stuck
    marker) on a volume every worker mounts at the same path."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    services = {name: SERVICES[name] for name in DASK_SERVICES}
    for service in services.values():
        assert service["image"] == "straggler-stream-dask:latest"
        assert service["build"]["context"] == "." and service["build"]["args"]["EXTRAS"] == "dask"
    assert "dask" in project["project"]["optional-dependencies"]
    scheduler = services["dask-scheduler"]["command"]
    assert scheduler[:2] == ["dask", "scheduler"]
    port = scheduler[scheduler.index("--port") + 1]
    address = f"dask-scheduler:{port}"
    worker = services["dask-worker"]["command"]
    assert worker[:3] == ["dask", "worker", f"tcp://{address}"]
    assert (
        worker[worker.index("--nthreads") + 1] == "1" and services["dask-worker"]["deploy"]["replicas"] >= 2
    )
    executor = build_parser().parse_args(services["dask-executor"]["command"][1:])
    assert services["dask-executor"]["command"][:2] == ["straggler", "dask-executor"]
    assert executor.scheduler == address and executor.bootstrap == "kafka:9092"
    job = services["dask-job"]
    assert (ROOT / job["command"][-1]).is_file()
    assert job["environment"]["DASK_SCHEDULER_ADDRESS"] == f"tcp://{address}"
    assert job["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    scratch = f"dask-scratch:{job['environment']['TMPDIR']}"
    assert scratch in job["volumes"] and scratch in services["dask-worker"]["volumes"]
    assert {"worker", "mitigator", "dask-executor", "dask-worker"} <= set(job["depends_on"])
