"""The bookie storage engine on real files: adds, reads, fencing, LAC, and restarts with and without a clean close."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time

import crc32c
import pytest

from bookfleet.bookie import index, journal
from bookfleet.bookie.checkpoint import LastLogMark
from bookfleet.bookie.entrylog import log_ids
from bookfleet.bookie.errors import (
    BadRequest,
    LedgerFenced,
    NoSuchEntry,
    NoSuchLedger,
    StaleWriterEpoch,
    Unauthorized,
)
from bookfleet.bookie.storage import LedgerStorage, StorageSettings
from bookfleet.wire import InvalidField, Status, encode_entry, master_key
from tests.fixtures.storage import (
    DIGESTER,
    KEY,
    TEST_SETTINGS,
    journal_records,
    make_entry,
    tear_last_journal_record,
)

OTHER_KEY = master_key(b"another password")


async def add_all(storage, ledger_id, entry_ids, size=100):
    entries = {e: make_entry(ledger_id, e, size=size) for e in entry_ids}
    await asyncio.gather(*(storage.add_entry(ledger_id, e, data, KEY) for e, data in entries.items()))
    return entries


async def test_round_trip_from_memtable_then_entry_log_then_after_clean_restart(open_storage, storage_dirs):
    storage = await open_storage()
    entries = await add_all(storage, 7, range(50))
    assert [await storage.read_entry(7, e) for e in range(50)] == list(entries.values())
    assert storage.last_entry_id(7) == 49 and storage.lac(7) == 48

    await storage.flush()
    _, ledger_dir = storage_dirs
    assert sum((ledger_dir / f"entrylog-{i}.log").stat().st_size for i in log_ids(ledger_dir)) > 50 * 100
    assert [await storage.read_entry(7, e) for e in range(50)] == list(entries.values())

    await storage.close()
    storage = await open_storage()
    # A clean close checkpointed everything: no journal record is left to replay, so these come from the entry log.
    assert list(journal.Replay(storage.journal_dir, LastLogMark(ledger_dir).read())) == []
    assert [await storage.read_entry(7, e) for e in range(50)] == list(entries.values())
    assert storage.ledger_ids() == {7} and storage.lac(7) == 48 and storage.last_entry_id(7) == 49


async def test_memtable_flushes_by_size_without_losing_entries(open_storage):
    storage = await open_storage(memtable_bytes=8 * 1024)
    entries = await add_all(storage, 1, range(300), size=1000)
    await storage.flush()
    assert [await storage.read_entry(1, e) for e in range(300)] == list(entries.values())


async def test_read_range_merges_memtable_and_entry_log_and_respects_max_bytes(open_storage):
    storage = await open_storage()
    flushed = await add_all(storage, 3, range(0, 20, 2))
    await storage.flush()
    in_memory = await add_all(storage, 3, range(1, 20, 2))
    everything = {**flushed, **in_memory}

    assert await storage.read_range(3, 0, 19, 1 << 20) == [everything[e] for e in range(20)]
    assert await storage.read_range(3, 5, 9, 1 << 20) == [everything[e] for e in range(5, 10)]
    size = len(everything[0])
    assert await storage.read_range(3, 4, 19, 3 * size) == [everything[e] for e in range(4, 7)]
    assert await storage.read_range(3, 4, 19, 1) == [everything[4]]  # at least one entry
    assert await storage.read_range(3, 25, 30, 1 << 20) == []


async def test_missing_ledger_and_entry_and_bad_input_are_named(open_storage):
    storage = await open_storage()
    with pytest.raises(NoSuchLedger, match="ledger 9 "):
        await storage.read_entry(9, 0)
    with pytest.raises(NoSuchLedger):
        storage.lac(9)
    await add_all(storage, 9, [0])
    with pytest.raises(NoSuchEntry, match="ledger 9 has no entry 1"):
        await storage.read_entry(9, 1)
    with pytest.raises(BadRequest, match="entry header names ledger 9 entry 0, the request ledger 9 entry 5"):
        await storage.add_entry(9, 5, make_entry(9, 0), KEY)
    with pytest.raises(BadRequest, match="shorter than"):
        await storage.add_entry(9, 5, b"short", KEY)
    with pytest.raises(BadRequest, match="master key of 3 bytes"):
        await storage.add_entry(10, 0, make_entry(10, 0), b"key")


async def test_fencing_and_master_key_survive_restarts(open_storage):
    storage = await open_storage()
    await add_all(storage, 1, range(3))
    with pytest.raises(Unauthorized):
        await storage.add_entry(1, 3, make_entry(1, 3), OTHER_KEY)
    with pytest.raises(Unauthorized):
        await storage.fence(1, OTHER_KEY)

    await storage.fence(1, KEY)
    with pytest.raises(LedgerFenced):
        await storage.add_entry(1, 3, make_entry(1, 3), KEY)
    await storage.add_entry(1, 3, make_entry(1, 3), KEY, recovery=True)
    assert await storage.read_entry(1, 3) == make_entry(1, 3)

    # A ledger never seen here is recorded as fenced, so a stale writer cannot start it afterwards.
    await storage.fence(2, KEY)
    with pytest.raises(LedgerFenced):
        await storage.add_entry(2, 0, make_entry(2, 0), KEY)
    with pytest.raises(NoSuchEntry):
        await storage.read_entry(2, 0)

    storage = await open_storage()  # the first is dropped without close: the journal alone carries the state
    with pytest.raises(LedgerFenced):
        await storage.add_entry(1, 4, make_entry(1, 4), KEY)
    with pytest.raises(Unauthorized):
        await storage.add_entry(1, 4, make_entry(1, 4), OTHER_KEY, recovery=True)
    assert storage.last_entry_id(1) == 3 and storage.ledger_ids() == {1, 2}

    await storage.close()
    storage = await open_storage()  # now from the index
    with pytest.raises(LedgerFenced):
        await storage.add_entry(2, 0, make_entry(2, 0), KEY)


async def test_a_recovery_add_of_an_older_epoch_never_replaces_a_newer_writers_copy(open_storage):
    """A recovery add or repair copy of an older writer epoch may fill in a missing entry or repeat a held one; it
    must not overwrite what a newer writer stored under the same id, in the memtable or in the entry log."""
    storage = await open_storage()
    await add_all(storage, 1, range(2))
    newer = encode_entry(DIGESTER, 1, 2, 1, 0, b"the newer writer's acknowledged entry 2")
    await storage.add_entry(1, 2, newer, KEY, writer_epoch=3)
    older = encode_entry(DIGESTER, 1, 2, 1, 0, b"an older writer's unacknowledged entry 2")
    for where in ("the memtable", "the entry log"):
        with pytest.raises(StaleWriterEpoch, match="writer epoch 2 is older than 3"):
            await storage.add_entry(1, 2, older, KEY, recovery=True, writer_epoch=2)
        assert await storage.read_entry(1, 2) == newer, where
        await storage.add_entry(1, 2, newer, KEY, recovery=True, writer_epoch=2)  # the same copy again: accepted
        await storage.flush()
    await storage.add_entry(1, 3, make_entry(1, 3), KEY, recovery=True, writer_epoch=2)  # a missing one: filled in
    await storage.add_entry(1, 2, older, KEY, recovery=True, writer_epoch=3)  # the ledger's own epoch may replace
    assert await storage.read_entry(1, 2) == older


async def test_writer_epoch_refuses_older_writers_and_survives_restarts(open_storage):
    storage = await open_storage()
    await add_all(storage, 1, range(3))  # the creating writer's epoch 0
    await storage.raise_writer_epoch(1, 2, KEY)  # a reopening writer's fence
    for stale in (0, 1):
        with pytest.raises(StaleWriterEpoch, match=f"writer epoch {stale} is older than 2") as refused:
            await storage.add_entry(1, 3, make_entry(1, 3), KEY, writer_epoch=stale)
    assert refused.value.status == Status.FENCED
    await storage.add_entry(1, 3, make_entry(1, 3), KEY, writer_epoch=2)
    await storage.add_entry(1, 4, make_entry(1, 4), KEY, writer_epoch=3)  # a newer writer's add raises it too
    with pytest.raises(StaleWriterEpoch, match="writer epoch 2 is older than 3"):
        await storage.add_entry(1, 5, make_entry(1, 5), KEY, writer_epoch=2)
    await storage.add_entry(1, 5, make_entry(1, 5), KEY, recovery=True)  # recovery and repair are not refused
    await storage.raise_writer_epoch(1, 3, KEY)  # the same epoch again: a retried raise
    with pytest.raises(StaleWriterEpoch):
        await storage.raise_writer_epoch(1, 2, KEY)  # a later writer won
    with pytest.raises(Unauthorized):
        await storage.raise_writer_epoch(1, 9, OTHER_KEY)
    with pytest.raises(InvalidField, match="writer epoch -1 is outside"):
        await storage.raise_writer_epoch(1, -1, KEY)
    with pytest.raises(InvalidField, match=f"writer epoch {2**63} is outside"):
        await storage.add_entry(1, 6, make_entry(1, 6), KEY, writer_epoch=2**63)
    await storage.raise_writer_epoch(2, 4, KEY)  # a ledger never seen here: the stale writer cannot start it
    with pytest.raises(StaleWriterEpoch):
        await storage.add_entry(2, 0, make_entry(2, 0), KEY, writer_epoch=3)

    for restart in ("the journal", "the index"):
        if restart == "the index":
            await storage.close()
        storage = await open_storage()  # first dropped without close: the journal alone carries the epochs
        with pytest.raises(StaleWriterEpoch, match="writer epoch 2 is older than 3"):
            await storage.add_entry(1, 6, make_entry(1, 6), KEY, writer_epoch=2)
        with pytest.raises(StaleWriterEpoch, match="writer epoch 3 is older than 4"):
            await storage.add_entry(2, 0, make_entry(2, 0), KEY, writer_epoch=3)
    await storage.add_entry(2, 0, make_entry(2, 0), KEY, writer_epoch=4)

    await storage.fence(1, KEY)  # recovery's fence stays the stronger one
    with pytest.raises(LedgerFenced):
        await storage.raise_writer_epoch(1, 5, KEY)
    with pytest.raises(LedgerFenced):
        await storage.add_entry(1, 6, make_entry(1, 6), KEY, writer_epoch=5)


OLD_LEDGERS_TABLE = """CREATE TABLE ledgers (
    ledger INTEGER PRIMARY KEY, master_key BLOB NOT NULL, fenced INTEGER NOT NULL,
    explicit_lac INTEGER NOT NULL, entry_lac INTEGER NOT NULL, last_entry INTEGER NOT NULL
)"""
"""The ledgers table as bookies wrote it before writer epochs."""


async def test_an_index_from_before_writer_epochs_opens_with_epoch_0(open_storage, storage_dirs):
    _, ledger_dir = storage_dirs
    ledger_dir.mkdir(parents=True)
    with sqlite3.connect(ledger_dir / index.FILE_NAME) as old:
        old.execute(OLD_LEDGERS_TABLE)
        old.execute("INSERT INTO ledgers VALUES (?, ?, ?, ?, ?, ?)", (8, KEY, 0, 4, 3, 5))
    storage = await open_storage()
    assert storage.lac(8) == 4 and storage.last_entry_id(8) == 5
    await storage.add_entry(8, 6, make_entry(8, 6), KEY)  # its writer's epoch 0 goes on
    await storage.raise_writer_epoch(8, 1, KEY)
    await storage.close()
    storage = await open_storage()
    with pytest.raises(StaleWriterEpoch):
        await storage.add_entry(8, 7, make_entry(8, 7), KEY)
    assert await storage.read_entry(8, 6) == make_entry(8, 6)


async def test_explicit_lac_and_long_poll(open_storage):
    storage = await open_storage()
    await add_all(storage, 4, range(3))
    assert storage.lac(4) == 1
    assert await storage.wait_for_lac(4, 0, timeout=5) == 1  # already past: answers at once
    assert await storage.wait_for_lac(4, 1, timeout=0.05) == 1  # times out with the current LAC

    waiting = asyncio.ensure_future(storage.wait_for_lac(4, 1, timeout=10))
    await asyncio.sleep(0)
    await storage.add_entry(4, 3, make_entry(4, 3), KEY)
    assert await asyncio.wait_for(waiting, 5) == 2

    waiting = asyncio.ensure_future(storage.wait_for_lac(4, 2, timeout=10))
    await asyncio.sleep(0)
    await storage.set_explicit_lac(4, 3, KEY)
    assert await asyncio.wait_for(waiting, 5) == 3
    await storage.set_explicit_lac(4, 1, KEY)  # never goes backwards
    assert storage.lac(4) == 3
    with pytest.raises(Unauthorized):
        await storage.set_explicit_lac(4, 9, OTHER_KEY)

    waiting = asyncio.ensure_future(storage.wait_for_lac(5, -1, timeout=10))  # a ledger that comes later
    await asyncio.sleep(0)
    await add_all(storage, 5, [0, 1])
    assert await asyncio.wait_for(waiting, 5) == 0

    storage = await open_storage()  # replayed from the journal
    assert storage.lac(4) == 3


async def test_unclean_stop_replays_the_journal_from_the_last_log_mark(open_storage):
    storage = await open_storage(journal_roll_bytes=4096)
    flushed = await add_all(storage, 1, range(40))
    await storage.flush()
    unflushed = await add_all(storage, 1, range(40, 80))
    other = await add_all(storage, 2, range(10))
    await storage.force(1)

    storage = await open_storage(journal_roll_bytes=4096)  # the first one is dropped, never closed
    everything = {**flushed, **unflushed}
    assert [await storage.read_entry(1, e) for e in range(80)] == list(everything.values())
    assert [await storage.read_entry(2, e) for e in range(10)] == list(other.values())
    assert storage.last_entry_id(1) == 79 and storage.lac(2) == 8


async def test_a_cancelled_add_does_not_fail_the_others_in_its_batch(open_storage):
    storage = await open_storage(journal_max_wait=0.05)
    adds = [asyncio.ensure_future(storage.add_entry(1, e, make_entry(1, e), KEY)) for e in range(3)]
    await asyncio.sleep(0)  # all three are appended and wait for the same group commit
    adds[1].cancel()
    await asyncio.gather(adds[0], adds[2])
    assert adds[1].cancelled()
    await storage.force(1)
    # Like a lost acknowledgement: the cancelled add was journaled anyway and is stored.
    assert [await storage.read_entry(1, e) for e in range(3)] == [make_entry(1, e) for e in range(3)]


def last_journal(storage_dirs):
    journal_dir, _ = storage_dirs
    return journal.journal_path(journal_dir, journal.journal_seqs(journal_dir)[-1])


async def test_torn_journal_tail_keeps_everything_before_it(open_storage, storage_dirs, caplog):
    storage = await open_storage()
    entries = await add_all(storage, 1, range(10))
    path = last_journal(storage_dirs)
    torn_at, _ = tear_last_journal_record(path, 10)  # the last record, entry 9, loses its end

    with caplog.at_level(logging.WARNING, logger="bookfleet.bookie.journal"):
        storage = await open_storage()
    assert f"journal {path}: checksum mismatch at offset {torn_at}; dropped what follows it (a torn tail" in caplog.text
    assert [await storage.read_entry(1, e) for e in range(9)] == [entries[e] for e in range(9)]
    with pytest.raises(NoSuchEntry):
        await storage.read_entry(1, 9)
    # The bookie goes on: new adds land in a new journal file and survive the next restart.
    await storage.add_entry(1, 9, entries[9], KEY)
    storage = await open_storage()
    assert await storage.read_entry(1, 9) == entries[9]


async def test_settings_reject_nonsense():
    with pytest.raises(ValueError, match="memtable_bytes must be positive"):
        StorageSettings(memtable_bytes=0)
    with pytest.raises(ValueError, match="compaction_live_ratio"):
        StorageSettings(compaction_live_ratio=2)


async def test_a_flush_of_many_entries_is_indexed_in_several_runs_and_the_newest_copy_wins(open_storage):
    """More entries than one run holds (index.MAX_RUN_ENTRIES), with a partial last run; an entry flushed twice is
    found at its second copy, also after a restart."""
    storage = await open_storage()
    count = 2 * index.MAX_RUN_ENTRIES + 7
    first = await add_all(storage, 3, range(count), size=40)
    await storage.flush()
    again = {e: make_entry(3, e, size=60) for e in (0, index.MAX_RUN_ENTRIES, count - 1)}
    await asyncio.gather(*(storage.add_entry(3, e, data, KEY, recovery=True) for e, data in again.items()))
    await storage.flush()
    expected = {**first, **again}
    assert [await storage.read_entry(3, e) for e in range(count)] == [expected[e] for e in range(count)]
    await storage.close()
    storage = await open_storage()
    assert await storage.read_range(3, 0, count - 1, 10**9) == [expected[e] for e in range(count)]


async def test_journals_fed_the_same_records_roll_at_different_points_within_the_roll_size(tmp_path):
    """Every bookie of an ensemble journals the same bytes: with one fixed roll size they all rolled (and stalled
    their syncs) in the same instant. Each file now rolls at its own point in the upper half of the roll size."""
    roll, record = 64 * 1024, b"r" * 1000
    sizes = []
    for name in ("a", "b"):
        log = journal.Journal(tmp_path / name, max_wait=0, flush_bytes=1 << 20, roll_bytes=roll)
        await log.start()
        for _ in range(400):
            await log.append(journal.RecordType.ADD, record)  # one record per group commit: exact roll offsets
        await log.close()
        files = [journal.journal_path(tmp_path / name, seq) for seq in journal.journal_seqs(tmp_path / name)]
        sizes.append([journal_records(path)[-1][0] for path in files[:-1]])  # where END is; the last still fills
    step = journal.SALTED_RECORD_HEADER.size + len(record)
    for rolled in sizes:
        assert len(rolled) >= 5 and all(roll // 2 <= size < roll + step for size in rolled), rolled
    assert sizes[0] != sizes[1]


async def test_the_journal_commits_while_the_event_loop_is_busy_and_resolves_the_batch_on_its_next_turn(tmp_path):
    """The writer thread writes and fdatasyncs a record without waiting for the event loop (which, on a busy bookie,
    is reading the next requests); only resolving the batch needs a turn of it."""
    log = journal.Journal(tmp_path, max_wait=0, flush_bytes=1 << 20, roll_bytes=1 << 30)
    await log.start()
    record = b"r" * 1000
    synced = [0]
    real_sync = log._write_and_sync

    def counted_sync(pieces: list[bytes]) -> float:
        seconds = real_sync(pieces)
        synced[0] += sum(map(len, pieces))
        return seconds

    log._write_and_sync = counted_sync
    batch = log.append(journal.RecordType.ADD, record)
    for _ in range(10_000):  # blocks this loop (no await) until the writer thread has committed
        if synced[0]:
            break
        time.sleep(0.001)
    assert synced[0] == journal.SALTED_RECORD_HEADER.size + len(record) and not batch.done()
    await batch
    assert log.synced == journal.JournalPosition(log.current_seq, journal.FILE_HEADER.size + synced[0])
    await log.close()


async def test_a_run_of_adds_is_applied_as_each_add_would_be_or_not_at_all(open_storage, storage_dirs):
    """`add_run` (the adds of one writer from one read): the same entries, last entry, LAC, epoch and journal records
    as adding each in turn; refused whole, changing nothing, for whatever would refuse one of them."""
    storage = await open_storage()
    entries = [make_entry(1, e) for e in range(5)]
    await storage.add_run(1, KEY, False, 2, list(range(5)), [e - 1 for e in range(5)], entries)
    assert [await storage.read_entry(1, e) for e in range(5)] == entries
    assert (storage.last_entry_id(1), storage.lac(1)) == (4, 3)
    with pytest.raises(StaleWriterEpoch):
        await storage.add_entry(1, 5, make_entry(1, 5), KEY, writer_epoch=1)  # the run raised the ledger's epoch

    refusals = [
        (Unauthorized, (1, OTHER_KEY, False, 2)), (StaleWriterEpoch, (1, KEY, False, 1)),
        (StaleWriterEpoch, (1, KEY, True, 1)),  # judged entry by entry: the caller adds them one by one
        (BadRequest, (-1, KEY, False, 2)), (BadRequest, (1, KEY, False, 2**63)),
    ]
    for error, (ledger_id, key, recovery, epoch) in refusals:
        with pytest.raises(error):
            storage.add_run(ledger_id, key, recovery, epoch, [5, 6], [4, 5], [make_entry(1, 5), make_entry(1, 6)])
    with pytest.raises(BadRequest):
        storage.add_run(1, KEY, False, 2, [5, -1], [4, 5], [make_entry(1, 5), make_entry(1, 6)])
    await storage.fence(1, KEY)
    with pytest.raises(LedgerFenced):
        storage.add_run(1, KEY, False, 2, [5, 6], [4, 5], [make_entry(1, 5), make_entry(1, 6)])
    assert (storage.last_entry_id(1), storage.lac(1)) == (4, 3)
    with pytest.raises(NoSuchEntry):
        await storage.read_entry(1, 5)

    await storage.add_run(1, KEY, True, 2, [5, 6], [4, 5], [make_entry(1, 5), make_entry(1, 6)])  # recovery: taken
    storage = await open_storage()  # the first one is dropped, never closed: its journal replayed
    assert [await storage.read_entry(1, e) for e in range(7)] == [*entries, make_entry(1, 5), make_entry(1, 6)]
    assert (storage.last_entry_id(1), storage.lac(1)) == (6, 5)


async def test_a_reused_journal_file_replays_only_its_new_life(tmp_path):
    """A journal file the checkpoint no longer needs is reused as the next one, its earlier records left in place: a
    crash after a few new records replays those, never the earlier life behind them (the new salt fails each one)."""
    log = journal.Journal(tmp_path, max_wait=0, flush_bytes=1 << 20, roll_bytes=16 * 1024)
    await log.start()
    first = journal.journal_path(tmp_path, log.current_seq)
    earlier_inode = first.stat().st_ino
    while log.current_seq == journal.journal_seqs(tmp_path)[0]:
        await log.append(journal.RecordType.ADD, b"earlier life " * 20)
    assert len(journal_records(first)) > 20
    log.remove_before(log.synced)  # the checkpoint, as the second file starts: the first becomes the spare
    assert (tmp_path / journal.SPARE_NAME).stat().st_ino == earlier_inode and not first.exists()
    while journal.journal_path(tmp_path, log.current_seq).stat().st_ino != earlier_inode:
        await log.append(journal.RecordType.ADD, b"second file")
    mark = log.synced
    new = [f"new life {i}".encode() for i in range(3)]
    for body in new:
        await log.append(journal.RecordType.ADD, body)
    log.stop_writer()  # killed: no END record

    replay = journal.Replay(tmp_path, mark)
    assert [body for _, body in replay] == new and replay.damage == []
    reused = journal.journal_path(tmp_path, mark.seq).read_bytes()
    assert reused.count(b"earlier life") > 100  # the earlier life is still there, behind the new records


async def test_the_first_lap_writes_no_zeros_its_files_grow_by_append_until_one_is_released(tmp_path):
    """Before a checkpoint releases a file there is nothing to reuse: the first file (also at start) and each one
    after it hold their header and their records, not a byte more (zeros written while serving doubled the disk's
    writes), and no spare is made. A released file becomes the spare at the size it had, and grows past it."""
    log = journal.Journal(tmp_path, max_wait=0, flush_bytes=1 << 20, roll_bytes=16 * 1024)
    await log.start()
    first = journal.journal_path(tmp_path, log.current_seq)
    assert first.stat().st_size == journal.FILE_HEADER.size
    while len(journal.journal_seqs(tmp_path)) < 4:
        await log.append(journal.RecordType.ADD, b"first lap " * 30)
        assert not (tmp_path / journal.SPARE_NAME).exists()
        current = journal.journal_path(tmp_path, log.current_seq)
        assert current.stat().st_size == log.synced.offset  # the file ends where its records do
    for seq in journal.journal_seqs(tmp_path)[:-1]:
        path = journal.journal_path(tmp_path, seq)
        offset, rtype, _ = journal_records(path)[-1]
        assert rtype == journal.RecordType.END and path.stat().st_size == offset + journal.SALTED_RECORD_HEADER.size

    released_size = first.stat().st_size
    log.remove_before(log.synced)
    spare = (tmp_path / journal.SPARE_NAME).stat()
    assert spare.st_size == released_size and not first.exists()
    while journal.journal_path(tmp_path, log.current_seq).stat().st_ino != spare.st_ino:
        await log.append(journal.RecordType.ADD, b"next lap " * 30)
    reused_seq = log.current_seq
    while log.current_seq == reused_seq:  # until it rolls: it may pass its earlier size
        await log.append(journal.RecordType.ADD, b"next lap " * 30)
    reused = journal.journal_path(tmp_path, reused_seq)
    end, _, _ = journal_records(reused)[-1]
    assert reused.stat().st_size == max(released_size, end + journal.SALTED_RECORD_HEADER.size)
    await log.close()


def first_format_record(rtype: journal.RecordType, body: bytes) -> bytes:
    """A record as the journal's first format wrote it: no file header before it, its CRC32C over type and body."""
    return journal.RECORD_HEADER.pack(len(body), crc32c.crc32c(bytes([rtype]) + body), rtype) + body


