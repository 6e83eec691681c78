"""Ledger resources <-> ZooKeeper: create (or adopt) the ledger, then mirror its metadata and health in status.

Observe (the Ledger, its cluster, its metadata, marker and repairs) -> decide (pure) -> act (kube.reconcilers.actions).
Creation is restart-safe: the id is reserved and written to status before the metadata is created under it, so a pass
interrupted in between finds the id in status and only finishes the creation. A ledger whose metadata disappears
after it was seen is never created again: its status says DELETED. Every decision that changes the status posts an
Event, once: decide compares the status it read with the one it decides.
"""

from __future__ import annotations

import base64
import datetime as dt
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.states import WatchedEvent
from pydantic import ValidationError

from bookfleet.client.placement import NotEnoughBookies, choose_ensemble, write_sets_sharing_a_zone
from bookfleet.kube import resources
from bookfleet.kube.models import (
    DATA_LOSS,
    VALID,
    BookieCluster,
    Condition,
    ConditionStatus,
    Ledger,
    RepairState,
    ledger_problems,
    set_condition,
    validated_cluster,
    validity_condition,
    zone_of,
)
from bookfleet.kube.reconcilers import repairs
from bookfleet.kube.reconcilers.actions import Action, Decision, Patch, PatchStatus, PostEvent, act
from bookfleet.kube.reconcilers.teardown import finalizer_release
from bookfleet.kube.runtime.api import CORE, CUSTOM
from bookfleet.kube.runtime.context import OperatorContext, ZooKeeperTarget, now, patch_status, timestamp
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import (
    LedgerMetadata,
    MetadataStore,
    NoSuchLedgerError,
    PendingRead,
    Segment,
    new_metadata,
)
from bookfleet.meta.registry import BookieInfo, BookieRegistry
from bookfleet.meta.underreplication import DataLoss, Marker, UnderReplication

CREATED = "Created"
DELETED = "DELETED"
"""status.state of a Ledger whose metadata was deleted from ZooKeeper after the operator had seen it."""
PROBLEM = {VALID: ConditionStatus.FALSE, CREATED: ConditionStatus.FALSE, DATA_LOSS: ConditionStatus.TRUE}
"""The status of each condition that needs attention: turning to it posts a Warning named by the reason."""
RepairsOf = Callable[[repairs.BookieKey], Iterable[dict]]


@dataclass(frozen=True)
class ObservedLedger:
    """What one pass decides on. ZooKeeper is read only as far as the Ledger gets: metadata once it has an id, the
    writable bookies and the password only while it may still be created."""

    status: Mapping[str, Any]
    ledger: Ledger | None = None
    spec_errors: str = ""
    """pydantic's complaints when the spec does not validate (then `ledger` is None)."""
    cluster: BookieCluster | None = None
    metadata: LedgerMetadata | None = None
    marker: Marker | None = None
    loss: DataLoss | None = None
    repairs: tuple[dict, ...] = ()
    writable: tuple[BookieInfo, ...] = ()
    password: bytes | None = None
    password_problem: str = ""
    bookie_zones: Mapping[str, str] = field(default_factory=dict)
    """bookie id -> zone of the cluster's bookies (`bookie_zones`)."""

    @property
    def ledger_id(self) -> int | None:
        """The reserved id (status), else the one to adopt (spec)."""
        reserved = self.status.get("ledgerId")
        return reserved if reserved is not None or self.ledger is None else self.ledger.spec.ledger_id

    @property
    def adopted(self) -> bool:
        """The spec names an existing ledger: the operator never creates it."""
        return self.ledger is not None and self.ledger.spec.ledger_id is not None

    @property
    def creatable(self) -> bool:
        """No id to adopt and never seen in ZooKeeper: the operator creates it."""
        return self.ledger is not None and not self.adopted and self.status.get("state") is None


@dataclass(frozen=True)
class ReserveLedgerId:
    """Take a cluster-unique id and record it in status before anything is created under it."""

    zookeeper: ZooKeeperTarget

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        patch_status(ctx, "ledgers", body, {"ledgerId": MetadataStore(ctx.zk(self.zookeeper)).new_ledger_id()})


