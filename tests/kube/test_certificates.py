"""The operator's certificates: what to issue or renew given now and the Secrets (pure), the manifests that carry
them into pods and repair jobs, and `ensure` renewing before expiry."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from cryptography import x509

from bookfleet.kube import certificates, resources
from bookfleet.kube.models import Bookie, BookieCluster, cluster_problems
from bookfleet.security.certs import CertificateAuthority
from bookfleet.security.roles import Role
from bookfleet.security.tls import TLS_DIR_ENV, server_context
from tests.fixtures.models import bookie_cluster

NOW = dt.datetime(2026, 11, 26, 3, 0, tzinfo=dt.UTC)
RENEW = dt.timedelta(days=30)


def make_cluster(**security: Any) -> BookieCluster:
    return bookie_cluster(2, name="demo", namespace="storage", uid="cluster-uid",
                          security={"zookeeperAuthSecret": "zk-auth", **security})


def bookies_of(cluster: BookieCluster) -> list[Bookie]:
    created = resources.bookies_for_cluster(cluster)
    return [Bookie.model_validate({**m, "metadata": {**m["metadata"], "uid": f"u{n}"}}) for n, m in enumerate(created)]


class SecretStore:
    """The calls `certificates.ensure` makes, on a dict: an in-memory API for Secrets and Certificates."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}

    def ensure(self, manifest: dict) -> tuple[dict, bool]:
        key = (manifest["kind"], manifest["metadata"]["name"])
        created = key not in self.objects
        self.objects.setdefault(key, manifest)
        return self.objects[key], created

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict | None:
        assert plural == "secrets"
        return self.objects.get(("Secret", name))

    def patch(self, api_version: str, plural: str, namespace: str, name: str, patch: dict) -> dict:
        self.objects[("Secret", name)] = {**self.objects[("Secret", name)], **patch}
        return self.objects[("Secret", name)]

    def cert(self, secret: str) -> x509.Certificate:
        data = self.objects[("Secret", secret)]["data"]
        return x509.load_pem_x509_certificate(base64.b64decode(data[resources.CERT_KEY]))


def test_identities_are_one_per_bookie_and_a_replicator() -> None:
    cluster = make_cluster()
    needed = certificates.identities(cluster, bookies_of(cluster))
    assert [(i.secret, i.roles, i.dns_names) for i in needed] == [
        ("demo-0-tls", (Role.BOOKIE,), ("demo-0.demo-bookies.storage.svc",)),
        ("demo-1-tls", (Role.BOOKIE,), ("demo-1.demo-bookies.storage.svc",)),
        ("demo-tls-replicator", (Role.REPLICATOR,), ()),
    ]


def test_plan_issues_what_is_missing_foreign_changed_or_expiring() -> None:
    cluster = make_cluster()
    needed = certificates.identities(cluster, bookies_of(cluster))
    ca = CertificateAuthority.create()
    assert certificates.plan(NOW, needed, {}, ca.cert_pem, RENEW) == needed  # nothing yet

    def stored(identity, issuer=ca, days=90, start=NOW, **override) -> dict:
        fields = {"name": identity.common_name, "roles": identity.roles, "dns_names": identity.dns_names, **override}
        issued = issuer.issue(valid_for=dt.timedelta(days=days), not_before=start, **fields)
        return certificates.identity_secret(cluster, identity, issued)

    fresh = {i.secret: stored(i) for i in needed}
    assert certificates.plan(NOW, needed, fresh, ca.cert_pem, RENEW) == []
    assert certificates.plan(NOW + dt.timedelta(days=59), needed, fresh, ca.cert_pem, RENEW) == []
    assert certificates.plan(NOW + dt.timedelta(days=61), needed, fresh, ca.cert_pem, RENEW) == needed

    bookie0, bookie1, replicator = needed
    mixed = {
        **fresh,
        bookie0.secret: stored(bookie0, issuer=CertificateAuthority.create()),  # another CA
        replicator.secret: stored(replicator, roles=(Role.CLIENT,)),  # the wrong role
    }
    assert certificates.plan(NOW, needed, mixed, ca.cert_pem, RENEW) == [bookie0, replicator]
    moved = {**fresh, bookie1.secret: stored(bookie1, dns_names=("old-name.svc",))}
    assert certificates.plan(NOW, needed, moved, ca.cert_pem, RENEW) == [bookie1]


def test_ensure_issues_once_then_renews_before_expiry(tmp_path: Path) -> None:
    cluster = make_cluster(certificateDays=90, renewBeforeDays=30)
    bookies = bookies_of(cluster)
    api = SecretStore()
    assert certificates.ensure(api, cluster, bookies, NOW) == ["demo-0-tls", "demo-1-tls", "demo-tls-replicator"]
    first = api.cert("demo-0-tls")
    assert certificates.ensure(api, cluster, bookies, NOW + dt.timedelta(days=1)) == []
    renewed = certificates.ensure(api, cluster, bookies, NOW + dt.timedelta(days=61))
    assert renewed == ["demo-0-tls", "demo-1-tls", "demo-tls-replicator"]
    assert api.cert("demo-0-tls").serial_number != first.serial_number
    assert api.cert("demo-0-tls").issuer == first.issuer  # same CA: peers keep trusting each other

    # the Secret, mounted as a directory, is a TLS directory a bookie serves from
    secret = api.objects[("Secret", "demo-0-tls")]
    for key, value in secret["data"].items():
        (tmp_path / key).write_bytes(base64.b64decode(value))
    assert isinstance(server_context(tmp_path).context, ssl.SSLContext)


