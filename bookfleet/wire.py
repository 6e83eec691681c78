"""The bookie wire format, defined once for bookie, client, repair and audit alike.

A frame on TCP is a 4-byte big-endian length followed by that many bytes: a 12-byte header and a body.

    request header:  version u8 | op u8 | flags u16 | request_id u64
    response header: version u8 | op u8 | status u16 | request_id u64

Responses carry the request's id, so requests pipeline and responses may come back out of order. A response
whose status is not OK carries a UTF-8 message as its body.

An entry, on the wire and at rest, is a 32-byte header, a digest and the payload:

    ledger_id u64 | entry_id i64 | lac i64 | length u64 | digest | payload

`length` is the ledger's cumulative length including this entry. The digest covers the 32 header bytes plus the
payload, as Apache BookKeeper's DigestManager computes it, so either side's entries verify on the other: CRC32C
(4 bytes), CRC32 (8 bytes: the 32-bit CRC as a big-endian u64), HMAC-SHA1 (20 bytes) keyed by SHA-1("mac" +
password), or none (DUMMY). The master key that guards a ledger on a bookie is BookKeeper's SHA-1("ledger" +
password), 20 bytes.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import crc32c

PROTOCOL_VERSION = 1
LENGTH_PREFIX = struct.Struct(">I")
REQUEST_HEADER = struct.Struct(">BBHQ")
RESPONSE_HEADER = struct.Struct(">BBHQ")
HEADER_SIZE = REQUEST_HEADER.size
MAX_FRAME_SIZE = 8 * 1024 * 1024
"""The largest frame a bookie accepts; a larger length prefix is answered with TOO_LARGE."""

ENTRY_HEADER = struct.Struct(">QqqQ")
MASTER_KEY_SIZE = 20
INVALID_ENTRY_ID = -1


class Op(enum.IntEnum):
    ADD_ENTRY = 1
    READ_ENTRY = 2
    READ_LAC = 3
    WRITE_LAC = 4
    GET_BOOKIE_INFO = 5
    FORCE_LEDGER = 6
    READ_RANGE = 7
    RAISE_EPOCH = 8


class Flag(enum.IntFlag):
    NONE = 0
    RECOVERY_ADD = 1
    """ADD_ENTRY: written by recovery or repair; accepted on a fenced ledger."""
    FENCE = 2
    """READ_ENTRY: fence the ledger before reading; needs the master key."""


class Status(enum.IntEnum):
    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    FENCED = 3
    UNAUTHORIZED = 4
    READ_ONLY = 5
    BAD_REQUEST = 6
    TOO_LARGE = 7
    INTERNAL_ERROR = 8
    SHUTTING_DOWN = 9
    UNKNOWN_LEDGER_STATE = 10
    """A read of what the bookie lacks while it cannot vouch that it never had it (its journal lost synced records):
    an error, never "no such ledger or entry". Apache BookKeeper's EUNKNOWNLEDGERSTATE (507; v2 protocol 107)."""


class BookieState(enum.IntEnum):
    WRITABLE = 0
    READ_ONLY = 1


class DigestType(enum.StrEnum):
    """A ledger's entry digest, named in its metadata (BookKeeper's DigestType; MAC is its HMAC)."""

    CRC32C = "crc32c"
    CRC32 = "crc32"
    MAC = "mac"
    DUMMY = "dummy"


