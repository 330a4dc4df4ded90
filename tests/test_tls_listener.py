"""Every stage over TLS and mutual TLS: one embedded broker for this module with a ``TLS`` and an
``MTLS`` listener (`straggler.kafka.embedded.BrokerTls`), its certificates made here.

Per listener, one run of all four components together (the two runs at once): the replayer
(`straggler produce`) and the SDK (`TelemetryProducer`) write, the worker (`straggler worker`,
aiokafka) predicts and the mitigator (`straggler mitigate`) commands, and the test reads a prediction
and a command back, every client through that listener. Then the bad certificates (a wrong CA, an
expired client certificate, none on the mTLS listener): a command fails in bounded time with one line
naming the listener's address and the cause, and the SDK raises that line. (An expired broker
certificate: tests/test_tls_errors.py.)
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tls_certificates import CertificateAuthority, Issued

from producers.telemetry import TelemetryProducer
from schemas import CheckpointEvaluated, Event, Prediction, RelaunchCommand, TaskCheckpoint, decode_each
from straggler.cli import main
from straggler.kafka.config import TlsHandshakeError
from straggler.kafka.embedded import BrokerTls, TlsAddresses, embedded_tls_kafka
from straggler.kafka.names import TopicNames
from straggler.kafka.security import CONFIG_FILE_ENV, SETTING_NAMES
from straggler.kafka.topics import create_topics
from straggler.replay import read_topic, start_cli

# one broker, two listeners
pytestmark = [pytest.mark.broker, pytest.mark.scenario, pytest.mark.xdist_group("tls-listener")]
SYNTHETIC_JOB = ["--format", "synthetic", "--jobs", "1", "--seed", "2", "--min-tasks", "20"]
"""One synthetic job of 31 tasks and 30 checkpoints, with stragglers."""
OUTPUT_TIMEOUT_S = 120.0
FAILURE_BOUND_S = 15.0
"""The SDK with a bad certificate must have raised within this."""
STAGES_BOUND_S = 40.0
"""Three commands with bad certificates, started at once, must all have exited within this (without
the handshake check librdkafka retries forever). Each spends ~3 s of CPU importing before its
handshake fails within ~2 s (`check_access`), so on two shared cores under load the last may exit
after ~20 s; the tight bound of the detection itself is the SDK's, above, and `check_access`'s in
tests/test_tls_errors.py. A slow path would also show in the line: after its 10 s `check_access`
says "no answer from the brokers", not "TLS handshake with"."""


@dataclass(frozen=True)
class Certificates:
    """The broker's CA and what it signed, and a CA nobody trusts."""

    ca: Path
    other_ca: Path
    broker: Issued
    client: Issued
    expired_client: Issued


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    directory = tmp_path_factory.mktemp("certificates")
    trusted = CertificateAuthority("trusted", directory)
    return Certificates(
        ca=trusted.certificate,
        other_ca=CertificateAuthority("other", directory).certificate,
        broker=trusted.issue("broker", server=True),
        client=trusted.issue("client", server=False),
        expired_client=trusted.issue("expired-client", server=False, expired=True),
    )


@pytest.fixture(scope="module")
def broker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("broker")


@pytest.fixture(scope="module")
def listeners(certificates: Certificates, broker_dir: Path) -> Iterator[TlsAddresses]:
    tls = BrokerTls(certificates.broker.certificate, certificates.broker.key, client_ca=certificates.ca)
    with embedded_tls_kafka(tls, data_dir=broker_dir) as addresses:
        yield addresses


def test_the_broker_commands_show_the_tls_listeners(
    listeners: TlsAddresses, broker_dir: Path, certificates: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["broker", "status", "--data-dir", str(broker_dir)]) == 0
    assert (
        f"tls: {listeners.tls}, mtls: {listeners.mtls} (client certificate required)"
        in capsys.readouterr().out
    )
    tls_files = [
        "--tls-certificate", str(certificates.broker.certificate), "--tls-key", str(certificates.broker.key),
        "--tls-client-ca", str(certificates.ca),
    ]  # fmt: skip
    assert main(["broker", "start", "--data-dir", str(broker_dir), *tls_files]) == 0  # finds it running
    out = capsys.readouterr().out
    assert "(already running)" in out and f"tls:       {listeners.tls} (SSL)" in out, out
    assert f"mtls:      {listeners.mtls} (SSL, client certificate required)" in out, out
    assert main(["broker", "start", "--data-dir", str(broker_dir), *tls_files[:4]]) == 2
    assert "--tls-certificate, --tls-key and --tls-client-ca go together" in capsys.readouterr().err


