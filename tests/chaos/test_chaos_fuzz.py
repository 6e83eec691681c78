"""Protocol fuzzing of a real bookie process, in each protocol it serves (bookfleet's own, Apache BookKeeper's V2 and
V3): seeded frames that know the layout (valid headers and body sizes with hostile fields: ids at and past every
range edge, random keys, flags, timeouts, spans) on one pipelined connection, plus frames that break the format
(garbage, bad lengths, versions, ops, short bodies) on connections of their own. Afterwards the bookie is alive,
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
from bookfleet.wire import Op
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
    """Well-framed requests with hostile fields, and format-breaking byte strings, from one seeded Random."""

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

    def writer_epoch(self) -> bytes:
        return U64.pack(self.random.choice([0, 0, 1, 2, 2**63 - 1, 2**63, self.random.getrandbits(64)]))

    def key(self) -> bytes:
        return FUZZ_KEY if self.random.random() < 0.8 else self.random.randbytes(wire.MASTER_KEY_SIZE)

    def body(self, op: int, flags: int) -> bytes:
        rand = self.random
        if op == Op.ADD_ENTRY:
            header = U64.pack(self.ledger_id()) + I64.pack(self.entry_id()) + I64.pack(self.entry_id())
            entry = header + U64.pack(rand.getrandbits(64)) + rand.randbytes(rand.randrange(600))
            return self.key() + self.writer_epoch() + entry
        if op == Op.READ_ENTRY:
            body = U64.pack(self.ledger_id()) + I64.pack(self.entry_id())
            return body + self.key() if flags & wire.Flag.FENCE else body
        if op == Op.READ_LAC:
            timeout = rand.choice([0, 1, 50, 2**32 - 1, rand.getrandbits(32)])
            return U64.pack(self.ledger_id()) + I64.pack(self.entry_id()) + struct.pack(">I", timeout)
        if op == Op.WRITE_LAC:
            return self.key() + U64.pack(self.ledger_id()) + I64.pack(self.entry_id())
        if op == Op.RAISE_EPOCH:
            return self.key() + U64.pack(self.ledger_id()) + self.writer_epoch()
        if op in (Op.FORCE_LEDGER,):
            return U64.pack(self.ledger_id())
        if op == Op.READ_RANGE:
            max_bytes = rand.choice([0, 1, 100, 4096, 4096, rand.getrandbits(32)])
            return U64.pack(self.ledger_id()) + I64.pack(self.entry_id()) + I64.pack(self.entry_id()) + struct.pack(
                ">I", max_bytes
            )
        return rand.randbytes(rand.randrange(20))  # GET_BOOKIE_INFO ignores its body

    def request(self) -> bytes:
        rand = self.random
        op = rand.choice(list(Op))
        flags = rand.getrandbits(16) if rand.random() < 0.3 else rand.choice([0, 1, 2])
        self.request_id += 1
        return wire.encode_request(op, self.request_id, self.body(op, flags), flags)

    def breaking(self) -> bytes:
        """A byte string no bookie can take as frames: it must answer at most an error and close."""
        rand = self.random
        kind = rand.randrange(7)
        if kind == 0:
            return rand.randbytes(rand.randrange(1, 3000))
        if kind == 1:
            return wire.LENGTH_PREFIX.pack(rand.choice([0, 5, 11, 2**31, 2**32 - 1])) + rand.randbytes(40)
        if kind == 2:
            return wire.LENGTH_PREFIX.pack(12) + wire.REQUEST_HEADER.pack(rand.randrange(2, 256), 1, 0, 1)
        if kind == 3:
            return wire.encode_request(rand.choice([0, 9, 99, 255]), 1, rand.randbytes(30))
        if kind == 4:  # a fixed-size body cut short
            op = rand.choice([Op.READ_ENTRY, Op.READ_LAC, Op.WRITE_LAC, Op.FORCE_LEDGER, Op.READ_RANGE, Op.RAISE_EPOCH])
            return wire.encode_request(op, 1, rand.randbytes(rand.randrange(7)))
        if kind == 5:  # an ADD too short for a key, an epoch and an entry header, or a FENCE with a short key
            if rand.random() < 0.5:
                return wire.encode_request(Op.ADD_ENTRY, 1, rand.randbytes(rand.randrange(63)))
            return wire.encode_request(Op.READ_ENTRY, 1, rand.randbytes(16 + rand.randrange(31)), wire.Flag.FENCE)
        return self.request()[: -rand.randrange(1, 10)]  # the stream ends inside a frame


class BookKeeperFrames(FrameGenerator):
    """The same hostile fields in Apache BookKeeper's V2 or V3 frames; `request` stays within what a connection
    survives (V2: the ops V2 serves; V3: any operation, an unserved one is answered EBADREQ)."""

    def __init__(self, seed: int, v3: bool):
        super().__init__(seed)
        self.v3 = v3

    def key(self) -> bytes:
        if self.random.random() < 0.8:
            return FUZZ_KEY[: bkwire.MASTER_KEY_SIZE]
        return self.random.randbytes(self.random.choice([0, bkwire.MASTER_KEY_SIZE, bkwire.MASTER_KEY_SIZE]))

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
        elif operation == OperationType.AUTH:
            request.authRequest.authPluginName = "fuzz"
        elif operation == OperationType.START_TLS:
            request.startTLSRequest.SetInParent()
        if rand.random() < 0.05:  # a missing operation message
            request.ClearField(bkwire._REQUEST_FIELD.get(operation, "readRequest"))
        return bkwire.encode_v3(request)

    def breaking(self) -> bytes:
        rand = self.random
        kind = rand.randrange(4)
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


def generator_of(protocol: str) -> FrameGenerator:
    return FrameGenerator(SEED) if protocol == "bookfleet" else BookKeeperFrames(SEED, v3=protocol == "v3")


def answer_status(protocol: str, frame: bytes) -> str:
    """The status of an answer frame (without its length prefix), by name."""
    if protocol == "bookfleet":
        return wire.Status(wire.decode_frame(frame).code).name
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


@pytest.mark.parametrize("protocol", ["bookfleet", "v2", "v3"])
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

    generator = generator_of(protocol)
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
    # Everything sent before a FORCE_LEDGER is synced once it answers; then the stream ends (long polls answer).
    if protocol == "bookfleet":
        writer.write(wire.encode_request(Op.FORCE_LEDGER, 0, U64.pack(1000)))
    writer.write_eof()
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
