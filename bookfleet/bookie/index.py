"""The ledger index (SQLite): where each flushed entry lives, and each ledger's durable state.

Entries are indexed by runs: a row per run of consecutive entry ids of one ledger in one entry log, holding each
entry's offset and size in two blobs, so a flush writes a row per run instead of one per entry (five Python ints
each). Runs never overlap: an entry indexed again (a recovery add, a re-replicated copy, compaction's copy) cuts the
older run around it in the same transaction, which keeps a row per entry's INSERT OR REPLACE meaning.

One connection writes (flushes and GC's compaction, from worker threads, one statement or transaction at a time
under a lock: compaction runs alongside flushes) and commits with synchronous=FULL in WAL mode; another reads on
the event loop (WAL readers never wait for the writer). Every flush is one transaction, committed only after the
entry log it points into is fsynced.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import sqlite3
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bookfleet.bookie.entrylog import Written

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    ledger INTEGER NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL, log INTEGER NOT NULL,
    offsets BLOB NOT NULL, sizes BLOB NOT NULL, bytes INTEGER NOT NULL, PRIMARY KEY (ledger, first)
);
CREATE TABLE IF NOT EXISTS ledgers (
    ledger INTEGER PRIMARY KEY, master_key BLOB NOT NULL, fenced INTEGER NOT NULL,
    explicit_lac INTEGER NOT NULL, entry_lac INTEGER NOT NULL, last_entry INTEGER NOT NULL,
    writer_epoch INTEGER NOT NULL DEFAULT 0
);
"""
ADDED_COLUMNS = {"writer_epoch": "INTEGER NOT NULL DEFAULT 0"}
"""Columns of `ledgers` newer than some indexes on disk: added on open (an old ledger's writer epoch is 0)."""
RUNS_BY_LOG = "CREATE INDEX IF NOT EXISTS entries ON runs (log)"
"""GC's index of runs by entry log, named `entries` so that an older bookie refuses to open this index: its schema's
`CREATE TABLE IF NOT EXISTS entries` fails on an index of that name. Without it, an older bookie started on this
directory would make an empty table and answer "no such entry" for every flushed entry, which recovery and repair
read as absence. Created once an older index's table of that name is converted."""
FILE_NAME = "index.sqlite"
MAX_RUN_ENTRIES = 1024
"""Entries of one run at most: a single entry's read loads its run's blobs (12 bytes an entry), so they stay a few
pages long, while a flush still writes a row per thousand entries, not per entry."""

Run = tuple[int, int, int, int, bytes, bytes, int]
"""A row of `runs`: (ledger, first, last, log, offsets, sizes, bytes): entries first..last of a ledger, every one of
them, in one entry log; each one's offset (u64) and size (u32) packed little-endian in id order, and their sum."""
_INSERT_RUN = "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)"
_FIRST_OF_RUN_AT = "(SELECT COALESCE(MAX(first), ?2) FROM runs WHERE ledger = ?1 AND first <= ?2)"
"""The first id of the run holding entry ?2 of ledger ?1 (or the one before it): runs never overlap, so every run
that reaches into [?2, ?3] starts from there to ?3 (an index seek, however many runs the ledger has)."""
_OVERLAPPING = f"SELECT * FROM runs WHERE ledger = ?1 AND first BETWEEN {_FIRST_OF_RUN_AT} AND ?3 AND last >= ?2"
_LOCATE = (
    "SELECT log, substr(offsets, (?2 - first) * 8 + 1, 8), substr(sizes, (?2 - first) * 4 + 1, 4) FROM runs "
    f"WHERE ledger = ?1 AND first = {_FIRST_OF_RUN_AT} AND last >= ?2"
)
_LOCATE_RANGE = (
    f"SELECT first, last, log, offsets, sizes FROM runs WHERE ledger = ?1 AND first BETWEEN {_FIRST_OF_RUN_AT} "
    "AND ?3 AND last >= ?2 ORDER BY first"
)


def runs_of(written: Written) -> Iterator[Run]:
    """The runs of what one entry-log append wrote (ascending ids of one ledger in one log): cut where an id is
    skipped and at MAX_RUN_ENTRIES."""
    ledger, entry_ids, log_id, offsets, sizes, total = written
    if len(entry_ids) <= MAX_RUN_ENTRIES and entry_ids[-1] - entry_ids[0] == len(entry_ids) - 1:
        yield ledger, entry_ids[0], entry_ids[-1], log_id, offsets, sizes, total
        return
    for start, stop in _gapless(entry_ids):
        for first in range(start, stop, MAX_RUN_ENTRIES):
            yield _cut_out(ledger, entry_ids[first], log_id, offsets, sizes, first, min(stop, first + MAX_RUN_ENTRIES))