@dataclass(frozen=True)
class CreateLedgerMetadata:
    """Create the ledger's metadata under the id in status (reserved by this pass or an interrupted one)."""

    zookeeper: ZooKeeperTarget
    metadata: LedgerMetadata

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        MetadataStore(ctx.zk(self.zookeeper)).create(self.metadata, body["status"]["ledgerId"])


CREATION_WAITS = frozenset({"NotEnoughBookies", "SecretNotFound"})
"""Why a Ledger may wait to be created for something no watch of the feed reports (a bookie registering, its
password Secret appearing): the feed passes such a Ledger again after its retry interval, not only at the resync."""


def reconcile(ctx: OperatorContext, body: dict, sources: LedgerSources, retry: float | None = None) -> float | None:
    """One level-based pass over a Ledger, run when something it mirrors changed (kube.runtime.ledgerfeed); like every
    reconciler's, it returns the seconds until the next pass is due (`retry` while it still waits to be created for
    something no watch reports; None: only a change calls for one).

    A Ledger the operator may create and has not seen in ZooKeeper is read afresh: the copy handed over may predate
    the last pass's status patch, and creating from it would reserve a second id and create a second ledger. Others
    (nearly all: existing or adopted) cost no GET."""
    if (body.get("status") or {}).get("state") is None and (body.get("spec") or {}).get("ledgerId") is None:
        meta = body["metadata"]
        body = ctx.api.get(CUSTOM, "ledgers", meta["namespace"], meta["name"]) or body
    moment = now()
    decision = decide(observe(ctx, body, sources), moment)
    act(ctx, body, (*older_finalizer_released(body), *decision.actions))
    return decision.due(moment, retry)


def older_finalizer_released(body: dict) -> tuple[Action, ...]:
    """Older operators ran Ledgers through kopf, which put its finalizer on each; this one watches them itself (kube.
    informers), so nothing else would ever drop it and deleting such a Ledger would wait for ever."""
    if (patch := finalizer_release(body)) is None:
        return ()
    return (Patch(CUSTOM, "ledgers", body["metadata"]["namespace"], body["metadata"]["name"], patch),)


def waits_for_creation(conditions: Iterable[dict]) -> bool:
    """Whether the Ledger's conditions leave it uncreated for one of CREATION_WAITS."""
    return any(c["type"] == CREATED and c["status"] == ConditionStatus.FALSE and c.get("reason") in CREATION_WAITS
               for c in conditions)


@dataclass(frozen=True)
class LedgerSources:
    """Where a pass looks things up without asking the API server: its cluster (from the operator's watch), the
    repair Jobs covering a ledger (the repair informers), and the watch it sets with its read of the ledger's metadata
    (so the next change to it wakes the Ledger; None: no watch)."""

    cluster: Callable[[str, str], dict | None]
    repairs_of: RepairsOf
    metadata_watch: Callable[[int], Callable[[WatchedEvent], None]] | None = None
    records: Callable[[ZooKeeperTarget, int], tuple[bool, bool] | None] = lambda target, ledger_id: None
    """whether the ledger has a marker and a DATA_LOSS record, as cached (None: not known, read both)"""
    read_ahead: Callable[[KazooClient, int], PendingRead | None] = lambda zk, ledger_id: None
    """the metadata read sent ahead for this pass with the others of its batch (None: the pass reads it)"""
    bookies: Callable[[str, str], list[dict]] = lambda namespace, name: []
    """the cluster's Bookies (their zones, where it lists none: as their nodes gave them)"""


# --- observe ------------------------------------------------------------------------------------------------------


