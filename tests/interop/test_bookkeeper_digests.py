"""Entry digests and master keys across Apache BookKeeper 4.17.2's own ledger client and bookfleet: a ledger
bookfleet's client wrote with each digest type is read whole by the Java client (every digest checked by its
DigestManager, the digest type taken from bookfleet's metadata), and a ledger the Java client wrote with a password
(MAC, CRC32) on bookfleet bookies survives a killed bookie through bookfleet's auditor and Spark repair, which take
its password and digest type from its metadata, then is read whole from Java again. hack/bookkeeper-interop's
LedgerDigestProbe, built with the jars by scripts/build-bookkeeper.sh (cached); one JVM per write or read."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from bookfleet import wire
from bookfleet.bench.bookkeeper import JAVA17_OPENS, built_reference
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.meta.metadata import MetadataStore
from tests.interop.javaside import probe_payload
from tests.interop.repairing import repaired_after_killing

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("java", "javac", "mvn")), reason="no JDK (java, javac, mvn) on PATH"
)

PROBE = "LedgerDigestProbe"


@pytest.fixture(scope="module")
def probe_classpath() -> str:
    reference = built_reference()
    return f"{reference / 'classes'}:{reference / 'lib' / '*'}"


@pytest.fixture
def java(zk_connect, probe_classpath):
    """Run LedgerDigestProbe on the test's ZooKeeper chroot; the lines it prints (BookKeeper logs to stdout too)."""
    host, _, chroot = zk_connect.partition("/")
    uri = f"zk+hierarchical://{host}/{chroot}/ledgers"

    def run(*args: str) -> list[str]:
        done = subprocess.run(
            ["java", *JAVA17_OPENS, "-cp", probe_classpath, PROBE, uri, *args],
            capture_output=True, text=True, timeout=240,
        )
        assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr[-4000:]}"
        return [line for line in done.stdout.splitlines() if line.startswith(("ledger ", "entry ", "last "))]

    return run


def read_from_java(java, ledger_id: int, digest_type: wire.DigestType, password: bytes) -> list[bytes]:
    """Every entry of the ledger as the Java client reads it, in order (its digests checked by the client)."""
    lines = java("read", str(ledger_id), digest_type.name, password.decode())
    entries = [line.split(" ") for line in lines if line.startswith("entry ")]
    assert [int(entry_id) for _, entry_id, _ in entries] == list(range(len(entries))), lines
    assert lines[-1] == f"last {len(entries) - 1}", lines
    return [bytes.fromhex(payload) for *_, payload in entries]


@pytest.mark.parametrize("digest_type", list(wire.DigestType), ids=str)
def test_java_reads_whole_a_ledger_bookfleet_wrote(bookie_fleet, zk_connect, java, digest_type):
    bookie_fleet.start(3)
    password = f"bookfleet {digest_type}".encode()
    payloads = [b"", b"x", *(b"entry %d " % i * (i + 1) for i in range(2, 40)), bytes(range(256)) * 40]

    async def write() -> int:
        async with BookKeeper(zk_connect) as bk:
            writer = await bk.create_ledger(3, 2, 2, digest_type=digest_type, password=password)
            for payload in payloads:
                await writer.add(payload)
            await writer.close()
            return writer.ledger_id

    assert read_from_java(java, asyncio.run(write()), digest_type, password) == payloads


@pytest.mark.spark
@pytest.mark.parametrize("digest_type", [wire.DigestType.MAC, wire.DigestType.CRC32], ids=str)
def test_a_ledger_java_wrote_is_repaired_by_bookfleet_and_read_whole_from_java(
    spark, zk, zk_connect, bookie_fleet, java, digest_type
):
    """E3/Qw2 on four bookies; one of the ensemble killed, its replicas copied by bookfleet's repair onto the fourth.
    Then a second bookie of the ensemble is stopped too: every entry the two held together is readable only from
    the repaired copies, so the Java client's read of the whole ledger checks every one of those copies' digests."""
    bookies = {bookie.bookie_id: bookie for bookie in bookie_fleet.start(4)}
    password = f"java {digest_type}"
    entries = 40
    (line,) = java("write", digest_type.name, password, str(entries))
    ledger_id = int(line.removeprefix("ledger "))
    store = MetadataStore(zk)
    written, _ = store.read(ledger_id)
    assert (written.digest_type, written.password, written.last_entry_id) == (digest_type, password.encode(), 39)
    ensemble = written.segments[0].bookies
    victim, second = bookies[ensemble[0]], bookies[ensemble[1]]

    repaired = repaired_after_killing(zk, zk_connect, ledger_id, victim)
    (replacement,) = set(repaired.segments[0].bookies) - set(ensemble)
    assert repaired.segments[0].bookies == (replacement, *ensemble[1:])

    second.stop()  # entries of write set {0, 1} (every third) now live on the replacement alone
    assert read_from_java(java, ledger_id, digest_type, password.encode()) == [probe_payload(e) for e in range(entries)]
