"""A stock Apache BookKeeper bookie beside three bookfleet bookies, in one ZooKeeper: BookKeeper's Java client and
bookfleet's each write ledgers whose ensembles hold both kinds, kill one bookie of the ensemble with SIGKILL mid-write
(a bookfleet one, the Java one), replace it by an ensemble change, close, and read every acknowledged entry back
with both clients. bookfleet's client also recovers (fencing through the Java bookie) and reopens such a ledger,
never sending the Java bookie an operation of bookfleet's own (which a stock bookie cannot parse: it closes the
connection). One fleet and one Java bookie for the module; a killed bookie is started again by the next test that
needs it (the two that kill the Java bookie are apart, the last of them last: one restart, not two)."""

from __future__ import annotations

import asyncio
import contextlib
import re

import pytest

from bookfleet import polling, wire
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.errors import LedgerWriteError
from bookfleet.client.writer import LedgerWriter
from bookfleet.fleet import StandaloneCluster
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore
from tests.interop.javaside import JavaBookie, facts, java, ledger_read_from_java, requires_java, write_conf
from tests.interop.repairing import repaired_after_killing

pytestmark = [requires_java, pytest.mark.xdist_group("mixed-ensembles")]  # one fleet (and JVM set) for the module

ENTRIES = 300
KILL_AFTER = 100
"""The entry whose acknowledgement kills the victim: the adds after it (up to 20 in flight) meet a dead bookie."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with StandaloneCluster(tmp_path_factory.mktemp("mixed"), bookies=3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def java_bookie(fleet, tmp_path_factory):
    # a short ZooKeeper session: a restart after a kill -9 waits for the dead process's registration to expire
    bookie = JavaBookie(tmp_path_factory.mktemp("java-bookie"), fleet.zk, zkTimeout=6000)
    with zkclient.session(fleet.zk) as zk:
        bookie.start(zk)
    yield bookie
    bookie.stop()


@pytest.fixture
def whole_fleet(fleet, java_bookie):
    """The fleet with every bookie running: one an earlier test killed is started again before the test that needs
    it (the Java bookie once its old registration expired), not after each test, so the module's last kill costs no
    restart."""
    for bookie in fleet.fleet.bookies:
        if not bookie.running:
            bookie.start().wait_ready()
    if not java_bookie.running:
        registration = f"/ledgers/available/{java_bookie.bookie_id}"
        with zkclient.session(fleet.zk) as zk:
            polling.wait_for(lambda: not zk.exists(registration), 60, "the killed Java bookie's registration to expire")
            java_bookie.start(zk)
    return fleet


def ensembles(printed: str) -> dict[int, list[str]]:
    """`{0=[a, b, c], 105=[a, d, c]}` as the Java client prints a ledger's ensembles."""
    return {int(first): bookies.split(", ") for first, bookies in re.findall(r"(\d+)=\[([^\]]*)\]", printed)}


PASSWORD = b"mixed ensembles"
IN_FLIGHT = 20


def assert_bookfleet_bookies_unharmed(fleet) -> None:
    for bookie in fleet.fleet.bookies:
        assert "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


def bookfleet_payload(entry_id: int) -> bytes:
    return b"bookfleet entry %d " % entry_id * (entry_id % 4 + 1)


async def mixed_ledger(bk: BookKeeper, shape: tuple[int, int, int], need: list[str]) -> LedgerWriter:
    """A new ledger of bookfleet's client whose ensemble names every bookie of `need` (others are deleted)."""
    for _ in range(50):
        writer = await bk.create_ledger(*shape, password=PASSWORD)
        if set(need) <= set(writer.metadata.segments[0].bookies):
            return writer
        await writer.close()
        await asyncio.to_thread(bk.delete_ledger, writer.ledger_id)
    raise AssertionError(f"no ensemble of 50 held {need}")


async def write(writer: LedgerWriter, entries: range, kill_after: int | None = None, kill=None) -> list[int]:
    """Add the payloads of `entries` with up to IN_FLIGHT pending; `kill()` once entry `kill_after` is acknowledged.
    The entry ids acknowledged (every add must succeed)."""
    adds = []
    for entry_id in entries:
        adds.append(writer.append(bookfleet_payload(entry_id)))
        if len(adds) > IN_FLIGHT and await adds[-IN_FLIGHT - 1] == kill_after:
            kill()
    return list(await asyncio.gather(*adds))


async def read_from_bookfleet(zk: str, ledger_id: int) -> list[bytes]:
    async with BookKeeper(zk) as bk:
        reader = await bk.open_ledger(ledger_id, PASSWORD)
        return [entry.payload async for entry in reader.entries()]


