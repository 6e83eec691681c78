"""kopf registrations only: every handler hands the object to a plain domain module.

Level-based throughout: loops and passes re-derive everything from Kubernetes and ZooKeeper on each pass, so a
restarted operator resumes where the previous one stopped. Bookie pods are watched by label, with no finalizers on
them: their events only wake their Bookie's and their cluster's loops. Ledgers have no timer and no finalizer:
kube.ledgerfeed wakes each one when something it mirrors changed.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

import kopf
import kubernetes

from bookfleet.kube import (
    api,
    bookies,
    clusters,
    informers,
    ledgerfeed,
    ledgers,
    metrics,
    repairs,
    resources,
    teardown,
    wakeups,
)
from bookfleet.kube.context import OperatorContext, ZooKeeperTarget
from bookfleet.kube.models import GROUP, VERSION

INTERVAL = float(os.environ.get("BOOKFLEET_OPERATOR_INTERVAL", "10"))
"""Seconds between reconciliations of each resource (set by `bookfleet operator --interval`)."""
KUBECONFIG = os.environ.get("BOOKFLEET_KUBECONFIG") or None
ZK_OVERRIDE = os.environ.get("BOOKFLEET_OPERATOR_ZK") or None
NAMESPACES = [ns for ns in os.environ.get("BOOKFLEET_OPERATOR_NAMESPACES", "").split(",") if ns] or None
"""The namespaces the operator watches (`bookfleet operator --namespace`); None: the whole cluster."""
LEDGER_RESYNC = float(os.environ.get("BOOKFLEET_LEDGER_RESYNC", str(60 * INTERVAL)))
"""Seconds between the resyncs of each cluster's Ledgers (what no watch covers); Ledgers otherwise wait on changes."""

_context: OperatorContext | None = None
WAKEUPS = wakeups.Wakeups()
CLUSTERS = wakeups.ObjectCache()
log = logging.getLogger(__name__)


def context() -> OperatorContext:
    """Created after login, when the kubernetes client knows where the API server is."""
    global _context
    if _context is None:
        _context = OperatorContext(api.KubeApi(), ZK_OVERRIDE)
    return _context


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # our own Events say what happened; kopf's per-handler ones are noise
    settings.watching.server_timeout = 300
    settings.watching.chunk_size = 500  # the start-up LIST in pages: 100,000 Ledgers are not one response
    settings.persistence.finalizer = teardown.FINALIZER  # named, so the chart's uninstall hook can release it


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """The kubeconfig given to the operator (tests, development), else the pod's service account."""
    api.load_config(KUBECONFIG)
    config = kubernetes.client.Configuration.get_default_copy()
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization") or ""
    scheme, _, token = header.rpartition(" ")
    return kopf.ConnectionInfo(
        server=config.host, ca_path=config.ssl_ca_cert, insecure=not config.verify_ssl, scheme=scheme or None,
        token=token or None, certificate_path=config.cert_file, private_key_path=config.key_file,
    )


@kopf.on.cleanup()
def close(**_: Any) -> None:
    if _context is not None:
        _context.close()
    for informer in _informers or ():
        informer.stop()


def _one_pass(plural: str, reconcile: Callable[[OperatorContext, dict], float | None], body: kopf.Body,
              ) -> Callable[[], float | None]:
    def one_pass() -> float | None:
        """A failed pass is logged and retried at the interval, as kopf does for a timer."""
        try:
            with metrics.reconciling(plural):
                return reconcile(context(), dict(body))
        except Exception:
            meta = body["metadata"]
            log.exception("reconciling %s %s/%s failed", plural, meta["namespace"], meta["name"])
            return None
    return one_pass


