"""Recovery on a full fleet: no writable spare, a bookie of the ensemble read-only because its disk is past the
threshold. Its reserve takes the recovery adds, so the ledger is closed on its own ensemble."""

from __future__ import annotations

import asyncio

import pytest

from bookfleet import wire
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.connection import BookieClient
from bookfleet.client.errors import LedgerWriteError
from bookfleet.client.writer import WriterSettings
from bookfleet.meta.metadata import LedgerState
from tests.fixtures.bookies import stored_entries
from tests.fixtures.waiting import eventually

QUOTA = 10**9
FULL_DISK = dict(
    no_verify_ledgers=False, disk_quota=QUOTA, disk_usage_threshold=0.9, disk_usage_lwm=0.8, disk_check_interval=0.2,
)


async def test_a_ledger_on_a_full_fleet_is_recovered_on_its_own_ensemble(bookie_fleet, zk_connect):
    """E=Qw=Qa=2 on the only two bookies; one turns read-only by its disk quota. The writer gives up after its
    add_timeout; recovery used to fail for want of a writable replacement, leaving the ledger open for good."""
    bookie_fleet.start(2, **FULL_DISK)
    by_id = {b.bookie_id: b for b in bookie_fleet.bookies}
    settings = WriterSettings(add_timeout=2.0, replacement_retry=0.2)
    async with BookKeeper(zk_connect, settings) as crashed, BookKeeper(zk_connect, settings) as recoverer:
        writer = await crashed.create_ledger(2, 2, 2)
        acknowledged = [b"entry %d" % i for i in range(10)]
        for payload in acknowledged:
            await writer.add(payload)
        ensemble = writer.metadata.segments[0].bookies
        full = by_id[ensemble[1]]
        with open(full.ledger_dir / "ballast", "wb") as ballast:
            ballast.truncate(QUOTA * 92 // 100)  # sparse: past the threshold, within the recovery reserve
        async with await BookieClient.connect(full.address) as probe:
            await eventually(lambda: _reports_read_only(probe))
        with pytest.raises(LedgerWriteError, match="cannot replace bookie"):
            await asyncio.wait_for(writer.add(b"refused"), 60)  # stored on the writable bookie only

        metadata = await recoverer.recover_ledger(writer.ledger_id)
        # Entry 10 was readable from a replica, so recovery re-added it to the whole write set (BookKeeper's rule).
        assert metadata.state == LedgerState.CLOSED and metadata.last_entry_id == 10
        assert [list(s.bookies) for s in metadata.segments] == [list(ensemble)]  # no replacement was needed
        assert await stored_entries(full.address, writer.ledger_id, range(12)) == set(range(11))
        reader = await recoverer.open_ledger(writer.ledger_id)
        assert [e.payload async for e in reader.entries()] == [*acknowledged, b"refused"]


async def _reports_read_only(client: BookieClient) -> bool:
    return (await client.bookie_info()).state == wire.BookieState.READ_ONLY
