"""Recovery open against real bookies: fencing a live writer, closing at the right entry after a crash."""

from __future__ import annotations

import asyncio
import functools
import itertools

import pytest

from bookfleet import wire
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.connection import BookieClient, FencedError
from bookfleet.client.errors import LedgerFencedError, LedgerWriteError
from bookfleet.client.recovery import RecoveryError
from bookfleet.client.writer import WriterSettings
from bookfleet.client.writeset import quorum_covered, write_set
from bookfleet.meta.metadata import LedgerState
from tests.fixtures.bookies import stored_entries
from tests.fixtures.netfault import LinkProxy
from tests.fixtures.storage import damage_journal_record
from tests.fixtures.waiting import eventually


def test_quorum_coverage_rule():
    # E=3 Qw=3 Qa=2: a writer needs 2 of the 3, so 2 fenced bookies stop it; 1 does not.
    assert quorum_covered({0, 2}, 3, 3, 2) and not quorum_covered({1}, 3, 3, 2)
    # E=4 Qw=2 Qa=2: every pair (0,1) (1,2) (2,3) (3,0) needs one fenced member.
    assert quorum_covered({0, 2}, 4, 2, 2) and not quorum_covered({0, 1}, 4, 2, 2)
    # E=3 Qw=2 Qa=1: each write set needs both members fenced.
    assert quorum_covered({0, 1, 2}, 3, 2, 1) and not quorum_covered({0, 1}, 3, 2, 1)


async def test_recovery_fences_the_old_writer(bookie_fleet, zk_connect):
    bookie_fleet.start(3)
    addresses = [b.address for b in bookie_fleet.bookies]
    async with BookKeeper(zk_connect) as old, BookKeeper(zk_connect) as new:
        writer = await old.create_ledger(3, 3, 2, password=b"pw")
        for i in range(20):
            await writer.add(b"%d" % i)
        in_flight = [writer.append(b"in flight %d" % i) for i in range(5)]
        reader = await new.open_ledger(writer.ledger_id, b"pw", recovery=True)
        metadata = reader.metadata
        assert metadata.state == LedgerState.CLOSED
        assert 19 <= metadata.last_entry_id <= 24
        with pytest.raises(LedgerFencedError, match=f"ledger {writer.ledger_id} was fenced"):
            await writer.add(b"after fencing")
        for add in in_flight:  # each either made it before the fence (and is in the ledger) or failed
            if add.exception() is None:
                assert add.result() <= metadata.last_entry_id
        last = metadata.last_entry_id
        readable = [e.payload async for e in reader.entries()]
        assert readable[:20] == [b"%d" % i for i in range(20)] and len(readable) == last + 1
        for address in addresses:  # nothing written after fencing reached any bookie
            assert await stored_entries(address, writer.ledger_id, range(last + 1, last + 8)) == set()
        assert (await new.open_ledger(writer.ledger_id, b"pw", recovery=True)).metadata == metadata
        with pytest.raises(LedgerWriteError):
            await writer.close()


async def test_recovery_closes_at_the_last_entry_any_replica_holds(bookie_fleet, zk_connect):
    bookie_fleet.start(3)
    by_id = {b.bookie_id: b for b in bookie_fleet.bookies}
    settings = WriterSettings(add_timeout=0.5)
    async with BookKeeper(zk_connect, settings) as crashed, BookKeeper(zk_connect) as recoverer:
        writer = await crashed.create_ledger(3, 3, 2)
        for i in range(10):
            await writer.add(b"%d" % i)
        ensemble = [by_id[b] for b in writer.metadata.segments[0].bookies]
        for bookie in ensemble[1:]:
            bookie.kill9()
        lost = writer.append(b"10")  # reaches the one bookie left: stored, never acknowledged
        with pytest.raises(LedgerWriteError, match="cannot replace bookie"):
            await lost
        assert await eventually(lambda: stored_entries(ensemble[0].address, writer.ledger_id, [10])) == {10}

        with pytest.raises(RecoveryError, match="cannot fence ledger"):
            await recoverer.recover_ledger(writer.ledger_id)
        assert recoverer.ledger_metadata(writer.ledger_id).state == LedgerState.IN_RECOVERY
        for bookie in ensemble[1:]:
            bookie.start().wait_ready()
        metadata = await recoverer.recover_ledger(writer.ledger_id)
        assert metadata.state == LedgerState.CLOSED and metadata.last_entry_id == 10
        assert metadata.length == sum(len(b"%d" % i) for i in range(11))
        stored = {b.bookie_id: await stored_entries(b.address, writer.ledger_id, range(12)) for b in ensemble}
        # The survivor acknowledged everything; a killed bookie may have lagged behind the Qa acks before it died.
        assert stored[ensemble[0].bookie_id] == set(range(11))
        for entry in range(10):  # every acknowledged entry kept at least Qa replicas
            assert sum(entry in entries for entries in stored.values()) >= 2, (entry, stored)
        assert all(10 in entries for entries in stored.values())  # the recovered tail reached its whole write set


