"""Apache BookKeeper's protocol V3 messages, in bookfleet's own schema.

The field numbers and wire types are the ones BookKeeper 4.17 documents for its `Request`/`Response` envelope
(`BookkeeperProtocol.proto`); the schema is declared here in Python and built with the `protobuf` package, so
there is no generated code and no protoc step. Two deliberate choices, both invisible on the wire:

- every field is `optional`: a missing field is reported by `bookfleet.bkwire` naming it (a parse never fails
  on a missing "required" field, so a hostile frame gets a precise EBADREQ);
- enum fields (version, operation, status, flags) are plain varints (`int32`): an operation or status this
  schema does not know arrives as its number instead of disappearing into unknown fields.

Fields bookfleet does not read (the request context, 200) are kept by protobuf as unknown fields and ignored.

bookfleet's own fields and operations have numbers from 1000 on, far above any BookKeeper uses, so a stock
bookie or client skips them as unknown fields: an add's writer epoch (AddRequest.writerEpoch), the bookie's error
message (Response.errorMessage), a read-only bookie's state (GetBookieInfoResponse.readOnly, always present in a
bookfleet bookie's answer: how a client tells the two kinds of bookie apart), and two operations
only bookfleet's client sends, and only to bookfleet bookies: RAISE_EPOCH (a reopening writer's fence) and
READ_RANGE (the present entries of a span, for repair).
"""

from __future__ import annotations

import enum

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_INT64, _UINT64, _INT32, _UINT32 = _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_INT32, _F.TYPE_UINT32
_BYTES, _STRING, _MESSAGE, _BOOL = _F.TYPE_BYTES, _F.TYPE_STRING, _F.TYPE_MESSAGE, _F.TYPE_BOOL
_REPEATED = "repeated"
"""The last element of a field's tuple that makes it repeated."""
_PACKAGE = "bookfleet.bkprotocol"


class ProtocolVersion(enum.IntEnum):
    VERSION_ONE = 1
    VERSION_TWO = 2
    VERSION_THREE = 3


class StatusCode(enum.IntEnum):
    EOK = 0
    ENOLEDGER = 402
    ENOENTRY = 403
    EBADREQ = 404
    EIO = 501
    EUA = 502
    EBADVERSION = 503
    EFENCED = 504
    EREADONLY = 505
    ETOOMANYREQUESTS = 506
    EUNKNOWNLEDGERSTATE = 507


class OperationType(enum.IntEnum):
    READ_ENTRY = 1
    ADD_ENTRY = 2
    AUTH = 5
    WRITE_LAC = 6
    READ_LAC = 7
    GET_BOOKIE_INFO = 8
    START_TLS = 9
    FORCE_LEDGER = 10
    RAISE_EPOCH = 1000
    """bookfleet's own: from now on the bookie refuses adds of an older writer epoch."""
    READ_RANGE = 1001
    """bookfleet's own: the present entries of [firstEntryId, lastEntryId], in order, up to maxBytes."""


class ReadFlag(enum.IntEnum):
    """ReadRequest.flag: one of these, never both."""

    FENCE_LEDGER = 1
    ENTRY_PIGGYBACK = 2


class AddFlag(enum.IntEnum):
    RECOVERY_ADD = 1


class BookieInfoWanted(enum.IntFlag):
    """GetBookieInfoRequest.requested: a bitwise OR."""

    TOTAL_DISK_CAPACITY = 1
    FREE_DISK_SPACE = 2


