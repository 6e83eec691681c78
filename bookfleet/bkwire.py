"""Apache BookKeeper's wire protocol (4.17), V2 and V3, as a bookie receives and answers it.

Both are length-prefixed; what follows the 4-byte length tells them apart, so a bookie decides per connection
from its first frame (`frame_protocol`), and closes a connection that opens with neither:

    V2:        header i32 = version 2 << 24 | op << 16 | flags, then the op's fields
    V3:        a protobuf `Request` (bkprotocol.py), whose first byte is field 1's tag, 0x0A

bookfleet's own client speaks V3 (client/connection.py), with bookfleet's extensions (bkprotocol.py's fields and
operations numbered from 1000) that a stock bookie skips; its per-request encoding (`AddRequestEncoder`,
`v3_request_head`) is written by hand here, as protobuf parses it. The per-entry loops over the same layouts are
C, each imported by this module only: the client's, an add's whole frame (`AddFrameEncoder`) and the reading of OK
add answers (`take_ok_add_answers`), in `_clientadds.c`; the bookie's, its in-place reading of a read's adds
(`AddReader`) and their answers (`encode_v2_add_acks`, `encode_v3_add_acks`), in `_bookieadds.c`.

V2 requests carry no id: the client matches an answer by (ledger, entry, op), so every answer repeats the request's
ledger and entry ids (BATCH_READ carries a request id of its own). V2 bodies:

    ADD        masterKey[20] | entry                 (the entry header names ledger and entry)
    READ       ledgerId i64 | entryId i64 [| masterKey[20] with FENCE]
    BATCH_READ ledgerId i64 | entryId i64 | requestId i64 | maxCount i32 | maxSize i64 [| masterKey[20] with FENCE]
    AUTH       a protobuf AuthMessage
    answer     header | rc i32 | ledgerId i64 | entryId i64 | body; BATCH_READ adds requestId i64 then
               (size i32 | entry)*; AUTH is header | AuthMessage

V3 answers are a protobuf `Response` carrying the request's header (its txnId) and a status. A V2 client knows only
the rcs in `V2Status` (any other makes it throw), a V3 client only the `StatusCode`s; `status_codes` maps the
bookie's own statuses onto both. Every decoder checks each field before anything reaches storage: ids in range, a
20-byte master key, an entry at least a header long; a violation raises `wire.InvalidField` (answered EBADREQ, the
connection goes on) or `wire.ProtocolError` (the frame cannot be read: the connection is closed).
"""

from __future__ import annotations

import enum
import itertools
import operator
import struct
from collections.abc import Iterator
from typing import NamedTuple

from google.protobuf.message import DecodeError

from bookfleet import _bookieadds, _clientadds, bkprotocol, wire
from bookfleet.bkprotocol import AddFlag, OperationType, StatusCode
from bookfleet.wire import InvalidField, ProtocolError, Status

MASTER_KEY_SIZE = wire.MASTER_KEY_SIZE
V2_VERSION = 2
V3_FIRST_BYTE = 0x0A
"""A V3 Request starts with its header, field 1 of wire type 2: tag byte 0x0A (no V2 header does)."""
AUTH_DISABLED_PLUGIN = "AuthDisabledPlugin"
"""The plugin name a bookie without authentication answers an AUTH request with; its client then goes on."""


class Protocol(enum.Enum):
    V2 = "v2"
    V3 = "v3"


def frame_protocol(first_byte: int) -> Protocol | None:
    """Which protocol a connection speaks, from the first byte after its first frame's length prefix; None for
    neither (the bookie closes the connection)."""
    if first_byte == V2_VERSION:
        return Protocol.V2
    if first_byte == V3_FIRST_BYTE:
        return Protocol.V3
    return None


class V2Op(enum.IntEnum):
    ADD = 1
    READ = 2
    AUTH = 3
    READ_LAC = 4
    WRITE_LAC = 5
    GET_BOOKIE_INFO = 6
    BATCH_READ = 7


class V2Flag(enum.IntFlag):
    NONE = 0
    FENCE = 1
    RECOVERY_ADD = 2
    HIGH_PRIORITY = 4


class V2Status(enum.IntEnum):
    EOK = 0
    ENOLEDGER = 1
    ENOENTRY = 2
    EBADREQ = 100
    EIO = 101
    EUA = 102
    EBADVERSION = 103
    EFENCED = 104
    EREADONLY = 105
    ETOOMANYREQUESTS = 106


