"""Secure by default: mutual TLS and roles on the bookie protocol, no ledger squatting, ZooKeeper ACLs, rotation,
and the CLI against a secure fleet."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kazoo.exceptions import NoAuthError

from bookfleet import wire
from bookfleet.bookie.config import BookieConfig
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.connection import BookieClient, NoSuchLedgerOnBookieError, UnauthorizedError
from bookfleet.fleet import LOOPBACK_NAMES, BookieFleet
from bookfleet.kube.reconcilers import certificates
from bookfleet.meta import zk as zkclient
from bookfleet.meta import zkpaths
from bookfleet.meta.zk import ZK_AUTH_ENV, ZK_TLS_DIR_ENV, ZooKeeperUnreachable
from bookfleet.polling import wait_for
from bookfleet.security.certs import CertificateAuthority, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.security.tls import TLS_DIR_ENV, client_context
from tests.fixtures.bookies import encode_test_entry
from tests.fixtures.models import bookie_cluster
from tests.fixtures.secrets import SecretStore

ZK_AUTH = "fleet:s3cret"


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture
def secure_fleet(zk_connect: str, tmp_path: Path, ca: CertificateAuthority):
    """Bookies with mutual TLS and ledger admission on, as deployed."""
    with BookieFleet(zk_connect, tmp_path / "bookies", ca=ca) as fleet:
        yield fleet


def identity(ca: CertificateAuthority, directory: Path, *roles: Role, **issue) -> Path:
    return write_tls_dir(directory, ca.issue(directory.name, roles, **issue))


async def refused(address: str, tls) -> str:
    """The error a client sees when the bookie refuses it: at the handshake, or (TLS 1.3, where the server checks
    the client's certificate after the client finished) on the first request."""
    with pytest.raises(ConnectionError) as caught:
        client = await BookieClient.connect(address, tls=tls)
        await client.bookie_info()
    return str(caught.value)


async def test_only_certificates_of_the_cluster_ca_get_in(secure_fleet, ca, tmp_path: Path):
    (bookie,) = secure_fleet.start(1)
    good = client_context(identity(ca, tmp_path / "app", Role.CLIENT))
    async with await BookieClient.connect(bookie.address, tls=good) as client:
        assert (await client.bookie_info()).state == wire.BookieState.WRITABLE

    with pytest.raises(UnauthorizedError, match=r"no certificate .* may not GET_BOOKIE_INFO"):
        async with await BookieClient.connect(bookie.address) as plain:  # no TLS at all: V3 in plain, no role
            await plain.bookie_info()

    # trusts the cluster CA, but its own certificate comes from another CA
    foreign = CertificateAuthority.create().issue("stranger", [Role.ADMIN])
    stranger_dir = write_tls_dir(tmp_path / "stranger", dataclasses.replace(foreign, ca_pem=ca.cert_pem))
    stranger = client_context(stranger_dir)
    assert "a bookie refuses a client certificate" in await refused(bookie.address, stranger)

    last_year = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=365)
    expired = identity(ca, tmp_path / "expired", Role.CLIENT, not_before=last_year)
    assert "a bookie refuses a client certificate" in await refused(bookie.address, client_context(expired))

    # the bookie says why, and read no frame from the TLS ones
    wait_for(lambda: "certificate has expired" in bookie.log_tail(50), 30, "the bookie to log the expired certificate")
    log = bookie.log_tail(50)
    assert "TLS handshake failed: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get" in log
    assert "closing connection" not in log  # no frame was parsed

    # and a client refuses a server whose certificate is not a bookie's, even from the right CA
    impostor_dir = identity(ca, tmp_path / "impostor", Role.CLIENT, dns_names=LOOPBACK_NAMES)
    impostor = secure_fleet.add(tls_dir=impostor_dir).start().wait_ready()
    with pytest.raises(ConnectionError, match="is not a bookie certificate"):
        await BookieClient.connect(impostor.address, tls=good)


