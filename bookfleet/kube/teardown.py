"""Deleting a BookieCluster so that nothing waits for ever: what the chart's pre-delete hook runs.

kopf holds a finalizer on every object it runs a loop for, so a BookieCluster and its Bookies go only once an
operator has stopped those (Ledgers have none: kube.ledgerfeed; one made by an older operator keeps kopf's until an
operator passes it again). `helm uninstall` removes the operator's Deployment and RBAC
before custom resources; a cluster or Ledger deleted after that would stay Terminating for good (and its namespace
with it). So the hook deletes the cluster and its Ledgers first, while the operator still runs, and waits for them
and the Bookies to go. If no operator releases them in time (scaled to zero, crash-looping), it removes that
finalizer itself: the reconcilers are level-based and keep nothing to clean up, so the finalizer guards no work.
A Ledger resource is only a view: its ledger stays in ZooKeeper. Volumes follow the cluster's whenDeleted policy
either way (Retain, the default: PVCs have no owner and stay).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from bookfleet.kube import resources
from bookfleet.kube.api import CUSTOM, KubeApi

FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
"""kopf's finalizer, which handlers.py names explicitly so this module and kopf agree."""


class Teardown(enum.StrEnum):
    ABSENT = "absent"
    DELETED = "deleted"
    """the operator released the cluster and its Bookies"""
    FORCED = "forced"
    """no operator did in time: the finalizers were removed here"""


def ledgers(api: KubeApi, namespace: str, name: str) -> list[dict]:
    """The Ledgers that name the cluster."""
    return [ledger for ledger in api.list(CUSTOM, "ledgers", namespace)
            if (ledger.get("spec") or {}).get("cluster") == name]


def remaining(api: KubeApi, namespace: str, name: str) -> list[tuple[str, dict]]:
    """The cluster, its Bookies and its Ledgers still present, as (plural, object)."""
    found = [("bookies", b) for b in api.list(CUSTOM, "bookies", namespace, {resources.LABEL_CLUSTER: name})]
    found += [("ledgers", ledger) for ledger in ledgers(api, namespace, name)]
    cluster = api.get(CUSTOM, "bookieclusters", namespace, name)
    return [("bookieclusters", cluster), *found] if cluster else found


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


def delete_cluster(api: KubeApi, namespace: str, name: str, timeout: float, interval: float = 1.0,
                   clock: Callable[[], float] = time.monotonic) -> Teardown:
    """Delete the BookieCluster and its Ledgers and return once they and its Bookies are gone; after `timeout` seconds
    without an operator releasing them, release (and delete) them here, waiting at most as long again."""
    for ledger in ledgers(api, namespace, name):
        api.delete(CUSTOM, "ledgers", namespace, ledger["metadata"]["name"])
    if not api.delete(CUSTOM, "bookieclusters", namespace, name) and not remaining(api, namespace, name):
        return Teardown.ABSENT
    if wait_gone(api, namespace, name, timeout, interval, clock):
        return Teardown.DELETED
    for plural, body in remaining(api, namespace, name):
        release(api, plural, body)
        api.delete(CUSTOM, plural, namespace, body["metadata"]["name"])
    wait_gone(api, namespace, name, timeout, interval, clock)
    return Teardown.FORCED


def wait_gone(api: KubeApi, namespace: str, name: str, timeout: float, interval: float,
              clock: Callable[[], float]) -> bool:
    deadline = clock() + timeout
    while remaining(api, namespace, name):
        if clock() >= deadline:
            return False
        time.sleep(interval)
    return True
