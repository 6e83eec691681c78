"""Apache BookKeeper 4.17.2's ledger client on a 3-bookie bookfleet fleet, over V3 and V2: the shell's `simpletest`
(create, add, read, close, delete), and a ledger its writer left open (killed after acknowledged adds) recovered
from Java (fencing, recovery adds, close); an explicit LAC written by either client and read by the Java one. One
fleet for the module."""

from __future__ import annotations

import asyncio

import pytest

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.fleet import StandaloneCluster
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore
from tests.interop.javaside import facts, java, ledger_left_open, requires_java, shell, write_conf

pytestmark = [requires_java, pytest.mark.xdist_group("java-client")]  # one fleet (and JVM set) for the module

PROTOCOLS = {"v3": "false", "v2": "true"}
HELD_ENTRIES = 25


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with StandaloneCluster(tmp_path_factory.mktemp("java-client"), bookies=3) as cluster:
        yield cluster


@pytest.fixture(scope="module", params=list(PROTOCOLS))
def conf(request, fleet, tmp_path_factory):
    """A client configuration of the fleet for each protocol."""
    directory = tmp_path_factory.mktemp(f"conf-{request.param}")
    return write_conf(directory / "bk.conf", fleet.zk, useV2WireProtocol=PROTOCOLS[request.param])


def assert_bookies_unharmed(fleet) -> None:
    for bookie in fleet.fleet.bookies:
        assert bookie.running and "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


def test_simpletest_creates_writes_reads_and_deletes_a_ledger(fleet, conf):
    output = shell(conf, "simpletest", "-e", "3", "-w", "2", "-a", "2", "-n", "100")
    assert "100 entries written to ledger" in output and "Last entry Id 99" in output, output[-3000:]
    assert_bookies_unharmed(fleet)


def test_a_ledger_its_killed_writer_left_open_is_recovered_whole_and_closed_at_its_last_acked_entry(fleet, conf):
    output = ledger_left_open(conf, 3, 3, 2, HELD_ENTRIES)
    assert output.endswith("holding"), output
    (ledger,) = facts(output, "ledger")
    acked = [int(entry) for entry in facts(output, "acked")]
    assert acked == list(range(HELD_ENTRIES)), output
    with zkclient.session(fleet.zk) as zk:
        assert not MetadataStore(zk).read(int(ledger))[0].is_closed  # the writer died with the ledger open

    recovered = java("LedgerInterop", str(conf), "recover", ledger)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr[-3000:]
    last = HELD_ENTRIES - 1
    assert facts(recovered.stdout, "recovered") == [f"lac={last}"], recovered.stdout
    assert facts(recovered.stdout, "read") == [str(HELD_ENTRIES)], recovered.stdout  # every payload checked
    assert facts(recovered.stdout, "closed") == [f"last={last}"], recovered.stdout
    with zkclient.session(fleet.zk) as zk:
        metadata = MetadataStore(zk).read(int(ledger))[0]
    assert metadata.is_closed and metadata.last_entry_id == last
    assert_bookies_unharmed(fleet)


EXPLICIT_LAC_ENTRIES = 20


@pytest.fixture(scope="module")
def explicit_lac_conf(fleet, tmp_path_factory):
    """V3 (READ_LAC and WRITE_LAC are V3 operations) with an explicit LAC sent after 200 ms without adds."""
    directory = tmp_path_factory.mktemp("conf-explicit-lac")
    return write_conf(directory / "bk.conf", fleet.zk, explicitLacInterval=200)


def test_an_explicit_lac_the_java_writer_sent_is_read_back_by_a_java_reader(fleet, explicit_lac_conf):
    """The last entry carries the LAC before it, so only the WRITE_LAC's digest-signed body, handed back by
    READ_LAC, tells a reader that the last entry is confirmed too."""
    done = java("LedgerInterop", str(explicit_lac_conf), "explicit-lac", 3, 3, 2, EXPLICIT_LAC_ENTRIES)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert facts(done.stdout, "explicit-lac") == [str(EXPLICIT_LAC_ENTRIES - 1)], done.stdout[-3000:]
    assert_bookies_unharmed(fleet)


def test_an_explicit_lac_bookfleet_wrote_is_read_back_by_a_java_reader(fleet, explicit_lac_conf):
    """bookfleet's writer signs its explicit LAC with the ledger's digest as BookKeeper's does (a Java reader checks
    it); the ledger is left open, flushed, so the explicit LAC is what says its last entry is confirmed."""

    async def write() -> int:
        async with BookKeeper(fleet.zk) as bk:
            writer = await bk.create_ledger(3, 3, 2, password=b"interop")
            for entry_id in range(EXPLICIT_LAC_ENTRIES):
                await writer.add(b"entry %d" % entry_id)
            await writer.flush()
            await writer.detach()
            return writer.ledger_id

    done = java("LedgerInterop", str(explicit_lac_conf), "read-explicit-lac", asyncio.run(write()))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert facts(done.stdout, "explicit-lac") == [str(EXPLICIT_LAC_ENTRIES - 1)], done.stdout[-3000:]
    assert_bookies_unharmed(fleet)
