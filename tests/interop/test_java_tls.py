"""Apache BookKeeper 4.17.2's client against bookfleet bookies serving mutual TLS (`--tls-dir`, as `--secure`
sets up): it asks START_TLS on a plain connection (V3), presents its certificate, and gets the role its `OU` names,
as bookfleet's clients do, while bookfleet's own clients speak TLS from the first byte on the same port. A
certificate of another CA, or no TLS at all, gets nothing. One fleet (plain ZooKeeper) for the module."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest

from bookfleet import wire
from bookfleet.client.connection import BookieClient
from bookfleet.fleet import BookieFleet
from bookfleet.security.certs import CertificateAuthority, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.security.tls import client_context
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

pytestmark = [requires_java, pytest.mark.xdist_group("java-tls")]  # one fleet (and JVM set) for the module

SIMPLETEST = ("simpletest", "-e", "3", "-w", "2", "-a", "2", "-n", "50")
HELD_ENTRIES = 10


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture(scope="module")
def fleet(ca, tmp_path_factory):
    root = tmp_path_factory.mktemp("java-tls")
    with ZooKeeperServer(root / "zookeeper") as zookeeper, BookieFleet(zookeeper.connect, root, ca=ca) as bookies:
        for n in range(3):
            bookies.add(f"bookie-{n}").start()
        for bookie in bookies.bookies:
            bookie.wait_ready()
        yield bookies


@pytest.fixture(scope="module")
def conf_for(fleet, ca, tmp_path_factory):
    """A Java client configuration presenting a certificate of the fleet's CA with `roles` (None: no TLS)."""
    directory = tmp_path_factory.mktemp("java-tls-confs")

    def make(name: str, *roles: Role):
        settings = tls_settings(write_tls_dir(directory / name, ca.issue(name, roles))) if roles else {}
        return write_conf(directory / f"{name}.conf", fleet.zk, **settings)

    return make


def refused_simpletest(conf) -> str:
    """The error that ended a simpletest that must fail (the shell exits 0 either way)."""
    done = java(SHELL_MAIN, "-conf", conf, *SIMPLETEST)
    output = done.stdout + done.stderr
    ended = re.search(r"Failed to process command 'simpletest'\n\S*BKException\$(\w+)", output)
    assert ended and "entries written" not in output, output[-3000:]
    return ended[1]


def test_simpletest_runs_over_start_tls_with_a_client_certificate(fleet, conf_for):
    output = shell(conf_for("app", Role.CLIENT), *SIMPLETEST)
    assert "50 entries written to ledger" in output and "Last entry Id 49" in output, output[-3000:]
    for bookie in fleet.bookies:
        assert f"Successfully connected to bookie using TLS: {bookie.bookie_id}" in output, output[-3000:]
        assert "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


def test_a_replicator_certificate_recovers_a_ledger_but_may_not_add_to_one(fleet, conf_for):
    """The roles of bookfleet's table: a replicator fences and adds in recovery, never a plain add."""
    held = ledger_left_open(conf_for("writer", Role.CLIENT), 3, 2, 2, HELD_ENTRIES)
    assert held.endswith("holding"), held
    (ledger,) = facts(held, "ledger")

    replicator = conf_for("repair", Role.REPLICATOR)
    recovered = java("LedgerInterop", replicator, "recover", ledger)
    assert facts(recovered.stdout, "closed") == [f"last={HELD_ENTRIES - 1}"], recovered.stdout + recovered.stderr

    assert "BKUnauthorizedAccessException" in refused_simpletest(replicator)


def test_a_certificate_of_another_ca_or_no_tls_gets_nothing_and_bookfleets_direct_tls_still_does(
    fleet, ca, conf_for, tmp_path
):
    foreign = dataclasses.replace(CertificateAuthority.create().issue("stranger", [Role.ADMIN]), ca_pem=ca.cert_pem)
    stranger = write_conf(tmp_path / "stranger.conf", fleet.zk, **tls_settings(write_tls_dir(tmp_path / "s", foreign)))
    assert "BKNotEnoughBookiesException" in refused_simpletest(stranger)  # no bookie let it in
    assert any("TLS handshake failed" in bookie.log_path.read_text() for bookie in fleet.bookies)
    assert "BKUnauthorizedAccessException" in refused_simpletest(conf_for("plain"))  # in, but with no role

    async def bookie_state() -> wire.BookieState:
        tls = client_context(write_tls_dir(tmp_path / "direct", ca.issue("direct", [Role.CLIENT])))
        async with await BookieClient.connect(fleet.bookies[0].address, tls=tls) as client:
            return (await client.bookie_info()).state

    assert asyncio.run(bookie_state()) == wire.BookieState.WRITABLE
