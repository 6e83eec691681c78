"""A bookie's garbage collection against ZooKeeper, on real bookie processes: a copy the metadata no longer names (the
bookie came back after its ledgers were repaired elsewhere) is collected, but only when no repair, recovery or loss
could still need it."""

from __future__ import annotations

import asyncio

from bookfleet.bookie.gc import GcReport
from bookfleet.bookie.zkgc import LedgerCollector
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.connection import BookieClient, NoSuchLedgerOnBookieError
from bookfleet.fleet import BookieFleet
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import LedgerMetadata, LedgerState, MetadataStore, Segment
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for

REPAIRED_ELSEWHERE = "elsewhere:3181"


async def holds(address: str, ledger_id: int) -> bool:
    async with await BookieClient.connect(address) as client:
        try:
            await client.read_entry(ledger_id, 0)
        except NoSuchLedgerOnBookieError:
            return False
        return True


async def test_a_copy_no_metadata_names_any_more_is_collected_only_when_nothing_may_need_it(
    bookie_fleet, zk_connect, zk
):
    settings = {"gc_interval": 0.2, "gc_grace": 0}
    address = {b.bookie_id: b.address for b in bookie_fleet.start(3, **settings)}
    cases = ("marked", "locked", "lost-data", "open", "moved")
    async with BookKeeper(zk_connect) as bk:
        writers = {case: await bk.create_ledger(3, 3, 2) for case in cases}
        for case, writer in writers.items():
            await asyncio.gather(*(writer.append(f"{case} {i}".encode()) for i in range(5)))
            if case != "open":
                await writer.close()
        await writers["open"].detach()
    (spare,) = bookie_fleet.start(1, **settings)
    address[spare.bookie_id] = spare.address
    store, under_replication = MetadataStore(zk), UnderReplication(zk)
    ledger = {case: writer.ledger_id for case, writer in writers.items()}
    under_replication.mark(ledger["marked"], ["another-bookie"])  # a repair of this ledger is still to come
    assert under_replication.acquire(ledger["locked"], "repair:test")  # a repair is copying right now
    under_replication.mark_data_loss(ledger["lost-data"], [4])  # the copy no metadata names may be the last one
    replaced = sorted(address)[0] if sorted(address)[0] != spare.bookie_id else sorted(address)[1]
    for ledger_id in ledger.values():  # what a repair does: the copy made on the spare, swapped in ("moved" last)
        metadata, version = store.read(ledger_id)
        swapped = (Segment(first_entry_id=0, bookies=tuple(spare.bookie_id if bookie == replaced else bookie
                                                           for bookie in metadata.segments[0].bookies)),)
        store.update(ledger_id, metadata.model_copy(update={"segments": swapped}), version)

    async with asyncio.timeout(60):
        while await holds(address[replaced], ledger["moved"]):
            await asyncio.sleep(0.1)
    # The pass that found "moved" unnamed scanned the metadata after every swap: it judged every case. None of the
    # others lost its copy, nor did any bookie still named lose its own.
    for case in cases[:-1]:
        assert await holds(address[replaced], ledger[case]), case
    for case, ledger_id in ledger.items():
        for bookie in store.read(ledger_id)[0].segments[0].bookies:
            if bookie != spare.bookie_id:
                assert await holds(address[bookie], ledger_id), (case, bookie)
    # The pass releases its lock of "moved" after the copy went (a thread of its own): a busy machine shows the gap.
    await asyncio.to_thread(wait_for, lambda: not under_replication.is_locked(ledger["moved"]), 30, "its release")
    assert under_replication.is_locked(ledger["locked"])


class HeldCopies:
    """A bookie's storage as the collector sees it: the ledgers it holds, and a collection that keeps `live`."""

    def __init__(self, ledger_ids: set[int]):
        self.held = set(ledger_ids)

    def ledger_ids(self) -> set[int]:
        return set(self.held)

    async def collect_garbage(self, live: set[int]) -> GcReport:
        deleted, self.held = self.held - live, self.held & live
        return GcReport(ledgers_deleted=sorted(deleted))


async def test_a_restarted_bookie_counts_the_grace_of_what_it_holds_from_its_start_not_from_its_first_pass(zk):
    """A bookie whose pod is started again when its zone returns holds copies repaired away meanwhile: with the
    grace equal to the interval (the operator's defaults) its first pass, one interval after the start, collects them;
    counted from that first pass, only the second did (two intervals after the return, on the local cluster)."""
    bookie, interval = "returning-bookie:3181", 60.0
    zk.create(zkpaths.cookie(bookie), b"{}", makepath=True)
    store = MetadataStore(zk)
    repaired_away = store.create(LedgerMetadata(
        ensemble_size=3, write_quorum=3, ack_quorum=2, state=LedgerState.CLOSED, last_entry_id=4, length=50,
        segments=(Segment(first_entry_id=0, bookies=("b1:3181", "b2:3181", "b3:3181")),)))
    storage, now = HeldCopies({repaired_away}), [1000.0]
    collector = LedgerCollector(storage, zk, bookie, interval, grace=interval, clock=lambda: now[0])
    collector.start()
    try:
        now[0] += interval  # the loop's first pass
        await collector.collect_once()
    finally:
        await collector.stop()
    assert storage.held == set()
    assert not UnderReplication(zk).is_locked(repaired_away)  # the lock it took to collect is released