# message name -> (field name, number, type[, message type name | _REPEATED]); numbers >= 1000 are bookfleet's.
_MESSAGES: dict[str, list[tuple]] = {
    "BKPacketHeader": [("version", 1, _INT32), ("operation", 2, _INT32), ("txnId", 3, _UINT64),
                       ("priority", 4, _UINT32)],
    "ReadRequest": [("ledgerId", 1, _INT64), ("entryId", 2, _INT64), ("masterKey", 3, _BYTES),
                    ("previousLAC", 4, _INT64), ("timeOut", 5, _INT64), ("flag", 100, _INT32)],
    "AddRequest": [("ledgerId", 1, _INT64), ("entryId", 2, _INT64), ("masterKey", 3, _BYTES), ("body", 4, _BYTES),
                   ("writeFlags", 5, _INT32), ("flag", 100, _INT32), ("writerEpoch", 1000, _UINT64)],
    "AuthMessage": [("authPluginName", 1, _STRING), ("payload", 2, _BYTES)],
    "WriteLacRequest": [("ledgerId", 1, _INT64), ("lac", 2, _INT64), ("masterKey", 3, _BYTES), ("body", 4, _BYTES)],
    "ReadLacRequest": [("ledgerId", 1, _INT64)],
    "GetBookieInfoRequest": [("requested", 1, _INT64)],
    "StartTLSRequest": [],
    "ForceLedgerRequest": [("ledgerId", 1, _INT64)],
    "RaiseEpochRequest": [("ledgerId", 1, _INT64), ("masterKey", 2, _BYTES), ("writerEpoch", 3, _UINT64)],
    "ReadRangeRequest": [("ledgerId", 1, _INT64), ("firstEntryId", 2, _INT64), ("lastEntryId", 3, _INT64),
                         ("maxBytes", 4, _INT64)],
    "ReadResponse": [("status", 1, _INT32), ("ledgerId", 2, _INT64), ("entryId", 3, _INT64), ("body", 4, _BYTES),
                     ("maxLAC", 5, _INT64), ("lacUpdateTimestamp", 6, _INT64)],
    "AddResponse": [("status", 1, _INT32), ("ledgerId", 2, _INT64), ("entryId", 3, _INT64)],
    "WriteLacResponse": [("status", 1, _INT32), ("ledgerId", 2, _INT64)],
    "ForceLedgerResponse": [("status", 1, _INT32), ("ledgerId", 2, _INT64)],
    "ReadLacResponse": [("status", 1, _INT32), ("ledgerId", 2, _INT64), ("lacBody", 3, _BYTES),
                        ("lastEntryBody", 4, _BYTES)],
    "GetBookieInfoResponse": [("status", 1, _INT32), ("totalDiskCapacity", 2, _INT64), ("freeDiskSpace", 3, _INT64),
                              ("readOnly", 1000, _BOOL)],
    "RaiseEpochResponse": [("status", 1, _INT32), ("ledgerId", 2, _INT64), ("lac", 3, _INT64),
                           ("lastEntryId", 4, _INT64)],
    "ReadRangeResponse": [("status", 1, _INT32), ("ledgerId", 2, _INT64), ("entries", 3, _BYTES, _REPEATED)],
    "StartTLSResponse": [],
    "Request": [("header", 1, _MESSAGE, "BKPacketHeader"), ("readRequest", 100, _MESSAGE, "ReadRequest"),
                ("addRequest", 101, _MESSAGE, "AddRequest"), ("authRequest", 102, _MESSAGE, "AuthMessage"),
                ("writeLacRequest", 103, _MESSAGE, "WriteLacRequest"),
                ("readLacRequest", 104, _MESSAGE, "ReadLacRequest"),
                ("getBookieInfoRequest", 105, _MESSAGE, "GetBookieInfoRequest"),
                ("startTLSRequest", 106, _MESSAGE, "StartTLSRequest"),
                ("forceLedgerRequest", 107, _MESSAGE, "ForceLedgerRequest"),
                ("raiseEpochRequest", 1000, _MESSAGE, "RaiseEpochRequest"),
                ("readRangeRequest", 1001, _MESSAGE, "ReadRangeRequest")],
    "Response": [("header", 1, _MESSAGE, "BKPacketHeader"), ("status", 2, _INT32),
                 ("readResponse", 100, _MESSAGE, "ReadResponse"), ("addResponse", 101, _MESSAGE, "AddResponse"),
                 ("authResponse", 102, _MESSAGE, "AuthMessage"),
                 ("writeLacResponse", 103, _MESSAGE, "WriteLacResponse"),
                 ("readLacResponse", 104, _MESSAGE, "ReadLacResponse"),
                 ("getBookieInfoResponse", 105, _MESSAGE, "GetBookieInfoResponse"),
                 ("startTLSResponse", 106, _MESSAGE, "StartTLSResponse"),
                 ("forceLedgerResponse", 107, _MESSAGE, "ForceLedgerResponse"),
                 ("raiseEpochResponse", 1000, _MESSAGE, "RaiseEpochResponse"),
                 ("readRangeResponse", 1001, _MESSAGE, "ReadRangeResponse"),
                 ("errorMessage", 1100, _STRING)],
}


def _build() -> dict[str, type]:
    """The message classes of `_MESSAGES`, from one file descriptor in a pool of this module's own."""
    schema = descriptor_pb2.FileDescriptorProto(name="bookfleet/bkprotocol.proto", package=_PACKAGE, syntax="proto2")
    for name, fields in _MESSAGES.items():
        message = schema.message_type.add(name=name)
        for field_name, number, field_type, *kind in fields:
            repeated = kind == [_REPEATED]
            label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            field = message.field.add(name=field_name, number=number, type=field_type, label=label)
            if kind and not repeated:
                field.type_name = f".{_PACKAGE}.{kind[0]}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name in _MESSAGES
    }


_CLASSES = _build()
Request = _CLASSES["Request"]
Response = _CLASSES["Response"]
AuthMessage = _CLASSES["AuthMessage"]
AddRequest = _CLASSES["AddRequest"]
ReadRequest = _CLASSES["ReadRequest"]
WriteLacRequest = _CLASSES["WriteLacRequest"]
GetBookieInfoRequest = _CLASSES["GetBookieInfoRequest"]
ForceLedgerRequest = _CLASSES["ForceLedgerRequest"]
RaiseEpochRequest = _CLASSES["RaiseEpochRequest"]
ReadRangeRequest = _CLASSES["ReadRangeRequest"]
