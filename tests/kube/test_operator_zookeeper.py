"""The operator's ZooKeeper sessions against a real ZooKeeper: each cluster writes with its own credential, and over
TLS when it names a ZooKeeper TLS Secret."""

from __future__ import annotations

import base64
import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import NoAuthError

from bookfleet.kube import resources
from bookfleet.kube.models import BookieCluster
from bookfleet.kube.reconcilers import ledgerscan
from bookfleet.kube.reconcilers.clusters import ConfigureAutoRecovery
from bookfleet.kube.reconcilers.repairs import remaining_ledgers
from bookfleet.kube.runtime import api
from bookfleet.kube.runtime.context import CredentialMissing, OperatorContext, ZooKeeperTarget, ZooKeeperUnavailable
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.security.certs import CertificateAuthority, IssuedCertificate, write_tls_dir
from bookfleet.security.tls import tls_files
from bookfleet.zkserver import ZooKeeperServer, free_port
from tests.fixtures.kube import NS
from tests.fixtures.models import bookie_cluster, bookie_cluster_manifest
from tests.fixtures.zookeeper import count_requests

CREDENTIALS = {"alpha-zk": "alpha:secret-a", "beta-zk": "beta:secret-b"}


class SecretsApi:
    """The credential Secrets of the clusters, as the API server would return them."""

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert plural == "secrets" and namespace == "ns"
        auth = CREDENTIALS.get(name)
        return None if auth is None else {"data": {"auth": base64.b64encode(auth.encode()).decode()}}

    def post_event(self, *event: Any) -> None:
        raise AssertionError(f"no Event is posted while sessions are opened: {event}")


def test_each_cluster_locks_its_nodes_to_its_own_credential(zk_connect, zk, monkeypatch):
    """Three clusters on one ZooKeeper (own chroots): two with their own credentials, one open. Whatever credential
    the operator's process has, each cluster's nodes are readable with its own credential only (none: by anyone)."""
    monkeypatch.setenv(zkclient.ZK_AUTH_ENV, CREDENTIALS["alpha-zk"])  # the process's own must never leak in
    for chroot in ("/alpha", "/beta", "/open"):
        zk.ensure_path(chroot)
    clusters = [bookie_cluster(name=name, namespace="ns", uid=None, zookeeper=f"{zk_connect}/{name}",
                               security={"zookeeperAuthSecret": secret})
                for name, secret in (("alpha", "alpha-zk"), ("beta", "beta-zk"), ("open", None))]
    ctx = OperatorContext(SecretsApi())  # type: ignore[arg-type]
    try:
        for each in clusters:
            ConfigureAutoRecovery(ZooKeeperTarget.of(each), True, 42).apply(ctx, {})
    finally:
        ctx.close()
    for each, owner in zip(clusters, ["alpha:secret-a", "beta:secret-b", zkclient.NO_AUTH], strict=True):
        with zkclient.session(each.spec.zookeeper, auth=owner) as session:
            assert UnderReplication(session).recovery_delay() == 42
        for other in {"alpha:secret-a", "beta:secret-b"} - {owner}:
            with zkclient.session(each.spec.zookeeper, auth=other) as session:
                if owner:
                    with pytest.raises(NoAuthError):
                        UnderReplication(session).recovery_delay()
                else:
                    assert UnderReplication(session).recovery_delay() == 42


def test_one_connect_string_with_two_credentials_gets_two_sessions(zk_connect):
    ctx = OperatorContext(SecretsApi())  # type: ignore[arg-type]
    try:
        alpha = ctx.zk(ZooKeeperTarget(zk_connect, "ns", "alpha-zk"))
        beta = ctx.zk(ZooKeeperTarget(zk_connect, "ns", "beta-zk"))
        assert alpha is not beta
        assert alpha is ctx.zk(ZooKeeperTarget(zk_connect, "ns", "alpha-zk"))
        with pytest.raises(CredentialMissing, match="ns/missing"):
            ctx.zk(ZooKeeperTarget(zk_connect, "ns", "missing"))
    finally:
        ctx.close()


def test_a_zookeeper_that_never_answers_holds_up_no_other_clusters_session(zk_connect):
    """A pass waiting for one cluster's unreachable ZooKeeper holds no lock another cluster's session needs, and a
    pass that must not wait is refused at once."""
    ctx = OperatorContext(SecretsApi())  # type: ignore[arg-type]
    nowhere = ZooKeeperTarget(f"127.0.0.1:{free_port()}", "ns")
    refused: list[Exception] = []

    def wait_for_nowhere() -> None:
        try:
            ctx.zk(nowhere, wait=5)
        except ZooKeeperUnavailable as unavailable:
            refused.append(unavailable)
    waiting = threading.Thread(target=wait_for_nowhere)
    try:
        waiting.start()
        assert ctx.zk(ZooKeeperTarget(zk_connect, "ns")).connected
        assert waiting.is_alive()  # the other session opened while this one still waits
        with pytest.raises(ZooKeeperUnavailable, match="no live session"):
            ctx.zk(nowhere, wait=0)
        waiting.join()
        assert len(refused) == 1
    finally:
        ctx.close()


