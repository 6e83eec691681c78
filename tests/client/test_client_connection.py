"""The connection to one bookie without a bookie: how requests made in one event-loop turn reach the socket."""

from __future__ import annotations

import asyncio

from bookfleet import wire
from bookfleet.client.connection import FLUSH_BYTES, BookieClient, _ClientProtocol


class RecordingTransport:
    """Keeps what each writelines call was given."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def writelines(self, pieces: list[bytes]) -> None:
        self.writes.append(b"".join(pieces))


async def test_a_turn_that_makes_many_requests_writes_them_as_they_pass_flush_bytes_in_order():
    """A turn that answers a group commit's acks makes one add per ack: the first of them leave while the rest are
    being made, in writes of about FLUSH_BYTES, and the rest with the end of the turn."""
    transport = RecordingTransport()
    client = BookieClient("bookie:1", transport, _ClientProtocol("bookie:1"))
    body = b"b" * 1000
    count = 3 * FLUSH_BYTES // len(body) + 5
    for _ in range(count):
        client.add_entry_callback(body, lambda arg, error: None, None)
    frame = wire.LENGTH_PREFIX.size + wire.HEADER_SIZE + len(body)
    per_write = -(-FLUSH_BYTES // len(body))  # the request whose body reaches FLUSH_BYTES is written with the others
    assert [len(w) for w in transport.writes] == [per_write * frame] * 3
    await asyncio.sleep(0)
    assert len(transport.writes) == 4
    stream = bytearray(b"".join(transport.writes))
    frames = wire.split_frames(stream)
    assert [f.request_id for f in frames] == list(range(1, count + 1)) and not stream
    assert all(f.body == body for f in frames)