async def test_recovery_replaces_a_dead_write_set_bookie(bookie_fleet, zk_connect):
    """Qw == Qa with a write-set bookie killed -9: recovery changes the ensemble to re-add the tail to a full set."""
    bookie_fleet.start(2)
    by_id = {b.bookie_id: b for b in bookie_fleet.bookies}
    quiet = WriterSettings(idle_lac_delay=3600.0)  # no explicit LAC: the last entry stays past the bookies' LAC
    async with BookKeeper(zk_connect, quiet) as crashed, BookKeeper(zk_connect) as recoverer:
        writer = await crashed.create_ledger(2, 2, 2)
        acked = [await writer.add(b"%d" % i) for i in range(10)]
        assert acked == list(range(10))
        spare = bookie_fleet.add().start()
        spare.wait_ready()
        survivor, dead = (by_id[b] for b in writer.metadata.segments[0].bookies)
        dead.kill9()

        metadata = await recoverer.recover_ledger(writer.ledger_id)
        assert metadata.state == LedgerState.CLOSED and metadata.last_entry_id == 9
        assert metadata.length == sum(len(b"%d" % i) for i in range(10))
        # Entry 9 carried LAC 8, so it was the tail: re-added from LAC + 1 on the survivor and the spare.
        assert [(s.first_entry_id, list(s.bookies)) for s in metadata.segments] == [
            (0, [survivor.bookie_id, dead.bookie_id]),
            (9, [survivor.bookie_id, spare.bookie_id]),
        ]
        assert await stored_entries(spare.address, writer.ledger_id, range(12)) == {9}
        assert await stored_entries(survivor.address, writer.ledger_id, range(12)) == set(range(10))
        reader = await recoverer.open_ledger(writer.ledger_id)
        assert [e.payload async for e in reader.entries()] == [b"%d" % i for i in range(10)]


async def test_recovery_reads_fence_a_slow_write_set_bookie(bookie_fleet, zk_connect, link_proxy):
    """BookKeeper's TLA+ race: S's link loses the fence, B answers the fence and its LAC read and then fails, so
    recovery hears "no such entry" from S and A. Unless that read fenced S, the old writer's late add of the same
    entry then reaches S and, with B's copy, gets Qa acks past the lastEntryId recovery just closed at. A comes first
    for the LAC entry, so only the tail read itself can have fenced S."""
    proxies = await _bookies_behind_proxies(bookie_fleet, link_proxy, 3)
    ports = {b.bookie_id: b.port for b in bookie_fleet.bookies}
    password, last_acked = b"pw", 5
    async with BookKeeper(zk_connect) as old, BookKeeper(zk_connect) as new:
        writer = await old.create_ledger(3, 3, 2, password=password)
        for i in range(last_acked + 1):
            await writer.add(b"%d" % i)
        await writer.flush()
        await writer.detach()
        ensemble = writer.metadata.segments[-1].bookies
        entry_id = last_acked + 1
        s, b, a = (ensemble[p] for p in write_set(entry_id, 3, 3))  # recovery reads entry_id from S, B, A
        assert ensemble[write_set(last_acked, 3, 3)[0]] == a  # and its LAC entry from A first
        late = _late_entry(writer, password, entry_id)
        master_key = wire.master_key(password)
        async with await BookieClient.connect(f"127.0.0.1:{ports[b]}") as direct:
            await direct.add_entry(master_key, late)  # the old writer's add reached B only so far

        proxies[s].hold()
        proxies[b].on_answer(lambda: (proxies[b].cut(), proxies[s].release()), answers=2)
        metadata = await new.recover_ledger(writer.ledger_id, password)
        assert metadata.last_entry_id == last_acked

        async with await BookieClient.connect(f"127.0.0.1:{ports[s]}") as direct:
            with pytest.raises(FencedError):  # the old writer's add finally reaches S: it must be refused
                await direct.add_entry(master_key, late)
        reader = await new.open_ledger(writer.ledger_id, password)
        assert [e.payload async for e in reader.entries()] == [b"%d" % i for i in range(last_acked + 1)]


