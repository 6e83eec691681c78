"""What the operator's caches (kube/caches.py) keep of each object: everything a pass or a wake-up reads, not the
API server's managedFields nor a bookie pod's spec beyond its node (most of their memory at 1,000 bookies). Pure
checks of the transforms on server-shaped bodies, then an informer with a transform on the API emulator: its store
and whoever it tells get the trimmed body, for the same changes as before."""

from __future__ import annotations

import copy
import datetime as dt
import threading
from typing import Any

from bookfleet.kube import caches, resources
from bookfleet.kube.models import Bookie
from bookfleet.kube.reconcilers import bookies, clusters
from bookfleet.kube.runtime import api, informers
from bookfleet.kube.runtime.context import timestamp
from tests.emulator import EmulatorThread
from tests.fixtures.kube import NS
from tests.fixtures.models import bookie_cluster
from tests.kube.test_informers import BlippingApi, wait_for

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
MANAGED_FIELDS = [{"manager": "bookfleet-operator", "operation": "Apply", "apiVersion": "v1",
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {}}},
                  {"manager": "kubelet", "operation": "Update", "subresource": "status",
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}]


def stored(manifest: dict[str, Any], uid: str) -> dict[str, Any]:
    """`manifest` as the API server hands it back: uid, resourceVersion and managedFields added."""
    body = copy.deepcopy(manifest)
    body["metadata"].update(uid=uid, resourceVersion="7", managedFields=copy.deepcopy(MANAGED_FIELDS))
    return body


def bookie_body(ordinal: int = 0) -> dict[str, Any]:
    return stored(resources.bookies_for_cluster(bookie_cluster(ordinal + 1))[ordinal], f"b{ordinal}")


def server_pod(ready: bool, body: dict[str, Any] | None = None, restarts: int = 0, draining: bool = False,
               deleted: bool = False) -> dict[str, Any]:
    """A bookie pod as listed: its manifest (of the default cluster's spec) scheduled on a node, with a status."""
    body = body or bookie_body()
    pod = stored(resources.bookie_pod(bookie_cluster(), Bookie.model_validate(body)), f"p-{body['metadata']['name']}")
    pod["spec"]["nodeName"] = "node-a"
    if deleted:
        pod["metadata"]["deletionTimestamp"] = timestamp(NOW)
    conditions = [{"type": "Ready", "status": str(ready), "lastTransitionTime": timestamp(NOW)}]
    if draining:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"})
    pod["status"] = {"phase": "Running", "conditions": conditions, "podIP": "10.0.0.1",
                     "containerStatuses": [{"name": resources.BOOKIE, "restartCount": restarts, "ready": ready,
                                            "state": {"running": {"startedAt": timestamp(NOW)}}}]}
    return pod


def test_a_cached_bookie_pod_keeps_its_metadata_status_and_node_and_nothing_else():
    whole = server_pod(ready=False, restarts=2, draining=True, deleted=True)
    before = copy.deepcopy(whole)
    kept = caches.bookie_pod_as_read(whole)
    assert whole == before  # what the watch handed over is not changed under anyone
    assert "managedFields" not in kept["metadata"]
    assert kept["metadata"] == {key: value for key, value in whole["metadata"].items() if key != "managedFields"}
    assert kept["status"] == whole["status"]
    assert kept["spec"] == {"nodeName": "node-a"}
    unscheduled = server_pod(ready=False)
    del unscheduled["spec"]["nodeName"]
    assert caches.bookie_pod_as_read(unscheduled)["spec"] == {}


def test_the_pod_readers_of_both_passes_answer_alike_from_the_cached_pod():
    for whole in (server_pod(ready=True), server_pod(ready=False, restarts=3), server_pod(ready=False, draining=True),
                  server_pod(ready=True, deleted=True)):
        kept = caches.bookie_pod_as_read(whole)
        for read in (bookies.pod_ready, bookies.pod_failed, bookies.ready_condition, bookies.planned_disruption,
                     bookies.restarts, clusters.pod_hash, lambda pod: bookies.not_ready_since(pod, NOW),
                     lambda pod: (pod["spec"]["nodeName"], pod["metadata"]["uid"], pod["metadata"]["labels"])):
            assert read(kept) == read(whole)


