"""Kafka client security (TLS, SASL PLAIN / SCRAM) for every role, from one place.

Why one place: the replayer, the SDK, the worker (Faust/aiokafka), the mitigation consumer and the
admin helpers must all reach a secured cluster with the same settings, named once. The settings come
from environment variables and/or a file of the same ``NAME=value`` lines (named by
``KAFKA_CONFIG_FILE`` or ``--kafka-config FILE``); a variable set in the environment wins over the
file. Child processes (the worker and consumer a replay starts, the watchdog's child) inherit the
environment, so they inherit the settings too. Nothing set means PLAINTEXT, exactly as before.

The core is pure: ``parse_settings`` (names -> validated ``SecuritySettings``), ``librdkafka_config``
(-> confluent-kafka keys) and ``faust_credentials`` (-> Faust's ``broker_credentials``). The shell is
``current_security`` (reads the environment and the file).
"""

from __future__ import annotations

import argparse
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

CONFIG_FILE_ENV = "KAFKA_CONFIG_FILE"
PROTOCOL_ENV = "KAFKA_SECURITY_PROTOCOL"
MECHANISM_ENV = "KAFKA_SASL_MECHANISM"
USERNAME_ENV = "KAFKA_SASL_USERNAME"
PASSWORD_ENV = "KAFKA_SASL_PASSWORD"
CAFILE_ENV = "KAFKA_SSL_CAFILE"
CERTFILE_ENV = "KAFKA_SSL_CERTFILE"
KEYFILE_ENV = "KAFKA_SSL_KEYFILE"
KEY_PASSWORD_ENV = "KAFKA_SSL_KEY_PASSWORD"
CHECK_HOSTNAME_ENV = "KAFKA_SSL_CHECK_HOSTNAME"
SETTING_NAMES = (
    PROTOCOL_ENV,
    MECHANISM_ENV,
    USERNAME_ENV,
    PASSWORD_ENV,
    CAFILE_ENV,
    CERTFILE_ENV,
    KEYFILE_ENV,
    KEY_PASSWORD_ENV,
    CHECK_HOSTNAME_ENV,
)
"""Every name the environment or the config file may set (the file may set no other)."""

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SecurityConfigError(ValueError):
    """The security settings are unreadable or make no sense together."""