# --- bodies ---------------------------------------------------------------------------------------------------
# ADD_ENTRY   request: master_key[20] | writer_epoch u64 | entry          response: ledger_id u64 | entry_id i64
#             (refused FENCED when the bookie knows a higher writer epoch for the ledger, unless RECOVERY_ADD;
#             a higher one than it knows raises its own)
# READ_ENTRY  request: ledger_id u64 | entry_id i64 [| master_key[20] with FENCE]
#             response: entry; for entry_id -1: lac i64 | last_entry_id i64 (the bookie's view, for recovery)
# READ_LAC    request: ledger_id u64 | previous_lac i64 | timeout_ms u32   response: lac i64
#             (long poll: answers once lac > previous_lac, or with the current lac when the timeout ends)
# WRITE_LAC   request: master_key[20] | ledger_id u64 | lac i64            response: empty
# GET_BOOKIE_INFO request: empty        response: free_bytes u64 | total_bytes u64 | state u8
# FORCE_LEDGER request: ledger_id u64   response: ledger_id u64 (answered once everything before it is synced)
# READ_RANGE  request: ledger_id u64 | first i64 | last i64 | max_bytes u32
#             response: count u32 | (size u32 | entry) * count   (the present entries of [first, last], in order)
# RAISE_EPOCH request: master_key[20] | ledger_id u64 | writer_epoch u64   response: lac i64 | last_entry_id i64
#             (a reopening writer's fence: from now on adds of an older epoch are refused; answered with the
#             bookie's view once durable; FENCED if the bookie knows a higher epoch or the ledger is fenced)
LEDGER_ENTRY = struct.Struct(">Qq")
READ_LAC_REQUEST = struct.Struct(">QqI")
LAC = struct.Struct(">q")
LAC_AND_LAST = struct.Struct(">qq")
WRITE_LAC_BODY = struct.Struct(">Qq")
BOOKIE_INFO = struct.Struct(">QQB")
LEDGER_ID = struct.Struct(">Q")
READ_RANGE_REQUEST = struct.Struct(">QqqI")
COUNT = struct.Struct(">I")
WRITER_EPOCH = struct.Struct(">Q")
ADD_PREFIX_SIZE = MASTER_KEY_SIZE + WRITER_EPOCH.size
"""What precedes the entry in an ADD_ENTRY body: master key and writer epoch."""
RAISE_EPOCH_BODY = struct.Struct(">QQ")
"""RAISE_EPOCH after the master key: ledger_id, writer_epoch."""
ADD_REQUEST_HEAD = struct.Struct(f">BBHQ{MASTER_KEY_SIZE}sQQqqQ")
"""An ADD_ENTRY request's header, master key, writer epoch and entry header: every field of an add in one unpack."""
ADD_RESPONSE = struct.Struct(">IBBHQQq")
"""A whole OK ADD_ENTRY response frame: length prefix, header, ledger_id, entry_id."""
ADD_ACK_LENGTH = ADD_RESPONSE.size - LENGTH_PREFIX.size
"""The length prefix of an OK ADD_ENTRY response."""


class ProtocolError(Exception):
    """A frame or body that does not follow this format; the message says what was wrong."""


class InvalidField(ValueError):
    """A well-framed request with a field out of its range; the message names the field. A bookie answers it
    BAD_REQUEST and keeps the connection: the framing is intact, only this request is refused."""


INT64_MAX = 2**63 - 1
"""Ids travel as u64/i64 but are stored as SQLite's signed 64-bit integers: nothing above this is an id."""


def check_ledger_id(ledger_id: int, what: str = "ledger id") -> int:
    """A ledger id: 0 <= id <= INT64_MAX (a u64 field may carry more, which no storage could hold)."""
    if not 0 <= ledger_id <= INT64_MAX:
        raise InvalidField(f"{what} {ledger_id} is outside [0, {INT64_MAX}]")
    return ledger_id


def check_entry_id(entry_id: int, what: str = "entry id") -> int:
    """An id that names an entry: 0 <= id <= INT64_MAX."""
    if not 0 <= entry_id <= INT64_MAX:
        raise InvalidField(f"{what} {entry_id} is outside [0, {INT64_MAX}]")
    return entry_id


def check_lac(lac: int, what: str = "lac") -> int:
    """A last-add-confirmed: an entry id, or INVALID_ENTRY_ID (-1) while nothing is confirmed."""
    if not INVALID_ENTRY_ID <= lac <= INT64_MAX:
        raise InvalidField(f"{what} {lac} is outside [{INVALID_ENTRY_ID}, {INT64_MAX}]")
    return lac


