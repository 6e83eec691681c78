"""Copying fragments to their replacement bookies: plain asyncio Python that runs inside one Spark task.

Each entry is read from a surviving replica (digest verified, failing over to the next replica) and written with
RECOVERY_ADD to every replacement that must hold it. There is no read-back: a bookie answers an add only after the
entry is fdatasynced, and the bytes it stored are the ones whose digest was just verified (any later reader checks
that digest again), so a successful answer already proves a durable, intact copy. Reads are READ_RANGE batches and
writes are pipelined on one connection per bookie, with many chunks in flight.

An entry that every surviving replica definitively lacks (no such entry or ledger, or a corrupt copy) is lost and
reported, never retried; an entry that could not be read because a bookie was unreachable is a failure, which the
next run retries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from bookfleet import wire
from bookfleet.client.connection import BookieClient, BookieError, NoSuchEntryError, NoSuchLedgerOnBookieError
from bookfleet.client.pool import BookiePool
from bookfleet.replication.planner import FragmentPlan

CHUNK_BYTES = 256 * 1024
"""About this much data per read/write round of one fragment."""
MAX_CHUNK_ENTRIES = 512
CHUNKS_IN_FLIGHT = 32
"""Chunks copied concurrently by one task: enough to keep the bookies' group commit full."""
READ_BATCH_BYTES = 2 * 1024 * 1024
CHUNK_TIMEOUT = 120.0
"""A bookie that stops answering (hung, not dead) fails the chunk instead of hanging the task forever."""


@dataclass(frozen=True, slots=True)
class RepairSettings:
    """What every task needs besides its fragments; picklable, shipped once per Spark job."""

    addresses: dict[str, str]
    """bookie id -> HOST:PORT, for the survivors and the replacements."""
    password: bytes = b""
    """The recovery password (BookKeeper's bookieRecoveryPasswd): digests and the master key come from it."""
    throttle_bytes_per_s: float | None = None
    """Bytes written per second by this task (the driver splits the job's budget across tasks)."""


@dataclass(slots=True)
class FragmentResult:
    """What one fragment's copy achieved; `error` set means retry later, `lost` means give those entries up."""

    ledger_id: int
    segment_index: int
    entries: int = 0
    bytes: int = 0
    lost: list[int] = field(default_factory=list)
    error: str | None = None


class TokenBucket:
    """Bytes per second shared by every fragment of a task; bursts up to one second's worth."""

    def __init__(self, rate: float | None):
        self.rate = rate
        self.tokens = rate or 0.0
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self, amount: int) -> None:
        if not self.rate:
            return
        async with self.lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= min(amount, self.rate):
                    self.tokens -= amount
                    return
                await asyncio.sleep((min(amount, self.rate) - self.tokens) / self.rate)


async def read_present(client: BookieClient, ledger_id: int, first: int, last: int) -> list[bytes]:
    """Every entry of [first, last] the bookie holds, in as many READ_RANGE calls as the size limit needs."""
    entries: list[bytes] = []
    while first <= last:
        batch = await client.read_range(ledger_id, first, last, READ_BATCH_BYTES)
        if not batch:
            break
        entries += batch
        first = wire.entry_ids(batch[-1])[1] + 1
    return entries


DEFINITIVE = (NoSuchEntryError, NoSuchLedgerOnBookieError)
"""Answers that prove a replica does not hold an entry (as opposed to a bookie we could not ask)."""


