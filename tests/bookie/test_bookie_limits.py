"""A real bookie process against hostile or careless clients: ids no storage can hold, read floods from a client
that never reads, long polls left behind, too many or idle connections, pipelined adds under admission limits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket

import pytest

from bookfleet import wire
from bookfleet.bkprotocol import OperationType
from bookfleet.bookie.checkpoint import LastLogMark
from bookfleet.bookie.journal import JournalPosition, journal_seqs
from bookfleet.client.connection import BadRequestError, BookieClient
from bookfleet.fleet import BookieFleet
from bookfleet.polling import wait_for
from tests.fixtures.bkclient import v3_request
from tests.fixtures.bookies import MASTER_KEY, encode_test_entry, http_get, rss_bytes

POISON = 2**63
"""A ledger id a u64 field carries and no SQLite integer holds: it used to break every later flush."""
POISON_ON_THE_WIRE = POISON - 2**64
"""POISON as V3's int64 ledgerId carries it (the same varint): protobuf will not set 2**63 itself in one."""


def metric(bookie, name: str) -> float:
    _, text = http_get(bookie.http_port, "/metrics")
    return float(re.search(rf"^{name} (\S+)$", text, re.M)[1])


async def test_ids_out_of_range_are_refused_and_flushes_checkpoints_and_restarts_stay_healthy(bookie_fleet):
    (bookie,) = bookie_fleet.start(1, journal_roll_bytes=4096, zk_session_timeout=4)
    async with await BookieClient.connect(bookie.address) as client:
        poison_entry = wire.encode_entry(wire.Digester("crc32c"), POISON, 0, -1, 1, b"poison")
        answers = await asyncio.gather(
            client.add_entry(MASTER_KEY, poison_entry),
            client.read_lac_and_last(POISON_ON_THE_WIRE, fence=True, master_key=MASTER_KEY),
            client.write_lac(MASTER_KEY, POISON_ON_THE_WIRE, 0),
            client.add_entry(MASTER_KEY, wire.encode_entry(wire.Digester("crc32c"), 3, -5, -1, 1, b"negative id")),
            client.read_range(3, -1, 4),
            return_exceptions=True,
        )
        entries = [encode_test_entry(1, i, os.urandom(200)) for i in range(100)]
        for entry in entries:  # the same connection goes on: a bad field refuses its request only
            await client.add_entry(MASTER_KEY, entry)

    # Flushes go on: the LastLogMark moves past the journal files of the adds, and they are trimmed.
    last_seq = journal_seqs(bookie.journal_dir)[-1]
    mark = await asyncio.to_thread(
        wait_for,
        lambda: (m := LastLogMark(bookie.ledger_dir).read()) >= JournalPosition(last_seq, 0) and m,
        30,
        "the LastLogMark to pass the adds",
    )
    # Trimming follows the mark's write: wait for it rather than race it.
    await asyncio.to_thread(wait_for, lambda: journal_seqs(bookie.journal_dir)[0] >= mark.seq, 30,
                            f"the journal files before {mark.seq} to be trimmed")
    bookie.kill9()
    bookie.start().wait_ready()
    async with await BookieClient.connect(bookie.address) as client:
        assert await client.read_range(1, 0, 99) == entries
    log = bookie.log_path.read_text()
    assert "Traceback" not in log and "flush failed" not in log

    messages = [str(answer) for answer in answers]
    assert all(isinstance(answer, BadRequestError) for answer in answers), "\n".join(messages)
    assert f"ledger id {POISON_ON_THE_WIRE} is outside [0, {2**63 - 1}]" in messages[0]
    assert f"READ_ENTRY for ledger {POISON_ON_THE_WIRE}: ledger id {POISON_ON_THE_WIRE} is outside" in messages[1]
    assert f"WRITE_LAC for ledger {POISON_ON_THE_WIRE}: ledger id {POISON_ON_THE_WIRE} is outside" in messages[2]
    assert "ADD_ENTRY for ledger 3: entry id -5 is outside" in messages[3]
    assert "first entry id -1 is outside" in messages[4]


