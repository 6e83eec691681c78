"""START_TLS on a bookie serving mutual TLS, frame by frame (BookKeeper's Java client opens every connection this
way; tests/interop/test_java_client.py runs the real one): a plain connection may ask AUTH and START_TLS and nothing
else, as on a BookKeeper bookie that requires TLS; once its handshake presented a certificate of the cluster CA,
that certificate's roles apply and the next frame chooses the connection's protocol again. bookfleet's clients speak
TLS from the first byte on the same port, and a client that connects and sends nothing holds up neither kind."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bookfleet import wire
from bookfleet.bkprotocol import BookieInfoWanted, OperationType, StatusCode
from bookfleet.bkwire import V2Status
from bookfleet.bookie.serving import TLS_HANDSHAKE_TIMEOUT
from bookfleet.client.connection import BookieClient
from bookfleet.fleet import BookieFleet
from bookfleet.polling import wait_for
from bookfleet.security.certs import CertificateAuthority, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.security.tls import client_context
from tests.fixtures.bkclient import BkConnection, v2_read, v3_request

WANTED = BookieInfoWanted.FREE_DISK_SPACE | BookieInfoWanted.TOTAL_DISK_CAPACITY


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture
def secure_fleet(zk_connect, tmp_path, ca):
    with BookieFleet(zk_connect, tmp_path / "bookies", ca=ca) as fleet:
        yield fleet


def tls_for(ca: CertificateAuthority, directory, role: Role):
    return client_context(write_tls_dir(directory, ca.issue(directory.name, [role])))


async def start_tls(port: int, tls) -> BkConnection:
    """A connection that opened in plain and asked START_TLS, as BookKeeper's client does."""
    conn = await BkConnection.open(port)
    assert (await conn.v3(v3_request(OperationType.START_TLS, 1))).status == StatusCode.EOK
    await conn.writer.start_tls(tls.context, server_hostname="localhost")
    return conn


async def test_a_plain_connection_gets_its_role_from_the_certificate_it_presents_after_start_tls(
    secure_fleet, ca, tmp_path
):
    (bookie,) = secure_fleet.start(1)
    conn = await BkConnection.open(bookie.port)
    auth = await conn.v3(v3_request(OperationType.AUTH, 1, authPluginName="any", payload=b""))
    assert auth.status == StatusCode.EOK
    refused = await conn.v3(v3_request(OperationType.GET_BOOKIE_INFO, 2, requested=WANTED))
    assert refused.status == StatusCode.EUA  # plain: no certificate, no role

    assert (await conn.v3(v3_request(OperationType.START_TLS, 3))).status == StatusCode.EOK
    tls = tls_for(ca, tmp_path / "app", Role.CLIENT)
    await conn.writer.start_tls(tls.context, server_hostname="localhost")
    info = await conn.v3(v3_request(OperationType.GET_BOOKIE_INFO, 4, requested=WANTED))
    assert info.status == StatusCode.EOK and info.getBookieInfoResponse.freeDiskSpace > 0
    await conn.close()

    v2_after_tls = await start_tls(bookie.port, tls)  # BookKeeper's V2 client asks START_TLS in V3
    assert (await v2_after_tls.v2(v2_read(77, 0))).rc == V2Status.ENOLEDGER  # V2 now, and a client may read
    await v2_after_tls.close()
    assert "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


async def test_a_plain_connection_is_refused_everything_but_start_tls_which_it_cannot_ask_twice(
    secure_fleet, ca, tmp_path
):
    (bookie,) = secure_fleet.start(1)
    conn = await BkConnection.open(bookie.port)
    assert (await conn.v3(v3_request(OperationType.READ_ENTRY, 1, ledgerId=5, entryId=0))).status == StatusCode.EUA
    assert (await conn.v3(v3_request(OperationType.START_TLS, 2))).status == StatusCode.EOK
    await conn.writer.start_tls(tls_for(ca, tmp_path / "repair", Role.REPLICATOR).context, server_hostname="localhost")
    assert (await conn.v3(v3_request(OperationType.START_TLS, 3))).status == StatusCode.EBADREQ
    await conn.close()

    plain_v2 = await BkConnection.open(bookie.port)  # V2 has no START_TLS: refused as by BookKeeper, EUA
    assert (await plain_v2.v2(v2_read(5, 0))).rc == V2Status.EUA
    await plain_v2.close()


async def test_start_tls_and_tls_from_the_first_byte_share_the_port_beside_a_client_that_sends_nothing(
    secure_fleet, ca, tmp_path
):
    (bookie,) = secure_fleet.start(1)
    silent = socket.create_connection(("127.0.0.1", bookie.port))  # connects, never sends a byte
    silent.setblocking(False)
    tls = tls_for(ca, tmp_path / "app", Role.CLIENT)

    def dropped() -> bool:
        try:
            return silent.recv(1) == b""
        except BlockingIOError:
            return False

    upgraded = await start_tls(bookie.port, tls)
    info = await upgraded.v3(v3_request(OperationType.GET_BOOKIE_INFO, 2, requested=WANTED))
    assert info.status == StatusCode.EOK
    async with await BookieClient.connect(bookie.address, tls=tls) as direct:
        assert (await direct.bookie_info()).state == wire.BookieState.WRITABLE
    await upgraded.close()
    assert not dropped()  # both were served while the silent one still waited: it held nothing up

    # and it is dropped once its time to begin is over
    await asyncio.to_thread(wait_for, dropped, TLS_HANDSHAKE_TIMEOUT + 30, "the silent client to be dropped")
    silent.close()
    assert f"nothing sent in {TLS_HANDSHAKE_TIMEOUT:.0f} s" in bookie.log_tail(), bookie.log_tail()
