"""Garbage collection: forget deleted ledgers, then reclaim entry logs that hold few or no live bytes.

`sweep` runs in a worker thread while the storage holds its flush lock: no flush is half done, so a log's live bytes
are all in the index and the logs it picks (never the current one) receive no more appends. `compact`, the long
part, runs without that lock while flushes go on: the entry logger and the index serialize their own writes, a
compacted entry is repointed only where the index still points at the old log, and the old log is removed only
after that commit. Files are not unlinked here: the storage removes them on the event loop, where reads resolve a
location and pread it without yielding, so a read never looks up a location in a file that disappears before it is
read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bookfleet.bookie.entrylog import EntryLogger, Written
from bookfleet.bookie.index import LedgerIndex

COPY_BATCH_BYTES = 8 * 1024 * 1024


@dataclass
class GcReport:
    ledgers_deleted: list[int] = field(default_factory=list)
    logs_removed: list[int] = field(default_factory=list)
    """Logs deleted because no indexed entry was left in them."""
    logs_compacted: list[int] = field(default_factory=list)
    """Logs whose live entries are copied to the current log (`compact`) before they are deleted."""
    bytes_reclaimed: int = 0


def sweep(index: LedgerIndex, entry_logger: EntryLogger, deleted: list[int], min_live_ratio: float) -> GcReport:
    """Delete the ledgers' index rows, then pick logs to remove and to compact; returns the report of files to
    delete (compacting and bytes_reclaimed are up to whoever deletes them)."""
    report = GcReport(ledgers_deleted=sorted(deleted))
    if deleted:
        index.delete_ledgers(deleted)
    live = index.live_bytes_by_log()
    for log_id in entry_logger.log_ids():
        if log_id == entry_logger.current_log:
            continue
        live_bytes = live.get(log_id, 0)
        if live_bytes == 0:
            report.logs_removed.append(log_id)
        elif live_bytes < min_live_ratio * entry_logger.path(log_id).stat().st_size:
            report.logs_compacted.append(log_id)
    return report


def compact(index: LedgerIndex, entry_logger: EntryLogger, log_id: int) -> None:
    """Copy the live entries of a log to the current log, fsync it, then repoint the index in one transaction (only
    entries still in `log_id`: a flush may have written a newer copy of an entry meanwhile). Entries are read in
    file order and appended as pieces of one ledger's ascending ids, which the index keeps as runs."""
    moved: list[Written] = []
    pieces: list[tuple[int, list[int], list[bytes]]] = []
    batch_bytes = 0
    for ledger_id, entry_id, offset, size in index.entries_in_log(log_id):
        if not pieces or pieces[-1][0] != ledger_id or entry_id <= pieces[-1][1][-1]:
            pieces.append((ledger_id, [], []))
        pieces[-1][1].append(entry_id)
        pieces[-1][2].append(entry_logger.read(log_id, offset, size))
        batch_bytes += size
        if batch_bytes >= COPY_BATCH_BYTES:
            moved += entry_logger.append(pieces)
            pieces, batch_bytes = [], 0
    moved += entry_logger.append(pieces)
    entry_logger.sync()
    index.relocate(log_id, moved)
