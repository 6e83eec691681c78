"""Apache BookKeeper 4.17.2's own shell (the jars `make bookkeeper-reference` fetches) against the ZooKeeper of a
bookfleet standalone fleet: it lists bookfleet's bookies, prints a ledger bookfleet's client wrote, lists a ledger
bookfleet marked, names bookfleet's auditor and reads the recovery delay bookfleet set. One fleet for the module;
one JVM per shell command."""

from __future__ import annotations

import asyncio
import base64
import functools
import re

import pytest

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.fleet import StandaloneCluster
from bookfleet.meta import cookies, layout
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.auditor import Auditor
from tests.interop import javaside
from tests.interop.javaside import requires_java, write_conf

pytestmark = requires_java


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with StandaloneCluster(tmp_path_factory.mktemp("interop"), bookies=3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def zk(fleet):
    with zkclient.session(fleet.zk) as session:
        yield session


@pytest.fixture(scope="module")
def shell(fleet, tmp_path_factory):
    """Run one BookieShell command against the fleet's ZooKeeper (javaside.shell: a small JVM); its whole output."""
    conf = write_conf(tmp_path_factory.mktemp("shell") / "bk.conf", fleet.zk)
    return functools.partial(javaside.shell, conf)


@pytest.fixture(scope="module")
def closed_ledger(fleet) -> int:
    async def write() -> int:
        async with BookKeeper(fleet.zk) as bk:
            writer = await bk.create_ledger(3, 2, 2, password=b"interop", custom={"app": "interop"})
            for i in range(5):
                await writer.add(f"entry {i}".encode())
            await writer.close()
            return writer.ledger_id

    return asyncio.run(write())


def said(output: str, line: str) -> bool:
    """Whether the shell logged exactly `line` (its commands print through its log, one fact a line)."""
    return re.search(rf"\] - {re.escape(line)}$", output, re.MULTILINE) is not None


def test_listbookies_lists_every_bookfleet_bookie(fleet, shell):
    output = shell("listbookies", "-rw")
    for bookie in fleet.fleet.bookies:
        assert said(output, f"BookieID:{bookie.bookie_id}, IP:127.0.0.1, Port:{bookie.port}, Hostname:localhost"), (
            output[-3000:])


def test_ledgermetadata_prints_a_ledger_bookfleets_client_wrote(closed_ledger, shell):
    output = shell("ledgermetadata", "-ledgerid", str(closed_ledger))
    assert said(output, f"ledgerID: {closed_ledger}"), output[-3000:]
    password = base64.b64encode(b"interop").decode()
    for fact in ("formatVersion=3", "ensembleSize=3", "writeQuorumSize=2", "ackQuorumSize=2", "state=CLOSED",
                 "length=35", "lastEntryId=4", "digestType=CRC32C", f"password=base64:{password}",
                 f"customMetadata={{app=base64:{password}}}"):  # the custom value is "interop" too
        assert fact in output, f"{fact} missing:\n{output[-3000:]}"


def test_ledgermetadata_finds_a_long_id_where_bookkeeper_looks(zk, shell):
    ledger_id = 2**31 + 5
    MetadataStore(zk).create(new_metadata(["bookie-0", "bookie-1"], 2, 1), ledger_id=ledger_id)
    output = shell("ledgermetadata", "-ledgerid", str(ledger_id))
    assert said(output, f"ledgerID: {ledger_id}") and "ensembles={0=[bookie-0, bookie-1]}" in output, output[-3000:]


def test_listunderreplicated_lists_a_ledger_bookfleet_marked(closed_ledger, zk, shell):
    UnderReplication(zk).mark(closed_ledger, ["bookie-9"], lost=True)
    output = shell("listunderreplicated", "-printmissingreplica")
    assert said(output, str(closed_ledger)) and said(output, "Under replicated ledger count: 1"), output[-3000:]
    assert "bookie-9" in output, output[-3000:]


def test_whoisauditor_names_bookfleets_auditor(fleet, zk, shell):
    with Auditor(zk, fleet.fleet.bookies[0].bookie_id) as auditor:
        assert auditor.wait_active(30)
        output = shell("whoisauditor")
    assert said(output, f"Auditor: {fleet.fleet.bookies[0].bookie_id}"), output[-3000:]


def test_lostbookierecoverydelay_reads_the_delay_bookfleet_set_and_bookfleet_the_one_it_sets(zk, shell):
    UnderReplication(zk).set_recovery_delay(42)
    output = shell("lostbookierecoverydelay", "-get")
    assert said(output, "LostBookieRecoveryDelay value in ZK: 42"), output[-3000:]
    shell("lostbookierecoverydelay", "-set", "7")
    assert UnderReplication(zk).recovery_delay() == 7


def test_cookie_get_reads_a_cookie_bookfleet_wrote(zk, shell):
    """The shell takes only HOST:PORT bookie ids, so the cookie is one bookfleet's meta.cookies writes for such an id
    (a bookie's start writes the same, as test_bookie_identity checks)."""
    cookies.create(zk, cookies.Cookie("127.0.0.1:3999", "/data/journal", "/data/ledgers", layout.instance_id(zk)))
    output = shell("cookie_get", "127.0.0.1:3999")
    assert 'bookieHost: "127.0.0.1:3999"' in output and f'instanceId: "{layout.instance_id(zk)}"' in output, (
        output[-3000:])