def test_a_rollout_decides_alike_from_cached_pods():
    """The rollout compares the digest annotated on each pod with the spec's, never the pod's spec itself."""
    cluster = bookie_cluster(2, image="bookfleet/bookie:next")  # the pods run the default cluster's spec
    members = [bookie_body(ordinal) for ordinal in range(2)]

    def rollout(as_cached: bool) -> Any:
        pods = [server_pod(ready=True, body=body) for body in members]
        return clusters.decide_rollout(cluster, [
            clusters.Member(body, caches.bookie_pod_as_read(pod) if as_cached else pod, registered=True,
                            forced_read_only=False) for body, pod in zip(members, pods, strict=True)], {}, NOW)
    cached = rollout(as_cached=True)
    assert cached == rollout(as_cached=False)
    assert cached[1].restarting == "bk-0"


def test_a_cached_claim_or_bookie_drops_only_managed_fields():
    claim = stored(resources.bookie_pvcs(bookie_cluster(), Bookie.model_validate(bookie_body()))[0], "c0")
    claim["status"] = {"phase": "Bound", "capacity": {"storage": "10Gi"}}
    for whole in (claim, bookie_body()):
        before = copy.deepcopy(whole)
        kept = informers.without_managed_fields(whole)
        assert whole == before
        del before["metadata"]["managedFields"]
        assert kept == before
        assert informers.without_managed_fields(kept) is kept  # nothing to drop: no copy


def test_a_cached_node_keeps_its_name_and_zone_and_the_pass_reads_the_zone_from_it():
    """Node status (conditions, images, addresses) changes with every heartbeat's news: only the zone is kept."""
    node = stored({"metadata": {"name": "node-a", "labels": {resources.ZONE_LABEL: "zone-b", resources.HOSTNAME_LABEL:
                                                              "node-a"}},
                   "status": {"conditions": [{"type": "Ready", "status": "True"}], "images": [{"names": ["x"]}]}},
                  "n0")
    kept = caches.node_as_read(node)
    assert kept == {"metadata": {"name": "node-a", "resourceVersion": "7", "labels": {resources.ZONE_LABEL: "zone-b"}}}
    bound = caches.bookie_pod_as_read(server_pod(ready=False))
    assert bookies.node_zone(lambda namespace, name: kept if name == bound["spec"]["nodeName"] else None,
                             bound) == "zone-b"
    unlabelled = caches.node_as_read(stored({"metadata": {"name": "node-a"}}, "n1"))
    assert bookies.node_zone(lambda namespace, name: unlabelled, bound) is None


def test_a_transformed_store_and_whoever_it_tells_get_the_trimmed_body_for_the_same_changes(kube: EmulatorThread):
    """List, watch and a re-list after a lost watch: each change is told once as before, and what is told and what
    the store holds is the trimmed pod (a wake-up reads its labels, a pass its status and node)."""
    api.load_config(str(kube.kubeconfig))
    labels = {**resources.BOOKIE_POD_SELECTOR, resources.LABEL_CLUSTER: "bk", resources.LABEL_BOOKIE: "bk-0"}
    for name in ("kept", "deleted"):
        pod = server_pod(ready=True)
        pod["metadata"] = {"name": name, "namespace": NS, "labels": labels, "managedFields": MANAGED_FIELDS}
        kube.create("pods", pod, NS)

    def meanwhile() -> None:
        kube.delete("pods", NS, "deleted")
    told: list[tuple[str, bool, dict]] = []
    lock = threading.Lock()

    def changed(body: dict, deleted: bool) -> None:
        with lock:
            told.append((body["metadata"]["name"], deleted, body))
    informer = informers.Informer(BlippingApi(meanwhile), api.CORE, "pods", resources.BOOKIE_POD_SELECTOR, [NS],
                                  changed, transform=caches.bookie_pod_as_read)
    informer.start()
    try:
        wait_for(lambda: len(told) >= 3)  # the first list's two, then the re-list's deletion
        kube.patch("pods", NS, "kept", {"status": {"phase": "Failed"}}, subresource="status")
        wait_for(lambda: len(told) >= 4)
        assert [(name, deleted) for name, deleted, _ in told[2:]] == [("deleted", True), ("kept", False)]
        assert sorted(name for name, _, _ in told[:2]) == ["deleted", "kept"]
        for _, _, body in told:
            assert "managedFields" not in body["metadata"] and body["spec"] == {"nodeName": "node-a"}
            assert body["metadata"]["labels"] == labels
        cached = informer.get(NS, "kept")
        assert cached is told[3][2] and cached["status"]["phase"] == "Failed"
        assert informer.get(NS, "deleted") is None
    finally:
        informer.stop()