def assert_read_whole_by_both_clients(zk: str, ledger_id: int, entries: int) -> None:
    expected = [bookfleet_payload(entry_id) for entry_id in range(entries)]
    assert asyncio.run(read_from_bookfleet(zk, ledger_id)) == expected
    assert ledger_read_from_java(zk, ledger_id, wire.DigestType.CRC32C, PASSWORD) == expected


@pytest.mark.parametrize("victim_kind", ["bookfleet", "java"])  # the Java bookie's kill last
def test_bookfleet_writes_a_mixed_ensemble_and_loses_no_acknowledged_entry_when_either_kind_is_killed(
    whole_fleet, java_bookie, victim_kind
):
    """E3/Qw3/Qa2 on two bookfleet bookies and the Java one, written by bookfleet's client; the victim killed with
    SIGKILL mid-write is replaced by the fourth bookie in an ensemble change; both clients read every entry back."""
    fleet = whole_fleet
    bookfleet_victim = fleet.fleet.bookies[1]
    victim_id, kill = (
        (java_bookie.bookie_id, java_bookie.kill9) if victim_kind == "java"
        else (bookfleet_victim.bookie_id, bookfleet_victim.kill9)
    )

    async def run() -> tuple[int, list[int]]:
        async with BookKeeper(fleet.zk) as bk:
            writer = await mixed_ledger(bk, (3, 3, 2), list(dict.fromkeys([java_bookie.bookie_id, victim_id])))
            acked = await write(writer, range(ENTRIES), KILL_AFTER, kill)
            await writer.close()
            return writer.ledger_id, acked

    ledger_id, acked = asyncio.run(run())
    assert acked == list(range(ENTRIES))
    with zkclient.session(fleet.zk) as zk:
        metadata = MetadataStore(zk).read(ledger_id)[0]
    assert metadata.is_closed and metadata.last_entry_id == ENTRIES - 1
    first, *later = metadata.segments
    assert java_bookie.bookie_id in first.bookies and later and victim_id not in later[-1].bookies, metadata
    assert_read_whole_by_both_clients(fleet.zk, ledger_id, ENTRIES)
    assert_bookfleet_bookies_unharmed(fleet)


def test_bookfleet_recovers_a_ledger_fencing_it_through_the_java_bookie(whole_fleet, java_bookie):
    """A writer holds an E3/Qw3/Qa2 ledger on two bookfleet bookies and the Java one open; one bookfleet bookie of
    its ensemble is stopped, so fencing needs the Java bookie (Qw - Qa + 1 = 2 of the 3): bookfleet's recovery fences
    through it with the V3 fence read, re-adds the tail and closes at the last acknowledged entry. The old writer's
    next add is refused, and both clients read the ledger whole."""
    fleet = whole_fleet
    entries = 40

    async def run() -> int:
        async with BookKeeper(fleet.zk) as bk, BookKeeper(fleet.zk) as recoverer:
            writer = await mixed_ledger(bk, (3, 3, 2), [java_bookie.bookie_id])
            assert await write(writer, range(entries)) == list(range(entries))
            ensemble = writer.metadata.segments[0].bookies
            stopped = next(b for b in fleet.fleet.bookies if b.bookie_id in ensemble)
            await asyncio.to_thread(stopped.stop)
            closed = await recoverer.recover_ledger(writer.ledger_id, PASSWORD)
            assert closed.is_closed and closed.last_entry_id == entries - 1, closed
            with pytest.raises(LedgerWriteError):
                await writer.add(b"after the recovery")
            with contextlib.suppress(LedgerWriteError):
                await writer.detach()
            return writer.ledger_id

    ledger_id = asyncio.run(run())
    assert_read_whole_by_both_clients(fleet.zk, ledger_id, entries)
    assert_bookfleet_bookies_unharmed(fleet)


def test_bookfleet_reopens_a_ledger_on_the_java_bookie_without_sending_it_bookfleet_operations(
    whole_fleet, java_bookie
):
    """A stock bookie cannot hold a writer epoch: the reopen never sends it RAISE_EPOCH (which it cannot parse; it
    would log the error and close the connection) and replaces it like a bookie that did not confirm the raise, in a
    new segment from the LAC + 1; the new writer goes on and both clients read the ledger whole."""
    fleet = whole_fleet
    java_log_before = len(java_bookie.log_path.read_text(errors="replace"))

    async def run() -> int:
        async with BookKeeper(fleet.zk) as first, BookKeeper(fleet.zk) as second:
            writer = await mixed_ledger(first, (3, 3, 2), [java_bookie.bookie_id])
            await write(writer, range(30))
            await writer.flush()
            await writer.detach()
            reopened = await second.reopen_ledger(writer.ledger_id, PASSWORD)
            assert await write(reopened, range(30, 60)) == list(range(30, 60))
            closed = await reopened.close()
            assert [segment.first_entry_id for segment in closed.segments] == [0, 30], closed
            assert java_bookie.bookie_id not in closed.segments[1].bookies, closed
            return writer.ledger_id

    ledger_id = asyncio.run(run())
    assert_read_whole_by_both_clients(fleet.zk, ledger_id, 60)
    assert "Exception" not in java_bookie.log_path.read_text(errors="replace")[java_log_before:]
    assert_bookfleet_bookies_unharmed(fleet)