class FragmentCopier:
    """Copies one fragment chunk by chunk; all chunks of all fragments of a task share connections and bucket."""

    def __init__(self, plan: FragmentPlan, connections: BookiePool, settings: RepairSettings, bucket: TokenBucket):
        self.plan = plan
        self.connections = connections
        self.bucket = bucket
        self.digester = wire.Digester(plan.digest_type, settings.password)
        self.master_key = wire.master_key(settings.password)
        self.result = FragmentResult(plan.ledger_id, plan.segment_index)
        # write sets repeat every E entries: look targets and sources up by entry_id % E
        self.targets = [plan.targets(residue) for residue in range(plan.ensemble_size)]
        self.sources = [plan.sources(residue) for residue in range(plan.ensemble_size)]

    def chunks(self) -> list[list[int]]:
        needed = self.plan.needed_entries()
        size = max(1, min(MAX_CHUNK_ENTRIES, CHUNK_BYTES // max(1, self.plan.entry_size_hint)))
        return [needed[i : i + size] for i in range(0, len(needed), size)]

    async def copy_chunk(self, entries: list[int], turn: int) -> None:
        found, unreachable = await self.read(entries, turn)
        lost = [e for e in entries if e not in found and e not in unreachable]
        self.result.lost.extend(lost)
        if unreachable:
            first = min(unreachable)
            self.result.error = f"entry {first} of ledger {self.plan.ledger_id}: {unreachable[first]}"
        try:
            await self.write(found)
        except (OSError, BookieError, wire.ProtocolError) as exc:
            self.result.error = f"ledger {self.plan.ledger_id} segment {self.plan.segment_index}: {exc}"
            return
        self.result.entries += len(found)
        size = self.plan.ensemble_size
        self.result.bytes += sum(len(raw) * len(self.targets[e % size]) for e, raw in found.items())

    async def read(self, entries: list[int], turn: int) -> tuple[dict[int, bytes], dict[int, str]]:
        """Entries read and verified from survivors; for the rest, why a survivor could not be asked."""
        found: dict[int, bytes] = {}
        unreachable: dict[int, str] = {}
        survivors, size = self.plan.survivors, self.plan.ensemble_size
        if not survivors:
            return found, unreachable  # every position of the segment is lost: nothing left to read
        order = survivors[turn % len(survivors) :] + survivors[: turn % len(survivors)]  # spread reads
        for bookie in order:
            want = [e for e in entries if e not in found and bookie in self.sources[e % size]]
            if not want:
                continue
            try:
                raw_entries = await self.read_range(bookie, want[0], want[-1])
            except DEFINITIVE:
                continue
            except (OSError, BookieError, wire.ProtocolError) as exc:
                unreachable.update((e, f"bookie {bookie}: {exc}") for e in want)
                continue
            wanted = set(want)
            for raw in raw_entries:
                try:
                    if wire.entry_ids(raw)[1] not in wanted:
                        continue  # another entry this survivor holds in the range: its digest is not needed
                    entry = wire.decode_entry(self.digester, raw)
                except wire.ProtocolError:
                    continue  # a corrupt copy counts as absent: the next survivor may have a good one
                if entry.entry_id in wanted and entry.ledger_id == self.plan.ledger_id:
                    found[entry.entry_id] = raw
                    unreachable.pop(entry.entry_id, None)
        return found, unreachable

    async def read_range(self, bookie: str, first: int, last: int) -> list[bytes]:
        return await read_present(await self.connections.get(bookie), self.plan.ledger_id, first, last)

    async def write(self, found: dict[int, bytes]) -> None:
        writes: dict[str, list[bytes]] = {}
        size = self.plan.ensemble_size
        for entry_id, raw in found.items():
            for target in self.targets[entry_id % size]:
                writes.setdefault(target, []).append(raw)
        await asyncio.gather(*(self.write_to(target, entries) for target, entries in writes.items()))

    async def write_to(self, target: str, entries: list[bytes]) -> None:
        client = await self.connections.get(target)
        await self.bucket.take(sum(map(len, entries)))
        # bare futures, no task per add: a chunk is bounded (CHUNK_BYTES), so the socket buffer stays bounded too
        await asyncio.gather(*(client.add_entry_nowait(self.master_key, raw, recovery=True) for raw in entries))


async def repair_fragments(plans: Iterable[FragmentPlan], settings: RepairSettings) -> list[FragmentResult]:
    """Copy every fragment; chunks of all fragments run concurrently up to CHUNKS_IN_FLIGHT."""
    connections = BookiePool(settings.addresses)
    bucket = TokenBucket(settings.throttle_bytes_per_s)
    slots = asyncio.Semaphore(CHUNKS_IN_FLIGHT)
    copiers = [FragmentCopier(plan, connections, settings, bucket) for plan in plans]

    async def run(copier: FragmentCopier, chunk: list[int], turn: int) -> None:
        async with slots:
            try:
                async with asyncio.timeout(CHUNK_TIMEOUT):
                    await copier.copy_chunk(chunk, turn)
            except TimeoutError:
                span = f"entries {chunk[0]}-{chunk[-1]}"
                copier.result.error = f"ledger {copier.plan.ledger_id}: {span} took over {CHUNK_TIMEOUT:.0f}s"

    try:
        await asyncio.gather(
            *(run(copier, chunk, turn) for copier in copiers for turn, chunk in enumerate(copier.chunks()))
        )
    finally:
        await connections.close()
    for copier in copiers:
        copier.result.lost.sort()
    return [copier.result for copier in copiers]


def repair_partition(plans: Iterable[FragmentPlan], settings: RepairSettings) -> list[FragmentResult]:
    """The Spark task body: one event loop for all of a partition's fragments."""
    return asyncio.run(repair_fragments(list(plans), settings))
