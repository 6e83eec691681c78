"""Recovery open: take a ledger away from its (possibly dead) writer and close it at the right entry.

1. Mark the metadata IN_RECOVERY (compare-and-set), so the writer cannot change its ensemble any more.
2. Fence the last segment's bookies. A writer needs Qa acks within one write set of Qw bookies, so once at least
   Qw - Qa + 1 bookies of every write set are fenced, no new add can complete.
3. From the highest LAC the fenced bookies report, read forward: an entry readable from any replica is recovered
   (added again to its whole write set with RECOVERY_ADD); the first entry that at least Qw - Qa + 1 replicas of its
   write set do not have was never acknowledged, and recovery stops before it.
4. Close the ledger at the last recovered entry.

The tail is re-added by a `LedgerWriter` in recovery mode, as BookKeeper does: a write-set bookie that is dead or
fails is replaced by the writer's own ensemble change (same placement rule, new segment from the recovered LAC + 1),
so the tail ends on a full write set even when Qw == Qa. Reads keep using the ensemble the old writer wrote to.
"""

from __future__ import annotations

import asyncio
import logging

from bookfleet import wire
from bookfleet.client.connection import BookieError, NoSuchLedgerOnBookieError
from bookfleet.client.pool import BookiePool
from bookfleet.client.reader import EntryUnavailable, read_entry
from bookfleet.client.writer import LedgerClosedError, LedgerWriteError, LedgerWriter, WriterSettings
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
    # Entries before the last segment were confirmed when the writer opened that segment (at its LAC + 1).
    lac = max(
        await _fence(ledger_id, metadata, master_key, pool, fence_timeout), metadata.segments[-1].first_entry_id - 1
    )
    digester = wire.Digester(metadata.digest_type, password)
    length = (await read_entry(pool, digester, ledger_id, metadata, lac)).length if lac >= 0 else 0
    settings = settings or WriterSettings()
    writer = LedgerWriter(ledger_id, metadata, version, password, store, pool, settings, lac, length, recovery=True)
    quorum_missing = metadata.write_quorum - metadata.ack_quorum + 1
    try:
        while True:
            entry_id = writer.last_add_confirmed + 1
            try:
                entry = await read_entry(pool, digester, ledger_id, metadata, entry_id)
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


async def _fence(ledger_id: int, metadata: LedgerMetadata, master_key: bytes, pool: BookiePool, timeout: float) -> int:
    """Fence every bookie of the last segment that answers; returns the highest LAC they report."""
    bookies = metadata.segments[-1].bookies

    async def fence(bookie: str) -> int:
        client = await pool.get(bookie)
        try:
            lac, _ = await client.read_lac_and_last(ledger_id, fence=True, master_key=master_key)
        except NoSuchLedgerOnBookieError:
            return wire.INVALID_ENTRY_ID  # fenced, nothing written there
        return lac

    tasks = [asyncio.ensure_future(fence(bookie)) for bookie in bookies]
    await asyncio.wait(tasks, timeout=timeout)
    answered, lacs, failures = set(), [], []
    for position, task in enumerate(tasks):
        if not task.done():
            task.cancel()
            failures.append(f"{bookies[position]}: no answer within {timeout:.0f}s")
        elif isinstance(error := task.exception(), BookieError | ConnectionError):
            failures.append(f"{bookies[position]}: {error}")
        elif error is not None:
            raise error
        else:
            answered.add(position)
            lacs.append(task.result())
    if not quorum_covered(answered, metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum):
        raise RecoveryError(
            f"cannot fence ledger {ledger_id}: too few bookies of every write set answered ({'; '.join(failures)})"
        )
    return max(lacs)
