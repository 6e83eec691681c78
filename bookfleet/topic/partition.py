"""A topic's partitions in ZooKeeper, each an ordered list of ledgers, and the format of their entries.

    zkpaths.topic(name)               {"partitions": N}; N = 0 for a non-partitioned topic
    zkpaths.partition(name, index)    {"ledgers": [{"ledgerId", "closed", "lastEntryId", "bytes", "ctime"}, ...]}

A non-partitioned topic keeps its single ledger list at partition index -1, the partition its MessageIds carry.
Ledger ids only grow, so the list is in ledger-id order and at most its last ledger is open. Every change is a
compare-and-set on the znode version: a second producer on the same partition fails instead of forking the list.

An entry's payload is `kind u8 | count u32 | (length u32 | message) * count`: kind 0 is one message that was not
batched (MessageId batch index -1), kind 1 a batch (batch indexes 0..count-1).
"""

from __future__ import annotations

import json
import re
import struct
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from bookfleet import wire
from bookfleet.meta import zkpaths
from bookfleet.topic.messageid import NONE

NON_PARTITIONED = NONE
_TOPIC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class TopicError(Exception):
    """A topic or partition that is missing, malformed, or changed by someone else; the message says which."""


class PartitionChanged(TopicError):
    """The partition's ledger list changed since it was read: another producer owns the partition now."""


def check_topic_name(name: str) -> str:
    if not _TOPIC_NAME.fullmatch(name):
        raise TopicError(
            f"topic name {name!r} is invalid: use 1-200 letters, digits, '.', '_' or '-' (a letter or digit first)"
        )
    return name


# --- entry payloads -------------------------------------------------------------------------------------------

_KIND_COUNT = struct.Struct(">BI")
_LENGTH = struct.Struct(">I")
SINGLE, BATCH = 0, 1


def encode_messages(messages: Sequence[bytes], batched: bool) -> bytes:
    """One entry's payload; an unbatched entry holds exactly one message."""
    if not messages:
        raise ValueError("an entry needs at least one message")
    if not batched and len(messages) != 1:
        raise ValueError(f"an unbatched entry holds one message, got {len(messages)}")
    parts = [_KIND_COUNT.pack(BATCH if batched else SINGLE, len(messages))]
    for message in messages:
        parts += [_LENGTH.pack(len(message)), message]
    return b"".join(parts)


def decode_messages(payload: bytes) -> tuple[bool, list[bytes]]:
    """(batched, messages) of an entry payload; a malformed payload raises wire.ProtocolError naming the fault."""
    view = memoryview(payload)
    kind, count = wire.unpack_body(_KIND_COUNT, view, "topic entry")
    if kind not in (SINGLE, BATCH) or (kind == SINGLE and count != 1):
        raise wire.ProtocolError(f"topic entry has kind {kind} with {count} message(s)")
    messages, pos = [], _KIND_COUNT.size
    for index in range(count):
        (length,) = wire.unpack_body(_LENGTH, view[pos:], f"length of message {index} in topic entry")
        pos += _LENGTH.size
        if pos + length > len(view):
            raise wire.ProtocolError(f"message {index} of topic entry runs past its end ({length} bytes)")
        messages.append(bytes(view[pos : pos + length]))
        pos += length
    if pos != len(view):
        raise wire.ProtocolError(f"topic entry has {len(view) - pos} byte(s) after its {count} message(s)")
    return kind == BATCH, messages


# --- ledger lists ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """One ledger of a partition; `last_entry_id` and `bytes` are known once it is closed."""

    ledger_id: int
    closed: bool = False
    last_entry_id: int = wire.INVALID_ENTRY_ID
    bytes: int = 0
    ctime: float = 0.0


def _to_json(ledgers: Sequence[LedgerInfo]) -> bytes:
    keys = {"ledger_id": "ledgerId", "closed": "closed", "last_entry_id": "lastEntryId", "bytes": "bytes"}
    return json.dumps({"ledgers": [{keys.get(k, k): v for k, v in asdict(info).items()} for info in ledgers]}).encode()


