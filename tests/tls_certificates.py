"""Certificates for the TLS tests, made at test time with `cryptography` (none is committed).

A `CertificateAuthority` signs the embedded broker's certificate (for 127.0.0.1 and localhost) and
clients' certificates; any of them can be made already expired. Keys are EC P-256 (fast to make),
written as unencrypted PKCS#8 PEM, the form Kafka's PEM keystore, librdkafka and Python's ssl all read.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)
CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=False, content_commitment=False, key_encipherment=False, data_encipherment=False,
    key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
)  # fmt: skip
"""A CA signs certificates (and revocation lists), nothing else."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    certificate: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path


def _write_certificate(certificate: x509.Certificate, path: Path) -> Path:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


class CertificateAuthority:
    """A self-signed CA in ``directory`` (``<name>-ca.pem``) that issues leaf certificates there."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(f"{name} CA"))
            .issuer_name(_name(f"{name} CA"))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(CA_KEY_USAGE, critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.certificate = _write_certificate(self._certificate, directory / f"{name}-ca.pem")

    def issue(self, name: str, *, server: bool, expired: bool = False) -> Issued:
        """A leaf certificate for a broker (``server``: valid for 127.0.0.1 and localhost) or a client;
        ``expired``: its validity ended an hour ago."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        end = now - datetime.timedelta(hours=1) if expired else now + VALIDITY
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(end - VALIDITY)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
        certificate = builder.sign(self._key, hashes.SHA256())
        return Issued(
            _write_certificate(certificate, self.directory / f"{name}.pem"),
            _write_key(key, self.directory / f"{name}-key.pem"),
        )
