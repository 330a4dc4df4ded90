"""Why a TLS handshake with a broker failed, as one line naming the address and the cause.

Why: a client whose TLS settings do not match the broker's otherwise retries forever (librdkafka) or
fails later with "transport failure". librdkafka reports each failed handshake through its error
callback (``_SSL`` when it rejects the broker's certificate; ``_TRANSPORT`` with the broker's TLS
alert when the broker rejects the client's), Python's ``ssl`` (aiokafka) raises ``SSLError``: both
texts are read by ``handshake_cause``. librdkafka says only "certificate verify failed", so
``broker_verify_message`` redoes the handshake with Python's ``ssl`` to learn why (an expired
certificate, an unknown CA, another host name).

The core is pure (``handshake_cause``, ``verify_failure_cause``, ``failure_message``); the shell is
``broker_verify_message`` (one bounded connection) and ``handshake_failure`` (both together).
"""

from __future__ import annotations

import re
import socket
import ssl
from collections.abc import Iterable

from confluent_kafka import KafkaError

from straggler.kafka.security import CERTFILE_ENV, KEYFILE_ENV, SecuritySettings, ssl_context

PROBE_TIMEOUT_S = 5.0
VERIFY_FAILED = "certificate verify failed"
_CLIENT_CERTIFICATE_ALERTS = (
    "alert bad certificate",
    "alert certificate unknown",
    "alert certificate required",
    "alert certificate expired",
    "alert certificate revoked",
    "alert unsupported certificate",
    "alert unknown ca",
    "alert access denied",
)
"""TLS alerts (OpenSSL's wording) a broker sends when it does not accept the client's certificate."""
_UNKNOWN_ISSUER = ("local issuer", "self-signed", "self signed", "first certificate", "issuer certificate")
"""OpenSSL's verify messages for a certificate whose CA the client does not trust."""
_NOT_TLS = ("wrong version number", "packet length too long", "record layer failure")
_ALERT = re.compile(r"(?:sslv3|tlsv1[0-3]?|ssl/tls) (alert [a-z ]+?)(?=:|$| \()")
_ADDRESS = re.compile(r"^(?:ssl|sasl_ssl)://([^/\s]+)/", re.IGNORECASE)
_HANDSHAKE_CODES = (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._AUTHENTICATION)


def handshake_cause(text: str, *, client_certificate: bool) -> str | None:
    """The cause of a failed TLS handshake named in an error text of librdkafka or Python's ``ssl``,
    or None when the text is not about one; ``client_certificate``: the client offered one."""
    lowered = text.lower()
    if VERIFY_FAILED in lowered:
        # Python's ssl adds OpenSSL's reason ("...: certificate has expired (_ssl.c:1006)"); librdkafka
        # only its own advice ("...: broker certificate could not be verified, verify that ...")
        reason = lowered.split(VERIFY_FAILED, 1)[1].lstrip(": ").split(" (_ssl.c")[0].split(" (after")[0]
        if reason and not reason.startswith("broker certificate"):
            return verify_failure_cause(reason)
        return f"{VERIFY_FAILED} (wrong CA?)"
    alert = next((a for a in _CLIENT_CERTIFICATE_ALERTS if a in lowered), None)
    if alert is not None:
        if not client_certificate:
            return (
                f"the broker requires a client certificate and none was given ({CERTFILE_ENV}, {KEYFILE_ENV})"
            )
        return (
            f"the broker refused the client certificate ({alert.removeprefix('alert ')}: expired, or not "
            "signed by a CA the broker trusts?)"
        )
    if any(marker in lowered for marker in _NOT_TLS):
        return "the listener does not speak TLS (a PLAINTEXT or SASL_PLAINTEXT listener?)"
    match = _ALERT.search(lowered)
    if match is not None:
        return f"the broker sent TLS {match.group(1)}"
    return None


def verify_failure_cause(verify_message: str) -> str:
    """Why the broker's certificate was not accepted, from OpenSSL's verify message (Python's
    ``SSLCertVerificationError.verify_message``)."""
    lowered = verify_message.lower()
    if "expired" in lowered:
        return f"{VERIFY_FAILED}: the broker's certificate has expired"
    if "not yet valid" in lowered:
        return f"{VERIFY_FAILED}: the broker's certificate is not valid yet (clock skew?)"
    if "hostname mismatch" in lowered or "ip address mismatch" in lowered:
        return (
            f"{VERIFY_FAILED}: the broker's certificate is not for this address "
            "(KAFKA_SSL_CHECK_HOSTNAME=false skips the check)"
        )
    if any(marker in lowered for marker in _UNKNOWN_ISSUER):
        return f"{VERIFY_FAILED} (wrong CA?): {verify_message}"
    return f"{VERIFY_FAILED}: {verify_message}"


def failure_message(address: str, cause: str) -> str:
    """The one line the commands print and the SDK raises."""
    return f"TLS handshake with {address} failed: {cause}"


def error_address(text: str, default: str) -> str:
    """The broker address in a librdkafka error text (``ssl://HOST:PORT/bootstrap: ...``), else
    ``default``."""
    match = _ADDRESS.match(text)
    return match.group(1) if match is not None else default


def broker_verify_message(
    address: str, settings: SecuritySettings, timeout: float = PROBE_TIMEOUT_S
) -> str | None:
    """OpenSSL's reason for rejecting the certificate of the broker at ``HOST:PORT`` with the client's
    CA and host check (None: it was accepted, or no TLS connection could be made to ask)."""
    host, _, port = address.rpartition(":")
    context = ssl_context(settings)
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host if settings.ssl_check_hostname else None),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message)
    except (OSError, ValueError):
        return None


def handshake_failure(errors: Iterable[KafkaError], bootstrap: str, settings: SecuritySettings) -> str | None:
    """The one-line message of the first failed TLS handshake among librdkafka's ``errors`` (None:
    none of them is one). A rejected broker certificate is checked again to name why."""
    if not settings.uses_ssl:
        return None
    for error in errors:
        if error.code() not in _HANDSHAKE_CODES:
            continue
        text = error.str()
        cause = handshake_cause(text, client_certificate=settings.ssl_certfile is not None)
        if cause is None:
            continue
        address = error_address(text, bootstrap.split(",")[0])
        if cause.startswith(VERIFY_FAILED):
            verify_message = broker_verify_message(address, settings)
            cause = verify_failure_cause(verify_message) if verify_message else cause
        return failure_message(address, cause)
    return None
