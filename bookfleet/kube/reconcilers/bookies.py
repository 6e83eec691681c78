"""A Bookie's life: its volumes and pod, its status from the pod and ZooKeeper, and what happens when it is lost.

One pass is observe (Kubernetes and ZooKeeper into `ObservedBookie`) -> decide (pure: observed state and the time -> a
`Decision`: its status patch first, then the actions) -> act (kube.reconcilers.actions). `find_death` is the one place
that says what counts as a lost bookie: its pod deleted or failed, not Ready on a node that is not Ready (or Terminating
past its grace period there), crash-looping for longer than lostBookieRecoveryDelay (not a pod restarted on purpose),
Pending because its volume's node is gone, or its volumes gone (a claim being deleted counts as gone). The loss gets
`lostSince` and a BookieLost Event naming the kind. A pod evicted through the eviction API (a drain) or stopped by a
graceful node shutdown is a planned loss (`Evicted`, `ShutDown`): the lost-bookie rule gives it the longer
planned-restart delay.

What happens next is the auditor's rule (replication.lostbookie), with the delay and the disable switch that the
cluster's reconciliation wrote into ZooKeeper: back with its data, nothing else happens; lost, its ledgers are
repaired (repairs.py); while auto-recovery is disabled, nothing is launched and the Repaired condition says so. A pod
is recreated on its volumes while they survive. A bookie whose data is gone, or whose pod is stuck on a dead node, is
replaced (the stuck pod force-deleted, fresh volumes, a fresh cookie) only after the repair has put its ledgers
elsewhere; one that is merely down (crash-looping with its data, or on a node that is NotReady or unreachable but
still exists: a zone outage, a partition) stays Lost, its volumes kept, until it comes back and rejoins with its
cookie, or its Node is deleted (then it is replaced).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster, BookiePhase, DesiredState, validated_cluster
from bookfleet.kube.reconcilers import ledgerscan, repairs
from bookfleet.kube.reconcilers.actions import (
    Action,
    Decision,
    Delete,
    Ensure,
    Patch,
    PatchStatus,
    PostEvent,
    act,
    again_on_conflict,
)
from bookfleet.kube.runtime.api import CORE, CUSTOM, KubeApi
from bookfleet.kube.runtime.context import (
    OperatorContext,
    ZooKeeperTarget,
    ZooKeeperUnavailable,
    conditions_with,
    now,
    rounded_up,
    timestamp,
)
from bookfleet.meta import cookies
from bookfleet.meta.registry import BookieInfo, BookieMode, BookieRegistry, UnknownBookie
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.lostbookie import LostBookieAction, decide_lost_bookie

log = logging.getLogger(__name__)

ANNOTATION_PLANNED_RESTART = "bookfleet.io/planned-restart"
"""uid of a pod the operator itself deletes (rolling upgrade, replacement): its deletion is not a loss, and its
successor is not counted crash-looping before it has been Ready (a rollout that never gets Ready is RolloutStuck)."""
ANNOTATION_DISRUPTION = "bookfleet.io/planned-disruption"
"""On a Bookie whose pod was seen terminating for a planned reason (evicted through the eviction API, e.g. by a
drain; its node shutting down): "<pod uid> <reason>". The pod's loss, once it is gone, is planned; removed when
another pod is Ready."""
LOST = "Lost"
REPAIRED = "Repaired"
REPAIR_GAVE_UP = "RepairGaveUp"
"""The Repaired condition's reason (and the Event's) once every attempt failed: what the operator's
repairs-given-up gauge counts, and the chart's alert fires on."""
AUTO_RECOVERY_DISABLED = "AutoRecoveryDisabled"
HOSTNAME_LABEL = "kubernetes.io/hostname"
NODE_GONE = "Gone"
"""The Ready status `observe` gives a node that no longer exists."""


LEDGER_COUNT_MAX_AGE = dt.timedelta(seconds=60)
"""How stale a Bookie status's ledger count may be: counting scans every ledger's metadata (BookKeeper keeps no index
by bookie), so one scan of a cluster's (kube.reconcilers.ledgerscan) serves all the Bookie passes of its cluster for
this long. Only the status shows the count; what a repair still has to do (repairs.remaining_ledgers) asks for a scan
begun after the moment that matters to it."""


def ledger_counts(zk: KazooClient) -> dict[str, int]:
    """bookie id -> how many ledgers its metadata names it in."""
    by_bookie = ledgerscan.SCANS.by_bookie(zk, dt.datetime.now(dt.UTC) - LEDGER_COUNT_MAX_AGE)
    return {bookie: len(ledgers) for bookie, ledgers in by_bookie.items()}