def observe(ctx: OperatorContext, body: dict, sources: LedgerSources) -> ObservedLedger:
    observed = ObservedLedger(status=body.get("status") or {})
    try:
        ledger = Ledger.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return replace(observed, spec_errors=problems)
    namespace = ledger.metadata.namespace
    cluster_body = sources.cluster(namespace, ledger.spec.cluster)
    observed = replace(observed, ledger=ledger,
                       cluster=None if cluster_body is None else validated_cluster(cluster_body))
    if observed.cluster is None:
        return observed
    observed = replace(observed, bookie_zones=bookie_zones(observed.cluster,
                                                           sources.bookies(namespace, ledger.spec.cluster)))
    target = ZooKeeperTarget.of(observed.cluster)
    zk = ctx.zk(target, wait=0)  # on the feed's threads, which every cluster shares: never wait for a session
    ledger_id = observed.ledger_id
    if ledger_id is not None:
        watch = None if sources.metadata_watch is None else sources.metadata_watch(ledger_id)
        try:
            pending = sources.read_ahead(zk, ledger_id)  # the watch set by the read: nothing slips by
            metadata, _ = pending.get() if pending is not None else MetadataStore(zk).read(ledger_id, watch)
        except NoSuchLedgerError:
            if watch is not None:
                zk.exists(zkpaths.ledger(ledger_id), watch=watch)  # its creation, then
        else:
            under_replication = UnderReplication(zk)
            marked, lost = sources.records(target, ledger_id) or (True, True)
            marker = under_replication.marker(ledger_id) if marked else None
            keys = [(namespace, observed.cluster.metadata.name, bookie) for bookie in repaired_bookies(
                marker, observed.status.get("repair"))]
            return replace(observed, metadata=metadata, marker=marker,
                           loss=under_replication.data_loss(ledger_id) if lost else None,
                           repairs=tuple(job for key in keys for job in sources.repairs_of(key)))
    if not observed.creatable:
        return observed
    try:
        password = read_password(ctx, ledger)
    except LookupError as exc:
        return replace(observed, password_problem=str(exc))
    return replace(observed, writable=tuple(BookieRegistry(zk).writable()), password=password)


def repaired_bookies(marker: Marker | None, previous: Mapping[str, Any] | None) -> list[str]:
    """The bookies whose repairs may cover the ledger: those its marker names, and the one of the repair its status
    shows while that has not ended (the marker goes as soon as the ledger is repaired, before the Job ends)."""
    bookies = sorted(marker.missing_bookies) if marker else []
    previous = previous or {}
    if previous.get("bookieId") and previous.get("state") not in (RepairState.SUCCEEDED, RepairState.FAILED):
        bookies.append(previous["bookieId"])
    return list(dict.fromkeys(bookies))


def read_password(ctx: OperatorContext, ledger: Ledger) -> bytes:
    ref = ledger.spec.password_secret_ref
    if ref is None:
        return b""
    secret = ctx.api.get(CORE, "secrets", ledger.metadata.namespace, ref.name)
    if secret is None or ref.key not in (secret.get("data") or {}):
        raise LookupError(f"secret {ref.name!r} with key {ref.key!r} not found")
    return base64.b64decode(secret["data"][ref.key])


# --- decide (pure) ------------------------------------------------------------------------------------------------


def decide(observed: ObservedLedger, moment: dt.datetime, rng: random.Random | None = None) -> Decision:
    """The actions of one pass, in order: creation steps, the status patch, then one Event per change it makes
    (`rng`: placement's choice among the writable bookies); requeued while it waits to be created."""
    ledger, cluster = observed.ledger, observed.cluster
    if ledger is None:
        return report(observed, moment, {}, condition(VALID, False, "InvalidSpec", observed.spec_errors))
    validity = validity_condition(ledger_problems(ledger.spec, None if cluster is None else cluster.spec))
    if cluster is None or validity.status != ConditionStatus.TRUE:
        return report(observed, moment, {}, validity)
    if observed.metadata is not None:
        return mirror(observed, moment, observed.metadata, validity)
    ledger_id = observed.ledger_id
    if observed.status.get("state") is not None:
        return report(observed, moment, {"state": DELETED, "underReplicated": None},
                      condition(VALID, False, "LedgerDeleted",
                                f"ledger {ledger_id} was deleted from ZooKeeper; its data is gone"))
    if not observed.creatable:
        return report(observed, moment, {"ledgerId": ledger_id},
                      condition(VALID, False, "NoSuchLedger", f"ledger {ledger_id} does not exist in ZooKeeper"))
    if observed.password is None:
        return report(observed, moment, {}, validity, condition(CREATED, False, "SecretNotFound",
                                                                observed.password_problem))
    spec = ledger.spec
    try:
        ensemble = choose_ensemble(observed.writable, spec.ensemble_size, spec.write_quorum, rng=rng,
                                   zones=spec.zones)
    except NotEnoughBookies as exc:
        return report(observed, moment, {}, validity, condition(CREATED, False, "NotEnoughBookies", str(exc)))
    metadata = new_metadata(ensemble, spec.write_quorum, spec.ack_quorum, spec.digest_type, observed.password)
    zookeeper = ZooKeeperTarget.of(cluster)
    reserve: list[Action] = [ReserveLedgerId(zookeeper)] if ledger_id is None else []
    mirrored = mirror(observed, moment, metadata, validity)
    return replace(mirrored, actions=(*reserve, CreateLedgerMetadata(zookeeper, metadata), *mirrored.actions))


