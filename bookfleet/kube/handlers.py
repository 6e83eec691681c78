"""kopf registrations only: every handler hands the object to a plain domain module.

Level-based throughout: loops and passes re-derive everything from Kubernetes and ZooKeeper on each pass, so a
restarted operator resumes where the previous one stopped. So no object carries a finalizer of the operator's: there
is no work one would guard, and a finalizer outlives the operator that should release it (a namespace deletion or an
Argo CD prune removes the operator with its objects, which then stay Terminating for ever). A loop ends when kopf
stops it or when the informers see its object gone (kube.runtime.wakeups). Bookies, their pods and claims,
BookieClusters and repair Jobs are read from kube.caches (indexed there by bookie id, cluster and lost bookie), which
also wake the loops that depend on them. Ledgers have no timer and no finalizer: kube.runtime.ledgerfeed wakes each one
when something it mirrors changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

import kopf
import kubernetes

from bookfleet.kube import crdgen
from bookfleet.kube.caches import Caches
from bookfleet.kube.models import GROUP, VERSION, validated_cluster
from bookfleet.kube.reconcilers import bookies, clusters, ledgers, teardown
from bookfleet.kube.runtime import api, ledgerfeed, metrics, wakeups
from bookfleet.kube.runtime.context import OperatorContext, ZooKeeperTarget, ZooKeeperUnavailable

INTERVAL = float(os.environ.get("BOOKFLEET_OPERATOR_INTERVAL", "10"))
"""Seconds between reconciliations of each resource (set by `bookfleet operator --interval`)."""
API_QPS = float(os.environ.get("BOOKFLEET_OPERATOR_API_QPS", "50"))
API_BURST = int(os.environ.get("BOOKFLEET_OPERATOR_API_BURST", "100"))
"""The operator's client-side rate limit on its API requests (`--api-qps`, `--api-burst`;
kube.runtime.api.RateLimiter)."""
EVENT_WINDOW = 6 * INTERVAL
"""Seconds over which a bookie loss's Ledger Events (under-replicated, repair launched and done, healed) are counted
into one Event per reason on their BookieCluster (kube.runtime.context.EventTally)."""
KUBECONFIG = os.environ.get("BOOKFLEET_KUBECONFIG") or None
ZK_OVERRIDE = os.environ.get("BOOKFLEET_OPERATOR_ZK") or None
APPLY_CRDS = bool(os.environ.get("BOOKFLEET_OPERATOR_APPLY_CRDS"))
"""Apply the operator's own CRDs at its start (`bookfleet operator --apply-crds`; kube.crdgen.apply_crds)."""
NAMESPACES = [ns for ns in os.environ.get("BOOKFLEET_OPERATOR_NAMESPACES", "").split(",") if ns] or None
"""The namespaces the operator watches (`bookfleet operator --namespace`); None: the whole cluster."""
BOOKIE_RESYNC = float(os.environ.get("BOOKFLEET_BOOKIE_RESYNC", str(30 * INTERVAL)))
"""Seconds between the resyncs of a settled Bookie (what no watch covers: its ledger count, its disk usage)."""
LEDGER_RESYNC = float(os.environ.get("BOOKFLEET_LEDGER_RESYNC", str(60 * INTERVAL)))
"""Seconds between the resyncs of each cluster's Ledgers (what no watch covers); Ledgers otherwise wait on changes."""
CLUSTER_THREADS = 8
"""Threads of each BookieCluster's pool, where its cluster's and its Bookies' passes run
(kube.runtime.wakeups.ClusterPools): a pass mostly waits on the API or ZooKeeper, and a cluster's blocked passes hold
only these."""

_context: OperatorContext | None = None
WAKEUPS = wakeups.Wakeups()
POOLS = wakeups.ClusterPools(CLUSTER_THREADS)
log = logging.getLogger(__name__)


def context() -> OperatorContext:
    """Created after login, when the kubernetes client knows where the API server is."""
    global _context
    if _context is None:
        _context = OperatorContext(api.KubeApi(limiter=api.RateLimiter(API_QPS, API_BURST)), ZK_OVERRIDE,
                                   event_window=EVENT_WINDOW)
    return _context


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # our own Events say what happened; kopf's per-handler ones are noise
    settings.watching.server_timeout = 300
    settings.watching.chunk_size = 500  # the start-up LIST in pages, as the informers list theirs
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
async def close(**_: Any) -> None:
    """A loop stopped during a pass left it running (kube.runtime.wakeups): it ends before what it uses is closed."""
    await WAKEUPS.passes_ended(timeout=INTERVAL)
    await asyncio.to_thread(_close)


def _close() -> None:
    if _context is not None:
        _context.close()
    if _caches is not None:
        _caches.stop()
    POOLS.shutdown()


def _one_pass(plural: str, reconcile: Callable[[OperatorContext, dict], float | None], body: kopf.Body,
              ) -> Callable[[], float | None]:
    def one_pass() -> float | None:
        """A failed pass is logged and retried at the interval, as kopf does for a timer."""
        try:
            with metrics.reconciling(plural, body):
                return reconcile(context(), dict(body))
        except ZooKeeperUnavailable as unavailable:  # the cluster's ZooKeeper is down: one line, not a trace
            meta = body["metadata"]
            log.warning("reconciling %s %s/%s: %s", plural, meta["namespace"], meta["name"], unavailable)
            return INTERVAL
        except Exception:
            meta = body["metadata"]
            log.exception("reconciling %s %s/%s failed", plural, meta["namespace"], meta["name"])
            return INTERVAL
    return one_pass