async def test_a_journal_of_the_first_format_is_replayed_whole_after_an_upgrade(open_storage, storage_dirs):
    """A bookie restarted on this code over files of the first format (no header, CRCs without a salt, grown by
    append, the newest torn by a crash): every record replays, then and after the next crash, when the files of the
    new format follow them."""
    journal_dir, _ = storage_dirs
    journal_dir.mkdir(parents=True)
    entries = [make_entry(1, e) for e in range(15)]
    older = [first_format_record(journal.RecordType.MASTER_KEY, journal.LEDGER.pack(1) + KEY)]
    older += [first_format_record(journal.RecordType.ADD, entry) for entry in entries[:6]]
    journal.journal_path(journal_dir, 1).write_bytes(b"".join(older))
    newest = [first_format_record(journal.RecordType.ADD, entry) for entry in entries[6:10]]
    torn = first_format_record(journal.RecordType.ADD, entries[10])[:-5]
    journal.journal_path(journal_dir, 2).write_bytes(b"".join(newest) + torn)

    storage = await open_storage()
    assert [await storage.read_entry(1, e) for e in range(10)] == entries[:10] and storage.journal_damage is None
    with pytest.raises(NoSuchEntry):
        await storage.read_entry(1, 10)
    for entry_id in range(10, 15):
        await storage.add_entry(1, entry_id, entries[entry_id], KEY)
    storage = await open_storage()  # the first one is dropped, never closed
    assert [await storage.read_entry(1, e) for e in range(15)] == entries and storage.journal_damage is None
    assert journal.file_salt(journal.journal_path(journal_dir, 3).read_bytes()) is not None