def test_what_a_lost_or_draining_bookie_still_holds_reads_no_marker(zk, monkeypatch):
    """remaining_ledgers, asked on every pass of a lost or draining bookie, reads the metadata only: the markers
    (a repair storm's thousands) are never walked, and a ledger the bookie was swapped out of no longer needs it
    even while its marker waits on another bookie."""
    store, markers = MetadataStore(zk), UnderReplication(zk)
    on_it = [store.create(new_metadata(["gone:1", "b:1", "c:1"], 3, 2)) for _ in range(3)]
    elsewhere = [store.create(new_metadata(["d:1", "b:1", "c:1"], 3, 2)) for _ in range(20)]
    markers.mark_all(elsewhere, ["d:1"], lost=True)
    markers.mark_all(on_it, ["gone:1"], lost=True)
    swapped = on_it.pop()  # a repair replaced gone:1, but the marker still waits on b:1, also missing
    metadata, version = store.read(swapped)
    store.update(swapped, metadata.with_replaced_bookie(0, 0, "e:1"), version)
    markers.mark(swapped, ["b:1"])

    requests = count_requests(zk, monkeypatch)
    assert remaining_ledgers(zk, "gone:1", dt.datetime.now(dt.UTC)) == sorted(on_it)
    assert requests and not [request for request in requests if "underreplication" in repr(request)]


def test_one_scan_serves_every_bookies_pass_begun_after_what_each_waits_for(zk, monkeypatch):
    """A zone's repairs end together: the passes of its lost bookies share one scan of the metadata (not one each,
    ~400 requests at 100,000 ledgers), as long as it began after the moment each pass needs it to have (its repair's
    end); a ledger moved after a scan began makes the next pass that needs it scan again, and see it moved."""
    store = MetadataStore(zk)
    ledgers = {bookie: store.create(new_metadata([bookie, "b:1", "c:1"], 3, 2)) for bookie in ("x:1", "y:1", "z:1")}
    repairs_ended = dt.datetime.now(dt.UTC) - 2 * ledgerscan.CLOCK_MARGIN
    requests = count_requests(zk, monkeypatch)
    assert [remaining_ledgers(zk, bookie, repairs_ended) for bookie in ledgers] == [[ledger] for ledger in
                                                                                   ledgers.values()]
    one_scan = len(requests)
    assert one_scan and [remaining_ledgers(zk, "x:1", repairs_ended) for _ in range(5)] and len(requests) == one_scan

    moved = ledgers["x:1"]  # a later repair swaps x:1 out
    metadata, version = store.read(moved)
    store.update(moved, metadata.with_replaced_bookie(0, 0, "e:1"), version)
    assert remaining_ledgers(zk, "x:1", repairs_ended) == [moved], "an older scan shows more left, never fewer"
    assert remaining_ledgers(zk, "x:1", dt.datetime.now(dt.UTC)) == []
    assert len(requests) > one_scan


def tls_secret(name: str, issued: IssuedCertificate) -> dict[str, Any]:
    """A kubernetes.io/tls Secret holding `issued`, as a user (or cert-manager) writes one."""
    data = {resources.CA_KEY: issued.ca_pem, resources.CERT_KEY: issued.cert_pem, resources.KEY_KEY: issued.key_pem}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "kubernetes.io/tls",
            "data": {key: base64.b64encode(value).decode() for key, value in data.items()}}


def test_a_cluster_with_a_zookeeper_tls_secret_speaks_tls_and_one_without_is_refused(kube, tmp_path, monkeypatch):
    """Against a ZooKeeper that serves only TLS and needs a client certificate (as `standalone --secure` runs it),
    with the Secret read from the API emulator: the cluster naming a Secret of that ZooKeeper's CA writes its
    settings over TLS; a cluster on the same connect string without one gets no session, neither the TLS one (the
    setting is part of the session's key) nor the process's $BOOKFLEET_ZK_TLS_DIR; a renewed Secret is what the
    session's files hold at its next read."""
    ca = CertificateAuthority.create()
    server_dir = write_tls_dir(tmp_path / "server", ca.issue("zookeeper", [], ("127.0.0.1", "localhost")))
    process_dir = write_tls_dir(tmp_path / "process", ca.issue("process", []))
    monkeypatch.setenv(zkclient.ZK_TLS_DIR_ENV, str(process_dir))  # the process's own must never leak in
    api.load_config(str(kube.kubeconfig))
    kube.create("secrets", tls_secret("zk-client", ca.issue("bookfleet", [])), NS)
    with ZooKeeperServer(tmp_path / "zookeeper", tls_dir=server_dir) as server:
        secure, plain = (BookieCluster.model_validate(kube.create("bookieclusters", bookie_cluster_manifest(
            server.connect, name=name, security=security), NS)) for name, security in (
                ("secure", {"tls": "Disabled", "zookeeperTlsSecret": "zk-client"}), ("plain", {"tls": "Disabled"})))
        ctx = OperatorContext(api.KubeApi(), zookeeper_tls_refresh=0)
        try:
            ConfigureAutoRecovery(ZooKeeperTarget.of(secure), True, 42).apply(ctx, {})
            with pytest.raises(ZooKeeperUnavailable, match="over plain TCP"):
                ctx.zk(ZooKeeperTarget.of(plain), wait=3)
            renewed = ca.issue("bookfleet", [])
            kube.patch("secrets", NS, "zk-client", {"data": tls_secret("zk-client", renewed)["data"]})
            _, cert, _ = tls_files(Path(ctx.zookeeper_tls(ZooKeeperTarget.of(secure))))
            assert cert.read_bytes() == renewed.cert_pem
        finally:
            ctx.close()
        with zkclient.session(server.connect, tls_dir=process_dir) as session:
            assert UnderReplication(session).recovery_delay() == 42
