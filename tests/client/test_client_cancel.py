"""A cancelled reader stops: a consumer that shuts down its tail must not find it still reading.

Python 3.11's `asyncio.wait_for` drops a cancellation that lands as the operation it waits for completes (CPython
gh-86296): the caller carries on with the result. Every entry read of a reader waited that way, so a tail cancelled
as one of its reads came back read on (to the end of a closed ledger, for ever on an open one). Real ZooKeeper and
bookie processes; the cancels land at every event-loop turn of a tail that reads entries back to back.
"""

from __future__ import annotations

import asyncio

from bookfleet.client.bookkeeper import BookKeeper

ENTRIES = 500
"""More than the tail ever reads before its cancel lands, so every cancel meets it reading."""
ROUNDS = 1000
LEAD = 3
"""Entries a tail reads before the test starts counting turns to its cancel."""
SPREAD = 8
"""Event-loop turns the cancel is put off by, 0 to SPREAD - 1 in turn: an entry read takes about six on loopback,
so the cancels land at every step of a read, its completion among them."""
HANG = 30.0
"""Generous: what it takes to tell a tail that stops from one that reads on."""


async def test_a_cancelled_tail_stops_even_as_its_read_completes(bookie_fleet, zk_connect):
    """Each round starts a tail over a closed ledger whose entries are all on the bookies, lets it read a few,
    cancels it some event-loop turns later and expects CancelledError: a tail that ends on its own instead ran
    past its cancel to the ledger's last entry."""
    bookie_fleet.start(3)
    async with BookKeeper(zk_connect) as bk:
        writer = await bk.create_ledger(3, 2, 2)
        await asyncio.gather(*(writer.add(b"%d" % i) for i in range(ENTRIES)))
        await writer.close()
        reader = await bk.open_ledger(writer.ledger_id)
        outcomes: list[str] = []
        for round_ in range(ROUNDS):
            read = 0

            async def tail() -> None:
                nonlocal read
                async for _entry in reader.tail():
                    read += 1

            tailing = asyncio.ensure_future(tail())
            while read < LEAD:
                await asyncio.sleep(0)
            for _turn in range(round_ % SPREAD):
                await asyncio.sleep(0)
            tailing.cancel()
            outcomes.append(await _ending(tailing))
    assert outcomes == ["cancelled"] * ROUNDS, f"{ROUNDS - outcomes.count('cancelled')} of {ROUNDS} cancels lost"


async def _ending(tailing: asyncio.Future) -> str:
    """How a cancelled tail ended: "cancelled", "read on to the end", or "still reading" after HANG."""
    done, _ = await asyncio.wait([tailing], timeout=HANG)
    if not done:
        tailing.cancel()
        return "still reading"
    return "cancelled" if tailing.cancelled() else "read on to the end"
