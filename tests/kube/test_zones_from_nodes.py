"""A cluster that lists no zones on a real kube-apiserver whose nodes carry zone labels: a bookie's pod bound to a
node gives the bookie that node's zone, read from the operator's Node cache (decisions alone:
test_bookie_reconciler_decisions.py)."""

from __future__ import annotations

import kubernetes

from bookfleet.kube import caches, resources
from bookfleet.kube.reconcilers import bookies, clusters
from bookfleet.kube.runtime import informers
from bookfleet.kube.runtime.api import CORE, CUSTOM
from bookfleet.kube.runtime.context import OperatorContext
from bookfleet.polling import wait_for
from tests.fixtures.apiserver import install_crds
from tests.fixtures.models import bookie_cluster_manifest

NS = "default"
ZONES = {"node-a": "zone-a", "node-b": "zone-b"}


def test_a_bookie_bound_to_a_zoned_node_is_started_again_in_that_zone(api_server, zk_connect):
    api = install_crds(api_server)
    core = kubernetes.client.CoreV1Api(api.client)
    for node, zone in ZONES.items():
        core.create_node({"metadata": {"name": node, "labels": {resources.ZONE_LABEL: zone}}})
        core.patch_node_status(node, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    nodes = informers.Informer(api, CORE, "nodes", {}, transform=caches.node_as_read)
    nodes.start()
    ctx = OperatorContext(api)
    try:
        cluster = api.create(bookie_cluster_manifest(zk_connect, replicas=1))
        clusters.reconcile(ctx, cluster)
        sources = bookies.BookieSources.live(api)
        sources = bookies.BookieSources(sources.bookie, sources.cluster, sources.pod, sources.claim, nodes.get)
        bookie = api.get(CUSTOM, "bookies", NS, "bk-0")
        assert bookie is not None and "zone" not in bookie["spec"]
        bookies.reconcile(ctx, bookie, sources)
        first = api.get(CORE, "pods", NS, "bk-0")
        assert first is not None and "--zone" not in first["spec"]["containers"][0]["command"]
        # The scheduler's step (the pod's claims have no volume here, so it would not place it): bound to node-b.
        core.create_namespaced_binding(NS, {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bk-0"},
                                            "target": {"apiVersion": "v1", "kind": "Node", "name": "node-b"}},
                                       _preload_content=False)
        wait_for(lambda: nodes.get("", "node-b"), 30, "node-b in the Node cache")
        bookies.reconcile(ctx, bookie, sources)
        assert api.get(CUSTOM, "bookies", NS, "bk-0")["spec"]["zone"] == "zone-b"
        bound = api.get(CORE, "pods", NS, "bk-0")
        assert bound is not None and bound["metadata"].get("deletionTimestamp"), "restarted before it registers"
        api.delete(CORE, "pods", NS, "bk-0", grace_period_seconds=0)  # the kubelet's part, on a node without one
        bookies.reconcile(ctx, bookie, sources)
        again = api.get(CORE, "pods", NS, "bk-0")
        assert again is not None and again["metadata"]["uid"] != first["metadata"]["uid"]
        command = again["spec"]["containers"][0]["command"]
        assert command[command.index("--zone") + 1] == "zone-b"
        (term,) = again["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert {"key": resources.ZONE_LABEL, "operator": "In", "values": ["zone-b"]} in term["matchExpressions"]
        reasons = {e["reason"] for e in api.list(CORE, "events", NS)}
        assert "ZoneFromNode" in reasons
    finally:
        ctx.close()
        nodes.stop()
