"""Garbage collection: forget deleted ledgers, then reclaim entry logs that hold few or no live bytes.

Runs in a worker thread while the storage holds its flush lock, so nothing else writes the entry log or the index.
Files are not unlinked here: the storage removes them on the event loop, where reads resolve a location and pread
it without yielding, so a read never looks up a location in a file that disappears before it is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bookfleet.bookie.entrylog import EntryLogger
from bookfleet.bookie.index import LedgerIndex

COPY_BATCH_BYTES = 8 * 1024 * 1024


@dataclass
class GcReport:
    ledgers_deleted: list[int] = field(default_factory=list)
    logs_removed: list[int] = field(default_factory=list)
    """Logs deleted because no indexed entry was left in them."""
    logs_compacted: list[int] = field(default_factory=list)
    """Logs whose live entries were copied to the current log before they were deleted."""
    bytes_reclaimed: int = 0


def sweep(index: LedgerIndex, entry_logger: EntryLogger, deleted: list[int], min_live_ratio: float) -> GcReport:
    """Delete the ledgers' index rows, then pick logs to remove and compact; returns the report of files to delete
    (bytes_reclaimed is filled in by whoever deletes them)."""
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
            compact(index, entry_logger, log_id)
            report.logs_compacted.append(log_id)
    return report


def compact(index: LedgerIndex, entry_logger: EntryLogger, log_id: int) -> None:
    """Copy the live entries of a log to the current log, fsync it, then repoint the index in one transaction."""
    moved = []
    batch: list[tuple[int, int, bytes]] = []
    batch_bytes = 0
    for ledger_id, entry_id, offset, size in index.entries_in_log(log_id):
        batch.append((ledger_id, entry_id, entry_logger.read(log_id, offset, size)))
        batch_bytes += size
        if batch_bytes >= COPY_BATCH_BYTES:
            moved += entry_logger.append(batch)
            batch, batch_bytes = [], 0
    moved += entry_logger.append(batch)
    entry_logger.sync()
    index.relocate((log, offset, size, ledger_id, entry_id) for ledger_id, entry_id, log, offset, size in moved)