def check_writer_epoch(epoch: int, what: str = "writer epoch") -> int:
    """A writer epoch: 0 <= epoch <= INT64_MAX (a bookie keeps it in SQLite next to the ledger's other state)."""
    if not 0 <= epoch <= INT64_MAX:
        raise InvalidField(f"{what} {epoch} is outside [0, {INT64_MAX}]")
    return epoch


def add_prefix(master_key: bytes, writer_epoch: int) -> bytes:
    """The start of an ADD_ENTRY body, before the encoded entry (pass it as encode_entry's `prefix`)."""
    return master_key + WRITER_EPOCH.pack(writer_epoch)


def encode_entry_list(entries: list[bytes]) -> bytes:
    """READ_RANGE response body: count u32 | (size u32 | entry) * count."""
    parts = [COUNT.pack(len(entries))]
    for entry in entries:
        parts += (COUNT.pack(len(entry)), entry)
    return b"".join(parts)


def decode_entry_list(body: bytes | memoryview) -> list[bytes]:
    view = memoryview(body)
    (count,) = unpack_body(COUNT, view, "READ_RANGE response")
    entries = []
    pos = COUNT.size
    for index in range(count):
        (size,) = unpack_body(COUNT, view[pos:], f"READ_RANGE entry {index} size")
        pos += COUNT.size
        if pos + size > len(view):
            raise ProtocolError(f"READ_RANGE entry {index} of {size} bytes runs past the {len(view)}-byte response")
        entries.append(bytes(view[pos : pos + size]))
        pos += size
    return entries


# --- frames ---------------------------------------------------------------------------------------------------


def encode_request(op: Op, request_id: int, body: bytes = b"", flags: int = 0) -> bytes:
    return encode_request_head(op, request_id, len(body), flags) + body


def encode_request_head(op: Op, request_id: int, body_size: int, flags: int = 0) -> bytes:
    """Length prefix and header of a request whose body follows: a body shared by several requests (one entry sent
    to its whole write set) is then never copied per request."""
    return FRAME_HEAD.pack(HEADER_SIZE + body_size, PROTOCOL_VERSION, op, flags, request_id)


FRAME_HEAD = struct.Struct(">I" + REQUEST_HEADER.format.lstrip(">"))
"""Length prefix and header of a frame (request or response: the layouts are the same), packed or read at once."""


def encode_response(op: int, request_id: int, status: Status = Status.OK, body: bytes = b"") -> bytes:
    header = RESPONSE_HEADER.pack(PROTOCOL_VERSION, op, status, request_id)
    return LENGTH_PREFIX.pack(HEADER_SIZE + len(body)) + header + body


def encode_error(op: int, request_id: int, status: Status, message: str) -> bytes:
    return encode_response(op, request_id, status, message.encode())


encode_add_response: Callable[[int, int, int], bytes] = functools.partial(
    ADD_RESPONSE.pack, ADD_ACK_LENGTH, PROTOCOL_VERSION, int(Op.ADD_ENTRY), int(Status.OK)
)
"""encode_add_response(request_id, ledger_id, entry_id): the whole OK ADD_ENTRY response frame, packed in C (a
bookie packs one per add; the answers of one group commit go out joined)."""


class Frame(NamedTuple):
    """A decoded frame: `code` is the flags of a request or the status of a response."""

    op: int
    code: int
    request_id: int
    body: bytes | memoryview


def check_frame_length(length: int, max_frame_size: int = MAX_FRAME_SIZE) -> None:
    if length < HEADER_SIZE:
        raise ProtocolError(f"frame of {length} bytes is shorter than the {HEADER_SIZE}-byte header")
    if length > max_frame_size:
        raise ProtocolError(f"frame of {length} bytes exceeds the {max_frame_size}-byte limit")


def decode_header(data: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, int, int]:
    """(op, code, request_id) of the header at `offset` (the caller knows it is there); checks the version."""
    version, op, code, request_id = REQUEST_HEADER.unpack_from(data, offset)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version} is not supported (this side speaks {PROTOCOL_VERSION})")
    return op, code, request_id


