"""A Bookie's life: its volumes and pod, its status from the pod and ZooKeeper, and what happens when it is lost.

A lost bookie (pod gone or failed) gets `lostSince`. Its pod is recreated on the same volumes when they survive.
What happens next is the auditor's rule (replication.lostbookie), with the delay and the disable switch that the
cluster's reconciliation wrote into ZooKeeper: back with its data, nothing else happens; lost, its ledgers are
repaired (repairs.py); while auto-recovery is disabled, nothing is launched and the Repaired condition says so.
A bookie whose volumes are gone rejoins, empty and with a fresh cookie, only after the repair has put its ledgers
elsewhere.
"""

from __future__ import annotations

import datetime as dt
import logging

from kazoo.client import KazooClient

from bookfleet.kube import repairs, resources
from bookfleet.kube.api import CORE, CUSTOM
from bookfleet.kube.context import OperatorContext, conditions_with, now, now_rounded_up, patch_status, timestamp
from bookfleet.kube.models import Bookie, BookieCluster, BookiePhase, DesiredState
from bookfleet.meta import cookies
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.registry import BookieInfo, BookieMode, BookieRegistry, UnknownBookie
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.lostbookie import LostBookieAction, decide_lost_bookie

log = logging.getLogger(__name__)

ANNOTATION_PLANNED_RESTART = "bookfleet.io/planned-restart"
"""uid of a pod the operator itself deletes (rolling upgrade): its deletion is not a loss."""
LOST = "Lost"
REPAIRED = "Repaired"
AUTO_RECOVERY_DISABLED = "AutoRecoveryDisabled"


