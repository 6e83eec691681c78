"""kopf registrations only: every handler hands the object to a plain domain module.

Level-based throughout: timers and loops re-derive everything from Kubernetes and ZooKeeper on each pass, so a
restarted operator resumes where the previous one stopped. Bookie pods are watched by label, with no finalizers on
them: their events only wake their Bookie's and their cluster's loops.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import kopf
import kubernetes

from bookfleet.kube import api, ledgers, lifecycle, metrics, repairs, resources, scaling, teardown, wakeups
from bookfleet.kube.context import OperatorContext
from bookfleet.kube.models import GROUP, VERSION

INTERVAL = float(os.environ.get("BOOKFLEET_OPERATOR_INTERVAL", "10"))
"""Seconds between reconciliations of each resource (set by `bookfleet operator --interval`)."""
KUBECONFIG = os.environ.get("BOOKFLEET_KUBECONFIG") or None
ZK_OVERRIDE = os.environ.get("BOOKFLEET_OPERATOR_ZK") or None

_context: OperatorContext | None = None
WAKEUPS = wakeups.Wakeups()
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
    await wakeups.run_loop(WAKEUPS, ("bookieclusters", namespace, name), _one_pass("bookieclusters", scaling.reconcile,
                           body), stopped, INTERVAL)


@kopf.daemon(GROUP, VERSION, "bookies", cancellation_backoff=60, cancellation_timeout=10)
async def run_bookie(body: kopf.Body, namespace: str, name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """A loop per Bookie: a pass when its pod changes (a pod that stops being Ready on a failed node is seen at once)
    and when a recovery delay ends, else every INTERVAL seconds."""
    await wakeups.run_loop(WAKEUPS, ("bookies", namespace, name), _one_pass("bookies", lifecycle.reconcile, body),
                           stopped, INTERVAL)


def _by_bookie(body: kopf.Body) -> dict[repairs.BookieKey, dict]:
    key = repairs.bookie_key(dict(body))
    return {} if key is None else {key: dict(body)}


@kopf.index("batch", "v1", "jobs", labels=resources.REPAIR_SELECTOR)
def repair_jobs_by_bookie(body: kopf.Body, **_: Any) -> dict[repairs.BookieKey, dict]:
    return _by_bookie(body)


@kopf.index("sparkoperator.k8s.io", "v1beta2", "sparkapplications", labels=resources.REPAIR_SELECTOR)
def spark_repairs_by_bookie(body: kopf.Body, **_: Any) -> dict[repairs.BookieKey, dict]:
    return _by_bookie(body)


@kopf.timer(GROUP, VERSION, "ledgers", interval=INTERVAL)
def sync_ledger(body: kopf.Body, repair_jobs_by_bookie: kopf.Index, spark_repairs_by_bookie: kopf.Index,
                **_: Any) -> None:
    """Repair state comes from the two indexes above (kept from the watch): no LIST per Ledger."""
    with metrics.reconciling("ledgers"):
        ledgers.sync(context(), dict(body), lambda key: [*repair_jobs_by_bookie.get(key, ()),
                                                         *spark_repairs_by_bookie.get(key, ())])


@kopf.on.event(GROUP, VERSION, "ledgers")
def ledger_event(event: kopf.RawEvent, **_: Any) -> None:
    """A deleted Ledger leaves the operator's ledger-health gauges."""
    if event["type"] == "DELETED":
        meta = event["object"]["metadata"]
        metrics.LEDGERS.forget(meta["namespace"], meta["name"])


@kopf.on.event(GROUP, VERSION, "bookieclusters")
async def cluster_event(event: kopf.RawEvent, **_: Any) -> None:
    """A new spec (generation) wakes the cluster's loop: settings reach ZooKeeper and rollouts start at once. Its
    own status patches do not (they leave the generation as it is)."""
    meta = event["object"]["metadata"]
    WAKEUPS.wake_on_new_generation(("bookieclusters", meta["namespace"], meta["name"]), meta.get("generation"),
                                   deleted=event["type"] == "DELETED")


@kopf.on.event("", "v1", "pods", labels=resources.BOOKIE_POD_SELECTOR)
async def bookie_pod_event(event: kopf.RawEvent, **_: Any) -> None:
    """A bookie pod created, changed or deleted wakes its Bookie's and its cluster's loops."""
    meta = event["object"]["metadata"]
    labels = meta.get("labels") or {}
    if bookie := labels.get(resources.LABEL_BOOKIE):
        WAKEUPS.wake(("bookies", meta["namespace"], bookie))
    if cluster := labels.get(resources.LABEL_CLUSTER):
        WAKEUPS.wake(("bookieclusters", meta["namespace"], cluster))
