"""Apache BookKeeper's V2 and V3 codecs (bkwire, bkprotocol): frames as BookKeeper lays them out, the protocol told
from a connection's first byte, and every field checked before a processor reads it."""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookfleet import bkprotocol, bkwire, wire
from bookfleet.bkprotocol import OperationType, ReadFlag, StatusCode
from bookfleet.bkwire import Protocol, V2Flag, V2Op, V2Status
from bookfleet.wire import InvalidField, ProtocolError, Status
from tests.fixtures.bkclient import MASTER_KEY, bk_entry, v2_add, v2_batch_read, v2_read, v3_request


def body(frame: bytes) -> bytes:
    """A frame without its length prefix, checking the prefix on the way."""
    (length,) = struct.unpack_from(">I", frame)
    assert length == len(frame) - 4
    return frame[4:]


def _recorder(answered: list[bytes]):
    """An add's answer callback that records the txnId it was given as its argument, once answered OK."""

    def on_answer(txn: bytes, error: BaseException | None) -> None:
        assert error is None
        answered.append(txn)

    return on_answer


def answered_in_place(buffer: bytearray, txns: list[bytes] | None = None) -> list[bytes]:
    """The txnIds whose waiters `bkwire.take_ok_add_answers` answers out of `buffer` (taking their frames off it), in
    order; a waiter waits under each of `txns`, by default under every 1 to 10 bytes where the first frame's txnId
    starts (whatever its header's length says: a waiter waits for any txnId the bytes could be read as)."""
    if txns is None:
        txns = list(dict.fromkeys(bytes(buffer[11 : 11 + size]) for size in range(1, 11)))
    answered: list[bytes] = []
    pending = {txn: (_recorder(answered), txn) for txn in txns}
    bkwire.take_ok_add_answers(buffer, pending)
    assert all(txn not in pending for txn in answered)
    return answered


def test_the_first_byte_tells_the_protocol():
    assert bkwire.frame_protocol(body(v2_read(1, 0))[0]) == Protocol.V2
    assert bkwire.frame_protocol(body(v3_request(OperationType.READ_LAC, 1, ledgerId=1))[0]) == Protocol.V3
    assert bkwire.frame_protocol(0x01) is None  # bookfleet's own frames (version 1) are gone: the bookie closes
    assert bkwire.frame_protocol(0x61) is None


def test_bookfleet_client_requests_are_v3_requests_a_stock_decoder_reads():
    """The client's hand-laid add (AddRequestEncoder) is the protobuf Request, writer epoch and all; the bookie's
    hand-laid ack is the protobuf Response, recognized in place by the client."""
    entry = bk_entry(7, 300, b"payload")
    frame = bkwire.AddRequestEncoder(7, MASTER_KEY, 2**40, recovery=True).frame(bkwire.varint(2**35), entry)
    request = bkwire.decode_v3_request(body(frame))
    bkwire.check_v3_request(request)
    fields = request.fields
    assert (request.operation, request.txn_id, request.version) == (OperationType.ADD_ENTRY, 2**35, 3)
    assert (fields.ledgerId, fields.entryId, fields.masterKey, fields.body) == (7, 300, MASTER_KEY, entry)
    assert (fields.flag, fields.writerEpoch) == (bkprotocol.AddFlag.RECOVERY_ADD, 2**40)

    ack = bytearray(bkwire.encode_v3_add_ack(2**35, 7, 300))
    response = bkwire.decode_v3_response(body(bytes(ack)))
    assert (response.header.txnId, response.status, response.addResponse.entryId) == (2**35, StatusCode.EOK, 300)
    assert answered_in_place(ack) == [bkwire.varint(2**35)] and not ack
    refusal = bytearray(bkwire.encode_v3(bkwire.v3_refusal(request, StatusCode.EFENCED, "fenced")))
    assert answered_in_place(refusal) == [] and len(refusal) > 4  # parsed whole, status and message read
    assert bkwire.decode_v3_response(body(bytes(refusal))).errorMessage == "fenced"


@pytest.mark.parametrize(("operation", "fields", "error"), [
    (OperationType.RAISE_EPOCH, {"ledgerId": 1, "masterKey": MASTER_KEY}, "without writerEpoch"),
    (OperationType.RAISE_EPOCH, {"ledgerId": 1, "masterKey": b"k", "writerEpoch": 1}, "master key of 1 bytes"),
    (OperationType.RAISE_EPOCH, {"ledgerId": 1, "masterKey": MASTER_KEY, "writerEpoch": 2**63}, "writer epoch"),
    (OperationType.READ_RANGE, {"ledgerId": 1, "firstEntryId": 5, "lastEntryId": 4, "maxBytes": 1}, "before first"),
    (OperationType.READ_RANGE, {"ledgerId": 1, "firstEntryId": -2, "lastEntryId": 4, "maxBytes": 1}, "first entry"),
    (OperationType.READ_RANGE, {"ledgerId": 1, "firstEntryId": 0, "lastEntryId": 4, "maxBytes": -1}, "negative"),
    (OperationType.READ_RANGE, {"ledgerId": -1, "firstEntryId": 0, "lastEntryId": 4, "maxBytes": 1}, "ledger id"),
])
def test_bookfleet_operations_fields_are_checked(operation, fields, error):
    request = bkwire.decode_v3_request(body(v3_request(operation, 1, **fields)))
    with pytest.raises(InvalidField, match=error):
        bkwire.check_v3_request(request)


