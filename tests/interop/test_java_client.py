"""Apache BookKeeper 4.17.2's ledger client on 3 bookfleet bookies, over V3 and V2, with TLS off and on: the shell's
`simpletest` (create, add, read, close, delete), and a ledger its writer left open (killed after acknowledged adds)
recovered from Java (fencing, recovery adds, close) over V3, V2 and V2+TLS (V3+TLS in the replicator's test); an
explicit LAC written by either client and read by the Java one.

With TLS the bookies serve mutual TLS as `--secure` sets them up (on a plain ZooKeeper: BookKeeper's client cannot
present the digest credential a secure standalone's ZooKeeper asks for). The Java client opens each connection in
plain and asks START_TLS in V3, whichever protocol it then speaks; its certificate's `OU` gives it the role it would
give bookfleet's clients: a `replicator` recovers a ledger but may not add to one, and a certificate of another CA,
or no TLS at all, gets nothing. One fleet of each kind for the module."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.fleet import BookieFleet, StandaloneCluster
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore
from bookfleet.security.certs import CertificateAuthority, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.zkserver import ZooKeeperServer
from tests.interop.javaside import (
    SHELL_MAIN,
    facts,
    java,
    ledger_left_open,
    requires_java,
    shell,
    tls_settings,
    write_conf,
)

pytestmark = [requires_java, pytest.mark.xdist_group("java-client")]  # one fleet (and JVM set) for the module

PROTOCOLS = {"v3": "false", "v2": "true"}
CLIENTS = [*PROTOCOLS, *(f"{protocol}-tls" for protocol in PROTOCOLS)]
RECOVERING_CLIENTS = ["v3", "v2", "v2-tls"]
HELD_ENTRIES = 25
SIMPLETEST = ("simpletest", "-e", "3", "-w", "2", "-a", "2", "-n", "100")


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture(scope="module")
def plain_fleet(tmp_path_factory):
    with StandaloneCluster(tmp_path_factory.mktemp("java-client"), bookies=3) as cluster:
        yield cluster.fleet


@pytest.fixture(scope="module")
def tls_fleet(ca, tmp_path_factory):
    root = tmp_path_factory.mktemp("java-tls")
    with ZooKeeperServer(root / "zookeeper") as zookeeper, BookieFleet(zookeeper.connect, root, ca=ca) as bookies:
        for n in range(3):
            bookies.add(f"bookie-{n}").start()
        for bookie in bookies.bookies:
            bookie.wait_ready()
        yield bookies


@pytest.fixture(scope="module")
def conf_for(tmp_path_factory):
    """A client configuration of `fleet` speaking `protocol`, presenting `identity` (a certificate) when given."""
    directory = tmp_path_factory.mktemp("confs")

    def make(fleet: BookieFleet, name: str, protocol: str = "v3", identity=None):
        settings = {"useV2WireProtocol": PROTOCOLS[protocol]}
        if identity is not None:
            settings.update(tls_settings(write_tls_dir(directory / name, identity)))
        return write_conf(directory / f"{name}.conf", fleet.zk, **settings)

    return make


@pytest.fixture(scope="module", params=CLIENTS)
def client(request, ca, conf_for):
    """(fleet, conf): each protocol on plain bookies, and on TLS bookies with a `client` certificate."""
    protocol, _, tls = request.param.partition("-")
    fleet = request.getfixturevalue("tls_fleet" if tls else "plain_fleet")
    identity = ca.issue(request.param, [Role.CLIENT]) if tls else None
    return fleet, conf_for(fleet, request.param, protocol, identity)


def assert_bookies_unharmed(fleet: BookieFleet) -> None:
    for bookie in fleet.bookies:
        assert bookie.running and "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


def refused_simpletest(conf) -> str:
    """The error that ended a simpletest that must fail (the shell exits 0 either way)."""
    done = java(SHELL_MAIN, "-conf", conf, *SIMPLETEST)
    output = done.stdout + done.stderr
    ended = re.search(r"Failed to process command 'simpletest'\n\S*BKException\$(\w+)", output)
    assert ended and "entries written" not in output, output[-3000:]
    return ended[1]


def test_simpletest_creates_writes_reads_and_deletes_a_ledger(client):
    fleet, conf = client
    output = shell(conf, *SIMPLETEST)
    assert "100 entries written to ledger" in output and "Last entry Id 99" in output, output[-3000:]
    if fleet.ca is not None:
        for bookie in fleet.bookies:
            assert f"Successfully connected to bookie using TLS: {bookie.bookie_id}" in output, output[-3000:]
    assert_bookies_unharmed(fleet)


def assert_recovered_whole(fleet: BookieFleet, writer_conf, recovery_conf) -> None:
    """A ledger written through `writer_conf` by a writer killed while holding it open is recovered through
    `recovery_conf`: every acknowledged entry read back, and closed at the last of them."""
    output = ledger_left_open(writer_conf, 3, 3, 2, HELD_ENTRIES)
    assert output.endswith("holding"), output
    (ledger,) = facts(output, "ledger")
    acked = [int(entry) for entry in facts(output, "acked")]
    assert acked == list(range(HELD_ENTRIES)), output
    with zkclient.session(fleet.zk) as zk:
        assert not MetadataStore(zk).read(int(ledger))[0].is_closed  # the writer died with the ledger open

    recovered = java("LedgerInterop", str(recovery_conf), "recover", ledger)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr[-3000:]
    last = HELD_ENTRIES - 1
    assert facts(recovered.stdout, "recovered") == [f"lac={last}"], recovered.stdout
    assert facts(recovered.stdout, "read") == [str(HELD_ENTRIES)], recovered.stdout  # every payload checked
    assert facts(recovered.stdout, "closed") == [f"last={last}"], recovered.stdout
    with zkclient.session(fleet.zk) as zk:
        metadata = MetadataStore(zk).read(int(ledger))[0]
    assert metadata.is_closed and metadata.last_entry_id == last
    assert_bookies_unharmed(fleet)


@pytest.mark.parametrize("client", RECOVERING_CLIENTS, indirect=True)
def test_a_ledger_its_killed_writer_left_open_is_recovered_whole_and_closed_at_its_last_acked_entry(client):
    """A `client` certificate's recovery over TLS is its own path (its recovery adds wait for the bookie to check
    that the ledger is not closed); V3 over TLS recovers in the replicator test below, and the bookie's processors
    are the same for V2 and V3 once a frame is decoded, so V2 over TLS stands for both."""
    fleet, conf = client
    assert_recovered_whole(fleet, conf, conf)


def test_a_replicator_certificate_recovers_a_ledger_but_may_not_add_and_strangers_get_nothing(
    tls_fleet, ca, conf_for
):
    """The roles of bookfleet's table, for a stock client's certificate: a replicator fences and adds in recovery,
    never a plain add; a certificate of another CA fails the handshake; a plain client has no role."""
    writer = conf_for(tls_fleet, "writer", "v3", ca.issue("writer", [Role.CLIENT]))
    replicator = conf_for(tls_fleet, "repair", "v3", ca.issue("repair", [Role.REPLICATOR]))
    assert_recovered_whole(tls_fleet, writer, replicator)
    assert "BKUnauthorizedAccessException" in refused_simpletest(replicator)

    foreign = dataclasses.replace(CertificateAuthority.create().issue("stranger", [Role.ADMIN]), ca_pem=ca.cert_pem)
    assert "BKNotEnoughBookiesException" in refused_simpletest(conf_for(tls_fleet, "stranger", "v3", foreign))
    assert any("TLS handshake failed" in bookie.log_path.read_text() for bookie in tls_fleet.bookies)
    assert "BKUnauthorizedAccessException" in refused_simpletest(conf_for(tls_fleet, "plain"))  # in, with no role


EXPLICIT_LAC_ENTRIES = 20


@pytest.fixture(scope="module")
def explicit_lac_conf(plain_fleet, tmp_path_factory):
    """V3 (READ_LAC and WRITE_LAC are V3 operations) with an explicit LAC sent after 200 ms without adds."""
    directory = tmp_path_factory.mktemp("conf-explicit-lac")
    return write_conf(directory / "bk.conf", plain_fleet.zk, explicitLacInterval=200)


def test_an_explicit_lac_the_java_writer_sent_is_read_back_by_a_java_reader(plain_fleet, explicit_lac_conf):
    """The last entry carries the LAC before it, so only the WRITE_LAC's digest-signed body, handed back by
    READ_LAC, tells a reader that the last entry is confirmed too."""
    done = java("LedgerInterop", str(explicit_lac_conf), "explicit-lac", 3, 3, 2, EXPLICIT_LAC_ENTRIES)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert facts(done.stdout, "explicit-lac") == [str(EXPLICIT_LAC_ENTRIES - 1)], done.stdout[-3000:]
    assert_bookies_unharmed(plain_fleet)


def test_an_explicit_lac_bookfleet_wrote_is_read_back_by_a_java_reader(plain_fleet, explicit_lac_conf):
    """bookfleet's writer signs its explicit LAC with the ledger's digest as BookKeeper's does (a Java reader checks
    it); the ledger is left open, flushed, so the explicit LAC is what says its last entry is confirmed."""

    async def write() -> int:
        async with BookKeeper(plain_fleet.zk) as bk:
            writer = await bk.create_ledger(3, 3, 2, password=b"interop")
            for entry_id in range(EXPLICIT_LAC_ENTRIES):
                await writer.add(b"entry %d" % entry_id)
            await writer.flush()
            await writer.detach()
            return writer.ledger_id

    done = java("LedgerInterop", str(explicit_lac_conf), "read-explicit-lac", asyncio.run(write()))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert facts(done.stdout, "explicit-lac") == [str(EXPLICIT_LAC_ENTRIES - 1)], done.stdout[-3000:]
    assert_bookies_unharmed(plain_fleet)
