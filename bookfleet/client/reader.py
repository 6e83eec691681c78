"""Ledger readers: never beyond the last-add-confirmed, any replica of the write set, digest checked every time.

An entry past the LAC may exist on some bookie without being acknowledged (and recovery may still decide against
it), so a reader that is not recovering stops at the LAC: the metadata's lastEntryId once the ledger is closed, else
the highest LAC that the last segment's bookies report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from bookfleet import wire
from bookfleet.client.connection import BookieError, NoSuchEntryError, NoSuchLedgerOnBookieError
from bookfleet.client.pool import BookiePool
from bookfleet.client.writeset import quorum_covered, write_set
from bookfleet.meta.metadata import LedgerMetadata, MetadataStore

log = logging.getLogger(__name__)

READ_TIMEOUT = 5.0
"""How long a replica may stay silent before a read fails over to the next one (a reader's `timeout`)."""
SILENT_FOR = 60.0
"""How long a replica that let a read time out is asked last by the same reader (BookKeeper keeps its bookie failure
history as long): a silent bookie then costs a reader one read timeout, not one for every entry it is first for."""
READ_BATCH = 256
"""Entries read concurrently by `entries()`: enough to pipeline, little enough to bound memory."""


class LedgerReadError(Exception):
    """A read that cannot be served; the message names the ledger, the entry and why."""


class EntryUnavailable(LedgerReadError):
    def __init__(self, ledger_id: int, entry_id: int, reasons: dict[str, str], missing: int = 0):
        detail = "; ".join(f"{bookie}: {reason}" for bookie, reason in reasons.items()) or "no replica to ask"
        super().__init__(f"entry {entry_id} of ledger {ledger_id} could not be read ({detail})")
        self.entry_id = entry_id
        self.missing = missing
        """How many replicas answered that they do not have it (recovery's proof that it was never acked)."""


class LedgerReader:
    """Reads one ledger. Create through `BookKeeper.open_ledger`."""

    def __init__(
        self, ledger_id: int, metadata: LedgerMetadata, password: bytes, store: MetadataStore, pool: BookiePool
    ):
        self.ledger_id = ledger_id
        self.metadata = metadata
        self._store = store
        self._pool = pool
        self._digester = wire.Digester(metadata.digest_type, password)
        self._master_key = wire.master_key(password)
        self.last_add_confirmed = metadata.last_entry_id if metadata.is_closed else wire.INVALID_ENTRY_ID
        self.timeout = READ_TIMEOUT
        self._silent: dict[str, float] = {}
        """Replicas that let a read time out, asked last for a while (see `read_entry`)."""

    async def read_lac(self) -> int:
        """The LAC now: lastEntryId of a closed ledger, else the highest one the last segment's bookies know."""
        if not self.metadata.is_closed:
            await self.refresh()
        if not self.metadata.is_closed:
            self.last_add_confirmed = max(self.last_add_confirmed, (await self.bookie_view())[0])
        else:
            self.last_add_confirmed = self.metadata.last_entry_id
        return self.last_add_confirmed

    async def bookie_view(self) -> tuple[int, int]:
        """(highest LAC, highest last entry id) of the last segment's bookies, once their answers cover every
        write quorum (or, when some stay silent for `timeout`, of those that answered)."""
        metadata = self.metadata
        bookies = metadata.segments[-1].bookies
        asks = [asyncio.ensure_future(self._bookie_view(position, bookie)) for position, bookie in enumerate(bookies)]
        answered: dict[int, tuple[int, int]] = {}
        errors: list[str] = []
        try:
            for finished in asyncio.as_completed(asks, timeout=self.timeout):
                try:
                    position, view = await finished
                except (BookieError, ConnectionError) as exc:
                    errors.append(str(exc))
                    continue
                answered[position] = view
                if quorum_covered(set(answered), len(bookies), metadata.write_quorum, metadata.ack_quorum):
                    break
        except TimeoutError:
            pass
        finally:
            for ask in asks:
                ask.cancel()
        if not answered:
            raise LedgerReadError(f"no bookie of ledger {self.ledger_id} answered for its LAC ({'; '.join(errors)})")
        return max(lac for lac, _ in answered.values()), max(last for _, last in answered.values())

    async def _bookie_view(self, position: int, bookie: str) -> tuple[int, tuple[int, int]]:
        client = await self._pool.get(bookie)
        try:
            view = await client.read_lac_and_last(self.ledger_id)
        except NoSuchLedgerOnBookieError:
            view = (wire.INVALID_ENTRY_ID, wire.INVALID_ENTRY_ID)  # nothing written there yet
        return position, view

    async def refresh(self) -> LedgerMetadata:
        """Re-read the metadata: an open ledger gains segments as its writer replaces bookies, and gets closed."""
        self.metadata, _ = await asyncio.to_thread(self._store.read, self.ledger_id)
        return self.metadata

    async def read(self, entry_id: int) -> wire.Entry:
        """One confirmed entry (entry_id <= LAC; the LAC is fetched again when entry_id is beyond the known one)."""
        if entry_id < 0:
            raise LedgerReadError(f"entry id {entry_id} of ledger {self.ledger_id} is negative")
        if entry_id > self.last_add_confirmed and entry_id > await self.read_lac():
            raise LedgerReadError(
                f"entry {entry_id} of ledger {self.ledger_id} is beyond its last confirmed entry "
                f"{self.last_add_confirmed}"
            )
        try:
            return await self._read_entry(entry_id)
        except EntryUnavailable:
            if self.metadata.is_closed:
                raise
            await self.refresh()  # a newer segment may hold it
            return await self._read_entry(entry_id)

    async def _read_entry(self, entry_id: int) -> wire.Entry:
        return await read_entry(
            self._pool, self._digester, self.ledger_id, self.metadata, entry_id, self.timeout, silent=self._silent
        )

    async def entries(self, first: int = 0, last: int | None = None) -> AsyncIterator[wire.Entry]:
        """Entries first..last in order (last defaults to the LAC; beyond it is an error)."""
        lac = await self.read_lac()
        last = lac if last is None else last
        if first < 0 or last < first - 1:
            raise LedgerReadError(f"bad range {first}..{last} for ledger {self.ledger_id}")
        if last > lac:
            raise LedgerReadError(f"entry {last} of ledger {self.ledger_id} is beyond its last confirmed entry {lac}")
        for start in range(first, last + 1, READ_BATCH):
            batch = range(start, min(last, start + READ_BATCH - 1) + 1)
            for entry in await asyncio.gather(*(self.read(e) for e in batch)):
                yield entry

    async def tail(self, first: int = 0, poll_timeout: float = 1.0) -> AsyncIterator[wire.Entry]:
        """Every entry from `first` on as it becomes confirmed, waiting with the READ_LAC long poll; ends after
        lastEntryId once the ledger is closed."""
        next_id = first
        while True:
            while next_id <= self.last_add_confirmed:
                yield await self.read(next_id)
                next_id += 1
            if self.metadata.is_closed:
                return
            await self._wait_for_lac(poll_timeout)

    async def _wait_for_lac(self, poll_timeout: float) -> None:
        """Long-poll the last segment's bookies for a LAC past the known one. A poll gets `poll_timeout` plus the
        read timeout to answer, and unmoved answers that cover every write quorum are enough (`bookie_view`'s rule):
        a silent bookie (stopped, a stalled VM: connected, answering nothing) holds up no loop of `tail`."""
        metadata = self.metadata
        previous = self.last_add_confirmed
        bookies = metadata.segments[-1].bookies
        polls = [
            asyncio.ensure_future(self._poll(position, bookie, previous, poll_timeout))
            for position, bookie in enumerate(bookies)
        ]
        answered: set[int] = set()
        try:
            for finished in asyncio.as_completed(polls, timeout=poll_timeout + self.timeout):
                position, lac = await finished
                if lac is None:
                    continue
                if lac > previous:
                    self.last_add_confirmed = lac
                    return
                answered.add(position)
                if quorum_covered(answered, len(bookies), metadata.write_quorum, metadata.ack_quorum):
                    break
        except TimeoutError:
            pass
        finally:
            for poll in polls:
                poll.cancel()
        await self.read_lac()  # nothing moved: the writer may have changed ensemble or closed the ledger

    async def _poll(self, position: int, bookie: str, previous: int, timeout: float) -> tuple[int, int | None]:
        """(position, the bookie's LAC once past `previous` or `timeout` is over; None if it failed)."""
        try:
            return position, await (await self._pool.get(bookie)).read_lac(self.ledger_id, previous, timeout)
        except (BookieError, ConnectionError):
            return position, None


async def read_entry(
    pool: BookiePool,
    digester: wire.Digester,
    ledger_id: int,
    metadata: LedgerMetadata,
    entry_id: int,
    timeout: float = READ_TIMEOUT,
    fence_key: bytes | None = None,
    silent: dict[str, float] | None = None,
) -> wire.Entry:
    """Entry `entry_id` from the first replica of its write set that has it intact; recovery shares this and
    passes `fence_key`, so every replica it asks is fenced before it answers (see `BookieClient.read_entry`).

    `silent` (bookie -> until when, in time.monotonic()) is the caller's memory of replicas that let a read time
    out: they are asked last, and one that does it again is added."""
    bookies = metadata.segment_for(entry_id).bookies
    reasons: dict[str, str] = {}
    missing = 0
    positions = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
    if silent:
        now = time.monotonic()
        positions.sort(key=lambda position: silent.get(bookies[position], 0.0) > now)
    for position in positions:
        bookie = bookies[position]
        try:
            client = await pool.get(bookie)
            async with asyncio.timeout(timeout):
                answer = await client.read_entry(ledger_id, entry_id, fence_key)
            entry = wire.decode_entry(digester, answer)
        except (NoSuchEntryError, NoSuchLedgerOnBookieError) as exc:
            missing += 1
            reasons[bookie] = exc.message
            continue
        except TimeoutError:
            reasons[bookie] = f"no answer within {timeout:g}s"
            if silent is not None:
                silent[bookie] = time.monotonic() + SILENT_FOR
            continue
        except (BookieError, ConnectionError, wire.ProtocolError) as exc:
            reasons[bookie] = str(exc)
            continue
        if (entry.ledger_id, entry.entry_id) != (ledger_id, entry_id):
            reasons[bookie] = f"answered with ledger {entry.ledger_id} entry {entry.entry_id}"
            continue
        return entry
    raise EntryUnavailable(ledger_id, entry_id, reasons, missing)
