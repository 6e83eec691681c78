"""Recovery open: take a ledger away from its (possibly dead) writer and close it at the right entry.

1. Mark the metadata IN_RECOVERY (compare-and-set), so the writer cannot change its ensemble any more.
2. Fence the last segment's bookies until the fenced ones cover every write set: a writer needs Qa acks within one
   write set of Qw bookies, so once at least Qw - Qa + 1 bookies of every write set are fenced, no new add can
   complete. Bookies still silent then are not waited for (BookKeeper's rule).
3. From the highest LAC carried by a digest-verified entry of a fenced bookie (never a bare LAC number), read
   forward: an entry readable from any replica is recovered (added again to its whole write set with RECOVERY_ADD);
   the first entry that at least Qw - Qa + 1 replicas of its write set do not have was never acknowledged, and
   recovery stops before it. Only "no such entry" counts: a replica that times out, refuses the connection or fails
   the digest check may hold the entry, so then recovery fails and the ledger stays IN_RECOVERY for a retry. Every
   recovery read carries the fence flag and master key (BookKeeper's fix after its TLA+ model): a replica's "no such
   entry" only counts because that replica is fenced when it says so; a slow bookie that missed step 2 could
   otherwise say it and then still take the old writer's add.
4. Close the ledger at the last recovered entry.

The tail is re-added by a `LedgerWriter` in recovery mode, as BookKeeper does: a write-set bookie that is dead or
fails is replaced by the writer's own ensemble change (same placement rule, new segment from the recovered LAC + 1),
so the tail ends on a full write set even when Qw == Qa. Reads keep using the ensemble the old writer wrote to. Those
new segments stay in the recovery writer until the close stores them with lastEntryId in one compare-and-set
(BookKeeper's newEnsemblesFromRecovery): while a ledger is IN_RECOVERY its segments are the old writer's only, so a
retried recovery's floor (the last segment's first entry - 1) and its tail reads reach the bookies holding the old
writer's copies, never a segment that only a failed recovery wrote to.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from bookfleet import wire
from bookfleet.client.connection import BookieClient, BookieError, NoSuchLedgerOnBookieError
from bookfleet.client.errors import LedgerClosedError, LedgerWriteError
from bookfleet.client.pool import BookiePool
from bookfleet.client.reader import READ_TIMEOUT, EntryUnavailable, read_entry
from bookfleet.client.writer import LedgerWriter, WriterSettings
from bookfleet.client.writeset import quorum_covered
from bookfleet.meta.metadata import LedgerMetadata, LedgerState, MetadataStore, MetadataVersionConflict

log = logging.getLogger(__name__)


class RecoveryError(Exception):
    """Recovery could not prove where the ledger ends; nothing was closed, it can be retried."""


async def recover_ledger(
    ledger_id: int,
    password: bytes,
    store: MetadataStore,
    pool: BookiePool,
    fence_timeout: float = 10.0,
    settings: WriterSettings | None = None,
) -> LedgerMetadata:
    """Fence, recover the tail and close the ledger; returns the closed metadata (as is, if already closed)."""
    while True:  # a writer's ensemble change may race with marking the ledger IN_RECOVERY
        metadata, version = await asyncio.to_thread(store.read, ledger_id)
        if metadata.state != LedgerState.OPEN:
            break
        try:
            version = await _cas(store, ledger_id, metadata.with_state(LedgerState.IN_RECOVERY), version)
        except MetadataVersionConflict:
            continue
        metadata = metadata.with_state(LedgerState.IN_RECOVERY)
        break
    if metadata.is_closed:
        return metadata
    master_key = wire.master_key(password)
    digester = wire.Digester(metadata.digest_type, password)
    # Entries before the last segment were confirmed when the writer opened that segment (at its LAC + 1).
    fenced_lac = await _fence(ledger_id, metadata, master_key, digester, pool, fence_timeout)
    lac = max(fenced_lac, metadata.segments[-1].first_entry_id - 1)
    # one memory of silent replicas for every read: a bookie that lets one time out is asked last by the rest
    read = functools.partial(read_entry, pool, digester, ledger_id, metadata, fence_key=master_key, silent={})
    length = 0
    if lac >= 0:
        length = (await read(lac)).length
    settings = settings or WriterSettings()
    writer = LedgerWriter(ledger_id, metadata, version, password, store, pool, settings, lac, length, recovery=True)
    quorum_missing = metadata.write_quorum - metadata.ack_quorum + 1
    try:
        while True:
            entry_id = writer.last_add_confirmed + 1
            try:
                entry = await read(entry_id)
            except EntryUnavailable as exc:
                if exc.missing >= quorum_missing:
                    break
                raise RecoveryError(f"cannot recover ledger {ledger_id}: {exc}") from None
            if entry_id == lac + 1:
                await writer.start()  # only a ledger with a tail to re-add replaces unreachable bookies
            await writer.recovery_add(entry)
        closed = await writer.close()
    except LedgerClosedError:
        current, _ = await asyncio.to_thread(store.read, ledger_id)
        if current.is_closed:
            return current  # another recovery closed it first, at the same point
        raise
    except LedgerWriteError as exc:
        raise RecoveryError(f"cannot recover ledger {ledger_id}: {exc}") from None
    finally:
        await writer.detach()
    log.info("ledger %d recovered and closed at entry %d (length %d)", ledger_id, closed.last_entry_id, closed.length)
    return closed


async def _cas(store: MetadataStore, ledger_id: int, metadata: LedgerMetadata, version: int) -> int:
    return await asyncio.to_thread(store.update, ledger_id, metadata, version)


async def _fence(
    ledger_id: int,
    metadata: LedgerMetadata,
    master_key: bytes,
    digester: wire.Digester,
    pool: BookiePool,
    timeout: float,
) -> int:
    """Fence the last segment's bookies until the fenced ones cover every write set; returns the highest LAC that a
    fenced bookie's last entry carries, digest-verified."""
    bookies = metadata.segments[-1].bookies

    async def fence(bookie: str) -> int:
        client = await pool.get(bookie)
        try:
            _, last = await client.read_lac_and_last(ledger_id, fence=True, master_key=master_key)
        except NoSuchLedgerOnBookieError:
            return wire.INVALID_ENTRY_ID  # fenced, nothing written there
        return await _verified_lac(client, digester, ledger_id, last, master_key)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    positions = {asyncio.ensure_future(fence(bookie)): position for position, bookie in enumerate(bookies)}
    pending = set(positions)
    answered: set[int] = set()
    lacs: list[int] = []
    failures: list[str] = []
    covered = False
    try:
        while pending and not covered and (left := deadline - loop.time()) > 0:
            done, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                position = positions[task]
                if isinstance(error := task.exception(), BookieError | ConnectionError):
                    failures.append(f"{bookies[position]}: {error}")
                elif error is not None:
                    raise error
                else:
                    answered.add(position)
                    lacs.append(task.result())
            covered = quorum_covered(answered, metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum)
    finally:
        for task in pending:
            task.cancel()
    if not covered:
        failures += [f"{bookies[positions[task]]}: no answer within {timeout:.0f}s" for task in pending]
        raise RecoveryError(
            f"cannot fence ledger {ledger_id}: too few bookies of every write set answered ({'; '.join(failures)})"
        )
    return max(lacs)


async def _verified_lac(
    client: BookieClient, digester: wire.Digester, ledger_id: int, last: int, master_key: bytes
) -> int:
    """The LAC written into a fenced bookie's last entry by the writer, once its digest checks; a bookie whose last
    entry cannot be read or verified contributes nothing (recovery then starts lower, which is always safe)."""
    if last < 0:
        return wire.INVALID_ENTRY_ID
    try:
        async with asyncio.timeout(READ_TIMEOUT):
            answer = await client.read_entry(ledger_id, last, master_key)
        entry = wire.decode_entry(digester, answer)
    except (BookieError, ConnectionError, wire.ProtocolError, TimeoutError) as exc:
        log.warning(
            "ledger %d: last entry %d on bookie %s not usable for the LAC: %s", ledger_id, last, client.address, exc
        )
        return wire.INVALID_ENTRY_ID
    if (entry.ledger_id, entry.entry_id) != (ledger_id, last) or entry.lac >= last:
        log.warning("ledger %d: bookie %s answered entry %d for %d", ledger_id, client.address, entry.entry_id, last)
        return wire.INVALID_ENTRY_ID
    return entry.lac