_STATUS_CODES: dict[Status, tuple[V2Status, StatusCode]] = {
    Status.OK: (V2Status.EOK, StatusCode.EOK),
    Status.NO_SUCH_LEDGER: (V2Status.ENOLEDGER, StatusCode.ENOLEDGER),
    Status.NO_SUCH_ENTRY: (V2Status.ENOENTRY, StatusCode.ENOENTRY),
    Status.FENCED: (V2Status.EFENCED, StatusCode.EFENCED),
    Status.UNAUTHORIZED: (V2Status.EUA, StatusCode.EUA),
    Status.READ_ONLY: (V2Status.EREADONLY, StatusCode.EREADONLY),
    Status.BAD_REQUEST: (V2Status.EBADREQ, StatusCode.EBADREQ),
    Status.TOO_LARGE: (V2Status.EBADREQ, StatusCode.EBADREQ),
    Status.INTERNAL_ERROR: (V2Status.EIO, StatusCode.EIO),
    Status.SHUTTING_DOWN: (V2Status.EIO, StatusCode.EIO),
    Status.UNKNOWN_LEDGER_STATE: (V2Status.EIO, StatusCode.EUNKNOWNLEDGERSTATE),
}


def status_codes(status: Status) -> tuple[V2Status, StatusCode]:
    """The V2 rc and the V3 status of one of the bookie's statuses (a shutting-down bookie is EIO: the client
    tries another bookie; so is a bookie that cannot vouch for what it lacks, to a V2 client, which knows no rc
    for it: an error, never "no such entry")."""
    return _STATUS_CODES[status]


_CLIENT_STATUS: dict[int, Status] = {
    StatusCode.EOK: Status.OK,
    StatusCode.ENOLEDGER: Status.NO_SUCH_LEDGER,
    StatusCode.ENOENTRY: Status.NO_SUCH_ENTRY,
    StatusCode.EFENCED: Status.FENCED,
    StatusCode.EUA: Status.UNAUTHORIZED,
    StatusCode.EREADONLY: Status.READ_ONLY,
    StatusCode.EBADREQ: Status.BAD_REQUEST,
    StatusCode.EUNKNOWNLEDGERSTATE: Status.UNKNOWN_LEDGER_STATE,
}


def client_status(code: int) -> Status:
    """The status a client acts on for a V3 answer's status: what the client tells apart keeps its own status
    (fenced, read-only, no such ledger or entry, cannot vouch); anything else (EIO, EBADVERSION, ETOOMANYREQUESTS,
    a code this schema does not know) is an error of the bookie, to try elsewhere."""
    return _CLIENT_STATUS.get(code, Status.INTERNAL_ERROR)


# --- V2 ---------------------------------------------------------------------------------------------------------

V2_HEADER = struct.Struct(">I")
V2_MIN_FRAME = V2_HEADER.size
V2_READ = struct.Struct(">qq")
V2_BATCH_READ = struct.Struct(">qqqiq")
V2_RESPONSE = struct.Struct(">IIiqq")
"""Length prefix, header, rc, ledgerId, entryId: the head of every V2 answer but AUTH's."""
_REQUEST_ID = struct.Struct(">q")
_SIZE = struct.Struct(">i")


def v2_header(op: int, flags: int = 0) -> int:
    return V2_VERSION << 24 | op << 16 | flags


class V2Request(NamedTuple):
    """A decoded V2 request: `entry` is an ADD's entry, `auth` an AUTH's message; BATCH_READ's request id and
    limits are 0 for other ops."""

    op: int
    flags: int
    ledger_id: int
    entry_id: int
    master_key: bytes | None
    entry: bytes = b""
    request_id: int = 0
    max_count: int = 0
    max_size: int = 0
    auth: object = None


def decode_v2_request(frame: bytes | memoryview) -> V2Request:
    """A V2 request (the frame without its length prefix). ProtocolError when the frame cannot be read as one (an
    unknown op, a body too short: the connection ends, as a BookKeeper bookie's does); the ranges of its fields are
    `check_v2_request`'s."""
    view = memoryview(frame)
    if len(view) < V2_MIN_FRAME:
        raise ProtocolError(f"V2 frame of {len(view)} bytes is shorter than its {V2_MIN_FRAME}-byte header")
    (header,) = V2_HEADER.unpack_from(view)
    version, op, flags = header >> 24, header >> 16 & 0xFF, header & 0xFFFF
    if version != V2_VERSION:
        raise ProtocolError(f"V2 frame of protocol version {version} on a V2 connection")
    body = view[V2_HEADER.size :]
    fencing = bool(flags & V2Flag.FENCE)
    if op == V2Op.ADD:
        if len(body) < MASTER_KEY_SIZE + wire.ENTRY_HEADER.size:
            raise ProtocolError(f"V2 ADD body of {len(body)} bytes is shorter than a master key and an entry header")
        ledger_id, entry_id = V2_READ.unpack_from(body, MASTER_KEY_SIZE)  # signed, as the answer repeats them
        return V2Request(op, flags, ledger_id, entry_id, bytes(body[:MASTER_KEY_SIZE]), bytes(body[MASTER_KEY_SIZE:]))
    if op == V2Op.READ:
        ledger_id, entry_id = _unpack(V2_READ, body, "READ")
        return V2Request(op, flags, ledger_id, entry_id, _fence_key(body[V2_READ.size :], fencing, "READ"))
    if op == V2Op.BATCH_READ:
        ledger_id, entry_id, request_id, max_count, max_size = _unpack(V2_BATCH_READ, body, "BATCH_READ")
        key = _fence_key(body[V2_BATCH_READ.size :], fencing, "BATCH_READ")
        return V2Request(op, flags, ledger_id, entry_id, key, b"", request_id, max_count, max_size)
    if op == V2Op.AUTH:
        return V2Request(op, flags, -1, -1, None, auth=decode_auth_message(body))
    name = V2Op(op).name if op in V2Op._value2member_map_ else str(op)
    raise ProtocolError(f"V2 op {name} is not served over V2 (a BookKeeper client sends it over V3)")


