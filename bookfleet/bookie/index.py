"""The ledger index (SQLite): where each flushed entry lives, and each ledger's durable state.

One connection writes (flushes and GC's compaction, from worker threads, one statement or transaction at a time
under a lock: compaction runs alongside flushes) and commits with synchronous=FULL in WAL mode; another reads on
the event loop (WAL readers never wait for the writer). Every flush is one transaction with
batched inserts, committed only after the entry log it points into is fsynced.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ledger INTEGER NOT NULL, entry INTEGER NOT NULL, log INTEGER NOT NULL, offset INTEGER NOT NULL,
    size INTEGER NOT NULL, PRIMARY KEY (ledger, entry)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledgers (
    ledger INTEGER PRIMARY KEY, master_key BLOB NOT NULL, fenced INTEGER NOT NULL,
    explicit_lac INTEGER NOT NULL, entry_lac INTEGER NOT NULL, last_entry INTEGER NOT NULL,
    writer_epoch INTEGER NOT NULL DEFAULT 0
);
"""
ADDED_COLUMNS = {"writer_epoch": "INTEGER NOT NULL DEFAULT 0"}
"""Columns of `ledgers` newer than some indexes on disk: added on open (an old ledger's writer epoch is 0)."""
FILE_NAME = "index.sqlite"
ENTRY_COLUMNS = 5
ROWS_PER_INSERT = 1000
"""Entry locations per INSERT statement of a flush (fewer where SQLite allows fewer bound variables)."""


@functools.lru_cache(maxsize=8)
def _insert_entries(rows: int) -> str:
    """INSERT OR REPLACE of `rows` entry locations; the full chunk's text is built once."""
    return "INSERT OR REPLACE INTO entries VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * rows)


@dataclass(slots=True)
class IndexedLedger:
    """What a bookie knows about one ledger besides its entries."""

    master_key: bytes
    fenced: bool = False
    explicit_lac: int = -1
    entry_lac: int = -1
    """The highest LAC carried by an entry stored here."""
    last_entry: int = -1
    writer_epoch: int = 0
    """The highest writer epoch seen: a non-recovery add carrying an older one is refused (a stale writer)."""
    explicit_lac_body: bytes = b""
    """The digest-signed copy of the highest explicit LAC that came with one, for READ_LAC; in memory only (after a
    restart READ_LAC answers with the last entry until the writer writes its LAC again)."""

    @property
    def lac(self) -> int:
        return max(self.entry_lac, self.explicit_lac)

    def row(self, ledger_id: int) -> tuple:
        return (
            ledger_id, self.master_key, self.fenced, self.explicit_lac, self.entry_lac, self.last_entry,
            self.writer_epoch,
        )


class LedgerIndex:
    def __init__(self, directory: Path):
        path = directory / FILE_NAME
        self._writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._writer.execute("PRAGMA journal_mode=WAL")
        self._writer.execute("PRAGMA synchronous=FULL")
        self._writer.executescript(SCHEMA)
        self._add_missing_columns()
        self._reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._writing = threading.Lock()
        """Held for each use of the writer connection: a transaction there must not take in another thread's rows."""
        variables = self._writer.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self._rows_per_insert = min(ROWS_PER_INSERT, variables // ENTRY_COLUMNS)

    def _add_missing_columns(self) -> None:
        """Bring an index written by an older bookie up to SCHEMA (columns are only ever added, at the end)."""
        present = {row[1] for row in self._writer.execute("PRAGMA table_info(ledgers)")}
        for name, definition in ADDED_COLUMNS.items():
            if name not in present:
                self._writer.execute(f"ALTER TABLE ledgers ADD COLUMN {name} {definition}")

    def ledgers(self) -> dict[int, IndexedLedger]:
        rows = self._reader.execute("SELECT * FROM ledgers").fetchall()
        return {row[0]: IndexedLedger(row[1], bool(row[2]), *row[3:]) for row in rows}

    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        """(log, offset, size) of a flushed entry."""
        return self._reader.execute(
            "SELECT log, offset, size FROM entries WHERE ledger = ? AND entry = ?", (ledger_id, entry_id)
        ).fetchone()

    def locate_range(self, ledger_id: int, first: int, last: int) -> sqlite3.Cursor:
        """A cursor over (entry, log, offset, size) of the flushed entries in [first, last], ascending; rows are
        fetched as they are consumed, so close it when done."""
        return self._reader.execute(
            "SELECT entry, log, offset, size FROM entries WHERE ledger = ? AND entry BETWEEN ? AND ? ORDER BY entry",
            (ledger_id, first, last),
        )

    def commit_flush(self, locations: Sequence[tuple], ledgers: Iterable[tuple]) -> None:
        """Insert entry locations and ledger rows (IndexedLedger.row) in one durable transaction.

        Locations go in as multi-row INSERTs: one statement step per chunk of rows instead of one per row costs a
        third less CPU per entry, and the flush thread gives up and takes back the GIL once per chunk rather than
        once per row (each handoff can stall the event loop)."""
        chunk = self._rows_per_insert
        with self._transaction() as db:
            for first in range(0, len(locations), chunk):
                rows = locations[first : first + chunk]
                db.execute(_insert_entries(len(rows)), list(itertools.chain.from_iterable(rows)))
            db.executemany("INSERT OR REPLACE INTO ledgers VALUES (?, ?, ?, ?, ?, ?, ?)", ledgers)

    def delete_ledgers(self, ledger_ids: Iterable[int]) -> None:
        ids = [(i,) for i in ledger_ids]
        with self._transaction() as db:
            db.executemany("DELETE FROM entries WHERE ledger = ?", ids)
            db.executemany("DELETE FROM ledgers WHERE ledger = ?", ids)

    def live_bytes_by_log(self) -> dict[int, int]:
        """Bytes of indexed entries per entry log (what GC would keep), computed, so it is never out of date."""
        with self._writing:
            return dict(self._writer.execute("SELECT log, SUM(size) FROM entries GROUP BY log").fetchall())

    def entries_in_log(self, log_id: int) -> list[tuple[int, int, int, int]]:
        """(ledger, entry, offset, size) of every indexed entry in one log, in file order."""
        with self._writing:
            return self._writer.execute(
                "SELECT ledger, entry, offset, size FROM entries WHERE log = ? ORDER BY offset", (log_id,)
            ).fetchall()

    def relocate(self, old_log: int, locations: Iterable[tuple]) -> None:
        """Point entries still in `old_log` at their new (log, offset, size) after compaction: rows of (log, offset,
        size, ledger, entry). An entry a flush rewrote meanwhile keeps its newer location."""
        rows = [(*location, old_log) for location in locations]
        with self._transaction() as db:
            db.executemany(
                "UPDATE entries SET log = ?, offset = ?, size = ? WHERE ledger = ? AND entry = ? AND log = ?", rows
            )

    def close(self) -> None:
        self._reader.close()
        self._writer.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One explicit transaction (the connection is in autocommit mode): COMMIT on success, ROLLBACK on error."""
        with self._writing:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                yield self._writer
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")
