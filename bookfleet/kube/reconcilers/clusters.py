"""A BookieCluster's shape: Bookies for its replicas, safe scale-down, rollouts, volumes, and its status.

observe (Kubernetes and ZooKeeper → `ObservedCluster`) → decide (pure: `decide(observed, now)` → `Decision`) → act.

Scale-down never deletes data that is still needed: the highest ordinal is drained first (read-only, its ledgers
repaired elsewhere, none left under-replicated, cookie removed) and only then are its pod and Bookie deleted; its
volumes follow the whenScaled policy. A Bookie whose desiredState is not Writable is forced read-only through its
ZooKeeper state node (level-based, on every pass), so the bookie itself refuses adds and leaves the writable
registrations that placement picks from. Scaled up again before its cookie is gone, a draining bookie turns writable
again; after, the drain finishes and the ordinal starts afresh.

Rollouts: every bookie pod carries the digest of what the bookie runs (resources.runs_hash: image, command line,
environment, resources, volumes; not the labels, probes or security contexts the operator adds around it). A pod whose
digest differs from what the current spec builds is restarted, one bookie at a time and only while every other bookie
is ready and registered; the next waits until the restarted one is ready and registered in a pod of the current spec.
One that is not within spec.rolloutTimeoutSeconds halts the rollout (RolloutStuck); it stays a planned restart for
bookies.py, so no repair starts. Changing the spec again restarts it at once (it is down anyway). Clusters roll one at
a time (`RolloutTurn`): an operator upgrade that brings a new bookie image rolls the first cluster to completion
before the next begins, and a stuck one halts them all; spec.rollout.paused holds a cluster's restarts back.
"""

from __future__ import annotations

import collections
import datetime as dt
import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kazoo.client import KazooClient
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from bookfleet.kube import resources
from bookfleet.kube.models import (
    VALID,
    Autoscaling,
    Bookie,
    BookieCluster,
    DesiredState,
    Retention,
    Storage,
    Volume,
    cluster_problems,
)
from bookfleet.kube.reconcilers import autoscaler, certificates, repairs
from bookfleet.kube.reconcilers.actions import (
    Action,
    Apply,
    ApplyShared,
    Decision,
    Delete,
    Ensure,
    Patch,
    PatchStatus,
    PostEvent,
    act,
    again_on_conflict,
)
from bookfleet.kube.reconcilers.bookies import (
    ANNOTATION_PLANNED_RESTART,
    LEDGER_COUNT_MAX_AGE,
    REPAIR_GAVE_UP,
    REPAIRED,
    ForgetCookie,
    LaunchRepair,
    Lookup,
    disk_usage,
    pod_ready,
)
from bookfleet.kube.runtime import metrics
from bookfleet.kube.runtime.api import CORE, CUSTOM, KubeApi
from bookfleet.kube.runtime.context import OperatorContext, ZooKeeperTarget, conditions_with, now, timestamp
from bookfleet.meta import bookiestate, cookies
from bookfleet.meta.registry import BookieMode, BookieRegistry
from bookfleet.meta.underreplication import UnderReplication

ANNOTATION_DECOMMISSION_SINCE = "bookfleet.io/decommission-since"
ANNOTATION_ROLLOUT_STARTED = "bookfleet.io/rollout-started"
"""On a Bookie whose pod a rollout restarted: when. Removed once it is ready and registered in a current pod."""
ANNOTATION_RELEASED = "bookfleet.io/released-from"
"""On a PVC kept (whenScaled Retain) after its bookie was drained and deleted: that Bookie's uid. Such a claim holds
a cookie ZooKeeper no longer has, so a bookie of the same ordinal could never start on it."""
ANNOTATION_EXPANSION_REFUSED = "bookfleet.io/expansion-refused"
"""On a PVC whose expansion the API server refused: the size asked for (not asked again until the spec changes)."""
PVCS = "persistentvolumeclaims"
READY = "Ready"
UPGRADING = "Upgrading"
ROLLOUT_STUCK = "RolloutStuck"
VOLUMES_EXPANDED = "VolumesExpanded"


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