async def test_recovery_fences_every_bookie_of_the_last_segment(bookie_fleet, zk_connect):
    """E > Qw: recovery's reads fence only the replicas they ask, so only its explicit fence step reaches a bookie
    outside every write set it reads (here the fourth, which holds no entry of a one-entry ledger). Afterwards every
    bookie of the last segment must refuse the old writer's next add there."""
    by_id = {b.bookie_id: b for b in bookie_fleet.start(4)}
    password = b"pw"
    async with BookKeeper(zk_connect) as old, BookKeeper(zk_connect) as new:
        writer = await old.create_ledger(4, 2, 2, password=password)
        assert await writer.add(b"0") == 0
        await writer.detach()
        ensemble = writer.metadata.segments[-1].bookies
        for bookie in ensemble:  # connected before recovery, so its fences all leave at once (none still dialling)
            await new.pool.get(bookie)
        metadata = await new.recover_ledger(writer.ledger_id, password)
        assert (metadata.state, metadata.last_entry_id) == (LedgerState.CLOSED, 0)
        master_key = wire.master_key(password)
        for position, bookie in enumerate(ensemble):
            entry_id = next(e for e in itertools.count(1) if position in write_set(e, 4, 2))
            async with await BookieClient.connect(by_id[bookie].address) as direct:
                with pytest.raises(FencedError):
                    await direct.add_entry(master_key, _late_entry(writer, password, entry_id))


async def test_recovery_fails_rather_than_count_failing_replicas_as_missing(bookie_fleet, zk_connect, link_proxy):
    """Entry 6 is on A and B, Qa of E=Qw=3: acknowledged. When A's connection is refused and B stays silent while C
    says "no such entry", one "no" is not the Qw - Qa + 1 = 2 that prove entry 6 was never acknowledged: recovery
    must fail and leave the ledger IN_RECOVERY, not close at 5. Retried with A and B back, it closes at 6."""
    proxies = await _bookies_behind_proxies(bookie_fleet, link_proxy, 3)
    ports = {b.bookie_id: b.port for b in bookie_fleet.bookies}
    password, entry_id = b"pw", 6
    async with BookKeeper(zk_connect) as old, BookKeeper(zk_connect) as recoverer:
        writer = await old.create_ledger(3, 3, 2, password=password)
        for i in range(entry_id):
            await writer.add(b"%d" % i)
        await writer.detach()
        ensemble = writer.metadata.segments[-1].bookies
        a, b, c = (ensemble[p] for p in write_set(entry_id, 3, 3))  # recovery reads entry 6 from A, B, C
        assert ensemble[write_set(entry_id - 1, 3, 3)[0]] == c  # and its LAC entry 5 from C first
        for bookie in (a, b):
            async with await BookieClient.connect(f"127.0.0.1:{ports[bookie]}") as direct:
                await direct.add_entry(wire.master_key(password), _late_entry(writer, password, entry_id, b"6"))

        proxies[a].on_answer(proxies[a].cut, answers=2)  # A answers the fence and the LAC read, then is refused
        proxies[b].hold()  # B stays silent: its fence and reads time out
        with pytest.raises(RecoveryError, match=f"entry {entry_id} of ledger {writer.ledger_id} could not be read"):
            await recoverer.recover_ledger(writer.ledger_id, password)
        assert recoverer.ledger_metadata(writer.ledger_id).state == LedgerState.IN_RECOVERY

        await proxies[a].reopen()
        proxies[b].release()
        metadata = await recoverer.recover_ledger(writer.ledger_id, password)
        assert (metadata.state, metadata.last_entry_id) == (LedgerState.CLOSED, entry_id)
        reader = await recoverer.open_ledger(writer.ledger_id, password)
        assert [e.payload async for e in reader.entries()] == [b"%d" % i for i in range(entry_id + 1)]