def check_v2_request(request: V2Request) -> None:
    """The ranges of a decoded V2 request's fields (InvalidField names the one at fault): ids, and an ADD's LAC."""
    if request.op == V2Op.AUTH:
        return
    what = "entry header's " if request.op == V2Op.ADD else ""
    wire.check_ledger_id(request.ledger_id, what + "ledger id")
    if request.entry_id != wire.INVALID_ENTRY_ID or request.op != V2Op.READ:
        wire.check_entry_id(request.entry_id, what + "entry id")
    if request.op == V2Op.ADD:
        wire.check_lac(wire.entry_ids(request.entry)[2], "entry header's lac")


def _unpack(layout: struct.Struct, body: memoryview, what: str) -> tuple:
    if len(body) < layout.size:
        raise ProtocolError(f"V2 {what} body of {len(body)} bytes is shorter than {layout.size}")
    return layout.unpack_from(body)


def _fence_key(rest: memoryview, fencing: bool, what: str) -> bytes | None:
    """The master key that follows a fencing read's fields (none without FENCE: trailing bytes are ignored, as
    BookKeeper does)."""
    if not fencing:
        return None
    if len(rest) < MASTER_KEY_SIZE:
        raise ProtocolError(f"V2 {what} with FENCE needs a {MASTER_KEY_SIZE}-byte master key, got {len(rest)} bytes")
    return bytes(rest[:MASTER_KEY_SIZE])


def encode_v2_response(op: int, rc: int, ledger_id: int, entry_id: int, body: bytes = b"") -> bytes:
    """A whole V2 answer frame (ADD, READ, or an error of any op but BATCH_READ's)."""
    return V2_RESPONSE.pack(V2_RESPONSE.size - 4 + len(body), v2_header(op), rc, ledger_id, entry_id) + body


def encode_v2_batch_response(rc: int, ledger_id: int, entry_id: int, request_id: int, entries: list[bytes]) -> bytes:
    parts = [b""]
    for entry in entries:
        parts += (_SIZE.pack(len(entry)), entry)
    body = _REQUEST_ID.pack(request_id) + b"".join(parts)
    return encode_v2_response(V2Op.BATCH_READ, rc, ledger_id, entry_id, body)


def decode_v2_batch_entries(body: bytes | memoryview) -> tuple[int, list[bytes]]:
    """(request id, entries) of a BATCH_READ answer's body (what follows entryId): for tests and tools."""
    view = memoryview(body)
    (request_id,) = _unpack(_REQUEST_ID, view, "BATCH_READ answer")
    entries, pos = [], _REQUEST_ID.size
    while pos < len(view):
        (size,) = _unpack(_SIZE, view[pos:], "BATCH_READ entry size")
        pos += _SIZE.size
        if size < 0 or pos + size > len(view):
            raise ProtocolError(f"BATCH_READ entry of {size} bytes runs past the {len(view)}-byte answer")
        entries.append(bytes(view[pos : pos + size]))
        pos += size
    return request_id, entries


def encode_v2_auth_response(message: bytes) -> bytes:
    return V2_HEADER.pack(V2_HEADER.size + len(message)) + V2_HEADER.pack(v2_header(V2Op.AUTH)) + message


def encode_v2_request(op: int, flags: int, body: bytes) -> bytes:
    """A V2 request frame (clients and tests: the bookie only decodes them)."""
    return V2_HEADER.pack(V2_HEADER.size + len(body)) + V2_HEADER.pack(v2_header(op, flags)) + body


encode_v2_add_acks = _bookieadds.encode_v2_add_acks
"""`encode_v2_add_acks(ledger_id, entry_ids)`: the OK answers of V2 adds to one ledger, as `encode_v2_response`
lays each out."""


# --- V3 ---------------------------------------------------------------------------------------------------------

