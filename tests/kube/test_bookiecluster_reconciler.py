"""The BookieCluster reconciler's whole pass against the API emulator and a real ZooKeeper: what it reads from the
operator's caches, and what it does when a cached Bookie is older than the last write to it (decisions alone:
test_bookiecluster_reconciler_decisions.py)."""

from __future__ import annotations

import collections

import pytest

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster
from bookfleet.kube.reconcilers import clusters
from bookfleet.kube.runtime import api
from bookfleet.kube.runtime.context import OperatorContext
from tests.emulator import EmulatorThread
from tests.fixtures.models import bookie_cluster

NS = "default"
SINCE = "2026-01-02T03:00:00Z"


class CountingApi(api.KubeApi):
    """The real client, counting its LISTs and GETs by kind."""

    def __init__(self) -> None:
        super().__init__()
        self.lists: collections.Counter[str] = collections.Counter()
        self.gets: collections.Counter[str] = collections.Counter()

    def list(self, api_version, plural, namespace, labels=None):
        self.lists[plural] += 1
        return super().list(api_version, plural, namespace, labels)

    def get(self, api_version, plural, namespace, name):
        self.gets[plural] += 1
        return super().get(api_version, plural, namespace, name)


def cached(*bookies: dict) -> clusters.ClusterSources:
    """The operator's caches holding these Bookies, no pods and no claims."""
    return clusters.ClusterSources(bookies=lambda namespace, name: list(bookies), pod=lambda namespace, name: None,
                                   claims=lambda namespace, name: [])


@pytest.fixture
def stored(kube: EmulatorThread, zk_connect: str):
    """A one-replica cluster in the emulator (TLS off: no certificates to issue); yields (its body, the API)."""
    api.load_config(str(kube.kubeconfig))
    cluster = bookie_cluster(1, name="bk", namespace=NS, uid=None, zookeeper=zk_connect, security={"tls": "Disabled"})
    body = kube.create("bookieclusters", cluster.to_wire(), NS)
    yield body, CountingApi(), BookieCluster.model_validate(body)


def test_a_cluster_pass_lists_nothing_its_caches_hold(stored, kube: EmulatorThread):
    """At 1,000 bookies the pass's two LISTs (Bookies, claims) added up: both come from the informers now."""
    body, kube_api, cluster = stored
    bookie = kube.create("bookies", resources.bookies_for_cluster(cluster)[0], NS)
    ctx = OperatorContext(kube_api)
    try:
        clusters.reconcile(ctx, body, cached(bookie))
    finally:
        ctx.close()
    assert kube_api.lists == {} and kube_api.gets == {}
    assert kube.get("bookieclusters", NS, "bk")["status"]["desiredBookies"] == 1  # the pass ran to its status


def test_a_drain_is_not_started_again_from_a_cached_copy_older_than_its_start(stored, kube: EmulatorThread):
    """bk-1 is beyond the replicas: its drain started at SINCE (annotated, read-only), but the cache still holds
    the copy from before. Started again from that copy, the drain's time (and the repair named after it) would
    move: the start is conditional on the version observed, so the pass meets 409 Conflict and runs again on live
    reads, which see the drain under way."""
    body, kube_api, _ = stored
    two = BookieCluster.model_validate({**body, "spec": {**body["spec"], "replicas": 2}})
    manifests = resources.bookies_for_cluster(two)
    kube.create("bookies", manifests[0], NS)
    before = kube.create("bookies", manifests[1], NS)
    kube.create("pods", resources.bookie_pod(two, Bookie.model_validate(before)), NS)  # it still runs: the drain waits
    kube.patch("bookies", NS, "bk-1", {"metadata": {"annotations": {clusters.ANNOTATION_DECOMMISSION_SINCE: SINCE}},
                                       "spec": {"desiredState": "ReadOnly"}})
    ctx = OperatorContext(kube_api)
    try:
        clusters.reconcile(ctx, body, cached(kube.get("bookies", NS, "bk-0"), before))
    finally:
        ctx.close()
    after = kube.get("bookies", NS, "bk-1")
    assert after is not None and after["metadata"]["annotations"][clusters.ANNOTATION_DECOMMISSION_SINCE] == SINCE
    assert kube_api.lists == {"bookies": 1, "persistentvolumeclaims": 1}  # the second pass, on live reads
