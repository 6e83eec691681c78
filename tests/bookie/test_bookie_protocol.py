"""A real bookie process over TCP, spoken to by bookfleet's client in BookKeeper V3 with bookfleet's extensions: every
op, fencing, the LAC long poll, probes, registration, hostile clients."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import struct

import pytest

from bookfleet import bkprotocol, bkwire, wire
from bookfleet.bkprotocol import OperationType, StatusCode
from bookfleet.client.connection import (
    BadRequestError,
    BookieClient,
    FencedError,
    NoSuchEntryError,
    NoSuchLedgerOnBookieError,
    UnauthorizedError,
)
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.registry import BookieInfo, BookieMode, BookieRegistry
from bookfleet.polling import wait_for
from tests.fixtures.bkclient import v3_request
from tests.fixtures.bookies import MASTER_KEY, encode_test_entry, http_get, rss_bytes

OTHER_KEY = wire.master_key(b"someone else")


async def test_every_op_round_trips(bookie_fleet, zk):
    (bookie,) = bookie_fleet.start(1, zones=["zone-a"])
    async with await BookieClient.connect(bookie.address) as client:
        entries = [encode_test_entry(5, i, os.urandom(100 + i)) for i in range(10)]
        acks = await asyncio.gather(*(client.add_entry(MASTER_KEY, e) for e in entries))
        assert acks == [(5, i) for i in range(10)]

        assert await client.read_entry(5, 3) == entries[3]
        assert wire.decode_entry(wire.Digester("crc32c"), await client.read_entry(5, 9)).entry_id == 9
        assert await client.read_lac_and_last(5) == (8, 9)
        assert await client.read_range(5, 2, 6) == entries[2:7]
        assert await client.read_range(5, 0, 9, max_bytes=300) == entries[:2]  # stops before passing max_bytes
        assert await client.read_range(5, 8, 100) == entries[8:]

        await client.write_lac(MASTER_KEY, 5, 9)
        assert await client.read_lac(5) == 9
        await client.force_ledger(5)
        info = await client.bookie_info()
        assert info.state == wire.BookieState.WRITABLE and 0 < info.free_bytes <= info.total_bytes

        with pytest.raises(NoSuchLedgerOnBookieError, match="READ_ENTRY for ledger 77"):
            await client.read_entry(77, 0)
        with pytest.raises(NoSuchEntryError, match="no entry 42"):
            await client.read_entry(5, 42)
        with pytest.raises(UnauthorizedError, match="ADD_ENTRY for ledger 5: master key"):
            await client.add_entry(OTHER_KEY, encode_test_entry(5, 10, b"x"))
        with pytest.raises(UnauthorizedError):
            await client.write_lac(OTHER_KEY, 5, 10)

    assert http_get(bookie.http_port, "/healthz") == (200, "ok\n")
    assert http_get(bookie.http_port, "/readyz") == (200, "ready\n")
    status, metrics = http_get(bookie.http_port, "/metrics")
    assert status == 200
    assert "bookie_add_entries_total 10.0" in metrics
    assert 'bookie_request_errors_total{op="ADD_ENTRY",status="UNAUTHORIZED"} 1.0' in metrics
    assert "bookie_add_latency_seconds_count 10.0" in metrics
    syncs = float(re.search(r"^bookie_journal_sync_latency_seconds_count (\S+)$", metrics, re.M)[1])
    synced = float(re.search(r"^bookie_journal_synced_bytes_total (\S+)$", metrics, re.M)[1])
    assert syncs >= 1 and synced > sum(map(len, entries))  # group commits: write + fdatasync of every record
    assert f'bookie_journal_sync_latency_seconds_bucket{{le="+Inf"}} {syncs}' in metrics
    assert float(re.search(r"^bookie_event_loop_lag_seconds_count (\S+)$", metrics, re.M)[1]) >= 1  # its probe runs

    registered = BookieInfo.decode(bookie.bookie_id, zk.get(zkpaths.available(bookie.bookie_id))[0])
    assert registered.address == bookie.address and registered.zone == "zone-a"
    assert registered.http_port == bookie.http_port and registered.total_bytes > 0
    (info,) = BookieRegistry(zk).writable()
    assert (info.bookie_id, info.state) == (bookie.bookie_id, BookieMode.WRITABLE)

    assert bookie.stop() == 0  # graceful: unregisters at once, no session timeout to wait for
    assert zk.exists(zkpaths.available(bookie.bookie_id)) is None


async def test_fencing_and_lac_long_poll(bookie_fleet):
    (bookie,) = bookie_fleet.start(1)
    async with await BookieClient.connect(bookie.address) as client:
        for i in range(3):
            await client.add_entry(MASTER_KEY, encode_test_entry(1, i, b"payload"))

        # Long poll: answers as soon as the LAC passes `previous`, or with the current LAC at the timeout.
        waiting = asyncio.create_task(client.read_lac(1, previous=1, timeout=10))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await client.add_entry(MASTER_KEY, encode_test_entry(1, 3, b"payload"))
        assert await asyncio.wait_for(waiting, 5) == 2
        assert await client.read_lac(1, previous=5, timeout=0.1) == 2

        # A caller that gives up early: the bookie's late answer (here an error) must not harm the connection.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.read_lac(99, previous=0, timeout=0.3), 0.05)
        await asyncio.sleep(0.4)
        assert await client.read_lac(1) == 2

        with pytest.raises(UnauthorizedError):
            await client.read_lac_and_last(1, fence=True, master_key=OTHER_KEY)
        with pytest.raises(ValueError, match="master key"):
            await client.read_lac_and_last(1, fence=True)
        assert await client.read_lac_and_last(1, fence=True, master_key=MASTER_KEY) == (2, 3)
        with pytest.raises(FencedError, match="ADD_ENTRY for ledger 1: ledger 1 is fenced"):
            await client.add_entry(MASTER_KEY, encode_test_entry(1, 4, b"late writer"))
        with pytest.raises(FencedError, match="WRITE_LAC for ledger 1: ledger 1 is fenced"):
            await client.write_lac(MASTER_KEY, 1, 3)
        assert await client.add_entry(MASTER_KEY, encode_test_entry(1, 4, b"recovery"), recovery=True) == (1, 4)

        # Fencing a ledger this bookie never saw keeps a stale writer out of it too.
        assert await client.read_lac_and_last(2, fence=True, master_key=MASTER_KEY) == (-1, -1)
        with pytest.raises(FencedError):
            await client.add_entry(MASTER_KEY, encode_test_entry(2, 0, b"stale"))


@pytest.mark.parametrize("admission", [False, True], ids=["plain", "admission"])
async def test_writer_epoch_refuses_older_writers_across_a_crash(bookie_fleet, zk, admission):
    """An add of an older writer epoch is refused FENCED, an equal or newer one taken (a newer one raises the
    bookie's); a raise answers the bookie's view; both survive kill -9. With admission, adds of a ledger not yet
    admitted (every ledger after a restart) take the checked path, which must refuse them just the same."""
    (bookie,) = bookie_fleet.start(1, no_verify_ledgers=not admission)
    ledger_id = MetadataStore(zk).create(new_metadata([bookie.bookie_id], 1, 1))
    async with await BookieClient.connect(bookie.address) as client:
        for i in range(3):
            await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, i, b"first writer"))
        assert await client.raise_writer_epoch(MASTER_KEY, ledger_id, 1) == (1, 2)
        with pytest.raises(FencedError, match=f"ADD_ENTRY for ledger {ledger_id}: .*writer epoch 0 is older than 1"):
            await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 3, b"stale writer"))
        assert await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 3, b"w2"), writer_epoch=1)
        assert await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 4, b"w3"), writer_epoch=2)
        with pytest.raises(FencedError, match=r"RAISE_EPOCH .*writer epoch 1 is older than 2"):
            await client.raise_writer_epoch(MASTER_KEY, ledger_id, 1)
        with pytest.raises(UnauthorizedError):
            await client.raise_writer_epoch(OTHER_KEY, ledger_id, 3)
        for bad in (client.raise_writer_epoch(MASTER_KEY, ledger_id, 2**63),
                    client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 5, b"x"), writer_epoch=2**63)):
            with pytest.raises(BadRequestError, match=f"writer epoch {2**63} is outside"):
                await bad  # refused, and the connection goes on
        assert await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 5, b"recovery"), recovery=True)

    bookie.kill9()
    bookie.start().wait_ready()
    async with await BookieClient.connect(bookie.address) as client:
        with pytest.raises(FencedError, match="writer epoch 1 is older than 2"):
            await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 6, b"stale writer"), writer_epoch=1)
        assert await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 6, b"w3"), writer_epoch=2)
        assert await client.read_lac_and_last(ledger_id) == (5, 6)


async def test_a_new_ledgers_adds_wait_together_for_its_admission_lookup_then_take_the_fast_path(bookie_fleet, zk):
    """A repair sends a whole fragment's copies to its replacement bookie before that bookie's admission lookup of
    the ledger answers (a new ledger's writer its first window): they wait together for that one lookup, then are
    applied as fast-path adds, answered with their group commit and counted in bookie_add_entries. They were decoded
    by protobuf and run one by one instead, most of a repair's bookie CPU per entry, and counted nowhere. Adds of a
    ledger without metadata are each refused after the lookup, and the connection goes on."""
    (bookie,) = bookie_fleet.start(1, no_verify_ledgers=False)
    ledger_id = MetadataStore(zk).create(new_metadata([bookie.bookie_id], 1, 1))
    entries = [encode_test_entry(ledger_id, i, os.urandom(100)) for i in range(200)]
    async with await BookieClient.connect(bookie.address) as client:
        copies = await asyncio.gather(*(client.add_entry(MASTER_KEY, e, recovery=True) for e in entries))
        assert copies == [(ledger_id, i) for i in range(200)]
        unknown = ledger_id + 1000
        refused = await asyncio.gather(
            *(client.add_entry(MASTER_KEY, encode_test_entry(unknown, i, b"x")) for i in range(20)),
            return_exceptions=True,
        )
        assert all(isinstance(error, NoSuchLedgerOnBookieError) for error in refused), refused
        assert await client.read_range(ledger_id, 0, 199) == entries
    _, metrics = http_get(bookie.http_port, "/metrics")
    assert "bookie_add_entries_total 200.0" in metrics and "bookie_add_latency_seconds_count 200.0" in metrics
    assert 'bookie_request_errors_total{op="ADD_ENTRY",status="NO_SUCH_LEDGER"} 20.0' in metrics
    assert "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()


def raw_exchange(port: int, payload: bytes, half_close: bool = False) -> tuple[list, bool]:
    """Send raw bytes; return the V3 answers the bookie sent and whether it closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        closed = False
        try:
            while chunk := sock.recv(65536):
                received += chunk
            closed = True
        except TimeoutError:
            pass
    answers, pos = [], 0
    while pos + 4 <= len(received):
        (length,) = struct.unpack_from(">I", received, pos)
        answers.append(bkprotocol.Response.FromString(bytes(received[pos + 4 : pos + 4 + length])))
        pos += 4 + length
    return answers, closed


def client_laid_add(txn_id: int, entry: bytes, writer_epoch: int = 0, entry_id: int | None = None) -> bytes:
    """An ADD frame as bookfleet's client lays it out (AddRequestEncoder), its request's entry id `entry_id` when
    given (else the entry header's)."""
    ledger_id, header_entry_id = wire.entry_ids(entry)[:2]
    encoder = bkwire.AddRequestEncoder(ledger_id, MASTER_KEY, writer_epoch)
    txn = bkwire.varint(txn_id)
    return encoder.frame_head(txn, header_entry_id if entry_id is None else entry_id, len(entry)) + entry


async def test_hostile_clients_only_lose_their_own_connection(bookie_fleet):
    (bookie,) = bookie_fleet.start(1, max_in_flight=8)
    port = bookie.port
    good = await BookieClient.connect(bookie.address)

    async def steady_writer() -> int:
        for i in range(300):
            assert await good.add_entry(MASTER_KEY, encode_test_entry(9, i, b"steady")) == (9, i)
        return 300

    writer = asyncio.create_task(steady_writer())
    # Frames that cannot be read: closed without an answer (nothing to match one with), as a BookKeeper bookie does.
    unreadable = {
        "huge length prefix": wire.LENGTH_PREFIX.pack(2**31) + b"\x0a" + b"\0" * 11,
        "bookfleet's old frame": wire.LENGTH_PREFIX.pack(12) + bytes([1, 2, 0, 0]) + b"\0" * 8,
        "neither V2 nor V3": wire.LENGTH_PREFIX.pack(3) + b"abc",
        "no protobuf": wire.LENGTH_PREFIX.pack(4) + b"\x0a\xff\xff\xff",
        "header without txnId": wire.LENGTH_PREFIX.pack(6) + b"\x0a\x04\x08\x03\x10\x02",
    }
    for name, payload in unreadable.items():
        answers, closed = await asyncio.to_thread(raw_exchange, port, payload)
        assert closed and not answers, name
    # Well-framed requests with a field out of range: refused EBADREQ naming it, and the connection goes on.
    refused = {
        "unknown operation": (bkwire.encode_v3(bkwire.v3_response(99, 79, 0)), "V3 operation 99 is not served"),
        "short ADD entry": (v3_request(
            OperationType.ADD_ENTRY, 80, ledgerId=9, entryId=0, masterKey=MASTER_KEY, body=b"\0" * 10
        ), "ADD_ENTRY for ledger 9: ADD entry of 10 bytes is shorter than its header"),
        "RAISE_EPOCH without an epoch": (v3_request(
            OperationType.RAISE_EPOCH, 81, ledgerId=9, masterKey=MASTER_KEY
        ), "RAISE_EPOCH for ledger 9: V3 RAISE_EPOCH request without writerEpoch"),
        "READ_RANGE backwards": (v3_request(
            OperationType.READ_RANGE, 82, ledgerId=9, firstEntryId=5, lastEntryId=4, maxBytes=1
        ), "last entry id 4 is before first entry id 5"),
        # Laid out as bookfleet's client writes an add (the bookie's in-place reader), a field out of range.
        "client-laid ADD, writer epoch out of range": (
            client_laid_add(84, encode_test_entry(9, 0, b"x"), writer_epoch=2**63), "writer epoch 9223372036854775808"
        ),
        "client-laid ADD, entry header of another entry": (
            client_laid_add(85, encode_test_entry(9, 1, b"x"), entry_id=0), "entry header names ledger 9 entry 1"
        ),
    }
    follow_up = v3_request(OperationType.GET_BOOKIE_INFO, 83, requested=1)
    for name, (payload, message) in refused.items():
        answers, closed = await asyncio.to_thread(raw_exchange, port, payload + follow_up, True)
        assert closed, name  # the client's half close ends it, after both answers
        assert [a.status for a in answers] == [StatusCode.EBADREQ, StatusCode.EOK], name
        assert message in answers[0].errorMessage, name

    # A frame cut short by the end of the stream, and plain garbage: closed.
    truncated = v3_request(OperationType.READ_ENTRY, 81, ledgerId=9, entryId=0)[:-5]
    answers, closed = await asyncio.to_thread(raw_exchange, port, truncated, True)
    assert closed and not answers
    for seed in range(5):
        garbage = struct.pack(">I", 1000 + seed) + os.urandom(2000)
        _, closed = await asyncio.to_thread(raw_exchange, port, garbage)
        assert closed

    # A client that floods requests and never reads: the bookie stops reading it instead of buffering without end.
    flood = socket.create_connection(("127.0.0.1", port))
    flood.setblocking(False)
    span = {"ledgerId": 9, "firstEntryId": 0, "lastEntryId": 299, "maxBytes": 1 << 20}
    chunk = v3_request(OperationType.READ_RANGE, 1, **span) * 1000
    limit, sent = 2000 * len(chunk), 0
    deadline = asyncio.get_running_loop().time() + 2
    while sent < limit and asyncio.get_running_loop().time() < deadline:
        try:
            sent += flood.send(chunk)
        except BlockingIOError:
            await asyncio.sleep(0.05)
    assert sent < limit, "the bookie kept reading a client that never reads its answers"
    assert rss_bytes(bookie.process.pid) < 400 * 2**20

    assert await asyncio.wait_for(writer, 90) == 300  # a bound on being blocked, not a speed: the machine may be busy

    # The in-flight bound: with 8 long polls running, a 9th request waits until one of them has answered.
    answered: list[str] = []
    polls = [asyncio.create_task(good.read_lac(9, previous=298, timeout=60)) for _ in range(8)]
    for poll in polls:
        poll.add_done_callback(lambda _: answered.append("poll"))
    await asyncio.to_thread(
        wait_for, lambda: "bookie_long_polls 8.0" in http_get(bookie.http_port, "/metrics")[1], 30, "8 long polls"
    )
    info = asyncio.create_task(good.bookie_info())
    info.add_done_callback(lambda _: answered.append("info"))
    async with await BookieClient.connect(bookie.address) as other:  # raising the LAC answers the polls
        await other.add_entry(MASTER_KEY, encode_test_entry(9, 300, b"steady"))
    assert (await asyncio.wait_for(info, 30)).total_bytes > 0
    assert await asyncio.gather(*polls) == [299] * 8
    assert answered.index("poll") < answered.index("info")
    flood.close()
    await good.close()
    async with await BookieClient.connect(bookie.address) as fresh:
        assert await fresh.read_entry(9, 300) == encode_test_entry(9, 300, b"steady")
    assert bookie.running
