"""One kind's objects kept by list-then-watch, as controller-runtime's informers keep theirs (which kinds the operator
keeps, and whom their changes wake, is kube.caches): every (re)list replaces the whole store, so an object deleted while
nobody watched is gone from the cache as well.

kopf's indexes cannot promise that. They are filled from watch events only, and kopf stops its watches while a
peered replica is paused: a pod deleted meanwhile stays in a resumed replica's index for ever, and a Bookie pass that
reads it waits for a pod that no longer exists (seen on the local cluster after an operator handover: a lost
bookie, repaired, never replaced). These caches run in their own threads whether the replica acts or not, so a
standby that takes over starts from what exists.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence

from kubernetes.client.exceptions import ApiException

from bookfleet.kube.runtime.api import KubeApi, WatchStream

WATCH_SECONDS = 300
"""How long one watch request lasts before it is renewed from the last resourceVersion seen."""
RELIST_BACKOFF = (1.0, 60.0)
"""The first and the longest wait before a failed informer lists again (doubling per failure in a row, jittered)."""
UNSERVED_RETRY_SECONDS = 60.0
"""How often a kind the API server does not serve (SparkApplication without the Spark operator) is looked for."""
SYNC_TIMEOUT = 120.0
"""How long a reader waits for the first list before its pass fails (and is retried at the next interval)."""
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


def relist_delay(failures: int, draw: float) -> float:
    """The wait before listing again after `failures` failed lists or watches in a row (`draw` uniform in [0, 1)):
    doubling from RELIST_BACKOFF's first to its longest, each drawn from its upper half, so the informers of an
    operator (and every operator of a cluster) that lost the API server together do not list again together."""
    first, longest = RELIST_BACKOFF
    return min(longest, first * 2 ** (failures - 1)) * (0.5 + draw / 2)


def without_managed_fields(body: dict) -> dict:
    """The object without metadata.managedFields, the API server's record of which manager set which field: no
    pass reads it, and it was over half of a cached pod's, claim's or Bookie's memory (~50 KB of the ~90 KB a bookie
    cost in these caches)."""
    meta = body["metadata"]
    if "managedFields" not in meta:
        return body
    return {**body, "metadata": {key: value for key, value in meta.items() if key != "managedFields"}}


def _key(body: dict) -> tuple[str, str]:
    """(namespace, name), the namespace interned: a store's keys share one string per namespace ("" for an object of
    the whole cluster, a Node)."""
    return sys.intern(body["metadata"].get("namespace", "")), body["metadata"]["name"]


def _version(kept: Kept | None) -> str | None:
    if kept is None or isinstance(kept, str):
        return kept
    return kept["metadata"].get("resourceVersion")