def flood_without_reading(port: int, request: bytes, count: int) -> socket.socket:
    """Send `count` copies of `request` and never read an answer; the socket stays open for the caller."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.sendall(request * count)
    return sock


async def test_read_flood_from_a_client_that_never_reads_stays_bounded_and_others_are_served(bookie_fleet):
    (bookie,) = bookie_fleet.start(1)
    payload = os.urandom(64 * 1024)
    async with await BookieClient.connect(bookie.address) as client:
        await asyncio.gather(*(client.add_entry(MASTER_KEY, encode_test_entry(5, i, payload)) for i in range(64)))
    before = rss_bytes(bookie.process.pid)

    # 300 READ_RANGEs of 4 MiB answers each: 13 KB of requests asking for 1.2 GiB.
    request = v3_request(OperationType.READ_RANGE, 1, ledgerId=5, firstEntryId=0, lastEntryId=63, maxBytes=8 << 20)
    flood = await asyncio.to_thread(flood_without_reading, bookie.port, request, 300)
    peak = before
    async with await BookieClient.connect(bookie.address) as other:
        for i in range(20):  # another client reads and writes meanwhile
            assert len(await other.read_range(5, i, i + 1)) == 2
            await other.add_entry(MASTER_KEY, encode_test_entry(6, i, b"still served"))
            peak = max(peak, rss_bytes(bookie.process.pid))
            await asyncio.sleep(0.05)
    assert peak - before < 200 * 2**20, f"the bookie grew by {(peak - before) >> 20} MiB"
    flood.close()
    assert bookie.running


async def test_long_polls_are_capped_per_connection_and_end_with_their_connection(bookie_fleet):
    (bookie,) = bookie_fleet.start(1, max_long_polls=3)
    async with await BookieClient.connect(bookie.address) as writer:
        await writer.add_entry(MASTER_KEY, encode_test_entry(1, 0, b"x"))
    poller = await BookieClient.connect(bookie.address)
    polls = [asyncio.create_task(poller.read_lac(1, previous=5, timeout=100)) for _ in range(3)]
    await asyncio.to_thread(wait_for, lambda: metric(bookie, "bookie_long_polls") == 3, 30, "three long polls")
    # A 4th long poll on the same connection is answered at once with the LAC it would have timed out with.
    assert await asyncio.wait_for(poller.read_lac(1, previous=5, timeout=100), 30) == -1
    assert not any(poll.done() for poll in polls)
    await poller.close()
    await asyncio.gather(*polls, return_exceptions=True)
    # The bookie drops them when their connection closes, not 100 s later.
    await asyncio.to_thread(wait_for, lambda: metric(bookie, "bookie_long_polls") == 0, 30, "the polls to end")


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except BlockingIOError:
        return False


async def test_connection_limit_and_idle_timeout(bookie_fleet):
    (bookie,) = bookie_fleet.start(1, max_connections=2, idle_timeout=2.0)
    busy = await BookieClient.connect(bookie.address)
    idle = socket.create_connection(("127.0.0.1", bookie.port))
    idle.setblocking(False)
    await asyncio.to_thread(wait_for, lambda: metric(bookie, "bookie_connections") == 2, 30, "two connections")
    extra = socket.create_connection(("127.0.0.1", bookie.port))
    extra.setblocking(False)
    await asyncio.to_thread(wait_for, lambda: closed_by_peer(extra), 30, "the connection over the limit to close")
    assert metric(bookie, "bookie_refused_connections_total") == 1

    async def keep_busy() -> None:
        for i in range(1000):
            await busy.add_entry(MASTER_KEY, encode_test_entry(1, i, b"busy"))
            if closed_by_peer(idle):
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(keep_busy(), 60)  # the idle one is closed, the busy one never
    assert closed_by_peer(idle)
    assert (await busy.bookie_info()).total_bytes > 0
    await busy.close()
    extra.close()
    idle.close()


async def test_pipelined_adds_beyond_the_admission_limits_all_complete(bookie_fleet):
    (bookie,) = bookie_fleet.start(1, max_connection_add_bytes=40_000, max_add_bytes=60_000)
    clients = [await BookieClient.connect(bookie.address) for _ in range(3)]
    payload = os.urandom(10_000)
    adds = [
        client.add_entry(MASTER_KEY, encode_test_entry(ledger, i, payload))
        for ledger, client in enumerate(clients)
        for i in range(100)
    ]
    assert len(await asyncio.wait_for(asyncio.gather(*adds), 120)) == 300
    for ledger, client in enumerate(clients):
        assert await client.read_range(ledger, 0, 99) == [encode_test_entry(ledger, i, payload) for i in range(100)]
        await client.close()


@pytest.fixture(autouse=True)
def _no_tracebacks(bookie_fleet):
    """Whatever these clients did, the bookie logged no traceback."""
    yield
    for bookie in bookie_fleet.bookies:
        assert "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


async def test_reading_goes_on_after_answers_that_filled_the_pending_bound_are_taken(bookie_fleet):
    (bookie,) = bookie_fleet.start(1, max_pending_response_bytes=1_000_000)
    async with await BookieClient.connect(bookie.address) as client:
        entries = [encode_test_entry(4, i, os.urandom(100_000)) for i in range(6)]
        await asyncio.gather(*(client.add_entry(MASTER_KEY, entry) for entry in entries))
        for _ in range(5):  # two 600 KB answers pass the bound: reading pauses until they have left
            assert await asyncio.wait_for(
                asyncio.gather(client.read_range(4, 0, 5), client.read_range(4, 0, 5)), 30
            ) == [entries, entries]
            assert await asyncio.wait_for(client.read_entry(4, 5), 30) == entries[5]


def send_until_refused(port: int, request: bytes, count: int) -> int:
    """Send `count` copies of `request` until the bookie stops taking them (nothing moves for 5 s); the bytes
    sent."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        sent = 0
        with contextlib.suppress(TimeoutError):
            for _ in range(count):
                sock.sendall(request)
                sent += len(request)
        return sent


