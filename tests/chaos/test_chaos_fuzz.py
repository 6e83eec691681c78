"""Protocol fuzzing of a real bookie process: seeded frames that know the layout (valid headers and body sizes with
hostile fields: ids at and past every range edge, random keys, flags, timeouts, spans) on one pipelined
connection, plus frames that break the format (garbage, bad lengths, versions, ops, short bodies) on connections of
their own. Afterwards the bookie is alive, logged no traceback, still flushes (its LastLogMark moved), stayed within
a memory bound, and the entries written before the fuzzing read back byte-exact."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import struct
import time

import pytest

from bookfleet import wire
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


async def send_breaking(port: int, payload: bytes) -> None:
    """Send on a connection of its own; the bookie must close it (an error answer first is fine)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    writer.write_eof()
    async with asyncio.timeout(30):
        while await reader.read(65536):
            pass
    writer.close()


async def read_answers(reader: asyncio.StreamReader, statuses: collections.Counter) -> None:
    buffer = bytearray()
    while chunk := await reader.read(1 << 20):
        buffer += chunk
        for frame in wire.split_frames(buffer):
            statuses[wire.Status(frame.code).name] += 1


async def test_protocol_fuzzing(bookie_fleet, chaos_scale):
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

    generator = FrameGenerator(SEED)
    statuses: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", bookie.port)
    answers = asyncio.create_task(read_answers(reader, statuses))
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
    assert statuses["INTERNAL_ERROR"] == 0
    assert growth < 300, f"the bookie grew by {growth} MiB"
