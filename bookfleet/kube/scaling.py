"""A BookieCluster's shape: Bookies for its replicas, safe scale-down, rolling upgrades, and its status.

Scale-down never deletes data that is still needed: the highest ordinal is drained first (read-only, its ledgers
repaired elsewhere, none left under-replicated, cookie removed) and only then are its pod, volumes and Bookie deleted.
A Bookie whose desiredState is not Writable is forced read-only through its ZooKeeper state node (level-based, on
every pass), so the bookie itself refuses adds and leaves the writable registrations that placement picks from.
"""

from __future__ import annotations

import datetime as dt
import logging

from kazoo.client import KazooClient
from pydantic import ValidationError

from bookfleet.kube import certificates, lifecycle, repairs, resources
from bookfleet.kube.api import CORE, CUSTOM
from bookfleet.kube.context import OperatorContext, conditions_with, now, now_rounded_up, patch_status, timestamp
from bookfleet.kube.models import VALID, Bookie, BookieCluster, DesiredState, cluster_problems
from bookfleet.meta import bookiestate, cookies
from bookfleet.meta.underreplication import UnderReplication

log = logging.getLogger(__name__)

ANNOTATION_DECOMMISSION_SINCE = "bookfleet.io/decommission-since"
READY = "Ready"
UPGRADING = "Upgrading"


def ordinal(bookie_name: str) -> int:
    return int(bookie_name.rsplit("-", 1)[1])


def validate(body: dict) -> tuple[BookieCluster | None, str]:
    """The cluster model, or None and one sentence saying what is wrong with its spec."""
    try:
        cluster = BookieCluster.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return None, f"invalid spec: {problems}"
    problems = cluster_problems(cluster.spec)
    return (None, "; ".join(problems)) if problems else (cluster, "")


def reconcile(ctx: OperatorContext, body: dict) -> None:
    """One level-based pass over a BookieCluster (called by a timer)."""
    meta, status = body["metadata"], body.get("status") or {}
    cluster, problem = validate(body)
    if cluster is None:
        if patch_status(ctx, "bookieclusters", body, {"conditions": conditions_with(status, VALID, False,
                                                                                    "InvalidSpec", problem)}):
            ctx.api.post_event(body, "InvalidSpec", problem, warning=True)
        return
    settings = cluster.spec.auto_recovery
    # The one place of these settings: the auditor, the repair job and every Bookie's loss decision read them here.
    UnderReplication(ctx.zk(cluster.spec.zookeeper)).configure(settings.enabled,
                                                                settings.lost_bookie_recovery_delay_seconds)
    for manifest in resources.cluster_objects(cluster):
        existing, created = ctx.api.ensure(manifest)
        if manifest["kind"] == "PodDisruptionBudget" and not created and existing["spec"] != manifest["spec"]:
            ctx.api.patch(manifest["apiVersion"], "poddisruptionbudgets", meta["namespace"],
                          manifest["metadata"]["name"], {"spec": manifest["spec"]})  # follows replicas
    service_account = cluster.spec.auto_recovery.repair.service_account_name
    for manifest in resources.repair_namespace_objects(meta["namespace"], service_account):
        ctx.api.ensure(manifest)
    existing = {b["metadata"]["name"]: b for b in
                ctx.api.list(CUSTOM, "bookies", meta["namespace"], {resources.LABEL_CLUSTER: meta["name"]})}
    for manifest in resources.bookies_for_cluster(cluster):
        if manifest["metadata"]["name"] not in existing:
            created, _ = ctx.api.ensure(manifest)
            existing[created["metadata"]["name"]] = created
    certificates.ensure(ctx.api, cluster, [Bookie.model_validate(b) for b in existing.values()], now())
    sync_read_only(ctx.zk(cluster.spec.zookeeper), existing.values())
    surplus = sorted((b for b in existing.values() if ordinal(b["metadata"]["name"]) >= cluster.spec.replicas),
                     key=lambda b: ordinal(b["metadata"]["name"]), reverse=True)
    if surplus:
        decommission(ctx, cluster, surplus[0])
    wanted = [b for b in existing.values() if ordinal(b["metadata"]["name"]) < cluster.spec.replicas]
    pods = {b["metadata"]["name"]: ctx.api.get(CORE, "pods", meta["namespace"], b["metadata"]["name"])
            for b in wanted}
    upgrading = rolling_upgrade(ctx, cluster, wanted, pods)
    ready = sum(lifecycle.pod_ready(pod) for pod in pods.values())
    patch_status(ctx, "bookieclusters", body, decide_status(status, cluster, ready, bool(surplus), upgrading))


