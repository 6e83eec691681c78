"""Readers, LAC reads and recovery with one bookie of the ensemble frozen (SIGSTOP: its connections stay open, it
answers nothing): each is passed over within the read timeout, never waited for.

The writer and the readers use BookKeepers of their own: the writer aborts a silent bookie's connection once its
`add_timeout` is over, which would release a reader's waits on the same shared connection and hide a missing deadline.
"""

from __future__ import annotations

import asyncio

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.writer import WriterSettings
from bookfleet.client.writeset import write_set
from bookfleet.meta.metadata import LedgerState
from tests.fixtures.bookies import paused
from tests.fixtures.waiting import eventually

PATIENT = WriterSettings(add_timeout=600)
"""A writer that never gives up on the frozen bookie while a test runs (with three bookies there is no spare)."""
POLL = 0.5
"""The tail's long-poll timeout."""
HANG = 30.0
"""Generous: what it takes to tell a read that ends from one that never does."""


async def test_a_tailing_reader_passes_over_a_frozen_bookie(bookie_fleet, zk_connect):
    """E3/Qw3/Qa2, one bookie frozen: the tail's long polls used to have no deadline and it waited for every one
    before it looked again, so the first poll without news (an idle writer) stalled it for good, with two bookies
    answering. It follows the writer across idle spells and ends once the ledger is closed."""
    by_id = {b.bookie_id: b for b in bookie_fleet.start(3)}
    async with BookKeeper(zk_connect, PATIENT) as writing, BookKeeper(zk_connect) as reading:
        writer = await writing.create_ledger(3, 3, 2)
        reader = await reading.open_ledger(writer.ledger_id)
        tailed: list[bytes] = []

        async def tail() -> None:
            async for entry in reader.tail(poll_timeout=POLL):
                tailed.append(entry.payload)

        with paused(by_id[writer.metadata.segments[0].bookies[0]]):
            tailing = asyncio.ensure_future(tail())
            try:
                for burst in range(3):  # the tail goes idle (polls with no news) after each burst
                    for i in range(burst * 5, burst * 5 + 5):
                        await writer.add(b"%d" % i)
                    # all but the burst's last entry: the LAC its successor carries confirms them (the writer's
                    # explicit LAC write waits for the frozen bookie's answer until add_timeout)
                    await eventually(lambda count=burst * 5 + 4: _has(tailed, count), timeout=HANG)
                    await asyncio.sleep(3 * POLL)  # the answering bookies' polls come back with no news
                await writer.close()
                await asyncio.wait_for(tailing, HANG)
            finally:
                tailing.cancel()
        assert tailed == [b"%d" % i for i in range(15)]


async def _has(items: list, count: int) -> bool:
    return len(items) >= count


async def test_a_lac_read_passes_over_a_frozen_bookie(bookie_fleet, zk_connect):
    """E3/Qw2/Qa2: two answers cover every write quorum, so the LAC is read without the frozen bookie."""
    by_id = {b.bookie_id: b for b in bookie_fleet.start(3)}
    async with BookKeeper(zk_connect, PATIENT) as writing, BookKeeper(zk_connect) as reading:
        writer = await writing.create_ledger(3, 2, 2)
        for i in range(6):
            await writer.add(b"%d" % i)
        await writer.flush()
        reader = await reading.open_ledger(writer.ledger_id)
        with paused(by_id[writer.metadata.segments[0].bookies[1]]):
            assert await asyncio.wait_for(reader.read_lac(), HANG) == 5
            assert [e.payload async for e in reader.entries()] == [b"%d" % i for i in range(6)]
        await writer.close()


async def test_a_recovery_open_passes_over_a_frozen_bookie(bookie_fleet, zk_connect):
    """E3/Qw3/Qa2, a writer that stopped without closing, one bookie frozen: recovery fences the other two (they
    cover every write set), reads the tail from them (the frozen bookie heads the write set of the entry past the
    end, so its read must fail over) and closes the ledger at the writer's last entry."""
    by_id = {b.bookie_id: b for b in bookie_fleet.start(3)}
    async with BookKeeper(zk_connect, PATIENT) as writing, BookKeeper(zk_connect) as recovering:
        writer = await writing.create_ledger(3, 3, 2)
        for i in range(10):
            await writer.add(b"%d" % i)
        ensemble = writer.metadata.segments[0].bookies
        frozen = by_id[ensemble[write_set(10, 3, 3)[0]]]  # heads the write set of the first entry past the end
        with paused(frozen):
            reader = await asyncio.wait_for(recovering.open_ledger(writer.ledger_id, recovery=True), HANG)
            assert reader.metadata.state == LedgerState.CLOSED and reader.metadata.last_entry_id == 9
            assert [e.payload async for e in reader.entries()] == [b"%d" % i for i in range(10)]
        await writer.detach()
