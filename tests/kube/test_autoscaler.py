"""The disk autoscaler's whole cluster pass against the API emulator and a real ZooKeeper: bookies whose
registrations report their ledger volumes past the add threshold raise the cluster's replicas, once (decisions
alone: test_autoscaler_decisions.py)."""

from __future__ import annotations

import copy

import pytest
from kubernetes.client.exceptions import ApiException

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster
from bookfleet.kube.reconcilers import autoscaler, clusters
from bookfleet.kube.runtime import api
from bookfleet.kube.runtime.context import OperatorContext
from bookfleet.meta import zkpaths
from bookfleet.meta.registry import BookieInfo
from tests.emulator import EmulatorThread
from tests.fixtures.models import bookie_cluster_manifest

NS = "default"


def test_bookies_past_the_add_threshold_raise_the_replicas_by_one(kube: EmulatorThread, zk_connect: str, zk):
    api.load_config(str(kube.kubeconfig))
    body = kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, autoscaling={
        "minReplicas": 3, "maxReplicas": 5, "scaleUpDiskUsage": 0.8, "scaleDownDiskUsage": 0.3}), NS)
    cluster = BookieCluster.model_validate(body)
    quota = resources.quantity_bytes(cluster.spec.storage.ledgers.size)
    for manifest, used in zip(resources.bookies_for_cluster(cluster), (0.5, 0.9, 0.6), strict=True):
        bookie = Bookie.model_validate(kube.create("bookies", manifest, NS))
        kube.create("pods", resources.bookie_pod(cluster, bookie), NS)
        kube.patch("pods", NS, bookie.metadata.name, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                   subresource="status")
        bookie_id = bookie.spec.bookie_id
        zk.create(zkpaths.available(bookie_id), BookieInfo(bookie_id=bookie_id, address="127.0.0.1:1",
                                                           free_bytes=round(quota * (1 - used))).encode(),
                  makepath=True)
    ctx = OperatorContext(api.KubeApi())
    stale = copy.deepcopy(body)
    try:
        clusters.reconcile(ctx, body)
        scaled = kube.get("bookieclusters", NS, "bk")
        assert scaled["spec"]["replicas"] == 4
        assert autoscaler.ANNOTATION_SCALED_AT in scaled["metadata"]["annotations"]
        events = [e for e in kube.list("events", NS) if e["reason"] == autoscaler.SCALED_UP]
        assert [e["message"] for e in events] == ["replicas 3 -> 4: bk-1 has used 90% of its ledger volume "
                                                  "(scaleUpDiskUsage 80%): one bookie more"]
        with pytest.raises(ApiException) as conflict:  # a copy from before the change: the pass fails, to be retried
            clusters.reconcile(ctx, stale)
        assert conflict.value.status == 409
        clusters.reconcile(ctx, kube.get("bookieclusters", NS, "bk"))
    finally:
        ctx.close()
    assert kube.get("bookieclusters", NS, "bk")["spec"]["replicas"] == 4, "bk-3 is not up yet: no second bookie"
    assert len([e for e in kube.list("events", NS) if e["reason"] == autoscaler.SCALED_UP]) == 1
    assert {b["metadata"]["name"] for b in kube.list("bookies", NS)} == {"bk-0", "bk-1", "bk-2", "bk-3"}
