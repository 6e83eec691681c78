"""bookfleet bookies join a cluster of Apache BookKeeper 4.17.2's own bookies (the first step of a migration,
docs/pulsar.md): the cluster formatted by BookKeeper's shell, three stock bookies, a ledger BookKeeper's client wrote
on them; a bookfleet bookie starts on the same `/ledgers`, takes the cluster's INSTANCEID into its cookie and
registers beside them; a stock bookie is killed and bookfleet's auditor and repair copy its replicas onto the
bookfleet bookie, reading every entry from the stock survivors (which serve BookKeeper's READ only)."""

from __future__ import annotations

import asyncio

import pytest

from bookfleet import wire
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.meta import cookies, layout, zkpaths
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.registry import BookieRegistry
from tests.interop.javaside import (
    JavaBookie,
    ledger_written_by_java,
    probe_payload,
    requires_java,
    shell,
    started_side_by_side,
    write_conf,
)
from tests.interop.repairing import repaired_after_killing

pytestmark = requires_java

ENTRIES = 40
PASSWORD = "migrating"


async def read_whole(zk_connect: str, ledger_id: int) -> list[bytes]:
    async with BookKeeper(zk_connect) as bookkeeper:
        reader = await bookkeeper.open_ledger(ledger_id, PASSWORD.encode())
        return [bytes(entry.payload) async for entry in reader.entries(0, ENTRIES - 1)]


@pytest.mark.spark
def test_a_bookfleet_bookie_joins_a_bookkeeper_cluster_and_takes_a_stock_bookies_replicas_from_stock_survivors(
    spark, zk, zk_connect, bookie_fleet, tmp_path
):
    shell(write_conf(tmp_path / "admin.conf", zk_connect), "initnewcluster")
    bookkeepers_layout, instance_id = zk.get(zkpaths.LAYOUT)[0], layout.instance_id(zk)
    stock = started_side_by_side([JavaBookie(tmp_path / f"java-{n}", zk_connect) for n in range(3)], zk)
    try:
        ledger_id = ledger_written_by_java(zk_connect, wire.DigestType.CRC32C, PASSWORD, ENTRIES)

        (ours,) = bookie_fleet.start(1)
        assert zk.get(zkpaths.LAYOUT)[0] == bookkeepers_layout
        assert cookies.read(zk, ours.bookie_id).instanceId == instance_id
        assert BookieRegistry(zk).ids() == {ours.bookie_id, *(bookie.bookie_id for bookie in stock)}

        ensemble = MetadataStore(zk).read(ledger_id)[0].segments[0].bookies
        by_id = {bookie.bookie_id: bookie for bookie in stock}
        repaired = repaired_after_killing(zk, zk_connect, ledger_id, by_id[ensemble[0]])
        assert repaired.segments[0].bookies == (ours.bookie_id, *ensemble[1:])

        by_id[ensemble[1]].stop()  # entries of write set {0, 1} (every third) now live on the copies alone
        assert asyncio.run(read_whole(zk_connect, ledger_id)) == [probe_payload(e) for e in range(ENTRIES)]
    finally:
        for bookie in stock:
            bookie.stop()
