"""Crashes of a real bookie process: nothing acknowledged is ever lost, a torn journal tail is survivable, and a
journal damaged after it was synced is loud."""

from __future__ import annotations

import asyncio
import os

import pytest

from bookfleet import wire
from bookfleet.bookie.journal import SALTED_RECORD_HEADER, journal_path, journal_seqs
from bookfleet.client.connection import BookieClient, BookieError, NoSuchEntryError, ReadOnlyError
from bookfleet.meta.registry import BookieRegistry
from tests.fixtures.bookies import MASTER_KEY, encode_test_entry
from tests.fixtures.storage import damage_journal_record, tear_last_journal_record


@pytest.mark.parametrize("crash", ["kill -9", "SIGTERM"])
async def test_stop_under_pipelined_load_loses_no_acknowledged_entry(bookie_fleet, crash):
    # A short flush interval lets entries reach the entry log too, so recovery mixes both paths; small journal files
    # roll and are reused (stale records behind the new ones) all through the load.
    (bookie,) = bookie_fleet.start(1, flush_interval=0.2, journal_roll_bytes=64 * 1024)
    acknowledged: dict[tuple[int, int], bytes] = {}

    async def writer(ledger_id: int) -> None:
        """Keep 64 adds in flight; record an entry as acknowledged only when its add succeeded."""
        client = await BookieClient.connect(bookie.address)
        in_flight: dict[asyncio.Task, int] = {}
        entries: dict[int, bytes] = {}
        next_id = 0
        while True:
            while len(in_flight) < 64:
                entries[next_id] = encode_test_entry(ledger_id, next_id, os.urandom(200))
                in_flight[asyncio.create_task(client.add_entry(MASTER_KEY, entries[next_id]))] = next_id
                next_id += 1
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                entry_id = in_flight.pop(task)
                if task.exception() is None:
                    acknowledged[(ledger_id, entry_id)] = entries.pop(entry_id)
                elif isinstance(task.exception(), ConnectionError) or "shutting down" in str(task.exception()):
                    return  # a stopping bookie refuses later adds (V3 EIO: BookKeeper has no code of its own for it)
                else:
                    raise task.exception()

    writers = [asyncio.create_task(writer(ledger_id)) for ledger_id in (1, 2, 3)]
    async with asyncio.timeout(30):
        while len(acknowledged) < 3000:
            await asyncio.sleep(0.01)
    if crash == "kill -9":
        bookie.kill9()
    else:  # graceful: in-flight adds finish, later ones are refused, the process exits cleanly
        assert await asyncio.to_thread(bookie.stop) == 0
    await asyncio.wait_for(asyncio.gather(*writers), 10)
    assert len(acknowledged) >= 3000

    bookie.start().wait_ready()
    async with await BookieClient.connect(bookie.address) as client:
        for ledger_id in (1, 2, 3):
            ours = sorted(e for (lid, e) in acknowledged if lid == ledger_id)
            stored = await client.read_range(ledger_id, 0, ours[-1], max_bytes=1 << 22)
            by_id = {int.from_bytes(entry[8:16], "big", signed=True): entry for entry in stored}
            missing = [e for e in ours if by_id.get(e) != acknowledged[(ledger_id, e)]]
            assert not missing, f"ledger {ledger_id}: acknowledged entries lost or changed: {missing[:10]}"


async def killed_with_entries_in_its_journal(bookie_fleet):
    """A bookie without timed flushes given entries 0-19 of ledger 4, then killed -9: every entry lives only in its
    journal, nothing checkpointed. Returns the bookie and the entries."""
    (bookie,) = bookie_fleet.start(1, flush_interval=3600)
    entries = [encode_test_entry(4, i, os.urandom(500)) for i in range(20)]
    async with await BookieClient.connect(bookie.address) as client:
        for entry in entries:
            await client.add_entry(MASTER_KEY, entry)
    bookie.kill9()
    return bookie, entries


async def test_torn_journal_tail_keeps_everything_before_it(bookie_fleet):
    bookie, entries = await killed_with_entries_in_its_journal(bookie_fleet)
    newest = journal_path(bookie.journal_dir, journal_seqs(bookie.journal_dir)[-1])
    offset, body = tear_last_journal_record(newest, 100)  # the last record (entry 19) is now torn in the middle
    with open(newest, "r+b") as journal:
        journal.seek(offset + SALTED_RECORD_HEADER.size + len(body))
        journal.write(b"\xde\xad\xbe\xef" * 10)  # and garbage follows it, as after a torn page write

    bookie.start().wait_ready()
    async with await BookieClient.connect(bookie.address) as client:
        assert (await client.bookie_info()).state == wire.BookieState.WRITABLE
        assert await client.read_range(4, 0, 18, max_bytes=1 << 20) == entries[:19]
        with pytest.raises(NoSuchEntryError):
            await client.read_entry(4, 19)
        assert await client.add_entry(MASTER_KEY, entries[19]) == (4, 19)
    bookie.kill9()
    bookie.start().wait_ready()  # a second crash replays the new journal past the torn one
    async with await BookieClient.connect(bookie.address) as client:
        assert await client.read_entry(4, 19) == entries[19]


async def test_a_damaged_journal_is_loud_and_never_answers_no_such_entry(bookie_fleet, zk):
    """A flipped byte amid a synced journal file of a stopped bookie, before any checkpoint: it restarts read-only,
    serves what it kept and answers UNKNOWN_LEDGER_STATE for what it lacks, never NO_SUCH_ENTRY."""
    bookie, entries = await killed_with_entries_in_its_journal(bookie_fleet)
    damage_journal_record(bookie.journal_dir, 4, 7)

    bookie.start().wait_ready()
    async with await BookieClient.connect(bookie.address) as client:
        for read in (
            lambda: client.read_entry(4, 7),
            lambda: client.read_entry(4, 20),
            lambda: client.read_range(4, 0, 19, 1 << 20),
        ):
            with pytest.raises(BookieError) as refused:
                await read()
            assert refused.value.status == wire.Status.UNKNOWN_LEDGER_STATE, refused.value
        assert await client.read_range(4, 8, 19, max_bytes=1 << 20) == entries[8:]
        assert (await client.bookie_info()).state == wire.BookieState.READ_ONLY
        with pytest.raises(ReadOnlyError, match="its journal lost synced records"):
            await client.add_entry(MASTER_KEY, encode_test_entry(5, 0, b"a new ledger"))
    assert [info.bookie_id for info in BookieRegistry(zk).read_only()] == [bookie.bookie_id]
    assert "it cannot vouch for any entry it lacks" in bookie.log_path.read_text()
