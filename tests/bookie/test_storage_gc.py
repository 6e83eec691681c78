"""Garbage collection, compaction and checkpoints on real files: space comes back, live entries stay byte-identical."""

from __future__ import annotations

import asyncio
import threading

import pytest

from bookfleet.bookie import gc, journal
from bookfleet.bookie.entrylog import log_ids
from bookfleet.bookie.errors import NoSuchLedger
from tests.fixtures.storage import KEY, make_entry

ROLL = 16 * 1024
"""Entry logs roll at this size, so a few hundred small entries spread over several logs."""


async def write_rounds(storage, ledger_ids, rounds, per_round, size=500):
    """Add `per_round` entries to each ledger and flush, `rounds` times: every entry log holds every ledger."""
    entries = {}
    for r in range(rounds):
        for ledger_id in ledger_ids:
            for e in range(r * per_round, (r + 1) * per_round):
                entries[ledger_id, e] = make_entry(ledger_id, e, size=size)
        await asyncio.gather(
            *(storage.add_entry(lid, e, data, KEY) for (lid, e), data in entries.items() if e >= r * per_round)
        )
        await storage.flush()
    return entries


async def read_all(storage, entries):
    return {key: await storage.read_entry(*key) for key in entries}


async def test_gc_deletes_ledgers_and_removes_logs_with_nothing_live(open_storage, storage_dirs):
    storage = await open_storage(entrylog_roll_bytes=ROLL, compaction_live_ratio=0.0)
    doomed = await write_rounds(storage, [1], rounds=3, per_round=40)
    kept = await write_rounds(storage, [2], rounds=1, per_round=40)
    _, ledger_dir = storage_dirs
    logs_before = set(log_ids(ledger_dir))
    used_before = storage.used_bytes()

    report = await storage.collect_garbage({2})

    assert report.ledgers_deleted == [1]
    assert report.logs_removed and not report.logs_compacted
    assert set(log_ids(ledger_dir)) == logs_before - set(report.logs_removed)
    assert report.bytes_reclaimed >= sum(len(e) for e in doomed.values())
    assert storage.used_bytes() <= used_before - report.bytes_reclaimed + 64 * 1024  # index and WAL may move a bit
    assert storage.ledger_ids() == {2}
    with pytest.raises(NoSuchLedger):
        await storage.read_entry(1, 0)
    assert await read_all(storage, kept) == kept

    await storage.close()
    storage = await open_storage(entrylog_roll_bytes=ROLL)
    assert storage.ledger_ids() == {2}  # the deleted ledger does not come back from the journal
    assert await read_all(storage, kept) == kept


async def test_compaction_moves_live_entries_and_keeps_them_byte_identical(open_storage, storage_dirs):
    storage = await open_storage(entrylog_roll_bytes=ROLL, compaction_live_ratio=0.6)
    entries = await write_rounds(storage, [1, 2, 3], rounds=4, per_round=10)
    unflushed = {(2, e): make_entry(2, e) for e in range(40, 45)}
    for (lid, e), data in unflushed.items():
        await storage.add_entry(lid, e, data, KEY)
    live = {key: data for key, data in entries.items() if key[0] == 2} | unflushed
    _, ledger_dir = storage_dirs

    report = await storage.collect_garbage({2})

    assert report.ledgers_deleted == [1, 3]
    assert report.logs_compacted, report
    assert not set(report.logs_compacted + report.logs_removed) & set(log_ids(ledger_dir))
    assert await read_all(storage, live) == live
    await storage.close()
    storage = await open_storage(entrylog_roll_bytes=ROLL)
    assert await read_all(storage, live) == live
    assert await storage.read_range(2, 0, 44, 1 << 20) == [live[2, e] for e in range(45)]


async def test_adds_and_flushes_go_on_while_a_compaction_is_in_progress(open_storage, storage_dirs, monkeypatch):
    """Compaction copies without the flush lock: adds past twice the memtable size wait for a flush, and that
    flush must not wait for the compaction (held here until the adds are done)."""
    storage = await open_storage(entrylog_roll_bytes=ROLL, compaction_live_ratio=0.6, memtable_bytes=4096)
    entries = await write_rounds(storage, [1, 2, 3], rounds=4, per_round=10)
    compacting, release = threading.Event(), threading.Event()
    compact = gc.compact

    def held_compact(*args) -> None:
        compacting.set()
        release.wait()
        compact(*args)

    monkeypatch.setattr(gc, "compact", held_compact)
    collecting = asyncio.ensure_future(storage.collect_garbage({2, 4}))
    try:
        await asyncio.to_thread(compacting.wait)
        during = {(4, e): make_entry(4, e, size=500) for e in range(40)}  # about 5x memtable_bytes
        async with asyncio.timeout(120):  # only a failure waits this long: the flush lock held by the compaction
            for (ledger_id, entry_id), data in during.items():
                await storage.add_entry(ledger_id, entry_id, data, KEY)
            await storage.flush()
        assert not collecting.done()
    finally:
        release.set()
    report = await collecting

    assert report.ledgers_deleted == [1, 3] and report.logs_compacted, report
    assert not set(report.logs_compacted) & set(log_ids(storage_dirs[1]))
    live = {key: data for key, data in entries.items() if key[0] == 2} | during
    assert await read_all(storage, live) == live
    await storage.close()
    storage = await open_storage(entrylog_roll_bytes=ROLL)
    assert await read_all(storage, live) == live


async def test_checkpoint_deletes_journals_before_the_mark(open_storage, storage_dirs):
    storage = await open_storage(journal_roll_bytes=2048)
    journal_dir, _ = storage_dirs
    entries = await write_rounds(storage, [1], rounds=1, per_round=30)  # flushes at the end
    seqs = journal.journal_seqs(journal_dir)
    assert len(seqs) == 1, seqs  # 30 entries rolled the journal many times; the flush left only the current one

    more = {(1, e): make_entry(1, e) for e in range(30, 60)}
    for (lid, e), data in more.items():
        await storage.add_entry(lid, e, data, KEY)
    assert len(journal.journal_seqs(journal_dir)) > 1
    storage = await open_storage(journal_roll_bytes=2048)  # dropped: replays the journals after the mark
    assert await read_all(storage, entries | more) == entries | more