def test_an_add_with_a_writer_epoch_out_of_range_is_refused():
    entry = bk_entry(7, 0, b"x")
    request = bkwire.decode_v3_request(body(v3_request(
        OperationType.ADD_ENTRY, 1, ledgerId=7, entryId=0, masterKey=MASTER_KEY, body=entry, writerEpoch=2**63
    )))
    with pytest.raises(InvalidField, match="writer epoch"):
        bkwire.check_v3_request(request)


@pytest.mark.parametrize(("code", "status"), [
    (StatusCode.EFENCED, Status.FENCED), (StatusCode.EREADONLY, Status.READ_ONLY),
    (StatusCode.ENOLEDGER, Status.NO_SUCH_LEDGER), (StatusCode.ENOENTRY, Status.NO_SUCH_ENTRY),
    (StatusCode.EUNKNOWNLEDGERSTATE, Status.UNKNOWN_LEDGER_STATE), (StatusCode.EUA, Status.UNAUTHORIZED),
    (StatusCode.EIO, Status.INTERNAL_ERROR), (StatusCode.ETOOMANYREQUESTS, Status.INTERNAL_ERROR),
    (999, Status.INTERNAL_ERROR),
])
def test_the_client_keeps_the_distinctions_it_acts_on(code, status):
    """Fenced, read-only, absent and cannot-vouch are told apart (the writer, recovery and repair act on each); the
    rest is an error of that bookie."""
    assert bkwire.client_status(code) == status


def test_v2_requests_as_bookkeeper_lays_them_out():
    entry = bk_entry(7, 3, b"payload")
    frame = v2_add(entry, V2Flag.RECOVERY_ADD)
    assert frame[4:8] == bytes([2, 1, 0, 2])  # version 2, ADD, flags = recovery-add
    add = bkwire.decode_v2_request(body(frame))
    assert (add.op, add.ledger_id, add.entry_id, add.master_key, add.entry) == (V2Op.ADD, 7, 3, MASTER_KEY, entry)

    fence = bkwire.decode_v2_request(body(v2_read(7, -1, V2Flag.FENCE, MASTER_KEY)))
    assert (fence.op, fence.flags, fence.ledger_id, fence.entry_id, fence.master_key) == (2, 1, 7, -1, MASTER_KEY)
    assert bkwire.decode_v2_request(body(v2_read(7, 2, 0, b"ignored trailing"))).master_key is None

    batch = bkwire.decode_v2_request(body(v2_batch_read(7, 5, request_id=9, max_count=4, max_size=1000)))
    assert (batch.op, batch.entry_id, batch.request_id, batch.max_count, batch.max_size) == (7, 5, 9, 4, 1000)


def test_v2_answers_as_bookkeeper_lays_them_out():
    answer = bkwire.encode_v2_response(V2Op.READ, V2Status.ENOENTRY, 7, 3)
    assert answer == struct.pack(">IIiqq", 24, 0x02020000, 2, 7, 3)
    entries = [b"one", b"three"]
    batch = bkwire.encode_v2_batch_response(V2Status.EOK, 7, 1, 42, entries)
    assert batch[4:8] == bytes([2, 7, 0, 0]) and bkwire.decode_v2_batch_entries(batch[24 + 4 :]) == (42, entries)
    auth = bkwire.encode_v2_auth_response(bkwire.auth_disabled_answer())
    assert auth[4:8] == bytes([2, 3, 0, 0])
    assert bkwire.decode_auth_message(auth[8:]).authPluginName == "AuthDisabledPlugin"


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (b"\x02\x01\x00", "shorter than its 4-byte header"),
        (body(bkwire.encode_v2_request(V2Op.ADD, 0, b"\0" * 51)), "shorter than a master key and an entry header"),
        (body(bkwire.encode_v2_request(V2Op.READ, 0, b"\0" * 15)), "READ body of 15 bytes is shorter than 16"),
        (body(v2_read(1, 0, V2Flag.FENCE, b"short")), "FENCE needs a 20-byte master key, got 5"),
        (body(bkwire.encode_v2_request(V2Op.BATCH_READ, 0, b"\0" * 35)), "BATCH_READ body of 35 bytes"),
        (body(bkwire.encode_v2_request(V2Op.GET_BOOKIE_INFO, 0, b"")), "GET_BOOKIE_INFO is not served over V2"),
        (body(bkwire.encode_v2_request(200, 0, b"")), "V2 op 200 is not served"),
        (b"\x03\x02\x00\x00" + b"\0" * 16, "protocol version 3 on a V2 connection"),
        (body(bkwire.encode_v2_request(V2Op.AUTH, 0, b"\xff\xff")), "not an AuthMessage"),
    ],
)
def test_unreadable_v2_frames(frame, error):
    with pytest.raises(ProtocolError, match=error):
        bkwire.decode_v2_request(frame)


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (v2_read(-1, 0), "ledger id -1 is outside"),
        (v2_read(1, -2), "entry id -2 is outside"),
        (v2_batch_read(1, -1, 0, 1, 1), "entry id -1 is outside"),
        (v2_add(bk_entry(2**63, 0, b"x")), "entry header's ledger id -9223372036854775808"),
        (v2_add(bk_entry(1, 0, b"x", lac=-2)), "entry header's lac -2"),
    ],
)
def test_v2_fields_out_of_range(frame, error):
    request = bkwire.decode_v2_request(body(frame))
    with pytest.raises(InvalidField, match=error):
        bkwire.check_v2_request(request)