@pytest.mark.parametrize(("victim_kind", "protocol"), [("bookfleet", "v3"), ("java", "v2")])
def test_a_mixed_ensemble_loses_no_acknowledged_entry_when_a_bookie_of_either_kind_is_killed_mid_write(
    whole_fleet, java_bookie, tmp_path, victim_kind, protocol
):
    fleet = whole_fleet
    bookfleet_victim = fleet.fleet.bookies[1]
    victim_id, victim_pid = (
        (bookfleet_victim.bookie_id, bookfleet_victim.process.pid) if victim_kind == "bookfleet"
        else (java_bookie.bookie_id, java_bookie.process.pid)
    )
    conf = write_conf(tmp_path / "bk.conf", fleet.zk, useV2WireProtocol=str(protocol == "v2").lower())
    need = dict.fromkeys([java_bookie.bookie_id, victim_id])  # both kinds, the victim among them
    written = java("LedgerInterop", conf, "write-killing", 3, 2, 2, ENTRIES, KILL_AFTER, victim_pid, ",".join(need))
    output = written.stdout
    assert written.returncode == 0, output[-3000:] + written.stderr[-3000:]

    assert sorted(int(entry) for entry in facts(output, "acked")) == list(range(ENTRIES)), output[-3000:]
    assert facts(output, "read") == [str(ENTRIES)], output[-3000:]  # a new client read each payload back
    (printed,) = facts(output, "ensembles")
    segments = ensembles(printed)
    first, *later = segments.values()
    assert set(need) <= set(first) and later and victim_id not in later[-1], printed
    (ledger,) = facts(output, "ledger")
    with zkclient.session(fleet.zk) as zk:
        metadata = MetadataStore(zk).read(int(ledger))[0]
    assert metadata.is_closed and metadata.last_entry_id == ENTRIES - 1
    assert [list(fragment.bookies) for fragment in metadata.fragments()] == list(segments.values())

    assert not (bookfleet_victim if victim_kind == "bookfleet" else java_bookie).running
    assert_bookfleet_bookies_unharmed(fleet)


@pytest.mark.spark
def test_bookfleet_repairs_a_ledger_whose_ensemble_holds_a_java_bookie(spark, zk, zk_connect, bookie_fleet, tmp_path):
    """E3/Qw2 on two bookfleet bookies and a Java one (a fleet of its own); a bookfleet bookie of the ensemble killed,
    its replicas copied by bookfleet's auditor and Spark repair onto the third, the entries it shared with the Java
    bookie read from the Java bookie (which has no READ_RANGE: entry by entry). Then the other bookfleet bookie of
    the ensemble is stopped too, so the entries the two held together are readable only from the repaired copies:
    both clients read the ledger whole."""
    bookies = {bookie.bookie_id: bookie for bookie in bookie_fleet.start(3)}
    java_bookie = JavaBookie(tmp_path / "java-bookie", zk_connect).start(zk)
    try:
        async def create() -> tuple[int, tuple[str, ...]]:
            async with BookKeeper(zk_connect) as bk:
                writer = await mixed_ledger(bk, (3, 2, 2), [java_bookie.bookie_id])
                await write(writer, range(30))
                await writer.close()
                return writer.ledger_id, writer.metadata.segments[0].bookies

        ledger_id, ensemble = asyncio.run(create())
        victim, second = (bookies[bookie] for bookie in ensemble if bookie in bookies)
        repaired = repaired_after_killing(zk, zk_connect, ledger_id, victim)
        (replacement,) = set(repaired.segments[0].bookies) - set(ensemble)
        assert replacement in bookies and victim.bookie_id not in repaired.segments[0].bookies

        second.stop()
        assert_read_whole_by_both_clients(zk_connect, ledger_id, 30)
        assert "Exception" not in java_bookie.log_path.read_text(errors="replace")
    finally:
        java_bookie.stop()
