"""Protocol fuzzing of a real bookie process, in each protocol it serves (Apache BookKeeper's V2 and V3, the latter
with bookfleet's extensions: an add's writer epoch, RAISE_EPOCH, READ_RANGE): seeded frames that know the layout
(valid headers and body sizes with hostile fields: ids at and past every range edge, random keys, flags, epochs,
timeouts, spans) on one pipelined connection, plus frames that break the format (garbage, bad lengths, a first frame
of neither protocol, short bodies) on connections of their own. Afterwards the bookie is alive,
logged no traceback, still flushes (its LastLogMark moved), stayed within a memory bound, and the entries written
before the fuzzing read back byte-exact."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import struct
import time

import pytest

from bookfleet import bkprotocol, bkwire, wire
from bookfleet.bkprotocol import OperationType
from bookfleet.bkwire import V2Op
from bookfleet.bookie.checkpoint import LastLogMark
from bookfleet.client.connection import BookieClient
from bookfleet.polling import wait_for
from tests.fixtures.bookies import MASTER_KEY, encode_test_entry, rss_bytes

pytestmark = pytest.mark.chaos

SEED = int(os.environ.get("BOOKFLEET_FUZZ_SEED", "20261126"))
KNOWN_LEDGER = 77
FUZZ_KEY = wire.master_key(b"fuzzer")
U64, I64 = struct.Struct(">Q"), struct.Struct(">q")
EDGE_IDS = [0, 1, 2**31 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
EDGE_ENTRY_IDS = [-(2**63), -2, -1, 0, 1, 2**31, 2**63 - 1]
BREAKING_SHARE = 0.01
"""Frames that break the format close their connection, so they get connections of their own."""


class FrameGenerator:
    """Hostile field values (ids at and past every range edge, keys, epochs) from one seeded Random."""

    def __init__(self, seed: int):
        self.random = random.Random(seed)
        self.request_id = 0

    def ledger_id(self) -> int:
        r = self.random.random()
        if r < 0.4:
            return 1000 + self.random.randrange(5)
        if r < 0.5:
            return KNOWN_LEDGER
        if r < 0.8:
            return self.random.choice(EDGE_IDS)
        return self.random.getrandbits(64)

    def entry_id(self) -> int:
        r = self.random.random()
        if r < 0.4:
            return self.random.randrange(50)
        if r < 0.8:
            return self.random.choice(EDGE_ENTRY_IDS)
        return self.random.getrandbits(64) - 2**63

    def writer_epoch(self) -> int:
        return self.random.choice([0, 0, 1, 2, 2**63 - 1, 2**63, self.random.getrandbits(64)])

class BookKeeperFrames(FrameGenerator):
    """The same hostile fields in Apache BookKeeper's V2 or V3 frames; `request` stays within what a connection
    survives (V2: the ops V2 serves; V3: any operation, an unserved one is answered EBADREQ)."""

    def __init__(self, seed: int, v3: bool):
        super().__init__(seed)
        self.v3 = v3

    def key(self) -> bytes:
        if self.random.random() < 0.8:
            return FUZZ_KEY[: bkwire.MASTER_KEY_SIZE]
        return self.random.randbytes(self.random.choice([0, bkwire.MASTER_KEY_SIZE, wire.MASTER_KEY_SIZE]))

    def entry(self, ledger_id: int, entry_id: int) -> bytes:
        rand = self.random
        header = I64.pack(ledger_id) + I64.pack(entry_id) + I64.pack(self.entry_id()) + U64.pack(rand.getrandbits(64))
        return header + rand.randbytes(rand.randrange(600))

    def signed(self, value: int) -> int:
        return value - 2**64 if value >= 2**63 else value

    def request(self) -> bytes:
        return self.v3_request() if self.v3 else self.v2_request()

    def v2_request(self) -> bytes:
        rand = self.random
        op = rand.choice([V2Op.ADD, V2Op.ADD, V2Op.READ, V2Op.READ, V2Op.BATCH_READ, V2Op.AUTH])
        flags = rand.getrandbits(16) if rand.random() < 0.3 else rand.choice([0, 1, 2, 4])
        ledger_id, entry_id = self.signed(self.ledger_id()), self.entry_id()
        if op == V2Op.ADD:
            body = self.key()[: bkwire.MASTER_KEY_SIZE].ljust(bkwire.MASTER_KEY_SIZE, b"\0")
            body += self.entry(ledger_id, entry_id)
        elif op == V2Op.AUTH:
            body = bkprotocol.AuthMessage(authPluginName="fuzz", payload=rand.randbytes(20)).SerializeToString()
        else:
            if op == V2Op.READ:
                body = bkwire.V2_READ.pack(ledger_id, entry_id)
            else:
                max_count = rand.choice([-1, 0, 1, 5, 2**31 - 1])
                max_size = rand.choice([-1, 0, 100, 1 << 20, 2**63 - 1])
                body = bkwire.V2_BATCH_READ.pack(ledger_id, entry_id, rand.getrandbits(63), max_count, max_size)
            body += FUZZ_KEY[: bkwire.MASTER_KEY_SIZE]  # a fencing read needs one; others ignore it
        return bkwire.encode_v2_request(op, flags, body)

    def v3_request(self) -> bytes:
        rand = self.random
        request = bkprotocol.Request()
        request.header.version = 3 if rand.random() < 0.95 else rand.choice([1, 2, 4])
        request.header.operation = rand.choice([*OperationType, OperationType.READ_ENTRY, 3, 4, 11, 12, 99])
        request.header.txnId = self.request_id = self.request_id + 1
        request.header.priority = rand.choice([0, 0, 1, 2**32 - 1])
        ledger_id, entry_id = self.signed(self.ledger_id()), self.entry_id()
        operation = request.header.operation
        if operation == OperationType.ADD_ENTRY:
            request.addRequest.SetInParent()
            fields = request.addRequest
            fields.ledgerId, fields.entryId, fields.masterKey = ledger_id, entry_id, self.key()
            fields.body = self.entry(ledger_id, entry_id) if rand.random() < 0.9 else rand.randbytes(20)
            fields.flag = rand.choice([0, 1, 1, 7])
            if rand.random() < 0.7:
                fields.writerEpoch = self.writer_epoch()
        elif operation == OperationType.READ_ENTRY:
            fields = request.readRequest
            fields.ledgerId, fields.entryId = ledger_id, entry_id
            fields.flag = rand.choice([0, 0, 1, 2, 5])
            fields.masterKey = self.key()
            if rand.random() < 0.3:
                fields.previousLAC = self.entry_id()
                fields.timeOut = rand.choice([-1, 0, 0, 1, 50, 2**40])
        elif operation == OperationType.WRITE_LAC:
            fields = request.writeLacRequest
            fields.ledgerId, fields.lac, fields.masterKey, fields.body = ledger_id, entry_id, self.key(), b"lac"
        elif operation in (OperationType.READ_LAC, OperationType.FORCE_LEDGER):
            getattr(request, bkwire._REQUEST_FIELD[operation]).ledgerId = ledger_id
        elif operation == OperationType.GET_BOOKIE_INFO:
            request.getBookieInfoRequest.requested = rand.getrandbits(63)
        elif operation == OperationType.RAISE_EPOCH:
            fields = request.raiseEpochRequest
            fields.ledgerId, fields.masterKey, fields.writerEpoch = ledger_id, self.key(), self.writer_epoch()
        elif operation == OperationType.READ_RANGE:
            fields = request.readRangeRequest
            fields.ledgerId, fields.firstEntryId, fields.lastEntryId = ledger_id, entry_id, self.entry_id()
            fields.maxBytes = rand.choice([-1, 0, 1, 100, 4096, 4096, rand.getrandbits(63)])
        elif operation == OperationType.AUTH:
            request.authRequest.authPluginName = "fuzz"
        elif operation == OperationType.START_TLS:
            request.startTLSRequest.SetInParent()
        if rand.random() < 0.05:  # a missing operation message
            request.ClearField(bkwire._REQUEST_FIELD.get(operation, "readRequest"))
        return bkwire.encode_v3(request)

    def breaking(self) -> bytes:
        rand = self.random
        kind = rand.randrange(5)
        if kind == 4:  # a first frame of neither protocol (bookfleet's own frames, version 1, among them)
            first = rand.choice([0, 1, 1, 3, 0x61, 255])
            return wire.LENGTH_PREFIX.pack(12) + bytes([first]) + rand.randbytes(11)
        if kind == 0:  # a length prefix no frame may have
            first = 0x0A if self.v3 else 2
            return wire.LENGTH_PREFIX.pack(rand.choice([0, 2**31, 2**32 - 1])) + bytes([first]) + rand.randbytes(40)
        if kind == 1 and not self.v3:  # an op V2 does not serve, or a body cut short
            if rand.random() < 0.5:
                return bkwire.encode_v2_request(rand.choice([0, 4, 5, 6, 8, 99, 255]), 0, rand.randbytes(30))
            return bkwire.encode_v2_request(rand.choice(list(V2Op)), 1, rand.randbytes(rand.randrange(16)))
        if kind == 1:  # no protobuf, or a header without its txnId
            if rand.random() < 0.5:
                return wire.LENGTH_PREFIX.pack(6) + b"\x0a\x04\x08\x03\x10\x01"
            junk = b"\x0a" + rand.randbytes(rand.randrange(1, 200))
            return wire.LENGTH_PREFIX.pack(len(junk)) + junk
        if kind == 2:
            garbage = (b"\x0a" if self.v3 else b"\x02") + rand.randbytes(rand.randrange(1, 3000))
            return wire.LENGTH_PREFIX.pack(len(garbage)) + garbage
        return self.request()[: -rand.randrange(1, 10)]  # the stream ends inside a frame


def answer_status(protocol: str, frame: bytes) -> str:
    """The status of an answer frame (without its length prefix), by name."""
    if protocol == "v2":
        (header,) = struct.unpack_from(">I", frame)
        if header >> 16 & 0xFF == V2Op.AUTH:
            return "AUTH"
        return bkwire.V2Status(struct.unpack_from(">i", frame, 4)[0]).name
    return bkprotocol.StatusCode(bkprotocol.Response.FromString(frame).status).name


async def send_breaking(port: int, payload: bytes) -> None:
    """Send on a connection of its own; the bookie must close it (an error answer first is fine)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    writer.write_eof()
    async with asyncio.timeout(30):
        while await reader.read(65536):
            pass
    writer.close()