async def test_a_long_id_ledger_and_one_whose_metadata_does_not_parse_are_never_collected(zk):
    """A Java client's ledger of id 2^31 + 7 lives in BookKeeper's long layout, /ledgers/000/0000/0021/4748/L3655,
    which the walk of the live ledgers must find; and a record this bookie cannot parse proves nothing about which
    bookies hold the ledger. Both copies stay, pass after pass."""
    bookie, interval = "holder:3181", 60.0
    zk.create(zkpaths.cookie(bookie), b"{}", makepath=True)
    long_id, unreadable = 2**31 + 7, 12
    names_holder = LedgerMetadata(
        ensemble_size=3, write_quorum=3, ack_quorum=2, state=LedgerState.CLOSED, last_entry_id=4, length=50,
        segments=(Segment(first_entry_id=0, bookies=(bookie, "b2:3181", "b3:3181")),))
    zk.create("/ledgers/000/0000/0021/4748/L3655", names_holder.encode(), makepath=True)
    zk.create(zkpaths.ledger(unreadable), b"BookieMetadataFormatVersion\t3\n\x05\x08", makepath=True)
    storage, now = HeldCopies({long_id, unreadable}), [1000.0]
    collector = LedgerCollector(storage, zk, bookie, interval, grace=interval, clock=lambda: now[0])
    collector.start()
    try:
        for _ in range(2):
            now[0] += interval
            await collector.collect_once()
    finally:
        await collector.stop()
    assert storage.held == {long_id, unreadable}


async def test_a_bookie_cut_from_zookeeper_collects_what_was_repaired_away_as_soon_as_it_rejoins(
        zk_connect, zk, link_proxy, tmp_path):
    """A bookie cut off (a zone outage) longer than its session comes back on a new session holding copies of ledgers
    repaired elsewhere meanwhile: it collects them when it rejoins, not an interval later (here an hour: the test
    waits a minute), with every check a pass makes (a copy still marked under-replicated stays)."""
    hosts, chroot = zk_connect.split("/", 1)
    to_zookeeper = await link_proxy(int(hosts.rsplit(":", 1)[1]))
    fleet = BookieFleet(f"{to_zookeeper.address}/{chroot}", tmp_path / "cut")
    try:
        bookie = fleet.add(gc_interval=3600, gc_grace=0, zk_session_timeout=4).start()
        await asyncio.to_thread(bookie.wait_ready, 60)  # off the loop: its ZooKeeper traffic goes through the proxy
        async with BookKeeper(zk_connect) as bk:
            writers = [await bk.create_ledger(1, 1, 1) for _ in ("moved", "marked")]
            for writer in writers:
                await asyncio.gather(*(writer.append(f"entry {i}".encode()) for i in range(3)))
                await writer.close()
        moved, marked = (writer.ledger_id for writer in writers)
        assert zk.exists(zkpaths.available(bookie.bookie_id))
        to_zookeeper.cut()
        async with asyncio.timeout(60):  # its session expires: the registration goes
            while zk.exists(zkpaths.available(bookie.bookie_id)):
                await asyncio.sleep(0.1)
        store = MetadataStore(zk)
        for ledger_id in (moved, marked):  # repaired elsewhere while it was gone; one still marked
            metadata, version = store.read(ledger_id)
            elsewhere = (Segment(first_entry_id=0, bookies=(REPAIRED_ELSEWHERE,)),)
            store.update(ledger_id, metadata.model_copy(update={"segments": elsewhere}), version)
        UnderReplication(zk).mark(marked, [REPAIRED_ELSEWHERE])
        assert await holds(bookie.address, moved) and await holds(bookie.address, marked)

        await to_zookeeper.reopen()
        async with asyncio.timeout(60):
            while await holds(bookie.address, moved):
                await asyncio.sleep(0.2)
        assert await holds(bookie.address, marked)
        async with asyncio.timeout(60):  # it rejoined: registered again on its new session
            while not zk.exists(zkpaths.available(bookie.bookie_id)):
                await asyncio.sleep(0.1)
    finally:
        await asyncio.to_thread(fleet.close)