async def test_roles_decide_what_a_peer_may_do(secure_fleet, ca, zk_connect, tmp_path: Path, monkeypatch):
    secure_fleet.start(3)
    client_dir = identity(ca, tmp_path / "app", Role.CLIENT)
    replicator = client_context(identity(ca, tmp_path / "repair", Role.REPLICATOR))
    monkeypatch.setenv(TLS_DIR_ENV, str(client_dir))
    async with BookKeeper(zk_connect) as bk:
        writer = await bk.create_ledger(3, 3, 2)
        for n in range(3):
            await writer.add(b"entry %d" % n)
        metadata = await writer.close()
    ledger_id, bookie_address = writer.ledger_id, secure_fleet.bookies[0].address
    key = wire.master_key(b"")
    copy = encode_test_entry(ledger_id, 3, b"late")

    async with await BookieClient.connect(bookie_address, tls=client_context(client_dir)) as client:
        # a replicator-only operation: copying into a closed ledger
        with pytest.raises(UnauthorizedError, match=f"CN=app.*may not add to closed ledger {ledger_id}.*replicator"):
            await client.add_entry(key, copy, recovery=True)
        assert metadata.is_closed
    async with await BookieClient.connect(bookie_address, tls=replicator) as client:
        assert await client.add_entry(key, copy, recovery=True) == (ledger_id, 3)
        assert await client.read_entry(ledger_id, 3) == copy
        with pytest.raises(UnauthorizedError, match="may not ADD_ENTRY: needs role client or admin, has replicator"):
            await client.add_entry(key, encode_test_entry(ledger_id, 4, b"x"))
        with pytest.raises(UnauthorizedError, match="may not WRITE_LAC"):
            await client.write_lac(key, ledger_id, 3)


async def test_a_client_team_holding_only_its_certificate_secret_writes_and_reads_a_ledger(
    secure_fleet, ca, zk_connect, tmp_path: Path, monkeypatch
):
    """spec.security.clientCertificates: the Secret the operator issues from the cluster's CA, mounted as a pod
    mounts it (ca.crt, tls.crt, tls.key) and nothing else, is a client's whole identity over mutual TLS."""
    secure_fleet.start(3)
    cluster = bookie_cluster(3, name="demo", security={"clientCertificates": ["billing"]})
    secrets = SecretStore()
    secrets.ensure(certificates.ca_secret(cluster, ca))  # the cluster's CA: the one the bookies' certificates share
    assert "demo-tls-client-billing" in certificates.ensure(secrets, cluster, [], datetime.datetime.now(datetime.UTC))
    monkeypatch.setenv(TLS_DIR_ENV, str(secrets.mount("demo-tls-client-billing", tmp_path / "billing")))
    async with BookKeeper(zk_connect) as bk:
        writer = await bk.create_ledger(3, 3, 2)
        await asyncio.gather(*(writer.add(b"invoice %d" % n) for n in range(3)))
        await writer.close()
        reader = await bk.open_ledger(writer.ledger_id)
        assert [(await reader.read(n)).payload for n in range(3)] == [b"invoice 0", b"invoice 1", b"invoice 2"]