class DeathKind(enum.StrEnum):
    POD_DELETED = "PodDeleted"
    POD_FAILED = "PodFailed"
    NODE_LOST = "NodeLost"
    CRASH_LOOP = "CrashLooping"
    VOLUME_NODE_GONE = "VolumeNodeGone"
    VOLUMES_GONE = "VolumesGone"
    EVICTED = "Evicted"
    SHUT_DOWN = "ShutDown"


PLANNED_DISRUPTIONS = {"EvictionByEvictionAPI": DeathKind.EVICTED, "TerminationByKubelet": DeathKind.SHUT_DOWN}
"""Reasons of a pod's DisruptionTarget condition that mean planned maintenance (a drain or eviction, a graceful node
shutdown): such a loss gets spec.autoRecovery.plannedRestartDelaySeconds."""


@dataclass(frozen=True)
class Death:
    kind: DeathKind
    since: dt.datetime
    """When the bookie went away, as well as the pod tells (whole seconds, never early)."""
    detail: str


@dataclass(frozen=True)
class ClaimObserved:
    name: str
    exists: bool
    terminating: bool = False
    lost_node: str | None = None
    """The node its volume is pinned to, when that node no longer exists (looked at only while the pod is not
    Ready)."""

    @property
    def usable(self) -> bool:
        """Holds the bookie's data: present, not being deleted, not on a vanished node."""
        return self.exists and not self.terminating and self.lost_node is None


@dataclass(frozen=True)
class ObservedBookie:
    body: dict[str, Any]
    bookie: Bookie
    cluster: BookieCluster
    pod: dict[str, Any] | None
    node_ready: str | None
    """The Ready status of the pod's node ("True", "False", "Unknown", or NODE_GONE); None while the pod is Ready,
    unscheduled or absent (not looked at)."""
    claims: tuple[ClaimObserved, ...]
    registration: BookieInfo | None
    ledgers: int
    recovery_delay: float
    recovery_disabled: bool
    repair: repairs.RepairObserved = field(default_factory=repairs.RepairObserved)
    """The repair attempts of the recorded loss (none while no loss is recorded)."""
    node_zone: str | None = None
    """The topology.kubernetes.io/zone label of the node the pod is bound to, looked at only while the Bookie has no
    zone and its cluster lists none (`zone_from_node`)."""
    zookeeper_reached: bool = True
    """False while the cluster's ZooKeeper has no live session: `registration`, `ledgers` and the recovery settings
    are then not known (the last two are the spec's), and only what the pod tells is decided (`decide`)."""

    @property
    def data_present(self) -> bool:
        return all(claim.usable for claim in self.claims)

    @property
    def on_dead_node(self) -> bool:
        return self.node_ready not in (None, "True")


Lookup = Callable[[str, str], "dict[str, Any] | None"]
"""(namespace, name) -> the object, or None when there is none."""


@dataclass(frozen=True)
class BookieSources:
    """Where a pass reads the Bookie and what surrounds it: its cluster, pod and claims. The operator passes its
    informers' caches (kube.caches, whose first list a pass waits for), so a pass over a serving bookie makes no
    GET, and arms `watch_registrations` on the cluster's ZooKeeper (a bookie registering, leaving or turning
    read-only wakes its Bookie); `live` reads each with a GET, as a pass does again after a stale cache copy met a
    409 Conflict."""

    bookie: Lookup
    cluster: Lookup
    pod: Lookup
    claim: Lookup
    node: Lookup
    """(ignored, name) -> the Node: a zone-less bookie's zone is its node's label."""
    watch_registrations: Callable[[KazooClient], None] | None = None

    @classmethod
    def live(cls, api: KubeApi) -> BookieSources:
        return cls(bookie=lambda namespace, name: api.get(CUSTOM, "bookies", namespace, name),
                   cluster=lambda namespace, name: api.get(CUSTOM, "bookieclusters", namespace, name),
                   pod=lambda namespace, name: api.get(CORE, "pods", namespace, name),
                   claim=lambda namespace, name: api.get(CORE, "persistentvolumeclaims", namespace, name),
                   node=lambda namespace, name: api.get(CORE, "nodes", None, name))


@dataclass(frozen=True)
class LaunchRepair:
    """Mark the bookie's ledgers and create repair attempt `attempt` of the loss at `since` (posts RepairLaunched)."""

    cluster: BookieCluster
    bookie: Bookie
    since: dt.datetime
    attempt: int

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        repairs.launch(ctx, self.cluster, self.bookie, self.since, self.attempt)


@dataclass(frozen=True)
class ForgetCookie:
    """Let a replaced bookie start empty under its old id (its ledgers are elsewhere by now)."""

    zookeeper: ZooKeeperTarget
    bookie_id: str

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        cookies.forget(ctx.zk(self.zookeeper), self.bookie_id)