def test_a_pass_with_nothing_to_issue_parses_nothing_new_and_makes_no_ca_key(monkeypatch) -> None:
    """At 1,000 bookies a pass had parsed every certificate and generated a throwaway CA key pair: now certificates
    are parsed once per content, and a CA made only when one is issued and none exists. (Secrets are still read one
    by one: the operator may not list a namespace's Secrets.)"""
    cluster = make_cluster()
    api = SecretStore()
    certificates.ensure(api, cluster, bookies_of(cluster), NOW)  # issues them
    certificates.ensure(api, cluster, bookies_of(cluster), NOW)  # reads them back
    created, parsed = [], []
    monkeypatch.setattr(certificates.CertificateAuthority, "create", lambda *a: created.append(a))
    load = x509.load_pem_x509_certificate
    monkeypatch.setattr(certificates.x509, "load_pem_x509_certificate", lambda pem: parsed.append(pem) or load(pem))
    for day in range(3):
        assert certificates.ensure(api, cluster, bookies_of(cluster), NOW + dt.timedelta(days=day)) == []
    assert (created, parsed) == ([], [])


def test_cert_manager_mode_creates_certificates_instead() -> None:
    cluster = make_cluster(tls="CertManager", certManagerIssuer="ClusterIssuer/fleet-ca")
    api = SecretStore()
    assert certificates.ensure(api, cluster, bookies_of(cluster), NOW) == []
    certificate = api.objects[("Certificate", "demo-0-tls")]
    assert certificate["spec"]["issuerRef"] == {"name": "fleet-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert certificate["spec"]["subject"]["organizationalUnits"] == ["bookie"]
    assert certificate["spec"]["dnsNames"] == ["demo-0.demo-bookies.storage.svc"]
    assert certificate["spec"]["renewBefore"] == "720h"
    assert cluster_problems(make_cluster(tls="CertManager").spec) == [
        "security.tls CertManager needs security.certManagerIssuer"
    ]


def test_disabled_mode_issues_nothing_and_mounts_nothing() -> None:
    cluster = make_cluster(tls="Disabled")
    api = SecretStore()
    assert certificates.ensure(api, cluster, bookies_of(cluster), NOW) == []
    assert api.objects == {}
    pod = resources.bookie_pod(cluster, bookies_of(cluster)[0])
    assert "--tls-dir" not in pod["spec"]["containers"][0]["command"]
    assert "tls" not in {v["name"] for v in pod["spec"]["volumes"]}


def test_pods_and_repairs_get_their_tls_directory_and_zookeeper_credential() -> None:
    cluster = make_cluster()
    bookie = bookies_of(cluster)[1]
    pod = resources.bookie_pod(cluster, bookie)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    container = pod["spec"]["containers"][0]
    assert container["command"][container["command"].index("--tls-dir") + 1] == resources.TLS_DIR
    assert {"name": "tls", "mountPath": resources.TLS_DIR, "readOnly": True} in container["volumeMounts"]
    assert {"name": "tls", "secret": {"secretName": "demo-1-tls", "defaultMode": 0o440}} in pod["spec"]["volumes"]
    zk_auth = {"name": "BOOKFLEET_ZK_AUTH", "valueFrom": {"secretKeyRef": {"name": "zk-auth", "key": "auth"}}}
    assert container["env"] == [zk_auth]

    job = resources.repair_job(cluster, bookie, NOW)
    kubernetes_validate.validate(job, "1.30", strict=True)
    spec = job["spec"]["template"]["spec"]
    driver = spec["containers"][0]
    assert {"name": TLS_DIR_ENV, "value": resources.TLS_DIR} in driver["env"] and zk_auth in driver["env"]
    assert [v for v in spec["volumes"] if "secret" in v] == [
        {"name": "tls", "secret": {"secretName": "demo-tls-replicator", "defaultMode": 0o440}}
    ]
    command = " ".join(driver["command"])
    assert f"spark.kubernetes.executor.secrets.demo-tls-replicator={resources.TLS_DIR}" in command
    assert f"spark.executorEnv.{TLS_DIR_ENV}={resources.TLS_DIR}" in command
    assert "spark.kubernetes.executor.secretKeyRef.BOOKFLEET_ZK_AUTH=zk-auth:auth" in command


@pytest.mark.parametrize("days, renew", [(30, 30), (10, 20)])
def test_renewal_must_come_before_expiry(days: int, renew: int) -> None:
    problems = cluster_problems(make_cluster(certificateDays=days, renewBeforeDays=renew).spec)
    assert problems == [f"security.renewBeforeDays ({renew}) must be less than certificateDays ({days})"]
