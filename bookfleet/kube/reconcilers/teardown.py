"""Deleting a BookieCluster so that nothing waits for ever: what the chart's pre-delete hook runs.

No finalizer of this operator guards any work (kube.handlers: its loops hold none, the reconcilers are level-based
and keep nothing to clean up), so nothing here waits for an operator: kopf's finalizer, which operators before this
one put on BookieClusters, Bookies and Ledgers, is dropped before each delete, and what is deleted goes at once.
The Ledgers are read a page at a time and each page's Ledgers of the cluster deleted together, `BATCH` at once, so
100,000 of them fit the hook's memory and time; nothing is listed again but the cluster's few Bookies, which the
garbage collector deletes with their cluster. A Ledger resource is only a view: its ledger stays in ZooKeeper.
Volumes follow the cluster's whenDeleted policy (Retain, the default: PVCs have no owner and stay).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from bookfleet.kube import resources
from bookfleet.kube.runtime.api import CUSTOM, KubeApi

FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
"""kopf's finalizer, which handlers.py names explicitly so this module and kopf agree."""
BATCH = 32
"""Ledger DELETEs in flight at once: 100,000 in minutes, not one round trip after another."""


class Teardown(enum.StrEnum):
    ABSENT = "absent"
    DELETED = "deleted"
    """the cluster, its Bookies and its Ledgers are gone"""
    HELD = "held"
    """the cluster or a Bookie is still there after the timeout: a finalizer not this operator's holds it"""


def release(api: KubeApi, plural: str, body: dict) -> None:
    """Drop kopf's finalizer (others, if any, stay)."""
    if (patch := finalizer_release(body)) is not None:
        api.patch(CUSTOM, plural, body["metadata"]["namespace"], body["metadata"]["name"], patch)


def finalizer_release(body: dict) -> dict | None:
    """The merge patch that drops kopf's finalizer from the object, None if it has none."""
    finalizers = body["metadata"].get("finalizers") or []
    if FINALIZER not in finalizers:
        return None
    return {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER]}}


def released_and_deleted(api: KubeApi, plural: str, body: dict) -> bool:
    """Release the object, then delete it; whether there was something to delete."""
    release(api, plural, body)
    return api.delete(CUSTOM, plural, body["metadata"]["namespace"], body["metadata"]["name"])


def delete_ledgers(api: KubeApi, namespace: str, name: str) -> int:
    """Delete the Ledgers that name the cluster, page by page, each page's `BATCH` at once; how many were deleted."""
    deleted = 0
    with ThreadPoolExecutor(BATCH, thread_name_prefix="delete-ledgers") as pool:
        for page in api.pages(CUSTOM, "ledgers", namespace):
            ours = [ledger for ledger in page if (ledger.get("spec") or {}).get("cluster") == name]
            deleted += sum(pool.map(lambda ledger: released_and_deleted(api, "ledgers", ledger), ours))
    return deleted


def remaining(api: KubeApi, namespace: str, name: str) -> list[tuple[str, dict]]:
    """The cluster and its Bookies still present, as (plural, object)."""
    found = [("bookies", b) for b in api.list(CUSTOM, "bookies", namespace, {resources.LABEL_CLUSTER: name})]
    cluster = api.get(CUSTOM, "bookieclusters", namespace, name)
    return [("bookieclusters", cluster), *found] if cluster else found


def delete_cluster(api: KubeApi, namespace: str, name: str, timeout: float, interval: float = 1.0,
                   clock: Callable[[], float] = time.monotonic) -> Teardown:
    """Delete the BookieCluster, its Bookies and its Ledgers; return once the cluster and its Bookies are gone, or
    after `timeout` seconds if another finalizer still holds one (HELD)."""
    ledgers = delete_ledgers(api, namespace, name)
    found = remaining(api, namespace, name)
    if not found and not ledgers:
        return Teardown.ABSENT
    deadline = clock() + timeout
    while True:
        for plural, body in found:  # Bookies too: the garbage collector deletes them, an old finalizer holds them
            released_and_deleted(api, plural, body)
        if not (found := remaining(api, namespace, name)):
            return Teardown.DELETED
        if clock() >= deadline:
            return Teardown.HELD
        time.sleep(interval)
