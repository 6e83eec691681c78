"""The connection to one bookie without a bookie: how requests made in one event-loop turn reach the socket, and how
answers are split out of the byte stream."""

from __future__ import annotations

import asyncio
import struct

import pytest

from bookfleet import bkprotocol, bkwire, wire
from bookfleet.bkprotocol import OperationType, StatusCode
from bookfleet.client.connection import FLUSH_BYTES, BookieClient, FencedError, _ClientProtocol, next_txn


class RecordingTransport:
    """Keeps what each writelines call was given."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close

    def writelines(self, pieces: list[bytes]) -> None:
        self.writes.append(b"".join(pieces))


def split_requests(stream: bytes) -> list:
    """The V3 Requests in `stream`, whole frames only."""
    requests, pos = [], 0
    while pos < len(stream):
        (length,) = struct.unpack_from(">I", stream, pos)
        requests.append(bkprotocol.Request.FromString(stream[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    assert pos == len(stream)
    return requests


async def test_a_turn_that_makes_many_requests_writes_them_as_they_pass_flush_bytes_in_order():
    """A turn that answers a group commit's acks makes one add per ack: the first of them leave while the rest are
    being made, in writes of about FLUSH_BYTES, and the rest with the end of the turn."""
    transport = RecordingTransport()
    client = BookieClient("bookie:1", transport, _ClientProtocol("bookie:1"))
    entry = wire.encode_entry(wire.Digester("crc32c"), 3, 0, -1, 950, b"b" * 950)
    encoder = bkwire.AddRequestEncoder(3, wire.master_key(b"pw"), 0)
    frames = [(encoder.frame(txn, entry), txn) for txn in (next_txn() for _ in range(3 * FLUSH_BYTES // 1000 + 5))]
    for frame, txn in frames:
        client.add_entry_callback(frame, txn, lambda arg, error: None, None)
    per_write = -(-FLUSH_BYTES // len(frames[0][0]))  # the request that reaches FLUSH_BYTES goes with the others
    assert [len(split_requests(w)) for w in transport.writes] == [per_write] * 3
    await asyncio.sleep(0)
    assert len(transport.writes) == 4
    requests = split_requests(b"".join(transport.writes))
    assert [bkwire.varint(r.header.txnId) for r in requests] == [txn for _, txn in frames]
    assert all(r.header.operation == OperationType.ADD_ENTRY and r.addRequest.body == entry for r in requests)


def sent_txn_ids(client: BookieClient, transport: RecordingTransport) -> list[int]:
    """The txnIds of the requests a client made, in order (every connection of a process draws from one sequence)."""
    client._flush()
    return [request.header.txnId for request in split_requests(b"".join(transport.writes))]


def answer(txn_id: int, status: int = StatusCode.EOK, message: str = "") -> bytes:
    response = bkwire.v3_response(OperationType.FORCE_LEDGER, txn_id, status)
    response.forceLedgerResponse.status, response.forceLedgerResponse.ledgerId = status, 5
    if message:
        response.errorMessage = message
    return bkwire.encode_v3(response)


async def test_answers_are_matched_by_txn_id_and_a_partial_one_waits():
    transport = RecordingTransport()
    client = BookieClient("bookie:1", transport, _ClientProtocol("bookie:1"))
    first, second = (asyncio.ensure_future(client.force_ledger(5)) for _ in range(2))
    await asyncio.sleep(0)
    first_txn, second_txn = sent_txn_ids(client, transport)
    fenced = answer(second_txn, StatusCode.EFENCED, "FORCE_LEDGER for ledger 5: fenced")
    buffer = bytearray(fenced + answer(first_txn)[:7])
    client._take_answers(buffer)
    with pytest.raises(FencedError, match="FORCE_LEDGER for ledger 5: fenced"):
        await second
    assert not first.done() and buffer == answer(first_txn)[:7]
    buffer += answer(first_txn)[7:]
    client._take_answers(buffer)
    assert await first is None and not buffer


async def test_an_answer_without_a_message_names_its_status():
    transport = RecordingTransport()
    client = BookieClient("bookie:1", transport, _ClientProtocol("bookie:1"))
    call = asyncio.ensure_future(client.force_ledger(5))
    await asyncio.sleep(0)
    client._take_answers(bytearray(answer(*sent_txn_ids(client, transport), StatusCode.EFENCED)))
    with pytest.raises(FencedError, match="EFENCED from a bookie that gave no message"):
        await call


@pytest.mark.parametrize(("bad", "error"), [
    (wire.LENGTH_PREFIX.pack(2**31), "exceeds"),
    (wire.LENGTH_PREFIX.pack(3) + b"\xff\xff\xff", "not a protobuf Response"),
    (wire.LENGTH_PREFIX.pack(2) + b"\x10\x00", "without a txnId"),
])
async def test_answers_before_a_bad_one_are_handed_over_and_the_bad_one_named(bad, error):
    transport = RecordingTransport()
    client = BookieClient("bookie:1", transport, _ClientProtocol("bookie:1"))
    good = asyncio.ensure_future(client.force_ledger(5))
    await asyncio.sleep(0)
    buffer = bytearray(answer(*sent_txn_ids(client, transport)) + bad)
    with pytest.raises(wire.ProtocolError, match=error):
        client._take_answers(buffer)
    assert await good is None


async def test_adds_answered_ok_after_their_connection_failed_in_the_same_read_are_failed_once_not_answered_again():
    """An add's answer callback can fail its own connection (the writer drops a bookie owing too many answers: its
    `_shed_laggards`): the OK answers after it in the same socket read are of adds that `_fail` settled with the
    connection's error already, and must not be answered a second time, as durable."""
    transport = RecordingTransport()
    client = BookieClient("bookie:1", transport, _ClientProtocol("bookie:1"))
    entry = wire.encode_entry(wire.Digester("crc32c"), 3, 0, -1, 10, b"b" * 10)
    encoder = bkwire.AddRequestEncoder(3, wire.master_key(b"pw"), 0)
    txns = [next_txn() for _ in range(4)]
    answers: dict[bytes, list[BaseException | None]] = {txn: [] for txn in txns}

    def on_answer(txn: bytes, error: BaseException | None) -> None:
        answers[txn].append(error)
        if txn == txns[0]:
            client.abort("it owes answers for too many bytes of acknowledged adds")

    for txn in txns:
        client.add_entry_callback(encoder.frame(txn, entry), txn, on_answer, txn)
    client._take_answers(bytearray(bkwire.encode_v3_add_acks(3, txns[:3], [0, 1, 2])))
    assert answers[txns[0]] == [None]
    for txn in txns[1:]:
        assert [type(error) for error in answers[txn]] == [ConnectionError], txn
    assert "dropped: it owes answers" in str(answers[txns[1]][0])