def mirror(observed: ObservedLedger, moment: dt.datetime, metadata: LedgerMetadata, validity: Condition
           ) -> Decision:
    """A ledger that exists: its metadata, under-replication, latest repair and data loss in status."""
    ledger_id = observed.ledger_id
    loss = observed.loss
    repair = repair_status(observed.repairs, observed.marker) or observed.status.get("repair")
    status = decide_status(ledger_id, metadata, observed.marker, repair, observed.bookie_zones)
    conditions = [validity, condition(DATA_LOSS, True, "EntriesLost", f"no replica holds entries "
                                                                      f"{list(loss.entries)[:20]}")
                  if loss is not None else condition(DATA_LOSS, False, "AllEntriesReplicated")]
    if not observed.adopted:
        conditions.append(condition(CREATED, True, CREATED, f"ensemble {', '.join(metadata.segments[0].bookies)}"))
    reported = report(observed, moment, status, *conditions)
    return replace(reported, actions=(*reported.actions, *health_events(observed.status, status,
                                                                        event_target(observed.cluster))))


def report(observed: ObservedLedger, moment: dt.datetime, status: dict[str, Any], *conditions: Condition) -> Decision:
    """Patch `status` with `conditions` set in it, post an Event for each condition that turns to a problem (or
    to Created); requeued while those conditions say it waits to be created."""
    current = [Condition.model_validate(c) for c in observed.status.get("conditions") or []]
    for new in conditions:
        current = set_condition(current, new, moment)
    wire = [c.to_wire() for c in current]
    return Decision((PatchStatus("ledgers", {**status, "conditions": wire}), *condition_events(observed.status, wire)),
                    requeue=waits_for_creation(wire))


def condition(type_: str, ok: bool, reason: str, message: str = "") -> Condition:
    return Condition(type=type_, status=ConditionStatus.TRUE if ok else ConditionStatus.FALSE, reason=reason,
                     message=message)


def condition_events(before: Mapping[str, Any], conditions: list[dict]) -> list[PostEvent]:
    old = {c["type"]: (c.get("status"), c.get("reason")) for c in before.get("conditions") or []}
    events = []
    for new in conditions:
        if old.get(new["type"]) == (new["status"], new.get("reason")):
            continue
        problem = new["status"] == PROBLEM.get(new["type"])
        if problem or new["type"] == CREATED:
            events.append(PostEvent(new["reason"], new.get("message", ""), warning=problem))
    return events


def health_events(before: Mapping[str, Any], after: dict[str, Any], cluster: dict[str, Any]) -> list[PostEvent]:
    """Events for changes of under-replication and of the latest repair between two statuses, counted on the
    Ledger's cluster (kube.runtime.context.EventTally): one bookie loss makes them for every Ledger it held."""
    events: list[tuple[str, str, bool]] = []
    was, is_ = before.get("underReplicated"), after["underReplicated"]
    if is_ and (not was or was.get("missingBookies") != is_["missingBookies"]):
        events.append(("UnderReplicated", f"no copy on {', '.join(is_['missingBookies'])}", True))
    elif was and not is_:
        events.append(("FullyReplicated", "every entry has all its copies again", False))
    old, new = before.get("repair") or {}, after["repair"] or {}
    if new and new["job"] != old.get("job"):
        events.append(("RepairLaunched", f"{new['job']} repairs this ledger (attempt {new['attempts']})", False))
    state = new.get("state")
    if state in (RepairState.SUCCEEDED, RepairState.FAILED) and (new["job"], state) != (old.get("job"),
                                                                                       old.get("state")):
        succeeded = state == RepairState.SUCCEEDED
        events.append(("RepairSucceeded" if succeeded else "RepairFailed",
                       f"{new['job']} {'succeeded' if succeeded else 'failed'}", not succeeded))
    return [PostEvent(reason, message, warning, involved=cluster, counted=True) for reason, message, warning in events]


