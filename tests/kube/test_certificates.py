"""The operator's certificates: what to issue or renew given now and the Secrets (pure), the manifests that carry
them into pods and repair jobs, and `ensure` renewing before expiry."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from cryptography import x509

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster, cluster_problems
from bookfleet.kube.reconcilers import certificates
from bookfleet.security.certs import CertificateAuthority
from bookfleet.security.roles import Role
from bookfleet.security.tls import TLS_DIR_ENV, server_context
from tests.fixtures.models import bookie_cluster
from tests.fixtures.secrets import SecretStore

NOW = dt.datetime(2026, 11, 26, 3, 0, tzinfo=dt.UTC)
RENEW = dt.timedelta(days=30)


def make_cluster(**security: Any) -> BookieCluster:
    return bookie_cluster(2, name="demo", namespace="storage", uid="cluster-uid",
                          security={"zookeeperAuthSecret": "zk-auth", **security})


def bookies_of(cluster: BookieCluster) -> list[Bookie]:
    created = resources.bookies_for_cluster(cluster)
    return [Bookie.model_validate({**m, "metadata": {**m["metadata"], "uid": f"u{n}"}}) for n, m in enumerate(created)]


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
    assert isinstance(server_context(api.mount("demo-0-tls", tmp_path / "tls")).context, ssl.SSLContext)


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


def test_a_client_team_named_in_the_spec_gets_a_client_role_certificate_renewed_like_the_bookies() -> None:
    """spec.security.clientCertificates: one Secret per name, role client only (no bookie or replicator rights), of
    the cluster's CA; renewed before expiry; a name dropped from the list is no longer renewed."""
    cluster = make_cluster(clientCertificates=["billing"])
    bookies = bookies_of(cluster)
    (client,) = [i for i in certificates.identities(cluster, bookies) if i.roles == (Role.CLIENT,)]
    assert (client.secret, client.common_name, client.dns_names) == ("demo-tls-client-billing", "billing", ())
    api = SecretStore()
    assert "demo-tls-client-billing" in certificates.ensure(api, cluster, bookies, NOW)
    cert = api.cert("demo-tls-client-billing")
    assert cert.issuer == api.cert("demo-0-tls").issuer
    assert [a.value for a in cert.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATIONAL_UNIT_NAME)] == ["client"]
    assert certificates.ensure(api, cluster, bookies, NOW + dt.timedelta(days=61)) == [
        "demo-0-tls", "demo-1-tls", "demo-tls-replicator", "demo-tls-client-billing"]
    dropped = make_cluster()
    assert certificates.ensure(api, dropped, bookies, NOW + dt.timedelta(days=122)) == [
        "demo-0-tls", "demo-1-tls", "demo-tls-replicator"]
    with pytest.raises(ValueError, match="duplicate entries: billing"):
        make_cluster(clientCertificates=["billing", "billing"])
    with pytest.raises(ValueError, match="should match pattern"):
        make_cluster(clientCertificates=["Billing Team"])


def test_cert_manager_issues_a_client_teams_certificate_where_it_is_the_issuer() -> None:
    cluster = make_cluster(tls="CertManager", certManagerIssuer="fleet-ca", clientCertificates=["billing"])
    api = SecretStore()
    certificates.ensure(api, cluster, bookies_of(cluster), NOW)
    spec = api.objects[("Certificate", "demo-tls-client-billing")]["spec"]
    assert (spec["secretName"], spec["commonName"], spec["subject"]["organizationalUnits"], spec["dnsNames"]) == (
        "demo-tls-client-billing", "billing", ["client"], [])
    assert "client auth" in spec["usages"]


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
