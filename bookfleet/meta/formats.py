"""Apache BookKeeper's ZooKeeper record messages, in bookfleet's own schema.

The field names, numbers, types and labels are the facts BookKeeper 4.17 documents for its records (ledger metadata,
bookie registrations, cookies, under-replication markers, locks, auditor votes, the rereplication layout, the time
of the auditor's last full check); the schema is built here in Python from descriptor_pb2 rather than compiled from
a .proto, so there is no protoc step and no generated file to keep in step. Names matter as much as numbers: the
text-format records (markers, cookies, locks, votes) are read by BookKeeper's text parser, which refuses a name it
does not know.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_REQUIRED, _OPTIONAL, _REPEATED = _F.LABEL_REQUIRED, _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_INT32, _INT64, _STRING, _BYTES, _ENUM, _MESSAGE = (
    _F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_ENUM, _F.TYPE_MESSAGE,
)
_PACKAGE = "bookfleet.bookkeeper"


def _message(container, name: str, fields: list[tuple], nested: tuple = (), enums: dict | None = None):
    """Add message `name` to `container`: fields are (name, number, label, type[, type name[, default]])."""
    message = container.add()
    message.name = name
    for enum_name, values in (enums or {}).items():
        enum = message.enum_type.add()
        enum.name = enum_name
        for value_name, number in values.items():
            enum.value.add(name=value_name, number=number)
    for build in nested:
        build(message.nested_type)
    for field_name, number, label, kind, *rest in fields:
        field = message.field.add(name=field_name, number=number, label=label, type=kind)
        if rest:
            field.type_name = rest[0]
        if len(rest) > 1:
            field.default_value = rest[1]
    return message


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="bookfleet/bookkeeper_formats.proto", package=_PACKAGE)
    proto.syntax = "proto2"
    lm = f".{_PACKAGE}.LedgerMetadataFormat"
    _message(
        proto.message_type,
        "LedgerMetadataFormat",
        [
            ("quorumSize", 1, _REQUIRED, _INT32),
            ("ensembleSize", 2, _REQUIRED, _INT32),
            ("length", 3, _REQUIRED, _INT64),
            ("lastEntryId", 4, _OPTIONAL, _INT64),
            ("state", 5, _REQUIRED, _ENUM, f"{lm}.State", "OPEN"),
            ("segment", 6, _REPEATED, _MESSAGE, f"{lm}.Segment"),
            ("digestType", 7, _OPTIONAL, _ENUM, f"{lm}.DigestType"),
            ("password", 8, _OPTIONAL, _BYTES),
            ("ackQuorumSize", 9, _OPTIONAL, _INT32),
            ("ctime", 10, _OPTIONAL, _INT64),
            ("customMetadata", 11, _REPEATED, _MESSAGE, f"{lm}.cMetadataMapEntry"),
            ("cToken", 12, _OPTIONAL, _INT64),
        ],
        nested=(
            lambda nested: _message(nested, "Segment", [
                ("ensembleMember", 1, _REPEATED, _STRING),
                ("firstEntryId", 2, _REQUIRED, _INT64),
            ]),
            lambda nested: _message(nested, "cMetadataMapEntry", [
                ("key", 1, _OPTIONAL, _STRING),
                ("value", 2, _OPTIONAL, _BYTES),
            ]),
        ),
        enums={
            "State": {"OPEN": 1, "IN_RECOVERY": 2, "CLOSED": 3},
            "DigestType": {"CRC32": 1, "HMAC": 2, "CRC32C": 3, "DUMMY": 4},
        },
    )
    _message(proto.message_type, "LedgerRereplicationLayoutFormat", [
        ("type", 1, _REQUIRED, _STRING),
        ("version", 2, _REQUIRED, _INT32),
    ])
    _message(proto.message_type, "UnderreplicatedLedgerFormat", [
        ("replica", 1, _REPEATED, _STRING),
        ("ctime", 2, _OPTIONAL, _INT64),
    ])
    _message(proto.message_type, "CookieFormat", [
        ("bookieHost", 1, _REQUIRED, _STRING),
        ("journalDir", 2, _REQUIRED, _STRING),
        ("ledgerDirs", 3, _REQUIRED, _STRING),
        ("instanceId", 4, _OPTIONAL, _STRING),
    ])
    _message(proto.message_type, "LockDataFormat", [("bookieId", 1, _OPTIONAL, _STRING)])
    _message(proto.message_type, "AuditorVoteFormat", [("bookieId", 1, _OPTIONAL, _STRING)])
    _message(proto.message_type, "CheckAllLedgersFormat", [("checkAllLedgersCTime", 1, _OPTIONAL, _INT64)])
    bs = f".{_PACKAGE}.BookieServiceInfoFormat"
    info = _message(
        proto.message_type,
        "BookieServiceInfoFormat",
        [
            ("endpoints", 6, _REPEATED, _MESSAGE, f"{bs}.Endpoint"),
            ("properties", 7, _REPEATED, _MESSAGE, f"{bs}.PropertiesEntry"),
        ],
        nested=(
            lambda nested: _message(nested, "Endpoint", [
                ("id", 1, _REQUIRED, _STRING),
                ("port", 2, _REQUIRED, _INT32),
                ("host", 3, _REQUIRED, _STRING),
                ("protocol", 4, _REQUIRED, _STRING),
                ("auth", 5, _REPEATED, _STRING),
                ("extensions", 6, _REPEATED, _STRING),
            ]),
            lambda nested: _message(nested, "PropertiesEntry", [
                ("key", 1, _OPTIONAL, _STRING),
                ("value", 2, _OPTIONAL, _STRING),
            ]),
        ),
    )
    info.nested_type[1].options.map_entry = True  # map<string, string> properties = 7
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _class(name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


LedgerMetadataFormat = _class("LedgerMetadataFormat")
LedgerRereplicationLayoutFormat = _class("LedgerRereplicationLayoutFormat")
UnderreplicatedLedgerFormat = _class("UnderreplicatedLedgerFormat")
CookieFormat = _class("CookieFormat")
LockDataFormat = _class("LockDataFormat")
AuditorVoteFormat = _class("AuditorVoteFormat")
CheckAllLedgersFormat = _class("CheckAllLedgersFormat")
BookieServiceInfoFormat = _class("BookieServiceInfoFormat")