def client_config(path: Path, ca: Path, client: Issued | None = None) -> Path:
    """A ``--kafka-config`` file for an SSL client trusting ``ca`` (with ``client``'s certificate)."""
    lines = ["KAFKA_SECURITY_PROTOCOL=SSL", f"KAFKA_SSL_CAFILE={ca}"]
    if client is not None:
        lines += [f"KAFKA_SSL_CERTFILE={client.certificate}", f"KAFKA_SSL_KEYFILE={client.key}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def straggler(*args: str) -> list[str]:
    return [sys.executable, "-m", "straggler.cli", *args]


@contextlib.contextmanager
def client_of(config: Path) -> Iterator[None]:
    """This process's clients made inside the block use ``config`` (they read it when created), and no
    security setting of the environment (which would win over the file)."""
    with pytest.MonkeyPatch.context() as scoped:
        for name in SETTING_NAMES:
            scoped.delenv(name, raising=False)
        scoped.setenv(CONFIG_FILE_ENV, str(config))
        yield


@contextlib.contextmanager
def stopped_together(stop_timeout: float = 30.0) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes added to the list are stopped at the end of the block, all SIGTERMed at once
    (each worker and mitigator takes seconds to leave its group), SIGKILLed if one outlives that."""
    processes: list[subprocess.Popen[bytes]] = []
    try:
        yield processes
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class PipelineRun:
    """What one listener's run wrote, read back through that listener."""

    produced: subprocess.CompletedProcess[str]
    sdk_delivered: int
    predictions: list[Prediction]
    evaluated: list[CheckpointEvaluated]
    commands: list[RelaunchCommand]
    sdk_reports: list[TaskCheckpoint]
    logs: str


def read_outputs(bootstrap: str, topics: TopicNames) -> tuple[list[Event], list[Event]]:
    predictions = [e for v in read_topic(bootstrap, topics.predictions) for e in decode_each(v)]
    return predictions, [e for v in read_topic(bootstrap, topics.commands) for e in decode_each(v)]


@pytest.fixture(scope="module")
def pipeline_runs(
    listeners: TlsAddresses, certificates: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, PipelineRun]:
    """Both listeners' runs at once (most of a run is waiting: Faust's start, the group joins)."""
    directory = tmp_path_factory.mktemp("pipelines")
    bootstraps = {"tls": listeners.tls, "mtls": listeners.mtls}
    configs = {
        "tls": client_config(directory / "tls.env", certificates.ca),
        "mtls": client_config(directory / "mtls.env", certificates.ca, certificates.client),
    }
    topics = {listener: TopicNames(f"{listener}-{uuid.uuid4().hex[:8]}-") for listener in bootstraps}
    runs: dict[str, PipelineRun] = {}
    with stopped_together() as children:
        producers: dict[str, subprocess.Popen[str]] = {}
        for listener, bootstrap in bootstraps.items():
            with client_of(configs[listener]):
                create_topics(bootstrap, prefix=topics[listener].prefix)
            common = [
                "--bootstrap", bootstrap, "--topic-prefix", topics[listener].prefix,
                "--kafka-config", str(configs[listener]),
            ]  # fmt: skip
            worker = [
                "worker",
                *common,
                "--datadir",
                str(directory / f"{listener}-faust"),
                "--pending-grace",
                "3",
            ]
            mitigator = [
                "mitigate",
                *common,
                "--policy",
                "unlimited",
                "--group",
                f"{topics[listener].prefix}m",
            ]
            children.append(start_cli(worker, directory / f"{listener}-worker.log"))
            children.append(start_cli(mitigator, directory / f"{listener}-mitigator.log"))
            producers[listener] = subprocess.Popen(
                straggler("produce", *SYNTHETIC_JOB, *common, "--quiet"),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        delivered = {}
        for listener, bootstrap in bootstraps.items():
            with client_of(configs[listener]), TelemetryProducer(bootstrap, topics=topics[listener]) as sdk:
                sdk.start_job("sdk-job", 1)
                sdk.report("sdk-job", "t0", {"cpu": 0.5})
                sdk.end_job("sdk-job")
            delivered[listener] = sdk.delivered
        produced = {
            listener: subprocess.CompletedProcess(process.args, process.wait(120), *process.communicate())
            for listener, process in producers.items()
        }
        outputs: dict[str, tuple[list[Event], list[Event]]] = {}
        deadline = time.monotonic() + OUTPUT_TIMEOUT_S
        while time.monotonic() < deadline:
            for listener, bootstrap in bootstraps.items():
                with client_of(configs[listener]):
                    outputs[listener] = read_outputs(bootstrap, topics[listener])
            if all(predictions and commands for predictions, commands in outputs.values()):
                break
            time.sleep(1.0)
        for listener, bootstrap in bootstraps.items():
            with client_of(configs[listener]):
                checkpoints = [
                    e for v in read_topic(bootstrap, topics[listener].checkpoints) for e in decode_each(v)
                ]
            predictions, commands = outputs[listener]
            runs[listener] = PipelineRun(
                produced=produced[listener],
                sdk_delivered=delivered[listener],
                predictions=[e for e in predictions if isinstance(e, Prediction)],
                evaluated=[e for e in predictions if isinstance(e, CheckpointEvaluated)],
                commands=[e for e in commands if isinstance(e, RelaunchCommand)],
                sdk_reports=[e for e in checkpoints if isinstance(e, TaskCheckpoint) and e.source == "sdk"],
                logs="",
            )
    for listener, run in runs.items():  # the children have stopped: their logs are complete
        run.logs = "\n".join(
            (directory / f"{listener}-{stage}.log").read_text(errors="replace")[-1500:]
            for stage in ("worker", "mitigator")
        )
    return runs


@pytest.mark.parametrize("listener", ["tls", "mtls"])
def test_every_stage_runs_over_the_listener(pipeline_runs: dict[str, PipelineRun], listener: str) -> None:
    run = pipeline_runs[listener]
    assert run.produced.returncode == 0, run.produced.stderr[-2000:]
    assert '"delivery_failures":0' in run.produced.stdout, run.produced.stdout
    assert run.sdk_delivered == 3 and [(r.job_id, r.task_id) for r in run.sdk_reports] == [("sdk-job", "t0")]
    assert run.predictions and run.evaluated, f"the worker predicted nothing over {listener}:\n{run.logs}"
    assert run.commands, f"the mitigator commanded nothing over {listener}:\n{run.logs}"


@dataclass(frozen=True)
class BadCertificate:
    """A client whose TLS settings the handshake refuses, the cause it must be told, and the command
    that tries (every command meets a bad certificate in `check_access`, so each case takes another)."""

    listener: str
    client: str | None
    trusted_ca: str
    cause: str
    stage: tuple[str, ...]


BAD_CERTIFICATES = {
    "wrong-ca": BadCertificate(
        "tls", None, "other_ca", "certificate verify failed (wrong CA?): ",
        ("worker", "--datadir", "{directory}"),
    ),
    "expired-client-certificate": BadCertificate(
        "mtls", "expired_client", "ca", "the broker refused the client certificate (certificate unknown: ",
        ("mitigate",),
    ),
    "no-client-certificate": BadCertificate(
        "mtls", None, "ca", "the broker requires a client certificate and none was given (",
        ("produce", *SYNTHETIC_JOB, "--quiet"),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class StageFailure:
    returncode: int
    stderr: str
    seconds: float


def bad_certificate_config(directory: Path, certificates: Certificates, case: BadCertificate) -> Path:
    client = getattr(certificates, case.client) if case.client is not None else None
    return client_config(directory / "kafka.env", getattr(certificates, case.trusted_ca), client)


@pytest.fixture(scope="module")
def stage_failures(
    listeners: TlsAddresses, certificates: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, StageFailure]:
    """Each case's command, all three at once: most of each run is Python importing."""
    running: dict[str, subprocess.Popen[str]] = {}
    started = time.monotonic()
    for name, case in BAD_CERTIFICATES.items():
        directory = tmp_path_factory.mktemp(name)
        config = bad_certificate_config(directory, certificates, case)
        arguments = [argument.format(directory=directory) for argument in case.stage]
        bootstrap = getattr(listeners, case.listener)
        running[name] = subprocess.Popen(
            straggler(*arguments, "--bootstrap", bootstrap, "--kafka-config", str(config)),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    failures: dict[str, StageFailure] = {}
    while len(failures) < len(running):
        for name, process in running.items():
            if name not in failures and process.poll() is not None:
                failures[name] = StageFailure(
                    process.returncode, process.communicate()[1], time.monotonic() - started
                )
        if time.monotonic() - started > 2 * STAGES_BOUND_S:
            for process in running.values():
                process.kill()
            pytest.fail(f"a command with a bad certificate hung: {sorted(set(running) - set(failures))}")
        time.sleep(0.1)
    return failures


@pytest.mark.parametrize("case", BAD_CERTIFICATES.values(), ids=BAD_CERTIFICATES.keys())
def test_a_bad_certificate_fails_the_command_with_one_line(
    stage_failures: dict[str, StageFailure], listeners: TlsAddresses, case: BadCertificate
) -> None:
    failure = stage_failures[next(name for name, value in BAD_CERTIFICATES.items() if value is case)]
    expected = f"error: TLS handshake with {getattr(listeners, case.listener)} failed: {case.cause}"
    assert failure.returncode == 1, failure.stderr[-2000:]
    lines = failure.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), failure.stderr[-2000:]
    assert failure.seconds < STAGES_BOUND_S, failure.seconds


@pytest.mark.parametrize("case", BAD_CERTIFICATES.values(), ids=BAD_CERTIFICATES.keys())
def test_a_bad_certificate_makes_the_sdk_raise_the_line(
    listeners: TlsAddresses, certificates: Certificates, case: BadCertificate, tmp_path: Path
) -> None:
    bootstrap = getattr(listeners, case.listener)
    with client_of(bad_certificate_config(tmp_path, certificates, case)):
        sdk = TelemetryProducer(bootstrap)
    started = time.monotonic()
    with pytest.raises(TlsHandshakeError) as raised:
        sdk.start_job("job", 1)
    assert time.monotonic() - started < FAILURE_BOUND_S
    assert str(raised.value).startswith(f"TLS handshake with {bootstrap} failed: {case.cause}")
    with pytest.raises(TlsHandshakeError):
        sdk.close(timeout=0)
