"""Copying fragments to their replacement bookies: plain asyncio Python that runs inside one Spark task.

Each entry is read from a surviving replica (digest verified, failing over to the next replica) and written with
RECOVERY_ADD to every replacement that must hold it. There is no read-back: a bookie answers an add only after the
entry is fdatasynced, and the bytes it stored are the ones whose digest was just verified (any later reader checks
that digest again), so a successful answer already proves a durable, intact copy. Reads are READ_RANGE batches and
writes are pipelined on one connection per bookie, with many chunks in flight.

Survivors are asked first, at the address the driver resolved (their registration, or the last address they
registered with: an unregistered or silent bookie may still hold its disk), then the missing bookies that may be
alive (a writer's missed entries, a replica check's finding), and the bookies declared lost last, as a last chance.
Only a bookie the lost-bookie rule declared lost (the marker's `lostBookies`) counts as gone: it gets one try; any
other bookie that times out is asked again (READ_ATTEMPTS) before the task gives up on it. Whether an entry is
copied, retried or given up is `entry_verdict`: it is lost only when every replica is declared lost or answered
that it lacks the entry (or holds a corrupt copy); any replica we could not ask makes it a failure the next run
retries, and a ledger with a failure keeps its marker and its metadata (its live copies stay named).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bookfleet import bkwire, eventloop, wire
from bookfleet.client.connection import (
    BookieClient,
    BookieError,
    NoSuchEntryError,
    NoSuchLedgerOnBookieError,
    next_txn,
)
from bookfleet.replication.planner import FragmentPlan

CHUNK_BYTES = 256 * 1024
"""About this much data per read/write round of one fragment."""
MAX_CHUNK_ENTRIES = 512
CHUNKS_IN_FLIGHT = 32
"""Chunks copied concurrently by one task: enough to keep the bookies' group commit full."""
READ_BATCH_BYTES = 2 * 1024 * 1024
CHUNK_TIMEOUT = 120.0
"""A bookie that stops answering (hung, not dead) fails the chunk instead of hanging the task forever."""
READ_TIMEOUT = 10.0
"""One replica's read of one chunk."""
READ_ATTEMPTS = 3
"""Tries of a read from a bookie that may be alive before it is unreachable for the rest of the task (a declared-lost
bookie gets one)."""
RETRY_DELAY = 0.5
"""Before the second try of a read; doubled before each further one."""


class Reply(enum.Enum):
    """What asking one replica for one entry gave."""

    HAS = "has"
    """A copy whose digest verifies."""
    LACKS = "lacks"
    """The bookie answered: no such ledger or entry."""
    CORRUPT = "corrupt"
    """The bookie answered with a copy that fails its digest check."""
    UNREACHABLE = "unreachable"
    """No answer: refused, timed out, a transient error, no known address, or not asked at all."""


class Verdict(enum.Enum):
    COPY = "copy"
    RETRY = "retry"
    LOST = "lost"


def entry_verdict(replicas: Sequence[str], replies: Mapping[str, Reply], declared_lost: Collection[str]) -> Verdict:
    """The one DATA_LOSS rule: copy from any good replica; give the entry up only when every replica is declared lost
    or answered that it has no (good) copy; otherwise retry, since a silent replica may still hold it.

    `declared_lost` holds only bookies the lost-bookie rule declared lost (`FragmentPlan.declared_lost`), never
    every bookie a marker names: a bookie named for missed entries or by a replica check is usually alive."""
    answers = [replies.get(bookie, Reply.UNREACHABLE) for bookie in replicas]
    if Reply.HAS in answers:
        return Verdict.COPY
    if any(a is Reply.UNREACHABLE and b not in declared_lost for b, a in zip(replicas, answers, strict=True)):
        return Verdict.RETRY
    return Verdict.LOST


@dataclass(frozen=True, slots=True)
class RepairSettings:
    """What every task needs besides its fragments; picklable, shipped once per Spark job."""

    addresses: dict[str, str]
    """bookie id -> HOST:PORT, for the survivors and the replacements."""
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


