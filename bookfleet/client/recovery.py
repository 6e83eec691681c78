"""Recovery open: take a ledger away from its (possibly dead) writer and close it at the right entry.

1. Mark the metadata IN_RECOVERY (compare-and-set), so the writer cannot change its ensemble any more.
2. Fence the last segment's bookies. A writer needs Qa acks within one write set of Qw bookies, so once at least
   Qw - Qa + 1 bookies of every write set are fenced, no new add can complete.
3. From the highest LAC the fenced bookies report, read forward: an entry readable from any replica is recovered
   (added again to its whole write set with RECOVERY_ADD); the first entry that at least Qw - Qa + 1 replicas of its
   write set do not have was never acknowledged, and recovery stops before it.
4. Close the ledger at the last recovered entry.
"""

from __future__ import annotations

import asyncio
import logging

from bookfleet import wire
from bookfleet.client.connection import BookieError, NoSuchLedgerError
from bookfleet.client.metadata import LedgerMetadata, LedgerState, MetadataStore, MetadataVersionConflict
from bookfleet.client.reader import EntryUnavailable, read_entry
from bookfleet.client.registry import BookiePool
from bookfleet.client.writeset import quorum_covered, write_set

log = logging.getLogger(__name__)


class RecoveryError(Exception):
    """Recovery could not prove where the ledger ends; nothing was closed, it can be retried."""


async def recover_ledger(
    ledger_id: int, password: bytes, store: MetadataStore, pool: BookiePool, fence_timeout: float = 10.0
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
    last, length = lac, 0
    if lac >= 0:
        length = (await read_entry(pool, digester, ledger_id, metadata, lac)).length
    quorum_missing = metadata.write_quorum - metadata.ack_quorum + 1
    while True:
        try:
            entry = await read_entry(pool, digester, ledger_id, metadata, last + 1)
        except EntryUnavailable as exc:
            if exc.missing >= quorum_missing:
                break
            raise RecoveryError(f"cannot recover ledger {ledger_id}: {exc}") from None
        await _recovery_add(ledger_id, metadata, master_key, pool, entry, digester)
        last, length = entry.entry_id, entry.length
    closed = metadata.with_closed(last, length)
    try:
        await _cas(store, ledger_id, closed, version)
    except MetadataVersionConflict:
        current, _ = await asyncio.to_thread(store.read, ledger_id)
        if current.is_closed:
            return current  # another recovery closed it first, at the same point
        raise
    log.info("ledger %d recovered and closed at entry %d (length %d)", ledger_id, last, length)
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
        except NoSuchLedgerError:
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


async def _recovery_add(
    ledger_id: int,
    metadata: LedgerMetadata,
    master_key: bytes,
    pool: BookiePool,
    entry: wire.Entry,
    digester: wire.Digester,
) -> None:
    """Write a recovered entry to its whole write set; Qa copies are enough to close, repair restores the rest."""
    encoded = wire.encode_entry(digester, ledger_id, entry.entry_id, entry.lac, entry.length, entry.payload)
    bookies = metadata.segment_for(entry.entry_id).bookies

    async def add(bookie: str) -> None:
        await (await pool.get(bookie)).add_entry(master_key, encoded, recovery=True)

    positions = write_set(entry.entry_id, metadata.ensemble_size, metadata.write_quorum)
    answers = await asyncio.gather(*(add(bookies[p]) for p in positions), return_exceptions=True)
    errors = [f"{bookies[p]}: {a}" for p, a in zip(positions, answers, strict=True) if isinstance(a, Exception)]
    if len(positions) - len(errors) < metadata.ack_quorum:
        raise RecoveryError(f"cannot recover entry {entry.entry_id} of ledger {ledger_id}: {'; '.join(errors)}")