def test_v3_round_trip_and_refusal():
    entry = bk_entry(9, 0, b"payload")
    frame = v3_request(OperationType.ADD_ENTRY, 77, ledgerId=9, entryId=0, masterKey=MASTER_KEY, body=entry, flag=1)
    request = bkwire.decode_v3_request(body(frame))
    bkwire.check_v3_request(request)
    assert (request.operation, request.txn_id, request.fields.body, request.fields.flag) == (2, 77, entry, 1)

    refusal = bkprotocol.Response.FromString(body(bkwire.encode_v3(bkwire.v3_refusal(request, StatusCode.EFENCED))))
    assert (refusal.header.version, refusal.header.operation, refusal.header.txnId) == (3, 2, 77)
    assert (refusal.status, refusal.addResponse.status) == (504, 504)
    assert (refusal.addResponse.ledgerId, refusal.addResponse.entryId) == (9, 0)
    assert bkwire.status_codes(Status.NO_SUCH_ENTRY) == (V2Status.ENOENTRY, StatusCode.ENOENTRY)
    assert bkwire.status_codes(Status.UNKNOWN_LEDGER_STATE) == (V2Status.EIO, StatusCode.EUNKNOWNLEDGERSTATE)
    assert all(v2 <= 106 for v2, _ in map(bkwire.status_codes, Status))  # all a V2 client can map


@pytest.mark.parametrize(
    ("operation", "fields", "error"),
    [
        (OperationType.READ_ENTRY, {"ledgerId": 1}, "READ_ENTRY request without entryId"),
        (OperationType.READ_ENTRY, {"ledgerId": -3, "entryId": 0}, "ledger id -3 is outside"),
        (OperationType.READ_ENTRY, {"ledgerId": 1, "entryId": 0, "flag": 3}, "READ flag 3"),
        (OperationType.READ_ENTRY, {"ledgerId": 1, "entryId": 0, "flag": ReadFlag.FENCE_LEDGER}, "master key of 0"),
        (OperationType.READ_ENTRY, {"ledgerId": 1, "entryId": 0, "previousLAC": -5}, "previous lac -5"),
        (OperationType.ADD_ENTRY, {"ledgerId": 1, "entryId": 0, "masterKey": MASTER_KEY, "body": b"short"},
         "ADD entry of 5 bytes"),
        (OperationType.WRITE_LAC, {"ledgerId": 1, "lac": -4, "masterKey": MASTER_KEY, "body": b""}, "lac -4"),
        (OperationType.FORCE_LEDGER, {}, "FORCE_LEDGER request without ledgerId"),
    ],
)
def test_v3_fields_checked(operation, fields, error):
    request = bkwire.decode_v3_request(body(v3_request(operation, 1, **fields)))
    with pytest.raises(InvalidField, match=error):
        bkwire.check_v3_request(request)


def test_v3_envelope():
    with pytest.raises(ProtocolError, match="not a protobuf Request"):
        bkwire.decode_v3_request(b"\x0a\xff")
    with pytest.raises(ProtocolError, match="header without txnId"):
        bkwire.decode_v3_request(b"\x0a\x04\x08\x03\x10\x01")
    old = bkprotocol.Request()
    old.header.version, old.header.operation, old.header.txnId = 2, OperationType.READ_LAC, 5
    old.readLacRequest.ledgerId = 1
    with pytest.raises(bkwire.BadVersion):
        bkwire.check_v3_request(bkwire.decode_v3_request(old.SerializeToString()))
    unknown = bkwire.decode_v3_request(b"\x0a\x06\x08\x03\x10\x0c\x18\x05")  # BATCH_READ_ENTRY: not over V3
    assert (unknown.operation, unknown.txn_id, unknown.fields) == (12, 5, None)
    with pytest.raises(InvalidField, match="operation 12 is not served"):
        bkwire.check_v3_request(unknown)


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_refuse_cleanly(data):
    """Whatever a client sends, a decoder returns a request or raises ProtocolError, and a check InvalidField."""
    for decode, check in ((bkwire.decode_v2_request, bkwire.check_v2_request),
                          (bkwire.decode_v3_request, bkwire.check_v3_request)):
        try:
            request = decode(data)
            check(request)
        except (ProtocolError, InvalidField):
            pass


_INT64 = st.integers(0, 2**63 - 1) | st.sampled_from([0, 127, 128, 16383, 16384, 2**21, 2**28 - 1, 2**28])
_ADD_FRAMES = st.builds(
    dict,
    txn_id=_INT64 | st.integers(2**63, 2**64 - 1), ledger_id=_INT64 | st.just(2**63),
    entry_id=st.integers(-1, 2**63 - 1), lac=st.integers(-2, 2**63 - 1),
    writer_epoch=_INT64 | st.integers(2**63, 2**64 - 1), recovery=st.booleans(),
    header_ledger_delta=st.sampled_from([0, 0, 1]),
)


