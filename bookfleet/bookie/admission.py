"""Ledger admission: a bookie creates a ledger (takes its first add, fence or LAC write, which fixes its master key)
only if the ledger exists in ZooKeeper metadata, so nobody can claim a future ledger id before its real writer.

The lookup runs once per new ledger id: a ledger found is remembered (ids are never reused), one not found is asked
again next time. What is remembered is bounded (`cache_ledgers` ids of each kind, least recently used forgotten
first): a forgotten ledger is only looked up again, and one the storage holds needs no memory at all. A found ledger
costs one read; before a miss is believed, the ZooKeeper session is synced and the read repeated, so a bookie
talking to a lagging server never refuses a ledger its writer has just created. Whether a ledger is closed, which
only the replicator may still add to (see `bookfleet.security.roles`), is read after a sync: a lagging server must
not make a closed ledger look open.

A read-only bookie takes a recovery add only if the ledger's stored metadata names it in the ensemble that stores the
entry (`in_ensemble`): recovery re-adds a tail to the ensemble's own bookies and a repair fills in entries a bookie of
the segment missed, but a new home for data (a recovery writer's or a repair's replacement, stored in the metadata only
once its copies are in) must be writable. That is read after a sync too, and the entry ranges found are remembered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cachetools import LRUCache
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from bookfleet.bookie.errors import UnknownLedger
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import LedgerMetadata, MetadataError

DEFAULT_CACHE_LEDGERS = 100_000
"""Ledger ids remembered as existing, and as closed (each an LRU of this many)."""


class LedgerAdmission:
    """Checks ledger ids this bookie does not hold yet against ZooKeeper metadata."""

    def __init__(
        self,
        zk: KazooClient,
        holds: Callable[[int], bool],
        cache_ledgers: int = DEFAULT_CACHE_LEDGERS,
        bookie_id: str | None = None,
    ):
        if cache_ledgers <= 0:
            raise ValueError(f"the admission cache must hold at least one ledger, got {cache_ledgers}")
        self.zk = zk
        self.holds = holds
        """Whether storage already has the ledger (then it was admitted before, or replayed from the journal)."""
        self._existing: LRUCache[int, bool] = LRUCache(cache_ledgers)
        self._closed: LRUCache[int, bool] = LRUCache(cache_ledgers)
        self.bookie_id = bookie_id
        """This bookie's id, as segments name it (None: `in_ensemble` is never true)."""
        self._spans: LRUCache[int, tuple[tuple[int, int | None], ...]] = LRUCache(cache_ledgers)
        """Per ledger, the entry ranges (first, last or None: open-ended) of the segments that name this bookie."""
        self._lookups: dict[tuple[int, bool], asyncio.Future[LedgerMetadata | None]] = {}

    def admitted(self, ledger_id: int) -> bool:
        """True when no lookup is needed: the cheap check on every request's path."""
        return self.holds(ledger_id) or self._existing.get(ledger_id, False)

    async def admit(self, ledger_id: int) -> None:
        """Return once `ledger_id` is known to exist; raise UnknownLedger if ZooKeeper has no metadata for it."""
        if not self.admitted(ledger_id) and await self._lookup(ledger_id, sync_first=False) is None:
            raise UnknownLedger(ledger_id)

    async def closed(self, ledger_id: int) -> bool:
        """Whether the ledger's metadata says CLOSED (asked afresh until it does: closing is final)."""
        if self._closed.get(ledger_id, False):
            return True
        metadata = await self._lookup(ledger_id, sync_first=True)
        return metadata is not None and metadata.is_closed

    async def in_ensemble(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the ledger's stored metadata names this bookie in the ensemble that stores `entry_id`. Ranges are
        remembered once found: a remembered one outlived only by a later ensemble change or repair can let in a copy
        of an entry this bookie's segment once held, never make it a new home; a miss is asked again."""
        spans = self._spans.get(ledger_id, ())
        if not _covers(spans, entry_id):
            metadata = await self._lookup(ledger_id, sync_first=True)
            spans = () if metadata is None else _spans_naming(metadata, self.bookie_id)
            if spans:
                self._spans[ledger_id] = spans
        return _covers(spans, entry_id)

    def _lookup(self, ledger_id: int, sync_first: bool) -> asyncio.Future[LedgerMetadata | None]:
        """One ZooKeeper lookup per ledger id (and kind) at a time, shared by every request that waits for it."""
        key = (ledger_id, sync_first)
        pending = self._lookups.get(key)
        if pending is not None:
            return pending
        loop = asyncio.get_running_loop()
        pending = self._lookups[key] = loop.create_future()
        path = zkpaths.ledger(ledger_id)

        def finish(result: LedgerMetadata | BaseException | None) -> None:
            self._lookups.pop(key, None)
            if isinstance(result, BaseException):
                pending.set_exception(result)
                return
            if result is not None:
                self._existing[ledger_id] = True
                if result.is_closed:
                    self._closed[ledger_id] = True
            pending.set_result(result)

        def synced_read(_: object = None) -> None:
            self.zk.get_async(path).rawlink(lambda answer: loop.call_soon_threadsafe(finish, _parse(answer)))

        def first_read(answer) -> None:
            result = _parse(answer)
            if result is None:  # a miss may be a lagging server's: sync and ask once more before believing it
                self.zk.sync_async(path).rawlink(synced_read)
            else:
                loop.call_soon_threadsafe(finish, result)

        if sync_first:
            self.zk.sync_async(path).rawlink(synced_read)
        else:
            self.zk.get_async(path).rawlink(first_read)
        return pending


def _spans_naming(metadata: LedgerMetadata, bookie_id: str | None) -> tuple[tuple[int, int | None], ...]:
    return tuple(
        (fragment.first_entry_id, fragment.last_entry_id)
        for fragment in metadata.fragments()
        if bookie_id in fragment.bookies
    )


def _covers(spans: tuple[tuple[int, int | None], ...], entry_id: int) -> bool:
    return any(first <= entry_id and (last is None or entry_id <= last) for first, last in spans)


def _parse(answer) -> LedgerMetadata | BaseException | None:
    try:
        data, _ = answer.get()
    except NoNodeError:
        return None
    except Exception as exc:  # ZooKeeper unreachable: the request fails with this error, the next one asks again
        return exc
    try:
        return LedgerMetadata.decode(data)
    except MetadataError as exc:
        return exc