class Connections:
    """One pipelined connection per bookie for the whole task, reopened if it broke; a bookie given up on (it timed
    out on every try, FragmentCopier.ask) is not asked again by this task (a frozen bookie would otherwise cost every
    chunk its timeouts)."""

    def __init__(self, addresses: dict[str, str]):
        self.addresses = addresses
        self.clients: dict[str, BookieClient] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.silent: dict[str, str] = {}
        """bookie id -> why it is given up on for this task."""

    async def get(self, bookie_id: str) -> BookieClient:
        if bookie_id in self.silent:
            raise ConnectionError(self.silent[bookie_id])
        client = self.clients.get(bookie_id)
        if client is not None and not client.closed:
            return client
        async with self.locks.setdefault(bookie_id, asyncio.Lock()):
            client = self.clients.get(bookie_id)
            if client is None or client.closed:
                address = self.addresses.get(bookie_id)
                if address is None:
                    raise ConnectionError(f"bookie {bookie_id} has no known address")
                client = await BookieClient.connect(address, READ_TIMEOUT, bookie_id=bookie_id)
                self.clients[bookie_id] = client
            return client

    def give_up(self, bookie_id: str, reason: str) -> None:
        self.silent.setdefault(bookie_id, reason)

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


async def read_present(client: BookieClient, ledger_id: int, first: int, last: int) -> list[bytes]:
    """Every entry of [first, last] the bookie holds, in as many READ_RANGE calls as the size limit needs; from a
    stock BookKeeper bookie, which has no READ_RANGE, one READ_ENTRY each (pipelined)."""
    if not await client.speaks_bookfleet():
        return await _read_each(client, ledger_id, range(first, last + 1))
    entries: list[bytes] = []
    while first <= last:
        batch = await client.read_range(ledger_id, first, last, READ_BATCH_BYTES)
        if not batch:
            break
        entries += batch
        first = wire.entry_ids(batch[-1])[1] + 1
    return entries


async def _read_each(client: BookieClient, ledger_id: int, entry_ids: range) -> list[bytes]:
    """The entries of `entry_ids` the bookie holds, in order; any error but "no such entry" propagates."""
    answers = await asyncio.gather(
        *(client.read_entry(ledger_id, entry_id) for entry_id in entry_ids), return_exceptions=True
    )
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(answer, NoSuchEntryError):
            raise answer
    return [answer for answer in answers if not isinstance(answer, BaseException)]


DEFINITIVE = (NoSuchEntryError, NoSuchLedgerOnBookieError)
"""Answers that prove a replica does not hold an entry (as opposed to a bookie we could not ask)."""


