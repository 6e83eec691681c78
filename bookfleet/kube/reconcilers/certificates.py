"""Certificates of a BookieCluster: which identities it needs, what to issue or renew (pure: `plan`), the Secret and
cert-manager Certificate manifests, and `ensure`, the one function the operator's reconcile pass calls.

Identities: one per bookie (role `bookie`, its stable DNS name as SAN), one replicator (repair drivers and their
executors) and one per client team the cluster's spec names (role `client`, `spec.security.clientCertificates`).
With `tls: Operator` the cluster's CA lives in the Secret `<cluster>-tls-ca` and the operator writes each identity's
Secret; with `tls: CertManager` cert-manager writes them from Certificates. Either way a Secret holds `ca.crt`,
`tls.crt`, `tls.key` (the kubernetes.io/tls layout cert-manager uses), mounted as the TLS directory (`ca.pem`,
`cert.pem`, `key.pem`). The kubelet refreshes mounted Secrets in place and bookies reload changed files,
so renewal needs no restart.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster, TlsMode
from bookfleet.kube.resources import (
    CA_KEY,
    CERT_KEY,
    KEY_KEY,
    bookie_secret_name,
    ca_secret_name,
    client_secret_name,
    replicator_secret_name,
)
from bookfleet.kube.runtime.api import CORE
from bookfleet.security.certs import CLOCK_SKEW, CertificateAuthority, IssuedCertificate
from bookfleet.security.roles import Role
from bookfleet.security.tls import bookie_host

CA_PRIVATE_KEY = "ca.key"
CERT_MANAGER_API = "cert-manager.io/v1"


@dataclass(frozen=True)
class Identity:
    """A certificate the cluster needs, and the Secret it lives in."""

    secret: str
    common_name: str
    roles: tuple[Role, ...]
    dns_names: tuple[str, ...] = ()


def identities(cluster: BookieCluster, bookies: list[Bookie]) -> list[Identity]:
    """The bookies' certificates (their DNS id, without the port), the replicator's and the client teams' (role
    client, named as spec.security.clientCertificates names them)."""
    needed = [
        Identity(bookie_secret_name(b.metadata.name), b.metadata.name, (Role.BOOKIE,), (bookie_host(b.spec.bookie_id),))
        for b in bookies
    ]
    name = cluster.metadata.name
    needed.append(Identity(replicator_secret_name(name), f"{name}-replicator", (Role.REPLICATOR,)))
    needed += [Identity(client_secret_name(name, client), client, (Role.CLIENT,))
               for client in cluster.spec.security.client_certificates]
    return needed


def _decoded(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    data = (secret or {}).get("data") or {}
    return {key: base64.b64decode(value) for key, value in data.items()}


def _current(identity: Identity, data: Mapping[str, bytes], ca_pem: bytes) -> x509.Certificate | None:
    """The identity's certificate if its Secret holds one for exactly this identity and this CA."""
    if not all(data.get(key) for key in (CA_KEY, CERT_KEY, KEY_KEY)) or data[CA_KEY] != ca_pem:
        return None
    return _certificate_for(identity, data[CERT_KEY])