@dataclass(frozen=True)
class ForceDeletePod:
    """Delete a pod without waiting for its kubelet: a dead node never confirms, so it would stay Terminating."""

    namespace: str
    name: str

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        ctx.api.delete(CORE, "pods", self.namespace, self.name, grace_period_seconds=0)


# --- reading pods ------------------------------------------------------------------------------------------------

def pod_ready(pod: dict | None) -> bool:
    if not pod or pod["metadata"].get("deletionTimestamp"):
        return False
    return (ready_condition(pod) or {}).get("status") == "True"


def pod_failed(pod: dict | None) -> bool:
    return bool(pod) and (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


def termination_reason(pod: dict) -> str:
    """Why a pod ended, as far as its status says: its reason (Evicted, from the kubelets that set it), else its
    phase. A bookie that exits cleanly on the SIGTERM of its kubelet's eviction ends Succeeded with no reason
    (kubelet 1.34: only the pod's Evicted Event says it was evicted)."""
    status = pod.get("status") or {}
    return status.get("reason") or status.get("phase") or "unknown"


def ready_condition(pod: dict) -> dict | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)


def planned_disruption(pod: dict | None) -> str | None:
    """The reason of the pod's DisruptionTarget condition, when it is one of planned maintenance."""
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True" \
                and condition.get("reason") in PLANNED_DISRUPTIONS:
            return condition["reason"]
    return None