class FragmentCopier:
    """Copies one fragment chunk by chunk; all chunks of all fragments of a task share connections and bucket."""

    def __init__(self, plan: FragmentPlan, connections: Connections, settings: RepairSettings, bucket: TokenBucket):
        self.plan = plan
        self.connections = connections
        self.bucket = bucket
        self.digester = wire.Digester(plan.digest_type, plan.password)
        self.add_request = bkwire.AddRequestEncoder(
            plan.ledger_id, wire.master_key(plan.password), plan.writer_epoch, recovery=True
        )
        """Copies are recovery adds, accepted on a fenced ledger; their writer epoch keeps them from replacing a copy
        that a newer writer made."""
        self.result = FragmentResult(plan.ledger_id, plan.segment_index)
        # write sets repeat every E entries: look targets and replicas up by entry_id % E
        self.targets = [plan.targets(residue) for residue in range(plan.ensemble_size)]
        self.replicas = [plan.replicas(residue) for residue in range(plan.ensemble_size)]
        self.declared_lost = plan.declared_lost
        self.named = tuple(sorted({plan.bookies[position] for position in plan.lost} - plan.declared_lost))
        """Missing bookies that may be alive (a writer's missed entries, a replica check): asked before the lost."""

    def chunks(self) -> list[list[int]]:
        needed = self.plan.needed_entries()
        size = max(1, min(MAX_CHUNK_ENTRIES, CHUNK_BYTES // max(1, self.plan.entry_size_hint)))
        return [needed[i : i + size] for i in range(0, len(needed), size)]

    async def copy_chunk(self, entries: list[int], turn: int) -> None:
        found, replies, reasons = await self.read(entries, turn)
        size = self.plan.ensemble_size
        retry = []
        for entry_id in entries:
            if entry_id in found:
                continue  # a good copy: COPY, whatever the other replicas said
            verdict = entry_verdict(self.replicas[entry_id % size], replies[entry_id], self.declared_lost)
            if verdict is Verdict.LOST:
                self.result.lost.append(entry_id)
            elif verdict is Verdict.RETRY:
                retry.append(entry_id)
        if retry:
            self.result.error = f"entry {retry[0]} of ledger {self.plan.ledger_id}: no replica answered ({reasons})"
        try:
            await self.write(found)
        except (OSError, BookieError, wire.ProtocolError) as exc:
            self.result.error = f"ledger {self.plan.ledger_id} segment {self.plan.segment_index}: {exc}"
            return
        self.result.entries += len(found)
        self.result.bytes += sum(len(raw) * len(self.targets[e % size]) for e, raw in found.items())

    async def read(
        self, entries: list[int], turn: int
    ) -> tuple[dict[int, bytes], dict[int, dict[str, Reply]], str]:
        """Entries read and verified, each entry's replies by bookie, and why the unreachable ones were.

        Survivors first (rotated by `turn` to spread reads), then the missing bookies that may be alive, then the
        declared-lost bookies for what is still missing: a bookie marked lost that answers after all is the best
        source there is."""
        found: dict[int, bytes] = {}
        replies: dict[int, dict[str, Reply]] = {entry_id: {} for entry_id in entries}
        reasons: list[str] = []
        survivors = self.plan.survivors
        rotation = turn % len(survivors) if survivors else 0
        order = survivors[rotation:] + survivors[:rotation] + self.named + tuple(sorted(self.declared_lost))
        size = self.plan.ensemble_size
        for bookie in order:
            want = [e for e in entries if e not in found and bookie in self.replicas[e % size]]
            if not want:
                continue
            try:
                raw_entries = await self.ask(bookie, want[0], want[-1])
            except DEFINITIVE:
                for entry_id in want:
                    replies[entry_id][bookie] = Reply.LACKS
                continue
            except (OSError, BookieError, wire.ProtocolError, TimeoutError) as exc:
                reasons.append(f"bookie {bookie}: {exc or f'no answer within {READ_TIMEOUT:.0f}s'}")
                continue  # not asked: UNREACHABLE by default
            wanted = set(want)
            for entry_id in want:
                replies[entry_id][bookie] = Reply.LACKS  # an entry the range left out is one the bookie lacks
            for raw in raw_entries:
                try:
                    ledger_id, entry_id = wire.entry_ids(raw)[:2]
                except wire.ProtocolError:
                    continue  # too short to name its entry: the entries it should have been stay LACKS
                if entry_id not in wanted:
                    continue  # another entry this replica holds in the range: its digest is not needed
                try:
                    wire.decode_entry(self.digester, raw)
                except wire.ProtocolError:
                    replies[entry_id][bookie] = Reply.CORRUPT  # the next replica may have a good copy
                    continue
                if ledger_id == self.plan.ledger_id:
                    found[entry_id] = raw
                    replies[entry_id][bookie] = Reply.HAS
                else:
                    replies[entry_id][bookie] = Reply.CORRUPT
        return found, replies, "; ".join(reasons) or "none asked"

    async def ask(self, bookie: str, first: int, last: int) -> list[bytes]:
        """read_range from one replica. A connection error or timeout is tried again, up to READ_ATTEMPTS times for
        a bookie that may be alive (one slow answer must not turn its copy into data loss) and once for a declared-
        lost one; then the task gives up on the bookie, so later chunks do not each wait for it."""
        attempts = 1 if bookie in self.declared_lost else READ_ATTEMPTS
        attempt = 0
        while True:
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    return await self.read_range(bookie, first, last)
            except (OSError, TimeoutError) as exc:
                attempt += 1
                if attempt >= attempts or bookie in self.connections.silent:
                    self.connections.give_up(bookie, f"{exc or f'no answer within {READ_TIMEOUT:.0f}s'}")
                    raise
            await asyncio.sleep(RETRY_DELAY * 2 ** (attempt - 1))

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
        # callback adds, one future per chunk: a chunk is bounded (CHUNK_BYTES), so the socket buffer stays bounded
        acks = ChunkAcks(len(entries))
        for raw in entries:
            txn = next_txn()
            client.add_entry_callback(self.add_request.frame(txn, raw), txn, acks.answer, None)
        await acks.done


class ChunkAcks:
    """The answers to one chunk's recovery adds to one bookie: `done` resolves at the last ack, or fails with the
    first error (the chunk is then retried by a later run; the other answers no longer matter)."""

    __slots__ = ("done", "remaining")

    def __init__(self, count: int):
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.remaining = count
        if not count:
            self.done.set_result(None)

    def answer(self, _: object, error: BaseException | None) -> None:
        if self.done.done():
            return
        if error is not None:
            self.done.set_exception(error)
            return
        self.remaining -= 1
        if not self.remaining:
            self.done.set_result(None)


async def repair_fragments(plans: Iterable[FragmentPlan], settings: RepairSettings) -> list[FragmentResult]:
    """Copy every fragment; chunks of all fragments run concurrently up to CHUNKS_IN_FLIGHT."""
    connections = Connections(settings.addresses)
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
    """The Spark task body: one event loop (uvloop when installed) for all of a partition's fragments."""
    return eventloop.run(repair_fragments(list(plans), settings))
