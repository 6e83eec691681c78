"""The index of entry runs (index.py) against a dict model of where each entry lives: flushes (an entry flushed again
wins over its older copy), compactions with flushes rewriting entries while they copy, ledger deletes; every single
read, range read and GC question answered as a row per entry would answer it, also after a reopen. And the entry
log's records packed in C are byte for byte those of entrylog.RECORD_HEADER, across rolls and packs; an index of an
older bookie (a row per entry) opens converted."""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import struct
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfleet.bookie import entrylog, gc, index
from bookfleet.bookie.entrylog import RECORD_HEADER, EntryLogger
from bookfleet.bookie.index import LedgerIndex
from bookfleet.bookie.memtable import Memtable
from tests.fixtures.storage import KEY, make_entry

LEDGERS = (1, 2, 3)
ENTRY_IDS = range(0, 40)
ROLL_BYTES = 1500
"""Entry logs this small roll every few dozen entries, so runs end at rolls and compaction has logs to pick."""

entry_sets = st.dictionaries(st.sampled_from(LEDGERS), st.sets(st.sampled_from(ENTRY_IDS), max_size=25), max_size=3)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("flush"), entry_sets),
        st.tuples(st.just("compact"), st.integers(0, 10), entry_sets),
        st.tuples(st.just("delete"), st.sets(st.sampled_from(LEDGERS), max_size=2)),
    ),
    max_size=12,
)

Location = tuple[int, int, int, bytes]
"""(log, offset, size, the entry's bytes)."""


class Model:
    """The index under test, its entry logs, and a dict of where each entry must be found."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.logger = EntryLogger(directory, ROLL_BYTES)
        self.index = LedgerIndex(directory)
        self.where: dict[tuple[int, int], Location] = {}
        self.copies = itertools.count()

    def flush(self, entry_ids: dict[int, set[int]]) -> None:
        """A flush in steps of 7 entries (so steps end inside a ledger), each entry a copy of its own."""
        memtable = Memtable()
        for ledger_id, ids in entry_ids.items():
            for entry_id in ids:
                memtable.put(ledger_id, entry_id, make_entry(ledger_id, entry_id, size=next(self.copies) % 50))
        written = [piece for step in memtable.steps(7) for piece in self.logger.append(step)]
        self.logger.sync()
        self.index.commit_flush(written, [])
        for ledger_id, ids, log_id, offsets, sizes, _ in written:
            self.learn(ledger_id, ids, log_id, offsets, sizes)

    def compact(self, pick: int, rewrites: dict[int, set[int]]) -> None:
        """gc.compact of one of the logs but the current one, with `rewrites` flushed as soon as it has listed the
        log's entries (a flush running alongside it)."""
        logs = [log_id for log_id in self.logger.log_ids() if log_id != self.logger.current_log]
        if not logs:
            return
        old_log = logs[pick % len(logs)]
        model = self

        class DuringCompaction:
            def entries_in_log(self, log_id: int) -> list[tuple[int, int, int, int]]:
                listed = model.index.entries_in_log(log_id)
                model.flush(rewrites)
                return listed

            def relocate(self, log_id: int, written: list) -> None:
                model.index.relocate(log_id, written)
                for ledger_id, ids, log, offsets, sizes, _ in written:
                    still_there = [e for e in ids if model.where[ledger_id, e][0] == old_log]
                    model.learn(ledger_id, ids, log, offsets, sizes, still_there)

        gc.compact(DuringCompaction(), self.logger, old_log)

    def delete(self, ledger_ids: set[int]) -> None:
        self.index.delete_ledgers(ledger_ids)
        self.where = {key: location for key, location in self.where.items() if key[0] not in ledger_ids}

    def learn(self, ledger_id, ids, log_id, offsets, sizes, only=None) -> None:
        for position, entry_id in enumerate(ids):
            if only is None or entry_id in only:
                offset = int.from_bytes(offsets[8 * position : 8 * position + 8], "little")
                size = int.from_bytes(sizes[4 * position : 4 * position + 4], "little")
                self.where[ledger_id, entry_id] = (log_id, offset, size, self.logger.read(log_id, offset, size))

    def reopen(self) -> None:
        self.index.close()
        self.index = LedgerIndex(self.directory)

    def check(self) -> None:
        for ledger_id, entry_id in itertools.product(LEDGERS, range(-1, ENTRY_IDS.stop + 1)):
            expected = self.where.get((ledger_id, entry_id))
            assert self.index.locate(ledger_id, entry_id) == (expected and expected[:3]), (ledger_id, entry_id)
            if expected is not None:
                assert self.logger.read(*expected[:3]) == expected[3]
        for ledger_id, (first, last) in itertools.product(LEDGERS, [(0, 39), (3, 17), (10, 10), (25, 60), (-5, 2)]):
            held = [e for e in range(first, last + 1) if (ledger_id, e) in self.where]
            expected = [(e, *self.where[ledger_id, e][:3]) for e in held]
            with contextlib.closing(self.index.locate_range(ledger_id, first, last)) as located:
                assert list(located) == expected, (ledger_id, first, last)
        live: dict[int, int] = {}
        for log_id, _, size, _ in self.where.values():
            live[log_id] = live.get(log_id, 0) + size
        assert self.index.live_bytes_by_log() == live
        for log_id in self.logger.log_ids():
            in_log = sorted((o, lid, e, s) for (lid, e), (log, o, s, _) in self.where.items() if log == log_id)
            assert self.index.entries_in_log(log_id) == [(lid, e, o, s) for o, lid, e, s in in_log]
        with contextlib.closing(sqlite3.connect(self.directory / index.FILE_NAME)) as db:
            runs = db.execute("SELECT ledger, first, last, length(offsets), length(sizes) FROM runs").fetchall()
        for _, first, last, offsets, sizes in runs:
            count = last - first + 1
            assert 1 <= count <= index.MAX_RUN_ENTRIES and (offsets, sizes) == (8 * count, 4 * count)
        assert len({(lid, e) for lid, first, last, *_ in runs for e in range(first, last + 1)}) == len(self.where)

    def close(self) -> None:
        self.index.close()
        self.logger.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_the_index_of_runs_answers_as_a_dict_of_entries_does(steps):
    with tempfile.TemporaryDirectory(prefix="index-runs-") as tmp, mock.patch.object(index, "MAX_RUN_ENTRIES", 5):
        model = Model(Path(tmp))
        try:
            for operation, *args in steps:
                getattr(model, operation)(*args)
                model.check()
            model.reopen()
            model.check()
        finally:
            model.close()


