"""Consuming a partition from any MessageId, across ledger boundaries, in production order.

The start is inclusive by default: the message at `start` is the first one delivered. With `inclusive=False`
delivery begins after it; an exclusive start without a batch index (-1) skips its whole entry. A start that
names no stored message simply begins at the next one that exists. Reading stops at the last confirmed entry of
the open ledger (what is durable now).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.topic.messageid import NONE, MessageId
from bookfleet.topic.partition import Partition, decode_messages


async def consume(
    bookkeeper: BookKeeper,
    partition: Partition,
    start: MessageId | None = None,
    inclusive: bool = True,
    password: bytes = b"",
) -> AsyncIterator[tuple[MessageId, bytes]]:
    """(MessageId, message) of every message of `partition` from `start` (default: the beginning)."""
    ledgers, _ = await asyncio.to_thread(partition.read)
    for info in ledgers:
        if start is not None and info.ledger_id < start.ledger_id:
            continue
        if info.closed and info.last_entry_id < 0:
            continue
        reader = await bookkeeper.open_ledger(info.ledger_id, password)
        first = start.entry_id if start is not None and info.ledger_id == start.ledger_id else 0
        last = info.last_entry_id if info.closed else None
        if last is not None and first > last:
            continue
        if last is None and first > await reader.read_lac():
            continue
        async for entry in reader.entries(first, last):
            batched, messages = decode_messages(entry.payload)
            for index, message in enumerate(messages):
                message_id = MessageId(info.ledger_id, entry.entry_id, partition.index, index if batched else NONE)
                if _wanted(message_id, start, inclusive):
                    yield message_id, message


def _wanted(message_id: MessageId, start: MessageId | None, inclusive: bool) -> bool:
    if start is None:
        return True
    here = (message_id.ledger_id, message_id.entry_id, message_id.batch_index)
    origin = (start.ledger_id, start.entry_id, start.batch_index)
    if inclusive:
        return here >= origin
    if start.batch_index == NONE:
        return here[:2] > origin[:2]
    return here > origin