def decode_frame(frame: bytes | memoryview) -> Frame:
    """Decode a frame without its length prefix."""
    view = memoryview(frame)
    if len(view) < HEADER_SIZE:
        raise ProtocolError(f"frame of {len(view)} bytes is shorter than the {HEADER_SIZE}-byte header")
    return Frame(*decode_header(view), view[HEADER_SIZE:])


def take_frames(
    buffer: bytearray, on_frame: Callable[[int, int, int, int, int], None], max_frame_size: int = MAX_FRAME_SIZE
) -> None:
    """Call `on_frame(op, code, request_id, start, end)` for every whole frame at the front of `buffer`, its body
    being buffer[start:end], then take them off (a partial frame stays). Per frame: one unpack of length prefix and
    header, the checks inline and no copy, so an answer whose body nobody reads (an add's ack) costs no allocation.
    Raises ProtocolError on a bad length or version; the frames before it were handed over and are taken off."""
    pos = 0
    end = len(buffer)
    unpack, head_size = FRAME_HEAD.unpack_from, FRAME_HEAD.size
    try:
        while end - pos >= head_size:
            length, version, op, code, request_id = unpack(buffer, pos)
            if not HEADER_SIZE <= length <= max_frame_size:
                check_frame_length(length, max_frame_size)
            start = pos + LENGTH_PREFIX.size
            if end - start < length:
                return
            if version != PROTOCOL_VERSION:
                decode_header(buffer, start)  # raises, naming the version
            pos = start + length
            on_frame(op, code, request_id, start + HEADER_SIZE, pos)
        if end - pos >= LENGTH_PREFIX.size:  # a partial head whose length already shows it can never be a frame
            (length,) = LENGTH_PREFIX.unpack_from(buffer, pos)
            check_frame_length(length, max_frame_size)
    finally:
        del buffer[:pos]


def split_frames(buffer: bytearray, max_frame_size: int = MAX_FRAME_SIZE) -> list[Frame]:
    """Decode and take every whole frame off the front of `buffer` (bodies are bytes); a partial frame stays."""
    frames: list[Frame] = []

    def decode(op: int, code: int, request_id: int, start: int, end: int) -> None:
        frames.append(Frame(op, code, request_id, bytes(buffer[start:end])))

    take_frames(buffer, decode, max_frame_size)
    return frames


def unpack_body(layout: struct.Struct, body: bytes | memoryview, what: str) -> tuple:
    """Unpack a fixed-size body, naming the operation when it has the wrong size."""
    if len(body) < layout.size:
        raise ProtocolError(f"{what} body of {len(body)} bytes is shorter than {layout.size}")
    return layout.unpack_from(body)


# --- keys and digests -----------------------------------------------------------------------------------------


def master_key(password: bytes) -> bytes:
    """The key that guards adds, fencing and epoch raises on a bookie: BookKeeper's SHA-1("ledger" + password), so a
    Java client and bookfleet's hold the same key for the same ledger; derived, so the password never travels."""
    return hashlib.sha1(b"ledger" + password).digest()


def _mac_key(password: bytes) -> bytes:
    return hashlib.sha1(b"mac" + password).digest()


_CRC32C = struct.Struct(">I")
_CRC32 = struct.Struct(">Q")
_DIGEST_SIZES = {DigestType.CRC32C: 4, DigestType.CRC32: 8, DigestType.MAC: 20, DigestType.DUMMY: 0}


def _crc32c_digest(header: bytes, payload: bytes | memoryview) -> bytes:
    return _CRC32C.pack(crc32c.crc32c(payload, crc32c.crc32c(header)))


def _crc32_digest(header: bytes, payload: bytes | memoryview) -> bytes:
    return _CRC32.pack(zlib.crc32(payload, zlib.crc32(header)))


def _no_digest(header: bytes, payload: bytes | memoryview) -> bytes:
    return b""