def _client_add_frame(txn_id, ledger_id, entry_id, lac, writer_epoch, recovery, header_ledger_delta) -> bytes:
    """An add frame as bookfleet's client lays it out (fields out of range too: the encoder encodes any int)."""
    header = bkwire.wire.ENTRY_HEADER.pack((ledger_id + header_ledger_delta) % 2**64, entry_id % 2**63, lac, 7)
    entry = header + b"\x00" * 4 + b"payload"
    encoder = bkwire.AddRequestEncoder(ledger_id, MASTER_KEY, writer_epoch, recovery)
    return encoder.frame_head(bkwire.varint(txn_id), entry_id % 2**63, len(entry)) + entry


@given(_ADD_FRAMES, st.binary(max_size=70000))
def test_the_add_encoder_writes_what_protobuf_parses_as_the_same_request(fields, payload):
    """The client's hand-laid add frame is what protobuf parses as the same Request, for any values (ids and epochs
    at every varint length, entry id -1 too, a recovery flag or not, entries of any size), each field once: protobuf's
    own bytes but for the order of the AddRequest's fields (the entry last, so that it is never copied)."""
    entry = bkwire.wire.ENTRY_HEADER.pack(fields["ledger_id"], fields["entry_id"], 0, 7) + payload
    encoder = bkwire.AddRequestEncoder(fields["ledger_id"], MASTER_KEY, fields["writer_epoch"], fields["recovery"])
    request = bkprotocol.Request()
    request.header.version, request.header.operation = 3, OperationType.ADD_ENTRY
    request.header.txnId = fields["txn_id"]
    add = request.addRequest
    add.ledgerId, add.masterKey = fields["ledger_id"] - 2**64 * (fields["ledger_id"] >= 2**63), MASTER_KEY
    if fields["recovery"]:
        add.flag = bkprotocol.AddFlag.RECOVERY_ADD
    add.writerEpoch, add.entryId, add.body = fields["writer_epoch"], fields["entry_id"], entry
    txn = bkwire.varint(fields["txn_id"])
    frame = encoder.frame(txn, entry)
    assert bkwire.with_txn(encoder.frame(bkwire.varint(5), entry), txn) == frame
    assert body(frame) != request.SerializeToString() and len(body(frame)) == request.ByteSize()
    assert bkprotocol.Request.FromString(body(frame)) == request


_PAYLOADS = st.binary(max_size=3000) | st.integers(0, 1 << 20).map(
    lambda size: bytes(range(7, 256)) * (size // 249) + bytes(size % 249)
)
"""Random bytes, or a large payload (to 1 MiB): every size class of the body's varint and of the CRC's tail."""


@given(_ADD_FRAMES, st.lists(st.tuples(st.integers(0, 2**63 - 1), _PAYLOADS), min_size=1, max_size=4),
       st.sampled_from(list(wire.DigestType)))
def test_the_c_encoder_s_frames_are_the_python_encoders_and_protobuf_s(fields, entries, digest_type):
    """The writer's one-call add frame, made in C (AddFrameEncoder), is byte for byte `frame_head` + `Digester.encode`
    (struct, crc32c, zlib, hmac): for ids, lacs and lengths of every varint length, txnIds up to 2^64 - 1, payloads
    from empty to 1 MiB, every digest type; and protobuf parses it as the same Request. The writer's PendingAdd
    (`pending_add`) carries that frame, its fields and time.monotonic's time."""
    digester = wire.Digester(digest_type, b"password")
    args = (fields["ledger_id"], MASTER_KEY, fields["writer_epoch"], fields["recovery"])
    frames, head = bkwire.AddFrameEncoder(*args, digester), bkwire.AddRequestEncoder(*args)
    overhead = wire.ENTRY_HEADER.size + digester.size
    for entry_id, payload in entries:
        txn, lac, length = bkwire.varint(fields["txn_id"]), fields["lac"], 2**40 + len(payload)
        entry = digester.encode(fields["ledger_id"], entry_id, lac, length, payload)
        frame = frames.frame_of(txn, entry_id, lac, length, payload)
        assert frame == head.frame_head(txn, entry_id, overhead + len(payload)) + entry
        before = time.monotonic()
        add = frames.pending_add(txn, entry_id, lac, length, payload, print)
        assert (add.body, add.txn, add.entry_id, add.length, add.on_done, add.acks, add.owed) == (
            frame, txn, entry_id, length, print, 0, 0
        )
        assert before <= add.sent_at <= time.monotonic()
        request = bkprotocol.Request.FromString(body(frame))
        assert (request.header.txnId, request.addRequest.entryId, request.addRequest.body) == (
            fields["txn_id"], entry_id, entry
        )


@given(_INT64, st.lists(st.tuples(_INT64 | st.integers(2**63, 2**64 - 1), _INT64), min_size=1, max_size=5))
def test_the_bookie_acks_what_protobuf_serializes_and_the_client_reads_them_in_place(ledger_id, adds):
    """A group commit's hand-laid acks are byte for byte protobuf's Responses, and the client's in-place reading
    of each gives the txnId protobuf parses."""
    acks = bkwire.encode_v3_add_acks(ledger_id, [bkwire.varint(txn) for txn, _ in adds], [e for _, e in adds])
    expected, pos = [], 0
    for txn_id, entry_id in adds:
        response = bkwire.v3_response(OperationType.ADD_ENTRY, txn_id, StatusCode.EOK)
        response.addResponse.status, response.addResponse.ledgerId = StatusCode.EOK, ledger_id
        response.addResponse.entryId = entry_id
        expected.append(bkwire.encode_v3(response))
        frame = expected[-1]
        pos += len(frame)
    assert acks == b"".join(expected)
    txns = list(dict.fromkeys(bkwire.varint(txn) for txn, _ in adds))  # a txnId twice: its waiter answered once
    buffer = bytearray(acks)
    answered = answered_in_place(buffer, txns)
    assert answered == txns[: len(answered)]
    assert not buffer if len(txns) == len(adds) else len(answered) < len(adds)


_EXTRA_FIELDS = [  # a field more, as a stock or future bookie might send it: the header's priority, or bytes after
    "priority",
    b"\x80\x7d\x01",  # an unknown varint field (2000)
    b"\x0a\x02\x18\x05",  # a second header, which protobuf merges: txnId 5
    b"\xe2\x44\x01x",  # errorMessage "x"
    b"\x10\x01",  # a second status, which protobuf takes: ENOLEDGER's 1
]


_LIES = st.integers(-3, 3) | st.sampled_from([2**31, wire.MAX_FRAME_SIZE + 1 - 40, 2**32 - 1])
"""How far an answer's length prefix is off its bytes: a few bytes either way, or far past them and the frame limit."""


def _check_answered_in_place(original: bytes, buffer: bytearray, answered: list[bytes]) -> None:
    """An answer taken in place from the front of `original` (what is left is `buffer`) is a whole frame within the
    bytes given that protobuf parses as an OK ADD answer of that txnId; none taken leaves every byte in place."""
    if not answered:
        assert buffer == original
        return
    (length,) = struct.unpack_from(">I", original)
    assert 4 + length <= len(original) and buffer == original[4 + length :]
    response = bkwire.decode_v3_response(original[4 : 4 + length])
    assert (response.header.txnId, response.status) == (bkwire.varint_value(answered[0]), StatusCode.EOK)
    assert response.header.operation == OperationType.ADD_ENTRY and response.addResponse.status == StatusCode.EOK
    assert not response.header.HasField("priority") and not response.errorMessage


@given(_INT64 | st.integers(2**63, 2**64 - 1), _INT64, _INT64,
       st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3), st.integers(-3, 3),
       st.sampled_from([None, *_EXTRA_FIELDS]), _LIES, st.binary(max_size=4))