async def test_recovery_never_takes_what_a_damaged_journal_lost_for_absence(bookie_fleet, zk_connect):
    """E=Qw=Qa=2, entries 0-19 acknowledged on A and B and held in their journals only; both stop and a byte flips
    amid each journal, in A's record of entry 10 and B's of entry 14. Answered "no such entry", their losses would
    close the ledger at 13 (both lack entry 14 once each drops the rest of its file) and lose six acknowledged
    entries. Neither can vouch that an entry it lacks was never written, so recovery fails and the ledger stays
    IN_RECOVERY: nobody can prove where it ends."""
    by_id = {b.bookie_id: b for b in bookie_fleet.start(4, flush_interval=3600)}  # two spares for the re-adds
    async with BookKeeper(zk_connect) as old, BookKeeper(zk_connect) as recoverer:
        writer = await old.create_ledger(2, 2, 2, password=b"pw")
        for i in range(20):
            await writer.add(b"%d" % i)
        await writer.detach()
        a, b = (by_id[bookie] for bookie in writer.metadata.segments[-1].bookies)
        for bookie, entry_id in ((a, 10), (b, 14)):
            bookie.kill9()
            damage_journal_record(bookie.journal_dir, writer.ledger_id, entry_id)
            bookie.start().wait_ready()

        unknown = f"entry 20 of ledger {writer.ledger_id} could not be read .*UNKNOWN_LEDGER_STATE"
        with pytest.raises(RecoveryError, match=unknown):
            await recoverer.recover_ledger(writer.ledger_id, b"pw")
        assert recoverer.ledger_metadata(writer.ledger_id).state == LedgerState.IN_RECOVERY


async def test_a_retried_recovery_reads_the_tail_where_the_writer_wrote_it(bookie_fleet, zk_connect, link_proxy):
    """Recovery's own ensemble changes reach ZooKeeper only with its close (BookKeeper's newEnsemblesFromRecovery).
    E=Qw=Qa=2 on A, B with entries 0-9 acknowledged on both: recovery 1 (B unreachable) replaces B by C to re-add
    entry 9, then C fails. Had it stored the segment [A, C] from entry 9, recovery 2 (A down, B back) would read
    entry 9 from A and C only, hear C's "no such entry" and close at 8 although B holds the acknowledged entry 9."""
    proxies = await _bookies_behind_proxies(bookie_fleet, link_proxy, 2)
    async with BookKeeper(zk_connect) as old, BookKeeper(zk_connect, WriterSettings(add_timeout=1.0)) as recoverer:
        writer = await old.create_ledger(2, 2, 2)
        assert [await writer.add(b"%d" % i) for i in range(10)] == list(range(10))
        await writer.detach()
        a, b = writer.metadata.segments[0].bookies
        spare = await _bookies_behind_proxies(bookie_fleet, link_proxy, 1)
        (c,) = spare
        proxies.update(spare)

        proxies[b].cut()
        proxies[c].hold()  # C is connected as B's replacement but never gets the re-added entry 9 ...
        proxies[c].on_request(proxies[c].cut)  # ... and fails as that add arrives
        with pytest.raises(RecoveryError, match="cannot replace bookie"):
            await recoverer.recover_ledger(writer.ledger_id)
        metadata = recoverer.ledger_metadata(writer.ledger_id)
        assert metadata.state == LedgerState.IN_RECOVERY
        assert metadata.segments == writer.metadata.segments

        proxies[a].cut()
        await proxies[b].reopen()
        await proxies[c].reopen()
        metadata = await recoverer.recover_ledger(writer.ledger_id)
        assert (metadata.state, metadata.last_entry_id) == (LedgerState.CLOSED, 9)
        assert [(s.first_entry_id, list(s.bookies)) for s in metadata.segments] == [(0, [a, b]), (9, [c, b])]
        reader = await recoverer.open_ledger(writer.ledger_id)
        assert [e.payload async for e in reader.entries()] == [b"%d" % i for i in range(10)]