@given(
    st.lists(st.tuples(st.integers(0, 2**63 - 1), st.lists(st.binary(max_size=300), max_size=8)), max_size=6),
    st.integers(1, 1000),
)
def test_the_entry_logs_records_are_those_of_record_header_across_rolls_and_packs(pieces, pack_bytes):
    """Pieces cut into packs (entrylog.PACK_BYTES, here as small as the entries) and into logs where they roll: the
    records are in order, and each entry is where its written location says."""
    with tempfile.TemporaryDirectory(prefix="entrylog-records-") as tmp, mock.patch.object(
        entrylog, "PACK_BYTES", pack_bytes
    ):
        logger = EntryLogger(Path(tmp), 700)
        try:
            entry_ids = itertools.count(2**62)
            appended = [(ledger, [next(entry_ids) for _ in entries], entries) for ledger, entries in pieces]
            written = logger.append(appended)
            logger.sync()
            records = [
                RECORD_HEADER.pack(len(entry), ledger, entry_id) + entry
                for ledger, ids, entries in appended
                for entry_id, entry in zip(ids, entries, strict=True)
            ]
            on_disk = b"".join(logger.path(log_id).read_bytes() for log_id in logger.log_ids())
            assert on_disk == b"".join(records)
            assert [e for _, ids, *_ in written for e in ids] == [e for _, ids, _ in appended for e in ids]
            located = [
                logger.read(log_id, offset, size)
                for _, _, log_id, offsets, sizes, _ in written
                for (offset,), (size,) in zip(
                    struct.iter_unpack("<Q", offsets), struct.iter_unpack("<I", sizes), strict=True
                )
            ]
            assert located == [entry for _, _, entries in appended for entry in entries]
        finally:
            logger.close()