def _gapless(entry_ids: list[int]) -> list[tuple[int, int]]:
    """The position ranges [start, stop) of ascending ids that skip no id, each as long as it goes."""
    spans: list[tuple[int, int]] = []
    for start, stop in _halves(entry_ids, 0, len(entry_ids)):
        if spans and entry_ids[start] == entry_ids[start - 1] + 1:
            spans[-1] = (spans[-1][0], stop)
        else:
            spans.append((start, stop))
    return spans


def _halves(entry_ids: list[int], start: int, stop: int) -> Iterator[tuple[int, int]]:
    """[start, stop) halved until no piece skips an id (ascending ids skip none in [a, b) iff ids[b - 1] - ids[a] ==
    b - 1 - a): a list without gaps is checked at once, one with a few gaps in a few steps."""
    if entry_ids[stop - 1] - entry_ids[start] == stop - 1 - start:
        yield start, stop
        return
    middle = (start + stop) // 2
    yield from _halves(entry_ids, start, middle)
    yield from _halves(entry_ids, middle, stop)


def _cut_out(ledger: int, first: int, log_id: int, offsets: bytes, sizes: bytes, start: int, stop: int) -> Run:
    """The run of the entries at positions [start, stop) of the packed offsets and sizes, the first one's id `first`."""
    sizes = sizes[4 * start : 4 * stop]
    total = sum(struct.unpack(f"<{stop - start}I", sizes))
    return ledger, first, first + stop - start - 1, log_id, offsets[8 * start : 8 * stop], sizes, total


def _part(run: Run, first: int, last: int) -> Run:
    """The run of entries first..last (within it) of `run`."""
    ledger, run_first, _, log_id, offsets, sizes, _ = run
    return _cut_out(ledger, first, log_id, offsets, sizes, first - run_first, last - run_first + 1)