@dataclass(frozen=True)
class SecuritySettings:
    """How clients authenticate to and encrypt traffic with the brokers; the default is PLAINTEXT."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    ssl_cafile: str | None = None
    """CA bundle (PEM) that signed the brokers' certificates; None: the system's trust store."""
    ssl_certfile: str | None = None
    """Client certificate (PEM) for mutual TLS, with ``ssl_keyfile``."""
    ssl_keyfile: str | None = None
    ssl_key_password: str | None = None
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        problems = settings_problems(self)
        if problems:
            raise SecurityConfigError("invalid Kafka security settings: " + "; ".join(problems))

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def __repr__(self) -> str:  # never print the passwords
        return (
            f"SecuritySettings(security_protocol={self.security_protocol!r}, "
            f"sasl_mechanism={self.sasl_mechanism!r}, username={self.username!r}, "
            f"ssl_cafile={self.ssl_cafile!r}, ssl_certfile={self.ssl_certfile!r}, "
            f"ssl_keyfile={self.ssl_keyfile!r}, ssl_check_hostname={self.ssl_check_hostname})"
        )


def settings_problems(s: SecuritySettings) -> list[str]:
    """What is wrong with a combination of settings, one sentence each (empty when it is usable)."""
    if s.security_protocol not in PROTOCOLS:
        return [f"{PROTOCOL_ENV} must be one of {', '.join(PROTOCOLS)}, not {s.security_protocol!r}"]
    problems: list[str] = []
    sasl_given = _given(
        (MECHANISM_ENV, s.sasl_mechanism), (USERNAME_ENV, s.username), (PASSWORD_ENV, s.password)
    )
    ssl_given = _given(
        (CAFILE_ENV, s.ssl_cafile),
        (CERTFILE_ENV, s.ssl_certfile),
        (KEYFILE_ENV, s.ssl_keyfile),
        (KEY_PASSWORD_ENV, s.ssl_key_password),
    )
    if s.uses_sasl:
        if s.sasl_mechanism not in MECHANISMS:
            problems.append(
                f"{s.security_protocol} needs {MECHANISM_ENV}, one of {', '.join(MECHANISMS)} "
                f"(got {s.sasl_mechanism!r})"
            )
        if not s.username or s.password is None:
            problems.append(f"{s.security_protocol} needs {USERNAME_ENV} and {PASSWORD_ENV}")
    elif sasl_given:
        problems.append(_unused(sasl_given, s.security_protocol, "SASL_PLAINTEXT or SASL_SSL"))
    if not s.uses_ssl and ssl_given:
        problems.append(_unused(ssl_given, s.security_protocol, "SSL or SASL_SSL"))
    if (s.ssl_certfile is None) != (s.ssl_keyfile is None):
        problems.append(f"a client certificate needs both {CERTFILE_ENV} and {KEYFILE_ENV}")
    if s.ssl_key_password is not None and s.ssl_keyfile is None:
        problems.append(f"{KEY_PASSWORD_ENV} set without {KEYFILE_ENV}")
    return problems


def _given(*settings: tuple[str, str | None]) -> list[str]:
    """The names of the ``(name, value)`` settings that are set."""
    return [name for name, value in settings if value is not None]


def _unused(names: list[str], protocol: str, protocols: str) -> str:
    """The problem of settings that ``protocol`` does not use (``protocols`` would)."""
    return f"{', '.join(names)} set but {PROTOCOL_ENV} is {protocol}: use {protocols}, or unset them"


PLAINTEXT = SecuritySettings()
"""Nothing set: what every client did before security settings existed."""


def _parse_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SecurityConfigError(f"{name} must be true or false, not {text!r}")


def parse_settings(values: Mapping[str, str]) -> SecuritySettings:
    """Validated settings from ``SETTING_NAMES`` -> value (other names are ignored; empty = unset)."""
    given = {name: values[name] for name in SETTING_NAMES if values.get(name, "").strip() != ""}

    def text(name: str) -> str | None:
        value = given.get(name)
        return None if value is None else value.strip()

    mechanism = text(MECHANISM_ENV)
    return SecuritySettings(
        security_protocol=(text(PROTOCOL_ENV) or "PLAINTEXT").upper(),
        sasl_mechanism=mechanism.upper() if mechanism is not None else None,
        username=text(USERNAME_ENV),
        password=given.get(PASSWORD_ENV),  # a password is taken verbatim
        ssl_cafile=text(CAFILE_ENV),
        ssl_certfile=text(CERTFILE_ENV),
        ssl_keyfile=text(KEYFILE_ENV),
        ssl_key_password=given.get(KEY_PASSWORD_ENV),
        ssl_check_hostname=_parse_bool(CHECK_HOSTNAME_ENV, given[CHECK_HOSTNAME_ENV])
        if CHECK_HOSTNAME_ENV in given
        else True,
    )


def parse_config_file(text: str, *, source: str = "the Kafka config file") -> dict[str, str]:
    """``NAME=value`` lines (``#`` comments, blank lines, optional ``export``, optional quotes) -> dict.

    The names are those of the environment variables (``SETTING_NAMES``), so the same file also
    serves as a shell or Compose ``env_file``. An unknown name is an error (a typo is not ignored).
    """
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        name, sep, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if not sep:
            raise SecurityConfigError(f"{source}, line {number}: expected NAME=value, got {raw!r}")
        if name not in SETTING_NAMES:
            raise SecurityConfigError(
                f"{source}, line {number}: unknown setting {name!r}; known: {', '.join(SETTING_NAMES)}"
            )
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name] = value
    return values


def load_settings(environ: Mapping[str, str]) -> SecuritySettings:
    """Settings from ``environ`` over the file it names in ``KAFKA_CONFIG_FILE`` (if any)."""
    values: dict[str, str] = {}
    path = environ.get(CONFIG_FILE_ENV, "").strip()
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SecurityConfigError(f"cannot read the Kafka config file {path}: {exc}") from exc
        values.update(parse_config_file(text, source=path))
    values.update({name: environ[name] for name in SETTING_NAMES if environ.get(name, "").strip() != ""})
    settings = parse_settings(values)
    for name, file in (
        (CAFILE_ENV, settings.ssl_cafile),
        (CERTFILE_ENV, settings.ssl_certfile),
        (KEYFILE_ENV, settings.ssl_keyfile),
    ):
        if file is not None and not Path(file).is_file():
            raise SecurityConfigError(f"{name} names {file}, which is not a readable file")
    return settings


def current_security() -> SecuritySettings:
    """The process's settings (``os.environ`` and its ``KAFKA_CONFIG_FILE``); PLAINTEXT if none."""
    return load_settings(os.environ)


def librdkafka_config(s: SecuritySettings) -> dict[str, str]:
    """The confluent-kafka (librdkafka) keys for ``s``; empty for PLAINTEXT (librdkafka's default)."""
    if s.security_protocol == "PLAINTEXT":
        return {}
    config = {"security.protocol": s.security_protocol}
    if s.uses_sasl:
        assert s.sasl_mechanism is not None and s.username is not None and s.password is not None
        config.update(
            {"sasl.mechanism": s.sasl_mechanism, "sasl.username": s.username, "sasl.password": s.password}
        )
    if s.uses_ssl:
        config["ssl.endpoint.identification.algorithm"] = "https" if s.ssl_check_hostname else "none"
        optional = {
            "ssl.ca.location": s.ssl_cafile,
            "ssl.certificate.location": s.ssl_certfile,
            "ssl.key.location": s.ssl_keyfile,
            "ssl.key.password": s.ssl_key_password,
        }
        config.update({key: value for key, value in optional.items() if value is not None})
    return config


def ssl_context(s: SecuritySettings) -> ssl.SSLContext:
    """The TLS context aiokafka (the Faust worker) uses for ``s``: same CA, client cert and host check."""
    context = ssl.create_default_context(cafile=s.ssl_cafile)
    context.check_hostname = s.ssl_check_hostname
    if s.ssl_certfile is not None:
        context.load_cert_chain(s.ssl_certfile, s.ssl_keyfile, password=s.ssl_key_password)
    return context


def faust_credentials(s: SecuritySettings) -> CredentialsT | None:
    """Faust's ``broker_credentials`` for ``s`` (None for PLAINTEXT, Faust's default).

    Faust hands them to aiokafka, which speaks PLAIN and SCRAM-SHA-256/512 over SASL_PLAINTEXT or
    SASL_SSL (``faust.transport.drivers.aiokafka.credentials_to_aiokafka_auth``).
    """
    import faust

    if s.security_protocol == "PLAINTEXT":
        return None
    if s.security_protocol == "SSL":
        return faust.SSLCredentials(ssl_context(s))
    return faust.SASLCredentials(
        username=s.username,
        password=s.password,
        mechanism=s.sasl_mechanism,
        ssl_context=ssl_context(s) if s.uses_ssl else None,
    )


def add_kafka_config_argument(parser: argparse.ArgumentParser) -> None:
    """``--kafka-config FILE`` on a command that talks to Kafka (see ``apply_kafka_config``)."""
    parser.add_argument(
        "--kafka-config",
        metavar="FILE",
        default=None,
        help=f"Kafka security settings (TLS, SASL), NAME=value lines (default: ${CONFIG_FILE_ENV}; "
        "see README, 'Secured clusters')",
    )


def apply_kafka_config(path: str | None) -> SecuritySettings:
    """Make ``path`` (if given) this process's config file, for its clients and its children, and
    return the validated settings: a bad setting fails the command at once, not at first connect."""
    if path is not None:
        os.environ[CONFIG_FILE_ENV] = str(Path(path).expanduser().resolve())
    return current_security()