OLD_ENTRIES_TABLE = """CREATE TABLE entries (
    ledger INTEGER NOT NULL, entry INTEGER NOT NULL, log INTEGER NOT NULL, offset INTEGER NOT NULL,
    size INTEGER NOT NULL, PRIMARY KEY (ledger, entry)
) WITHOUT ROWID"""
"""The entries table as bookies wrote it before runs: a row per entry."""


async def test_an_index_of_a_row_per_entry_opens_converted_into_runs(open_storage, storage_dirs):
    _, ledger_dir = storage_dirs
    logger = EntryLogger(ledger_dir, 1 << 20)
    written = {ledger_id: {e: make_entry(ledger_id, e) for e in ids} for ledger_id, ids in
               {8: [*range(0, 2500), *range(2600, 2610)], 9: [0, 1, 2, 5]}.items()}
    rows = []
    for ledger_id, entries in written.items():
        for _, ids, log_id, offsets, _, _ in logger.append([(ledger_id, list(entries), list(entries.values()))]):
            for position, entry_id in enumerate(ids):
                offset = int.from_bytes(offsets[8 * position : 8 * position + 8], "little")
                rows.append((ledger_id, entry_id, log_id, offset, len(entries[entry_id])))
    logger.close()
    with contextlib.closing(sqlite3.connect(ledger_dir / index.FILE_NAME)) as old, old:
        old.execute(OLD_ENTRIES_TABLE)
        old.execute(
            "CREATE TABLE ledgers (ledger INTEGER PRIMARY KEY, master_key BLOB NOT NULL, fenced INTEGER NOT NULL, "
            "explicit_lac INTEGER NOT NULL, entry_lac INTEGER NOT NULL, last_entry INTEGER NOT NULL, "
            "writer_epoch INTEGER NOT NULL DEFAULT 0)"
        )
        old.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, ?)", rows)
        old.executemany("INSERT INTO ledgers VALUES (?, ?, 0, -1, ?, ?, 0)", [(8, KEY, 2608, 2609), (9, KEY, 4, 5)])

    for _ in range(2):  # converted at the first open, then opened as it is
        storage = await open_storage()
        for ledger_id, entries in written.items():
            assert [await storage.read_entry(ledger_id, e) for e in entries] == list(entries.values())
            assert await storage.read_range(ledger_id, 0, 10**6, 10**9) == list(entries.values())
        await storage.close()
    with contextlib.closing(sqlite3.connect(ledger_dir / index.FILE_NAME)) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        runs = db.execute("SELECT ledger, first, last FROM runs ORDER BY ledger, first").fetchall()
    assert tables == {"runs", "ledgers"}
    assert runs == [(8, 0, 1023), (8, 1024, 2047), (8, 2048, 2499), (8, 2600, 2609), (9, 0, 2), (9, 5, 5)]


async def test_an_older_bookie_refuses_an_index_of_runs_instead_of_reading_it_as_empty(open_storage, storage_dirs):
    """An older bookie opens its index with `CREATE TABLE IF NOT EXISTS entries`: on an index of runs that must fail
    (the bookie does not start), not make an empty table whose "no such entry" answers recovery takes for absence."""
    _, ledger_dir = storage_dirs
    storage = await open_storage()
    await storage.close()
    with (
        contextlib.closing(sqlite3.connect(ledger_dir / index.FILE_NAME)) as db,
        pytest.raises(sqlite3.OperationalError, match="already an index named entries"),
    ):
        db.executescript(OLD_ENTRIES_TABLE.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))


def test_deleting_ledgers_gives_the_write_ahead_log_s_space_back(tmp_path):
    """GC's deletes must shrink the index's files: a bookie read-only on a nearly full disk becomes writable again
    only once its usage falls under the low-water mark, and SQLite alone keeps its WAL file at its largest."""
    db = LedgerIndex(tmp_path)
    for entry_id in range(200):  # a flush of one entry each, as a lightly loaded bookie's timed flushes are
        db.commit_flush([(7, [entry_id], 1, (64 * entry_id).to_bytes(8, "little"), (64).to_bytes(4, "little"), 64)], [])
    wal = tmp_path / f"{index.FILE_NAME}-wal"
    assert wal.stat().st_size > 100_000
    db.delete_ledgers([7])
    assert wal.stat().st_size == 0
    assert db.live_bytes_by_log() == {}
    db.close()