async def read_answers(reader: asyncio.StreamReader, statuses: collections.Counter, protocol: str) -> None:
    while True:
        try:
            (length,) = wire.LENGTH_PREFIX.unpack(await reader.readexactly(wire.LENGTH_PREFIX.size))
            frame = await reader.readexactly(length)
        except asyncio.IncompleteReadError:
            return
        statuses[answer_status(protocol, frame)] += 1


@pytest.mark.parametrize("protocol", ["v2", "v3"])
async def test_protocol_fuzzing(bookie_fleet, chaos_scale, protocol):
    frames = chaos_scale.pick(short=100_000, long=1_000_000)
    # No GC: it deletes ledgers ZooKeeper has no metadata for (none of these), after 60 s in the long run.
    (bookie,) = bookie_fleet.start(1, gc_interval=86400)
    known = [encode_test_entry(KNOWN_LEDGER, i, os.urandom(100 + i)) for i in range(50)]
    async with await BookieClient.connect(bookie.address) as client:
        await asyncio.gather(*(client.add_entry(MASTER_KEY, entry) for entry in known))
    await asyncio.to_thread(wait_for, lambda: LastLogMark(bookie.ledger_dir).read().offset, 30, "a first flush")
    mark_before = LastLogMark(bookie.ledger_dir).read()
    rss_before = rss_bytes(bookie.process.pid)
    rss_peak = rss_before

    generator = BookKeeperFrames(SEED, v3=protocol == "v3")
    statuses: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", bookie.port)
    answers = asyncio.create_task(read_answers(reader, statuses, protocol))
    sent = breaking = 0
    while sent + breaking < frames:
        batch = []
        for _ in range(min(2000, frames - sent - breaking)):
            if generator.random.random() < BREAKING_SHARE:
                await send_breaking(bookie.port, generator.breaking())
                breaking += 1
            else:
                batch.append(generator.request())
        writer.write(b"".join(batch))
        await writer.drain()
        sent += len(batch)
        rss_peak = max(rss_peak, rss_bytes(bookie.process.pid))
        assert not answers.done(), "the bookie closed a connection whose frames were all well-formed"
    writer.write_eof()  # the stream ends: long polls answer
    await asyncio.wait_for(answers, 300)
    writer.close()
    seconds = time.monotonic() - started

    assert bookie.running
    async with await BookieClient.connect(bookie.address) as client:
        assert await client.read_range(KNOWN_LEDGER, 0, 49) == known
        await client.add_entry(MASTER_KEY, encode_test_entry(KNOWN_LEDGER, 50, b"after the fuzzing"))
    mark_after = await asyncio.to_thread(
        wait_for,
        lambda: (mark := LastLogMark(bookie.ledger_dir).read()) > mark_before and mark,
        30,
        "the LastLogMark to move after the fuzzing",
    )
    log = bookie.log_path.read_text()
    tracebacks = log.count("Traceback")
    flush_failures = log.count("flush failed")
    growth = (rss_peak - rss_before) >> 20
    chaos_scale.report(
        "protocol_fuzzing",
        protocol=protocol,
        seed=SEED,
        frames=sent + breaking,
        well_framed=sent,
        format_breaking=breaking,
        answers=dict(statuses),
        tracebacks=tracebacks,
        flush_failures=flush_failures,
        rss_growth_mib=growth,
        last_log_mark=list(mark_after),
        seconds=round(seconds, 1),
    )
    assert tracebacks == 0 and flush_failures == 0, bookie.log_tail(60)
    assert statuses["INTERNAL_ERROR"] == statuses["EIO"] == 0
    assert growth < 300, f"the bookie grew by {growth} MiB"
