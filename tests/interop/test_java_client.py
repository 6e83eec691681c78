"""Apache BookKeeper 4.17.2's ledger client on a 3-bookie bookfleet fleet, over V3 and V2: the shell's `simpletest`
(create, add, read, close, delete), and a ledger its writer left open (killed after acknowledged adds) recovered
from Java (fencing, recovery adds, close). One fleet for the module."""

from __future__ import annotations

import pytest

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
