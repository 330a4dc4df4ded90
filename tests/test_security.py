"""Kafka security settings: parsing, validation, and their mapping to confluent-kafka and Faust."""

from __future__ import annotations

import os
from pathlib import Path

import certifi
import faust
import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from straggler.kafka.config import admin_config, consumer_config, producer_config
from straggler.kafka.security import (
    CONFIG_FILE_ENV,
    PLAINTEXT,
    SecurityConfigError,
    SecuritySettings,
    apply_kafka_config,
    current_security,
    faust_credentials,
    librdkafka_config,
    load_settings,
    parse_config_file,
    parse_settings,
)

CA = certifi.where()  # any real PEM bundle serves as a CA file


def test_nothing_set_keeps_the_plaintext_configs_of_before(clean_env: pytest.MonkeyPatch) -> None:
    assert current_security() == PLAINTEXT
    assert librdkafka_config(PLAINTEXT) == {}
    assert faust_credentials(PLAINTEXT) is None
    assert producer_config("h:1") == {
        "bootstrap.servers": "h:1",
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "compression.type": "lz4",
        "partitioner": "murmur2_random",
    }
    assert consumer_config("h:1", "g") == {
        "bootstrap.servers": "h:1",
        "group.id": "g",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
    assert admin_config("h:1") == {"bootstrap.servers": "h:1"}


def test_environment_settings_reach_every_client_config(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("KAFKA_SECURITY_PROTOCOL", "sasl_ssl")
    clean_env.setenv("KAFKA_SASL_MECHANISM", "scram-sha-512")
    clean_env.setenv("KAFKA_SASL_USERNAME", "alice")
    clean_env.setenv("KAFKA_SASL_PASSWORD", " p=w#d ")
    clean_env.setenv("KAFKA_SSL_CAFILE", CA)
    clean_env.setenv("KAFKA_SSL_CHECK_HOSTNAME", "false")
    expected = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": " p=w#d ",  # verbatim
        "ssl.ca.location": CA,
        "ssl.endpoint.identification.algorithm": "none",
    }
    for config in (
        producer_config("h:1", transactional_id="t"),
        consumer_config("h:1", "g"),
        admin_config("h:1"),
    ):
        assert {k: config[k] for k in expected} == expected
    assert producer_config("h:1", security=PLAINTEXT).get("security.protocol") is None  # explicit wins


def test_the_file_holds_the_same_names_and_the_environment_overrides_it(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "kafka.env"
    path.write_text(
        "# a secured cluster\n\n"
        "KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT\n"
        "export KAFKA_SASL_MECHANISM = PLAIN\n"
        "KAFKA_SASL_USERNAME='alice'\n"
        'KAFKA_SASL_PASSWORD="from file"\n'
    )
    clean_env.setenv(CONFIG_FILE_ENV, str(path))
    assert current_security() == SecuritySettings("SASL_PLAINTEXT", "PLAIN", "alice", "from file")
    clean_env.setenv("KAFKA_SASL_PASSWORD", "from env")
    assert current_security().password == "from env"


def test_apply_kafka_config_exports_the_file_to_children(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "kafka.env"
    path.write_text("KAFKA_SECURITY_PROTOCOL=SSL\nKAFKA_SSL_CAFILE=" + CA + "\n")
    settings = apply_kafka_config(str(path))
    assert os.environ[CONFIG_FILE_ENV] == str(path.resolve())
    assert settings == SecuritySettings("SSL", ssl_cafile=CA)
    assert apply_kafka_config(None) == settings  # no flag: the environment as it is


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "must be one of PLAINTEXT, SSL"),
        ({"KAFKA_SASL_USERNAME": "alice", "KAFKA_SASL_PASSWORD": "x"}, "use SASL_PLAINTEXT or SASL_SSL"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "PLAIN"},
            "needs KAFKA_SASL_USERNAME",
        ),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "KAFKA_SASL_USERNAME": "a",
                "KAFKA_SASL_PASSWORD": "b",
            },
            "needs KAFKA_SASL_MECHANISM",
        ),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SASL_MECHANISM": "GSSAPI",
                "KAFKA_SASL_USERNAME": "a",
                "KAFKA_SASL_PASSWORD": "b",
            },
            "one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
        ),
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SSL_CAFILE": CA}, "use SSL or SASL_SSL"),
        ({"KAFKA_SSL_CAFILE": CA}, "use SSL or SASL_SSL"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTFILE": CA}, "needs both KAFKA_SSL_CERTFILE"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, "true or false"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": "/no/such/ca.pem"}, "not a readable file"),
    ],
)
def test_meaningless_combinations_are_refused_with_the_reason(values: dict[str, str], message: str) -> None:
    with pytest.raises(SecurityConfigError, match=message):
        load_settings(values)


@pytest.mark.parametrize(
    ("text", "message"),
    [("KAFKA_SASL_PASSWORD\n", "expected NAME=value"), ("KAFKA_SASL_PASWORD=x\n", "unknown setting")],
)
def test_a_malformed_file_names_its_line(text: str, message: str) -> None:
    with pytest.raises(SecurityConfigError, match=f"line 1: {message}"):
        parse_config_file(text)


def test_a_missing_file_is_an_error() -> None:
    with pytest.raises(SecurityConfigError, match="cannot read the Kafka config file"):
        load_settings({CONFIG_FILE_ENV: "/no/such/kafka.env"})


def test_passwords_are_not_in_the_repr() -> None:
    settings = SecuritySettings("SASL_PLAINTEXT", "PLAIN", "alice", "hunter2")
    assert "hunter2" not in repr(settings) and "alice" in repr(settings)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_worker_gets_the_same_sasl_login_through_faust(mechanism: str) -> None:
    settings = parse_settings(
        {
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_MECHANISM": mechanism,
            "KAFKA_SASL_USERNAME": "alice",
            "KAFKA_SASL_PASSWORD": "pw",
        }
    )
    credentials = faust_credentials(settings)
    assert isinstance(credentials, faust.SASLCredentials)
    auth = credentials_to_aiokafka_auth(credentials)
    assert auth == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "alice",
        "sasl_plain_password": "pw",
        "ssl_context": None,
    }


def test_the_worker_gets_the_same_tls_settings_through_faust() -> None:
    sasl_ssl = SecuritySettings(
        "SASL_SSL", "SCRAM-SHA-256", "a", "b", ssl_cafile=CA, ssl_check_hostname=False
    )
    auth = credentials_to_aiokafka_auth(faust_credentials(sasl_ssl))
    assert auth["security_protocol"] == "SASL_SSL" and auth["sasl_mechanism"] == "SCRAM-SHA-256"
    assert auth["ssl_context"].check_hostname is False
    tls = credentials_to_aiokafka_auth(faust_credentials(SecuritySettings("SSL", ssl_cafile=CA)))
    assert tls["security_protocol"] == "SSL" and tls["ssl_context"].check_hostname is True
