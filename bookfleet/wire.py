"""Entries, digests and the field checks, defined once for bookie, client, repair and audit alike.

The frames around them are Apache BookKeeper's V2 and V3 (`bkwire.py`): a 4-byte big-endian length followed by
that many bytes, at most MAX_FRAME_SIZE. `Status` is the bookie's own vocabulary of outcomes, which bkwire maps
onto each protocol's status codes and back.

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
import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import crc32c

LENGTH_PREFIX = struct.Struct(">I")
MAX_FRAME_SIZE = 8 * 1024 * 1024
"""The largest frame a bookie accepts; a larger length prefix closes the connection."""

ENTRY_HEADER = struct.Struct(">QqqQ")
LAC_HEADER = struct.Struct(">Qq")
"""An explicit LAC's body before its digest: ledger id, LAC (BookKeeper's WRITE_LAC body and READ_LAC lacBody)."""
MASTER_KEY_SIZE = 20
INVALID_ENTRY_ID = -1


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
        """The encoded entry, after `prefix` (bkwire.AddRequestEncoder's frame head): the payload is copied once. The
        writer's per-add call, so a CRC32C digest is computed here rather than through `digest`."""
        header = ENTRY_HEADER.pack(ledger_id, entry_id, lac, length)
        if self._crc32c:
            return b"".join((prefix, header, _CRC32C.pack(crc32c.crc32c(payload, crc32c.crc32c(header))), payload))
        return b"".join((prefix, header, self.digest(header, payload), payload))

    def lac_body(self, ledger_id: int, lac: int) -> bytes:
        """The digest-signed explicit LAC a WRITE_LAC carries: a stock bookie refuses one without it, and hands it
        to BookKeeper's readers, who check its digest before they believe the LAC."""
        header = LAC_HEADER.pack(ledger_id, lac)
        return header + self.digest(header, b"")


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
    """The encoded entry, after `prefix` (bkwire.AddRequestEncoder's frame head): see Digester.encode."""
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