async def test_adds_waiting_for_admission_count_toward_the_add_byte_limits(zk_connect, link_proxy, tmp_path):
    """A new ledger's first adds wait for the admission lookup in ZooKeeper (stalled here); they used to wait
    outside the add-byte accounting, so one client could make the bookie hold 2,000 frames of them. Now they
    count: the bookie stops reading once `max_connection_add_bytes` of them wait."""
    zk_address, chroot = zk_connect.split("/", 1)
    proxy = await link_proxy(int(zk_address.rsplit(":", 1)[1]))
    limits = {"max_connection_add_bytes": 1 << 20, "max_add_bytes": 2 << 20, "zk_session_timeout": 60}
    with BookieFleet(f"{proxy.address}/{chroot}", tmp_path / "admitting", **limits) as fleet:
        (bookie,) = await asyncio.to_thread(fleet.start, 1)  # its ZooKeeper link is this event loop's proxy
        before = rss_bytes(bookie.process.pid)
        proxy.stall()  # the bookie's ZooKeeper session stays connected and answers nothing
        entry = encode_test_entry(77, 0, os.urandom(1 << 20))
        add = v3_request(OperationType.ADD_ENTRY, 1, ledgerId=77, entryId=0, masterKey=MASTER_KEY, body=entry)
        sent = await asyncio.to_thread(send_until_refused, bookie.port, add, 128)
        grown = rss_bytes(bookie.process.pid) - before
        proxy.flow()
        assert sent < 64 << 20 and grown < 48 << 20, f"{sent >> 20} MiB sent, the bookie grew by {grown >> 20} MiB"
        assert bookie.running
