"""One writer per ledger: concurrent reopens, closing under a live writer, a writer that loses its lease."""

from __future__ import annotations

import asyncio

import pytest

from bookfleet import cli
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.writer import LedgerFencedError, LedgerHeldError, LedgerWriteError, LedgerWriter
from bookfleet.meta import zkpaths
from tests.test_client_writer import eventually


async def test_two_concurrent_reopens_get_one_writer(bookie_fleet, zk_connect):
    bookie_fleet.start(3)
    async with BookKeeper(zk_connect) as creator, BookKeeper(zk_connect) as one, BookKeeper(zk_connect) as two:
        first = await creator.create_ledger(3, 3, 2, password=b"pw")
        await first.add(b"0")
        await first.flush()
        with pytest.raises(LedgerHeldError, match=f"ledger {first.ledger_id} already has a live writer"):
            await one.reopen_ledger(first.ledger_id, b"pw")  # the creator still writes
        await first.detach()

        reopened = await asyncio.gather(
            one.reopen_ledger(first.ledger_id, b"pw"), two.reopen_ledger(first.ledger_id, b"pw"), return_exceptions=True
        )
        winners = [w for w in reopened if isinstance(w, LedgerWriter)]
        refused = [e for e in reopened if isinstance(e, LedgerHeldError)]
        assert (len(winners), len(refused)) == (1, 1), reopened
        assert await winners[0].add(b"1 from the one writer") == 1
        await winners[0].flush()
        await winners[0].detach()

        again = await (one if winners[0] is reopened[1] else two).reopen_ledger(first.ledger_id, b"pw")
        assert await again.add(b"2") == 2
        await again.close()
        reader = await creator.open_ledger(first.ledger_id, b"pw")
        assert [e.payload async for e in reader.entries()] == [b"0", b"1 from the one writer", b"2"]


async def test_close_fences_a_live_writer(bookie_fleet, zk_connect):
    bookie_fleet.start(3)
    async with BookKeeper(zk_connect) as live, BookKeeper(zk_connect) as closer:
        writer = await live.create_ledger(3, 3, 2)
        acked: list[int] = []
        failure: list[BaseException] = []

        async def keep_writing() -> None:
            try:
                while True:
                    batch = [writer.append(b"entry") for _ in range(20)]
                    acked.extend(await asyncio.gather(*batch))
            except LedgerWriteError as exc:
                failure.append(exc)

        async def some_acked() -> bool:
            return len(acked) >= 100

        writing = asyncio.ensure_future(keep_writing())
        await eventually(some_acked, timeout=30)
        command = ["ledger", "close", str(writer.ledger_id), "--zk", zk_connect]
        assert await asyncio.to_thread(cli.main, command) == 0
        closed = closer.ledger_metadata(writer.ledger_id)

        async def settled() -> bool:
            return bool(failure) or max(acked) > closed.last_entry_id

        await eventually(settled, timeout=30)
        writing.cancel()
        assert max(acked) <= closed.last_entry_id, "the live writer got an ack past the closed lastEntryId"
        assert isinstance(failure[0], LedgerFencedError)
        reader = await closer.open_ledger(writer.ledger_id)
        assert [e.entry_id async for e in reader.entries()] == list(range(closed.last_entry_id + 1))


async def test_a_writer_that_loses_its_lease_stops(bookie_fleet, zk_connect, zk):
    bookie_fleet.start(3)
    async with BookKeeper(zk_connect) as bk:
        writer = await bk.create_ledger(3, 3, 2)
        await writer.add(b"0")
        zk.delete(zkpaths.ledger_writer(writer.ledger_id))  # what the expiry of the writer's session does

        async def refused() -> LedgerWriteError | None:
            try:
                await writer.add(b"more")
            except LedgerWriteError as exc:
                return exc
            return None

        assert "lost its lease" in str(await eventually(refused, timeout=30))