def _from_json(data: bytes, path: str) -> list[LedgerInfo]:
    try:
        return [
            LedgerInfo(item["ledgerId"], item["closed"], item["lastEntryId"], item["bytes"], item["ctime"])
            for item in json.loads(data)["ledgers"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise TopicError(f"{path} does not hold a partition's ledger list: {exc!r}") from None


class Partition:
    """The ledger list of one partition; each change passes the version it read (compare-and-set)."""

    def __init__(self, zk: KazooClient, topic: str, index: int):
        if index < NON_PARTITIONED:
            raise TopicError(f"partition {index} of topic {topic!r} is invalid (use -1 or a partition index)")
        self.zk = zk
        self.topic = check_topic_name(topic)
        self.index = index
        self.path = zkpaths.partition(topic, index)

    def read(self) -> tuple[list[LedgerInfo], int]:
        """(ledgers in order, znode version); version -1 when the partition has no list yet."""
        try:
            data, stat = self.zk.get(self.path)
        except NoNodeError:
            return [], -1
        return _from_json(data, self.path), stat.version

    def append(self, ledger_id: int, version: int) -> int:
        """Add a new open ledger after the (closed) ones read at `version`; returns the new version."""
        ledgers, current = self.read()
        if current != version:
            raise PartitionChanged(f"{self}: ledger list changed (version {current}, expected {version})")
        if ledgers and not ledgers[-1].closed:
            raise TopicError(f"{self}: ledger {ledgers[-1].ledger_id} is still open; close it before appending")
        if ledgers and ledger_id <= ledgers[-1].ledger_id:
            raise TopicError(f"{self}: ledger {ledger_id} does not follow ledger {ledgers[-1].ledger_id}")
        return self._write([*ledgers, LedgerInfo(ledger_id, ctime=time.time())], version)

    def close(self, ledger_id: int, last_entry_id: int, size: int, version: int) -> int:
        """Record the last ledger as closed at `last_entry_id` with `size` bytes; returns the new version."""
        ledgers, current = self.read()
        if current != version:
            raise PartitionChanged(f"{self}: ledger list changed (version {current}, expected {version})")
        if not ledgers or ledgers[-1].ledger_id != ledger_id:
            raise TopicError(f"{self}: ledger {ledger_id} is not its last ledger")
        closed = replace(ledgers[-1], closed=True, last_entry_id=last_entry_id, bytes=size)
        return self._write([*ledgers[:-1], closed], version)

    def _write(self, ledgers: list[LedgerInfo], version: int) -> int:
        data = _to_json(ledgers)
        try:
            if version == -1:
                self.zk.create(self.path, data, makepath=True)
                return 0
            return self.zk.set(self.path, data, version=version).version
        except (BadVersionError, NodeExistsError, NoNodeError):
            raise PartitionChanged(f"{self}: ledger list changed under us (expected version {version})") from None

    def __str__(self) -> str:
        return f"partition {self.index} of topic {self.topic!r}"


class Topic:
    """A topic's partition count; `partitions()` lists its Partition objects (one at -1 when non-partitioned)."""

    def __init__(self, zk: KazooClient, name: str):
        self.zk = zk
        self.name = check_topic_name(name)
        self.path = zkpaths.topic(name)

    def create(self, partitions: int | None = None) -> int:
        """Create the topic with `partitions` (0: non-partitioned), or check an existing one; returns the count.

        With None an existing topic keeps its count and a new one is non-partitioned.
        """
        if partitions is not None and partitions < 0:
            raise TopicError(f"topic {self.name!r}: partition count must be >= 0, got {partitions}")
        try:
            self.zk.create(self.path, json.dumps({"partitions": partitions or 0}).encode(), makepath=True)
        except NodeExistsError:
            existing = self.partition_count()
            if partitions is not None and existing != partitions:
                raise TopicError(f"topic {self.name!r} exists with {existing} partition(s), not {partitions}") from None
            return existing
        return partitions or 0

    def partition_count(self) -> int:
        try:
            data, _ = self.zk.get(self.path)
        except NoNodeError:
            raise TopicError(f"topic {self.name!r} does not exist") from None
        try:
            return int(json.loads(data)["partitions"])
        except (ValueError, KeyError, TypeError) as exc:
            raise TopicError(f"{self.path} does not hold a topic's partition count: {exc!r}") from None

    def partitions(self) -> list[Partition]:
        count = self.partition_count()
        indexes = range(count) if count else [NON_PARTITIONED]
        return [Partition(self.zk, self.name, index) for index in indexes]
