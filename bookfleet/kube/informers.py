"""The operator's caches (Bookies, their pods and claims, BookieClusters, repair Jobs), kept by list-then-watch as
controller-runtime's informers keep theirs: every (re)list replaces the whole store, so an object deleted while
nobody watched is gone from the cache as well.

kopf's indexes cannot promise that. They are filled from watch events only, and kopf stops its watches while a
peered replica is paused: a pod deleted meanwhile stays in a resumed replica's index for ever, and a Bookie pass that
reads it waits for a pod that no longer exists (seen on the local cluster after an operator handover: a lost
bookie, repaired, never replaced). These caches run in their own threads whether the replica acts or not, so a
standby that takes over starts from what exists.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import sys
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence

from kazoo.client import KazooClient
from kazoo.recipe.watchers import ChildrenWatch
from kubernetes.client.exceptions import ApiException

from bookfleet.kube import api, bookies, clusters, repairs, resources, wakeups
from bookfleet.kube.api import KubeApi, WatchStream
from bookfleet.meta import zkpaths

WATCH_SECONDS = 300
"""How long one watch request lasts before it is renewed from the last resourceVersion seen."""
RELIST_BACKOFF = (1.0, 60.0)
"""The first and the longest wait before a failed informer lists again (doubling per failure in a row, jittered)."""
UNSERVED_RETRY_SECONDS = 60.0
"""How often a kind the API server does not serve (SparkApplication without the Spark operator) is looked for."""
SYNC_TIMEOUT = 120.0
"""How long a reader waits for the first list before its pass fails (and is retried at the next interval)."""
BY_BOOKIE_ID, BY_CLUSTER, BY_LOST_BOOKIE = "bookieId", "cluster", "lostBookie"
"""The caches' index names: a Bookie by its bookie id, Bookies and claims by their cluster, repairs by lost bookie."""
log = logging.getLogger(__name__)


Index = Callable[[dict], Hashable | None]
"""The key an object is filed under (None: not filed)."""
Changed = Callable[[dict, bool], None]
"""Told of each change: the object's body, and whether it was deleted."""
Kept = dict | str
"""What a store holds of an object: its body (as transformed), or only its resourceVersion (`versions_only`)."""


