"""Under-replication state in ZooKeeper: markers, per-ledger locks, switches and DATA_LOSS records.

This is the one place where the auditor (who marks), the repair job (who locks, repairs and clears) and the
operator (who marks on pod death and flips the switches) meet, so every change is a compare-and-set or an atomic
create: two auditors, or an auditor racing a repair, never lose each other's updates.

Markers, locks, the switch and the delay are Apache BookKeeper's own records, so its AutoRecovery and shell read
them: a marker is an UnderreplicatedLedgerFormat in protobuf text (`replica: "<bookie>"` lines and `ctime: <ms>`), a
lock a LockDataFormat in text, the delay an integer of seconds, and the time the auditor last finished checking every
ledger a CheckAllLedgersFormat in protobuf binary (BookKeeper writes this one with toByteArray, not as text), so an
auditor of either kind that takes office after the other waits out the same interval. BookKeeper's text parser
refuses a name it does not know, so what bookfleet adds lives beside them, in nodes BookKeeper never reads.

A marker says why it names each bookie, in its reasons node: "lostBookies" were declared lost by the lost-bookie
rule (replication/lostbookie.py, through auditor.mark_lost_bookie), "missedEntries" were named by a writer that went
on without them, and the rest by a replica check. Only a declared-lost bookie may count as gone for good when repair
decides DATA_LOSS: the others are usually alive. "missedAt" is when a writer last named missed entries, so the
open-ledger grace of a writer that rides through counts from its newest mark, not from an older marker's ctime.
The reasons change with their marker in one transaction; they name the marker's ctime ("markerCtime"), so reasons
left behind by a marker that BookKeeper's replication worker cleared are never read as a later marker's.

    marker   zkpaths.underreplicated(id)        UnderreplicatedLedgerFormat text
    reasons  zkpaths.marker_reasons(id)         {"lostBookies": [...], "missedEntries": [...], "missedAt": <ms>,
                                                 "markerCtime": <ms>}, only for a marker with reasons
    lock     zkpaths.underreplication_lock(id)  ephemeral, LockDataFormat text naming the holder
    switch   zkpaths.UR_DISABLE                 present while ledger replication is disabled
    delay    zkpaths.UR_RECOVERY_DELAY          lostBookieRecoveryDelay, whole seconds
    check    zkpaths.UR_CHECK_ALL_LEDGERS_CTIME CheckAllLedgersFormat binary, checkAllLedgersCTime in ms since epoch
    loss     zkpaths.dataloss(id)               {"entries": [...], "ctime": <ms since epoch>}
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from google.protobuf import text_format
from google.protobuf.message import DecodeError
from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import WatchedEvent

from bookfleet.meta import zkpaths
from bookfleet.meta.formats import (
    AuditorVoteFormat,
    CheckAllLedgersFormat,
    LockDataFormat,
    UnderreplicatedLedgerFormat,
)
from bookfleet.meta.zk import pipelined, put, read_many

DEFAULT_RECOVERY_DELAY = 0.0
"""lostBookieRecoveryDelay when none is stored: mark at once (BookKeeper's default too)."""


@dataclass(frozen=True, slots=True)
class Marker:
    """An under-replicated ledger as read; `version` is what clear() compares against."""

    ledger_id: int
    missing_bookies: frozenset[str]
    ctime: int
    version: int
    missed_entries: frozenset[str] = frozenset()
    """Missing bookies known to lack entries although they may be up (a writer went on without them): their
    replicas must be repaired even if they answer, so only a repair clears them, never a stale-marker check."""
    lost_bookies: frozenset[str] = frozenset()
    """Missing bookies the lost-bookie rule declared lost: the only ones repair may give up on."""
    missed_at: int = 0
    """When (ms) a writer last named missed entries in this marker; 0 if none ever did."""
    reasons_version: int | None = None
    """The version of the marker's reasons node as read (None: it had none), for the transactions that change both."""

    @property
    def has_reasons(self) -> bool:
        return bool(self.missed_entries or self.lost_bookies or self.missed_at)

    @property
    def grace_start(self) -> int:
        """When (ms) the open-ledger grace starts: the marker's creation or a writer's newer mark, whichever is
        later (a writer that marks again is alive and replacing bookies itself)."""
        return max(self.ctime, self.missed_at)


@dataclass(frozen=True, slots=True)
class DataLoss:
    """A ledger with entries that no replica holds any more; repair gives them up instead of retrying forever."""

    ledger_id: int
    entries: tuple[int, ...]
    ctime: int


def _now_ms() -> int:
    return int(time.time() * 1000)


def _encode(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True).encode()


def _marker_record(marker: Marker) -> bytes:
    """The marker as BookKeeper writes it."""
    record = UnderreplicatedLedgerFormat(replica=sorted(marker.missing_bookies), ctime=marker.ctime)
    return text_format.MessageToString(record).encode()


def _reasons_record(marker: Marker) -> bytes:
    return _encode({
        "lostBookies": sorted(marker.lost_bookies), "missedEntries": sorted(marker.missed_entries),
        "missedAt": marker.missed_at, "markerCtime": marker.ctime,
    })


def _write_in(txn: TransactionRequest, marker: Marker, version: int | None, reasons_version: int | None) -> Marker:
    """Create (version None) or compare-and-set the marker, with its reasons node (at `reasons_version`, None: there
    is none) made to match; returns the marker as it is once the transaction commits."""
    path, reasons = zkpaths.underreplicated(marker.ledger_id), zkpaths.marker_reasons(marker.ledger_id)
    if version is None:
        txn.create(path, _marker_record(marker))
    else:
        txn.set_data(path, _marker_record(marker), version=version)
    stored = replace(marker, version=0 if version is None else version + 1,
                     reasons_version=None if not marker.has_reasons else 0 if reasons_version is None
                     else reasons_version + 1)
    version = reasons_version
    if marker.has_reasons and version is None:
        txn.create(reasons, _reasons_record(marker))
    elif marker.has_reasons:
        txn.set_data(reasons, _reasons_record(marker), version=version)
    elif version is not None:
        txn.delete(reasons, version=version)
    return stored


def lock_record(holder: str) -> bytes:
    """A repair lock's data as BookKeeper writes it: LockDataFormat text naming the holder."""
    return _naming(LockDataFormat, holder)


def lock_holder(data: bytes) -> str:
    """The holder a lock names (a lock BookKeeper's replication worker took names its bookie)."""
    return _named(LockDataFormat, data)


def auditor_vote(auditor_id: str) -> bytes:
    """An auditor candidate's node data, BookKeeper's AuditorVoteFormat text (what `whoisauditor` reads)."""
    return _naming(AuditorVoteFormat, auditor_id)


def auditor_of_vote(data: bytes) -> str:
    return _named(AuditorVoteFormat, data)


def check_all_ledgers_record(ctime_ms: int) -> bytes:
    """When the full replica check last finished, as BookKeeper's auditor writes it: CheckAllLedgersFormat binary."""
    return CheckAllLedgersFormat(checkAllLedgersCTime=ctime_ms).SerializeToString()


def check_all_ledgers_ctime_of(data: bytes) -> int | None:
    """The time (ms since the epoch) a check-all-ledgers record holds; None when it holds none (BookKeeper's -1:
    never checked)."""
    record = CheckAllLedgersFormat()
    try:
        record.ParseFromString(data)
    except DecodeError as exc:
        raise ValueError(f"{zkpaths.UR_CHECK_ALL_LEDGERS_CTIME} is not a CheckAllLedgersFormat: {exc}") from None
    return record.checkAllLedgersCTime if record.HasField("checkAllLedgersCTime") else None


def _naming(kind, bookie_id: str) -> bytes:
    return text_format.MessageToString(kind(bookieId=bookie_id)).encode()


def _named(kind, data: bytes) -> str:
    """The bookieId of a LockDataFormat or AuditorVoteFormat text (the data itself when it is not one)."""
    record = kind()
    try:
        text_format.Parse(data.decode(errors="replace"), record)
    except text_format.ParseError:
        return data.decode(errors="replace")
    return record.bookieId


def _decode(data: bytes, path: str) -> dict:
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"{path} does not hold JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path} holds {type(document).__name__}, expected a JSON object")
    return document