@kopf.daemon(GROUP, VERSION, "bookieclusters", cancellation_backoff=60, cancellation_timeout=10)
async def run_cluster(body: kopf.Body, namespace: str, name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """A loop per BookieCluster: a pass when one of its bookie pods changes (a rollout's next step starts as soon as
    the restarted bookie is Ready), else every INTERVAL seconds."""
    await wakeups.run_loop(WAKEUPS, ("bookieclusters", namespace, name), _one_pass(
        "bookieclusters", lambda ctx, cluster: clusters.reconcile(ctx, cluster, _pod), body), stopped, INTERVAL)


@kopf.on.startup()
async def start_informers(**_: Any) -> None:
    """Bookie pods and claims, listed then watched from here on, whether this replica acts or not (kube.informers).
    A pod's change wakes its Bookie's and its cluster's loops once the cache holds it."""
    global _informers
    api.load_config(KUBECONFIG)
    loop = asyncio.get_running_loop()

    def pod_changed(pod: dict) -> None:
        loop.call_soon_threadsafe(_wake_for_pod, pod["metadata"])
    _informers = (
        informers.Informer(context().api, api.CORE, "pods", resources.BOOKIE_POD_SELECTOR, NAMESPACES, pod_changed),
        informers.Informer(context().api, api.CORE, "persistentvolumeclaims", resources.BOOKIE_POD_SELECTOR,
                           NAMESPACES))
    for informer in _informers:
        informer.start()


def _wake_for_pod(meta: dict) -> None:
    """On the event loop: a bookie pod created, changed or deleted wakes its Bookie's and its cluster's loops."""
    labels = meta.get("labels") or {}
    if bookie := labels.get(resources.LABEL_BOOKIE):
        WAKEUPS.wake(("bookies", meta["namespace"], bookie))
    if cluster := labels.get(resources.LABEL_CLUSTER):
        WAKEUPS.wake(("bookieclusters", meta["namespace"], cluster))


def _pod(namespace: str, name: str) -> dict | None:
    assert _informers is not None, "started with the operator"
    return _informers[0].get(namespace, name)


def _bookie_sources() -> bookies.BookieSources:
    """A Bookie pass reads its cluster, pod and claims from caches (no GET); a cluster not yet in the cache is read
    with a GET."""
    assert _informers is not None, "started with the operator"

    def cluster(namespace: str, name: str) -> dict | None:
        return CLUSTERS.get(namespace, name) or context().api.get(api.CUSTOM, "bookieclusters", namespace, name)
    return bookies.BookieSources(cluster=cluster, pod=_pod, claim=_informers[1].get)


_informers: tuple[informers.Informer, informers.Informer] | None = None


@kopf.daemon(GROUP, VERSION, "bookies", cancellation_backoff=60, cancellation_timeout=10)
async def run_bookie(body: kopf.Body, namespace: str, name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """A loop per Bookie: a pass when its pod changes (a pod that stops being Ready on a failed node is seen at once)
    and when a recovery delay ends, else every INTERVAL seconds."""
    await wakeups.run_loop(WAKEUPS, ("bookies", namespace, name), _one_pass(
        "bookies", lambda ctx, bookie: bookies.reconcile(ctx, bookie, _bookie_sources()), body), stopped, INTERVAL)


def _by_bookie(body: kopf.Body) -> dict[repairs.BookieKey, dict]:
    """Also wakes the Ledgers the repair may cover: their status shows its state."""
    key = repairs.bookie_key(dict(body))
    if key is None:
        return {}
    FEED.wake_repair(*key)
    return {key: dict(body)}


@kopf.index("batch", "v1", "jobs", labels=resources.REPAIR_SELECTOR)
def repair_jobs_by_bookie(body: kopf.Body, **_: Any) -> dict[repairs.BookieKey, dict]:
    return _by_bookie(body)


@kopf.index("sparkoperator.k8s.io", "v1beta2", "sparkapplications", labels=resources.REPAIR_SELECTOR)
def spark_repairs_by_bookie(body: kopf.Body, **_: Any) -> dict[repairs.BookieKey, dict]:
    return _by_bookie(body)


def _reconcile_ledger(key: ledgerfeed.LedgerKey, body: dict | None) -> bool:
    """One Ledger pass, on the feed's worker thread: the body its watch event brought, else a fresh GET."""
    if body is None and (body := context().api.get(api.CUSTOM, "ledgers", *key)) is None:
        return False  # deleted meanwhile
    with metrics.reconciling("ledgers"):
        return ledgers.reconcile(context(), body, ledgers.LedgerSources(CLUSTERS.get, _repairs_of, FEED.watch_metadata))


def _repairs_of(key: repairs.BookieKey) -> list[dict]:
    """Repair state from the two indexes below (kept from the watch): no LIST per Ledger."""
    indexes = _repair_indexes
    return [] if indexes is None else [job for index in indexes for job in index.get(key, ())]


_repair_indexes: tuple[kopf.Index, kopf.Index] | None = None


def _zookeeper_of(namespace: str, cluster: str) -> ZooKeeperTarget | None:
    """The cluster's ZooKeeper and credential (from the BookieClusters' watch): the feed watches each once."""
    body = CLUSTERS.get(namespace, cluster)
    return None if body is None else ZooKeeperTarget(
        body["spec"]["zookeeper"], namespace, (body["spec"].get("security") or {}).get("zookeeperAuthSecret"))


FEED = ledgerfeed.LedgerFeed(_reconcile_ledger, _zookeeper_of, lambda target: context().zk(target),
                             resync=LEDGER_RESYNC, retry=INTERVAL)


@kopf.on.startup()
def start_ledger_feed(**_: Any) -> None:
    FEED.start()


@kopf.on.cleanup()
def stop_ledger_feed(**_: Any) -> None:
    FEED.stop()


@kopf.on.event(GROUP, VERSION, "ledgers")
def ledger_event(event: kopf.RawEvent, repair_jobs_by_bookie: kopf.Index, spark_repairs_by_bookie: kopf.Index,
                 **_: Any) -> None:
    """Ledgers are watched, not timed: a new Ledger or a new spec wakes its pass (kube.ledgerfeed); no finalizer. A
    deleted Ledger leaves the feed and the operator's ledger-health gauges."""
    global _repair_indexes
    _repair_indexes = (repair_jobs_by_bookie, spark_repairs_by_bookie)
    body, deleted = event["object"], event["type"] == "DELETED"
    if deleted:
        metrics.LEDGERS.forget(body["metadata"]["namespace"], body["metadata"]["name"])
    elif target := _zookeeper_of(body["metadata"]["namespace"], (body.get("spec") or {}).get("cluster", "")):
        FEED.watch_zookeeper(target)
    FEED.ledger_changed(body, deleted=deleted)


@kopf.on.event(GROUP, VERSION, "bookieclusters")
async def cluster_event(event: kopf.RawEvent, **_: Any) -> None:
    """A new spec (generation) wakes the cluster's loop: settings reach ZooKeeper and rollouts start at once. Its
    own status patches do not (they leave the generation as it is). Every event refreshes the cluster cache the
    Ledger passes read."""
    meta = event["object"]["metadata"]
    CLUSTERS.update(event["object"], deleted=event["type"] == "DELETED")
    WAKEUPS.wake_on_new_generation(("bookieclusters", meta["namespace"], meta["name"]), meta.get("generation"),
                                   deleted=event["type"] == "DELETED")