def event_target(cluster: BookieCluster | None) -> dict[str, Any]:
    """The BookieCluster as the object its Ledgers' counted Events are posted on."""
    assert cluster is not None, "a Ledger's status is mirrored only with its cluster"
    meta = cluster.metadata
    return {"apiVersion": cluster.api_version, "kind": cluster.kind,
            "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid}}


def bookie_zones(cluster: BookieCluster, bookies: Iterable[dict] = ()) -> dict[str, str]:
    """bookie id -> zone of the cluster's bookies, known also while a bookie, or its whole zone, is lost: round-robin
    by ordinal over the zones it lists, else each of its `bookies`' zone as its node gave it (the Bookie's spec.zone,
    kept with it)."""
    name, namespace, spec = cluster.metadata.name, cluster.metadata.namespace, cluster.spec
    if not spec.zones:
        return {b["spec"]["bookieId"]: zone for b in bookies if (zone := b["spec"].get("zone"))}
    return {resources.bookie_id(name, resources.bookie_name(name, ordinal), namespace, spec.bookie.port):
            zone_of(ordinal, spec.zones) for ordinal in range(spec.replicas)}


def decide_status(ledger_id: int | None, metadata: LedgerMetadata, marker: Marker | None, repair: dict | None,
                  zones: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Ledger's status from its metadata, its under-replication marker and its latest repair (pure); no ledgerId
    while it is being reserved in the same pass. With the bookies' `zones`, each segment says how many of its write
    sets hold two replicas in one zone."""

    def segment(s: Segment) -> dict[str, Any]:
        shown: dict[str, Any] = {"firstEntryId": s.first_entry_id, "bookies": list(s.bookies)}
        if zones:
            shown["writeSetsSharingAZone"] = write_sets_sharing_a_zone([zones.get(b, "") for b in s.bookies],
                                                                        metadata.write_quorum)
        return shown

    return {
        **({} if ledger_id is None else {"ledgerId": ledger_id}),
        "state": metadata.state.value,
        "lastEntryId": metadata.last_entry_id,
        "length": metadata.length,
        "segments": [segment(s) for s in metadata.segments],
        "underReplicated": None if marker is None else {
            "missingBookies": sorted(marker.missing_bookies),
            "since": timestamp(dt.datetime.fromtimestamp(marker.ctime / 1000, dt.UTC)),
        },
        "repair": repair,
    }


CLOCK_SLACK = dt.timedelta(seconds=60)
"""Markers carry ZooKeeper's clock, Jobs the API server's: a repair that ended this much before a marker was made
still counts as ended before it."""


def repair_status(candidates: Iterable[dict], marker: Marker | None = None) -> dict | None:
    """The latest repair of the ledger's lost bookies, as the Ledger's status shows it (None: none found; the status
    keeps the one it showed). A repair of one loss may take several attempts; one that ended before the ledger was
    marked did not cover it."""
    marked = None if marker is None else dt.datetime.fromtimestamp(marker.ctime / 1000, dt.UTC) - CLOCK_SLACK
    losses: dict[tuple[str | None, str | None], list[dict]] = {}
    for job in sorted(candidates, key=repairs.attempt_order):
        losses.setdefault(repairs.loss_of(job), []).append(job)
    current = [attempts for attempts in losses.values()
               if marked is None or (ended := repairs.finished_at(attempts[-1])) is None or ended >= marked]
    if not current:
        return None
    attempts = max(current, key=lambda each: repairs.attempt_order(each[-1]))
    job = attempts[-1]
    finished = repairs.finished_at(job)
    return {
        "job": job["metadata"]["name"],
        "bookieId": repairs.loss_of(job)[0],
        "state": repairs.job_state(job).value,
        "started": job["metadata"].get("creationTimestamp"),
        "finished": timestamp(finished) if finished else None,
        "attempts": len(attempts),
    }
