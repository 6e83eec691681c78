"""Entries, digests and the field checks, defined once for bookie, client, repair and audit alike.

The frames around them are Apache BookKeeper's V2 and V3 (`bkwire.py`): a 4-byte big-endian length followed by
that many bytes, at most MAX_FRAME_SIZE. `Status` is the bookie's own vocabulary of outcomes, which bkwire maps
onto each protocol's status codes and back.

An entry, on the wire and at rest, is a 32-byte header, a digest and the payload:

    ledger_id u64 | entry_id i64 | lac i64 | length u64 | digest | payload

`length` is the ledger's cumulative length including this entry. The digest covers the 32 header bytes plus the
payload: CRC32C (4 bytes), or HMAC-SHA256 (32 bytes) keyed from the ledger password.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass

import crc32c

LENGTH_PREFIX = struct.Struct(">I")
MAX_FRAME_SIZE = 8 * 1024 * 1024
"""The largest frame a bookie accepts; a larger length prefix closes the connection."""

ENTRY_HEADER = struct.Struct(">QqqQ")
MASTER_KEY_SIZE = 32
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
    CRC32C = "crc32c"
    MAC = "mac"


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
    """The key that guards adds, fencing and epoch raises on a bookie; derived, so the password never travels."""
    return hashlib.sha256(b"bookfleet-master-key\0" + password).digest()


def _mac_key(password: bytes) -> bytes:
    return hashlib.sha256(b"bookfleet-mac\0" + password).digest()


_CRC = struct.Struct(">I")


def digest_size(digest_type: DigestType) -> int:
    return 4 if digest_type == DigestType.CRC32C else 32


class Digester:
    """Computes and checks entry digests for one ledger."""

    __slots__ = ("_crc", "_key", "digest_type", "size")

    def __init__(self, digest_type: DigestType | str, password: bytes = b""):
        self.digest_type = DigestType(digest_type)
        self.size = digest_size(self.digest_type)
        self._key = _mac_key(password)
        self._crc = self.digest_type == DigestType.CRC32C
        """Decided once: comparing a StrEnum on every entry costs more than the CRC itself."""

    def digest(self, header: bytes, payload: bytes | memoryview) -> bytes:
        if self._crc:
            return _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(header)))
        mac = hmac.new(self._key, header, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def encode(
        self, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes, prefix: bytes = b""
    ) -> bytes:
        """The encoded entry, after `prefix` (bkwire.AddRequestPrefix's): the payload is copied once. The
        writer's per-add call, so a CRC32C digest is computed here rather than through `digest`."""
        header = ENTRY_HEADER.pack(ledger_id, entry_id, lac, length)
        if self._crc:
            return b"".join((prefix, header, _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(header))), payload))
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
    """The encoded entry, after `prefix` (bkwire.AddRequestPrefix's): see Digester.encode."""
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