def test_the_client_reads_an_ack_in_place_only_as_protobuf_parses_it(txn_id, ledger_id, entry_id, changes, resize,
                                                                     extra, lie, after):
    """Whatever bytes an answer holds (a byte changed, cut short or longer, a field more, a duplicated message that
    protobuf would merge) and whatever its length prefix claims (a few bytes off, past the bytes received, past the
    frame limit), the client's in-place reading (C) answers a waiter only for a whole OK ADD answer whose txnId
    protobuf parses the same, reads nothing past the buffer, and leaves anything else in place for the parse."""
    ack = bytearray(body(bkwire.encode_v3_add_ack(txn_id, ledger_id, entry_id)))
    if extra == "priority":
        response = bkprotocol.Response.FromString(bytes(ack))
        response.header.priority = 1
        ack = bytearray(response.SerializeToString())
    elif extra is not None:
        ack += extra
    for position, value in changes:
        ack[position % len(ack)] = value
    ack = ack[: len(ack) + resize] if resize < 0 else ack + bytes(resize)
    original = struct.pack(">I", (len(ack) + lie) % 2**32) + ack + after
    buffer = bytearray(original)
    _check_answered_in_place(original, buffer, answered_in_place(buffer))
    if not changes and not resize and extra is None and lie == 0:
        assert buffer == after  # the bookie's own ack: always read in place


@pytest.mark.parametrize("txn_id", [0, 2**63 - 1, 2**64 - 1])
def test_no_single_byte_change_or_cut_of_an_ack_is_read_in_place_unless_protobuf_parses_it_so(txn_id):
    """Every byte of an ack (ids at their longest varints) changed to each value that tells a varint's or a length's
    byte apart, and the ack cut at every length: read in place only as protobuf parses it."""
    ack = bkwire.encode_v3_add_ack(txn_id, 2**63 - 1, 2**63 - 1)
    for position in range(4, len(ack)):
        for value in {0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF, (ack[position] + 1) % 256, (ack[position] - 1) % 256}:
            changed = bytearray(ack)
            changed[position] = value
            buffer = bytearray(changed)
            _check_answered_in_place(bytes(changed), buffer, answered_in_place(buffer))
    for cut in range(len(ack)):
        for fitted in (False, True):
            hostile = bytearray(ack[:cut])
            if fitted and cut >= 4:
                hostile[:4] = struct.pack(">I", cut - 4)
            _check_answered_in_place(bytes(hostile), hostile, answered_in_place(hostile))