def parse_time(text: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def not_ready_since(pod: dict, at: dt.datetime) -> dt.datetime:
    """When the pod stopped serving: its Ready condition turning false, else its deletion, else `at`."""
    condition = ready_condition(pod) or {}
    moment = None if condition.get("status") == "True" else parse_time(condition.get("lastTransitionTime"))
    return rounded_up(moment or parse_time(pod["metadata"].get("deletionTimestamp")) or at)


def restarts(pod: dict) -> int:
    """Restarts of the bookie container (at least 1 while it waits in CrashLoopBackOff)."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") == resources.BOOKIE:
            waiting = (container.get("state") or {}).get("waiting") or {}
            return max(container.get("restartCount", 0), int(waiting.get("reason") == "CrashLoopBackOff"))
    return 0


# --- observe -----------------------------------------------------------------------------------------------------

def registration(zk: KazooClient, bookie_id: str) -> BookieInfo | None:
    try:
        return BookieRegistry(zk).info(bookie_id)
    except UnknownBookie:
        return None


def load(body: dict, cluster_of: Lookup) -> tuple[Bookie, BookieCluster] | None:
    """The Bookie and its cluster as models, or None while the cluster is missing or invalid."""
    bookie = Bookie.model_validate(body)
    cluster_body = cluster_of(bookie.metadata.namespace, bookie.spec.cluster)
    if cluster_body is None:
        return None
    try:
        return bookie, validated_cluster(cluster_body)
    except ValueError:
        return None  # the cluster's own handler reports why


def node_ready(api: KubeApi, name: str) -> str:
    node = api.get(CORE, "nodes", None, name)
    if node is None:
        return NODE_GONE
    return next((c.get("status", "Unknown") for c in (node.get("status") or {}).get("conditions") or []
                 if c.get("type") == "Ready"), "Unknown")


def pinned_nodes(volume: dict) -> list[str]:
    """The nodes a (local) PersistentVolume's nodeAffinity pins it to, by hostname."""
    terms = ((((volume.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {})
             .get("nodeSelectorTerms") or [])
    return [value for term in terms for expression in term.get("matchExpressions") or []
            if expression.get("key") == HOSTNAME_LABEL and expression.get("operator") == "In"
            for value in expression.get("values") or []]


def observe_claim(api: KubeApi, namespace: str, name: str, follow_volume: bool,
                  claim_of: Lookup | None = None) -> ClaimObserved:
    """The claim (from `claim_of`, else a GET) and, when asked, whether its volume's node is gone."""
    claim = (claim_of or BookieSources.live(api).claim)(namespace, name)
    if claim is None:
        return ClaimObserved(name, exists=False)
    terminating = bool(claim["metadata"].get("deletionTimestamp"))
    volume_name = (claim.get("spec") or {}).get("volumeName")
    volume = api.get(CORE, "persistentvolumes", None, volume_name) if follow_volume and volume_name else None
    nodes = pinned_nodes(volume) if volume else []
    gone = nodes and all(node_ready(api, node) == NODE_GONE for node in nodes)
    return ClaimObserved(name, exists=True, terminating=terminating, lost_node=nodes[0] if gone else None)


def observe(ctx: OperatorContext, body: dict, sources: BookieSources | None = None) -> ObservedBookie | None:
    """Everything a pass decides from; None while the Bookie is gone or being deleted (its pod going with it is no
    loss), or its cluster missing or invalid. The Bookie is read from `sources` (kopf's copy may predate the loss the
    last pass recorded), as are its cluster, pod and claims (default: live GETs). Nodes and volumes are looked at
    only while the pod is not Ready (a Ready pod's node and volumes are evidently there). ZooKeeper is read only
    if its session is live this moment (never waited for): pod death and a pod's recreation are decided without it."""
    sources = sources or BookieSources.live(ctx.api)
    body = sources.bookie(body["metadata"]["namespace"], body["metadata"]["name"])
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    loaded = load(body, sources.cluster)
    if loaded is None:
        return None
    bookie, cluster = loaded
    ns, name = bookie.metadata.namespace, bookie.metadata.name
    pod = sources.pod(ns, name)
    serving = pod_ready(pod)
    node_name = None if serving or pod is None else (pod.get("spec") or {}).get("nodeName")
    kubernetes = {"body": body, "bookie": bookie, "cluster": cluster, "pod": pod,
                  "node_ready": node_ready(ctx.api, node_name) if node_name else None,
                  "claims": tuple(observe_claim(ctx.api, ns, claim, follow_volume=not serving, claim_of=sources.claim)
                                  for claim in resources.claim_names(bookie.metadata.name))}
    try:
        zk = ctx.zk(ZooKeeperTarget.of(cluster), wait=0)
    except ZooKeeperUnavailable:
        auto_recovery = cluster.spec.auto_recovery
        return ObservedBookie(**kubernetes, registration=None, ledgers=bookie.status.ledgers or 0,
                              recovery_delay=auto_recovery.lost_bookie_recovery_delay_seconds,
                              recovery_disabled=not auto_recovery.enabled, zookeeper_reached=False)
    if sources.watch_registrations:
        sources.watch_registrations(zk)
    under_replication = UnderReplication(zk)
    disabled = under_replication.is_disabled()
    lost_since = bookie.status.lost_since
    tracks_repair = lost_since is not None and not disabled and bookie.spec.desired_state == DesiredState.WRITABLE
    return ObservedBookie(
        **kubernetes, registration=registration(zk, bookie.spec.bookie_id),
        ledgers=ledger_counts(zk).get(bookie.spec.bookie_id, 0),
        recovery_delay=under_replication.recovery_delay(), recovery_disabled=disabled,
        repair=repairs.observe_repair(ctx, cluster, bookie, lost_since) if tracks_repair else repairs.RepairObserved(),
        node_zone=node_zone(sources.node, pod) if bookie.spec.zone is None and not cluster.spec.zones else None,
    )


def node_zone(node_of: Lookup, pod: dict | None) -> str | None:
    """The zone label of the node the pod is bound to (None: unbound, or a node without one)."""
    node_name = ((pod or {}).get("spec") or {}).get("nodeName")
    node = node_of("", node_name) if node_name else None
    return ((node or {}).get("metadata", {}).get("labels") or {}).get(resources.ZONE_LABEL) or None


# --- decide ------------------------------------------------------------------------------------------------------

def find_death(observed: ObservedBookie, at: dt.datetime) -> Death | None:
    """How the bookie's pod died, if it did: the one place that says what counts as a lost bookie."""
    pod, bookie = observed.pod, observed.bookie
    name = bookie.metadata.name
    planned = bookie.metadata.annotations.get(ANNOTATION_PLANNED_RESTART)
    if pod is None:
        # A bookie whose first pod is still to come is new; one whose pod the operator deleted is restarting.
        if bookie.status.pod is None or planned:
            return None
        if recorded := bookie.metadata.annotations.get(ANNOTATION_DISRUPTION):
            reason = recorded.rpartition(" ")[2]
            return Death(PLANNED_DISRUPTIONS.get(reason, DeathKind.POD_DELETED), rounded_up(at),
                         f"pod {name} is gone ({reason}: planned maintenance)")
        return Death(DeathKind.POD_DELETED, rounded_up(at), f"pod {name} is gone")
    if pod_failed(pod):
        why = termination_reason(pod)
        if reason := planned_disruption(pod):
            return Death(PLANNED_DISRUPTIONS[reason], rounded_up(at), f"pod {name} stopped ({reason}: {why})")
        if pod["metadata"].get("deletionTimestamp"):  # it ended on its way out (a real kubelet reports that phase)
            if planned == pod["metadata"].get("uid"):
                return None  # the operator's own restart (a rollout)
            return Death(DeathKind.POD_DELETED, rounded_up(at), f"pod {name} is gone (deleted; it ended {why})")
        ended = "failed" if pod["status"]["phase"] == "Failed" else "ended"
        return Death(DeathKind.POD_FAILED, rounded_up(at), f"pod {name} {ended} ({why})")
    condition = ready_condition(pod) or {}
    deleted_at = parse_time(pod["metadata"].get("deletionTimestamp"))
    if observed.on_dead_node and (condition.get("status") != "True" or (deleted_at and deleted_at <= at)):
        node = pod["spec"]["nodeName"]
        return Death(DeathKind.NODE_LOST, not_ready_since(pod, at),
                     f"pod {name} is not ready on node {node}, whose Ready status is {observed.node_ready}")
    lost_node = next((claim for claim in observed.claims if claim.lost_node), None)
    if lost_node and not pod_ready(pod):
        phase = (pod.get("status") or {}).get("phase", "Pending")
        return Death(DeathKind.VOLUME_NODE_GONE, rounded_up(at),
                     f"pod {name} is {phase}: the node {lost_node.lost_node} of volume {lost_node.name} no longer"
                     " exists")
    gone = [claim.name for claim in observed.claims if not claim.usable]
    if gone and bookie.status.pod is not None:
        return Death(DeathKind.VOLUMES_GONE, rounded_up(at), f"volume(s) {', '.join(gone)} of pod {name} are gone or"
                                                              " being deleted")
    since = not_ready_since(pod, at)
    if restarting(pod, planned) and (at - since).total_seconds() > observed.recovery_delay:
        return Death(DeathKind.CRASH_LOOP, since,
                     f"pod {name} is crash-looping: {restarts(pod)} restart(s), not ready since {timestamp(since)},"
                     f" longer than lostBookieRecoveryDelay ({observed.recovery_delay:g}s)")
    return None


def restarting(pod: dict | None, planned: str | None) -> bool:
    """Restarted and not Ready, neither Terminating nor restarted on purpose: a crash loop once it lasts longer than
    the delay."""
    return pod is not None and not planned and not pod_ready(pod) and not pod["metadata"].get("deletionTimestamp") \
        and bool(restarts(pod))


@dataclass
class Plan:
    """What one decision builds up: the conditions as they become, the Events their changes post, the actions."""

    conditions: list[dict]
    events: list[PostEvent] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    recheck_at: dt.datetime | None = None

    @classmethod
    def of(cls, body: dict[str, Any]) -> Plan:
        return cls(list((body.get("status") or {}).get("conditions") or []))

    def condition(self, type_: str, ok: bool, reason: str, message: str, event: str | None = None,
                  warning: bool = False) -> None:
        """Set a condition; post `event` only when it changes (each pass re-decides, an Event is said once)."""
        before = _condition(self.conditions, type_)
        self.conditions = conditions_with({"conditions": self.conditions}, type_, ok, reason, message)
        if event and before != _condition(self.conditions, type_):
            self.events.append(PostEvent(event, message, warning=warning))

    def record_loss(self, death: Death) -> None:
        self.condition(LOST, True, death.kind.value, death.detail, event="BookieLost", warning=True)

    def report_disabled(self) -> None:
        """Say, once, why a lost bookie's ledgers are not being repaired."""
        self.condition(REPAIRED, False, AUTO_RECOVERY_DISABLED, "auto-recovery is disabled (spec.autoRecovery.enabled):"
                       " no repair is launched until it is enabled", event=AUTO_RECOVERY_DISABLED, warning=True)


def _condition(conditions: Sequence[dict], type_: str) -> tuple[str, str, str] | None:
    found = next((c for c in conditions if c["type"] == type_), None)
    return (found["status"], found.get("reason", ""), found.get("message", "")) if found else None


def delete_pod_on_purpose(observed: ObservedBookie, force: bool) -> list[Action]:
    """Delete the bookie's pod, annotated first so that its deletion is not counted as a new loss."""
    bookie, pod = observed.bookie, observed.pod
    assert pod is not None
    ns, name = bookie.metadata.namespace, bookie.metadata.name
    annotate = Patch(CUSTOM, "bookies", ns, name,
                     {"metadata": {"annotations": {ANNOTATION_PLANNED_RESTART: pod["metadata"]["uid"]}}})
    return [annotate, ForceDeletePod(ns, name) if force else Delete(CORE, "pods", ns, name)]


def volumes_and_pod(observed: ObservedBookie) -> list[Action]:
    """Create what is missing; never a pod against a claim being deleted or on a vanished node (it would stay
    Pending for ever)."""
    missing = {claim.name for claim in observed.claims if not claim.exists}
    actions: list[Action] = [Ensure(claim) for claim in resources.bookie_pvcs(observed.cluster, observed.bookie)
                             if claim["metadata"]["name"] in missing]
    if observed.pod is None and not any(claim.terminating or claim.lost_node for claim in observed.claims):
        actions.append(Ensure(resources.bookie_pod(observed.cluster, observed.bookie)))
    return actions


def replace(observed: ObservedBookie, pod: dict | None, plan: Plan) -> bool:
    """Fresh pod, volumes and cookie for a bookie whose data is gone or whose pod is stuck on a deleted node, now
    that its ledgers are safe elsewhere. The old pod and claims go first; returns True once the fresh ones are made."""
    bookie = observed.bookie
    name = bookie.metadata.name
    if pod is not None:
        plan.actions += delete_pod_on_purpose(observed, force=observed.on_dead_node)
        if observed.on_dead_node:
            plan.events.append(PostEvent("PodForceDeleted", f"pod {name} was stuck on node {pod['spec']['nodeName']}"
                                         f" ({observed.node_ready}): force-deleted now that its ledgers are safe",
                                         warning=True))
    plan.actions += [Delete(CORE, "persistentvolumeclaims", bookie.metadata.namespace, claim.name)
                     for claim in observed.claims if claim.exists and not claim.terminating]
    if pod is not None or any(claim.exists for claim in observed.claims):
        return False  # next pass, once they are gone
    plan.actions += [ForgetCookie(ZooKeeperTarget.of(observed.cluster), bookie.spec.bookie_id),
                     *volumes_and_pod(observed)]
    plan.condition(LOST, False, "Replaced", f"bookie {name} rejoins empty, with fresh volumes and a fresh cookie",
                   event="BookieReplaced")
    return True


def repaired_since(conditions: Sequence[dict], lost_since: dt.datetime) -> bool:
    """The Repaired condition turned True after this loss began: its repair succeeded, whatever became of its Jobs."""
    found = next((c for c in conditions if c["type"] == REPAIRED), None)
    when = parse_time(found.get("lastTransitionTime")) if found and found.get("status") == "True" else None
    return when is not None and when >= lost_since


def back_on_its_volumes(observed: ObservedBookie, plan: Plan) -> dict | None:
    """A lost bookie's pod made again on its surviving volumes and data (a failed one deleted first, unless on a dead
    node, whose kubelet would never confirm): the pod alone decides it, no ZooKeeper. Returns the pod as it stays."""
    pod = observed.pod
    if pod_failed(pod) and not observed.on_dead_node:
        plan.actions += delete_pod_on_purpose(observed, force=False)
        pod = None
    if pod is None and observed.data_present:
        plan.actions.append(Ensure(resources.bookie_pod(observed.cluster, observed.bookie)))
    return pod


def decide_loss(observed: ObservedBookie, lost_since: dt.datetime, at: dt.datetime, plan: Plan) -> dt.datetime | None:
    """One step of a recorded loss; returns the loss time, or None once it is over."""
    bookie, name = observed.bookie, observed.bookie.metadata.name
    pod = observed.pod
    registered = pod_ready(pod) and observed.registration is not None
    planned = _condition(plan.conditions, LOST) is not None and _condition(plan.conditions, LOST)[1] in {
        kind.value for kind in PLANNED_DISRUPTIONS.values()}
    planned_delay = observed.cluster.spec.auto_recovery.planned_restart_delay_seconds if planned else None
    verdict = decide_lost_bookie(lost_since.timestamp(), at.timestamp(), observed.recovery_delay,
                                 observed.recovery_disabled, registered, data_present=observed.data_present,
                                 planned_delay=planned_delay)
    if verdict.action == LostBookieAction.NOTHING:
        plan.condition(LOST, False, "BookieReturned", f"bookie {name} came back with its data", event="BookieReturned")
        return None
    pod = back_on_its_volumes(observed, plan)
    if verdict.action == LostBookieAction.WAIT:
        if observed.recovery_disabled:
            plan.report_disabled()
        elif verdict.recheck_at is not None:
            plan.recheck_at = dt.datetime.fromtimestamp(verdict.recheck_at, dt.UTC)
        return lost_since
    if repaired_since(plan.conditions, lost_since):  # its Jobs may be gone (ttlSecondsAfterFinished)
        step = repairs.RepairStep(repairs.Outcome.REPAIRED)
    else:
        step = repairs.decide_repair(observed.recovery_disabled, observed.repair, at,
                                     observed.cluster.spec.auto_recovery.repair.max_concurrent)
    if step.launch is not None:
        plan.actions.append(LaunchRepair(observed.cluster, bookie, lost_since, step.launch))
    if step.outcome == repairs.Outcome.REPAIRED:
        plan.condition(REPAIRED, True, "RepairSucceeded", f"the ledgers of bookie {name} are fully replicated again",
                       event="RepairSucceeded")
        if observed.data_present and observed.node_ready != NODE_GONE:
            if observed.on_dead_node:
                node = pod["spec"]["nodeName"] if pod else "?"
                plan.condition(LOST, True, DeathKind.NODE_LOST.value,
                               f"pod {name} is stuck on node {node} ({observed.node_ready}); its ledgers are"
                               " repaired elsewhere, its volumes kept until the node returns or its Node is deleted",
                               event="VolumesKept")
            return lost_since  # down with its data kept: Lost until it comes back
        return None if replace(observed, pod, plan) else lost_since
    if step.outcome == repairs.Outcome.DISABLED:
        plan.report_disabled()
    elif step.outcome == repairs.Outcome.BACKING_OFF:
        plan.condition(REPAIRED, False, "RepairFailed", "repair failed, retrying with backoff", event="RepairFailed",
                       warning=True)
    elif step.outcome == repairs.Outcome.GAVE_UP:
        plan.condition(REPAIRED, False, REPAIR_GAVE_UP, f"repair failed {repairs.MAX_ATTEMPTS} times; giving up until "
                       "the Bookie changes", event=REPAIR_GAVE_UP, warning=True)
    elif step.outcome == repairs.Outcome.QUEUED:
        active = observed.repair.others_active
        plan.condition(REPAIRED, False, "RepairQueued", f"waiting for one of the cluster's {active} active repairs "
                       "to end (spec.autoRecovery.repair.maxConcurrent)")
    else:
        plan.condition(REPAIRED, False, "Repairing", "repair in progress")
    return lost_since


def decide(observed: ObservedBookie, at: dt.datetime) -> Decision:
    """The Bookie's status and the actions that bring its pod, volumes and repair where they should be (pure). The
    status goes first: a loss time is recorded before a repair named after it is launched, and the Events of a change
    are posted with it. While the cluster's ZooKeeper has no live session, what the pod tells is decided all the
    same (its death recorded, a pod made again on surviving volumes); the rest waits for ZooKeeper (whether the bookie
    is registered, the lost-bookie rule, its repair), at the retry interval."""
    bookie, pod = observed.bookie, observed.pod
    lost_since = bookie.status.lost_since
    if bookie.spec.desired_state != DesiredState.WRITABLE:  # decommissioning: clusters.py drives it
        if not observed.zookeeper_reached:
            return Decision((), requeue=True)
        return Decision((PatchStatus("bookies", decide_status(bookie, pod, observed.registration, observed.ledgers,
                                                              lost_since), if_unchanged=True),), requeue=True)
    plan = Plan.of(observed.body)
    planned = bookie.metadata.annotations.get(ANNOTATION_PLANNED_RESTART)
    if planned and pod_ready(pod) and pod["metadata"]["uid"] != planned:
        plan.actions.append(Patch(CUSTOM, "bookies", bookie.metadata.namespace, bookie.metadata.name,
                                  {"metadata": {"annotations": {ANNOTATION_PLANNED_RESTART: None}}}))
    plan.actions += track_disruption(observed)
    if lost_since is None and (death := find_death(observed, at)):
        lost_since = death.since
        plan.record_loss(death)
    if lost_since is None:
        plan.actions += zone_from_node(observed)
        plan.actions += volumes_and_pod(observed)
        plan.recheck_at = crash_loop_due(observed, at)
    elif not observed.zookeeper_reached:
        back_on_its_volumes(observed, plan)
    else:
        lost_since = decide_loss(observed, lost_since, at, plan)
    known = decide_status(bookie, pod, observed.registration, observed.ledgers, lost_since) \
        if observed.zookeeper_reached else status_without_zookeeper(bookie, pod, lost_since)
    status = {**known, "conditions": plan.conditions}
    return Decision((PatchStatus("bookies", status, if_unchanged=True), *plan.events, *plan.actions), plan.recheck_at,
                    requeue=not settled(observed, lost_since))


def zone_from_node(observed: ObservedBookie) -> list[Action]:
    """A Bookie of a cluster that lists no zones takes its node's zone once its pod is bound: recorded in its spec,
    the zone reaches the bookie as a listed one does (`--zone`, so its registration carries it, and a node affinity
    that keeps it with its volumes). A pod not yet Ready is restarted at once, mostly before it has registered
    without a zone; a serving one is restarted by the cluster's rollout, one bookie at a time."""
    bookie, pod, zone = observed.bookie, observed.pod, observed.node_zone
    if zone is None or bookie.spec.zone is not None:
        return []
    meta = bookie.metadata
    actions: list[Action] = [
        Patch(CUSTOM, "bookies", meta.namespace, meta.name, {"spec": {"zone": zone}}),
        PostEvent("ZoneFromNode", f"bookie {meta.name} is in zone {zone}, its node's"),
    ]
    if pod is not None and not pod_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
        actions += delete_pod_on_purpose(observed, force=False)
    return actions


def settled(observed: ObservedBookie, lost_since: dt.datetime | None) -> bool:
    """Serving and registered, nothing lost or planned: only a change (its pod, claims, Bookie or registration, each
    watched) can call for another pass. Anything else is in motion and passed again at the retry interval (a repair
    or a drain progressing in ZooKeeper, a bookie starting)."""
    return lost_since is None and pod_ready(observed.pod) and observed.registration is not None \
        and not observed.bookie.metadata.annotations.get(ANNOTATION_PLANNED_RESTART)


def track_disruption(observed: ObservedBookie) -> list[Action]:
    """Note a planned disruption while the pod terminates (once it is gone, only the Bookie remembers why), and
    forget it once another pod is Ready."""
    bookie, pod = observed.bookie, observed.pod
    recorded = bookie.metadata.annotations.get(ANNOTATION_DISRUPTION)
    reason = planned_disruption(pod)
    value = f"{pod['metadata'].get('uid')} {reason}" if pod is not None and reason else None
    if value and value != recorded:
        change: str | None = value
    elif recorded and pod_ready(pod) and not recorded.startswith(f"{pod['metadata'].get('uid')} "):
        change = None
    else:
        return []
    return [Patch(CUSTOM, "bookies", bookie.metadata.namespace, bookie.metadata.name,
                  {"metadata": {"annotations": {ANNOTATION_DISRUPTION: change}}})]


def crash_loop_due(observed: ObservedBookie, at: dt.datetime) -> dt.datetime | None:
    """When a restarting pod will have been not Ready for longer than the delay (find_death's crash loop)."""
    pod = observed.pod
    if not restarting(pod, observed.bookie.metadata.annotations.get(ANNOTATION_PLANNED_RESTART)):
        return None
    return not_ready_since(pod, at) + dt.timedelta(seconds=observed.recovery_delay + 1)


def decide_status(bookie: Bookie, pod: dict | None, info: BookieInfo | None, ledgers: int,
                  lost_since: dt.datetime | None) -> dict:
    """The Bookie's status from its pod, its registration, its ledger count and its loss (pure)."""
    if bookie.spec.desired_state != DesiredState.WRITABLE:
        phase = BookiePhase.DECOMMISSIONING
    elif lost_since:
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
        "diskUsage": disk_usage(info.free_bytes, bookie) if info else None,
        "lostSince": timestamp(lost_since) if lost_since else None,
    }


def status_without_zookeeper(bookie: Bookie, pod: dict | None, lost_since: dt.datetime | None) -> dict:
    """What the status says while ZooKeeper cannot be read: the pod and the loss; the registration, the ledger count
    and the disk usage stay as last read."""
    status = {"pod": bookie.metadata.name if pod else None, "lostSince": timestamp(lost_since) if lost_since else None}
    return {**status, "phase": BookiePhase.LOST.value} if lost_since else status


def disk_usage(free_bytes: int, bookie: Bookie) -> float:
    """Used fraction of the ledger volume, from the free bytes the bookie registers."""
    quota = resources.quantity_bytes(bookie.spec.storage.ledgers.size)
    return round(min(max(1 - free_bytes / quota, 0.0), 1.0), 4) if quota else 0.0


# --- act ---------------------------------------------------------------------------------------------------------

def reconcile(ctx: OperatorContext, body: dict, sources: BookieSources | None = None,
              retry: float | None = None) -> float | None:
    """One level-based pass over a Bookie; the seconds until the next pass is due (at a time the decision named, or
    after `retry` while it is in motion; None: only a change calls for one). A pass whose cached copy of the Bookie
    was older than the last write to it (409 Conflict on the status patch) runs again on a fresh GET."""
    cached = sources or BookieSources.live(ctx.api)
    decision, at = again_on_conflict(functools.partial(_one_pass, ctx, body), cached, lambda: dataclasses.replace(
        cached, bookie=BookieSources.live(ctx.api).bookie))
    return None if decision is None else decision.due(at, retry)


def _one_pass(ctx: OperatorContext, body: dict, sources: BookieSources) -> tuple[Decision | None, dt.datetime]:
    observed = observe(ctx, body, sources)
    at = now()
    if observed is None:
        return None, at
    decision = decide(observed, at)
    act(ctx, observed.body, decision.actions)
    return decision, at