class Informer:
    """The objects of one kind matching a label selector, in the given namespaces (None: the whole cluster)."""

    def __init__(self, api: KubeApi, api_version: str, plural: str, labels: dict[str, str],
                 namespaces: Sequence[str] | None = None, changed: Changed | None = None,
                 indexes: Mapping[str, Index] | None = None, transform: Callable[[dict], dict] | None = None,
                 versions_only: bool = False):
        """`changed(body, deleted)` is called from the informer's thread after the store took each change (a
        deleted object's last body included), so whoever it wakes reads the new state; a re-list calls it only for
        the objects that went or changed meanwhile. `indexes` name the keys each object is filed under, kept with
        the store (client-go's Indexers), so `indexed(name, key)` costs no scan.

        `transform(body)`: what the informer takes in of each object listed or watched (controller-runtime's cache
        transform): the store holds it and `changed` gets it, so it must keep the metadata's namespace, name and
        resourceVersion and whatever the indexes, `changed` and the store's readers read.

        `versions_only`: the store holds only each object's resourceVersion (what a re-list compares), for a consumer
        that keeps its own view and never reads the store (`get` and a deletion a re-list finds give only the
        object's identity: namespace, name, resourceVersion; no indexes): 100,000 Ledgers' identities as dicts took
        ~35 MB. `changed` gets whole bodies, a list's as each page arrives (before the store took the list), so
        100,000 objects are never all held at once, here or there."""
        if versions_only and indexes:
            raise ValueError("an informer that keeps only versions has no bodies to index")
        self._api, self._api_version, self._plural = api, api_version, plural
        self._changed = changed or (lambda body, deleted: None)
        self._transform = transform or (lambda body: body)
        self._versions_only = self._hand_on_per_page = versions_only
        self._indexes = dict(indexes or {})
        self._filed: dict[str, dict[Hashable, dict[tuple[str, str], dict]]] = {name: {} for name in self._indexes}
        self._selector = ",".join(f"{key}={value}" for key, value in labels.items())
        self._scopes: Sequence[str | None] = tuple(namespaces) if namespaces else (None,)
        self._objects: dict[str | None, dict[tuple[str, str], Kept]] = {scope: {} for scope in self._scopes}
        self._synced = {scope: threading.Event() for scope in self._scopes}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._streams: dict[str | None, WatchStream] = {}
        self._threads = [threading.Thread(target=self._run, args=(scope,), daemon=True,
                                          name=f"informer-{plural}-{scope or 'all'}") for scope in self._scopes]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Ends the watch requests under way; the threads end with them."""
        self._stopped.set()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.close()

    def get(self, namespace: str, name: str) -> dict | None:
        """The object as last listed or watched; waits for the first list of its namespace."""
        scope = namespace if namespace in self._objects else None
        if scope not in self._synced:
            return None  # a namespace this operator does not watch
        self._wait_listed(scope)
        with self._lock:
            kept = self._objects[scope].get((namespace, name))
        return None if kept is None else self._as_body((namespace, name), kept)

    def indexed(self, index: str, key: Hashable) -> list[dict]:
        """The objects index `index` files under `key`, in every namespace; waits for the first list of each (an
        empty answer before it would read as "none exist": a cluster pass at start-up saw no Bookies). A kind the
        server does not serve counts as listed, with nothing in it."""
        for scope in self._scopes:
            self._wait_listed(scope)
        with self._lock:
            return list(self._filed[index].get(key, {}).values())

    def _wait_listed(self, scope: str | None) -> None:
        if not self._synced[scope].wait(SYNC_TIMEOUT):
            raise TimeoutError(f"{self._plural} in {scope or 'all namespaces'} not listed after {SYNC_TIMEOUT:.0f} s")

    def _kept(self, body: dict) -> Kept:
        """What the store holds of an object."""
        return (body["metadata"].get("resourceVersion") or "") if self._versions_only else body

    def _as_body(self, key: tuple[str, str], kept: Kept) -> dict:
        """A stored object as its readers get it."""
        if isinstance(kept, str):
            return {"metadata": {"namespace": key[0], "name": key[1], "resourceVersion": kept}}
        return kept

    def _file(self, body: Kept) -> None:
        for name, index in self._indexes.items():
            if (key := index(body)) is not None:
                self._filed[name].setdefault(key, {})[_key(body)] = body

    def _unfile(self, body: Kept) -> None:
        for name, index in self._indexes.items():
            if (key := index(body)) is not None and (filed := self._filed[name].get(key)) is not None:
                filed.pop(_key(body), None)
                if not filed:
                    del self._filed[name][key]

    def _put(self, scope: str | None, body: dict, deleted: bool = False) -> None:
        """Store one watched change (under the lock), its index entries with it."""
        if (old := self._objects[scope].pop(_key(body), None)) is not None:
            self._unfile(old)
        if not deleted:
            kept = self._objects[scope][_key(body)] = self._kept(body)
            self._file(kept)

    def _run(self, scope: str | None) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                version = self._list(scope)
                failures = 0
                self._watch(scope, version)
            except ApiException as exc:
                if exc.status == 404:  # not served: nothing of it exists, and nothing to wait for
                    self._synced[scope].set()
                    self._stopped.wait(UNSERVED_RETRY_SECONDS)
                else:
                    failures += 1
                    self._retry(scope, exc, failures)
            except Exception as exc:  # the API server restarting, a network blip: list again
                failures += 1
                self._retry(scope, exc, failures)

    def _retry(self, scope: str | None, exc: Exception, failures: int) -> None:
        if self._stopped.is_set():
            return
        delay = relist_delay(failures, random.random())
        log.warning("%s informer (%s): %s; listing again in %.1f s", self._plural, scope or "all namespaces", exc,
                    delay)
        self._stopped.wait(delay)

    def _list(self, scope: str | None) -> str:
        """Replace the store with a fresh list; returns the list's resourceVersion."""
        with self._lock:
            before = self._objects[scope]
        kept: dict[tuple[str, str], Kept] = {}
        changed: list[dict] = []
        token = ""
        while True:
            page = self._api.list_page(self._api_version, self._plural, scope, self._selector, token)
            for item in map(self._transform, page.get("items", [])):
                key = _key(item)
                kept[key] = self._kept(item)
                if _version(before.get(key)) != _version(kept[key]):
                    if self._hand_on_per_page:
                        self._changed(item, False)
                    else:
                        changed.append(item)
            token = page["metadata"].get("continue", "")
            if not token:
                break
        with self._lock:
            self._objects[scope] = kept
            for body in before.values():
                self._unfile(body)
            for body in kept.values():
                self._file(body)
        self._synced[scope].set()
        for key, body in before.items():
            if key not in kept:
                self._changed(self._as_body(key, body), True)
        for body in changed:
            self._changed(body, False)
        return page["metadata"]["resourceVersion"]

    def _watch(self, scope: str | None, version: str) -> None:
        """Apply watch events until the version is too old (410) or the informer stops."""
        while not self._stopped.is_set():
            stream = self._api.watch(self._api_version, self._plural, scope, self._selector, version, WATCH_SECONDS)
            with self._lock:
                self._streams[scope] = stream
                stopped = self._stopped.is_set()
            if stopped:  # stop() ran before the stream was there to close
                stream.close()
                return
            for event in stream:
                body = event["object"]
                if event["type"] == "ERROR":
                    raise ApiException(status=body.get("code"), reason=body.get("message"))
                version = body["metadata"].get("resourceVersion") or version
                if event["type"] == "BOOKMARK":
                    continue
                body = self._transform(body)
                deleted = event["type"] == "DELETED"
                with self._lock:
                    self._put(scope, body, deleted)
                self._changed(body, deleted)


