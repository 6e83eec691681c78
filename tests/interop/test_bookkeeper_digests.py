"""Entry digests and master keys across Apache BookKeeper 4.17.2's own ledger client and bookfleet: a ledger
bookfleet's client wrote with each digest type is read whole by the Java client (every digest checked by its
DigestManager, the digest type taken from bookfleet's metadata), and a ledger the Java client wrote with a password
(MAC, CRC32) on bookfleet bookies survives a killed bookie through bookfleet's auditor and Spark repair, which take
its password and digest type from its metadata, then is read whole from Java again. hack/bookkeeper-interop's
LedgerDigestProbe, built with the jars by scripts/build-bookkeeper.sh (cached): one JVM reads the ledgers of every
digest type, one JVM per write or read in the repair tests."""

from __future__ import annotations

import asyncio

import pytest

from bookfleet import wire
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.meta.metadata import MetadataStore
from tests.interop.javaside import (
    ledger_read_from_java,
    ledger_written_by_java,
    ledgers_read_from_java,
    probe_payload,
    requires_java,
)
from tests.interop.repairing import repaired_after_killing

pytestmark = requires_java


def test_java_reads_whole_a_ledger_bookfleet_wrote_with_each_digest_type(bookie_fleet, zk_connect):
    """One ledger per digest type on one fleet, all read back in one JVM (a digest type of its own each, so a
    mismatch names its type)."""
    bookie_fleet.start(3)
    payloads = [b"", b"x", *(b"entry %d " % i * (i + 1) for i in range(2, 40)), bytes(range(256)) * 40]

    async def write(digest_type: wire.DigestType) -> int:
        async with BookKeeper(zk_connect) as bk:
            writer = await bk.create_ledger(3, 2, 2, digest_type=digest_type, password=bookfleet_password(digest_type))
            for payload in payloads:
                await writer.add(payload)
            await writer.close()
            return writer.ledger_id

    ledgers = {digest_type: asyncio.run(write(digest_type)) for digest_type in wire.DigestType}
    read = ledgers_read_from_java(zk_connect, [
        (ledger_id, digest_type, bookfleet_password(digest_type)) for digest_type, ledger_id in ledgers.items()
    ])
    assert {digest_type: read[ledger_id] for digest_type, ledger_id in ledgers.items()} == dict.fromkeys(
        wire.DigestType, payloads)


def bookfleet_password(digest_type: wire.DigestType) -> bytes:
    return f"bookfleet {digest_type}".encode()


@pytest.mark.spark
@pytest.mark.parametrize("digest_type", [wire.DigestType.MAC, wire.DigestType.CRC32], ids=str)
def test_a_ledger_java_wrote_is_repaired_by_bookfleet_and_read_whole_from_java(
    spark, zk, zk_connect, bookie_fleet, digest_type
):
    """E3/Qw2 on four bookies; one of the ensemble killed, its replicas copied by bookfleet's repair onto the fourth.
    Then a second bookie of the ensemble is stopped too: every entry the two held together is readable only from
    the repaired copies, so the Java client's read of the whole ledger checks every one of those copies' digests."""
    bookies = {bookie.bookie_id: bookie for bookie in bookie_fleet.start(4)}
    password = f"java {digest_type}"
    entries = 40
    ledger_id = ledger_written_by_java(zk_connect, digest_type, password, entries)
    store = MetadataStore(zk)
    written, _ = store.read(ledger_id)
    assert (written.digest_type, written.password, written.last_entry_id) == (digest_type, password.encode(), 39)
    ensemble = written.segments[0].bookies
    victim, second = bookies[ensemble[0]], bookies[ensemble[1]]

    repaired = repaired_after_killing(zk, zk_connect, ledger_id, victim)
    (replacement,) = set(repaired.segments[0].bookies) - set(ensemble)
    assert repaired.segments[0].bookies == (replacement, *ensemble[1:])

    second.stop()  # entries of write set {0, 1} (every third) now live on the replacement alone
    assert ledger_read_from_java(zk_connect, ledger_id, digest_type, password.encode()) == [
        probe_payload(e) for e in range(entries)]
