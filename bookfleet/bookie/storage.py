"""LedgerStorage: the bookie's storage API, tying journal, memtable, entry log, index and checkpoint together.

Add path: check the ledger's state, put the entry in the memtable, apply its effects (last entry, LAC) and append
it to the journal, all without yielding; then wait for the journal's fdatasync. Because state is applied before any
await, a memtable swapped out for flushing holds every record before the journal's synced position at that moment,
which is therefore a safe LastLogMark once the flush is durable. Replay is idempotent, so records after the mark
that were flushed anyway are simply applied again.

Reads look in the active memtable, then the one being flushed, then the index and the entry log (pread on the
event loop: page-cache reads take microseconds, and it keeps a read atomic with respect to GC removing files).

A flush that fails must neither repeat forever nor hold back the other ledgers: when the index refuses some
ledgers' rows, the others are committed ledger by ledger and the refused ledgers are quarantined — kept in memory
(still readable), refused for further changes, and written to the journal again, so the LastLogMark can move past
their old records (the journal is trimmed as usual) while a restart still replays them. The quarantine is bounded
(`quarantine_bytes`): an index that refuses more than that fails the storage instead of collecting ever more ledgers.
A failure of the disk or of the index itself (an OSError, SQLite's I/O and full-disk errors, an index file that is
corrupt or no database at all) is reported through `on_failure` and retried with backoff: the bookie turns
read-only and leaves the writable set, and reads go on from whatever is still readable (the memtables, the entry
logs through an index that still answers).

A journal whose synced records were lost (journal.Replay's `damage`: not a torn tail) leaves the bookie unable to
vouch that an entry it lacks was never written here: any ledger's records may have been in the lost span. That is
recorded for good (checkpoint.JournalDamage) and every read of something absent answers CannotVouch instead of
NoSuchLedger / NoSuchEntry, which recovery and repair would count as proof of absence (see docs/design.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import hmac
import logging
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bookfleet import wire
from bookfleet.bookie import gc
from bookfleet.bookie.checkpoint import JournalDamage, LastLogMark
from bookfleet.bookie.entrylog import EntryLogger, Written
from bookfleet.bookie.errors import (
    BadRequest,
    CannotVouch,
    LedgerFenced,
    NoSuchEntry,
    NoSuchLedger,
    ShuttingDown,
    StaleWriterEpoch,
    StorageFailure,
    Unauthorized,
)
from bookfleet.bookie.index import IndexedLedger, LedgerIndex
from bookfleet.bookie.journal import (
    LEDGER,
    LEDGER_AND_EPOCH,
    LEDGER_AND_LAC,
    Journal,
    JournalPosition,
    RecordType,
    Replay,
)
from bookfleet.bookie.memtable import Memtable

log = logging.getLogger(__name__)

GcReport = gc.GcReport
_CORRUPT_INDEX = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
"""Primary SQLite result codes of an index file that is damaged or not a database: Python raises them as a plain
sqlite3.DatabaseError, the class a refused row (IntegrityError) belongs to as well."""
FLUSH_STEP_ENTRIES = 512
"""Entries a flush appends to the entry log per worker-thread call. Their records are packed in C and copied and
written without the GIL (entrylog.py), so what a step holds the GIL for is sorting and gathering them and a few
Python calls: tens of microseconds at 1 KiB. A step costs a thread handoff of the event loop, well under a hundred
instructions an entry at this size; the index's commit writes a row per run and is as short."""
MAX_FLUSH_BACKOFF = 30.0
"""Longest wait between retries of a failing flush (seconds)."""
_ENTRY_HEADER = wire.ENTRY_HEADER
_INT64_MAX = wire.INT64_MAX
_MASTER_KEY_SIZE = wire.MASTER_KEY_SIZE
"""A ledger's first add brings its key: BookKeeper's SHA-1 of the password, from either client."""


@dataclass(frozen=True)
class StorageSettings:
    journal_max_wait: float = 0.0
    """Seconds a journal batch may wait for more records before it is written. The default 0 writes as soon as the
    previous sync ends: under load the records that arrived during that sync form the next group commit."""
    journal_flush_bytes: int = 512 * 1024
    """A batch this large is written at once, without waiting."""
    journal_roll_bytes: int = 256 * 1024 * 1024
    """A journal file rolls somewhere between half of this and this (journal.roll_point); it is an older file
    reused at the size it had, or, on the first lap, a new one that grows by append (no zeros written ahead)."""
    memtable_bytes: int = 64 * 1024 * 1024
    """Flush the memtable to the entry log once it holds this much; adds wait for the flush under way once it holds
    twice this. Kept at 64 KiB entries too: Apache BookKeeper's DbLedgerStorage also writes every entry to its entry
    log within seconds (each 32 MB half of its write cache as it fills) and holds adds at 64 MB (docs/design.md)."""
    flush_interval: float = 0.25
    """Seconds between timed flushes of whatever the memtable holds: frequent small flushes keep each stall of the
    event loop short (a flush's entry-log writes and index commit hold the GIL)."""
    entrylog_roll_bytes: int = 512 * 1024 * 1024
    compaction_live_ratio: float = 0.5
    """GC compacts an entry log whose live bytes are under this fraction of its size."""
    quarantine_bytes: int = 64 * 1024 * 1024
    """Entries of ledgers the index refused that are kept in memory; past this the storage fails (read-only)."""

    def __post_init__(self) -> None:
        for name in (
            "journal_flush_bytes", "journal_roll_bytes", "memtable_bytes", "entrylog_roll_bytes", "quarantine_bytes"
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"storage setting {name} must be positive, got {getattr(self, name)}")
        for name in ("journal_max_wait", "flush_interval"):
            if getattr(self, name) < 0:
                raise ValueError(f"storage setting {name} must not be negative, got {getattr(self, name)}")
        ratio = self.compaction_live_ratio
        if not 0 <= ratio <= 1:
            raise ValueError(f"storage setting compaction_live_ratio must be in [0, 1], got {ratio}")


