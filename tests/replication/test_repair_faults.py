"""Repair under faults: it never declares data lost, nor writes a replacement into the metadata, while a replica
might still answer. Real ZooKeeper, real bookie processes, a real local SparkSession."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import time

import pytest

from bookfleet import wire
from bookfleet.bench.repair import LedgerShape, fill_ledgers, verify_replicas
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.connection import BookieClient
from bookfleet.client.writeset import write_set
from bookfleet.meta.metadata import LedgerState, MetadataStore, new_metadata
from bookfleet.meta.registry import BookieRegistry
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from bookfleet.replication.auditor import mark_lost_bookie
from bookfleet.replication.spark_repair import RepairJob, RepairSummary, run_repair
from tests.fixtures.storage import damage_journal_record
from tests.fixtures.strandedentry import PASSWORD, copies_of, ledger_with_a_stranded_entry

pytestmark = pytest.mark.spark

PAIR = LedgerShape(ensemble_size=2, write_quorum=2, ack_quorum=2)
DIGESTER = wire.Digester(wire.DigestType.CRC32C, b"")
MASTER_KEY = wire.master_key(b"")


@contextlib.contextmanager
def frozen(bookie):
    """SIGSTOP the bookie (disk intact, silent, its session expiring), SIGCONT on the way out."""
    os.kill(bookie.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(bookie.process.pid, signal.SIGCONT)


def registered(zk) -> set[str]:
    return {info.bookie_id for info in BookieRegistry(zk).all()}


def test_a_frozen_survivor_is_waited_for_never_declared_lost(spark, zk, zk_connect, bookie_fleet):
    lost, survivor = bookie_fleet.start(2, zk_session_timeout=2)
    expected = asyncio.run(fill_ledgers(zk_connect, 1, 100, 256, PAIR))
    (ledger_id,) = expected
    bookie_fleet.start(2)
    store = MetadataStore(zk)
    before = store.read(ledger_id)[0]
    lost.kill9()
    assert mark_lost_bookie(zk, lost.bookie_id) == [ledger_id]
    under_replication = UnderReplication(zk)

    with frozen(survivor):
        wait_for(lambda: survivor.bookie_id not in registered(zk), 60, "the frozen bookie's session to expire")
        during = run_repair(zk_connect)
        assert during.data_loss == {} and during.entries == 0
        assert during.failures and survivor.bookie_id in during.failures[0]
        assert under_replication.ledger_ids() == [ledger_id]  # still marked, retried later
        assert store.read(ledger_id)[0] == before  # no replacement that holds nothing

    wait_for(lambda: survivor.bookie_id in registered(zk), 60, "the thawed bookie to register again")
    after = run_repair(zk_connect)
    assert (after.failures, after.data_loss, after.ledgers) == ([], {}, 1)
    assert under_replication.ledger_ids() == [] and under_replication.data_losses() == []
    assert lost.bookie_id not in store.read(ledger_id)[0].bookies()
    assert asyncio.run(verify_replicas(zk_connect, expected)) == []
    assert asyncio.run(read_back(zk_connect, ledger_id)) == expected[ledger_id]


def test_a_slow_bookie_a_writer_named_is_waited_for_never_declared_lost(spark, zk, zk_connect, bookie_fleet):
    """The only other copy is on a bookie a writer named for missed entries, alive but too slow to answer: the
    repair fails for a later retry, with no DATA_LOSS and the live copy kept in the metadata."""
    lost, slow, *_ = bookie_fleet.start(4)
    ledger_id = handmade_ledger(zk, [lost, slow], 10, lambda ledger_id, entry_id, _: good_entry(ledger_id, entry_id))
    lost.kill9()
    mark_lost_bookie(zk, lost.bookie_id)
    under_replication = UnderReplication(zk)
    under_replication.mark(ledger_id, [slow.bookie_id], missed_entries=True)
    store = MetadataStore(zk)
    before = store.read(ledger_id)[0]

    with frozen(slow):
        during = run_repair(zk_connect, open_grace_s=0)
        assert during.data_loss == {} and during.entries == 0
        assert during.failures and slow.bookie_id in during.failures[0]
        assert under_replication.ledger_ids() == [ledger_id] and under_replication.data_losses() == []
        assert store.read(ledger_id)[0] == before  # the slow bookie's copy is still named

    after = run_repair(zk_connect, open_grace_s=0)
    assert (after.failures, after.data_loss, after.entries) == ([], {}, 10)
    assert not {lost.bookie_id, slow.bookie_id} & store.read(ledger_id)[0].bookies()
    assert under_replication.ledger_ids() == [] and under_replication.data_losses() == []


async def read_back(zk_connect: str, ledger_id: int) -> list[bytes]:
    async with BookKeeper(zk_connect) as bookkeeper:
        reader = await bookkeeper.open_ledger(ledger_id)
        return [hashlib.sha256(entry.payload).digest() async for entry in reader.entries()]


def handmade_ledger(zk, bookies, entries: int, copies) -> int:
    """A closed E=Qw=Qa=2 ledger on `bookies`, written entry by entry: `copies(ledger_id, entry_id, bookie_id)` is
    the raw entry that bookie gets (None: nothing), as a faulty writer or disk would leave the replicas."""
    store = MetadataStore(zk)
    ids = [bookie.bookie_id for bookie in bookies]
    ledger_id = store.create(new_metadata(ids, write_quorum=2, ack_quorum=2))

    async def write() -> None:
        for bookie in bookies:
            async with await BookieClient.connect(bookie.address) as client:
                for entry_id in range(entries):
                    raw = copies(ledger_id, entry_id, bookie.bookie_id)
                    if raw is not None:
                        await client.add_entry(MASTER_KEY, raw)

    asyncio.run(write())
    metadata, version = store.read(ledger_id)
    store.update(ledger_id, metadata.with_closed(entries - 1, entries * 100), version)
    return ledger_id


def good_entry(ledger_id: int, entry_id: int) -> bytes:
    return wire.encode_entry(DIGESTER, ledger_id, entry_id, entry_id - 1, (entry_id + 1) * 100, bytes(100))


def corrupt_entry(ledger_id: int, entry_id: int) -> bytes:
    raw = bytearray(good_entry(ledger_id, entry_id))
    raw[-1] ^= 0xFF  # the payload no longer matches its digest
    return bytes(raw)


@pytest.mark.parametrize("damage", ["lacks", "corrupt"])
def test_data_loss_when_the_last_survivor_lacks_the_entry_or_holds_it_corrupt(
    spark, zk, zk_connect, bookie_fleet, damage
):
    lost, survivor, spare = bookie_fleet.start(3)

    def copies(ledger_id: int, entry_id: int, bookie_id: str) -> bytes | None:
        if bookie_id == survivor.bookie_id and entry_id >= 5:
            return corrupt_entry(ledger_id, entry_id) if damage == "corrupt" else None
        return good_entry(ledger_id, entry_id)

    ledger_id = handmade_ledger(zk, [lost, survivor], 10, copies)
    lost.kill9()
    mark_lost_bookie(zk, lost.bookie_id)

    summary = run_repair(zk_connect)

    assert summary.failures == [] and summary.data_loss == {ledger_id: [5, 6, 7, 8, 9]}
    assert summary.entries == 5  # the good ones went to the replacement
    metadata = MetadataStore(zk).read(ledger_id)[0]
    assert metadata.segments[0].bookies == (spare.bookie_id, survivor.bookie_id)
    assert UnderReplication(zk).ledger_ids() == []
    assert [r.entries for r in UnderReplication(zk).data_losses()] == [(5, 6, 7, 8, 9)]
    assert asyncio.run(entries_held(spare, ledger_id, 9)) == [0, 1, 2, 3, 4]


def test_a_survivor_whose_journal_lost_an_entry_is_no_proof_of_data_loss(spark, zk, zk_connect, bookie_fleet):
    """The survivor's journal lost entry 5's record after it was synced (a flipped byte, nothing checkpointed yet):
    it cannot vouch that it never held entry 5, so repair must not count it as lacking and declare data loss; the
    ledger fails for a later run, marker kept."""
    lost, survivor, _spare = bookie_fleet.start(3, flush_interval=3600)
    ledger_id = handmade_ledger(zk, [lost, survivor], 10, lambda ledger, entry, bookie: good_entry(ledger, entry))
    survivor.kill9()
    damage_journal_record(survivor.journal_dir, ledger_id, 5)
    survivor.start().wait_ready()
    lost.kill9()
    mark_lost_bookie(zk, lost.bookie_id)

    summary = run_repair(zk_connect)

    assert summary.data_loss == {} and UnderReplication(zk).data_losses() == []
    assert any("UNKNOWN_LEDGER_STATE" in failure for failure in summary.failures), summary.failures
    assert UnderReplication(zk).ledger_ids() == [ledger_id]


async def entries_held(bookie, ledger_id: int, last: int) -> list[int]:
    """Ids of the verified entries 0..last the bookie holds."""
    async with await BookieClient.connect(bookie.address) as client:
        raws = await client.read_range(ledger_id, 0, last)
    return [wire.decode_entry(DIGESTER, raw).entry_id for raw in raws]


def test_a_live_writer_keeps_writing_while_its_replaced_bookie_is_repaired(spark, zk, zk_connect, bookie_fleet):
    """The lost bookie sits only in a closed segment (the writer replaced it): repair copies that segment and leaves
    the ledger open, so its writer never sees LedgerFencedError (BookKeeper's rule)."""
    bookies = {bookie.bookie_id: bookie for bookie in bookie_fleet.start(4)}
    store = MetadataStore(zk)

    async def scenario() -> tuple[int, list[bytes], RepairSummary, str]:
        async with BookKeeper(zk_connect) as bookkeeper:
            writer = await bookkeeper.create_ledger(3, 3, 2)
            payloads: list[bytes] = []

            async def write(count: int) -> None:
                for _ in range(count):
                    payload = os.urandom(100)
                    await writer.add(payload)
                    payloads.append(payload)

            await write(20)
            victim = writer.metadata.segments[0].bookies[0]
            bookies[victim].kill9()
            await write(20)
            # The writer goes on at Qa and replaces the victim once it has noticed (delayed ensemble change); from
            # then on the victim sits only in the first, closed segment.
            deadline = time.monotonic() + 120
            while not (len(writer.metadata.segments) == 2 and victim not in writer.metadata.segments[-1].bookies):
                assert time.monotonic() < deadline, f"the writer never replaced {victim}: {writer.metadata.segments}"
                await write(1)
            mark_lost_bookie(zk, victim)

            repair = asyncio.ensure_future(asyncio.to_thread(run_repair, zk_connect, open_grace_s=0))
            while not repair.done():
                await write(5)  # the writer goes on throughout the repair
            summary = await repair
            await write(20)
            await writer.close()
            return writer.ledger_id, [hashlib.sha256(p).digest() for p in payloads], summary, victim

    ledger_id, digests, summary, victim = asyncio.run(scenario())
    assert (summary.ledgers, summary.failures, summary.data_loss) == (1, [], {})
    metadata = store.read(ledger_id)[0]
    assert metadata.is_closed and metadata.last_entry_id == len(digests) - 1  # closed by its writer, not fenced
    assert victim not in metadata.bookies() and UnderReplication(zk).ledger_ids() == []
    assert asyncio.run(verify_replicas(zk_connect, {ledger_id: digests})) == []


def test_an_open_ledger_is_not_fenced_when_no_bookie_could_replace_the_lost_one(zk, zk_connect, bookie_fleet):
    """Its writer may go on at Qa (delayed ensemble change); fencing it would stop the writer and repair nothing."""
    victim, *_ = bookie_fleet.start(3)

    async def open_ledger() -> int:
        async with BookKeeper(zk_connect) as bookkeeper:
            writer = await bookkeeper.create_ledger(3, 3, 2)
            for _ in range(5):
                await writer.add(b"entry")
            return writer.ledger_id  # left OPEN, as by a writer still at work

    ledger_id = asyncio.run(open_ledger())
    victim.kill9()
    mark_lost_bookie(zk, victim.bookie_id)
    job = RepairJob(zk, open_grace_s=0)

    assert job.prepare(None) == []

    assert job.summary.pending == [ledger_id] and "not fencing its writer" in job.summary.failures[0]
    assert MetadataStore(zk).read(ledger_id)[0].state == LedgerState.OPEN
    assert UnderReplication(zk).ledger_ids() == [ledger_id]


def test_a_bookie_a_writer_went_on_without_is_repaired_although_it_answers(spark, zk, zk_connect, bookie_fleet):
    """Delayed ensemble change: the writer kept writing at Qa while one bookie missed entries, and marked it."""
    kept, skipped, spare = bookie_fleet.start(3)

    def copies(ledger_id: int, entry_id: int, bookie_id: str) -> bytes | None:
        missed = bookie_id == skipped.bookie_id and 3 <= entry_id <= 6
        return None if missed else good_entry(ledger_id, entry_id)

    ledger_id = handmade_ledger(zk, [kept, skipped], 10, copies)
    UnderReplication(zk).mark(ledger_id, [skipped.bookie_id], missed_entries=True)

    summary = run_repair(zk_connect)

    assert (summary.failures, summary.data_loss, summary.entries) == ([], {}, 10)
    assert MetadataStore(zk).read(ledger_id)[0].segments[0].bookies == (kept.bookie_id, spare.bookie_id)
    assert asyncio.run(entries_held(spare, ledger_id, 9)) == list(range(10))
    assert UnderReplication(zk).ledger_ids() == []


def test_a_repair_after_a_reopen_copies_the_new_writers_entries_only(spark, zk, zk_connect, bookie_fleet):
    """Writer B reopened a ledger while the bookie holding writer A's unacknowledged entry 11 was paused; later a
    bookie of both segments is lost. Every copy the repair makes (one onto that very bookie, the only one left to
    take a place in B's segment) is B's, and no replica anywhere in the metadata holds A's."""
    bookies = {bookie.bookie_id: bookie for bookie in bookie_fleet.start(4)}
    ledger_id, holder = asyncio.run(ledger_with_a_stranded_entry(zk_connect, bookies))

    async def reopen_and_close() -> None:
        async with BookKeeper(zk_connect) as bk:
            writer = await bk.reopen_ledger(ledger_id, PASSWORD)
            for entry_id in range(11, 16):
                await writer.add(b"B-%d" % entry_id)
            await writer.close()

    with frozen(holder):
        asyncio.run(reopen_and_close())
    store = MetadataStore(zk)
    lost = bookies[store.read(ledger_id)[0].segments[0].bookies[0]]
    lost.kill9()
    assert mark_lost_bookie(zk, lost.bookie_id) == [ledger_id]
    summary = run_repair(zk_connect)  # the ledger's password comes from its metadata
    assert (summary.ledgers, summary.failures, summary.data_loss) == (1, [], {}), summary
    repaired = store.read(ledger_id)[0]
    assert lost.bookie_id not in {bookie for segment in repaired.segments for bookie in segment.bookies}
    expected = [b"A-%d" % e for e in range(11)] + [b"B-%d" % e for e in range(11, 16)]
    for entry_id, payload in enumerate(expected):
        replicas = [repaired.segment_for(entry_id).bookies[p] for p in write_set(entry_id, 3, 3)]
        assert asyncio.run(copies_of(bookies, ledger_id, entry_id, replicas)) == [payload] * 3, entry_id
