"""Bookie storage under faults: ids no index can hold, a ledger the index refuses, a journal that fails, a journal
damaged after it was synced, a fenced ledger's LAC. Each test injects its fault into a real LedgerStorage on real
files."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
from collections.abc import AsyncIterator

import pytest

from bookfleet import wire
from bookfleet.bookie import journal
from bookfleet.bookie.checkpoint import LastLogMark
from bookfleet.bookie.entrylog import EntryLogger
from bookfleet.bookie.errors import CannotVouch, LedgerFenced, NoSuchEntry, StorageFailure
from bookfleet.bookie.index import LedgerIndex
from bookfleet.bookie.storage import LedgerStorage, StorageSettings
from tests.fixtures.storage import (
    INDEX_DAMAGE,
    KEY,
    TEST_SETTINGS,
    corrupt_index,
    damage_journal_record,
    journal_records,
    make_entry,
    tear_last_journal_record,
)

POISON = 2**63
"""A ledger id a u64 field can carry and no SQLite integer can hold."""


@contextlib.asynccontextmanager
async def watched_storage(storage_dirs, **settings) -> AsyncIterator[tuple[LedgerStorage, list[str]]]:
    """A started LedgerStorage and the list its failure reports land in."""
    failures: list[str] = []
    storage = LedgerStorage(*storage_dirs, StorageSettings(**{**TEST_SETTINGS, **settings}), on_failure=failures.append)
    await storage.start()
    try:
        yield storage, failures
    finally:
        await storage.close()


async def add_all(storage, ledger_id, entry_ids):
    entries = {e: make_entry(ledger_id, e) for e in entry_ids}
    await asyncio.gather(*(storage.add_entry(ledger_id, e, data, KEY) for e, data in entries.items()))
    return entries


async def test_ids_outside_the_signed_64_bit_range_never_reach_the_index(open_storage, storage_dirs):
    storage = await open_storage()
    poison_entry = wire.encode_entry(wire.Digester("crc32c"), POISON, 0, -1, 1, b"x")
    with pytest.raises(wire.InvalidField, match=f"entry header's ledger id {POISON} is outside"):
        await storage.add_entry(POISON, 0, poison_entry, KEY)
    with pytest.raises(wire.InvalidField, match=f"ledger id {POISON} is outside"):
        await storage.fence(POISON, KEY)
    with pytest.raises(wire.InvalidField, match=f"ledger id {POISON} is outside"):
        await storage.set_explicit_lac(POISON, 3, KEY)
    with pytest.raises(wire.InvalidField, match="lac -2 is outside"):
        await storage.set_explicit_lac(1, -2, KEY)
    assert storage.ledger_ids() == set()

    entries = await add_all(storage, 1, range(5))
    await storage.flush()  # healthy: the index takes everything, the mark moves past the adds
    assert LastLogMark(storage_dirs[1]).read() > journal.JournalPosition(0, 0)
    storage = await open_storage()
    assert [await storage.read_entry(1, e) for e in range(5)] == list(entries.values())


class RefusingIndex:
    """Makes the index refuse every flush that carries one of `ledger_ids` (a fault no validation can foresee)."""

    def __init__(self, monkeypatch, *ledger_ids: int):
        real = LedgerIndex.commit_flush
        self.refusals = 0

        def commit_flush(index, locations, ledgers):
            locations, ledgers = list(locations), list(ledgers)
            if refused := sorted({row[0] for row in locations + ledgers} & set(ledger_ids)):
                self.refusals += 1
                raise sqlite3.IntegrityError(f"injected refusal of ledger {refused[0]}")
            real(index, locations, ledgers)

        monkeypatch.setattr(LedgerIndex, "commit_flush", commit_flush)


async def test_a_ledger_the_index_refuses_neither_blocks_the_others_nor_is_lost(
    open_storage, storage_dirs, monkeypatch
):
    settings = {"journal_roll_bytes": 4096}
    refusing = RefusingIndex(monkeypatch, 13)
    storage = await open_storage(**settings)
    stuck = await add_all(storage, 13, range(10))
    others = {ledger: await add_all(storage, ledger, range(10)) for ledger in (12, 14)}
    await storage.flush()  # no error: ledgers 12 and 14 are indexed, 13 is quarantined
    assert refusing.refusals == 2  # the whole batch, then ledger 13 on its own
    refused = r"ledger 13 cannot be indexed on this bookie \(IntegrityError: injected refusal"
    with pytest.raises(StorageFailure, match=refused):
        await storage.add_entry(13, 10, make_entry(13, 10), KEY)
    assert [await storage.read_entry(13, e) for e in range(10)] == list(stuck.values())
    assert await storage.read_range(13, 0, 9, 1 << 20) == list(stuck.values())

    # Later flushes do not retry ledger 13 and do not hold the journal back: it is copied once per journal file.
    first_seq = journal.journal_seqs(storage_dirs[0])[0]
    for round_ in range(3):
        others[12].update(await add_all(storage, 12, range(10 + 40 * round_, 50 + 40 * round_)))
        await storage.flush()
    assert refusing.refusals == 2
    assert journal.journal_seqs(storage_dirs[0])[0] > first_seq  # old journal files were trimmed
    assert LastLogMark(storage_dirs[1]).read().seq > first_seq

    storage = await open_storage(**settings)  # a crash: the first storage is dropped, never closed
    assert [await storage.read_entry(13, e) for e in range(10)] == list(stuck.values())
    for ledger, entries in others.items():
        assert [await storage.read_entry(ledger, e) for e in sorted(entries)] == [entries[e] for e in sorted(entries)]
    await storage.flush()
    assert refusing.refusals == 4  # quarantined again after the restart, once
    monkeypatch.undo()  # the fault is repaired: the next restart indexes ledger 13 for good
    storage = await open_storage(**settings)
    await storage.flush()
    await storage.add_entry(13, 10, make_entry(13, 10), KEY)
    assert [await storage.read_entry(13, e) for e in range(11)] == [*stuck.values(), make_entry(13, 10)]


async def test_an_index_refusing_ever_more_ledgers_fails_the_storage_once_the_quarantine_is_full(
    storage_dirs, monkeypatch
):
    RefusingIndex(monkeypatch, 10, 11)
    async with watched_storage(storage_dirs, quarantine_bytes=20 * len(make_entry(10, 0))) as (storage, failures):
        first = await add_all(storage, 10, range(15))
        await storage.flush()  # quarantined, within the bound: the bookie goes on
        assert failures == [] and storage.failure is None
        second = await add_all(storage, 11, range(15))
        await storage.flush()

        assert failures == [storage.failure]
        assert "the index refused 2 ledger(s)" in failures[0] and "over quarantine_bytes" in failures[0]
        with pytest.raises(StorageFailure, match="over quarantine_bytes"):
            await storage.add_entry(12, 0, make_entry(12, 0), KEY)  # no further ledger can join the quarantine
        assert [await storage.read_entry(10, e) for e in range(15)] == list(first.values())
        assert await storage.read_range(11, 0, 14, 1 << 20) == list(second.values())


async def test_a_journal_write_error_fails_the_storage_at_once_and_says_why(storage_dirs, monkeypatch):
    async with watched_storage(storage_dirs) as (storage, failures):
        await add_all(storage, 1, range(3))

        def broken_disk(fd: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "fdatasync", broken_disk)
        with pytest.raises(StorageFailure, match="journal write failed"):
            await storage.add_entry(1, 3, make_entry(1, 3), KEY)
        assert len(failures) == 1 and "journal write or sync failed" in failures[0]
        assert "Input/output error" in failures[0]
        assert storage.failure == failures[0]
        with pytest.raises(StorageFailure):
            await storage.add_entry(2, 0, make_entry(2, 0), KEY)
        assert await storage.read_entry(1, 2) == make_entry(1, 2)  # reads go on
        monkeypatch.undo()  # the close's own syncs


async def test_write_lac_is_refused_on_a_fenced_ledger(open_storage):
    storage = await open_storage()
    await add_all(storage, 1, range(3))
    await storage.set_explicit_lac(1, 2, KEY)
    await storage.fence(1, KEY)
    with pytest.raises(LedgerFenced):
        await storage.set_explicit_lac(1, 5, KEY)
    assert storage.lac(1) == 2


async def test_a_flush_failing_on_the_disk_stops_adds_backs_off_and_recovers(storage_dirs, monkeypatch, caplog):
    attempts = []
    real_sync = EntryLogger.sync

    def failing_sync(logger: EntryLogger) -> None:
        attempts.append(1)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(EntryLogger, "sync", failing_sync)
    async with watched_storage(storage_dirs, flush_interval=0.05) as (storage, failures):
        entries = await add_all(storage, 1, range(5))
        async with asyncio.timeout(60):
            while len(attempts) < 3:  # timed flushes go on retrying, further and further apart
                await asyncio.sleep(0.05)
        assert failures == [f"memtable flush failed: [Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"]
        with pytest.raises(StorageFailure, match="bookie storage failed: memtable flush failed"):
            await storage.add_entry(1, 5, make_entry(1, 5), KEY)
        failed_logs = [r for r in caplog.records if "memtable flush failed" in r.getMessage()]
        assert len([r for r in failed_logs if r.exc_info]) == 1  # one traceback, not one per retry

        monkeypatch.setattr(EntryLogger, "sync", real_sync)  # the disk has room again
        async with asyncio.timeout(60):
            while LastLogMark(storage_dirs[1]).read() == journal.JournalPosition(0, 0):
                await asyncio.sleep(0.05)
        assert [await storage.read_entry(1, e) for e in range(5)] == list(entries.values())


@pytest.mark.parametrize("damage", sorted(INDEX_DAMAGE))
async def test_a_corrupt_index_fails_the_storage_instead_of_quarantining_every_ledger(storage_dirs, damage):
    async with watched_storage(storage_dirs) as (storage, failures):
        await add_all(storage, 1, range(5))
        await storage.flush()
        corrupt_index(storage_dirs[1], damage)
        held = await add_all(storage, 2, range(5))  # acknowledged: durable in the journal, held in memory

        with pytest.raises(sqlite3.DatabaseError):
            await storage.flush()
        assert len(failures) == 1 and "memtable flush failed: the ledger index is corrupt" in failures[0]
        assert storage.failure == failures[0]
        with pytest.raises(StorageFailure, match="bookie storage failed: memtable flush failed: the ledger index"):
            await storage.add_entry(3, 0, make_entry(3, 0), KEY)  # no new ledger is taken, none quarantined
        assert [await storage.read_entry(2, e) for e in range(5)] == list(held.values())  # reads go on
        with pytest.raises(StorageFailure, match="the ledger index is corrupt"):
            await storage.read_entry(1, 0)  # flushed, behind the broken index: the client asks another replica
        assert failures == [storage.failure]


async def test_a_read_that_meets_a_corrupt_index_fails_the_storage(storage_dirs):
    """An idle bookie flushes nothing: its readers find the damage, and the bookie stops taking adds."""
    async with watched_storage(storage_dirs) as (storage, failures):
        await add_all(storage, 1, range(5))
        await storage.flush()
        corrupt_index(storage_dirs[1], "corrupt_pages")

        with pytest.raises(StorageFailure, match="index read failed: the ledger index is corrupt"):
            await storage.read_range(1, 0, 4, 1 << 20)
        assert failures == [storage.failure] and "index read failed" in failures[0]
        with pytest.raises(StorageFailure, match="bookie storage failed: index read failed"):
            await storage.add_entry(2, 0, make_entry(2, 0), KEY)


async def cannot_vouch(read) -> str:
    """Await a read that must be refused as "cannot vouch" (never "no such ledger or entry"); returns why."""
    with pytest.raises(CannotVouch) as refused:
        await read
    assert refused.value.status == wire.Status.UNKNOWN_LEDGER_STATE
    return str(refused.value)


async def test_a_damaged_record_amid_synced_ones_never_passes_for_a_missing_entry(open_storage, storage_dirs, caplog):
    """A flipped byte in the middle of a synced journal file, before any checkpoint: the records after it are still
    replayed, and what the bookie lacks is "cannot vouch" for good, after the checkpoint that trims the file too."""
    storage = await open_storage()
    entries = await add_all(storage, 1, range(10))
    damaged = damage_journal_record(storage_dirs[0], 1, 4)

    with caplog.at_level(logging.ERROR, logger="bookfleet.bookie"):
        storage = await open_storage()  # the first one is dropped, as a killed process's would be
    assert "cannot vouch for ledger 1 entry 4" in await cannot_vouch(storage.read_entry(1, 4))
    kept = [*range(4), *range(5, 10)]
    assert [await storage.read_entry(1, e) for e in kept] == [entries[e] for e in kept]
    assert "checksum mismatch at offset" in storage.journal_damage and str(damaged) in storage.journal_damage
    assert "journal lost synced records" in caplog.text and "cannot vouch for any entry it lacks" in caplog.text
    assert "cannot vouch for ledger 1 entry 10" in await cannot_vouch(storage.read_entry(1, 10))
    assert "cannot vouch for ledger 2:" in await cannot_vouch(storage.read_entry(2, 0))  # its records may be lost too
    assert "cannot vouch for ledger 1 entry 4" in await cannot_vouch(storage.read_range(1, 0, 9, 1 << 20))
    assert "cannot vouch for ledger 1 entry 10" in await cannot_vouch(storage.read_range(1, 5, 12, 1 << 20))
    assert await storage.read_range(1, 5, 9, 1 << 20) == [entries[e] for e in range(5, 10)]
    assert await storage.read_range(1, 0, 9, 1 << 20, max_entries=3) == [entries[e] for e in range(3)]
    assert "ledger 1" in await cannot_vouch(storage.raise_writer_epoch(1, 1, KEY))  # its answer is a view of the end

    await storage.flush()  # the checkpoint moves past the damaged file, which goes
    assert not damaged.exists()
    storage = await open_storage()
    assert str(damaged) in storage.journal_damage
    assert "cannot vouch for ledger 1 entry 4" in await cannot_vouch(storage.read_entry(1, 4))


async def test_a_bad_record_at_the_end_of_an_older_journal_file_is_damage_not_a_torn_tail(open_storage, storage_dirs):
    """A rolled file was synced whole: a bad record at its end is lost data, whatever follows it."""
    storage = await open_storage(journal_roll_bytes=4096)
    for entry_id in range(80):  # one by one: a file rolls between group commits
        await storage.add_entry(1, entry_id, make_entry(1, entry_id), KEY)
    older = journal.journal_path(storage_dirs[0], journal.journal_seqs(storage_dirs[0])[0])
    tear_last_journal_record(older, 1)  # the record before its END

    storage = await open_storage(journal_roll_bytes=4096)
    assert "cannot vouch for ledger 1 entry" in await cannot_vouch(storage.read_range(1, 0, 79, 1 << 22))
    assert str(older) in storage.journal_damage


async def test_a_torn_tail_is_sealed_quietly_and_stays_a_torn_tail(open_storage, storage_dirs, caplog):
    """The newest file's last record, cut short by a crash, was never acknowledged: dropped with a warning, and the
    file sealed there (an END record), so the crash after the next start does not find it in a file that is no longer
    the newest."""
    storage = await open_storage()
    entries = await add_all(storage, 1, range(10))
    torn = journal.journal_path(storage_dirs[0], journal.journal_seqs(storage_dirs[0])[-1])
    torn_at, _ = tear_last_journal_record(torn, 10)  # entry 9's record loses its end

    with caplog.at_level(logging.WARNING, logger="bookfleet.bookie"):
        storage = await open_storage()
    assert "(a torn tail" in caplog.text and "synced records lost" not in caplog.text
    assert storage.journal_damage is None
    assert journal_records(torn)[-1][:2] == (torn_at, journal.RecordType.END)  # sealed where it tore
    with pytest.raises(NoSuchEntry):
        await storage.read_entry(1, 9)
    storage = await open_storage()  # crashed again: the torn file is now an older one
    assert storage.journal_damage is None
    assert [await storage.read_entry(1, e) for e in range(9)] == [entries[e] for e in range(9)]
    with pytest.raises(NoSuchEntry):
        await storage.read_entry(1, 9)