async def test_recovery_stores_each_of_its_ensemble_changes_with_the_close(bookie_fleet, zk_connect, link_proxy):
    """Two ensemble changes in one recovery: B is unreachable from the start, and the spare that replaces it for the
    re-added tail (entries 5-9, which all carry LAC 4) fails at its third add. The close stores both new segments,
    each from the entry it took over at, with lastEntryId."""
    proxies = await _bookies_behind_proxies(bookie_fleet, link_proxy, 2)
    async with BookKeeper(zk_connect) as old, BookKeeper(zk_connect) as recoverer:
        writer = await old.create_ledger(2, 2, 2)
        for i in range(5):
            await writer.add(b"%d" % i)
        assert await asyncio.gather(*(writer.append(b"%d" % i) for i in range(5, 10))) == list(range(5, 10))
        await writer.detach()
        ensemble = writer.metadata.segments[0].bookies
        spares = await _bookies_behind_proxies(bookie_fleet, link_proxy, 2)
        proxies.update(spares)
        failed: list[str] = []

        def fail_at_third_add(spare: str) -> None:
            proxies[spare].cut()
            failed.append(spare)
            for other in spares.keys() - {spare}:
                proxies[other].on_request(lambda: None)  # the other spare, which replaces it, stays up

        for spare in spares:
            proxies[spare].on_request(functools.partial(fail_at_third_add, spare), requests=3)
        proxies[ensemble[1]].cut()
        metadata = await recoverer.recover_ledger(writer.ledger_id)
        assert (metadata.state, metadata.last_entry_id) == (LedgerState.CLOSED, 9)
        (first,) = failed
        (second,) = spares.keys() - {first}
        assert [(s.first_entry_id, s.bookies) for s in metadata.segments] == [
            (0, ensemble),
            (5, (ensemble[0], first)),
            (7, (ensemble[0], second)),
        ]
        reader = await recoverer.open_ledger(writer.ledger_id)
        assert [e.payload async for e in reader.entries()] == [b"%d" % i for i in range(10)]


async def test_recovery_takes_its_lac_from_verified_entries_not_bare_numbers(bookie_fleet, zk_connect):
    """A bookie reporting a LAC beyond every entry (a WRITE_LAC nobody's entries back) must not make recovery start
    past the real tail (it used to fail for good, leaving the ledger IN_RECOVERY)."""
    bookie_fleet.start(3)
    async with BookKeeper(zk_connect) as old, BookKeeper(zk_connect) as new:
        writer = await old.create_ledger(3, 3, 2, password=b"pw")
        for i in range(6):
            await writer.add(b"%d" % i)
        await writer.flush()
        await writer.detach()
        async with await BookieClient.connect(bookie_fleet.bookies[0].address) as direct:
            await direct.write_lac(wire.master_key(b"pw"), writer.ledger_id, 100)
        metadata = await new.recover_ledger(writer.ledger_id, b"pw")
        assert (metadata.state, metadata.last_entry_id) == (LedgerState.CLOSED, 5)


async def _bookies_behind_proxies(bookie_fleet, link_proxy, count: int) -> dict[str, LinkProxy]:
    """`count` more bookies, each registered with the address of its own proxy: bookie id -> proxy, all ready."""
    proxies, started = {}, []
    for _ in range(count):
        proxy = await link_proxy(0)
        bookie = bookie_fleet.add(advertised_address=proxy.address)
        proxy.target_port = bookie.port
        proxies[bookie.bookie_id] = proxy
        started.append(bookie.start())
    for bookie in started:
        bookie.wait_ready()
    return proxies


def _late_entry(writer, password: bytes, entry_id: int, payload: bytes = b"late") -> bytes:
    """Entry `entry_id` as the old writer would send it next (its LAC the entry before, as after a flush)."""
    digester = wire.Digester(writer.metadata.digest_type, password)
    return wire.encode_entry(digester, writer.ledger_id, entry_id, entry_id - 1, writer.length + len(payload), payload)
