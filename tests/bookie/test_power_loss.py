"""Power cuts under bookie storage (tests/fixtures/powerloss.py): every unsynced byte and every directory change not
yet fsynced is lost. Every acknowledged entry must survive, and the LastLogMark must survive as written and never
point past the durable journal. Each fdatasync and directory fsync of the journal, entry logs and checkpoint is
needed for one of these to hold."""

from __future__ import annotations

import asyncio
import itertools

from bookfleet.bookie import journal
from bookfleet.bookie.checkpoint import LastLogMark
from bookfleet.bookie.storage import LedgerStorage, StorageSettings
from tests.fixtures.storage import KEY, TEST_SETTINGS, make_entry

SMALL_FILES = {**TEST_SETTINGS, "journal_roll_bytes": 8192, "entrylog_roll_bytes": 8192}
"""Small journal and entry-log files, so flushes and adds roll to new files (their names need directory syncs)."""


async def open_storage(storage_dirs) -> LedgerStorage:
    storage = LedgerStorage(*storage_dirs, StorageSettings(**SMALL_FILES))
    await storage.start()
    return storage


async def add(storage: LedgerStorage, acked: dict, ledger_id: int, entry_ids, size: int = 300) -> None:
    """Add entries and remember each one once it is acknowledged."""
    entries = {e: make_entry(ledger_id, e, size=size) for e in entry_ids}
    await asyncio.gather(*(storage.add_entry(ledger_id, e, data, KEY) for e, data in entries.items()))
    acked.update({(ledger_id, e): data for e, data in entries.items()})


async def check_survivors(storage_dirs, acked: dict, mark_written: journal.JournalPosition) -> LedgerStorage:
    journal_dir, ledger_dir = storage_dirs
    mark = LastLogMark(ledger_dir).read()
    assert mark == mark_written, "the LastLogMark did not survive as written"
    if mark.offset:
        assert journal.journal_path(journal_dir, mark.seq).stat().st_size >= mark.offset, "mark past durable data"
    storage = await open_storage(storage_dirs)
    for (ledger_id, entry_id), data in acked.items():
        assert await storage.read_entry(ledger_id, entry_id) == data, f"lost ledger {ledger_id} entry {entry_id}"
    return storage


async def test_acknowledged_entries_and_the_mark_survive_power_cuts(storage_dirs, power_loss):
    acked: dict[tuple[int, int], bytes] = {}
    mark = journal.JournalPosition(0, 0)

    # 1. Cut before any flush: everything lives in the journal (its file name needs the directory sync too).
    storage = await open_storage(storage_dirs)
    await add(storage, acked, 1, range(10))
    await power_loss.cut(storage)
    storage = await check_survivors(storage_dirs, acked, mark)

    # 2. Flushes into rolling entry logs and a checkpoint that trims the journal, then more adds, then a cut.
    for round_ in range(3):
        await add(storage, acked, 1, range(10 + 40 * round_, 50 + 40 * round_))
        await add(storage, acked, 2, range(20 * round_, 20 * round_ + 20))
        await storage.flush()
    mark = LastLogMark(storage_dirs[1]).read()
    assert mark > journal.JournalPosition(1, 0)
    await add(storage, acked, 3, range(20))  # after the last flush: only in the journal
    await storage.force(3)
    await power_loss.cut(storage)
    storage = await check_survivors(storage_dirs, acked, mark)

    # 3. Replayed entries flushed by the new run, then a cut straight after that flush's checkpoint.
    await storage.flush()
    mark = LastLogMark(storage_dirs[1]).read()
    await power_loss.cut(storage)
    storage = await check_survivors(storage_dirs, acked, mark)

    # 4. GC compaction moves live entries into new entry logs and repoints the index, then a cut.
    for round_ in range(12):
        await add(storage, acked, 10, range(10 * round_, 10 * round_ + 10), size=400)
        await add(storage, acked, 11, range(10 * round_, 10 * round_ + 10), size=100)
        await storage.flush()
    report = await storage.collect_garbage({1, 2, 3, 11})
    assert report.ledgers_deleted == [10] and report.logs_compacted
    acked = {key: data for key, data in acked.items() if key[0] != 10}
    mark = LastLogMark(storage_dirs[1]).read()
    await power_loss.cut(storage)
    storage = await check_survivors(storage_dirs, acked, mark)
    await storage.close()
    assert power_loss.syncs > 0


async def test_a_power_cut_in_a_reused_journal_file_keeps_its_new_records_and_never_its_earlier_life(
    storage_dirs, power_loss
):
    """Ledgers from 100 on fill journal files (a MASTER_KEY and an add each); they are deleted and the checkpoint
    moves past them, so the oldest file is reused as the next one, the old records still in it. New ledgers, shaped
    alike (so the old records line up right behind the new ones), then a cut a few ledgers into the reused file:
    every acked add is back, no deleted ledger (a MASTER_KEY record replayed would bring its ledger back), no
    journal damage."""
    journal_dir, _ = storage_dirs
    acked: dict[tuple[int, int], bytes] = {}
    storage = await open_storage(storage_dirs)
    ledger_ids = itertools.count(100)
    while len(journal.journal_seqs(journal_dir)) < 3:  # then a file has just started: no spare is ready yet
        await add(storage, {}, next(ledger_ids), [0])
    oldest = journal.journal_path(journal_dir, journal.journal_seqs(journal_dir)[0])
    reused_inode = oldest.stat().st_ino
    await storage.collect_garbage(set())  # flushes: the mark passes the older files, the oldest becomes the spare
    assert (journal_dir / journal.SPARE_NAME).stat().st_ino == reused_inode and not oldest.exists()
    new_ledgers = itertools.count(1000)
    while journal.journal_path(journal_dir, journal.journal_seqs(journal_dir)[-1]).stat().st_ino != reused_inode:
        await add(storage, acked, next(new_ledgers), [0])
    for _ in range(3):
        await add(storage, acked, next(new_ledgers), [0])
    await power_loss.cut(storage)

    storage = await check_survivors(storage_dirs, acked, LastLogMark(storage_dirs[1]).read())
    assert storage.ledger_ids() == {ledger_id for ledger_id, _ in acked} and storage.journal_damage is None
    await storage.close()
