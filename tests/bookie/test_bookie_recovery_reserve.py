"""A read-only bookie's reserve for recovery adds (bookie/diskmonitor.py, server.py, admission.py): past the disk
threshold, or forced read-only, a bookie still takes recovery adds of entries its stored ensemble names it for, and
refuses them once the reserve up to the hard limit is used; it never takes one as a new home of a ledger."""

from __future__ import annotations

import pytest

from bookfleet import wire
from bookfleet.client.connection import BookieClient, ReadOnlyError
from bookfleet.meta import bookiestate
from bookfleet.meta.metadata import MetadataStore, new_metadata
from tests.fixtures.bookies import MASTER_KEY, encode_test_entry
from tests.fixtures.waiting import eventually

QUOTA = 1_000_000
BALLAST = 550_000
"""Bytes of a sparse file in the ledger dir: usage past the threshold (0.5), below the recovery limit (0.7) by
about 100 kB once the bookie's own files (some 50 kB; its journal file grows by append) are counted."""
FULL_DISK = dict(
    no_verify_ledgers=False, disk_quota=QUOTA, disk_usage_threshold=0.5, disk_usage_lwm=0.4,
    disk_usage_recovery_limit=0.7, disk_check_interval=3600,  # measured once, at start: the reserve is fixed
)


async def test_a_full_bookie_takes_recovery_adds_of_its_own_ensemble_until_its_reserve_is_used_up(bookie_fleet, zk):
    bookie = bookie_fleet.add(**FULL_DISK)
    store = MetadataStore(zk)
    own = store.create(new_metadata([bookie.bookie_id], 1, 1))
    elsewhere = store.create(new_metadata(["another-bookie"], 1, 1))  # a new home here would be a repair's
    bookie.ledger_dir.mkdir(parents=True)
    with open(bookie.ledger_dir / "ballast", "wb") as ballast:
        ballast.truncate(BALLAST)
    bookie.start().wait_ready()
    payload = b"r" * 4000
    async with await BookieClient.connect(bookie.address) as client:
        assert (await client.bookie_info()).state == wire.BookieState.READ_ONLY
        with pytest.raises(ReadOnlyError, match="its disk usage is above the threshold"):
            await client.add_entry(MASTER_KEY, encode_test_entry(own, 0, payload))
        with pytest.raises(ReadOnlyError, match=f"ledger {elsewhere}'s does not name it for entry 0"):
            await client.add_entry(MASTER_KEY, encode_test_entry(elsewhere, 0, payload), recovery=True)

        with pytest.raises(ReadOnlyError, match="its disk reserve for recovery adds is used up"):
            for taken in range(QUOTA // len(payload)):  # the reserve ends long before the quota
                await client.add_entry(MASTER_KEY, encode_test_entry(own, taken, payload), recovery=True)
        entry_size = len(encode_test_entry(own, 0, payload))
        # Each was charged its journal and entry-log copies, within what the limit left above the ballast.
        assert taken > 0 and taken * 2 * entry_size <= 0.7 * QUOTA - BALLAST
        for entry_id in range(taken):
            assert await client.read_entry(own, entry_id) == encode_test_entry(own, entry_id, payload)


async def test_a_bookie_forced_read_only_takes_recovery_adds_of_its_own_ensemble(bookie_fleet, zk):
    """An operator's or a drain's switch: the storage is sound, so the ledgers it holds can still be closed."""
    (bookie,) = bookie_fleet.start(1, no_verify_ledgers=False)
    ledger_id = MetadataStore(zk).create(new_metadata([bookie.bookie_id], 1, 1))
    bookiestate.set_read_only(zk, bookie.bookie_id, "draining")
    async with await BookieClient.connect(bookie.address) as client:
        await eventually(lambda: _reports_read_only(client))
        with pytest.raises(ReadOnlyError, match="forced read-only in ZooKeeper"):
            await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 0, b"writer"))
        assert await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 0, b"tail"), recovery=True)
        assert await client.read_entry(ledger_id, 0) == encode_test_entry(ledger_id, 0, b"tail")


async def _reports_read_only(client: BookieClient) -> bool:
    return (await client.bookie_info()).state == wire.BookieState.READ_ONLY
