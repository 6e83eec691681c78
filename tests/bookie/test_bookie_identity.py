"""Cookies, read-only switching (disk full, forced through ZooKeeper) and garbage collection, on real bookie
processes and a real ZooKeeper."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal

import pytest

from bookfleet import cli, wire
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.connection import BookieClient, NoSuchLedgerOnBookieError, ReadOnlyError
from bookfleet.client.placement import NotEnoughBookies
from bookfleet.fleet import BookieProcess
from bookfleet.meta import bookiestate, cookies, layout, zkpaths
from bookfleet.meta.registry import BookieRegistry
from tests.fixtures.bookies import MASTER_KEY, encode_test_entry


def refusal(bookie: BookieProcess) -> str:
    """Start a bookie that must refuse to start; return its complaint."""
    assert bookie.start().wait_exit(30) != 0
    return bookie.log_tail(3)


def test_cookie_mismatch_refuses_to_start(bookie_fleet, zk, tmp_path):
    (first,) = bookie_fleet.start(1)
    first.stop()
    cookie = cookies.read(zk, first.bookie_id)
    assert (cookie.bookieId, cookie.ledgerDir) == (first.bookie_id, str(first.ledger_dir))
    assert cookie.instanceId == layout.instance_id(zk)  # BookKeeper's: the cluster's INSTANCEID

    moved = BookieProcess("bookie-b.example", bookie_fleet.zk, first.data_dir, port=first.port)
    assert f"belongs to bookie {first.bookie_id}, not bookie-b.example" in refusal(moved)

    first_registration = tmp_path / "first-registration"
    shutil.copytree(first.data_dir, first_registration)
    first.wipe()
    complaint = refusal(first)
    assert f"ZooKeeper has a cookie for bookie {first.bookie_id} but its journal dir" in complaint
    assert "the disk was wiped or replaced" in complaint

    # Decommissioning deletes the ZooKeeper cookie; the wiped bookie then joins again as a new bookie.
    zk.delete(zkpaths.cookie(first.bookie_id))
    first.start().wait_ready()
    first.stop()
    # The disks of its first registration, back: same bookie, same cluster, but not the disks ZooKeeper knows now.
    shutil.rmtree(first.data_dir)
    shutil.copytree(first_registration, first.data_dir)
    assert "the disk is from another incarnation of it" in refusal(first)
    zk.delete(zkpaths.cookie(first.bookie_id))
    assert "ZooKeeper has none" in refusal(first)


def test_a_zookeeper_an_earlier_bookfleet_wrote_is_refused_in_one_line(bookie_fleet, zk):
    zk.create(zkpaths.cookie("bookie-of-old"), b'{"bookieId": "bookie-of-old", "instanceId": "1f"}', makepath=True)
    complaint = refusal(bookie_fleet.add())
    assert "holds bookfleet's old JSON records; this bookfleet reads and writes only Apache BookKeeper's" in complaint
    assert not zk.exists(zkpaths.LAYOUT)


async def registered_as(zk, bookie: BookieProcess, where: str) -> None:
    """Wait until exactly one of the two registrations exists: `available` or `readonly`."""
    wanted, other = zkpaths.available(bookie.bookie_id), zkpaths.readonly(bookie.bookie_id)
    if where == "readonly":
        wanted, other = other, wanted
    async with asyncio.timeout(10):
        while not (zk.exists(wanted) and not zk.exists(other)):
            await asyncio.sleep(0.02)


async def test_read_only_when_full_and_writable_after_gc(bookie_fleet, zk):
    (bookie,) = bookie_fleet.start(
        1,
        disk_quota=400_000,
        disk_usage_threshold=0.5,
        disk_usage_lwm=0.45,
        disk_check_interval=0.05,
        gc_interval=0.1,
        gc_grace=0,
        flush_interval=0.05,
        journal_roll_bytes=16_384,
        entrylog_roll_bytes=16_384,
    )
    zk.create(zkpaths.ledger(3), b"{}", makepath=True)  # any metadata: the bookie only checks that it exists
    payload = b"p" * 8000
    async with await BookieClient.connect(bookie.address) as client:
        written = 0
        with pytest.raises(ReadOnlyError, match="read-only"):
            for written in range(200):
                await client.add_entry(MASTER_KEY, encode_test_entry(3, written, payload))
                await asyncio.sleep(0.01)
        assert 5 < written < 200
        assert (await client.bookie_info()).state.name == "READ_ONLY"
        await registered_as(zk, bookie, "readonly")
        assert await client.read_entry(3, 0) == encode_test_entry(3, 0, payload)  # reads are still served

        zk.delete(zkpaths.ledger(3))
        async with asyncio.timeout(20):
            while (await client.bookie_info()).state.name != "WRITABLE":
                await asyncio.sleep(0.05)
        with pytest.raises(NoSuchLedgerOnBookieError):
            await client.read_entry(3, 0)
        assert await client.add_entry(MASTER_KEY, encode_test_entry(6, 0, payload)) == (6, 0)
    await registered_as(zk, bookie, "available")


async def test_read_only_forced_through_zookeeper_until_cleared(bookie_fleet, zk_connect, zk, capsys):
    bookies = bookie_fleet.start(3)
    target, others = bookies[0], sorted(b.bookie_id for b in bookies[1:])
    readonly = ("bookies", "readonly", target.bookie_id, "--zk", zk_connect)
    assert cli.main(["bookies", "readonly", "no-such-bookie:1", "--zk", zk_connect]) == 2
    assert "no bookie no-such-bookie:1: ZooKeeper has no cookie" in capsys.readouterr().err

    async with await BookieClient.connect(target.address) as client:
        await client.add_entry(MASTER_KEY, encode_test_entry(4, 0, b"before"))
        assert cli.main([*readonly, "--reason", "draining for maintenance"]) == 0
        assert bookiestate.read(zk, target.bookie_id) == bookiestate.ForcedState(
            read_only=True, reason="draining for maintenance")
        await registered_as(zk, target, "readonly")
        with pytest.raises(ReadOnlyError, match=r"forced read-only in ZooKeeper \(draining for maintenance\)"):
            await client.add_entry(MASTER_KEY, encode_test_entry(4, 1, b"refused"))
        assert await client.read_entry(4, 0) == encode_test_entry(4, 0, b"before")  # reads are still served
        assert (await client.bookie_info()).state == wire.BookieState.READ_ONLY
    assert sorted(info.bookie_id for info in BookieRegistry(zk).writable()) == others
    async with BookKeeper(zk_connect) as bk:
        with pytest.raises(NotEnoughBookies, match="need 3 writable bookies, 2 available"):
            await bk.create_ledger(ensemble_size=3, write_quorum=2)
        writer = await bk.create_ledger(ensemble_size=2, write_quorum=2)
        assert sorted(writer.metadata.segments[0].bookies) == others
        await writer.close()

    target.stop()  # level-based: a restarted bookie comes up read-only while the switch is set
    target.start().wait_ready()
    await registered_as(zk, target, "readonly")

    assert cli.main([*readonly, "--clear"]) == 0
    assert bookiestate.read(zk, target.bookie_id) is None
    await registered_as(zk, target, "available")
    async with await BookieClient.connect(target.address) as client:
        assert await client.add_entry(MASTER_KEY, encode_test_entry(4, 1, b"after")) == (4, 1)
        assert (await client.bookie_info()).state == wire.BookieState.WRITABLE


async def test_registration_comes_back_after_the_session_expires(bookie_fleet, zk):
    (bookie,) = bookie_fleet.start(1, zk_session_timeout=4)
    first_owner = zk.exists(zkpaths.available(bookie.bookie_id)).ephemeralOwner
    os.kill(bookie.process.pid, signal.SIGSTOP)  # a hung bookie: its session expires, its registration goes
    try:
        async with asyncio.timeout(30):
            while zk.exists(zkpaths.available(bookie.bookie_id)):
                await asyncio.sleep(0.1)
    finally:
        os.kill(bookie.process.pid, signal.SIGCONT)
    async with asyncio.timeout(30):
        while not (stat := zk.exists(zkpaths.available(bookie.bookie_id))):
            await asyncio.sleep(0.05)
    assert stat.ephemeralOwner != first_owner  # registered again, under the new session
    async with await BookieClient.connect(bookie.address) as client:
        assert await client.add_entry(MASTER_KEY, encode_test_entry(1, 0, b"still serving")) == (1, 0)