def _mac_digest(keyed: hmac.HMAC) -> Callable[[bytes, bytes | memoryview], bytes]:
    """HMAC-SHA1 of header and payload, from a copy of the ledger's keyed state (keying costs two SHA-1 blocks)."""

    def digest(header: bytes, payload: bytes | memoryview) -> bytes:
        mac = keyed.copy()
        mac.update(header)
        mac.update(payload)
        return mac.digest()

    return digest


def digest_size(digest_type: DigestType | str) -> int:
    return _DIGEST_SIZES[DigestType(digest_type)]


def max_payload_size(digest_type: DigestType | str) -> int:
    """The largest entry payload whose ADD_ENTRY frame (header, master key, entry header, digest) a bookie accepts."""
    return MAX_FRAME_SIZE - HEADER_SIZE - ADD_PREFIX_SIZE - ENTRY_HEADER.size - digest_size(digest_type)


class Digester:
    """Computes and checks entry digests for one ledger; `digest(header, payload)` is the ledger's digest function,
    chosen once."""

    __slots__ = ("_crc32c", "digest", "digest_type", "size")

    def __init__(self, digest_type: DigestType | str, password: bytes = b""):
        self.digest_type = DigestType(digest_type)
        self.size = _DIGEST_SIZES[self.digest_type]
        self.digest: Callable[[bytes, bytes | memoryview], bytes] = {
            DigestType.CRC32C: _crc32c_digest,
            DigestType.CRC32: _crc32_digest,
            DigestType.DUMMY: _no_digest,
        }.get(self.digest_type) or _mac_digest(hmac.new(_mac_key(password), digestmod=hashlib.sha1))
        self._crc32c = self.digest_type == DigestType.CRC32C
        """Decided once: comparing a StrEnum on every entry costs more than the CRC itself."""

    def encode(
        self, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes, prefix: bytes = b""
    ) -> bytes:
        """The encoded entry, after `prefix` (an ADD_ENTRY body's add_prefix): the payload is copied once. The
        writer's per-add call, so a CRC32C digest is computed here rather than through `digest`."""
        header = ENTRY_HEADER.pack(ledger_id, entry_id, lac, length)
        if self._crc32c:
            return b"".join((prefix, header, _CRC32C.pack(crc32c.crc32c(payload, crc32c.crc32c(header))), payload))
        return b"".join((prefix, header, self.digest(header, payload), payload))


@dataclass(frozen=True, slots=True)
class Entry:
    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes


class DigestMismatch(ProtocolError):
    """An entry whose digest does not match its contents: corrupt on disk or in flight, or the wrong password."""


def encode_entry(
    digester: Digester, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes, prefix: bytes = b""
) -> bytes:
    """The encoded entry, after `prefix` (an ADD_ENTRY body's add_prefix): see Digester.encode."""
    return digester.encode(ledger_id, entry_id, lac, length, payload, prefix)


def entry_ids(entry: bytes | memoryview) -> tuple[int, int, int]:
    """(ledger_id, entry_id, lac) of an encoded entry, without checking its digest: what a bookie needs."""
    if len(entry) < ENTRY_HEADER.size:
        raise ProtocolError(f"entry of {len(entry)} bytes is shorter than the {ENTRY_HEADER.size}-byte header")
    ledger_id, entry_id, lac, _ = ENTRY_HEADER.unpack_from(entry)
    return ledger_id, entry_id, lac


def decode_entry(digester: Digester, entry: bytes | memoryview) -> Entry:
    """Decode an entry and verify its digest."""
    view = memoryview(entry)
    start = ENTRY_HEADER.size + digester.size
    if len(view) < start:
        raise ProtocolError(f"entry of {len(view)} bytes is shorter than its {start}-byte header and digest")
    ledger_id, entry_id, lac, length = ENTRY_HEADER.unpack_from(view)
    header = bytes(view[: ENTRY_HEADER.size])
    payload = bytes(view[start:])
    if not hmac.compare_digest(digester.digest(header, payload), bytes(view[ENTRY_HEADER.size : start])):
        raise DigestMismatch(f"digest mismatch on ledger {ledger_id} entry {entry_id}")
    return Entry(ledger_id, entry_id, lac, length, payload)