@given(st.binary(max_size=80))
def test_the_client_s_in_place_reading_of_any_bytes_answers_only_ok_add_answers(data):
    """Any bytes at all (bad varints, lying lengths, truncated frames): read in place only as protobuf parses them."""
    buffer = bytearray(data)
    _check_answered_in_place(data, buffer, answered_in_place(buffer))


async def test_the_in_place_reading_stops_where_the_caller_must_read():
    """OK ADD answers are answered in place up to the first one whose waiter is no callback add's (none waits, or a
    future does: the caller parses it whole) and up to a waiter that raises, which is raised with the answers before
    it and its own taken off."""
    txns = [bkwire.varint(txn) for txn in (5, 300, 2**40, 7)]
    acks = [bkwire.encode_v3_add_ack(bkwire.varint_value(txn), 1, entry) for entry, txn in enumerate(txns)]
    answered: list[bytes] = []
    record = _recorder(answered)
    pending = {txns[0]: (record, txns[0]), txns[2]: (record, txns[2])}
    buffer = bytearray(b"".join(acks))
    bkwire.take_ok_add_answers(buffer, pending)
    assert answered == txns[:1] and buffer == b"".join(acks[1:])  # no waiter for the second
    pending[txns[1]] = asyncio.get_running_loop().create_future()
    bkwire.take_ok_add_answers(buffer, pending)
    assert answered == txns[:1] and buffer == b"".join(acks[1:]) and txns[1] in pending  # a future's: parsed whole

    def refuse(txn: bytes, error: BaseException | None) -> None:
        raise RuntimeError(f"waiter of {txn!r}")

    del buffer[: len(acks[1])]
    pending[txns[2]], pending[txns[3]] = (refuse, txns[2]), (record, txns[3])
    with pytest.raises(RuntimeError, match="waiter of"):
        bkwire.take_ok_add_answers(buffer, pending)
    assert buffer == acks[3] and txns[2] not in pending
    bkwire.take_ok_add_answers(buffer, pending)
    assert answered == [txns[0], txns[3]] and not buffer and not pending.keys() - {txns[1]}


def _generic_add_fields(frame: bytes):
    """What the generic decoder and checks make of a frame: the checked add fields, or None when refused."""
    try:
        request = bkwire.decode_v3_request(frame)
        bkwire.check_v3_request(request)
    except (ProtocolError, InvalidField):
        return None
    return bkwire.checked_add_fields(request)


def _by_value(fields):
    """Add fields with the txnId as its value (the reader keeps its varint's bytes as they came)."""
    return fields if fields is None else (bkwire.varint_value(fields[0]), *fields[1:])


def _read_in_place(reader: bkwire.AddReader, buffer: bytearray, start: int, end: int):
    """The fields of the add framed in buffer[start:end] as the bookie's fast path reads it (its writer, then a run
    of the one add), as the generic path's: None when the reader leaves it to the generic decoder."""
    writer = reader.writer_of(buffer, start, end)
    if writer is None:
        return None
    run = SimpleNamespace(txns=[], entry_ids=[], lacs=[], entries=[])
    assert reader.read_run(buffer, start, end, run, 1, 0) == (end, 1, len(run.entries[0]))  # the add writer_of read
    return (run.txns[0], writer.ledger_id, run.entry_ids[0], writer.master_key, run.entries[0], writer.recovery,
            writer.writer_epoch, run.lacs[0])


def _hostile(frame: bytes, changes: list[tuple[int, int]], resize: int) -> bytearray:
    """`frame` with bytes after its length prefix changed, cut short or made longer, its prefix fitted to it."""
    hostile = bytearray(frame)
    for position, value in changes:
        hostile[4 + position % (len(hostile) - 4)] = value
    hostile = hostile[: len(hostile) + resize] if resize < 0 else hostile + bytes(resize)
    hostile[:4] = struct.pack(">I", len(hostile) - 4)
    return hostile


@given(_ADD_FRAMES, st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=3),
       st.integers(-3, 3), st.binary(max_size=3), st.binary(max_size=3), st.booleans())
def test_the_in_place_add_reader_reads_what_the_generic_decoder_accepts(fields, changes, resize, before, after, warm):
    """The bookie's fast path reads its client's adds in place, and whatever it reads out of any bytes (a field out of
    range, a byte changed, a frame cut short or longer, its writer's encoder kept from the frame before or not) is
    exactly what the generic decoder decodes and its checks accept: nothing the generic path refuses gets past it."""
    frame = _client_add_frame(**fields)
    reader = bkwire.AddReader(Protocol.V3)
    unchanged = _read_in_place(reader, bytearray(before + frame + after), len(before), len(before) + len(frame))
    assert unchanged == _generic_add_fields(body(frame))  # the client's own layout: read in place whenever valid
    if not warm:
        reader = bkwire.AddReader(Protocol.V3)
    hostile = _hostile(frame, changes, resize)
    read = _read_in_place(reader, bytearray(before) + hostile + after, len(before), len(before) + len(hostile))
    assert read is None or _by_value(read) == _by_value(_generic_add_fields(bytes(hostile[4:])))