@functools.lru_cache(maxsize=8192)
def _certificate_for(identity: Identity, cert_pem: bytes) -> x509.Certificate | None:
    """`cert_pem` parsed, if it names exactly `identity`: cached by content (a Secret's certificate changes only when
    it is issued again), so a pass over 1,000 bookies parses none it parsed before."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return None
    subject = cert.subject
    names = [a.value for a in subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
    units = sorted(a.value for a in subject.get_attributes_for_oid(x509.NameOID.ORGANIZATIONAL_UNIT_NAME))
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    except x509.ExtensionNotFound:
        sans = []
    if names != [identity.common_name] or units != sorted(identity.roles) or sorted(sans) != sorted(identity.dns_names):
        return None
    return cert


def plan(
    now: dt.datetime,
    needed: list[Identity],
    secrets: Mapping[str, Mapping[str, Any] | None],
    ca_pem: bytes,
    renew_before: dt.timedelta,
) -> list[Identity]:
    """The identities to issue now: no usable Secret yet (missing, other CA, other identity) or expiring within
    `renew_before`. `secrets` maps Secret names to the Secrets as the API returns them (None: absent)."""
    due = []
    for identity in needed:
        cert = _current(identity, _decoded(secrets.get(identity.secret)), ca_pem)
        if cert is None or cert.not_valid_after_utc - now <= renew_before:
            due.append(identity)
    return due


def _secret(cluster: BookieCluster, name: str, data: Mapping[str, bytes], secret_type: str) -> dict[str, Any]:
    meta = cluster.metadata
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": meta.namespace, "labels": resources.labels(meta.name, "tls")},
        "type": secret_type,
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }
    return resources.owned_by(manifest, cluster)


def ca_secret(cluster: BookieCluster, ca: CertificateAuthority) -> dict[str, Any]:
    return _secret(
        cluster, ca_secret_name(cluster.metadata.name), {CA_KEY: ca.cert_pem, CA_PRIVATE_KEY: ca.key_pem}, "Opaque"
    )


def identity_secret(cluster: BookieCluster, identity: Identity, issued: IssuedCertificate) -> dict[str, Any]:
    data = {CA_KEY: issued.ca_pem, CERT_KEY: issued.cert_pem, KEY_KEY: issued.key_pem}
    return _secret(cluster, identity.secret, data, "kubernetes.io/tls")


def cert_manager_certificate(cluster: BookieCluster, identity: Identity) -> dict[str, Any]:
    """A cert-manager Certificate that keeps `identity`'s Secret filled and renewed."""
    security = cluster.spec.security
    kind, _, issuer = (security.cert_manager_issuer or "").rpartition("/")
    manifest = {
        "apiVersion": CERT_MANAGER_API,
        "kind": "Certificate",
        "metadata": {
            "name": identity.secret,
            "namespace": cluster.metadata.namespace,
            "labels": resources.labels(cluster.metadata.name, "tls"),
        },
        "spec": {
            "secretName": identity.secret,
            "commonName": identity.common_name,
            "subject": {"organizationalUnits": [str(role) for role in identity.roles], "organizations": ["bookfleet"]},
            "dnsNames": list(identity.dns_names),
            "duration": f"{security.certificate_days * 24}h",
            "renewBefore": f"{security.renew_before_days * 24}h",
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
            "issuerRef": {"name": issuer, "kind": kind or "Issuer", "group": "cert-manager.io"},
        },
    }
    return resources.owned_by(manifest, cluster)


def ensure(api, cluster: BookieCluster, bookies: list[Bookie], now: dt.datetime) -> list[str]:
    """Issue or renew what `plan` says (Operator mode) or keep the Certificates in place (CertManager mode);
    returns the Secret names written."""
    security = cluster.spec.security
    needed = identities(cluster, bookies)
    if security.tls == TlsMode.DISABLED:
        return []
    if security.tls == TlsMode.CERT_MANAGER:
        for identity in needed:
            api.ensure(cert_manager_certificate(cluster, identity))
        return []
    namespace, name = cluster.metadata.namespace, cluster.metadata.name
    # A GET per Secret, never a LIST: the operator may not list the namespace's Secrets (the chart grants get only).

    def secret(secret_name: str) -> dict | None:
        return api.get(CORE, "secrets", namespace, secret_name)

    stored = secret(ca_secret_name(name))
    secrets = {identity.secret: secret(identity.secret) for identity in needed}
    renew_before = dt.timedelta(days=security.renew_before_days)
    due = plan(now, needed, secrets, _decoded(stored).get(CA_KEY, b""), renew_before)
    if not due:
        return []
    if stored is None:  # a CA key pair only when a certificate is issued and there is no CA yet
        stored, _ = api.ensure(ca_secret(cluster, CertificateAuthority.create(f"{name} bookfleet CA")))
    ca_data = _decoded(stored)
    ca = CertificateAuthority.from_pem(ca_data[CA_KEY], ca_data[CA_PRIVATE_KEY])
    written = []
    lifetime = dt.timedelta(days=security.certificate_days)
    for identity in plan(now, due, secrets, ca.cert_pem, renew_before):
        # Valid from the pass's own clock (the renewal decision reads the same one).
        issued = ca.issue(identity.common_name, identity.roles, identity.dns_names, lifetime, now - CLOCK_SKEW)
        manifest = identity_secret(cluster, identity, issued)
        if secrets[identity.secret] is None:
            api.ensure(manifest)
        else:
            api.patch(CORE, "secrets", namespace, identity.secret, {"data": manifest["data"]})
        written.append(identity.secret)
    return written