_REQUEST_FIELD = {
    OperationType.READ_ENTRY: "readRequest",
    OperationType.ADD_ENTRY: "addRequest",
    OperationType.AUTH: "authRequest",
    OperationType.WRITE_LAC: "writeLacRequest",
    OperationType.READ_LAC: "readLacRequest",
    OperationType.GET_BOOKIE_INFO: "getBookieInfoRequest",
    OperationType.START_TLS: "startTLSRequest",
    OperationType.FORCE_LEDGER: "forceLedgerRequest",
    OperationType.RAISE_EPOCH: "raiseEpochRequest",
    OperationType.READ_RANGE: "readRangeRequest",
}
"""The Request field that carries each operation's fields."""
RESPONSE_FIELD = {
    OperationType.READ_ENTRY: "readResponse",
    OperationType.ADD_ENTRY: "addResponse",
    OperationType.AUTH: "authResponse",
    OperationType.WRITE_LAC: "writeLacResponse",
    OperationType.READ_LAC: "readLacResponse",
    OperationType.GET_BOOKIE_INFO: "getBookieInfoResponse",
    OperationType.START_TLS: "startTLSResponse",
    OperationType.FORCE_LEDGER: "forceLedgerResponse",
    OperationType.RAISE_EPOCH: "raiseEpochResponse",
    OperationType.READ_RANGE: "readRangeResponse",
}
"""The Response field that carries each operation's answer."""


class V3Request(NamedTuple):
    """A V3 request with a header: `fields` is the operation's own message (e.g. the ReadRequest), None when the
    operation is not served or its message is missing; `txn_id` goes back in the answer's header."""

    operation: int
    txn_id: int
    version: int
    priority: int
    fields: object


class BadVersion(InvalidField):
    """A V3 request of another protocol version: answered EBADVERSION, as a BookKeeper bookie does."""


def decode_v3_request(frame: bytes | memoryview) -> V3Request:
    """A V3 request (the frame without its length prefix): ProtocolError when it is no protobuf Request or its
    header lacks a field (nothing to answer to: the connection ends). Its fields are checked by
    `check_v3_request`, whose refusal is answered with the request's txnId."""
    request = bkprotocol.Request()
    try:
        request.ParseFromString(frame)
    except DecodeError as exc:
        raise ProtocolError(f"V3 frame of {len(frame)} bytes is not a protobuf Request: {exc}") from None
    header = request.header
    for field in ("version", "operation", "txnId"):
        if not header.HasField(field):
            raise ProtocolError(f"V3 request header without {field}")
    field = _REQUEST_FIELD.get(header.operation)
    fields = getattr(request, field) if field is not None and request.HasField(field) else None
    return V3Request(header.operation, header.txnId, header.version, header.priority, fields)


def check_v3_request(request: V3Request) -> None:
    """Everything a processor reads, before it reads it: the version, a served operation with its message, and
    the presence and range of each field (InvalidField names the one at fault; BadVersion)."""
    if request.version != bkprotocol.ProtocolVersion.VERSION_THREE:
        raise BadVersion(f"V3 request of protocol version {request.version}")
    if request.operation not in _REQUEST_FIELD:
        raise InvalidField(f"V3 operation {request.operation} is not served")
    operation = OperationType(request.operation)
    if request.fields is None:
        raise InvalidField(f"V3 {operation.name} request without its {_REQUEST_FIELD[operation]}")
    _check_v3_fields(operation, request.fields)


_REQUIRED = {
    OperationType.READ_ENTRY: ("ledgerId", "entryId"),
    OperationType.ADD_ENTRY: ("ledgerId", "entryId", "masterKey", "body"),
    OperationType.AUTH: ("authPluginName",),
    OperationType.WRITE_LAC: ("ledgerId", "lac", "masterKey", "body"),
    OperationType.READ_LAC: ("ledgerId",),
    OperationType.FORCE_LEDGER: ("ledgerId",),
    OperationType.RAISE_EPOCH: ("ledgerId", "masterKey", "writerEpoch"),
    OperationType.READ_RANGE: ("ledgerId", "firstEntryId", "lastEntryId", "maxBytes"),
}


def _check_v3_fields(operation: OperationType, fields) -> None:
    for field in _REQUIRED.get(operation, ()):
        if not fields.HasField(field):
            raise InvalidField(f"V3 {operation.name} request without {field}")
    if operation in (OperationType.AUTH, OperationType.GET_BOOKIE_INFO, OperationType.START_TLS):
        return
    wire.check_ledger_id(fields.ledgerId)
    if operation == OperationType.ADD_ENTRY:
        wire.check_entry_id(fields.entryId)
        _check_key(fields.masterKey)
        if len(fields.body) < wire.ENTRY_HEADER.size:
            raise InvalidField(f"ADD entry of {len(fields.body)} bytes is shorter than its header")
        ledger_id, entry_id, lac, _ = wire.ENTRY_HEADER.unpack_from(fields.body)
        if (ledger_id, entry_id) != (fields.ledgerId, fields.entryId):
            raise InvalidField(
                f"entry header names ledger {ledger_id} entry {entry_id}, "
                f"the request ledger {fields.ledgerId} entry {fields.entryId}"
            )
        wire.check_lac(lac, "entry header's lac")
        wire.check_writer_epoch(fields.writerEpoch)
    elif operation == OperationType.READ_ENTRY:
        if fields.entryId != wire.INVALID_ENTRY_ID:
            wire.check_entry_id(fields.entryId)
        if fields.HasField("flag") and fields.flag not in bkprotocol.ReadFlag._value2member_map_:
            raise InvalidField(f"READ flag {fields.flag} is neither FENCE_LEDGER nor ENTRY_PIGGYBACK")
        if fields.flag == bkprotocol.ReadFlag.FENCE_LEDGER:
            _check_key(fields.masterKey)
        if fields.HasField("previousLAC"):
            wire.check_lac(fields.previousLAC, "previous lac")
        if fields.HasField("timeOut") and fields.timeOut < 0:
            raise InvalidField(f"long poll timeout {fields.timeOut} ms is negative")
    elif operation == OperationType.WRITE_LAC:
        wire.check_lac(fields.lac)
        _check_key(fields.masterKey)
    elif operation == OperationType.RAISE_EPOCH:
        _check_key(fields.masterKey)
        wire.check_writer_epoch(fields.writerEpoch)
    elif operation == OperationType.READ_RANGE:
        wire.check_entry_id(fields.firstEntryId, "first entry id")
        if fields.lastEntryId < fields.firstEntryId:
            raise InvalidField(f"last entry id {fields.lastEntryId} is before first entry id {fields.firstEntryId}")
        if fields.maxBytes < 0:
            raise InvalidField(f"READ_RANGE maxBytes {fields.maxBytes} is negative")


