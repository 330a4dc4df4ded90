"""A failed TLS handshake is named in one line (`straggler.kafka.tls_errors`): the pure reading of
librdkafka's and Python's error texts, then real handshakes against a TLS server in this process
(no Kafka: the handshake fails before any Kafka request) whose certificate has expired or is signed
by another CA, through the probe, `check_access`, the SDK and a command."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from tls_certificates import CertificateAuthority, Issued

from producers.telemetry import TelemetryProducer
from straggler.kafka.config import TlsHandshakeError, check_access
from straggler.kafka.security import PLAINTEXT, SecuritySettings
from straggler.kafka.tls_errors import (
    broker_verify_message,
    error_address,
    handshake_cause,
    handshake_failure,
    verify_failure_cause,
)

LIBRDKAFKA_VERIFY_FAILED = (
    "ssl://127.0.0.1:44731/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
    "verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly "
    "configured or root CA certificates are installed (install ca-certificates package) (after 16ms in "
    "state SSL_HANDSHAKE)"
)
LIBRDKAFKA_BAD_CERTIFICATE = (
    "ssl://127.0.0.1:36011/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls alert bad "
    "certificate: SSL alert number 42 (after 3ms in state UP)"
)
LIBRDKAFKA_CERTIFICATE_UNKNOWN = (
    "ssl://127.0.0.1:36011/bootstrap: Receive failed: error:0A000416:SSL routines::ssl/tls alert "
    "certificate unknown: SSL alert number 46"
)
PYTHON_EXPIRED = (
    "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate has expired (_ssl.c:1006)"
)
PYTHON_CERTIFICATE_REQUIRED = (
    "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required (_ssl.c:2580)"
)


@pytest.mark.parametrize(
    ("text", "client_certificate", "cause"),
    [
        (LIBRDKAFKA_VERIFY_FAILED, False, "certificate verify failed (wrong CA?)"),
        (PYTHON_EXPIRED, False, "certificate verify failed: the broker's certificate has expired"),
        (LIBRDKAFKA_BAD_CERTIFICATE, False, "the broker requires a client certificate and none was given"),
        (PYTHON_CERTIFICATE_REQUIRED, False, "the broker requires a client certificate and none was given"),
        (LIBRDKAFKA_BAD_CERTIFICATE, True, "the broker refused the client certificate (bad certificate: "),
        (LIBRDKAFKA_CERTIFICATE_UNKNOWN, True, "the broker refused the client certificate (certificate unk"),
        ("[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)", False, "the listener does not"),
        ("[SSL: TLSV1_ALERT_PROTOCOL_VERSION] tlsv1 alert protocol version", False, "the broker sent TLS"),
    ],
    ids=[
        "librdkafka-verify", "python-expired", "librdkafka-no-client-cert", "python-no-client-cert",
        "librdkafka-refused-cert", "librdkafka-unknown-cert", "not-tls", "other-alert",
    ],
)  # fmt: skip
def test_the_cause_is_read_from_librdkafka_and_python_texts(
    text: str, client_certificate: bool, cause: str
) -> None:
    found = handshake_cause(text, client_certificate=client_certificate)
    assert found is not None and found.startswith(cause), found


@pytest.mark.parametrize(
    "text",
    [
        "1/1 brokers are down",
        "ssl://127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused",
        "SASL authentication error: Authentication failed: Invalid username or password",
    ],
)
def test_other_errors_are_not_taken_for_a_handshake(text: str) -> None:
    assert handshake_cause(text, client_certificate=False) is None


@pytest.mark.parametrize(
    ("verify_message", "cause"),
    [
        ("certificate has expired", "certificate verify failed: the broker's certificate has expired"),
        ("unable to get local issuer certificate", "certificate verify failed (wrong CA?): unable to get"),
        ("self-signed certificate in certificate chain", "certificate verify failed (wrong CA?): self-"),
        ("Hostname mismatch, certificate is not valid for 'h'.", "certificate verify failed: the broker's"),
        ("certificate is not yet valid", "certificate verify failed: the broker's certificate is not valid"),
        ("unsupported certificate purpose", "certificate verify failed: unsupported certificate purpose"),
    ],
)
def test_openssl_verify_messages_name_the_cause(verify_message: str, cause: str) -> None:
    assert verify_failure_cause(verify_message).startswith(cause)


def test_the_address_comes_from_the_error_text_else_the_bootstrap() -> None:
    assert error_address(LIBRDKAFKA_VERIFY_FAILED, "b:1") == "127.0.0.1:44731"
    assert error_address("1/1 brokers are down", "b:1") == "b:1"


def test_only_tls_clients_and_handshake_errors_give_a_failure() -> None:
    tls = SecuritySettings("SSL")
    verify = KafkaError(KafkaError._SSL, LIBRDKAFKA_VERIFY_FAILED)
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
    assert handshake_failure([verify], "b:1", PLAINTEXT) is None
    assert handshake_failure([down], "b:1", tls) is None
    refused = KafkaError(KafkaError._TRANSPORT, LIBRDKAFKA_BAD_CERTIFICATE)
    assert handshake_failure([down, refused], "b:1", tls) == (
        "TLS handshake with 127.0.0.1:36011 failed: the broker requires a client certificate and none "
        "was given (KAFKA_SSL_CERTFILE, KAFKA_SSL_KEYFILE)"
    )


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | Issued]:
    directory = tmp_path_factory.mktemp("certificates")
    trusted, other = CertificateAuthority("trusted", directory), CertificateAuthority("other", directory)
    return {
        "ca": trusted.certificate,
        "other-ca": other.certificate,
        "broker": trusted.issue("broker", server=True),
        "expired-broker": trusted.issue("expired-broker", server=True, expired=True),
    }


@contextlib.contextmanager
def tls_server(identity: Issued) -> Iterator[str]:
    """A TLS server on 127.0.0.1 presenting ``identity``: each connection is a handshake, then closed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(identity.certificate, identity.key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with contextlib.suppress(OSError), connection:
                connection.settimeout(2.0)
                context.wrap_socket(connection, server_side=True).close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()


@pytest.mark.parametrize(
    ("identity", "trusted", "verify_message"),
    [
        ("broker", "ca", None),
        ("expired-broker", "ca", "certificate has expired"),
        ("broker", "other-ca", "unable to get local issuer certificate"),
    ],
)
def test_the_probe_says_why_the_broker_certificate_is_refused(
    certificates: dict[str, Path | Issued], identity: str, trusted: str, verify_message: str | None
) -> None:
    server_identity = certificates[identity]
    assert isinstance(server_identity, Issued)
    settings = SecuritySettings("SSL", ssl_cafile=str(certificates[trusted]))
    with tls_server(server_identity) as address:
        assert broker_verify_message(address, settings) == verify_message


def test_check_access_names_an_expired_broker_certificate_at_once(
    certificates: dict[str, Path | Issued],
) -> None:
    expired = certificates["expired-broker"]
    assert isinstance(expired, Issued)
    settings = SecuritySettings("SSL", ssl_cafile=str(certificates["ca"]))
    with tls_server(expired) as address:
        started = time.monotonic()
        with pytest.raises(TlsHandshakeError) as raised:
            check_access(address, security=settings, timeout=10.0)
        elapsed = time.monotonic() - started
    assert str(raised.value) == (
        f"TLS handshake with {address} failed: certificate verify failed: the broker's certificate "
        "has expired"
    )
    assert elapsed < 5.0, elapsed


def test_the_sdk_raises_the_handshake_failure_instead_of_retrying(
    certificates: dict[str, Path | Issued], clean_env: pytest.MonkeyPatch
) -> None:
    broker = certificates["broker"]
    assert isinstance(broker, Issued)
    clean_env.setenv("KAFKA_SECURITY_PROTOCOL", "SSL")
    clean_env.setenv("KAFKA_SSL_CAFILE", str(certificates["other-ca"]))
    with tls_server(broker) as address:
        sdk = TelemetryProducer(address)
        started = time.monotonic()
        with pytest.raises(
            TlsHandshakeError, match=f"^TLS handshake with {address} failed: certificate verify"
        ):
            sdk.start_job("job", 3)
        assert time.monotonic() - started < 15.0
        with pytest.raises(TlsHandshakeError, match="wrong CA"):  # and so does every later call
            sdk.report("job", "t1", {"cpu": 1.0})
        with pytest.raises(TlsHandshakeError):
            sdk.close(timeout=0)


def test_a_command_prints_one_line_and_exits_1(
    certificates: dict[str, Path | Issued], tmp_path: Path
) -> None:
    expired = certificates["expired-broker"]
    assert isinstance(expired, Issued)
    config = tmp_path / "kafka.env"
    config.write_text(f"KAFKA_SECURITY_PROTOCOL=SSL\nKAFKA_SSL_CAFILE={certificates['ca']}\n")
    with tls_server(expired) as address:
        started = time.monotonic()
        completed = subprocess.run(
            [sys.executable, "-m", "straggler.cli", "mitigate", "--bootstrap", address,
             "--kafka-config", str(config)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert completed.returncode == 1, completed.stderr[-2000:]
    assert completed.stderr.strip().splitlines() == [
        f"error: TLS handshake with {address} failed: certificate verify failed: the broker's certificate "
        "has expired"
    ]
    assert elapsed < 15.0, elapsed