@pytest.mark.parametrize("extra", [
    b"\x80\x7d\x01",  # an unknown varint field (2000) after the body
    b"\x22\x00",  # the body again: protobuf keeps the last one
    b"\x10\x05",  # the entry id again
])
def test_an_add_with_a_field_more_goes_to_the_generic_decoder(extra):
    """An add in the client's layout with one field more, which protobuf reads (skips, or lets override), is never
    read in place: the generic decoder decides it."""
    entry = bk_entry(7, 300, b"payload")
    frame = bkwire.AddRequestEncoder(7, MASTER_KEY, 1).frame(bkwire.varint(9), entry)
    request = bkprotocol.Request.FromString(frame[4:])
    message = request.addRequest.SerializeToString() + extra
    longer = bkwire.v3_request_head(OperationType.ADD_ENTRY, bkwire.varint(9), len(message)) + message
    assert bkwire.AddReader(Protocol.V3).writer_of(bytearray(longer), 0, len(longer)) is None
    reader = bkwire.AddReader(Protocol.V3)
    assert reader.writer_of(bytearray(frame), 0, len(frame)) is not None  # warm: the writer kept
    assert reader.writer_of(bytearray(longer), 0, len(longer)) is None
    run = SimpleNamespace(txns=[], entry_ids=[], lacs=[], entries=[])
    assert reader.read_run(bytearray(longer), 0, len(longer), run, 1, 1 << 30) == (0, 0, 0)


def test_txn_ids_are_distinct_canonical_varints():
    """The client's txnIds: each a varint as protobuf writes it, none twice (their order means nothing)."""
    ids = list(itertools.islice(bkwire.txn_ids(), 100_000))
    values = [bkwire.varint_value(txn) for txn in ids]
    assert len(set(values)) == len(ids) and all(bkwire.varint(v) == txn for v, txn in zip(values, ids, strict=True))


def _generic_v2_add(frame: bytes):
    """What the generic V2 decoder and checks make of a frame, as the in-place reader's fields: None when refused
    or no ADD."""
    try:
        request = bkwire.decode_v2_request(frame)
        bkwire.check_v2_request(request)
    except (ProtocolError, InvalidField):
        return None
    if request.op != V2Op.ADD:
        return None
    recovery = bool(request.flags & V2Flag.RECOVERY_ADD)
    lac = bkwire.wire.entry_ids(request.entry)[2]
    return b"", request.ledger_id, request.entry_id, request.master_key, request.entry, recovery, 0, lac


@given(st.integers(-2, 2**63 - 1) | st.just(2**63), st.integers(-1, 2**63 - 1), st.integers(-2, 2**63 - 1),
       st.sampled_from([0, V2Flag.RECOVERY_ADD, V2Flag.HIGH_PRIORITY | V2Flag.RECOVERY_ADD, V2Flag.FENCE]),
       st.lists(st.tuples(st.integers(0, 100), st.integers(0, 255)), max_size=3), st.integers(-3, 3),
       st.binary(max_size=3), st.booleans())
def test_the_v2_add_reader_reads_what_the_generic_decoder_accepts(ledger_id, entry_id, lac, flags, changes, resize,
                                                                   before, warm):
    """The bookie's fast path reads V2 adds in place, and whatever it reads out of any bytes (an id out of range, a
    byte changed, a frame cut short or longer, the last writer kept from the frame before or not) is exactly what
    the generic decoder decodes and its checks accept."""
    header = struct.pack(">QQQQ", ledger_id % 2**64, entry_id % 2**64, lac % 2**64, 7)
    frame = v2_add(header + b"payload", flags)
    reader = bkwire.AddReader(Protocol.V2)
    unchanged = _read_in_place(reader, bytearray(before + frame), len(before), len(before) + len(frame))
    assert unchanged == _generic_v2_add(frame[4:])
    if not warm:
        reader = bkwire.AddReader(Protocol.V2)
    hostile = _hostile(frame, changes, resize)
    read = _read_in_place(reader, bytearray(before) + hostile, len(before), len(before) + len(hostile))
    assert read is None or read == _generic_v2_add(bytes(hostile[4:]))


def test_v2_acks_of_a_run_are_the_answers_of_each_add():
    assert bkwire.encode_v2_add_acks(7, [0, 1, 2**40]) == b"".join(
        bkwire.encode_v2_response(V2Op.ADD, V2Status.EOK, 7, entry_id) for entry_id in (0, 1, 2**40)
    )


def test_acks_of_runs_that_cannot_be_answered_are_refused():
    """The C encoders check what they are given rather than write a wrong frame."""
    with pytest.raises(ValueError):
        bkwire.encode_v3_add_acks(7, [b"\x01", b"\x02"], [0])  # an entry id short
    with pytest.raises(ValueError):
        bkwire.encode_v3_add_acks(7, [bytes(11)], [0])  # no txnId varint is 11 bytes
    with pytest.raises(OverflowError):
        bkwire.encode_v2_add_acks(7, [2**63])


def _stream_frame(protocol: Protocol, writer: int, entry_id: int, txn_id: int, payload: bytes) -> bytes:
    """A whole add frame of one of two writers as its client lays it out."""
    ledger_id, epoch = (5, 0) if writer == 0 else (2**40, 2**35)
    entry = bk_entry(ledger_id, entry_id, payload)
    if protocol == Protocol.V2:
        return v2_add(entry, V2Flag.RECOVERY_ADD if writer else 0)
    return bkwire.AddRequestEncoder(ledger_id, MASTER_KEY, epoch, bool(writer)).frame(bkwire.varint(txn_id), entry)


