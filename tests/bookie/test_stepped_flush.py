"""A memtable flush in steps (storage.FLUSH_STEP_ENTRIES per worker-thread call, the GIL back to the event loop in
between): while one is held between its steps every entry reads back, from the snapshot it is writing; and a process
killed -9 at any point of one loses no acknowledged entry, because the LastLogMark moves only after the snapshot is
in the synced entry log and the committed index."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bookfleet.bookie import entrylog, index
from bookfleet.bookie import storage as storage_module
from bookfleet.bookie.checkpoint import LastLogMark
from tests.bookie.pausedflush import CRASH_PLAN
from tests.fixtures.storage import FLUSH_PAUSE_POINTS, KEY, FlushPause, make_entry


def indexed_entries(ledger_dir: Path) -> int:
    with contextlib.closing(sqlite3.connect(ledger_dir / index.FILE_NAME)) as db:
        return db.execute("SELECT COALESCE(SUM(last - first + 1), 0) FROM runs").fetchone()[0]


async def test_every_entry_reads_back_while_a_flush_is_held_between_its_steps(open_storage, storage_dirs, monkeypatch):
    storage = await open_storage()
    _, ledger_dir = storage_dirs
    count = 3 * storage_module.FLUSH_STEP_ENTRIES
    snapshot = {(ledger_id, e): make_entry(ledger_id, e) for ledger_id in (1, 2) for e in range(count)}
    await asyncio.gather(*(storage.add_entry(lid, e, data, KEY) for (lid, e), data in snapshot.items()))
    mark_before = LastLogMark(ledger_dir).read()
    pause = FlushPause("mid_append")
    monkeypatch.setattr(pause.owner, pause.name, pause.method)
    flush = asyncio.ensure_future(storage.flush())
    try:
        assert await pause.held(flush), "the flush wrote its whole snapshot in one step"
        # The first step is in the entry log, nothing is indexed yet: reads are served from the snapshot being flushed.
        first_step_bytes = storage_module.FLUSH_STEP_ENTRIES * len(snapshot[1, 0])
        assert sum(path.stat().st_size for path in ledger_dir.glob("entrylog-*.log")) > first_step_bytes
        assert indexed_entries(ledger_dir) == 0
        newer = {(2, e): make_entry(2, e) for e in range(count, count + 10)}  # into the active memtable meanwhile
        await asyncio.gather(*(storage.add_entry(lid, e, data, KEY) for (lid, e), data in newer.items()))
        everything = {**snapshot, **newer}
        for (ledger_id, entry_id), data in everything.items():
            assert await storage.read_entry(ledger_id, entry_id) == data, f"ledger {ledger_id} entry {entry_id}"
        for ledger_id in (1, 2):
            expected = [data for (lid, _), data in sorted(everything.items()) if lid == ledger_id]
            assert await storage.read_range(ledger_id, 0, 10**6, 10**9) == expected
        assert LastLogMark(ledger_dir).read() == mark_before, "the mark moved before the flush was durable"
    finally:  # also when an assertion failed: a flush held for good would hang the storage's close
        pause.release.set()
    await flush
    assert indexed_entries(ledger_dir) == len(snapshot)
    for (ledger_id, entry_id), data in everything.items():
        assert await storage.read_entry(ledger_id, entry_id) == data, f"ledger {ledger_id} entry {entry_id}"


async def test_a_flush_of_large_entries_packs_at_most_pack_bytes_at_a_time(open_storage, monkeypatch):
    """64 KiB entries: a flush step of them packed at once made one 32 MiB buffer, which glibc mapped and unmapped at
    every step. Each pack holds at most entrylog.PACK_BYTES of entries, and every entry reads back from the log."""
    storage = await open_storage()
    entries = {entry_id: make_entry(1, entry_id, size=64 * 1024) for entry_id in range(40)}
    await asyncio.gather(*(storage.add_entry(1, entry_id, data, KEY) for entry_id, data in entries.items()))
    packed = []
    pack_records = entrylog.pack_records

    def recording_pack_records(ledger_id: int, entry_ids: list[int], pieces: list[bytes], *log_position: int):
        packed.append(sum(map(len, pieces)))
        return pack_records(ledger_id, entry_ids, pieces, *log_position)

    monkeypatch.setattr(entrylog, "pack_records", recording_pack_records)
    await storage.flush()
    assert sum(packed) == sum(map(len, entries.values()))
    assert max(packed) <= entrylog.PACK_BYTES
    assert indexed_entries(storage.ledger_dir) == len(entries)
    for entry_id, data in entries.items():
        assert await storage.read_entry(1, entry_id) == data


@pytest.mark.parametrize("point", list(FLUSH_PAUSE_POINTS))
async def test_a_kill_9_in_the_middle_of_a_flush_loses_no_acknowledged_entry(open_storage, storage_dirs, point):
    """tests/bookie/pausedflush.py acknowledges CRASH_PLAN's adds, holds its second flush at `point` and is killed
    -9 there; the storage reopened on its directories has every entry, from the entry log or the journal."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.bookie.pausedflush", *map(str, storage_dirs), point],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert process.stdout.readline() == "paused\n"
    finally:
        process.kill()
        process.wait()
    storage = await open_storage()
    for batch in CRASH_PLAN:
        for ledger_id, entry_ids in batch.items():
            for entry_id in entry_ids:
                assert await storage.read_entry(ledger_id, entry_id) == make_entry(ledger_id, entry_id), (
                    f"lost ledger {ledger_id} entry {entry_id}"
                )
    assert storage.last_entry_id(1) == 949 and storage.last_entry_id(3) == 599
