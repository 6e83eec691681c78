"""The operator's caches: the kinds it keeps by list-then-watch (kube.runtime.informers), filed by the keys its
passes look up, the sources each reconciler reads from them, and whose loop each change wakes. They sit above the
reconcilers, whose sources (`bookies.BookieSources`, `clusters.ClusterSources`) they fill, and below the handlers,
which start them with the operator.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Sequence

from kazoo.client import KazooClient
from kazoo.recipe.watchers import ChildrenWatch

from bookfleet.kube import resources
from bookfleet.kube.reconcilers import bookies, clusters, repairs
from bookfleet.kube.runtime import api, wakeups
from bookfleet.kube.runtime.api import KubeApi
from bookfleet.kube.runtime.informers import Informer, without_managed_fields
from bookfleet.meta import zkpaths

BY_BOOKIE_ID, BY_CLUSTER, BY_LOST_BOOKIE = "bookieId", "cluster", "lostBookie"
"""The caches' index names: a Bookie by its bookie id, Bookies and claims by their cluster, repairs by lost bookie."""


class Caches:
    """What the operator's passes read instead of the API server: Bookies, their pods and claims, BookieClusters, and
    the repair Jobs and SparkApplications by lost bookie. A change wakes whoever depends on it: a Bookie or its
    registration in ZooKeeper its loop, a pod or claim its Bookie's and its cluster's loops, a cluster's new spec its
    loop, a repair the Ledgers it covers (`wake_repair`). Ledgers are watched here too, for `ledger_changed(body,
    deleted)` (kube.runtime.ledgerfeed keeps its own compact view of them, so their store holds only their names):
    kopf's per-object handling of 100,000 Ledgers' events was a third of the operator's CPU, and kopf stops watching on
    a paused peer, where these watches go on."""

    def __init__(self, kube: KubeApi, namespaces: Sequence[str] | None, loop: asyncio.AbstractEventLoop,
                 loops: wakeups.Wakeups, wake_repair: Callable[[str, str, str], None],
                 ledger_changed: Callable[[dict, bool], None]):
        self._loop, self._loops, self._wake_repair = loop, loops, wake_repair
        self.bookies = Informer(kube, api.CUSTOM, "bookies", {}, namespaces, self._bookie_changed,
                                {BY_BOOKIE_ID: lambda body: (body.get("spec") or {}).get("bookieId"),
                                 BY_CLUSTER: of_cluster}, transform=without_managed_fields)
        self.pods = Informer(kube, api.CORE, "pods", resources.BOOKIE_POD_SELECTOR, namespaces, self._workload_changed,
                             transform=bookie_pod_as_read)
        self.claims = Informer(kube, api.CORE, "persistentvolumeclaims", resources.BOOKIE_POD_SELECTOR, namespaces,
                               self._workload_changed, {BY_CLUSTER: of_cluster}, transform=without_managed_fields)
        self.clusters = Informer(kube, api.CUSTOM, "bookieclusters", {}, namespaces, self._cluster_changed,
                                 transform=without_managed_fields)
        self.repairs = tuple(Informer(kube, version, plural, resources.REPAIR_SELECTOR, namespaces,
                                      self._repair_changed, {BY_LOST_BOOKIE: repairs.bookie_key},
                                      transform=without_managed_fields)
                             for version, plural in ((api.BATCH, "jobs"), (api.SPARK, "sparkapplications")))
        self.ledgers = Informer(kube, api.CUSTOM, "ledgers", {}, namespaces, ledger_changed, versions_only=True)
        self.nodes = Informer(kube, api.CORE, "nodes", {}, transform=node_as_read)
        self._all = (self.bookies, self.pods, self.claims, self.clusters, *self.repairs, self.ledgers, self.nodes)
        self._registrations: dict[tuple[KazooClient, str], set[str]] = {}
        self._registrations_lock = threading.Lock()
        self.bookie_sources = bookies.BookieSources(bookie=self.bookies.get, cluster=self.clusters.get,
                                                    pod=self.pods.get, claim=self.claims.get, node=self.nodes.get,
                                                    watch_registrations=self.watch_registrations)
        self.cluster_sources = clusters.ClusterSources(
            bookies=lambda namespace, name: self.bookies.indexed(BY_CLUSTER, (namespace, name)),
            pod=self.pods.get, claims=lambda namespace, name: self.claims.indexed(BY_CLUSTER, (namespace, name)))

    def start(self) -> None:
        for informer in self._all:
            informer.start()

    def stop(self) -> None:
        for informer in self._all:
            informer.stop()

    def repairs_of(self, key: repairs.BookieKey) -> list[dict]:
        return [job for informer in self.repairs for job in informer.indexed(BY_LOST_BOOKIE, key)]

    def watch_registrations(self, zk: KazooClient) -> None:
        """Watch which bookies are registered (writable and read-only) in this ZooKeeper, once per session holder:
        a bookie that registers, leaves or turns read-only wakes its Bookie, whose status shows it."""
        with self._registrations_lock:
            if (zk, zkpaths.AVAILABLE) in self._registrations:
                return
            for path in (zkpaths.AVAILABLE, zkpaths.READONLY):
                self._registrations[zk, path] = set()
        zk.ensure_path(zkpaths.READONLY)  # as a registering bookie does: a watch on a missing node would stop
        for path in (zkpaths.AVAILABLE, zkpaths.READONLY):
            ChildrenWatch(zk, path, functools.partial(self._registrations_changed, zk, path))

    def _registrations_changed(self, zk: KazooClient, path: str, children: list[str] | None) -> None:
        with self._registrations_lock:
            before, now = self._registrations[zk, path], set(children or ())
            self._registrations[zk, path] = now
        for bookie_id in before ^ now:
            for bookie in self.bookies.indexed(BY_BOOKIE_ID, bookie_id):
                self._wake("bookies", bookie)

    def _bookie_changed(self, bookie: dict, deleted: bool) -> None:
        self._wake("bookies", bookie)
        if deleted:
            self._end_loop("bookies", bookie)

    def _end_loop(self, plural: str, body: dict) -> None:
        meta = body["metadata"]
        self._loop.call_soon_threadsafe(self._loops.gone, (plural, meta["namespace"], meta["name"]), meta.get("uid"))

    def _wake(self, plural: str, body: dict) -> None:
        self._loop.call_soon_threadsafe(self._loops.wake, (plural, body["metadata"]["namespace"],
                                                           body["metadata"]["name"]))

    def _workload_changed(self, body: dict, deleted: bool) -> None:
        """A bookie's pod or claim: its Bookie's and its cluster's loops."""
        labels, namespace = body["metadata"].get("labels") or {}, body["metadata"]["namespace"]
        for plural, label in (("bookies", resources.LABEL_BOOKIE), ("bookieclusters", resources.LABEL_CLUSTER)):
            if name := labels.get(label):
                self._loop.call_soon_threadsafe(self._loops.wake, (plural, namespace, name))

    def _cluster_changed(self, cluster: dict, deleted: bool) -> None:
        """Only a new spec (generation) wakes the loop: its own status patches do not."""
        meta = cluster["metadata"]
        key = ("bookieclusters", meta["namespace"], meta["name"])
        self._loop.call_soon_threadsafe(self._loops.wake_on_new_generation, key, meta.get("generation"), deleted)
        if deleted:
            self._end_loop("bookieclusters", cluster)

    def _repair_changed(self, job: dict, deleted: bool) -> None:
        if key := repairs.bookie_key(job):
            self._wake_repair(*key)