def pod_ready(pod: dict | None) -> bool:
    if not pod or pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def pod_failed(pod: dict | None) -> bool:
    return bool(pod) and (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


def registration(zk: KazooClient, bookie_id: str) -> BookieInfo | None:
    try:
        return BookieRegistry(zk).info(bookie_id)
    except UnknownBookie:
        return None


def load(ctx: OperatorContext, body: dict) -> tuple[Bookie, BookieCluster] | None:
    """The Bookie and its cluster as models, or None while the cluster is missing or invalid."""
    bookie = Bookie.model_validate(body)
    cluster_body = ctx.api.get(CUSTOM, "bookieclusters", bookie.metadata.namespace, bookie.spec.cluster)
    if cluster_body is None:
        return None
    try:
        return bookie, BookieCluster.model_validate(cluster_body)
    except ValueError:
        return None  # the cluster's own handler reports why


def ensure_volumes_and_pod(ctx: OperatorContext, cluster: BookieCluster, bookie: Bookie) -> None:
    for claim in resources.bookie_pvcs(cluster, bookie):
        ctx.api.ensure(claim)
    ctx.api.ensure(resources.bookie_pod(cluster, bookie))


def volumes_present(ctx: OperatorContext, bookie: Bookie) -> bool:
    ns = bookie.metadata.namespace
    return all(ctx.api.get(CORE, "persistentvolumeclaims", ns, claim)
               for claim in resources.claim_names(bookie.metadata.name))


def mark_lost(ctx: OperatorContext, body: dict, reason: str) -> None:
    """Record the loss once: the first lostSince stays, so the recovery delay counts from the real loss."""
    status = body.get("status") or {}
    if status.get("lostSince"):
        return
    ctx.api.patch_status("bookies", body["metadata"]["namespace"], body["metadata"]["name"], {
        "lostSince": timestamp(now_rounded_up()), "phase": BookiePhase.LOST.value,
        "conditions": conditions_with(status, LOST, True, "PodLost", reason),
    })
    ctx.api.post_event(body, "BookieLost", reason, warning=True)


def reconcile(ctx: OperatorContext, body: dict) -> None:
    """One level-based pass over a Bookie (called by a timer and after pod events)."""
    loaded = load(ctx, body)
    if loaded is None:
        return
    bookie, cluster = loaded
    if bookie.spec.desired_state != DesiredState.WRITABLE:
        update_status(ctx, body, cluster, bookie)  # decommissioning: scaling.py drives it
        return
    ns, name = bookie.metadata.namespace, bookie.metadata.name
    pod = ctx.api.get(CORE, "pods", ns, name)
    lost_since = bookie.status.lost_since
    had_pod = bookie.status.pod is not None  # a bookie whose first pod is still to come is new, not lost
    planned = bookie.metadata.annotations.get(ANNOTATION_PLANNED_RESTART)
    if planned and pod_ready(pod) and pod["metadata"]["uid"] != planned:
        ctx.api.patch(CUSTOM, "bookies", ns, name, {"metadata": {"annotations": {ANNOTATION_PLANNED_RESTART: None}}})
    elif planned and pod is None:
        had_pod = False  # the operator deleted it on purpose (rolling upgrade): recreate, do not repair
    if lost_since is None and had_pod and (pod is None or pod_failed(pod)):
        mark_lost(ctx, body, f"pod {name} is {'gone' if pod is None else 'failed'}")
        lost_since = now_rounded_up()
    if lost_since is None:
        ensure_volumes_and_pod(ctx, cluster, bookie)
    else:
        handle_loss(ctx, body, cluster, bookie, pod, lost_since)
    refreshed = ctx.api.get(CUSTOM, "bookies", ns, name)
    if refreshed:
        update_status(ctx, refreshed, cluster, Bookie.model_validate(refreshed))


def handle_loss(ctx: OperatorContext, body: dict, cluster: BookieCluster, bookie: Bookie, pod: dict | None,
                lost_since: dt.datetime) -> None:
    ns, name = bookie.metadata.namespace, bookie.metadata.name
    zk = ctx.zk(cluster.spec.zookeeper)
    if pod_failed(pod):
        ctx.api.delete(CORE, "pods", ns, name)
        pod = None
    has_volumes = volumes_present(ctx, bookie)
    if pod is None and has_volumes:
        ctx.api.ensure(resources.bookie_pod(cluster, bookie))  # back on the same volumes, with its data
    under_replication = UnderReplication(zk)
    disabled = under_replication.is_disabled()
    registered = pod_ready(pod) and registration(zk, bookie.spec.bookie_id) is not None
    verdict = decide_lost_bookie(lost_since.timestamp(), now().timestamp(), under_replication.recovery_delay(),
                                 disabled, registered, data_present=has_volumes)
    if verdict.action == LostBookieAction.NOTHING:
        clear_loss(ctx, body, "BookieReturned", f"bookie {name} came back with its data: no repair needed")
        return
    if verdict.action == LostBookieAction.WAIT:
        if disabled:
            report_disabled(ctx, body)
        return
    outcome = repairs.ensure_repaired(ctx, cluster, bookie, lost_since)
    status = body.get("status") or {}
    if outcome == repairs.Outcome.REPAIRED:
        if not has_volumes:
            cookies.forget(zk, bookie.spec.bookie_id)
            ensure_volumes_and_pod(ctx, cluster, bookie)
        clear_loss(ctx, body, "RepairSucceeded", f"the ledgers of bookie {name} are fully replicated again")
    elif outcome == repairs.Outcome.DISABLED:
        report_disabled(ctx, body)
    elif outcome in (repairs.Outcome.BACKING_OFF, repairs.Outcome.GAVE_UP):
        message = ("repair failed, retrying with backoff" if outcome == repairs.Outcome.BACKING_OFF
                   else f"repair failed {repairs.MAX_ATTEMPTS} times; giving up until the Bookie changes")
        if patch_status(ctx, "bookies", body, {"conditions": conditions_with(status, REPAIRED, False, "RepairFailed",
                                                                             message)}):
            ctx.api.post_event(body, "RepairFailed", message, warning=True)
    else:
        patch_status(ctx, "bookies", body, {"conditions": conditions_with(status, REPAIRED, False, "Repairing",
                                                                          "repair in progress")})


def report_disabled(ctx: OperatorContext, body: dict) -> None:
    """Say, once, why a lost bookie's ledgers are not being repaired."""
    status = body.get("status") or {}
    message = "auto-recovery is disabled (spec.autoRecovery.enabled): no repair is launched until it is enabled"
    if patch_status(ctx, "bookies", body, {"conditions": conditions_with(status, REPAIRED, False,
                                                                         AUTO_RECOVERY_DISABLED, message)}):
        ctx.api.post_event(body, AUTO_RECOVERY_DISABLED, message, warning=True)


def clear_loss(ctx: OperatorContext, body: dict, reason: str, message: str) -> None:
    status = body.get("status") or {}
    conditions = conditions_with(status, LOST, False, reason, message)
    if reason == "RepairSucceeded":
        conditions = conditions_with({"conditions": conditions}, REPAIRED, True, reason, message)
    ctx.api.patch_status("bookies", body["metadata"]["namespace"], body["metadata"]["name"],
                         {"lostSince": None, "conditions": conditions})
    ctx.api.post_event(body, reason, message)


def update_status(ctx: OperatorContext, body: dict, cluster: BookieCluster, bookie: Bookie) -> None:
    """Observe the pod and ZooKeeper, decide the status, patch what changed."""
    zk = ctx.zk(cluster.spec.zookeeper)
    pod = ctx.api.get(CORE, "pods", bookie.metadata.namespace, bookie.metadata.name)
    ledgers = len(MetadataStore(zk).ledgers_on_bookie(bookie.spec.bookie_id))
    patch_status(ctx, "bookies", body, decide_status(bookie, pod, registration(zk, bookie.spec.bookie_id), ledgers))


def decide_status(bookie: Bookie, pod: dict | None, info: BookieInfo | None, ledgers: int) -> dict:
    """The Bookie's status from its pod, its registration and its ledger count (pure)."""
    if bookie.spec.desired_state != DesiredState.WRITABLE:
        phase = BookiePhase.DECOMMISSIONING
    elif bookie.status.lost_since:
        phase = BookiePhase.LOST
    elif info and pod_ready(pod):
        phase = BookiePhase.READ_ONLY if info.state == BookieMode.READ_ONLY else BookiePhase.RUNNING
    else:
        phase = BookiePhase.PENDING
    return {
        "phase": phase.value,
        "bookieId": bookie.spec.bookie_id,
        "pod": bookie.metadata.name if pod else None,
        "registered": info is not None,
        "ledgers": ledgers,
        "diskUsage": disk_usage(info, bookie) if info else None,
    }


def disk_usage(info: BookieInfo, bookie: Bookie) -> float:
    """Used fraction of the ledger volume, from the free bytes the bookie registers."""
    quota = resources.quantity_bytes(bookie.spec.storage.ledgers.size)
    return round(min(max(1 - info.free_bytes / quota, 0.0), 1.0), 4) if quota else 0.0


def on_pod_event(ctx: OperatorContext, event_type: str, pod: dict) -> None:
    """A bookie pod deleted or failed: record the loss on its Bookie right away (the timer does the rest)."""
    meta = pod["metadata"]
    bookie_name = (meta.get("labels") or {}).get(resources.LABEL_BOOKIE)
    if not bookie_name or not (event_type == "DELETED" or pod_failed(pod)):
        return
    body = ctx.api.get(CUSTOM, "bookies", meta["namespace"], bookie_name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
    if (body["metadata"].get("annotations") or {}).get(ANNOTATION_PLANNED_RESTART) == meta.get("uid"):
        return
    if (body.get("spec") or {}).get("desiredState", DesiredState.WRITABLE) != DesiredState.WRITABLE:
        return
    mark_lost(ctx, body, f"pod {meta['name']} was {'deleted' if event_type == 'DELETED' else 'failed'}")