def decide_status(status: dict, cluster: BookieCluster, ready: int, draining: bool, upgrading: str | None) -> dict:
    """The cluster's status from its ready bookies, a drain under way and the bookie a rolling upgrade restarts
    (pure; conditions keep their transition time while unchanged)."""
    replicas = cluster.spec.replicas
    conditions = conditions_with(status, VALID, True, "SpecValid")
    conditions = conditions_with({"conditions": conditions}, READY, ready == replicas,
                                 "AllReady" if ready == replicas else "NotAllReady",
                                 f"{ready}/{replicas} bookies ready")
    conditions = conditions_with({"conditions": conditions}, UPGRADING, upgrading is not None,
                                 "RollingUpgrade" if upgrading else "UpToDate",
                                 f"restarting {upgrading}" if upgrading else "")
    return {"desiredBookies": replicas, "readyBookies": ready,
            "phase": "Ready" if ready == replicas and not draining else "Reconciling", "conditions": conditions}


def sync_read_only(zk: KazooClient, bookies) -> None:
    """Force read-only exactly the Bookies whose desiredState is not Writable (one listing, writes only on change)."""
    forced = bookiestate.forced_ids(zk)
    for body in bookies:
        bookie_id, desired = body["spec"]["bookieId"], body["spec"].get("desiredState", DesiredState.WRITABLE)
        if desired != DesiredState.WRITABLE and bookie_id not in forced:
            bookiestate.set_read_only(zk, bookie_id, f"Bookie {body['metadata']['name']} is {desired}")
        elif desired == DesiredState.WRITABLE and bookie_id in forced:
            bookiestate.clear(zk, bookie_id)


def rolling_upgrade(ctx: OperatorContext, cluster: BookieCluster, bookies: list[dict],
                    pods: dict[str, dict | None]) -> str | None:
    """Restart one pod whose image is outdated, only while every other bookie is ready; returns who restarts."""
    outdated = [b for b in sorted(bookies, key=lambda b: ordinal(b["metadata"]["name"]))
                if (pod := pods[b["metadata"]["name"]]) and pod["spec"]["containers"][0]["image"] != cluster.spec.image]
    if not outdated:
        return None
    if not all(lifecycle.pod_ready(pod) for pod in pods.values()):
        return next((name for name, pod in pods.items() if not lifecycle.pod_ready(pod)), None)
    bookie = outdated[0]
    name, ns = bookie["metadata"]["name"], bookie["metadata"]["namespace"]
    pod = pods[name]
    assert pod is not None
    ctx.api.patch(CUSTOM, "bookies", ns, name,
                  {"metadata": {"annotations": {lifecycle.ANNOTATION_PLANNED_RESTART: pod["metadata"]["uid"]}}})
    ctx.api.delete(CORE, "pods", ns, name)
    ctx.api.post_event(bookie, "RollingUpgrade", f"restarting {name} with image {cluster.spec.image}")
    return name


def decommission(ctx: OperatorContext, cluster: BookieCluster, body: dict) -> None:
    """One step of draining a surplus bookie; its data is deleted only when nothing needs it any more."""
    bookie = Bookie.model_validate(body)
    ns, name = bookie.metadata.namespace, bookie.metadata.name
    since_text = bookie.metadata.annotations.get(ANNOTATION_DECOMMISSION_SINCE)
    if bookie.spec.desired_state == DesiredState.WRITABLE or not since_text:
        since = now_rounded_up()
        ctx.api.patch(CUSTOM, "bookies", ns, name, {
            "metadata": {"annotations": {ANNOTATION_DECOMMISSION_SINCE: timestamp(since)}},
            "spec": {"desiredState": DesiredState.READ_ONLY.value},
        })
        ctx.api.post_event(body, "Decommissioning", f"draining {name}: read-only, then its ledgers move elsewhere")
        return
    since = dt.datetime.fromisoformat(since_text.replace("Z", "+00:00"))
    zk = ctx.zk(cluster.spec.zookeeper)
    if repairs.remaining_ledgers(zk, bookie.spec.bookie_id):
        outcome = repairs.ensure_repaired(ctx, cluster, bookie, since)
        if outcome != repairs.Outcome.REPAIRED:
            return
    cookies.forget(zk, bookie.spec.bookie_id)
    pod_left = ctx.api.delete(CORE, "pods", ns, name)
    for claim in resources.bookie_pvcs(bookie):
        ctx.api.delete(CORE, "persistentvolumeclaims", ns, claim["metadata"]["name"])
    if pod_left:
        return  # the switch goes only after the bookie process: it must not turn writable on its way out
    bookiestate.clear(zk, bookie.spec.bookie_id)
    ctx.api.delete(CUSTOM, "bookies", ns, name)
    ctx.api.post_event(cluster.to_wire(), "Decommissioned", f"{name} drained and removed; no ledger needs it")
    log.info("decommissioned %s", name)