def _locations(run: tuple[int, int, int, bytes, bytes], first: int, last: int) -> Iterator[tuple[int, int, int, int]]:
    """(entry, log, offset, size) of entries first..last of a (first, last, log, offsets, sizes) row."""
    run_first, run_last, log_id, offsets, sizes = run
    first, last = max(first, run_first), min(last, run_last)
    count, start = last - first + 1, first - run_first
    return zip(
        range(first, last + 1), itertools.repeat(log_id, count), struct.unpack_from(f"<{count}Q", offsets, 8 * start),
        struct.unpack_from(f"<{count}I", sizes, 4 * start), strict=True,
    )


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
        self._writing = threading.Lock()
        """Held for each use of the writer connection: a transaction there must not take in another thread's rows."""
        self._writer.executescript(SCHEMA)
        self._add_missing_columns()
        self._convert_entries()
        self._writer.execute(RUNS_BY_LOG)
        self._reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def _add_missing_columns(self) -> None:
        """Bring an index written by an older bookie up to SCHEMA (columns are only ever added, at the end)."""
        present = {row[1] for row in self._writer.execute("PRAGMA table_info(ledgers)")}
        for name, definition in ADDED_COLUMNS.items():
            if name not in present:
                self._writer.execute(f"ALTER TABLE ledgers ADD COLUMN {name} {definition}")

    def _convert_entries(self) -> None:
        """Bring the `entries` table of an older bookie's index (a row per entry) into `runs`, in one transaction
        that drops it: a crash meanwhile leaves the old table whole, converted again at the next start."""
        if not self._writer.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entries'").fetchone():
            return
        with self._transaction() as db:
            rows = db.execute("SELECT ledger, entry, log, offset, size FROM entries ORDER BY ledger, entry")
            for (ledger, log_id), located in itertools.groupby(rows, operator.itemgetter(0, 2)):
                entry_ids, offsets, sizes = [], [], []
                for _, entry_id, _, offset, size in located:
                    entry_ids.append(entry_id)
                    offsets.append(offset)
                    sizes.append(size)
                count = len(entry_ids)
                written = (
                    ledger, entry_ids, log_id, struct.pack(f"<{count}Q", *offsets), struct.pack(f"<{count}I", *sizes),
                    sum(sizes),
                )
                db.executemany(_INSERT_RUN, runs_of(written))
            db.execute("DROP TABLE entries")
        log.info("converted the index's entries table (a row per entry) into runs")

    def ledgers(self) -> dict[int, IndexedLedger]:
        rows = self._reader.execute("SELECT * FROM ledgers").fetchall()
        return {row[0]: IndexedLedger(row[1], bool(row[2]), *row[3:]) for row in rows}

    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        """(log, offset, size) of a flushed entry."""
        found = self._reader.execute(_LOCATE, (ledger_id, entry_id)).fetchone()
        if found is None:
            return None
        log_id, offset, size = found
        return log_id, int.from_bytes(offset, "little"), int.from_bytes(size, "little")

    def locate_range(self, ledger_id: int, first: int, last: int) -> Iterator[tuple[int, int, int, int]]:
        """(entry, log, offset, size) of the flushed entries in [first, last], ascending; runs are fetched as they
        are consumed, so close it when done."""
        with contextlib.closing(self._reader.execute(_LOCATE_RANGE, (ledger_id, first, last))) as runs:
            for run in runs:
                yield from _locations(run, first, last)

    def commit_flush(self, written: Sequence[Written], ledgers: Iterable[tuple]) -> None:
        """Index what a flush appended (EntryLogger.append's answers) and ledger rows (IndexedLedger.row) in one
        durable transaction; an entry indexed before is then found here only (its older run is cut around it)."""
        with self._transaction() as db:
            for appended in written:
                for run in runs_of(appended):
                    for older in db.execute(_OVERLAPPING, run[:3]).fetchall():
                        self._cut(db, older, run[1], run[2])
                    db.execute(_INSERT_RUN, run)
            db.executemany("INSERT OR REPLACE INTO ledgers VALUES (?, ?, ?, ?, ?, ?, ?)", ledgers)

    def delete_ledgers(self, ledger_ids: Iterable[int]) -> None:
        """Forget the ledgers, then give the write-ahead log's space back: SQLite checkpoints it only every thousand
        pages and never shrinks the file, so without this a bookie read-only on a nearly full disk could stay
        over its low-water mark after GC deleted everything it could."""
        ids = [(i,) for i in ledger_ids]
        with self._transaction() as db:
            db.executemany("DELETE FROM runs WHERE ledger = ?", ids)
            db.executemany("DELETE FROM ledgers WHERE ledger = ?", ids)
        with self._writing:
            self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def live_bytes_by_log(self) -> dict[int, int]:
        """Bytes of indexed entries per entry log (what GC would keep), computed, so it is never out of date."""
        with self._writing:
            return dict(self._writer.execute("SELECT log, SUM(bytes) FROM runs GROUP BY log").fetchall())

    def entries_in_log(self, log_id: int) -> list[tuple[int, int, int, int]]:
        """(ledger, entry, offset, size) of every indexed entry in one log, in file order."""
        with self._writing:
            runs = self._writer.execute(
                "SELECT ledger, first, last, log, offsets, sizes FROM runs WHERE log = ?", (log_id,)
            ).fetchall()
        entries = [
            (ledger, entry_id, offset, size)
            for ledger, *run in runs
            for entry_id, _, offset, size in _locations(run, run[0], run[1])
        ]
        entries.sort(key=operator.itemgetter(2))
        return entries

    def relocate(self, old_log: int, written: Iterable[Written]) -> None:
        """Point entries still in `old_log` at where compaction copied them (EntryLogger.append's answers). An entry a
        flush rewrote meanwhile keeps its newer location."""
        with self._transaction() as db:
            for appended in written:
                for run in runs_of(appended):
                    for older in db.execute(_OVERLAPPING, run[:3]).fetchall():
                        if older[3] == old_log:
                            first, last = max(run[1], older[1]), min(run[2], older[2])
                            self._cut(db, older, first, last)
                            db.execute(_INSERT_RUN, _part(run, first, last))

    def close(self) -> None:
        self._reader.close()
        self._writer.close()

    @staticmethod
    def _cut(db: sqlite3.Connection, run: Run, first: int, last: int) -> None:
        """Take entries first..last out of an indexed run: what is left of it on either side stays, as runs."""
        db.execute("DELETE FROM runs WHERE ledger = ? AND first = ?", run[:2])
        if run[1] < first:
            db.execute(_INSERT_RUN, _part(run, run[1], first - 1))
        if run[2] > last:
            db.execute(_INSERT_RUN, _part(run, last + 1, run[2]))

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
