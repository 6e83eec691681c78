"""Caches of bookie pods and claims kept by list-then-watch, as controller-runtime's informers keep theirs: every
(re)list replaces the whole store, so an object deleted while nobody watched is gone from the cache as well.

kopf's indexes cannot promise that. They are filled from watch events only, and kopf stops its watches while a
peered replica is paused: a pod deleted meanwhile stays in a resumed replica's index for ever, and a Bookie pass that
reads it waits for a pod that no longer exists (seen on the local cluster after an operator handover: a lost
bookie, repaired, never replaced). These caches run in their own threads whether the replica acts or not, so a
standby that takes over starts from what exists.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from kubernetes.client.exceptions import ApiException

from bookfleet.kube.api import KubeApi

WATCH_SECONDS = 300
"""How long one watch request lasts before it is renewed from the last resourceVersion seen."""
RETRY_SECONDS = 2.0
SYNC_TIMEOUT = 120.0
"""How long a reader waits for the first list before its pass fails (and is retried at the next interval)."""
log = logging.getLogger(__name__)


class Informer:
    """The objects of one kind matching a label selector, in the given namespaces (None: the whole cluster)."""

    def __init__(self, api: KubeApi, api_version: str, plural: str, labels: dict[str, str],
                 namespaces: Sequence[str] | None = None, changed: Callable[[dict], None] | None = None):
        """`changed(body)` is called from the informer's thread after the store took each change (a deleted
        object's last body included), so whoever it wakes reads the new state."""
        self._api, self._api_version, self._plural = api, api_version, plural
        self._changed = changed or (lambda body: None)
        self._selector = ",".join(f"{key}={value}" for key, value in labels.items())
        self._scopes: Sequence[str | None] = tuple(namespaces) if namespaces else (None,)
        self._objects: dict[str | None, dict[tuple[str, str], dict]] = {scope: {} for scope in self._scopes}
        self._synced = {scope: threading.Event() for scope in self._scopes}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(scope,), daemon=True,
                                          name=f"informer-{plural}-{scope or 'all'}") for scope in self._scopes]

    def start(self) -> Informer:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """The threads end when their current watch request does (at most WATCH_SECONDS): they are daemons."""
        self._stopped.set()

    def get(self, namespace: str, name: str) -> dict | None:
        """The object as last listed or watched; waits for the first list of its namespace."""
        scope = namespace if namespace in self._objects else None
        if scope not in self._synced:
            return None  # a namespace this operator does not watch
        if not self._synced[scope].wait(SYNC_TIMEOUT):
            raise TimeoutError(f"{self._plural} in {namespace} not listed after {SYNC_TIMEOUT:.0f} s")
        with self._lock:
            return self._objects[scope].get((namespace, name))

    def _run(self, scope: str | None) -> None:
        while not self._stopped.is_set():
            try:
                self._watch(scope, self._list(scope))
            except Exception as exc:  # the API server restarting, a network blip: list again
                log.warning("%s informer (%s): %s; listing again", self._plural, scope or "all namespaces", exc)
                self._stopped.wait(RETRY_SECONDS)

    def _list(self, scope: str | None) -> str:
        """Replace the store with a fresh list; returns the list's resourceVersion."""
        listed: dict[tuple[str, str], dict] = {}
        token = ""
        while True:
            page = self._api.list_page(self._api_version, self._plural, scope, self._selector, token)
            listed.update({_key(item): item for item in page.get("items", [])})
            token = page["metadata"].get("continue", "")
            if not token:
                break
        with self._lock:
            gone = [body for key, body in self._objects[scope].items() if key not in listed]
            self._objects[scope] = listed
        self._synced[scope].set()
        for body in [*gone, *listed.values()]:
            self._changed(body)
        return page["metadata"]["resourceVersion"]

    def _watch(self, scope: str | None, version: str) -> None:
        """Apply watch events until the version is too old (410) or the informer stops."""
        while not self._stopped.is_set():
            for event in self._api.watch(self._api_version, self._plural, scope, self._selector, version,
                                         WATCH_SECONDS):
                body = event["object"]
                if event["type"] == "ERROR":
                    raise ApiException(status=body.get("code"), reason=body.get("message"))
                version = body["metadata"].get("resourceVersion") or version
                if event["type"] == "BOOKMARK":
                    continue
                with self._lock:
                    if event["type"] == "DELETED":
                        self._objects[scope].pop(_key(body), None)
                    else:
                        self._objects[scope][_key(body)] = body
                self._changed(body)


def _key(body: dict) -> tuple[str, str]:
    return body["metadata"]["namespace"], body["metadata"]["name"]
