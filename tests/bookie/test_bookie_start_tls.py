"""START_TLS on a bookie serving mutual TLS, frame by frame (BookKeeper's Java client opens every connection this
way; tests/interop/test_java_tls.py runs the real one): a plain connection may ask AUTH and START_TLS and nothing
else; once its handshake presented a certificate of the cluster CA, that certificate's roles apply and the next
frame chooses the connection's protocol again."""

from __future__ import annotations

import pytest

from bookfleet.bkprotocol import BookieInfoWanted, OperationType, StatusCode
from bookfleet.bkwire import V2Status
from bookfleet.fleet import BookieFleet
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
    tls = client_context(write_tls_dir(tmp_path / "app", ca.issue("app", [Role.CLIENT])))
    await conn.writer.start_tls(tls.context, server_hostname="localhost")
    info = await conn.v3(v3_request(OperationType.GET_BOOKIE_INFO, 4, requested=WANTED))
    assert info.status == StatusCode.EOK and info.getBookieInfoResponse.freeDiskSpace > 0
    await conn.close()

    v2_after_tls = await BkConnection.open(bookie.port)  # BookKeeper's V2 client asks START_TLS in V3
    assert (await v2_after_tls.v3(v3_request(OperationType.START_TLS, 1))).status == StatusCode.EOK
    await v2_after_tls.writer.start_tls(tls.context, server_hostname="localhost")
    assert (await v2_after_tls.v2(v2_read(77, 0))).rc == V2Status.ENOLEDGER  # V2 now, and a client may read
    await v2_after_tls.close()


async def test_a_plain_connection_is_refused_everything_but_start_tls_which_it_cannot_ask_twice_nor_in_v2(
    secure_fleet, ca, tmp_path
):
    (bookie,) = secure_fleet.start(1)
    conn = await BkConnection.open(bookie.port)
    assert (await conn.v3(v3_request(OperationType.READ_ENTRY, 1, ledgerId=5, entryId=0))).status == StatusCode.EUA
    assert (await conn.v3(v3_request(OperationType.START_TLS, 2))).status == StatusCode.EOK
    tls = client_context(write_tls_dir(tmp_path / "repair", ca.issue("repair", [Role.REPLICATOR])))
    await conn.writer.start_tls(tls.context, server_hostname="localhost")
    assert (await conn.v3(v3_request(OperationType.START_TLS, 3))).status == StatusCode.EBADREQ
    await conn.close()

    plain_v2 = await BkConnection.open(bookie.port)  # V2 has no START_TLS: closed unanswered
    assert await plain_v2.raw(v2_read(5, 0)) is None
    await plain_v2.close()
