"""Producing to a topic: each partition appends to one open ledger, rolls over to a new one, and batches messages.

A producer that starts on a partition whose last ledger is still open (its previous producer crashed) opens that
ledger with recovery: the bookies fence it, so the old producer cannot add anything more, and it is closed at its
last recoverable entry. Every message the old producer had acknowledged is in that prefix; then writing continues
in a new ledger. A ledger joins the partition's list before its first entry is written, so an acknowledged message
is always reachable from the list.

A ledger fenced or closed under a live producer (a repair that fenced it, `bookfleet ledger close`) makes the
producer roll over, as Pulsar's does: the ledger is closed at its recovered end in the partition's list, a write
whose entry made it into that end is acknowledged there, and every later write goes again to a new ledger.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

import crc32c

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.errors import LedgerClosedError, LedgerFencedError
from bookfleet.client.writer import LedgerWriter
from bookfleet.meta.metadata import LedgerMetadata
from bookfleet.topic.messageid import MessageId
from bookfleet.topic.partition import Partition, PartitionChanged, Topic, encode_messages


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    max_entries: int = 50_000
    """Roll over to a new ledger after this many entries..."""
    max_bytes: int = 256 * 1024 * 1024
    """...or this many payload bytes..."""
    max_age: float = 4 * 3600.0
    """...or when the ledger is older than this many seconds at the next write."""
    batch_size: int = 1
    """Messages per entry; 1 writes unbatched entries (MessageId batch index -1)."""
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    password: bytes = b""

    def __post_init__(self) -> None:
        for name in ("max_entries", "max_bytes", "batch_size", "ensemble_size", "write_quorum", "ack_quorum"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_age <= 0:
            raise ValueError(f"max_age must be positive, got {self.max_age} seconds")


class PartitionProducer:
    """The single writer of one partition. Entries are appended in call order and pipelined."""

    def __init__(self, bookkeeper: BookKeeper, partition: Partition, settings: ProducerSettings):
        self.bookkeeper = bookkeeper
        self.partition = partition
        self.settings = settings
        self._writer: LedgerWriter | None = None
        self._version = -1
        self._entries = 0
        self._bytes = 0
        self._opened_at = 0.0
        self._lock = asyncio.Lock()
        self._taken: dict[int, LedgerMetadata] = {}
        """Closed metadata of the ledgers fenced or closed under this producer, by id (the last few)."""

    @property
    def ledger_id(self) -> int | None:
        """The open ledger, once started."""
        return self._writer.ledger_id if self._writer else None

    async def start(self) -> PartitionProducer:
        """Fence and close a ledger left open by a crashed producer, then open a new one."""
        ledgers, self._version = await asyncio.to_thread(self.partition.read)
        if ledgers and not ledgers[-1].closed:
            metadata = await self.bookkeeper.recover_ledger(ledgers[-1].ledger_id, self.settings.password)
            self._version = await asyncio.to_thread(
                self.partition.close, ledgers[-1].ledger_id, metadata.last_entry_id, metadata.length, self._version
            )
        await self._open()
        return self

    async def write(self, messages: list[bytes], batched: bool) -> list[MessageId]:
        """Append one entry holding `messages`; returns their MessageIds once the entry is durable (Qa acks)."""
        payload = encode_messages(messages, batched)
        async with self._lock:  # rollover must not interleave with the next append; the ack wait is outside
            self._current()
            if self._full():
                await self._close_ledger()
                await self._open()
            writer, entry_id, pending = self._append(payload)
        while True:
            try:
                entry_id = await pending
                break
            except (LedgerFencedError, LedgerClosedError) as taken:
                async with self._lock:  # taken in failure order, so messages written again keep their order
                    try:
                        closed = await self._roll_over(writer)
                    except PartitionChanged:
                        raise taken from None  # another producer owns the partition now: this one stays fenced
                    if entry_id <= closed.last_entry_id:
                        break  # recovered into the closed ledger
                    writer, entry_id, pending = self._append(payload)  # not in it: write it again in the new one
        batch_indexes = range(len(messages)) if batched else [-1]
        return [MessageId(writer.ledger_id, entry_id, self.partition.index, index) for index in batch_indexes]

    def _append(self, payload: bytes) -> tuple[LedgerWriter, int, asyncio.Future[int]]:
        """Append to the current ledger (the caller holds the lock): (writer, the entry's id, its ack)."""
        writer = self._current()
        entry_id = writer.next_entry_id
        pending = writer.append(payload)
        self._entries += 1
        self._bytes += len(payload)
        return writer, entry_id, pending

    def _current(self) -> LedgerWriter:
        if self._writer is None:
            raise RuntimeError(f"{self.partition}: producer is not started or already closed")
        return self._writer

    async def _roll_over(self, writer: LedgerWriter) -> LedgerMetadata:
        """The ledger of `writer` was fenced or closed by someone else (the caller holds the lock): close it in the
        partition's list at its recovered end and open a new one, once for every write that fails with it; returns
        its closed metadata."""
        if writer.ledger_id in self._taken:
            return self._taken[writer.ledger_id]
        metadata = await self._record_taken(writer)
        if self._writer is writer:
            await self._open()
        return metadata

    async def _record_taken(self, writer: LedgerWriter) -> LedgerMetadata:
        """Stop `writer`, recover its ledger (or read where its recovery closed it) and close it in the list."""
        await writer.detach()
        metadata = await self.bookkeeper.recover_ledger(writer.ledger_id, self.settings.password)
        self._version = await asyncio.to_thread(
            self.partition.close, writer.ledger_id, metadata.last_entry_id, metadata.length, self._version
        )
        self._taken[writer.ledger_id] = metadata
        for old in sorted(self._taken)[:-4]:
            del self._taken[old]
        return metadata

    async def close(self) -> None:
        async with self._lock:
            if self._writer is not None:
                await self._close_ledger()

    def _full(self) -> bool:
        settings = self.settings
        return (
            self._entries >= settings.max_entries
            or self._bytes >= settings.max_bytes
            or time.monotonic() - self._opened_at >= settings.max_age
        )

    async def _open(self) -> None:
        s = self.settings
        writer = await self.bookkeeper.create_ledger(
            s.ensemble_size, s.write_quorum, s.ack_quorum, password=s.password, custom={"topic": str(self.partition)}
        )
        try:
            self._version = await asyncio.to_thread(self.partition.append, writer.ledger_id, self._version)
        except BaseException:
            await writer.close()
            await asyncio.to_thread(self.bookkeeper.delete_ledger, writer.ledger_id)
            raise
        self._writer, self._entries, self._bytes, self._opened_at = writer, 0, 0, time.monotonic()

    async def _close_ledger(self) -> None:
        writer, self._writer = self._writer, None
        try:
            metadata = await writer.close()
        except (LedgerFencedError, LedgerClosedError):  # taken away at the very end: close at its recovered end
            await self._record_taken(writer)
            return
        self._version = await asyncio.to_thread(
            self.partition.close, writer.ledger_id, metadata.last_entry_id, metadata.length, self._version
        )


class Producer:
    """Produces to every partition of a topic: routes by key (stable hash) or round-robin, batches per partition.

    `send()` buffers a message and returns a future of its MessageId; a batch is written when it is full or on
    `flush()`. Use as `async with Producer(bk, "orders", partitions=4) as producer:`; `partitions` None keeps an
    existing topic's count and makes a new topic non-partitioned.
    """

    def __init__(
        self,
        bookkeeper: BookKeeper,
        topic: str,
        partitions: int | None = None,
        settings: ProducerSettings | None = None,
    ):
        self.bookkeeper = bookkeeper
        self.topic = Topic(bookkeeper.zk, topic)
        self.requested_partitions = partitions
        self.settings = settings or ProducerSettings()
        self._partitions: list[PartitionProducer] = []
        self._buffers: dict[int, list[tuple[bytes, asyncio.Future[MessageId]]]] = {}
        self._writes: set[asyncio.Task] = set()
        self._round_robin = itertools.count()

    async def start(self) -> Producer:
        await asyncio.to_thread(self.topic.create, self.requested_partitions)
        partitions = await asyncio.to_thread(self.topic.partitions)
        self._partitions = [PartitionProducer(self.bookkeeper, p, self.settings) for p in partitions]
        await asyncio.gather(*(p.start() for p in self._partitions))
        return self

    def send(self, message: bytes, key: bytes | None = None) -> asyncio.Future[MessageId]:
        """Queue a message; the future resolves to its MessageId once its entry is durable."""
        slot = self.route(key)
        future = asyncio.get_running_loop().create_future()
        buffer = self._buffers.setdefault(slot, [])
        buffer.append((message, future))
        if len(buffer) >= self.settings.batch_size:
            self._write(slot)
        return future

    def route(self, key: bytes | None) -> int:
        """The partition slot of a message: CRC32C of the key, so every process routes a key alike."""
        count = len(self._partitions)
        return (crc32c.crc32c(key) if key is not None else next(self._round_robin)) % count

    async def flush(self) -> None:
        """Write partial batches and wait until everything sent so far is durable (or failed)."""
        for slot in list(self._buffers):
            self._write(slot)
        if self._writes:
            await asyncio.wait(set(self._writes))

    async def close(self) -> None:
        try:
            await self.flush()
        finally:
            await asyncio.gather(*(p.close() for p in self._partitions))

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _write(self, slot: int) -> None:
        batch = self._buffers.pop(slot, [])
        if not batch:
            return
        task = asyncio.ensure_future(self._write_batch(self._partitions[slot], batch))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_batch(self, partition: PartitionProducer, batch: list[tuple[bytes, asyncio.Future]]) -> None:
        try:
            ids = await partition.write([m for m, _ in batch], batched=self.settings.batch_size > 1)
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), message_id in zip(batch, ids, strict=True):
            if not future.done():
                future.set_result(message_id)