async def test_no_squatting_on_future_ledger_ids(zk_connect, tmp_path: Path):
    """A hostile client cannot claim ledger ids before their writers: adds, fences and LAC writes of a ledger
    without metadata are refused, and the real writers then write."""
    with BookieFleet(zk_connect, tmp_path / "bookies") as fleet:
        bookies = fleet.start(3)
        async with BookKeeper(zk_connect) as bk:
            first = (await bk.create_ledger(3, 3, 2)).ledger_id
            future_ids = range(first + 1, first + 6)
            squatter_key = os.urandom(wire.MASTER_KEY_SIZE)
            for bookie in bookies:
                async with await BookieClient.connect(bookie.address) as squatter:
                    for ledger_id in future_ids:
                        with pytest.raises(NoSuchLedgerOnBookieError, match=f"ledger {ledger_id} has no metadata"):
                            await squatter.add_entry(squatter_key, encode_test_entry(ledger_id, 0, b"mine"))
                        with pytest.raises(NoSuchLedgerOnBookieError, match="has no metadata"):
                            await squatter.read_lac_and_last(ledger_id, fence=True, master_key=squatter_key)
                        with pytest.raises(NoSuchLedgerOnBookieError, match="has no metadata"):
                            await squatter.write_lac(squatter_key, ledger_id, 0)
            for expected in future_ids:
                writer = await bk.create_ledger(3, 3, 2)
                assert writer.ledger_id == expected
                await asyncio.gather(*(writer.add(b"real %d" % n) for n in range(5)))
                await writer.close()
                reader = await bk.open_ledger(expected)
                assert (await reader.read(4)).payload == b"real 4"


def test_unauthenticated_zookeeper_clients_cannot_write_under_the_ledgers_root(zk_connect):
    with zkclient.session(zk_connect, auth=ZK_AUTH) as fleet:
        fleet.ensure_path(zkpaths.AVAILABLE)
        fleet.create(zkpaths.ledger(7), b"{}", makepath=True)
    with zkclient.session(zk_connect) as anonymous:
        with pytest.raises(NoAuthError):
            anonymous.create(f"{zkpaths.AVAILABLE}/fake-bookie", b"{}", ephemeral=True)
        with pytest.raises(NoAuthError):
            anonymous.set(zkpaths.ledger(7), b"rewritten")
        with pytest.raises(NoAuthError):
            anonymous.delete(zkpaths.ledger(7))
    with zkclient.session(zk_connect, auth="fleet:wrong-password") as intruder, pytest.raises(NoAuthError):
        intruder.set(zkpaths.ledger(7), b"rewritten")


