"""MessageId: where a message lives, `ledgerId:entryId:partition:batchIndex` (Pulsar's layout).

Ledgers get increasing ids and a partition appends to one ledger at a time, so within a partition the order of
(ledger, entry, batch index) is the order in which messages were produced. Comparing ids of different partitions is
still a total order (ledger, entry, partition, batch index), which keeps sorting deterministic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NONE = -1
"""The partition of a non-partitioned topic, the batch index of a message that was not batched."""


_INTEGER = re.compile(r"-?[0-9]+")


class BadMessageId(ValueError):
    """A MessageId string or field that does not follow `ledgerId:entryId:partition:batchIndex`."""


@dataclass(frozen=True, order=True, slots=True)
class MessageId:
    ledger_id: int
    entry_id: int
    partition: int = NONE
    batch_index: int = NONE

    def __post_init__(self) -> None:
        for name, value, lowest in (
            ("ledgerId", self.ledger_id, 0),
            ("entryId", self.entry_id, 0),
            ("partition", self.partition, NONE),
            ("batchIndex", self.batch_index, NONE),
        ):
            if type(value) is not int:
                raise BadMessageId(f"{name} must be an integer, got {value!r}")
            if value < lowest:
                raise BadMessageId(f"{name} {value} is below {lowest}")

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.partition}:{self.batch_index}"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """The inverse of str(); a bad string raises BadMessageId naming the part that is wrong."""
        parts = text.strip().split(":")
        if len(parts) != 4:
            raise BadMessageId(
                f"message id {text!r} has {len(parts)} part(s); expected ledgerId:entryId:partition:batchIndex"
            )
        values = []
        for name, part in zip(("ledgerId", "entryId", "partition", "batchIndex"), parts, strict=True):
            if not _INTEGER.fullmatch(part):
                raise BadMessageId(f"message id {text!r}: {name} {part!r} is not an integer")
            values.append(int(part))
        try:
            return cls(*values)
        except BadMessageId as exc:
            raise BadMessageId(f"message id {text!r}: {exc}") from None