class LedgerStorage:
    """A bookie's ledgers on disk; see docs/design.md for the contract. Every acknowledging call returns after
    fdatasync."""

    def __init__(
        self,
        journal_dir: Path,
        ledger_dir: Path,
        settings: StorageSettings | None = None,
        on_journal_sync: Callable[[int, float], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        on_flush: Callable[[float], None] | None = None,
        on_memtable_wait: Callable[[float], None] | None = None,
    ):
        """`on_journal_sync(bytes, seconds)`: called after each journal group commit (Journal's `on_sync`).
        `on_failure(reason)`: called on the event loop when the journal or a flush fails on the disk, so the bookie
        stops taking adds at once and says why. `on_flush(seconds)`: how long a flush of a non-empty memtable took,
        and `on_memtable_wait(seconds)`: how long adds held by a full memtable waited for it (a tail's suspects)."""
        self.journal_dir = Path(journal_dir)
        self.ledger_dir = Path(ledger_dir)
        self.settings = settings or StorageSettings()
        self._journal = Journal(
            self.journal_dir,
            self.settings.journal_max_wait,
            self.settings.journal_flush_bytes,
            self.settings.journal_roll_bytes,
            on_journal_sync,
            self._failed,
        )
        self._on_failure = on_failure
        self._on_flush = on_flush
        self._on_memtable_wait = on_memtable_wait
        self.failure: str | None = None
        """Why the storage stopped taking adds (the journal or the disk failed); None while healthy."""
        self._mark = LastLogMark(self.ledger_dir)
        self._damage_record = JournalDamage(self.ledger_dir)
        self.journal_damage: str | None = None
        """The synced journal spans this bookie lost (then it cannot vouch for anything it lacks); None if none."""
        self._index: LedgerIndex | None = None
        self._entry_logger: EntryLogger | None = None
        self._ledgers: dict[int, IndexedLedger] = {}
        self._dirty: set[int] = set()
        """Ledgers whose state changed since the last flush."""
        self._active = Memtable()
        self._flushing: Memtable | None = None
        self._quarantine = Memtable()
        """Entries of ledgers the index refused (see the module docstring)."""
        self._quarantined: dict[int, str] = {}
        """Why each quarantined ledger could not be indexed."""
        self._quarantine_hold: JournalPosition | None = None
        """Where the last journal copy of the quarantined ledgers starts."""
        self._flush_lock = asyncio.Lock()
        self._gc_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self._memtable_taken: asyncio.Future[None] | None = None
        """Resolved when a flush takes the memtable (or the size-triggered flushes end): adds held at twice
        memtable_bytes wait for this."""
        self._flush_failing = False
        """The last timed or size-triggered flush failed (its traceback is logged once per run of failures)."""
        self._timer: asyncio.Task[None] | None = None
        self._lac_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._open = False

    # --- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the index and entry logs, replay the journal from the LastLogMark, start a new journal file."""
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._open_files)
        await self._journal.start()
        self._open = True
        self._timer = asyncio.get_running_loop().create_task(self._flush_periodically(), name="memtable-flush-timer")

    def _open_files(self) -> None:
        self._index = LedgerIndex(self.ledger_dir)
        self._entry_logger = EntryLogger(self.ledger_dir, self.settings.entrylog_roll_bytes)
        self._ledgers = self._index.ledgers()
        mark = self._mark.read()
        started = time.monotonic()
        records = 0
        replayed = Replay(self.journal_dir, mark)
        for rtype, body in replayed:
            self._apply(rtype, body)
            records += 1
        if records:
            log.info("replayed %d journal records from %s in %.2f s", records, mark, time.monotonic() - started)
        if replayed.damage:
            self._damage_record.add([str(damage) for damage in replayed.damage])
        self.journal_damage = self._damage_record.read()
        if self.journal_damage is not None:
            log.error(
                "this bookie's journal lost synced records (%s): it cannot vouch for any entry it lacks, answers "
                "UNKNOWN_LEDGER_STATE for them and takes no adds; decommission it (its ledgers re-replicated from "
                "the other bookies, its directories wiped) or remove %s once every ledger on it was repaired",
                self.journal_damage, self._damage_record.path,
            )

    def _apply(self, rtype: RecordType, body: bytes) -> None:
        """Re-apply one journal record (idempotent: a record may already be in the index)."""
        if rtype == RecordType.ADD:
            ledger_id, entry_id, lac, _ = _ENTRY_HEADER.unpack_from(body)
            state = self._ledgers.get(ledger_id)
            if state is None:  # its MASTER_KEY record is before the mark and the ledger was deleted since
                return
            self._put(state, ledger_id, entry_id, lac, bytes(body))
            return
        (ledger_id,) = LEDGER.unpack_from(body)
        state = self._ledgers.get(ledger_id)
        if rtype == RecordType.MASTER_KEY:
            if state is None:
                self._ledgers[ledger_id] = IndexedLedger(bytes(body[LEDGER.size :]))
        elif state is None:
            return
        elif rtype == RecordType.FENCE:
            state.fenced = True
        elif rtype == RecordType.WRITER_EPOCH:
            state.writer_epoch = max(state.writer_epoch, LEDGER_AND_EPOCH.unpack_from(body)[1])
        else:
            state.explicit_lac = max(state.explicit_lac, LEDGER_AND_LAC.unpack_from(body)[1])
        self._dirty.add(ledger_id)

    async def close(self) -> None:
        """Flush the memtable, checkpoint, and close every file (what a graceful shutdown does). A storage that
        failed closes anyway: what the flush could not write is in the journal, replayed at the next start."""
        if not self._open:
            return
        self._open = False
        self._timer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._timer
        await self._journal.close()
        async with self._gc_lock:  # a compaction in a worker thread may still use the files
            try:
                await self.flush()
            except Exception:
                if self.failure is None:
                    raise
                log.warning("closing failed storage without a last flush: its memtable is in the journal only")
            finally:
                self._entry_logger.close()
                self._index.close()
        for waiters in self._lac_waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    # --- writes ------------------------------------------------------------------------------------------------

    async def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        entry: bytes,
        master_key: bytes,
        recovery: bool = False,
        writer_epoch: int = 0,
    ) -> None:
        """`add_unpacked` for a caller holding a whole encoded entry: checks that its header names this ledger and
        entry, applies the add and returns once it is durable (what add_unpacked raises, it raises)."""
        if len(entry) < _ENTRY_HEADER.size:
            raise BadRequest(f"entry of {len(entry)} bytes is shorter than the {_ENTRY_HEADER.size}-byte header")
        header_ledger, header_entry, lac, _ = _ENTRY_HEADER.unpack_from(entry)
        if header_ledger != ledger_id or header_entry != entry_id:
            raise BadRequest(
                f"entry header names ledger {header_ledger} entry {header_entry}, "
                f"the request ledger {ledger_id} entry {entry_id}"
            )
        await self.add_unpacked(ledger_id, entry_id, lac, bytes(entry), master_key, recovery, writer_epoch)

    def add_unpacked(
        self,
        ledger_id: int,
        entry_id: int,
        lac: int,
        entry: bytes,
        master_key: bytes,
        recovery: bool,
        writer_epoch: int = 0,
    ) -> asyncio.Future[None]:
        """The one add of the storage, applied at once: the first master key seen for a ledger becomes its key; a
        writer epoch older than the ledger's is refused (StaleWriterEpoch) unless `recovery`, a newer one becomes the
        ledger's. The caller unpacked the ids of `entry`'s header itself (the server reads them with the request's
        other fields in one unpack). Returns the future of the add's group commit: adds resolved by the same commit
        share it, so a server answers them together; await it directly (it ignores cancellation)."""
        if not self._open:
            raise ShuttingDown("the bookie's storage is closed")
        if not (
            0 <= ledger_id <= _INT64_MAX
            and 0 <= entry_id <= _INT64_MAX
            and -1 <= lac <= _INT64_MAX
            and 0 <= writer_epoch <= _INT64_MAX
        ):
            wire.check_ledger_id(ledger_id, "entry header's ledger id")  # whichever is out of range raises
            wire.check_entry_id(entry_id, "entry header's entry id")
            wire.check_lac(lac, "entry header's lac")
            wire.check_writer_epoch(writer_epoch)
        state = self._writable(ledger_id, master_key, recovery)
        if writer_epoch != state.writer_epoch:
            if writer_epoch > state.writer_epoch:
                self._raise_epoch(state, ledger_id, writer_epoch)
            elif not recovery or self._holds_other_copy(state, ledger_id, entry_id, entry):
                # A recovery add or repair copy may fill in an entry and repeat one, never replace a newer
                # writer's copy with an older writer's view of the ledger.
                raise StaleWriterEpoch(ledger_id, writer_epoch, state.writer_epoch)
        self._put(state, ledger_id, entry_id, lac, entry)
        return self._unless_memtable_full(self._journal.append(RecordType.ADD, entry))

    def add_run(
        self, ledger_id: int, master_key: bytes, recovery: bool, writer_epoch: int, entry_ids: list[int],
        lacs: list[int], entries: list[bytes],
    ) -> asyncio.Future[None]:
        """Consecutive adds of one writer (ledger, key, recovery flag, epoch) applied as `add_unpacked` applies each
        in turn, with one memtable insert and one journal append for them all; every entry's header must name
        `ledger_id`, its `entry_ids` and `lacs` (the caller read them from it). All or nothing: whatever would refuse
        one of them (the same checks, made once) raises before anything changes, and the caller adds them one by one
        to learn which (only a recovery add of an older epoch is judged entry by entry)."""
        if not self._open:
            raise ShuttingDown("the bookie's storage is closed")
        if not (
            0 <= ledger_id <= _INT64_MAX and 0 <= writer_epoch <= _INT64_MAX
            and min(entry_ids) >= 0 and max(entry_ids) <= _INT64_MAX and min(lacs) >= -1 and max(lacs) <= _INT64_MAX
        ):
            raise BadRequest(f"adds to ledger {ledger_id} with an id, lac or writer epoch out of range")
        state = self._writable(ledger_id, master_key, recovery)
        if writer_epoch > state.writer_epoch:
            self._raise_epoch(state, ledger_id, writer_epoch)
        elif writer_epoch < state.writer_epoch:
            raise StaleWriterEpoch(ledger_id, writer_epoch, state.writer_epoch)
        self._active.put_run(ledger_id, entry_ids, entries)
        self._advance(state, ledger_id, max(entry_ids), max(lacs))
        return self._unless_memtable_full(self._journal.append_run(RecordType.ADD, entries))

    def _unless_memtable_full(self, synced: asyncio.Future[None]) -> asyncio.Future[None]:
        """An add's commit future, or, once the memtable has grown to twice its size, one that also waits until a
        flush takes the memtable (backpressure on adds)."""
        if self._active.size >= self.settings.memtable_bytes:
            taken = self._memtable_full()
            if taken is not None:
                return asyncio.ensure_future(self._synced_after(taken, synced))
        return synced

    def _writable(self, ledger_id: int, master_key: bytes, recovery: bool) -> IndexedLedger:
        """The state of a ledger an add may change (created by its first add), or why not: a failed storage or a
        quarantined ledger, another master key, a fenced ledger to all but recovery adds."""
        if self.failure is not None or self._quarantined:
            self._check_changeable(ledger_id)
        state = self._ledgers.get(ledger_id)
        if state is None:
            state = self._create(ledger_id, master_key)
        elif not hmac.compare_digest(state.master_key, master_key):
            raise Unauthorized(ledger_id)
        if state.fenced and not recovery:
            raise LedgerFenced(ledger_id)
        return state

    async def _synced_after(self, taken: asyncio.Future[None], synced: asyncio.Future[None]) -> None:
        held = time.perf_counter()
        await asyncio.shield(taken)
        if self._on_memtable_wait is not None:
            self._on_memtable_wait(time.perf_counter() - held)
        await synced

    async def fence(self, ledger_id: int, master_key: bytes) -> None:
        """Fence a ledger: from now on only recovery adds are accepted. A ledger this bookie has never seen is
        recorded as fenced too, so a stale writer cannot add to it afterwards; a read then finds no entry."""
        self._check_open()
        self._check_changeable(wire.check_ledger_id(ledger_id))
        state = self._authorized(ledger_id, master_key)
        state.fenced = True
        self._dirty.add(ledger_id)
        await self._journal.append(RecordType.FENCE, LEDGER.pack(ledger_id))

    async def raise_writer_epoch(self, ledger_id: int, writer_epoch: int, master_key: bytes) -> None:
        """A reopening writer's fence: from now on adds of an older writer epoch are refused. Refused itself on a
        fenced ledger (recovery owns it) and for an epoch older than one seen (a later writer won). A ledger this
        bookie has never seen is recorded with the epoch, so the old writer cannot start it here either."""
        self._check_open()
        self._check_changeable(wire.check_ledger_id(ledger_id))
        wire.check_writer_epoch(writer_epoch)
        if self.journal_damage is not None:  # the answer is this bookie's view of the ledger's end
            raise CannotVouch(ledger_id, None, self.journal_damage)
        state = self._authorized(ledger_id, master_key)
        if state.fenced:
            raise LedgerFenced(ledger_id)
        if writer_epoch < state.writer_epoch:
            raise StaleWriterEpoch(ledger_id, writer_epoch, state.writer_epoch)
        await self._raise_epoch(state, ledger_id, writer_epoch)

    def _raise_epoch(self, state: IndexedLedger, ledger_id: int, writer_epoch: int) -> asyncio.Future[None]:
        """Apply and journal a writer epoch no lower than the ledger's; returns the future of its group commit (an
        equal one is journaled again, so a raise is answered only once a record of it is durable)."""
        state.writer_epoch = writer_epoch
        self._dirty.add(ledger_id)
        return self._journal.append(RecordType.WRITER_EPOCH, LEDGER_AND_EPOCH.pack(ledger_id, writer_epoch))

    async def set_explicit_lac(self, ledger_id: int, lac: int, master_key: bytes, body: bytes = b"") -> None:
        """Record a LAC the writer sent on its own (WRITE_LAC), and `body`, its digest-signed copy, for READ_LAC;
        the ledger's LAC never goes backwards. Refused on a fenced ledger: after fencing only recovery decides how
        far the ledger goes."""
        self._check_open()
        self._check_changeable(wire.check_ledger_id(ledger_id))
        wire.check_lac(lac)
        state = self._authorized(ledger_id, master_key)
        if state.fenced:
            raise LedgerFenced(ledger_id)
        if body and lac >= state.explicit_lac:
            state.explicit_lac_body = bytes(body)
        if lac > state.explicit_lac:
            previous = state.lac
            state.explicit_lac = lac
            self._dirty.add(ledger_id)
            if state.lac > previous:
                self._wake_lac_waiters(ledger_id)
        await self._journal.append(RecordType.LAC, LEDGER_AND_LAC.pack(ledger_id, lac))

    async def force(self, ledger_id: int) -> None:
        """Return once everything accepted before this call is fdatasynced (FORCE_LEDGER)."""
        self._check_open()
        synced = self._journal.barrier()
        if synced is not None:
            await synced

    # --- reads -------------------------------------------------------------------------------------------------

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        self._check_open()
        if ledger_id not in self._ledgers:
            raise self._absent(ledger_id)
        entry = self._stored(ledger_id, entry_id)
        if entry is None:
            raise self._absent(ledger_id, entry_id)
        return entry

    def _stored(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The newest copy of an entry: memtables first, then the entry log through the index."""
        entry = self._active.get(ledger_id, entry_id)
        if entry is None and self._flushing is not None:
            entry = self._flushing.get(ledger_id, entry_id)
        if entry is None and ledger_id in self._quarantined:
            entry = self._quarantine.get(ledger_id, entry_id)
        if entry is None:
            try:
                location = self._index.locate(ledger_id, entry_id)
            except sqlite3.Error as exc:
                self._check_index(exc)
                raise
            if location is not None:
                entry = self._entry_logger.read(*location)
        return entry

    def _holds_other_copy(self, state: IndexedLedger, ledger_id: int, entry_id: int, entry: bytes) -> bool:
        """Whether this bookie holds a copy of the entry that differs from `entry` (the rare case of a recovery
        add of an older writer epoch: most fill in entries past the last one held and look nothing up)."""
        if entry_id > state.last_entry:
            return False
        stored = self._stored(ledger_id, entry_id)
        return stored is not None and stored != entry

    async def read_range(
        self, ledger_id: int, first: int, last: int, max_bytes: int, max_entries: int | None = None
    ) -> list[bytes]:
        """The present entries of [first, last] in order, stopping before max_bytes would be passed (but always
        at least one entry if any is present) or once max_entries are found. Once the journal lost synced records,
        a range with an entry absent up to where the answer ends is refused (CannotVouch) instead."""
        self._check_open()
        state = self._ledgers.get(ledger_id)
        if state is None:
            raise self._absent(ledger_id)
        asked_last, last = last, min(last, state.last_entry)
        if first > last:
            if self.journal_damage is not None:
                raise self._absent(ledger_id, first)
            return []
        in_memory: dict[int, bytes] = {}
        for memtable in (self._quarantine, self._flushing, self._active):
            if memtable is not None:
                for entry_id in memtable.entry_ids(ledger_id, first, last):
                    in_memory[entry_id] = memtable.get(ledger_id, entry_id)
        entries: list[bytes] = []
        total = 0
        previous = None
        cut = False
        try:
            with contextlib.closing(self._index.locate_range(ledger_id, first, last)) as on_disk:
                # (entry,) sorts before (entry, log, offset, size): the memtable's copy of an entry comes first.
                for item in heapq.merge([(entry_id,) for entry_id in sorted(in_memory)], on_disk):
                    if item[0] == previous:
                        continue
                    previous = item[0]
                    entry = in_memory[previous] if len(item) == 1 else self._entry_logger.read(*item[1:])
                    total += len(entry)
                    if entries and total > max_bytes:
                        cut = True
                        break
                    entries.append(entry)
                    if len(entries) == max_entries:
                        cut = True
                        break
        except sqlite3.Error as exc:
            self._check_index(exc)
            raise
        if self.journal_damage is not None:
            through = wire.entry_ids(entries[-1])[1] if cut else asked_last
            self._check_range_whole(ledger_id, first, through, entries)
        return entries

    def lac(self, ledger_id: int) -> int:
        return self._state(ledger_id).lac

    def explicit_lac_body(self, ledger_id: int) -> bytes:
        """The digest-signed explicit LAC a writer sent with WRITE_LAC (empty when none came since the start)."""
        return self._state(ledger_id).explicit_lac_body

    def last_entry_id(self, ledger_id: int) -> int:
        return self._state(ledger_id).last_entry

    async def wait_for_lac(
        self, ledger_id: int, previous: int, timeout: float, until: asyncio.Future[None] | None = None
    ) -> int:
        """The ledger's LAC once it is above `previous`, or whatever it is when `timeout` seconds have passed or
        `until` is done (the asker went away). A ledger not yet on this bookie is waited for too; NoSuchLedger if
        it still is not there at the end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            state = self._ledgers.get(ledger_id)
            if state is not None and state.lac > previous:
                return state.lac
            remaining = deadline - loop.time()
            if remaining <= 0 or not self._open or (until is not None and until.done()):
                return self.lac(ledger_id)
            waiter = loop.create_future()
            self._lac_waiters.setdefault(ledger_id, []).append(waiter)
            try:
                waiting = (waiter,) if until is None else (waiter, until)
                await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiters = self._lac_waiters.get(ledger_id)
                if waiters is not None and waiter in waiters:
                    waiters.remove(waiter)
                    if not waiters:
                        del self._lac_waiters[ledger_id]

    def has_ledger(self, ledger_id: int) -> bool:
        """True once the ledger's first add, fence or LAC write was accepted here (and until it is collected)."""
        return ledger_id in self._ledgers

    def ledger_ids(self) -> set[int]:
        return set(self._ledgers)

    # --- space -------------------------------------------------------------------------------------------------

    def used_bytes(self) -> int:
        """Bytes on disk in the journal and ledger dirs (what read-only switching watches)."""
        total = 0
        for directory in {self.journal_dir, self.ledger_dir}:
            with os.scandir(directory) as entries:
                total += sum(e.stat().st_size for e in entries if e.is_file(follow_symlinks=False))
        return total

    async def collect_garbage(self, live_ledgers: set[int]) -> GcReport:
        """Delete every local ledger not in `live_ledgers`, remove entry logs left with no live bytes and compact
        those under the compaction live ratio. Flushes first, so the checkpoint moves past the deleted ledgers'
        journal records and a restart does not bring them back."""
        self._check_open()
        await self.flush()
        return await asyncio.shield(self._collect_garbage(live_ledgers))

    async def _collect_garbage(self, live_ledgers: set[int]) -> GcReport:
        """Deleting and picking logs hold the flush lock (see gc.py); compaction does not, so adds and flushes go on
        while live entries are copied. One pass at a time (`_gc_lock`), and close() waits for it."""
        async with self._gc_lock:
            self._check_open()  # closed while this pass waited for the one before
            async with self._flush_lock:
                deleted = [ledger_id for ledger_id in self._ledgers if ledger_id not in live_ledgers]
                for ledger_id in deleted:
                    del self._ledgers[ledger_id]
                    self._dirty.discard(ledger_id)
                self._active.drop(deleted)
                self._quarantine.drop(deleted)
                for ledger_id in deleted:
                    self._quarantined.pop(ledger_id, None)
                report = await self._gc_step(
                    gc.sweep, self._index, self._entry_logger, deleted, self.settings.compaction_live_ratio
                )
                for log_id in report.logs_removed:
                    report.bytes_reclaimed += self._entry_logger.remove(log_id)
            for log_id in report.logs_compacted:
                await self._gc_step(gc.compact, self._index, self._entry_logger, log_id)
                report.bytes_reclaimed += self._entry_logger.remove(log_id)
        if report.ledgers_deleted or report.bytes_reclaimed:
            log.info("gc: %s", report)
        return report

    async def _gc_step(self, step: Callable, *args):
        """Run one GC step in a worker thread; a failing disk or index fails the storage, as a flush would."""
        try:
            return await asyncio.to_thread(step, *args)
        except Exception as exc:
            if _is_storage_error(exc):
                self._failed(f"garbage collection failed: {_describe(exc)}")
            raise

    # --- flushing ----------------------------------------------------------------------------------------------

    async def flush(self) -> None:
        """Move the memtable into the entry log and index, make both durable, then checkpoint and drop the journal
        files wholly before the new mark. Shielded: a cancelled caller must not release the lock while a worker
        thread still writes the entry log and the index."""
        await asyncio.shield(self._flush())

    async def _flush(self) -> None:
        async with self._flush_lock:
            if not self._active.ledgers and not self._dirty:
                return
            began = time.perf_counter()
            snapshot, self._active = self._active, Memtable()
            self._flushing = snapshot
            self._release_held_adds()
            ledgers = [self._ledgers[i].row(i) for i in self._dirty if i in self._ledgers]
            dirty, self._dirty = self._dirty, set()
            mark = self._journal.synced
            try:
                refused = await self._write_snapshot(snapshot, ledgers)
            except BaseException as exc:
                snapshot.absorb(self._active)
                self._active = snapshot
                self._dirty |= dirty
                if _is_storage_error(exc):  # whoever flushed (timer, GC, close): the bookie stops taking adds
                    self._failed(f"memtable flush failed: {_describe(exc)}")
                raise
            finally:
                self._flushing = None
            if refused:
                self._quarantine_ledgers(snapshot, refused)
            if self._quarantined:
                mark = min(mark, await self._keep_quarantine_journaled(bool(refused)))
            await asyncio.to_thread(self._checkpoint, mark)
            if self._on_flush is not None:
                self._on_flush(time.perf_counter() - began)

    async def _write_snapshot(self, snapshot: Memtable, ledgers: list[tuple]) -> dict[int, str]:
        """Append the snapshot to the entry log in steps of FLUSH_STEP_ENTRIES, each its own worker-thread call, so
        the GIL goes back to the event loop between steps (and while a step's bytes are copied and written). Then
        sync the log and index it (`_index_snapshot`). The snapshot stays readable throughout: the caller drops it
        only once this returns."""
        steps = snapshot.steps(FLUSH_STEP_ENTRIES)
        written: list[Written] = []
        while appended := await asyncio.to_thread(self._append_step, steps):
            written += appended
        return await asyncio.to_thread(self._index_snapshot, written, ledgers)

    def _append_step(self, steps: Iterator[list[tuple[int, list[int], list[bytes]]]]) -> list[Written]:
        """Append the next step of a snapshot (sorted and gathered here, in the worker thread); [] once done."""
        step = next(steps, None)
        return [] if step is None else self._entry_logger.append(step)

    def _index_snapshot(self, written: list[Written], ledgers: list[tuple]) -> dict[int, str]:
        """Sync the entry log the snapshot was appended to, then index it; returns the ledgers the index refused
        (with why), after committing every other ledger on its own. A failure of the disk or the database itself
        (`_is_storage_error`) is raised instead: it is no ledger's fault."""
        self._entry_logger.sync()
        try:
            self._index.commit_flush(written, ledgers)
            return {}
        except Exception as exc:
            if _is_storage_error(exc):
                raise
            log.warning("the index refused a flush; committing it ledger by ledger", exc_info=True)
        by_ledger: dict[int, tuple[list[Written], list[tuple]]] = {}
        for appended in written:
            by_ledger.setdefault(appended[0], ([], []))[0].append(appended)
        for row in ledgers:
            by_ledger.setdefault(row[0], ([], []))[1].append(row)
        refused = {}
        for ledger_id, (ledger_written, rows) in by_ledger.items():
            try:
                self._index.commit_flush(ledger_written, rows)
            except Exception as exc:
                if _is_storage_error(exc):
                    raise
                refused[ledger_id] = f"{type(exc).__name__}: {exc}"
        return refused

    def _quarantine_ledgers(self, snapshot: Memtable, refused: dict[int, str]) -> None:
        for ledger_id, why in refused.items():
            log.error("ledger %d cannot be indexed (%s): it stays in memory and the journal, read-only", ledger_id, why)
            self._quarantined[ledger_id] = why
            for entry_id, entry in snapshot.ledgers.get(ledger_id, {}).items():
                self._quarantine.put(ledger_id, entry_id, entry)
        limit = self.settings.quarantine_bytes
        if self._quarantine.size > limit:  # no more adds: the quarantine cannot grow past one more memtable
            self._failed(
                f"the index refused {len(self._quarantined)} ledger(s) whose {self._quarantine.size} bytes are "
                f"kept in memory, over quarantine_bytes ({limit})"
            )

    async def _keep_quarantine_journaled(self, refused_now: bool) -> JournalPosition:
        """The position the LastLogMark must not pass for the quarantined ledgers' sake. Their records are written
        to the journal again when ledgers were refused just now or the journal has rolled since the last copy, so
        the mark (and trimming) moves on with at most one copy per journal file."""
        hold = self._quarantine_hold
        if refused_now or hold is None or hold.seq < self._journal.current_seq:
            hold = self._journal.synced
            last = None
            for ledger_id in self._quarantined:
                state = self._ledgers[ledger_id]
                last = self._journal.append(RecordType.MASTER_KEY, LEDGER.pack(ledger_id) + state.master_key)
                for _, entry in sorted(self._quarantine.ledgers.get(ledger_id, {}).items()):
                    last = self._journal.append(RecordType.ADD, entry)
                if state.fenced:
                    last = self._journal.append(RecordType.FENCE, LEDGER.pack(ledger_id))
                if state.writer_epoch:
                    body = LEDGER_AND_EPOCH.pack(ledger_id, state.writer_epoch)
                    last = self._journal.append(RecordType.WRITER_EPOCH, body)
                if state.explicit_lac >= 0:
                    last = self._journal.append(RecordType.LAC, LEDGER_AND_LAC.pack(ledger_id, state.explicit_lac))
            await last
            self._quarantine_hold = hold
        return hold

    def _checkpoint(self, mark) -> None:
        self._mark.write(mark)
        self._journal.remove_before(mark)

    def _memtable_full(self) -> asyncio.Future[None] | None:
        """Start flushing the full memtable unless that is under way; once it has grown to twice its size, return
        the future of a flush taking it: the add waits for that (backpressure on adds), not for that flush's end.
        Its entries then no longer count against the memtable, and adds arriving after it are not held either."""
        loop = asyncio.get_running_loop()
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = loop.create_task(self._flush_while_full())
        if self._active.size < 2 * self.settings.memtable_bytes:
            return None
        if self._memtable_taken is None:
            self._memtable_taken = loop.create_future()
        return self._memtable_taken

    async def _flush_while_full(self) -> None:
        """Flush until the memtable is below its size (adds held at twice it wait for the next flush to take it,
        even when no new add comes to start one), or a flush fails; whatever happens, release the held adds."""
        try:
            while await self._flush_logged() and self._active.size >= self.settings.memtable_bytes:
                pass
        finally:
            self._release_held_adds()

    def _release_held_adds(self) -> None:
        taken, self._memtable_taken = self._memtable_taken, None
        if taken is not None and not taken.done():
            taken.set_result(None)

    async def _flush_logged(self) -> bool:
        """Flush; a failure stops adds (`on_failure`) and is logged, with its traceback only the first time."""
        try:
            await self.flush()
        except Exception as exc:
            log.error(
                "memtable flush failed; its entries stay in memory and in the journal: %s",
                exc,
                exc_info=not self._flush_failing,
            )
            self._flush_failing = True
            self._failed(f"memtable flush failed: {_describe(exc)}")
            return False
        self._flush_failing = False
        return True

    async def _flush_periodically(self) -> None:
        """Timed flushes start at a random phase and keep a little jitter, so bookies started together do not all
        stall in the same instant: with Qa < Qw the other bookies' acks carry the adds while one of them flushes.
        After a failed flush the wait doubles each time, up to MAX_FLUSH_BACKOFF: retried, never in a tight loop."""
        interval = self.settings.flush_interval
        await asyncio.sleep(random.uniform(0, interval))
        failures = 0
        while True:
            failures = 0 if await self._flush_logged() else failures + 1
            wait = min(interval * 2**failures, max(interval, MAX_FLUSH_BACKOFF))
            await asyncio.sleep(wait * random.uniform(0.9, 1.1))

    def _failed(self, reason: str) -> None:
        """The journal or the disk failed: take no more adds, and tell the bookie once, so it turns read-only."""
        if self.failure is not None:
            return
        self.failure = reason
        log.error("bookie storage failed, no further adds are taken: %s", reason)
        if self._on_failure is not None:
            self._on_failure(reason)

    # --- helpers -----------------------------------------------------------------------------------------------

    def _put(self, state: IndexedLedger, ledger_id: int, entry_id: int, lac: int, entry: bytes) -> None:
        self._active.put(ledger_id, entry_id, entry)
        self._advance(state, ledger_id, entry_id, lac)

    def _advance(self, state: IndexedLedger, ledger_id: int, entry_id: int, lac: int) -> None:
        """A ledger's entries up to `entry_id` with `lac` in their headers are in the memtable: its last entry and
        LAC move on, waking the long polls the LAC passes."""
        self._dirty.add(ledger_id)
        if entry_id > state.last_entry:
            state.last_entry = entry_id
        if lac > state.entry_lac:
            if not self._lac_waiters:
                state.entry_lac = lac
                return
            previous = state.lac
            state.entry_lac = lac
            if state.lac > previous:
                self._wake_lac_waiters(ledger_id)

    def _create(self, ledger_id: int, master_key: bytes) -> IndexedLedger:
        if len(master_key) != _MASTER_KEY_SIZE:
            raise BadRequest(f"master key of {len(master_key)} bytes, expected {_MASTER_KEY_SIZE}")
        state = self._ledgers[ledger_id] = IndexedLedger(bytes(master_key))
        self._dirty.add(ledger_id)
        self._journal.append(RecordType.MASTER_KEY, LEDGER.pack(ledger_id) + bytes(master_key))
        return state

    def _authorized(self, ledger_id: int, master_key: bytes) -> IndexedLedger:
        state = self._ledgers.get(ledger_id)
        if state is None:
            return self._create(ledger_id, master_key)
        if not hmac.compare_digest(state.master_key, master_key):
            raise Unauthorized(ledger_id)
        return state

    def _state(self, ledger_id: int) -> IndexedLedger:
        state = self._ledgers.get(ledger_id)
        if state is None:
            raise self._absent(ledger_id)
        return state

    def _absent(self, ledger_id: int, entry_id: int | None = None) -> NoSuchLedger | NoSuchEntry | CannotVouch:
        """What a read of something this bookie lacks raises: "no such ledger or entry" only while the journal has
        lost no synced record, else CannotVouch (the lost span may have held it)."""
        if self.journal_damage is not None:
            return CannotVouch(ledger_id, entry_id, self.journal_damage)
        return NoSuchLedger(ledger_id) if entry_id is None else NoSuchEntry(ledger_id, entry_id)

    def _check_range_whole(self, ledger_id: int, first: int, through: int, entries: list[bytes]) -> None:
        """A damaged journal's range answer: CannotVouch for the first id of [first, through] it lacks (a range's gaps
        are read as "lacks" by repair), unless there is none."""
        if len(entries) != through - first + 1:
            present = {wire.entry_ids(entry)[1] for entry in entries}
            raise self._absent(ledger_id, next(e for e in range(first, through + 1) if e not in present))

    def _check_open(self) -> None:
        if not self._open:
            raise ShuttingDown("the bookie's storage is closed")

    def _check_index(self, exc: sqlite3.Error) -> None:
        """After a read met an index error: a corrupt index fails the storage, as a flush that meets it does, and the
        read is refused saying why (the client asks another replica); any other error is the caller's to raise."""
        if _is_corrupt_index(exc):
            reason = f"index read failed: {_describe(exc)}"
            self._failed(reason)
            raise StorageFailure(f"bookie storage failed: {reason}") from exc

    def _check_changeable(self, ledger_id: int) -> None:
        """Refuse changes while the storage has failed, and to a quarantined ledger (its copy must stay fixed)."""
        if self.failure is not None:
            raise StorageFailure(f"bookie storage failed: {self.failure}")
        why = self._quarantined.get(ledger_id)
        if why is not None:
            raise StorageFailure(f"ledger {ledger_id} cannot be indexed on this bookie ({why}); it is read-only")

    def _wake_lac_waiters(self, ledger_id: int) -> None:
        for waiter in self._lac_waiters.pop(ledger_id, ()):
            if not waiter.done():
                waiter.set_result(None)


def _is_storage_error(exc: BaseException) -> bool:
    """An error of the disk or of the index database itself (I/O error, disk full, locked, a corrupt index file):
    the storage fails, no ledger is blamed."""
    return isinstance(exc, (OSError, sqlite3.OperationalError)) or _is_corrupt_index(exc)


def _is_corrupt_index(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.DatabaseError) else None
    return code is not None and code & 0xFF in _CORRUPT_INDEX


def _describe(exc: BaseException) -> str:
    """An error as the operator reads it in the read-only reason: a corrupt index says so."""
    if _is_corrupt_index(exc):
        return f"the ledger index is corrupt ({exc.sqlite_errorname}: {exc})"
    return str(exc)