def test_zk_secure_puts_the_fleet_acl_on_nodes_created_before_the_credential(zk_connect):
    cookie = f"{zkpaths.COOKIES}/bookie-0"
    with zkclient.session(zk_connect) as before:  # a fleet that ran without a credential: world-open nodes
        before.create(zkpaths.ledger(7), b"{}", makepath=True)
        before.create(cookie, b"cookie", makepath=True)
    env = {k: v for k, v in os.environ.items() if k not in (ZK_AUTH_ENV, TLS_DIR_ENV, ZK_TLS_DIR_ENV)}

    no_credential = _cli("zk", "secure", "--zk", zk_connect, env=env)
    assert no_credential.returncode == 2 and "--zk-auth" in no_credential.stderr

    first = _cli("zk", "secure", "--zk", zk_connect, "--zk-auth", ZK_AUTH, "--json", env=env)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert {zkpaths.ROOT, zkpaths.COOKIES, cookie, zkpaths.ledger(7)} <= set(report["changed"])
    assert report["nodes"] == len(report["changed"]) and not report["refused"]
    with zkclient.session(zk_connect) as anonymous:
        for path in (cookie, zkpaths.ledger(7)):
            with pytest.raises(NoAuthError):
                anonymous.set(path, b"rewritten")
            with pytest.raises(NoAuthError):
                anonymous.get(path)
        with pytest.raises(NoAuthError):
            anonymous.create(f"{zkpaths.COOKIES}/squatter", b"")
    with zkclient.session(zk_connect, auth=ZK_AUTH) as fleet:
        assert fleet.get(cookie)[0] == b"cookie"
        fleet.set(zkpaths.ledger(7), b"{}")

    again = _cli("zk", "secure", "--zk", zk_connect, "--zk-auth", ZK_AUTH, "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"nodes": report["nodes"], "changed": [], "refused": []}

    intruder = _cli("zk", "secure", "--zk", zk_connect, "--zk-auth", "intruder:guess", env=env)
    assert intruder.returncode == 2 and f"may not change: {zkpaths.ROOT}" in intruder.stderr


async def test_certificates_rotate_without_a_restart(secure_fleet, ca, tmp_path: Path):
    (bookie,) = secure_fleet.start(1)
    tls = client_context(identity(ca, tmp_path / "app", Role.CLIENT))
    old = await BookieClient.connect(bookie.address, tls=tls)
    old_serial = old._transport.get_extra_info("peercert")["serialNumber"]

    write_tls_dir(bookie.flags["tls_dir"], ca.issue(bookie.bookie_id, [Role.BOOKIE], LOOPBACK_NAMES))
    async with await BookieClient.connect(bookie.address, tls=tls) as new:
        assert new._transport.get_extra_info("peercert")["serialNumber"] != old_serial
        assert (await new.bookie_info()).state == wire.BookieState.WRITABLE
    assert (await old.bookie_info()).state == wire.BookieState.WRITABLE  # open connections keep working
    await old.close()
    assert bookie.running


def test_bookie_http_serves_https_when_asked_and_plain_by_default(zk_connect, tmp_path: Path, ca):
    with BookieFleet(zk_connect, tmp_path / "bookies", ca=ca) as fleet:
        plain = fleet.add()
        https = fleet.add(http_tls=True)
        for bookie in (plain.start(), https.start()):
            bookie.wait_ready()  # over HTTPS for the second, verified against the fleet's CA

        with urllib.request.urlopen(plain.http_url("/healthz"), timeout=10) as reply:
            assert plain.http_url("/healthz").startswith("http://") and reply.read() == b"ok\n"
        url = https.http_url("/metrics")
        assert url.startswith("https://")
        with urllib.request.urlopen(url, timeout=10, context=https.http_context()) as reply:
            assert b"bookie_add_entries" in reply.read()
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain answer on the HTTPS port
            urllib.request.urlopen(url.replace("https://", "http://"), timeout=10)
        (tmp_path / "other-ca.pem").write_bytes(CertificateAuthority.create().cert_pem)
        stranger = ssl.create_default_context(cafile=tmp_path / "other-ca.pem")
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(url, timeout=10, context=stranger)


def test_https_needs_the_bookies_certificate(tmp_path: Path):
    with pytest.raises(ValueError, match=r"--http-tls .* needs --tls-dir"):
        BookieConfig("b", 3181, tmp_path / "journal", tmp_path / "ledgers", "127.0.0.1:2181", http_tls=True)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bookfleet", "--log-level", "WARNING", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )


def test_cli_against_a_secure_fleet_needs_its_tls_dir(zk_connect, tmp_path: Path, ca, monkeypatch):
    monkeypatch.setenv(ZK_AUTH_ENV, ZK_AUTH)  # the bookies inherit it
    with BookieFleet(zk_connect, tmp_path / "bookies", ca=ca) as fleet:
        fleet.start(3)
        env = {k: v for k, v in os.environ.items() if k not in (TLS_DIR_ENV, ZK_AUTH_ENV)}
        created = _cli("ledger", "create", "--zk", zk_connect, "--zk-auth", ZK_AUTH, env=env)
        assert created.returncode == 0, created.stderr
        ledger_id = created.stdout.strip()

        anonymous = _cli("ledger", "list", "--zk", zk_connect, env=env)
        assert anonymous.returncode == 2
        assert "--zk-auth" in anonymous.stderr and len(anonymous.stderr.strip().splitlines()) == 1

        no_tls = _cli("ledger", "write", ledger_id, "--count", "3", "--zk", zk_connect, "--zk-auth", ZK_AUTH, env=env)
        assert no_tls.returncode == 2
        assert "requires mutual TLS: pass --tls-dir" in no_tls.stderr
        assert len(no_tls.stderr.strip().splitlines()) == 1

        client_dir = identity(ca, tmp_path / "cli", Role.CLIENT)
        secure = {**env, TLS_DIR_ENV: str(client_dir), ZK_AUTH_ENV: ZK_AUTH}
        written = _cli("ledger", "write", ledger_id, "--count", "3", "--zk", zk_connect, env=secure)
        assert written.returncode == 0, written.stderr
        read = _cli("ledger", "read", ledger_id, "--zk", zk_connect, "--json", env=secure)
        assert read.returncode == 0, read.stderr
        assert read.stdout.count("entry_id") == 3 or len(read.stdout.strip().splitlines()) == 3


def test_an_unusable_zookeeper_tls_dir_is_one_line_naming_the_file(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in (ZK_AUTH_ENV, TLS_DIR_ENV, ZK_TLS_DIR_ENV)}
    listed = _cli("ledger", "list", "--zk", "127.0.0.1:1", "--zk-tls-dir", str(tmp_path / "none"), env=env)
    assert listed.returncode == 2
    assert listed.stderr.strip() == (
        f"bookfleet ledger: ZooKeeper TLS file {tmp_path / 'none' / 'ca.pem'} is missing "
        f"(from --zk-tls-dir or ${ZK_TLS_DIR_ENV})"
    )


def test_standalone_secure_prints_what_a_client_needs_and_speaks_tls_to_zookeeper(tmp_path: Path):
    data_dir = tmp_path / "fleet"
    env = {k: v for k, v in os.environ.items() if k not in (TLS_DIR_ENV, ZK_AUTH_ENV, ZK_TLS_DIR_ENV)}
    command = [sys.executable, "-m", "bookfleet", "--log-level", "WARNING", "standalone", "--secure", "--bookies", "3"]
    standalone = subprocess.Popen(
        [*command, "--no-auto-recovery", "--data-dir", str(data_dir)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        lines = []
        while not lines or not lines[-1].startswith("running"):
            line = standalone.stdout.readline()
            assert line, "standalone exited:\n" + "".join(lines)
            lines.append(line)
        exports = dict(
            line.strip().removeprefix("export ").split("=", 1) for line in lines if line.strip().startswith("export ")
        )
        zk = next(line.split()[1] for line in lines if line.startswith("ZooKeeper:"))
        assert exports[TLS_DIR_ENV] == str(data_dir.resolve() / "tls" / "client")
        assert exports[ZK_TLS_DIR_ENV] == exports[TLS_DIR_ENV]
        assert sorted(p.name for p in Path(exports[TLS_DIR_ENV]).iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
        client = {**env, **exports}

        created = _cli("ledger", "create", "--zk", zk, env=client)
        assert created.returncode == 0, created.stderr
        ledger_id = created.stdout.strip()
        assert _cli("ledger", "write", ledger_id, "--count", "2", "--zk", zk, env=client).returncode == 0
        without_tls = _cli("ledger", "read", ledger_id, "--zk", zk, env={**client, TLS_DIR_ENV: ""})
        assert without_tls.returncode == 2 and "requires mutual TLS" in without_tls.stderr
        # ZooKeeper serves only TLS: a plain session gets nowhere, a certificate of another CA neither.
        with pytest.raises(ZooKeeperUnreachable):
            zkclient.connect(zk, timeout=3)
        stranger = identity(CertificateAuthority.create(), tmp_path / "stranger", Role.CLIENT)
        with pytest.raises(ZooKeeperUnreachable):
            zkclient.connect(zk, timeout=3, tls_dir=stranger)
        plain_cli = _cli("ledger", "list", "--zk", zk, env={**client, ZK_TLS_DIR_ENV: ""})
        assert plain_cli.returncode == 2 and "unreachable" in plain_cli.stderr
        # Over TLS but without the credential, the ACLs still hold.
        with zkclient.session(zk, tls_dir=exports[ZK_TLS_DIR_ENV]) as anonymous, pytest.raises(NoAuthError):
            anonymous.create(f"{zkpaths.AVAILABLE}/fake-bookie", b"{}", ephemeral=True)
    finally:
        os.killpg(standalone.pid, signal.SIGINT)
        standalone.wait(60)