_LYING_LENGTHS = st.sampled_from([0, 1, 3, 4, 60, 2**23, 2**23 + 1, 2**31, 2**32 - 1])


@given(st.sampled_from([Protocol.V2, Protocol.V3]),
       st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2**63 - 1), st.integers(0, 2**64 - 1),
                          st.binary(max_size=40)), min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(0, 7), st.integers(0, 120), st.integers(0, 255)), max_size=4),
       st.none() | st.tuples(st.integers(0, 7), _LYING_LENGTHS), st.integers(0, 40), st.binary(max_size=8),
       st.binary(max_size=200), st.integers(1, 9), st.integers(0, 2000))
def test_the_reader_reads_a_stream_only_as_the_generic_decoder_reads_each_frame(
    protocol, adds, changes, lying_length, cut, before, after, max_count, room
):
    """Never trust the network: a read's adds (two writers, V2 or V3), with bytes of their heads changed (where every
    field but the payload lies: a varint, a tag, a length, an id), a frame's length prefix lying (cut short, huge),
    the buffer's end cutting a frame whose rest lies beyond it, are read in runs as the connection reads them. Every
    add read is exactly what the generic decoder and its checks make of its frame; nothing is read from a frame that
    is not whole before the end, nor past the limits; an untouched stream is read whole."""
    frames = [bytearray(_stream_frame(protocol, *add)) for add in adds]
    if lying_length is not None:
        frames[lying_length[0] % len(frames)][:4] = struct.pack(">I", lying_length[1])
    for index, position, value in changes:
        frame = frames[index % len(frames)]
        frame[position % len(frame)] = value
    stream = bytearray(b"".join(frames))
    buffer = bytearray(before) + stream + after
    start, end = len(before), max(len(before), len(before) + len(stream) - cut)
    untouched = not changes and lying_length is None and cut == 0
    generic = _generic_add_fields if protocol == Protocol.V3 else _generic_v2_add
    reader = bkwire.AddReader(protocol)
    pos = start
    while (writer := reader.writer_of(buffer, pos, end)) is not None:
        run = SimpleNamespace(txns=[], entry_ids=[], lacs=[], entries=[])
        new_pos, count, size = reader.read_run(buffer, pos, end, run, max_count, room)
        assert 1 <= count <= max_count and size == sum(map(len, run.entries)) and pos < new_pos <= end
        for index in range(count):
            (length,) = struct.unpack_from(">I", buffer, pos)
            assert pos + 4 + length <= end and (index == 0 or length <= room - sum(map(len, run.entries[:index])))
            read = (run.txns[index], writer.ledger_id, run.entry_ids[index], writer.master_key, run.entries[index],
                    writer.recovery, writer.writer_epoch, run.lacs[index])
            assert _by_value(read) == _by_value(generic(bytes(buffer[pos + 4 : pos + 4 + length])))
            pos += 4 + length
        assert pos == new_pos
    if untouched:
        assert pos == end  # the client's own frames: all read in place


@pytest.mark.parametrize("protocol", [Protocol.V2, Protocol.V3])
@pytest.mark.parametrize("writer", [0, 1])
def test_every_byte_of_an_add_s_head_changed_is_read_only_as_the_generic_decoder_reads_it(protocol, writer):
    """Each byte of a frame up to its entry's payload (length prefix, header, every tag, length, varint and id of both
    layouts), changed to each of a few values, after a frame of the same writer (the reader warm): the frame is either
    read as the generic decoder and its checks read it, or left to them."""
    first = _stream_frame(protocol, writer, 7, 300, b"first")
    frame = _stream_frame(protocol, writer, 2**35, 2**40, b"payload")
    generic = _generic_add_fields if protocol == Protocol.V3 else _generic_v2_add
    for position in range(len(frame) - len(b"payload") - 4):  # the entry's digest too
        for value in {0x00, 0x01, 0x7F, 0x80, 0xFF, frame[position] ^ 0x01, (frame[position] + 1) % 256}:
            changed = bytearray(frame)
            changed[position] = value
            buffer = bytearray(first) + changed
            reader = bkwire.AddReader(protocol)
            run = SimpleNamespace(txns=[], entry_ids=[], lacs=[], entries=[])
            assert reader.writer_of(buffer, 0, len(buffer)) is not None
            pos, count, _ = reader.read_run(buffer, 0, len(buffer), run, 2, 1 << 30)
            if count == 2:
                (length,) = struct.unpack_from(">I", buffer, len(first))  # a shorter one leaves bytes after it
                assert pos == len(first) + 4 + length <= len(buffer)
                expected = generic(bytes(buffer[len(first) + 4 : pos]))
                assert expected is not None and _by_value(expected) == _by_value((
                    run.txns[1], reader.writer.ledger_id, run.entry_ids[1], reader.writer.master_key,
                    run.entries[1], reader.writer.recovery, reader.writer.writer_epoch, run.lacs[1],
                )), (position, value)
            elif (in_place := _read_in_place(bkwire.AddReader(protocol), changed, 0, len(changed))) is not None:
                assert _by_value(in_place) == _by_value(generic(bytes(changed[4:]))), (position, value)