class UnderReplication:
    """Under-replication state of one ZooKeeper ensemble, through a started KazooClient the caller owns."""

    def __init__(self, zk: KazooClient):
        self.zk = zk
        self.held: dict[int, int] = {}
        """ledger id -> the session that took its lock through this object (an ephemeral dies with its session)."""

    # --- markers --------------------------------------------------------------------------------------------

    def mark(
        self, ledger_id: int, missing_bookies: Iterable[str], missed_entries: bool = False, lost: bool = False
    ) -> Marker:
        """Mark a ledger as missing replicas on `missing_bookies`; idempotent, merges with an existing marker.

        `missed_entries`: these bookies are known to lack entries of the ledger although they may be up (a writer
        kept writing without them until it replaced them), so their return must not clear the marker; each such
        mark restarts the open-ledger grace (`Marker.grace_start`). `lost`: the lost-bookie rule declared them
        lost (only `auditor.mark_lost_bookie` says so). Neither: a replica check named them."""
        missing = frozenset(missing_bookies)
        if not missing:
            raise ValueError(f"marking ledger {ledger_id} needs at least one missing bookie")
        if missed_entries and lost:
            raise ValueError("a bookie is named either for missed entries or as lost, not both at once")
        missed = missing if missed_entries else frozenset()
        declared = missing if lost else frozenset()
        path = zkpaths.underreplicated(ledger_id)
        if missed or declared:
            self.zk.ensure_path(zkpaths.UR_REASONS)
        while True:
            now = _now_ms()
            current = self.marker(ledger_id)
            if current is None:
                self.zk.ensure_path(path.rsplit("/", 1)[0])
                left = self.zk.exists(zkpaths.marker_reasons(ledger_id))  # a cleared marker's, by BookKeeper
                wanted = Marker(ledger_id, missing, now, 0, missed, declared, now if missed_entries else 0)
                versions = None, None if left is None else left.version
            else:
                wanted = Marker(
                    ledger_id,
                    current.missing_bookies | missing,
                    current.ctime,
                    current.version,
                    current.missed_entries | missed,
                    current.lost_bookies | declared,
                    max(current.missed_at, now) if missed_entries else current.missed_at,
                    current.reasons_version,
                )
                if wanted == current:
                    return current
                versions = current.version, current.reasons_version
            txn = self.zk.transaction()
            stored = _write_in(txn, wanted, *versions)
            if not any(isinstance(result, Exception) for result in txn.commit()):
                return stored
            # created or changed meanwhile, or an empty level was removed under us: read again

    def mark_all(self, ledger_ids: Iterable[int], missing_bookies: Iterable[str], lost: bool = False) -> list[Marker]:
        """mark(..., lost=lost) of many ledgers missing the same bookies, in about one ZooKeeper request per ledger:
        the shared hex levels are made once, then each ledger's own level and marker in one transaction, all in one
        pipeline.
        A ledger whose transaction fails (already marked, or its level left behind) goes through mark()."""
        missing = frozenset(missing_bookies)
        if not missing:
            raise ValueError("marking ledgers needs at least one missing bookie")
        paths = {ledger_id: zkpaths.underreplicated(ledger_id) for ledger_id in ledger_ids}
        if not paths:
            return []
        self._make_levels(path.rsplit("/", 2)[0] for path in paths.values())
        if lost:
            self.zk.ensure_path(zkpaths.UR_REASONS)
        ctime = _now_ms()
        declared = missing if lost else frozenset()
        stored: dict[int, Marker] = {}

        def create(ledger_id: int) -> IAsyncResult:
            txn = self.zk.transaction()
            txn.create(paths[ledger_id].rsplit("/", 1)[0])
            wanted = Marker(ledger_id, missing, ctime, 0, lost_bookies=declared)
            stored[ledger_id] = _write_in(txn, wanted, None, None)
            return txn.commit_async()

        return [
            self.mark(ledger_id, missing, lost=lost)
            if any(isinstance(result, Exception) for result in commit.get())
            else stored[ledger_id]
            for ledger_id, commit in pipelined(list(paths), create)
        ]

    def _make_levels(self, levels: Iterable[str]) -> None:
        """Create these hex levels and those above them, one pipeline per depth; existing ones are fine, and one
        pruned meanwhile only makes its ledgers' transactions fail over to mark()."""
        self.zk.ensure_path(zkpaths.UR_LEDGERS)
        by_depth: dict[int, set[str]] = {}
        for level in levels:
            parts = level.removeprefix(zkpaths.UR_LEDGERS + "/").split("/")
            for depth in range(1, len(parts) + 1):
                by_depth.setdefault(depth, set()).add("/".join([zkpaths.UR_LEDGERS, *parts[:depth]]))
        for depth in sorted(by_depth):
            for _, create in pipelined(sorted(by_depth[depth]), self.zk.create_async):
                with contextlib.suppress(NodeExistsError, NoNodeError):
                    create.get()

    def marker(self, ledger_id: int) -> Marker | None:
        return self.read_markers([ledger_id])[ledger_id]

    def read_markers(self, ledger_ids: Iterable[int]) -> dict[int, Marker | None]:
        """The markers of these ledgers (None: not marked) with their reasons, read in multiRead requests
        (read_many): the markers, then the reasons of those marked."""
        found: dict[int, Marker | None] = {}
        for ledger_id, read in read_many(self.zk, ledger_ids, zkpaths.underreplicated):
            found[ledger_id] = None if read is None else _parse_marker(ledger_id, *read)
        marked = [ledger_id for ledger_id, marker in found.items() if marker is not None]
        for ledger_id, read in read_many(self.zk, marked, zkpaths.marker_reasons):
            marker = found[ledger_id]
            if read is None or marker is None:
                continue
            document = _decode(read[0], zkpaths.marker_reasons(ledger_id))
            if document.get("markerCtime") != marker.ctime:
                found[ledger_id] = replace(marker, reasons_version=read[1].version)  # another marker's: replaced
                continue
            found[ledger_id] = replace(
                marker,
                missed_entries=frozenset(document.get("missedEntries", ())) & marker.missing_bookies,
                lost_bookies=frozenset(document.get("lostBookies", ())) & marker.missing_bookies,
                missed_at=document.get("missedAt", 0),
                reasons_version=read[1].version,
            )
        return found

    def markers(self) -> list[Marker]:
        """Every marker, by ledger id; walks the four hex levels (markers cleared meanwhile are skipped)."""
        return [marker for marker in self.read_markers(self.ledger_ids()).values() if marker is not None]

    def ledger_ids(self) -> list[int]:
        """Ids of the marked ledgers, sorted."""
        return sorted(zkpaths.ledger_id_from_marker(path) for path in self._walk(zkpaths.UR_LEDGERS, depth=5))

    def clear(self, marker: Marker) -> bool:
        """Remove a marker only if nobody changed it since `marker` was read; False when it changed or is gone.

        A bookie lost while a repair ran merges into the marker and bumps its version, so the repair's clear
        fails and the new loss is kept.
        """
        txn = self.zk.transaction()
        self.clear_in(txn, marker)
        if any(isinstance(result, Exception) for result in txn.commit()):
            return False
        self.prune_levels(self.shared_levels([marker.ledger_id]))
        return True

    def clear_in(self, txn: TransactionRequest, marker: Marker) -> None:
        """clear(marker) as part of the caller's transaction (all or nothing), with the marker's own level (every
        ledger id has its own last 4-hex level); once it committed, prune_levels(shared_levels(...))."""
        self._delete_in(txn, marker)
        txn.delete(zkpaths.underreplicated(marker.ledger_id).rsplit("/", 1)[0])

    @staticmethod
    def _delete_in(txn: TransactionRequest, marker: Marker) -> None:
        txn.delete(zkpaths.underreplicated(marker.ledger_id), version=marker.version)
        if marker.reasons_version is not None:
            txn.delete(zkpaths.marker_reasons(marker.ledger_id), version=marker.reasons_version)

    @staticmethod
    def shared_levels(cleared: Iterable[int]) -> set[str]:
        """The levels above the ones clear_in() removed with these ledgers' markers."""
        return {zkpaths.underreplicated(ledger_id).rsplit("/", 2)[0] for ledger_id in cleared}

    def prune_levels(self, levels: Iterable[str]) -> None:
        """Remove these hex levels and those above them while left empty, so listing stays proportional to the
        markers (best effort); each distinct level is tried once, a whole depth at a time in one pipeline."""
        pending = set(levels) - {zkpaths.UR_LEDGERS}
        while pending:
            deletes = pipelined(sorted(pending), self.zk.delete_async)
            pending = set()
            for path, delete in deletes:
                try:
                    delete.get()
                except (NotEmptyError, NoNodeError):
                    continue
                pending.add(path.rsplit("/", 1)[0])
            pending.discard(zkpaths.UR_LEDGERS)

    # --- locks ----------------------------------------------------------------------------------------------

    def acquire(self, ledger_id: int, holder: str | None = None) -> bool:
        """Take the ledger's repair lock; False if someone else holds it. Ephemeral: dies with the session."""
        return ledger_id in self.acquire_all([ledger_id], holder)

    def acquire_all(self, ledger_ids: Iterable[int], holder: str | None = None) -> set[int]:
        """acquire() for many ledgers in one pipeline of asynchronous creates; returns the ids locked."""
        data = lock_record(holder or f"{socket.gethostname()}:{os.getpid()}")
        session = self._session()
        lock = zkpaths.underreplication_lock
        self.zk.ensure_path(zkpaths.UR_LOCKS)  # once, not a makepath race of every create on a fleet's first run
        creates = pipelined(ledger_ids, lambda ledger_id: self.zk.create_async(lock(ledger_id), data, ephemeral=True))
        taken = set()
        for ledger_id, create in creates:
            try:
                create.get()
            except NodeExistsError:
                continue
            self.held[ledger_id] = session
            taken.add(ledger_id)
        return taken

    def release(self, ledger_id: int) -> None:
        """Drop the ledger's lock if this session holds it (never someone else's)."""
        self.held.pop(ledger_id, None)
        path = zkpaths.underreplication_lock(ledger_id)
        try:
            _, stat = self.zk.get(path)
            if stat.ephemeralOwner == self._session():
                self.zk.delete(path, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass

    def release_in(self, txn: TransactionRequest, ledger_id: int) -> bool:
        """release() as part of the caller's transaction, when this object took the lock in the session the client
        still has (so the lock is surely ours); False, and nothing added, when that is not known: call release()."""
        if self.held.get(ledger_id) != self._session():
            return False
        txn.delete(zkpaths.underreplication_lock(ledger_id))
        self.held.pop(ledger_id)
        return True

    def _session(self) -> int | None:
        return self.zk.client_id[0] if self.zk.client_id else None

    def is_locked(self, ledger_id: int) -> bool:
        return self.zk.exists(zkpaths.underreplication_lock(ledger_id)) is not None

    def lock_watch(self) -> LockWatch:
        return LockWatch(self.zk)

    # --- switches -------------------------------------------------------------------------------------------

    def disable(self) -> None:
        """Pause ledger replication (e.g. for a rolling restart): the auditor defers marking, repair waits."""
        with contextlib.suppress(NodeExistsError):
            self.zk.create(zkpaths.UR_DISABLE, b"", makepath=True)

    def enable(self) -> None:
        with contextlib.suppress(NoNodeError):
            self.zk.delete(zkpaths.UR_DISABLE)

    def is_disabled(self) -> bool:
        return self.zk.exists(zkpaths.UR_DISABLE) is not None

    def watch_disabled(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(disabled)` now and on every flip of the switch, until the session closes."""
        self.zk.DataWatch(zkpaths.UR_DISABLE, lambda data, stat: callback(stat is not None))

    def recovery_delay(self, default: float = DEFAULT_RECOVERY_DELAY) -> float:
        """lostBookieRecoveryDelay in seconds: how long a vanished bookie may stay away before it is lost."""
        try:
            data, _ = self.zk.get(zkpaths.UR_RECOVERY_DELAY)
        except NoNodeError:
            return default
        return _delay_from(data, default)

    def set_recovery_delay(self, seconds: float) -> None:
        """Store the delay; BookKeeper keeps whole seconds, so a fraction is refused rather than rounded."""
        if not seconds >= 0 or seconds != int(seconds):
            raise ValueError(f"lostBookieRecoveryDelay must be whole seconds >= 0, got {seconds}")
        put(self.zk, zkpaths.UR_RECOVERY_DELAY, str(int(seconds)).encode())

    def configure(self, enabled: bool, delay: float) -> None:
        """Set the switch and the delay to these values, writing only what differs (the operator, every pass)."""
        if self.recovery_delay() != delay:
            self.set_recovery_delay(delay)
        if self.is_disabled() == enabled:
            self.enable() if enabled else self.disable()

    def watch_recovery_delay(self, callback: Callable[[float], None], default: float = DEFAULT_RECOVERY_DELAY) -> None:
        """Call `callback(seconds)` now and whenever the stored delay changes, until the session closes."""

        def changed(data: bytes | None, stat) -> None:
            callback(default if stat is None else _delay_from(data, default))

        self.zk.DataWatch(zkpaths.UR_RECOVERY_DELAY, changed)

    # --- the full replica check ---------------------------------------------------------------------------

    def check_all_ledgers_ctime(self) -> int | None:
        """When (ms since the epoch) an auditor, bookfleet's or BookKeeper's, last finished checking every ledger's
        replicas; None if none ever did."""
        try:
            data, _ = self.zk.get(zkpaths.UR_CHECK_ALL_LEDGERS_CTIME)
        except NoNodeError:
            return None
        return check_all_ledgers_ctime_of(data)

    def set_check_all_ledgers_ctime(self, ctime_ms: int) -> None:
        put(self.zk, zkpaths.UR_CHECK_ALL_LEDGERS_CTIME, check_all_ledgers_record(ctime_ms))

    # --- data loss ------------------------------------------------------------------------------------------

    def mark_data_loss(self, ledger_id: int, entries: Iterable[int]) -> DataLoss:
        """Record entries of a ledger that have no surviving replica; merges with an earlier record."""
        lost = set(entries)
        path = zkpaths.dataloss(ledger_id)
        while True:
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                record = DataLoss(ledger_id, tuple(sorted(lost)), _now_ms())
                try:
                    self.zk.create(
                        path, _encode({"entries": list(record.entries), "ctime": record.ctime}), makepath=True
                    )
                except NodeExistsError:
                    continue
                return record
            document = _decode(data, path)
            record = DataLoss(ledger_id, tuple(sorted(lost | set(document.get("entries", ())))), document["ctime"])
            try:
                self.zk.set(
                    path, _encode({"entries": list(record.entries), "ctime": record.ctime}), version=stat.version
                )
            except (BadVersionError, NoNodeError):
                continue
            return record

    def data_loss(self, ledger_id: int) -> DataLoss | None:
        return next(iter(self._data_losses([ledger_id])), None)

    def data_losses(self) -> list[DataLoss]:
        """Every DATA_LOSS record, by ledger id."""
        return self._data_losses(sorted(int(leaf[1:]) for leaf in self._children(zkpaths.UR_DATALOSS)))

    def _data_losses(self, ledger_ids: list[int]) -> list[DataLoss]:
        """The records of these ledgers that exist, read in multiRead requests (read_many)."""
        records = []
        for ledger_id, read in read_many(self.zk, ledger_ids, zkpaths.dataloss):
            if read is not None:
                document = _decode(read[0], zkpaths.dataloss(ledger_id))
                records.append(DataLoss(ledger_id, tuple(document.get("entries", ())), document.get("ctime", 0)))
        return records

    # --- tree helpers ---------------------------------------------------------------------------------------

    def _children(self, path: str) -> list[str]:
        try:
            return self.zk.get_children(path)
        except NoNodeError:
            return []

    def _walk(self, root: str, depth: int) -> list[str]:
        """Paths `depth` levels below `root`; each depth is listed in multiRead requests (read_many; a level cleared
        meanwhile lists nothing)."""
        paths = [root]
        for _ in range(depth):
            paths = [f"{path}/{child}" for path, children in read_many(self.zk, paths, str, children=True)
                     for child in sorted(children or ())]
        return paths


class LockWatch:
    """Learns when repair locks other sessions hold go (released, or their holder's session ended: the lock is
    ephemeral) from ZooKeeper watches, not by polling: a repair that found a ledger locked by another repair waits
    for it instead of leaving it to a later run."""

    def __init__(self, zk: KazooClient):
        self.zk = zk
        self._watched: dict[str, int] = {}
        """lock path -> ledger id, of the locks watched and last seen held."""
        self._changed: set[int] = set()
        self._signal = threading.Condition()

    def watch(self, ledger_ids: Iterable[int]) -> set[int]:
        """Watch these ledgers' locks, in one pipeline of exists calls that each leave a watch; returns the ledgers
        whose lock is already gone (those are not watched)."""
        paths = {ledger_id: zkpaths.underreplication_lock(ledger_id) for ledger_id in ledger_ids}
        with self._signal:
            self._watched.update({path: ledger_id for ledger_id, path in paths.items()})
        checks = pipelined(paths, lambda ledger_id: self.zk.exists_async(paths[ledger_id], watch=self._fired))
        gone = {ledger_id for ledger_id, check in checks if check.get() is None}
        with self._signal:
            for ledger_id in gone:
                self._watched.pop(paths[ledger_id], None)
        return gone

    def wait(self, timeout: float) -> set[int]:
        """Wait up to `timeout` seconds for watched locks to go; returns those gone, empty if none went in time."""
        deadline = time.monotonic() + timeout
        while True:
            with self._signal:
                self._signal.wait_for(lambda: self._changed, max(0.0, deadline - time.monotonic()))
                changed, self._changed = self._changed & set(self._watched.values()), set()
            gone = self.watch(changed)  # a lock's data set, or a session event: look again, re-arming its watch
            if gone or time.monotonic() >= deadline:
                return gone

    def _fired(self, event: WatchedEvent) -> None:
        """kazoo's watch callback, on its event thread (never blocks). A session event names no path and may have
        dropped every watch: all are looked at again."""
        with self._signal:
            if event.path is None:
                self._changed.update(self._watched.values())
            elif event.path in self._watched:
                self._changed.add(self._watched[event.path])
            self._signal.notify_all()


def _delay_from(data: bytes, default: float) -> float:
    if not data:
        return default
    try:
        return float(int(data))
    except ValueError:
        raise ValueError(f"{zkpaths.UR_RECOVERY_DELAY} holds {data[:40]!r}, not whole seconds") from None


def _parse_marker(ledger_id: int, data: bytes, stat) -> Marker:
    """A marker as bookfleet or BookKeeper wrote it (BookKeeper's may lack the ctime: 0)."""
    record = UnderreplicatedLedgerFormat()
    try:
        text_format.Parse(data.decode(), record)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise ValueError(f"{zkpaths.underreplicated(ledger_id)} is not an UnderreplicatedLedgerFormat: {exc}") from None
    return Marker(ledger_id, frozenset(record.replica), record.ctime, stat.version)
