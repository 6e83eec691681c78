"""The fleet's certificate authority and the certificates it issues, with the `cryptography` package.

A certificate's subject is the principal: `CN=<name>, OU=<role>[, OU=<role>...], O=bookfleet`. The roles a holder
has are its subject's OU values (see `bookfleet.security.roles`). A bookie's certificate also names its stable DNS
id (and loopback addresses for a standalone fleet) as subject alternative names, which clients verify.

A TLS directory holds `ca.pem`, `cert.pem` and `key.pem`; `write_tls_dir` replaces each file atomically, so a
process that reloads on change never reads half a file.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bookfleet.security.roles import Role
from bookfleet.security.tls import CA_FILE, CERT_FILE, KEY_FILE

ORGANIZATION = "bookfleet"
CLOCK_SKEW = datetime.timedelta(minutes=5)
"""Certificates start this long before they are issued, so a peer whose clock lags still accepts them."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    encoding, key_format = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    return key.private_bytes(encoding, key_format, serialization.NoEncryption())


@dataclass(frozen=True)
class IssuedCertificate:
    """A certificate with its private key and the CA certificate that signed it, all PEM."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    @property
    def not_after(self) -> datetime.datetime:
        return x509.load_pem_x509_certificate(self.cert_pem).not_valid_after_utc


class CertificateAuthority:
    """A self-signed CA that issues the fleet's certificates."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey):
        self.cert = cert
        self.key = key

    @classmethod
    def create(cls, name: str = "bookfleet CA", valid_for: datetime.timedelta = datetime.timedelta(days=3650)):
        key = _new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name), _organization()])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + valid_for)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key is not an elliptic-curve key")
        return cls(x509.load_pem_x509_certificate(cert_pem), key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def issue(
        self,
        name: str,
        roles: Iterable[Role],
        dns_names: Iterable[str] = (),
        valid_for: datetime.timedelta = datetime.timedelta(days=90),
        not_before: datetime.datetime | None = None,
    ) -> IssuedCertificate:
        """A certificate for `name` carrying `roles`; `dns_names` (host names or IP addresses) become SANs."""
        key = _new_key()
        start = not_before or _now() - CLOCK_SKEW
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
        subject += [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, str(role)) for role in roles]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([*subject, _organization()]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + valid_for)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        names = [_general_name(dns_name) for dns_name in dns_names]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return IssuedCertificate(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), self.cert_pem)


def _organization() -> x509.NameAttribute:
    return x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION)


def _key_usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=not ca, data_encipherment=False,
        key_agreement=False, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def write_tls_dir(directory: Path, issued: IssuedCertificate) -> Path:
    """Write `ca.pem`, `cert.pem` and `key.pem` (mode 0600) into `directory`; the key goes first, so a reader that
    sees a new certificate also finds its key."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomically(directory / KEY_FILE, issued.key_pem, 0o600)
    _write_atomically(directory / CERT_FILE, issued.cert_pem, 0o644)
    _write_atomically(directory / CA_FILE, issued.ca_pem, 0o644)
    return directory


def save_ca(directory: Path, ca: CertificateAuthority) -> None:
    """The CA's own files (`ca.pem`, `ca-key.pem`), kept by whoever issues certificates."""
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomically(directory / "ca-key.pem", ca.key_pem, 0o600)
    _write_atomically(directory / CA_FILE, ca.cert_pem, 0o644)


def load_or_create_ca(directory: Path) -> CertificateAuthority:
    """The CA kept in `directory`, created on first use, so a restarted standalone fleet keeps its certificates."""
    cert, key = directory / CA_FILE, directory / "ca-key.pem"
    if cert.exists() and key.exists():
        return CertificateAuthority.from_pem(cert.read_bytes(), key.read_bytes())
    ca = CertificateAuthority.create()
    save_ca(directory, ca)
    return ca