async def test_adds_past_twice_the_memtable_wait_for_the_flush_under_way_and_both_are_measured(storage_dirs):
    """The memtable's backpressure, seen by /metrics: a flush held in its entry-log append holds the adds that find
    the memtable at twice memtable_bytes, and each held add reports its wait once the flush, reported too, ends."""
    flushes, waits = [], []
    size = len(make_entry(1, 0, size=1000))
    storage = LedgerStorage(
        *storage_dirs, StorageSettings(**{**TEST_SETTINGS, "memtable_bytes": 4 * size}),
        on_flush=flushes.append, on_memtable_wait=waits.append,
    )
    await storage.start()
    released = threading.Event()
    append = storage._entry_logger.append
    storage._entry_logger.append = lambda step: released.wait() and append(step)
    try:
        await add_all(storage, 1, range(4), size=1000)  # the fourth fills the memtable: its flush starts and is held
        await add_all(storage, 1, range(4, 11), size=1000)  # seven more: not yet twice memtable_bytes
        held = [asyncio.ensure_future(storage.add_entry(1, e, make_entry(1, e, size=1000), KEY)) for e in (11, 12)]
        await asyncio.sleep(0.05)
        assert not any(add.done() for add in held) and waits == [] and flushes == []
    finally:
        released.set()
    await asyncio.gather(*held)
    assert len(waits) == 2 and min(waits) >= 0.05 and flushes
    await storage.close()