# --- observe -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One Bookie as its cluster's pass sees it: its pod, its registration and, when it is being drained, what still
    needs it (the Bookie's own pass observes its loss instead: `bookies.ObservedBookie`)."""

    body: dict[str, Any]
    pod: dict[str, Any] | None
    registered: bool
    forced_read_only: bool
    cookie: bool = True
    remaining_ledgers: int = 0
    repair: repairs.RepairObserved = field(default_factory=repairs.RepairObserved)
    """The repair attempts of its drain (looked at only while it is drained with ledgers left)."""

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def model(self) -> Bookie:
        return Bookie.model_validate(self.body)

    @property
    def annotations(self) -> dict[str, str]:
        return self.body["metadata"].get("annotations") or {}

    @property
    def writable(self) -> bool:
        return self.body["spec"].get("desiredState", DesiredState.WRITABLE) == DesiredState.WRITABLE

    @property
    def decommissioning(self) -> bool:
        return not self.writable and ANNOTATION_DECOMMISSION_SINCE in self.annotations

    @property
    def decommission_since(self) -> dt.datetime | None:
        """When its drain began: the repair of its ledgers is named after it, as a loss's is after its time."""
        text = self.annotations.get(ANNOTATION_DECOMMISSION_SINCE)
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text and not self.writable else None

    @property
    def up(self) -> bool:
        """Ready and registered: what a rollout waits for before touching the next bookie."""
        return pod_ready(self.pod) and self.registered


@dataclass(frozen=True)
class FleetFacts:
    """The fleet's health as its ZooKeeper holds it, through meta's readers: markers and DATA_LOSS records of every
    ledger (not only those a Ledger resource shows), and the writable registrations' zones."""

    under_replicated: int = 0
    data_loss: int = 0
    oldest_marker_ms: int | None = None
    writable_zones: tuple[str, ...] = ()
    """The zone of each writable registered bookie ("" for none)."""
    free_bytes: Mapping[str, int] = field(default_factory=dict)
    """The free bytes each registered bookie (writable or read-only) last reported, by bookie id: the autoscaler's
    disk usage, as fresh as the bookie's last disk check (a settled Bookie's status is a resync old)."""

    @classmethod
    def read(cls, zk: KazooClient) -> FleetFacts:
        """One walk of the marker tree and a read of each marker (multiRead batches), the DATA_LOSS records and the
        registrations: a pass's cost grows with the ledgers marked, none per healthy ledger."""
        under_replication = UnderReplication(zk)
        markers = under_replication.markers()
        registered = BookieRegistry(zk).all()
        return cls(len(markers), len(under_replication.data_losses()),
                   min((marker.ctime for marker in markers), default=None),
                   tuple(info.zone for info in registered if info.state == BookieMode.WRITABLE),
                   {info.bookie_id: info.free_bytes for info in registered})


ClusterKey = tuple[str, str]
"""(namespace, name) of a BookieCluster."""


class RolloutTurn:
    """Which cluster may restart bookies for a new spec or a new operator: one at a time among the clusters this
    operator manages, so the first cluster to run a new bookie image proves it before any other restarts a bookie
    for it, and a stuck rollout halts them all. Held in the process (only the acting replica's passes run); a
    cluster holds it from its first restart until it has no bookie left to restart, is paused, or is deleted. After
    an operator restart the first cluster with bookies to restart takes it."""

    def __init__(self) -> None:
        self._holder: ClusterKey | None = None
        self._lock = threading.Lock()

    def holder(self) -> ClusterKey | None:
        return self._holder

    def take(self, key: ClusterKey) -> bool:
        with self._lock:
            if self._holder not in (None, key):
                return False
            self._holder = key
            return True

    def release(self, key: ClusterKey) -> None:
        with self._lock:
            if self._holder == key:
                self._holder = None


ROLLOUT_TURN = RolloutTurn()


@dataclass(frozen=True)
class ObservedCluster:
    body: dict[str, Any]
    cluster: BookieCluster | None
    problem: str = ""
    bookies: tuple[Member, ...] = ()
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The cluster's PVCs by name."""
    recovery_disabled: bool = False
    """The auto-recovery switch in ZooKeeper (read only while a bookie is being drained)."""
    fleet: FleetFacts = field(default_factory=lambda: FleetFacts())
    """What ZooKeeper says of the fleet's health, for the metrics."""
    turn: RolloutTurn = ROLLOUT_TURN
    turn_holder: ClusterKey | None = None
    """The cluster whose rollout goes on (`RolloutTurn`), as this pass found it."""

    @property
    def key(self) -> ClusterKey:
        return self.body["metadata"]["namespace"], self.body["metadata"]["name"]


Listing = Callable[[str, str], list[dict[str, Any]]]
"""(namespace, cluster name) -> the cluster's objects of one kind."""


@dataclass(frozen=True)
class ClusterSources:
    """Where a pass reads the cluster's Bookies, their pods and their claims. The operator passes its informers'
    caches (kube.caches: two LISTs a pass added up at 1,000 bookies); `live` reads them from the API server, as a
    pass does again after a write decided from a stale cache copy met a 409 Conflict."""

    bookies: Listing
    pod: Lookup
    claims: Listing
    turn: RolloutTurn = ROLLOUT_TURN

    @classmethod
    def live(cls, api: KubeApi) -> ClusterSources:
        return cls(bookies=lambda namespace, name: api.list(CUSTOM, "bookies", namespace,
                                                            {resources.LABEL_CLUSTER: name}),
                   pod=lambda namespace, name: api.get(CORE, "pods", namespace, name),
                   claims=lambda namespace, name: api.list(CORE, PVCS, namespace, {resources.LABEL_CLUSTER: name}))


def observe(ctx: OperatorContext, body: dict, sources: ClusterSources | None = None) -> ObservedCluster:
    """Kubernetes and ZooKeeper as one value; what still needs a bookie is read only for those being drained. The
    Bookies, pods and claims come from `sources` (default: live reads); a draining Bookie is read afresh (a rare
    case, and every step of its drain is decided from it)."""
    sources = sources or ClusterSources.live(ctx.api)
    cluster, problem = validate(body)
    if cluster is None:
        return ObservedCluster(body, None, problem, turn=sources.turn, turn_holder=sources.turn.holder())
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    zk = ctx.zk(ZooKeeperTarget.of(cluster))
    registered = BookieRegistry(zk).ids()
    forced = bookiestate.forced_ids(zk)
    bodies = []
    for bookie in sorted(sources.bookies(ns, name), key=lambda b: ordinal(b["metadata"]["name"])):
        if draining(bookie) and (bookie := ctx.api.get(CUSTOM, "bookies", ns, bookie["metadata"]["name"])) is None:
            continue
        bodies.append(bookie)
    disabled = UnderReplication(zk).is_disabled() if any(map(draining, bodies)) else False
    bookies = []
    for bookie in bodies:
        bookie_id = bookie["spec"]["bookieId"]
        seen = Member(bookie, sources.pod(ns, bookie["metadata"]["name"]), bookie_id in registered, bookie_id in forced)
        if draining(bookie):
            seen = observe_drain(ctx, cluster, seen, disabled)
        bookies.append(seen)
    claims = {c["metadata"]["name"]: c for c in sources.claims(ns, name)}
    return ObservedCluster(body, cluster, "", tuple(bookies), claims, disabled, FleetFacts.read(zk), sources.turn,
                           sources.turn.holder())


def draining(bookie: dict[str, Any]) -> bool:
    return bookie["spec"].get("desiredState", DesiredState.WRITABLE) != DesiredState.WRITABLE


def observe_drain(ctx: OperatorContext, cluster: BookieCluster, bookie: Member,
                  disabled: bool) -> Member:
    """What still needs a draining bookie: its cookie, the ledgers left on it and, while there are some, the repair
    attempts of its drain (decide chooses the next one; act launches it)."""
    zk = ctx.zk(ZooKeeperTarget.of(cluster))
    bookie_id = bookie.body["spec"]["bookieId"]
    since = bookie.decommission_since
    # Begun after the drain began (a ledger created on it before then counts); before that, a recent one will do.
    began_after = since or now() - LEDGER_COUNT_MAX_AGE
    remaining = len(repairs.remaining_ledgers(zk, bookie_id, began_after))
    repair = repairs.observe_repair(ctx, cluster, bookie.model, since) if remaining and since and not disabled \
        else repairs.RepairObserved()
    return replace(bookie, cookie=cookies.exists(zk, bookie_id), remaining_ledgers=remaining, repair=repair)


# --- actions of this reconciler --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigureAutoRecovery:
    """The one place of these settings: the auditor, the repair job and every Bookie's loss decision read them."""

    zookeeper: ZooKeeperTarget
    enabled: bool
    delay_seconds: int

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        UnderReplication(ctx.zk(self.zookeeper)).configure(self.enabled, self.delay_seconds)


@dataclass(frozen=True)
class RecordFleetHealth:
    """The fleet's health in the operator's metrics (kube.runtime.metrics.FLEETS), served while this replica acts
    for it."""

    health: metrics.FleetHealth

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        metrics.FLEETS.record(body["metadata"]["namespace"], body["metadata"]["name"], self.health)


@dataclass(frozen=True)
class EnsureCertificates:
    cluster: BookieCluster
    bookies: tuple[Bookie, ...]

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        certificates.ensure(ctx.api, self.cluster, list(self.bookies), now())


@dataclass(frozen=True)
class SetForcedReadOnly:
    """Force a bookie read-only (reason given) or release it (reason None) through its ZooKeeper state node."""

    zookeeper: ZooKeeperTarget
    bookie_id: str
    reason: str | None

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        zk = ctx.zk(self.zookeeper)
        if self.reason is None:
            bookiestate.clear(zk, self.bookie_id)
        else:
            bookiestate.set_read_only(zk, self.bookie_id, self.reason)


@dataclass(frozen=True)
class InTurn:
    """Restart a bookie for the rollout only as the holder of the rollout turn: another cluster may have taken it
    since this pass looked (then nothing is done; the next pass finds it taken)."""

    turn: RolloutTurn
    key: ClusterKey
    actions: tuple[Action, ...]

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        if self.turn.take(self.key):
            act(ctx, body, self.actions)


@dataclass(frozen=True)
class GiveUpTurn:
    """The cluster has no bookie left to restart, is paused or invalid: the next cluster's rollout may go on."""

    turn: RolloutTurn
    key: ClusterKey

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        self.turn.release(self.key)


@dataclass(frozen=True)
class ExpandClaim:
    """Ask for a bigger volume; a refusal (the storage class does not allow expansion) is recorded on the claim and
    said once in a Warning Event, instead of failing every pass."""

    namespace: str
    name: str
    size: str

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        try:
            ctx.api.patch(CORE, PVCS, self.namespace, self.name,
                          {"spec": {"resources": {"requests": {"storage": self.size}}}})
        except ApiException as exc:
            if exc.status not in (403, 422):
                raise
            ctx.api.patch(CORE, PVCS, self.namespace, self.name,
                          {"metadata": {"annotations": {ANNOTATION_EXPANSION_REFUSED: self.size}}})
            ctx.api.post_event(body, "VolumeExpansionRefused",
                               f"PVC {self.name} cannot grow to {self.size}: {exc.reason}", warning=True)


# --- decide --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rollout:
    """Where the rollout stands: bookies up in a current pod, the one restarting, whether it is stuck."""

    updated: int
    restarting: str | None = None
    stuck: str | None = None
    waiting_for: str | None = None
    outdated: int = 0
    """Bookies in a pod not of the current spec, not restarted yet."""
    paused: bool = False
    behind: ClusterKey | None = None
    """The cluster whose rollout goes first (this one has bookies to restart and waits for its turn)."""


def decide(observed: ObservedCluster, moment: dt.datetime) -> Decision:
    """Everything one pass does, in order (pure); nothing but a change, or the next interval, calls for another."""
    body, cluster = observed.body, observed.cluster
    status = body.get("status") or {}
    if cluster is None:
        conditions = conditions_with(status, VALID, False, "InvalidSpec", observed.problem)
        give_up = give_up_turn(observed.turn, observed.turn_holder, observed.key)
        if conditions == status.get("conditions"):
            return Decision(tuple(give_up))
        return Decision((*give_up, PatchStatus("bookieclusters", {"conditions": conditions}),
                         PostEvent("InvalidSpec", observed.problem, warning=True)))
    spec = cluster.spec
    actions: list[Action] = [
        ConfigureAutoRecovery(ZooKeeperTarget.of(cluster), spec.auto_recovery.enabled,
                              spec.auto_recovery.lost_bookie_recovery_delay_seconds),
        *apply_owned_objects(cluster),
    ]
    wanted = [b for b in observed.bookies if ordinal(b.name) < spec.replicas]
    surplus = [b for b in observed.bookies if ordinal(b.name) >= spec.replicas]
    actions += create_missing_bookies(observed, cluster)
    actions.append(EnsureCertificates(cluster, tuple(b.model for b in observed.bookies)))
    actions += sync_read_only(ZooKeeperTarget.of(cluster), observed.bookies)
    actions += cancel_drains(wanted)
    # A bookie scaled up again after its cookie went still finishes its drain: its disks can never serve it again.
    finishing = [b for b in wanted if b.decommissioning and not b.cookie]
    draining = sorted(surplus + finishing, key=lambda b: ordinal(b.name), reverse=True)
    if draining:
        actions += decommission(observed, cluster, draining[0], moment)
    serving = [b for b in wanted if b not in finishing]
    actions += follow_storage(observed, cluster, serving)
    rollout_actions, rollout = decide_rollout(cluster, serving, observed.claims, moment, observed.turn_holder,
                                              observed.turn)
    actions += rollout_actions
    actions += rollout_events(status, cluster, rollout)
    ready = sum(pod_ready(b.pod) for b in serving)
    if spec.autoscaling is not None:
        actions += autoscale(observed, spec.autoscaling, spec.replicas, serving, draining, moment)
    actions.append(PatchStatus("bookieclusters", decide_status(status, cluster, ready, bool(draining), rollout,
                                                               refused_expansions(observed))))
    health = RecordFleetHealth(fleet_health(observed, cluster, rollout, draining[:1], moment))
    return Decision((health, *actions))  # first: an action that fails later in the pass leaves it recorded


def autoscale(observed: ObservedCluster, policy: Autoscaling, replicas: int, serving: list[Member],
              draining: list[Member], moment: dt.datetime) -> list[Action]:
    """The autoscaler's step: replicas and the time of the change in one patch, on the version observed (a stale
    copy of the cluster, without the last change's time, meets 409 Conflict instead of scaling again)."""
    free = observed.fleet.free_bytes
    settled = not draining and len(serving) == replicas and all(
        b.up and b.body["spec"]["bookieId"] in free for b in serving)
    usage = {b.name: disk_usage(free[b.body["spec"]["bookieId"]], b.model) for b in serving} if settled else {}
    meta = observed.body["metadata"]
    scaled_at = (meta.get("annotations") or {}).get(autoscaler.ANNOTATION_SCALED_AT)
    scale = autoscaler.decide_scale(policy, replicas, usage, settled,
                                    dt.datetime.fromisoformat(scaled_at.replace("Z", "+00:00")) if scaled_at else None,
                                    moment)
    if scale is None:
        return []
    return [Patch(CUSTOM, "bookieclusters", meta["namespace"], meta["name"],
                  {"metadata": {"annotations": {autoscaler.ANNOTATION_SCALED_AT: timestamp(moment)}},
                   "spec": {"replicas": scale.replicas}}, if_version=meta.get("resourceVersion")),
            PostEvent(scale.reason, f"replicas {replicas} -> {scale.replicas}: {scale.message}")]


def fleet_health(observed: ObservedCluster, cluster: BookieCluster, rollout: Rollout, drained: list[Member],
                 moment: dt.datetime) -> metrics.FleetHealth:
    """The figures the chart's alerts are on (pure): ZooKeeper's facts, writable bookies by zone (every zone of the
    spec, or else of its Bookies as their nodes gave them, shown, 0 when it has none), the rollout, and the repairs
    given up: a lost bookie's (its Repaired condition) and the drain's (decided here as its next step is)."""
    facts = observed.fleet
    zones = cluster.spec.zones or sorted({zone for b in observed.bookies if (zone := b.body["spec"].get("zone"))})
    by_zone = dict.fromkeys(zones, 0) | collections.Counter(facts.writable_zones)
    gave_up = sum(any(c.get("type") == REPAIRED and c.get("reason") == REPAIR_GAVE_UP
                      for c in (b.body.get("status") or {}).get("conditions") or []) for b in observed.bookies)
    limit = cluster.spec.auto_recovery.repair.max_concurrent
    gave_up += sum(b.remaining_ledgers > 0 and b.decommission_since is not None and repairs.decide_repair(
        observed.recovery_disabled, b.repair, moment, limit).outcome == repairs.Outcome.GAVE_UP for b in drained)
    return metrics.FleetHealth(facts.under_replicated, facts.data_loss, facts.oldest_marker_ms, by_zone,
                               rollout.stuck is not None, gave_up)


def apply_owned_objects(cluster: BookieCluster) -> list[Action]:
    """Server-side apply of everything the cluster owns whole: Service, disruption budget, network policies, the
    executor template, and the repair account it shares with the namespace's other clusters naming it (each one of
    its owners). Upgrades and spec changes reach them, drift is undone; applying what is already there writes
    nothing. NetworkPolicies switched off are deleted (a no-op once gone)."""
    owned = [*resources.cluster_objects(cluster), resources.executor_template(cluster)]
    actions: list[Action] = [Apply(manifest) for manifest in owned]
    actions += [ApplyShared(manifest, resources.owner_claim(manifest, cluster))
                for manifest in resources.repair_account_objects(cluster)]
    if not cluster.spec.network_policy.enabled:
        actions += [Delete(m["apiVersion"], "networkpolicies", m["metadata"]["namespace"], m["metadata"]["name"])
                    for m in resources.network_policies(cluster)]
    return actions


def create_missing_bookies(observed: ObservedCluster, cluster: BookieCluster) -> list[Action]:
    """A Bookie for every missing ordinal, on volumes it can start on: claims released by a drained bookie of the
    same ordinal are deleted first, and a claim still being deleted is waited for (a pod created against it would
    stay Pending for ever)."""
    existing = {b.name for b in observed.bookies}
    actions: list[Action] = []
    for manifest in resources.bookies_for_cluster(cluster):
        name = manifest["metadata"]["name"]
        if name in existing:
            continue
        leftovers = [c for n in resources.claim_names(name) if (c := observed.claims.get(n))]
        released = [c for c in leftovers if ANNOTATION_RELEASED in (c["metadata"].get("annotations") or {})
                    and not c["metadata"].get("deletionTimestamp")]
        for claim in released:
            actions.append(Delete(CORE, PVCS, cluster.metadata.namespace, claim["metadata"]["name"]))
        if released:
            names = ", ".join(c["metadata"]["name"] for c in released)
            actions.append(PostEvent("StaleVolumesDeleted", f"{names} of drained {name} deleted: {name} starts on new "
                                     "volumes (the old ones hold a cookie ZooKeeper no longer has)"))
        dying = any(c["metadata"].get("deletionTimestamp") for c in leftovers)
        if not released and not dying:
            actions.append(Ensure(manifest))  # on new volumes, or on those whenDeleted Retain kept: with its data
    return actions


def sync_read_only(zookeeper: ZooKeeperTarget, bookies: Iterable[Member]) -> list[Action]:
    """Force read-only exactly the Bookies whose desiredState is not Writable (writes only on change)."""
    actions: list[Action] = []
    for bookie in bookies:
        bookie_id, desired = bookie.body["spec"]["bookieId"], bookie.body["spec"].get("desiredState")
        if not bookie.writable and not bookie.forced_read_only:
            actions.append(SetForcedReadOnly(zookeeper, bookie_id, f"Bookie {bookie.name} is {desired}"))
        elif bookie.writable and bookie.forced_read_only:
            actions.append(SetForcedReadOnly(zookeeper, bookie_id, None))
    return actions


def cancel_drains(wanted: Iterable[Member]) -> list[Action]:
    """Scaled up again while a bookie drains, and its cookie (its identity with its disks) still there: it simply
    turns writable again; what was already repaired elsewhere stays there."""
    actions: list[Action] = []
    for bookie in wanted:
        if bookie.decommissioning and bookie.cookie:
            meta = bookie.body["metadata"]
            actions += [
                Patch(CUSTOM, "bookies", meta["namespace"], bookie.name, {
                    "metadata": {"annotations": {ANNOTATION_DECOMMISSION_SINCE: None}},
                    "spec": {"desiredState": DesiredState.WRITABLE.value},
                }),
                PostEvent("DecommissionCancelled", f"{bookie.name} is wanted again: writable, with its data",
                          involved=bookie.body),
            ]
    return actions


def decommission(observed: ObservedCluster, cluster: BookieCluster, bookie: Member,
                 moment: dt.datetime) -> list[Action]:
    """One step of draining a bookie; its data is deleted only when nothing needs it any more, and then only if
    whenScaled is Delete."""
    meta, spec = bookie.body["metadata"], bookie.body["spec"]
    ns, name, bookie_id, zookeeper = meta["namespace"], bookie.name, spec["bookieId"], ZooKeeperTarget.of(cluster)
    since = bookie.decommission_since
    if since is None:  # only on the version observed: a stale copy must not start the drain again at a later time
        return [
            Patch(CUSTOM, "bookies", ns, name, {
                "metadata": {"annotations": {ANNOTATION_DECOMMISSION_SINCE: timestamp(moment)}},
                "spec": {"desiredState": DesiredState.READ_ONLY.value},
            }, if_version=meta.get("resourceVersion")),
            PostEvent("Decommissioning", f"draining {name}: read-only, then its ledgers move elsewhere",
                      involved=bookie.body),
        ]
    if bookie.remaining_ledgers:  # its ledgers move elsewhere first: the repair's next step, as for a lost bookie
        step = repairs.decide_repair(observed.recovery_disabled, bookie.repair, moment,
                                     cluster.spec.auto_recovery.repair.max_concurrent)
        return [] if step.launch is None else [LaunchRepair(cluster, bookie.model, since, step.launch)]
    actions: list[Action] = [ForgetCookie(zookeeper, bookie_id), Delete(CORE, "pods", ns, name)]
    delete_claims = cluster.spec.persistent_volume_claim_retention_policy.when_scaled == Retention.DELETE
    for claim_name in resources.claim_names(name):
        claim = observed.claims.get(claim_name)
        if claim is None:
            continue
        if delete_claims:
            actions.append(Delete(CORE, PVCS, ns, claim_name))
        elif ANNOTATION_RELEASED not in (claim["metadata"].get("annotations") or {}):
            actions.append(Patch(CORE, PVCS, ns, claim_name, {"metadata": {
                "ownerReferences": None, "annotations": {ANNOTATION_RELEASED: meta.get("uid") or name}}}))
    if bookie.pod is not None:
        return actions  # the switch goes only after the bookie process: it must not turn writable on its way out
    kept = "" if delete_claims else "; its volumes are kept (whenScaled: Retain)"
    return [
        *actions,
        SetForcedReadOnly(zookeeper, bookie_id, None),
        Delete(CUSTOM, "bookies", ns, name),
        PostEvent("Decommissioned", f"{name} drained and removed; no ledger needs it{kept}"),
    ]


def follow_storage(observed: ObservedCluster, cluster: BookieCluster, bookies: Iterable[Member]) -> list[Action]:
    """Claims grow to the cluster's storage where the storage class allows, and their owner references follow
    whenDeleted; Bookies take the storage their claims were granted (`granted_storage`: the new quota reaches the pod
    through the rollout only once the volume has grown)."""
    actions: list[Action] = []
    for bookie in bookies:
        meta = bookie.body["metadata"]
        storage = granted_storage(cluster, bookie.name, observed.claims).to_wire()
        if bookie.body["spec"].get("storage") != storage:
            actions.append(Patch(CUSTOM, "bookies", meta["namespace"], bookie.name, {"spec": {"storage": storage}}))
        for wanted in resources.bookie_pvcs(cluster, with_storage(bookie, cluster.spec.storage)):
            claim = observed.claims.get(wanted["metadata"]["name"])
            if claim is None or claim["metadata"].get("deletionTimestamp"):
                continue
            owners = wanted["metadata"].get("ownerReferences")
            if (claim["metadata"].get("ownerReferences") or None) != owners:
                actions.append(Patch(CORE, PVCS, meta["namespace"], claim["metadata"]["name"],
                                     {"metadata": {"ownerReferences": owners}}))
            size = wanted["spec"]["resources"]["requests"]["storage"]
            if needs_expansion(claim, size):
                actions.append(ExpandClaim(meta["namespace"], claim["metadata"]["name"], size))
    return actions


def claim_size(claim: dict) -> str:
    return str(claim["spec"]["resources"]["requests"]["storage"])


def needs_expansion(claim: dict, size: str) -> bool:
    """Bigger than asked and not already refused at that size (shrinking is never possible)."""
    refused = (claim["metadata"].get("annotations") or {}).get(ANNOTATION_EXPANSION_REFUSED)
    return resources.quantity_bytes(size) > resources.quantity_bytes(claim_size(claim)) and refused != size


def refused_expansions(observed: ObservedCluster) -> list[str]:
    """Claims still smaller than a size the API server refused to grow them to."""
    return sorted(name for name, claim in observed.claims.items()
                  if (refused := (claim["metadata"].get("annotations") or {}).get(ANNOTATION_EXPANSION_REFUSED))
                  and resources.quantity_bytes(refused) > resources.quantity_bytes(claim_size(claim)))


def granted_storage(cluster: BookieCluster, bookie: str, claims: Mapping[str, dict]) -> Storage:
    """The cluster's storage as far as the bookie's volumes have it: a volume whose claim is smaller (its expansion
    pending, or refused by the storage class) keeps the size its filesystem has, so the pod's --disk-quota never
    promises the bookie more than its disk holds (it would fill it to ENOSPC instead of turning read-only)."""
    wanted = cluster.spec.storage
    return wanted.model_copy(update={volume: granted_volume(getattr(wanted, volume),
                                                            claims.get(resources.pvc_name(bookie, volume)))
                                     for volume in resources.VOLUMES})


def granted_volume(wanted: Volume, claim: dict | None) -> Volume:
    """`wanted`, or the claim's capacity where that is smaller (no claim yet: it is made at `wanted`)."""
    if claim is None:
        return wanted
    capacity = ((claim.get("status") or {}).get("capacity") or {}).get("storage") or claim_size(claim)
    if resources.quantity_bytes(capacity) >= resources.quantity_bytes(wanted.size):
        return wanted
    return wanted.model_copy(update={"size": str(capacity)})


def with_storage(bookie: Member, storage: Storage) -> Bookie:
    model = bookie.model
    return model.model_copy(update={"spec": model.spec.model_copy(update={"storage": storage})})


def desired_hash(cluster: BookieCluster, bookie: Member, claims: Mapping[str, dict]) -> str:
    """The digest of the pod this pass wants for the bookie: with the storage its claims were granted."""
    granted = with_storage(bookie, granted_storage(cluster, bookie.name, claims))
    return resources.bookie_pod(cluster, granted)["metadata"]["annotations"][resources.ANNOTATION_CONFIG_HASH]


def pod_hash(pod: dict | None) -> str | None:
    return ((pod or {}).get("metadata", {}).get("annotations") or {}).get(resources.ANNOTATION_CONFIG_HASH)


def adopt_whole_pod_hashes(cluster: BookieCluster, bookies: list[Member], claims: Mapping[str, dict],
                           wanted: Mapping[str, str]) -> list[Action]:
    """Pods annotated by an operator before resources.runs_hash, with the digest of the whole pod, that match what
    this operator builds: they run what they should, so they are annotated anew instead of restarted."""
    actions: list[Action] = []
    for bookie in bookies:
        found = pod_hash(bookie.pod)
        if bookie.pod is None or found in (None, wanted[bookie.name]):
            continue
        granted = with_storage(bookie, granted_storage(cluster, bookie.name, claims))
        if found == resources.whole_pod_hash(cluster, granted):
            meta = bookie.pod["metadata"]
            actions.append(Patch(CORE, "pods", meta["namespace"], meta["name"], {"metadata": {"annotations": {
                resources.ANNOTATION_CONFIG_HASH: wanted[bookie.name]}}}))
    return actions


def decide_rollout(cluster: BookieCluster, bookies: list[Member], claims: Mapping[str, dict], moment: dt.datetime,
                   turn_holder: ClusterKey | None = None, turn: RolloutTurn = ROLLOUT_TURN,
                   ) -> tuple[list[Action], Rollout]:
    """Restart at most one bookie whose pod is not of the current spec, only while every other one is up, unless
    the cluster is paused, and only as the holder of the rollout turn (`turn_holder`: as observed)."""
    key = (cluster.metadata.namespace, cluster.metadata.name)
    wanted = {b.name: desired_hash(cluster, b, claims) for b in bookies}
    actions: list[Action] = adopt_whole_pod_hashes(cluster, bookies, claims, wanted)
    adopted = {action.name for action in actions if isinstance(action, Patch)}
    current = {b.name: b.name in adopted or pod_hash(b.pod) == wanted[b.name] for b in bookies}
    updated = sum(current[b.name] and b.up for b in bookies)
    restarting = [b for b in bookies if ANNOTATION_ROLLOUT_STARTED in b.annotations]
    for bookie in restarting:
        if current[bookie.name] and bookie.up:
            actions.append(Patch(CUSTOM, "bookies", bookie.body["metadata"]["namespace"], bookie.name,
                                 {"metadata": {"annotations": {ANNOTATION_ROLLOUT_STARTED: None}}}))
            actions.append(PostEvent("BookieUpdated", f"{bookie.name} is ready and registered in a pod of the "
                                     "current spec", involved=bookie.body))
    pending = [b for b in restarting if not (current[b.name] and b.up)]
    if pending:
        bookie = pending[0]
        if replaced_pod(bookie) and not current[bookie.name]:  # the spec changed again: it is down anyway
            return actions + restart(cluster, bookie, moment), Rollout(updated, restarting=bookie.name)
        started = dt.datetime.fromisoformat(bookie.annotations[ANNOTATION_ROLLOUT_STARTED].replace("Z", "+00:00"))
        stuck = (moment - started).total_seconds() > cluster.spec.rollout_timeout_seconds
        return actions, Rollout(updated, restarting=bookie.name, stuck=bookie.name if stuck else None)
    outdated = [b for b in bookies if b.pod is not None and not b.pod["metadata"].get("deletionTimestamp")
                and not current[b.name]]
    if not outdated:
        return actions + give_up_turn(turn, turn_holder, key), Rollout(updated)
    if cluster.spec.rollout.paused:
        return actions + give_up_turn(turn, turn_holder, key), Rollout(updated, outdated=len(outdated), paused=True)
    if turn_holder not in (None, key):
        return actions, Rollout(updated, outdated=len(outdated), behind=turn_holder)
    for bookie in outdated:
        others_up = all(other.up for other in bookies if other is not bookie)
        if others_up:
            in_turn = InTurn(turn, key, tuple(restart(cluster, bookie, moment)))
            return [*actions, in_turn], Rollout(updated, restarting=bookie.name, outdated=len(outdated))
    waiting_for = next(b.name for b in bookies if not b.up)
    return actions, Rollout(updated, waiting_for=waiting_for, outdated=len(outdated))


def give_up_turn(turn: RolloutTurn, holder: ClusterKey | None, key: ClusterKey) -> list[Action]:
    """The turn released, when this cluster holds it."""
    return [GiveUpTurn(turn, key)] if holder == key else []


def replaced_pod(bookie: Member) -> bool:
    """The bookie runs a pod other than the one its restart deleted (that one may stay Terminating a while)."""
    pod = bookie.pod
    return (pod is not None and not pod["metadata"].get("deletionTimestamp")
            and pod["metadata"].get("uid") != bookie.annotations.get(ANNOTATION_PLANNED_RESTART))


def restart(cluster: BookieCluster, bookie: Member, moment: dt.datetime) -> list[Action]:
    """Delete the bookie's pod as a planned restart (bookies.py recreates it from the current spec, and does not
    count it lost) and note when, for the rollout timeout."""
    assert bookie.pod is not None
    ns = bookie.body["metadata"]["namespace"]
    return [
        Patch(CUSTOM, "bookies", ns, bookie.name, {"metadata": {"annotations": {
            ANNOTATION_PLANNED_RESTART: bookie.pod["metadata"]["uid"],
            ANNOTATION_ROLLOUT_STARTED: timestamp(moment)}}}),
        Delete(CORE, "pods", ns, bookie.name),
        PostEvent("RollingUpgrade", f"restarting {bookie.name} with the current spec (image "
                  f"{resources.bookie_image(cluster)})", involved=bookie.body),
    ]


def rollout_events(status: dict, cluster: BookieCluster, rollout: Rollout) -> list[Action]:
    """A Warning Event when a rollout gets stuck (once: when its condition turns True)."""
    was_stuck = any(c.get("type") == ROLLOUT_STUCK and c.get("status") == "True"
                    for c in status.get("conditions") or [])
    if rollout.stuck and not was_stuck:
        return [PostEvent(ROLLOUT_STUCK, stuck_message(cluster, rollout.stuck), warning=True)]
    return []


def stuck_message(cluster: BookieCluster, name: str) -> str:
    return (f"{name} is not ready and registered {cluster.spec.rollout_timeout_seconds}s after its restart: the "
            "rollout is halted (it is not counted lost; fix the spec or the pod and it goes on)")


def decide_status(status: dict, cluster: BookieCluster, ready: int, draining: bool, rollout: Rollout,
                  refused: list[str] | None = None) -> dict:
    """The cluster's status (pure; conditions keep their transition time while unchanged)."""
    replicas = cluster.spec.replicas
    conditions = conditions_with(status, VALID, True, "SpecValid")
    for type_, ok, reason, message in (
        (READY, ready == replicas, "AllReady" if ready == replicas else "NotAllReady",
         f"{ready}/{replicas} bookies ready"),
        (UPGRADING, rollout.restarting is not None or rollout.waiting_for is not None,
         "RollingUpgrade" if rollout.restarting or rollout.waiting_for else upgrade_reason(rollout),
         f"restarting {rollout.restarting}" if rollout.restarting
         else f"waiting for {rollout.waiting_for} to be ready" if rollout.waiting_for
         else f"{rollout.outdated} bookie(s) to restart: {waiting_message(rollout)}" if rollout.outdated else ""),
        (ROLLOUT_STUCK, rollout.stuck is not None, "ReadyTimeout" if rollout.stuck else "NotStuck",
         stuck_message(cluster, rollout.stuck) if rollout.stuck else ""),
        (VOLUMES_EXPANDED, not refused, "ExpansionRefused" if refused else "AsRequested",
         f"the storage class refused to grow {', '.join(refused)}" if refused else ""),
    ):
        conditions = conditions_with({"conditions": conditions}, type_, ok, reason, message)
    return {"observedGeneration": cluster.metadata.generation, "desiredBookies": replicas, "readyBookies": ready,
            "updatedBookies": rollout.updated,
            "phase": "Ready" if ready == replicas and not draining else "Reconciling", "conditions": conditions}


def upgrade_reason(rollout: Rollout) -> str:
    return "Paused" if rollout.paused else "WaitingForTurn" if rollout.behind else "UpToDate"


def waiting_message(rollout: Rollout) -> str:
    if rollout.paused:
        return "paused (spec.rollout.paused)"
    namespace, name = rollout.behind or ("", "")
    return f"after BookieCluster {namespace}/{name}'s rollout (one cluster at a time)"


# --- act -----------------------------------------------------------------------------------------------------


def reconcile(ctx: OperatorContext, body: dict, sources: ClusterSources | None = None) -> float | None:
    """One level-based pass over a BookieCluster; like every reconciler's, it returns the seconds until a pass is due
    by the clock alone (for a cluster: None, its loop runs the next at the interval or on a bookie pod's change). A
    pass whose conditional write met 409 Conflict (a cached Bookie older than the last write) runs again on live
    reads."""
    return again_on_conflict(functools.partial(_one_pass, ctx, body), sources or ClusterSources.live(ctx.api),
                             lambda: ClusterSources.live(ctx.api))


def _one_pass(ctx: OperatorContext, body: dict, sources: ClusterSources) -> float | None:
    moment = now()
    decision = decide(observe(ctx, body, sources), moment)
    act(ctx, body, decision.actions)
    return decision.due(moment, None)
