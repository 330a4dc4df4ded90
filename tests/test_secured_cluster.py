"""Every role against a secured broker: an embedded broker whose only client listener is SASL_PLAINTEXT
(PLAIN and SCRAM users), started once for this module on 127.0.0.1.

The pipeline (worker, mitigation consumer, replayer, admin helpers) runs with SASL PLAIN; a
produce/consume round trip runs with SCRAM through confluent-kafka and through aiokafka (the worker's
client); clients without credentials or with a wrong password get a clear error in bounded time.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from harness.small_jobs import make_job

from producers.replayer import TraceReplayer
from schemas import CheckpointEvaluated, RelaunchCommand, command_id, decode_each
from straggler.core.policies import Unlimited
from straggler.evaluation import EvaluationConfig, method_decisions
from straggler.kafka.config import KafkaAccessError, check_access
from straggler.kafka.embedded import BrokerSecurity, embedded_kafka
from straggler.kafka.names import TopicNames
from straggler.kafka.security import (
    CONFIG_FILE_ENV,
    PLAINTEXT,
    SETTING_NAMES,
    SecuritySettings,
    faust_credentials,
)
from straggler.kafka.smoke import smoke_check
from straggler.kafka.topics import create_topics
from straggler.replay import child_process, read_topic

pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("secured-cluster")]  # one secured broker
ALICE = ("alice", "alice-secret")  # a PLAIN user
BOB = ("bob", "bob-secret")  # a SCRAM user (SHA-256 and SHA-512)


def login(mechanism: str, user: tuple[str, str]) -> SecuritySettings:
    return SecuritySettings("SASL_PLAINTEXT", mechanism, *user)


def env_file(path: Path, settings: SecuritySettings) -> Path:
    path.write_text(
        f"KAFKA_SECURITY_PROTOCOL={settings.security_protocol}\n"
        f"KAFKA_SASL_MECHANISM={settings.sasl_mechanism}\n"
        f"KAFKA_SASL_USERNAME={settings.username}\n"
        f"KAFKA_SASL_PASSWORD={settings.password}\n"
    )
    return path


@pytest.fixture(scope="module")
def secured_bootstrap() -> Iterator[str]:
    security = BrokerSecurity(plain_users=dict([ALICE]), scram_users=dict([BOB]))
    with embedded_kafka(security=security) as bootstrap:
        yield bootstrap


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This process's environment without any security setting (each test sets its own)."""
    for name in (*SETTING_NAMES, CONFIG_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_pipeline_runs_with_sasl_plain(
    secured_bootstrap: str, env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = env_file(tmp_path / "kafka.env", login("PLAIN", ALICE))
    topics = TopicNames(f"sasl-{uuid.uuid4().hex[:8]}-")
    with env.context() as scoped:
        scoped.setenv(CONFIG_FILE_ENV, str(config))
        create_topics(secured_bootstrap, prefix=topics.prefix)
    # The children get the settings only from --kafka-config: this environment has none yet.
    common = [
        "--bootstrap",
        secured_bootstrap,
        "--topic-prefix",
        topics.prefix,
        "--kafka-config",
        str(config),
    ]
    worker = ["worker", *common, "--datadir", str(tmp_path / "faust"), "--pending-grace", "3"]
    group = f"{topics.prefix}mitigation"
    mitigator = ["mitigate", *common, "--policy", "unlimited", "--group", group, "--checkpoint-seconds", "60"]
    with (
        child_process(worker, tmp_path / "worker.log") as worker_process,
        child_process(mitigator, tmp_path / "mitigator.log"),
    ):
        env.setenv(CONFIG_FILE_ENV, str(config))  # the replayer and the readers below, in this process
        trace = make_job(160, seed=11, job_id=f"sasl-{uuid.uuid4().hex[:6]}", signal=0.5)
        result = TraceReplayer([trace], secured_bootstrap, topics=topics, progress=False).run()
        assert result.delivery_failures == 0
        markers = {(trace.job_id, float(c)) for c in trace.checkpoints}
        policy, expected_commands = Unlimited(), set()
        for verdicts in method_decisions(
            trace, "nurd", EvaluationConfig(methods=("nurd",), threshold="online")
        ):
            if verdicts:
                for action in policy.on_checkpoint(trace.job_id, verdicts[0].checkpoint_time, verdicts):
                    expected_commands.add(
                        command_id(action.job_id, action.task_id, action.action, action.decision_key)
                    )
        assert expected_commands, "the job must contain stragglers"

        deadline = time.monotonic() + 180.0
        seen: set[tuple[str, float]] = set()
        commands: set[str] = set()
        while time.monotonic() < deadline and worker_process.poll() is None:
            events = [e for v in read_topic(secured_bootstrap, topics.predictions) for e in decode_each(v)]
            seen = {(e.job_id, e.checkpoint_time) for e in events if isinstance(e, CheckpointEvaluated)}
            found = [e for v in read_topic(secured_bootstrap, topics.commands) for e in decode_each(v)]
            commands = {e.command_id for e in found if isinstance(e, RelaunchCommand)}
            if markers <= seen and expected_commands <= commands:
                break
            time.sleep(1.0)
        log = (tmp_path / "worker.log").read_text(errors="replace")[-2000:]
    assert markers <= seen, f"checkpoints never evaluated: {sorted(markers - seen)[:5]}; worker log:\n{log}"
    assert commands == expected_commands


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_round_trip_through_confluent_kafka(
    secured_bootstrap: str, env: pytest.MonkeyPatch, mechanism: str
) -> None:
    settings = login(mechanism, BOB)
    for name, value in (
        ("KAFKA_SECURITY_PROTOCOL", settings.security_protocol),
        ("KAFKA_SASL_MECHANISM", mechanism),
        ("KAFKA_SASL_USERNAME", BOB[0]),
        ("KAFKA_SASL_PASSWORD", BOB[1]),
    ):
        env.setenv(name, value)
    result = smoke_check(secured_bootstrap, messages=40, echo=False)
    assert result.ok, result


def test_scram_round_trip_through_aiokafka_as_the_worker_logs_in(secured_bootstrap: str) -> None:
    auth = credentials_to_aiokafka_auth(faust_credentials(login("SCRAM-SHA-512", BOB)))
    topic = f"sasl-aio-{uuid.uuid4().hex[:8]}"
    from confluent_kafka.admin import NewTopic

    from straggler.kafka.topics import create_missing_topics

    with pytest.MonkeyPatch.context() as scoped:
        for name, value in (
            ("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT"),
            ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
            ("KAFKA_SASL_USERNAME", BOB[0]),
            ("KAFKA_SASL_PASSWORD", BOB[1]),
        ):
            scoped.setenv(name, value)
        create_missing_topics(secured_bootstrap, [NewTopic(topic, num_partitions=1, replication_factor=1)])

    async def round_trip() -> bytes:
        producer = AIOKafkaProducer(bootstrap_servers=secured_bootstrap, **auth)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"hello", key=b"k")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=secured_bootstrap, auto_offset_reset="earliest", **auth
        )
        await consumer.start()
        try:
            record = await asyncio.wait_for(consumer.getone(), timeout=30.0)
        finally:
            await consumer.stop()
        return bytes(record.value or b"")

    assert asyncio.run(round_trip()) == b"hello"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (PLAINTEXT, "expect other security settings"),
        (login("PLAIN", (ALICE[0], "wrong")), "refused the credentials as 'alice' \\(PLAIN\\)"),
        (login("SCRAM-SHA-256", (BOB[0], "wrong")), "refused the credentials as 'bob' \\(SCRAM-SHA-256\\)"),
        (login("PLAIN", BOB), "refused the credentials"),  # a SCRAM-only user has no PLAIN login
    ],
    ids=["no-credentials", "wrong-plain-password", "wrong-scram-password", "wrong-mechanism"],
)
def test_a_client_without_valid_credentials_is_refused_quickly(
    secured_bootstrap: str, settings: SecuritySettings, message: str
) -> None:
    started = time.monotonic()
    with pytest.raises(KafkaAccessError, match=message):
        check_access(secured_bootstrap, security=settings, timeout=5.0)
    assert time.monotonic() - started < 15.0


def test_a_command_with_a_wrong_password_fails_with_a_clear_error(
    secured_bootstrap: str, tmp_path: Path
) -> None:
    config = env_file(tmp_path / "kafka.env", login("PLAIN", (ALICE[0], "wrong")))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "straggler.cli",
            "worker",
            "--bootstrap",
            secured_bootstrap,
            "--kafka-config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 1, completed.stderr[-2000:]
    assert "refused the credentials as 'alice' (PLAIN)" in completed.stderr