def _check_key(key: bytes) -> None:
    if len(key) != MASTER_KEY_SIZE:
        raise InvalidField(f"master key of {len(key)} bytes, not {MASTER_KEY_SIZE}")


def v3_response(operation: int, txn_id: int, status: StatusCode):
    """A Response to a request: its header (version 3, the operation, the txnId) and status."""
    response = bkprotocol.Response(status=status)
    response.header.version = bkprotocol.ProtocolVersion.VERSION_THREE
    response.header.operation = operation
    response.header.txnId = txn_id
    return response


def v3_refusal(request: V3Request, status: StatusCode, message: str = ""):
    """The answer refusing a request with `status`: the envelope's status and the bookie's `message` (bookfleet's
    field, skipped by a stock client), and the operation's own answer with the same status and the request's ledger
    and entry ids (the fields a BookKeeper client reads from it)."""
    response = v3_response(request.operation, request.txn_id, status)
    if message:
        response.errorMessage = message
    field = RESPONSE_FIELD.get(request.operation)
    if field is None or request.operation in (OperationType.AUTH, OperationType.START_TLS):
        return response
    answer = getattr(response, field)
    answer.status = status
    for name in ("ledgerId", "entryId"):
        if name in answer.DESCRIPTOR.fields_by_name and request.fields is not None:
            setattr(answer, name, getattr(request.fields, name, 0))
    return response


def encode_v3(message) -> bytes:
    """A V3 frame: the length prefix and the serialized message."""
    data = message.SerializeToString()
    return V2_HEADER.pack(len(data)) + data


def decode_auth_message(data: bytes | memoryview):
    message = bkprotocol.AuthMessage()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"AUTH body of {len(data)} bytes is not an AuthMessage: {exc}") from None
    return message


def auth_disabled_answer() -> bytes:
    """The AuthMessage a bookie without authentication answers any AUTH request with."""
    return bkprotocol.AuthMessage(authPluginName=AUTH_DISABLED_PLUGIN, payload=b"").SerializeToString()


# --- V3, bookfleet's client and the add path ----------------------------------------------------------------------