class Caches:
    """What the operator's passes read instead of the API server: Bookies, their pods and claims, BookieClusters, and
    the repair Jobs and SparkApplications by lost bookie. A change wakes whoever depends on it: a Bookie or its
    registration in ZooKeeper its loop, a pod or claim its Bookie's and its cluster's loops, a cluster's new spec its
    loop, a repair the Ledgers it covers (`wake_repair`). Ledgers are watched here too, for `ledger_changed(body,
    deleted)` (kube.ledgerfeed keeps its own compact view of them, so their store holds only their names): kopf's
    per-object handling of 100,000 Ledgers' events was a third of the operator's CPU, and kopf stops watching on a
    paused peer, where these watches go on."""

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


def relist_delay(failures: int, draw: float) -> float:
    """The wait before listing again after `failures` failed lists or watches in a row (`draw` uniform in [0, 1)):
    doubling from RELIST_BACKOFF's first to its longest, each drawn from its upper half, so the informers of an
    operator (and every operator of a cluster) that lost the API server together do not list again together."""
    first, longest = RELIST_BACKOFF
    return min(longest, first * 2 ** (failures - 1)) * (0.5 + draw / 2)


def of_cluster(body: dict) -> tuple[str, str] | None:
    """The BookieCluster an object belongs to, by its cluster label."""
    name = (body["metadata"].get("labels") or {}).get(resources.LABEL_CLUSTER)
    return None if name is None else (body["metadata"]["namespace"], name)


def without_managed_fields(body: dict) -> dict:
    """The object without metadata.managedFields, the API server's record of which manager set which field: no
    pass reads it, and it was over half of a cached pod's, claim's or Bookie's memory (~50 KB of the ~90 KB a bookie
    cost in these caches)."""
    meta = body["metadata"]
    if "managedFields" not in meta:
        return body
    return {**body, "metadata": {key: value for key, value in meta.items() if key != "managedFields"}}


def bookie_pod_as_read(pod: dict) -> dict:
    """A bookie pod as the passes read it (kube.bookies, kube.clusters): its metadata and status, and of its spec
    only the node it runs on. The rest of the spec is the manifest the operator wrote (a rollout compares the
    digest annotated on the pod, not the spec), a third of a cached pod's memory."""
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


def _key(body: dict) -> tuple[str, str]:
    """(namespace, name), the namespace interned: a store's keys share one string per namespace ("" for an object of
    the whole cluster, a Node)."""
    return sys.intern(body["metadata"].get("namespace", "")), body["metadata"]["name"]


def _version(kept: Kept | None) -> str | None:
    if kept is None or isinstance(kept, str):
        return kept
    return kept["metadata"].get("resourceVersion")