def _without_finalizer(daemon: Callable) -> Callable:
    """kopf puts its finalizer on every object a daemon runs for (to stop the daemon before the object goes): not
    on ours, whose loops end by themselves when their object is gone. kopf also drops the finalizer an older
    operator left on an object, at its next event."""
    spawning = kopf.get_default_registry()._spawning
    spawning._handlers = [dataclasses.replace(handler, requires_finalizer=False) if handler.fn is daemon else handler
                          for handler in spawning._handlers]
    return daemon


@_without_finalizer
@kopf.daemon(GROUP, VERSION, "bookieclusters", cancellation_backoff=60, cancellation_timeout=10)
async def run_cluster(body: kopf.Body, namespace: str, name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """A loop per BookieCluster: a pass when one of its bookie pods changes (a rollout's next step starts as soon as
    the restarted bookie is Ready), else every INTERVAL seconds."""
    try:
        with FEED.acting(namespace, name):  # its Ledgers are passed only while this replica acts for it
            await wakeups.run_loop(WAKEUPS, ("bookieclusters", namespace, name), _one_pass(
                "bookieclusters", lambda ctx, cluster: clusters.reconcile(ctx, cluster, caches().cluster_sources),
                body), lambda: POOLS.of(namespace, name), stopped, INTERVAL, uid=body["metadata"].get("uid"))
    finally:
        metrics.FLEETS.forget(namespace, name)  # its health is served by the replica that acts for it
        clusters.ROLLOUT_TURN.release((namespace, name))  # a deleted cluster's rollout halts no other
        POOLS.release(namespace, name)


@kopf.on.startup()
def apply_crds(**_: Any) -> None:
    """Before anything is read: objects are then served with every field this operator knows."""
    if APPLY_CRDS:
        api.load_config(KUBECONFIG)
        log.info("CRDs applied: %s", ", ".join(crdgen.apply_crds(context().api)) or "none (a newer operator's)")


@kopf.on.startup()
async def start_caches(**_: Any) -> None:
    """Listed then watched from here on, whether this replica acts or not (kube.caches)."""
    global _caches
    api.load_config(KUBECONFIG)
    _caches = Caches(context().api, NAMESPACES, asyncio.get_running_loop(), WAKEUPS, FEED.wake_repair,
                               _ledger_changed)
    _caches.start()


def caches() -> Caches:
    assert _caches is not None, "started with the operator"
    return _caches


def _cluster(namespace: str, name: str) -> dict | None:
    return caches().clusters.get(namespace, name)


_caches: Caches | None = None


@_without_finalizer
@kopf.daemon(GROUP, VERSION, "bookies", cancellation_backoff=60, cancellation_timeout=10)
async def run_bookie(body: kopf.Body, namespace: str, name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """A loop per Bookie, driven by change: a pass when the Bookie, its pod, its claims or its registration change (a
    pod that stops being Ready on a failed node is seen at once) and when a recovery delay ends; every INTERVAL while
    it is in motion (lost, starting, draining); else a resync every BOOKIE_RESYNC seconds on average, each
    wait drawn anew (±50 %) so that a fleet's loops, all started with the operator, do not resync together."""
    await wakeups.run_loop(WAKEUPS, ("bookies", namespace, name), _one_pass(
        "bookies", lambda ctx, bookie: bookies.reconcile(ctx, bookie, caches().bookie_sources, retry=INTERVAL), body),
        lambda: POOLS.of(namespace, body["spec"]["cluster"]), stopped, BOOKIE_RESYNC, jitter=0.5,
        uid=body["metadata"].get("uid"))


def _reconcile_ledger(key: ledgerfeed.LedgerKey, body: dict | None) -> float | None:
    """One Ledger pass, on the feed's worker thread: the body its watch event brought, else a fresh GET."""
    if body is None and (body := context().api.get(api.CUSTOM, "ledgers", *key)) is None:
        return None  # deleted meanwhile
    with metrics.reconciling("ledgers", body):
        sources = ledgers.LedgerSources(_cluster, caches().repairs_of, FEED.metadata_watch, FEED.records,
                                        FEED.read_ahead, caches().cluster_sources.bookies)
        return ledgers.reconcile(context(), body, sources, retry=INTERVAL)


def _zookeeper_of(namespace: str, cluster: str) -> ZooKeeperTarget | None:
    """The cluster's ZooKeeper, credential and TLS Secret (from the BookieClusters' watch): the feed watches each
    once, on the session the cluster's Ledger passes use."""
    body = _cluster(namespace, cluster)
    return None if body is None else ZooKeeperTarget.of(validated_cluster(body))


FEED = ledgerfeed.LedgerFeed(_reconcile_ledger, _zookeeper_of, lambda target: context().zk(target, wait=0),
                             resync=LEDGER_RESYNC, retry=INTERVAL)


@kopf.on.startup()
def start_ledger_feed(**_: Any) -> None:
    FEED.start()


@kopf.on.cleanup()
def stop_ledger_feed(**_: Any) -> None:
    FEED.stop()


def _ledger_changed(body: dict, deleted: bool) -> None:
    """Ledgers are watched (kube.caches), not timed: a new Ledger or a new spec wakes its pass
    (kube.runtime.ledgerfeed); no finalizer. A deleted Ledger leaves the feed."""
    cluster = (body.get("spec") or {}).get("cluster", "")
    if not deleted and (target := _zookeeper_of(body["metadata"]["namespace"], cluster)):
        with contextlib.suppress(ZooKeeperUnavailable):  # its passes ask again
            FEED.watch_zookeeper(target)
    FEED.ledger_changed(body, deleted=deleted)