def _encode_varint(value: int) -> bytes:
    """A protobuf varint (a negative int64 takes ten bytes, as protobuf encodes it)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = tuple(_encode_varint(value) for value in range(1 << 14))
_LOW_VARINT_BYTES = tuple(bytes((value & 0x7F | 0x80, value >> 7 | 0x80)) for value in range(1 << 14))
"""The first two bytes of the varint of any value >= 2^14 whose low 14 bits are the index: with `_SMALL_VARINTS`,
the varint of a value below 2^28 is two table look-ups (`_V[v] if v < 16384 else _V2[v & 16383] + _V[v >> 14]`,
written out where it is per-entry work, for non-negative values only)."""
_V, _V2 = _SMALL_VARINTS, _LOW_VARINT_BYTES


def varint(value: int) -> bytes:
    """A protobuf varint; the ones below 2^28 (txnIds, entry ids and sizes) from two tables."""
    if 0 <= value < 16384:
        return _V[value]
    if 0 < value < 268435456:
        return _V2[value & 16383] + _V[value >> 14]
    return _encode_varint(value)


def txn_ids() -> Iterator[bytes]:
    """Unique txnIds as their varints' bytes, made in C (no Python call per id): first every value from 2^14 to
    2^28 - 1 once (each a 3- or 4-byte varint: its low 14 bits' two bytes, then the rest's), in an order of no
    meaning, then counting on from 2^28."""
    made_in_c = itertools.starmap(operator.add, itertools.product(_LOW_VARINT_BYTES, _SMALL_VARINTS[1:]))
    return itertools.chain(made_in_c, map(varint, itertools.count(1 << 28)))


def varint_value(data: bytes) -> int:
    """The value of one well-formed varint (the client's and bookie's txnIds are kept as their varint's bytes)."""
    value = 0
    for shift, byte in enumerate(data):
        value |= (byte & 0x7F) << 7 * shift
    return value


def _tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


_VARINT, _LENGTH_DELIMITED = 0, 2
_LENGTH = struct.Struct(">I")
_ADD_HEADER = b"\x08\x03\x10\x02\x18"
"""A V3 ADD request's or answer's header up to its txnId: version 3, operation ADD_ENTRY."""
_ADD_REQUEST_TAG = b"\xaa\x06"
"""Request.addRequest: field 101, length-delimited (and Response.addResponse)."""
_RECOVERY_FLAG = _tag(100, _VARINT) + varint(AddFlag.RECOVERY_ADD)
_WRITER_EPOCH_TAG = _tag(1000, _VARINT)


class AddRequestEncoder:
    """Lays out the V3 ADD requests of one writer (ledger, master key, writer epoch, recovery flag) as protobuf does:
    a Request whose header is version 3, ADD_ENTRY and the txnId, and whose AddRequest holds ledgerId, masterKey,
    [flag RECOVERY_ADD], writerEpoch, entryId and body, in that order. The writer's fields are encoded once; per
    entry only txnId, entry id and sizes. The one definition of this layout: the client writes its adds with it and
    the bookie's in-place reader (`AddReader`) reads an add only if it is byte for byte what this writes."""

    __slots__ = ("_fixed_size", "fixed", "ledger_id", "master_key", "recovery", "writer_epoch")

    def __init__(self, ledger_id: int, master_key: bytes, writer_epoch: int, recovery: bool = False):
        self.ledger_id, self.master_key = ledger_id, master_key
        self.writer_epoch, self.recovery = writer_epoch, recovery
        self.fixed = b"".join((
            _tag(1, _VARINT), varint(ledger_id), _tag(3, _LENGTH_DELIMITED), varint(len(master_key)), master_key,
            _RECOVERY_FLAG if recovery else b"", _WRITER_EPOCH_TAG, varint(writer_epoch),
        ))
        """The AddRequest's writer fields (ledger id, master key, recovery flag, writer epoch) as they are laid out."""
        self._fixed_size = len(self.fixed) + 2
        """The AddRequest's bytes beside the entry id's and the body's varints and the body: the fixed fields and
        the entry id's and body's tags."""

    def frame_head(self, txn: bytes, entry_id: int, entry_size: int) -> bytes:
        """The whole request frame up to the entry's bytes (which follow it unchanged, `wire.encode_entry`'s
        `prefix`): length prefix, header with `txn` (the txnId's varint, see `varint`), the AddRequest's tag and
        length, its fields up to the body's tag and length. `entry_size` below 2^28 (a frame is at most 8 MiB); the
        varint of each value below 2^28 is two table look-ups: this is per-entry work on both sides."""
        entry = (
            _V[entry_id] if 0 <= entry_id < 16384 else _V2[entry_id & 16383] + _V[entry_id >> 14]
            if 0 < entry_id < 268435456 else varint(entry_id)
        )
        size = _V[entry_size] if entry_size < 16384 else _V2[entry_size & 16383] + _V[entry_size >> 14]
        message_size = self._fixed_size + len(entry) + len(size) + entry_size
        message = _V[message_size] if message_size < 16384 else _V2[message_size & 16383] + _V[message_size >> 14]
        return b"".join((
            _LENGTH.pack(9 + len(txn) + len(message) + message_size), b"\x0a", _V[5 + len(txn)], _ADD_HEADER, txn,
            _ADD_REQUEST_TAG, message, self.fixed, b"\x10", entry, b"\x22", size,
        ))

    def frame(self, txn: bytes, entry: bytes) -> bytes:
        """The whole request frame of an encoded entry (a copy of it: for entries encoded already, as repair's)."""
        return self.frame_head(txn, wire.entry_ids(entry)[1], len(entry)) + entry


class AddFrameEncoder(_clientadds.AddFrameEncoder):
    """A writer's whole add frames, the entry encoded in them, in one C call (`frame_of(txn, entry_id, lac, length,
    payload)`, or `pending_add`: see `PendingAdd`): byte for byte `frame_head`'s bytes and then
    `wire.Digester.encode`'s entry (header, digest, payload). The ledger writer's per-entry encode, in C because in
    Python it was a quarter of the client's instructions per entry (docs/design.md); a CRC32C digest is made in C
    too, any other by the ledger's digest."""

    __slots__ = ()

    def __new__(cls, ledger_id: int, master_key: bytes, writer_epoch: int, recovery: bool, digester: wire.Digester):
        fixed = AddRequestEncoder(ledger_id, master_key, writer_epoch, recovery).fixed
        digest = None if digester.digest_type == wire.DigestType.CRC32C else digester.digest
        return super().__new__(cls, ledger_id, fixed, digester.size, digest)


PendingAdd = _clientadds.PendingAdd
"""The ledger writer's object of one add until every bookie it was sent to answered (BookKeeper's PendingAddOp), made
with its frame and send time in one C call, `AddFrameEncoder.pending_add(txn, entry_id, lac, length, payload,
on_done)`: `entry_id`, `length`, `body` (the frame), `txn`, `on_done` read-only; `sent_at` (time.monotonic's clock),
`acks` and `owed` (bitmasks of ensemble positions, 0 at first) the writer's to change."""


def with_txn(frame: bytes, txn: bytes) -> bytes:
    """An ADD request frame written by `AddRequestEncoder` with another txnId (`txn`, its varint): for an add sent
    again on a connection where its first send is not answered yet."""
    rest = frame[6 + frame[5] :]  # after the header, whose length is the byte after the frame's first
    return b"".join((_LENGTH.pack(7 + len(txn) + len(rest)), b"\x0a", _V[5 + len(txn)], _ADD_HEADER, txn, rest))


def _request_heads() -> dict[int, tuple[bytes, bytes]]:
    """Per operation, the bytes of a Request's header before its txnId, and the tag of the operation's message."""
    heads = {}
    for operation, field in _REQUEST_FIELD.items():
        number = bkprotocol.Request.DESCRIPTOR.fields_by_name[field].number
        before_txn = b"\x08" + varint(bkprotocol.ProtocolVersion.VERSION_THREE) + b"\x10" + varint(operation) + b"\x18"
        heads[operation] = before_txn, _tag(number, _LENGTH_DELIMITED)
    return heads


_REQUEST_HEADS = _request_heads()


def v3_request_head(operation: int, txn: bytes, message_size: int) -> bytes:
    """A V3 request frame up to its operation's message (of `message_size` bytes, which follows it unchanged): the
    length prefix, the header (version 3, the operation, `txn`: the txnId's varint) and the message's tag and
    length."""
    before_txn, tag = _REQUEST_HEADS[operation]
    size = varint(message_size)
    header_size = len(before_txn) + len(txn)  # < 128 bytes
    return b"".join((
        _LENGTH.pack(2 + header_size + len(tag) + len(size) + message_size), b"\x0a", _V[header_size],
        before_txn, txn, tag, size,
    ))


def encode_v3_request(operation: int, txn_id: int, message) -> bytes:
    """A V3 request frame carrying `message` (the operation's own protobuf message)."""
    data = message.SerializeToString()
    return v3_request_head(operation, varint(txn_id), len(data)) + data


encode_v3_add_acks = _bookieadds.encode_v3_add_acks
"""`encode_v3_add_acks(ledger_id, txns, entry_ids)`: the OK answer frames of adds to one ledger given by their
txnIds' varints and entry ids (>= 0), as protobuf lays each Response out: a bookie answers the adds of one writer and
one group commit together (the ledger's part is encoded once)."""


def encode_v3_add_ack(txn_id: int, ledger_id: int, entry_id: int) -> bytes:
    """The whole OK answer frame of one add."""
    return encode_v3_add_acks(ledger_id, [varint(txn_id)], [entry_id])


take_ok_add_answers = _clientadds.take_ok_add_answers
"""`take_ok_add_answers(buffer, pending)`: the client's per-ack reading, in C. Hands each OK ADD answer at the
front of `buffer` (a bytearray of length-prefixed answers) to its waiter and deletes it from the buffer: the waiter
`pending` holds under the answer's txnId varint, if it is an `(on_answer, arg)` tuple, is popped and called
`on_answer(arg, None)`. An OK ADD answer is one laid out as protobuf writes it: a header with version, operation
and txnId only, the EOK status, an AddResponse of status EOK, ledger id and entry id (each an int64's varint),
nothing else. It stops at the first frame that is not whole, is above the frame limit, is no such answer or has no
such waiter: the caller parses that one whole (`decode_v3_response`). An exception from `on_answer` is raised once
the answers before it are taken off."""


def decode_v3_response(frame: bytes | memoryview):
    """A V3 answer (the frame without its length prefix); ProtocolError when it is no protobuf Response or has no
    header (the client cannot tell which request it answers)."""
    response = bkprotocol.Response()
    try:
        response.ParseFromString(frame)
    except DecodeError as exc:
        raise ProtocolError(f"V3 answer of {len(frame)} bytes is not a protobuf Response: {exc}") from None
    if not response.header.HasField("txnId") or not response.HasField("status"):
        raise ProtocolError("V3 answer without a txnId or a status")
    return response


ADD_FRAME_OVERHEAD = 96
"""An upper bound on what a V3 add frame holds beside its master key and entry: the length prefix, the header with
a 10-byte txnId, the message's tag and length, ledger and entry ids, the recovery flag, the writer epoch and the
entry's tag and length, each varint at its longest."""


def max_payload_size(digest_type: wire.DigestType | str) -> int:
    """The largest entry payload whose V3 ADD frame (envelope, master key, entry header, digest) a bookie accepts."""
    entry_overhead = wire.ENTRY_HEADER.size + wire.digest_size(wire.DigestType(digest_type))
    return wire.MAX_FRAME_SIZE - ADD_FRAME_OVERHEAD - wire.MASTER_KEY_SIZE - entry_overhead


AddFields = tuple[bytes, int, int, bytes, bytes, bool, int, int]
"""(txn, ledger_id, entry_id, master_key, entry, recovery, writer_epoch, lac) of a V3 ADD that passed every check
`check_v3_request` makes, its txnId as its varint's bytes (echoed in the answer as they came): the bookie's fast
path applies it as it is."""


def checked_add_fields(request: V3Request) -> AddFields | None:
    """The fields of a decoded V3 ADD that passes every check `check_v3_request` makes, each field read once; None
    for anything else (the session's full checks then name the fault). The bookie's per-add check for an add in
    another layout than `AddReader`'s: a quarter of the generic one's cost."""
    fields = request.fields
    if request.version != bkprotocol.ProtocolVersion.VERSION_THREE or fields is None:
        return None
    ledger_id, entry_id, key, entry = fields.ledgerId, fields.entryId, fields.masterKey, fields.body
    writer_epoch = fields.writerEpoch
    if not (
        0 <= ledger_id <= _INT64_MAX and 0 <= entry_id <= _INT64_MAX and 0 <= writer_epoch <= _INT64_MAX
        and len(key) == MASTER_KEY_SIZE and len(entry) >= _ENTRY_HEADER.size
        and fields.HasField("ledgerId") and fields.HasField("entryId")
    ):
        return None
    header_ledger, header_entry, lac, _ = _ENTRY_HEADER.unpack_from(entry)
    if header_ledger != ledger_id or header_entry != entry_id or not -1 <= lac <= _INT64_MAX:
        return None
    recovery = fields.flag == AddFlag.RECOVERY_ADD
    return varint(request.txn_id), ledger_id, entry_id, key, entry, recovery, writer_epoch, lac


def add_request_of(txn: bytes, ledger_id: int, entry_id: int) -> V3Request:
    """An ADD request as far as its refusal names it (the bookie's fast path keeps only these of an add)."""
    fields = bkprotocol.AddRequest(ledgerId=ledger_id, entryId=entry_id)
    return V3Request(OperationType.ADD_ENTRY, varint_value(txn), bkprotocol.ProtocolVersion.VERSION_THREE, 0, fields)


_INT64_MAX = wire.INT64_MAX
_ENTRY_HEADER = wire.ENTRY_HEADER


class InPlaceWriter(NamedTuple):
    """The fields every add of one writer repeats, as `AddReader` read them; `key` is their bytes in the frame (V2:
    header, master key and the entry header's ledger id; V3: the AddRequest's fields before the entry id), which every
    next add of the writer repeats byte for byte."""

    key: bytes
    ledger_id: int
    master_key: bytes
    recovery: bool
    writer_epoch: int


class AddReader:
    """Reads a connection's adds in place (`_bookieadds.c`): V2 ADDs as `decode_v2_request` and `check_v2_request`
    accept them (ids signed from the entry header, in range; any flags, RECOVERY_ADD the one that counts; epoch 0),
    V3 ADDs byte for byte as `AddRequestEncoder` writes them for the fields they name, every field in the range
    `check_v3_request` checks (the txnId's varint kept as it came, echoed in the answer). Anything else (another order,
    a field more or repeated, a value out of range, a varint not as protobuf writes it) is not read and goes to the
    generic decoder, which decodes and checks it; what this reads is what that decodes. The entry is the one copy made.

    One per connection, keeping the last writer: a run of its adds is one C call (`read_run`)."""

    __slots__ = ("_v3", "writer")

    def __init__(self, protocol: Protocol) -> None:
        self._v3 = protocol == Protocol.V3
        self.writer: InPlaceWriter | None = None
        """The writer of the last add read: the same object for every add of one writer."""

    def writer_of(self, buffer: bytearray, frame_start: int, end: int) -> InPlaceWriter | None:
        """The writer of the add framed in buffer[frame_start:end] (its length prefix included), kept as the reader's
        writer; None when it is not an add this reads (the generic decoder decides it)."""
        fields = _bookieadds.writer_of(self._v3, buffer, frame_start, end)
        if fields is None:
            return None
        writer = self.writer
        if writer is None or writer.key != fields[0]:
            writer = self.writer = InPlaceWriter(*fields)
        return writer

    def read_run(self, buffer: bytearray, pos: int, end: int, run, max_count: int, room: int) -> tuple[int, int, int]:
        """Read the writer's adds framed one after another from buffer[pos:end] into `run` (txnId varints, b"" in
        V2, entry ids, lacs, entries appended to its lists): as many as are whole and read in place, at most
        `max_count`, those after the first only while their frame's length fits what `room` leaves after the entries
        before them. Returns the position after the last one read, how many, and their entries' bytes."""
        return _bookieadds.read_adds(
            self._v3, buffer, pos, end, self.writer.key, run.txns, run.entry_ids, run.lacs, run.entries, max_count,
            room,
        )