def of_cluster(body: dict) -> tuple[str, str] | None:
    """The BookieCluster an object belongs to, by its cluster label."""
    name = (body["metadata"].get("labels") or {}).get(resources.LABEL_CLUSTER)
    return None if name is None else (body["metadata"]["namespace"], name)


def bookie_pod_as_read(pod: dict) -> dict:
    """A bookie pod as the passes read it (kube.reconcilers.bookies, kube.reconcilers.clusters): its metadata and
    status, and of its spec only the node it runs on. The rest of the spec is the manifest the operator wrote (a rollout
    compares the digest annotated on the pod, not the spec), a third of a cached pod's memory."""
    pod = without_managed_fields(pod)
    spec = pod.get("spec") or {}
    return {**pod, "spec": {"nodeName": spec["nodeName"]} if "nodeName" in spec else {}}


def node_as_read(node: dict) -> dict:
    """A Node as the passes read it: its name and its zone (a zone-less bookie takes its node's); its status, a
    heartbeat's worth of changes, is not kept."""
    meta = node["metadata"]
    zone = (meta.get("labels") or {}).get(resources.ZONE_LABEL)
    return {"metadata": {"name": meta["name"], "resourceVersion": meta.get("resourceVersion"),
                         "labels": {} if zone is None else {resources.ZONE_LABEL: zone}}}
