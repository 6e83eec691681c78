"""The fleet at a glance, read from ZooKeeper: bookies, ledgers, under-replication, the auditor and running repairs.

`fleet_status(zk)` is the one place these facts are gathered: `bookfleet status` prints them, and the operator can
put the same ones on its BookieCluster status. It only reads, each kind of node in multiRead requests. Each bookie's
ledger count needs every ledger's metadata (BookKeeper keeps no index by bookie, and a Java client would not write
bookfleet's), so a status reads them all, 250 to a request: about 400 requests at 100,000 ledgers.

What ZooKeeper says about a repair in progress: the repair job takes the lock of every ledger it plans at the start
and releases each as its commit lands, so the locks a holder still has are the ledgers it has left, and the oldest
lock's age is how long that run has been going.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Literal

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from pydantic import BaseModel, computed_field

from bookfleet.meta import bookiestate, zkpaths
from bookfleet.meta.metadata import LedgerMetadata, LedgerState, MetadataStore
from bookfleet.meta.registry import BookieRegistry
from bookfleet.meta.underreplication import UnderReplication, auditor_of_vote, lock_holder
from bookfleet.meta.zk import read_many


class BookieAtAGlance(BaseModel):
    """One bookie: registered (writable or read-only), or absent while some ledger's metadata still names it."""

    bookie_id: str
    state: Literal["writable", "read_only", "absent"]
    address: str | None = None
    zone: str = ""
    free_bytes: int | None = None
    ledgers: int = 0
    """Ledgers with a segment on this bookie (a scan of the metadata)."""
    forced_read_only: str | None = None
    """The reason, while `bookfleet bookies readonly` (or the operator) forces it read-only."""


class LedgerCounts(BaseModel):
    """How many ledgers (from the metadata layout's child counts), marked and lost (listings of ids): never a read per
    ledger. The counts by state (open, in recovery, closed) are in the ledgers' own metadata, so they are None unless
    asked for: a fleet of 100,000 ledgers takes seconds to count them that way."""

    total: int = 0
    open: int | None = None
    in_recovery: int | None = None
    closed: int | None = None
    under_replicated: int = 0
    data_loss: int = 0


class UnderReplicatedLedger(BaseModel):
    """A marked ledger: which bookies its replicas are missing on, since when, and who is repairing it."""

    ledger_id: int
    missing_bookies: list[str]
    since: dt.datetime
    repair_holder: str | None = None


class AuditorStatus(BaseModel):
    active: str | None
    """The elected auditor's id (None: no auditor runs, so lost bookies are not noticed)."""
    standbys: int
    recovery_delay_s: float
    """lostBookieRecoveryDelay: how long a vanished bookie may stay away before its ledgers are marked."""
    replication_disabled: bool
    """The switch of `bookfleet autorecovery disable`: nothing is marked or repaired while it is set."""


class RepairAtAGlance(BaseModel):
    """A repair run seen through its locks: `ledgers_left` of its planned ledgers are not committed yet."""

    holder: str
    ledgers_left: int
    running_since: dt.datetime


class FleetStatus(BaseModel):
    taken_at: dt.datetime
    bookies: list[BookieAtAGlance]
    ledgers: LedgerCounts
    data_loss_ledgers: list[int]
    auditor: AuditorStatus
    repairs: list[RepairAtAGlance]

    @computed_field
    @property
    def healthy(self) -> bool:
        """Every bookie that holds ledgers is up, nothing is marked and nothing is lost."""
        return (
            not self.ledgers.under_replicated
            and not self.ledgers.data_loss
            and all(bookie.state != "absent" or not bookie.ledgers for bookie in self.bookies)
        )