async def test_adds_held_by_a_full_memtable_go_on_once_a_flush_takes_it_not_when_that_flush_ends(storage_dirs):
    """A flush queued behind one under way takes the memtable only when that one ends: the adds it held wait for
    that moment, not also for the whole of the flush that took their entries (adds after them were never held)."""
    size = len(make_entry(1, 0, size=1000))
    storage = LedgerStorage(*storage_dirs, StorageSettings(**{**TEST_SETTINGS, "memtable_bytes": 4 * size}))
    await storage.start()
    steps = threading.Semaphore(0)
    append = storage._entry_logger.append
    storage._entry_logger.append = lambda step: steps.acquire() and append(step)
    try:
        await add_all(storage, 1, range(3), size=1000)
        first = asyncio.ensure_future(storage.flush())  # takes the three entries, held in its append
        while storage._flushing is None:
            await asyncio.sleep(0)
        await add_all(storage, 1, range(3, 10), size=1000)  # a size-triggered flush queues behind the first
        held = [asyncio.ensure_future(storage.add_entry(1, e, make_entry(1, e, size=1000), KEY)) for e in (10, 11)]
        await asyncio.sleep(0.05)
        assert not any(add.done() for add in held)
        steps.release()  # the first flush ends; the queued one takes the memtable and is held in its append
        await first
        await asyncio.wait_for(asyncio.gather(*held), 10)
    finally:
        for _ in range(10):
            steps.release()
    await storage.flush()
    assert [await storage.read_entry(1, e) for e in range(12)] == [make_entry(1, e, size=1000) for e in range(12)]
    await storage.close()