def fleet_status(zk: KazooClient, by_state: bool = False) -> FleetStatus:
    """Everything `bookfleet status` shows, read now through `zk` (a started client the caller owns); with `by_state`
    the ledgers are counted by state too (from the same scan of every ledger's metadata that counts each bookie's)."""
    under_replication = UnderReplication(zk)
    metadata = MetadataStore(zk)
    stored = metadata.scan()
    locks = repair_locks(zk)
    data_loss = [record.ledger_id for record in under_replication.data_losses()]
    ledgers = LedgerCounts(
        total=metadata.count(),
        under_replicated=len(under_replication.ledger_ids()),
        data_loss=len(data_loss),
    )
    if by_state:
        states = Counter(found.state for found in stored.values())
        ledgers.open, ledgers.in_recovery = states[LedgerState.OPEN], states[LedgerState.IN_RECOVERY]
        ledgers.closed = states[LedgerState.CLOSED]
    return FleetStatus(
        taken_at=dt.datetime.now(dt.UTC),
        bookies=bookie_statuses(zk, stored),
        ledgers=ledgers,
        data_loss_ledgers=data_loss,
        auditor=auditor_status(zk),
        repairs=repair_statuses(locks),
    )


def bookie_statuses(zk: KazooClient, stored: dict[int, LedgerMetadata]) -> list[BookieAtAGlance]:
    """Registered bookies and those some ledger's metadata (`stored`, a scan) names but that are not registered, by
    id."""
    registered = {info.bookie_id: info for info in BookieRegistry(zk).all()}
    held = Counter(bookie for metadata in stored.values() for bookie in metadata.bookies())
    forced = bookiestate.forced_ids(zk)
    statuses = []
    for bookie_id in sorted(registered.keys() | held.keys()):
        info = registered.get(bookie_id)
        state = bookiestate.read(zk, bookie_id) if bookie_id in forced else None
        statuses.append(
            BookieAtAGlance(
                bookie_id=bookie_id,
                state=info.state.value if info else "absent",
                address=info.address if info else None,
                zone=info.zone if info else "",
                free_bytes=info.free_bytes if info else None,
                ledgers=held[bookie_id],
                forced_read_only=state.reason if state and state.read_only else None,
            )
        )
    return statuses


def auditor_status(zk: KazooClient) -> AuditorStatus:
    """The elected auditor: the candidate with the lowest sequence number leads (bookfleet.replication.auditor)."""
    under_replication = UnderReplication(zk)
    candidates = sorted(_children(zk, zkpaths.AUDITOR_ELECTION))
    active = None
    for name in candidates:  # the leader may resign between the listing and the read: take the next one
        try:
            data, _ = zk.get(f"{zkpaths.AUDITOR_ELECTION}/{name}")
        except NoNodeError:
            continue
        active = auditor_of_vote(data)
        break
    return AuditorStatus(
        active=active,
        standbys=max(0, len(candidates) - 1),
        recovery_delay_s=under_replication.recovery_delay(),
        replication_disabled=under_replication.is_disabled(),
    )


def repair_locks(zk: KazooClient) -> dict[int, tuple[str, dt.datetime]]:
    """ledger id -> (holder, taken at) of every repair lock held now."""
    names = [name for name in _children(zk, zkpaths.UR_LOCKS) if name.startswith("urL")]
    return {int(name[3:]): (lock_holder(read[0]), _from_ms(read[1].ctime))
            for name, read in read_many(zk, names, lambda name: f"{zkpaths.UR_LOCKS}/{name}")
            if read is not None}  # else released meanwhile


def repair_statuses(locks: dict[int, tuple[str, dt.datetime]]) -> list[RepairAtAGlance]:
    by_holder: dict[str, list[dt.datetime]] = {}
    for holder, taken_at in locks.values():
        by_holder.setdefault(holder, []).append(taken_at)
    return [
        RepairAtAGlance(holder=holder, ledgers_left=len(taken), running_since=min(taken))
        for holder, taken in sorted(by_holder.items())
    ]


def under_replicated_ledgers(zk: KazooClient) -> list[UnderReplicatedLedger]:
    """Every marked ledger, by id, with the holder of its repair lock if one is being repaired."""
    locks = repair_locks(zk)
    return [
        UnderReplicatedLedger(
            ledger_id=marker.ledger_id,
            missing_bookies=sorted(marker.missing_bookies),
            since=_from_ms(marker.ctime),
            repair_holder=locks[marker.ledger_id][0] if marker.ledger_id in locks else None,
        )
        for marker in UnderReplication(zk).markers()
    ]


def _from_ms(milliseconds: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(milliseconds / 1000, dt.UTC)


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return zk.get_children(path)
    except NoNodeError:
        return []
