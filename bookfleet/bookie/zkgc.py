"""The garbage-collection loop: ledgers whose metadata left ZooKeeper, and copies no metadata names any more, are
collected from this bookie.

A ledger's metadata is created before any entry reaches a bookie, so a ledger the bookie holds but ZooKeeper lacks
was deleted. To stay safe against any ordering surprise, a ledger is only collected once this process has known it
for longer than a grace period: what the storage holds when the loop starts is known from then on (counted from the
first pass instead, a bookie restarted when its zone returned kept its stale copies a second interval), a ledger
added later from the pass that first sees it; a failed ZooKeeper walk, or one in a namespace without this bookie's
cookie, skips the pass instead of collecting anything.

A bookie that comes back after its ledgers were repaired elsewhere (a zone outage, a partition) holds copies the
metadata no longer names: over-replicated, as BookKeeper calls them. Such a copy is collected only when the ledger is
closed (recovery and ensemble changes, which write to a bookie before or without its lock, only touch open ledgers),
neither marked under-replicated nor recorded as having lost data (then a copy no metadata names may be the last one),
and while this bookie holds the ledger's repair lock, so that no repair is copying to it meanwhile.

Such a bookie usually comes back through a new ZooKeeper session: cut off for longer than the lost-bookie delay, its
session expired. The collector then runs a pass as soon as the new session is up, rather than up to an interval later
(the zone-loss scenario's stale copies went a whole --gc-interval after the return): the same pass, with every check
above and the grace, only sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState

from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import LedgerMetadata, MetadataStore
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.meta.zk import pipelined

log = logging.getLogger(__name__)


class LedgerCollector:
    def __init__(self, storage, zk: KazooClient, bookie_id: str, interval: float, grace: float,
                 clock: Callable[[], float] = time.monotonic):
        self.storage = storage
        self.zk = zk
        self.bookie_id = bookie_id
        self.metadata = MetadataStore(zk)
        self.under_replication = UnderReplication(zk)
        self.interval = interval
        self.grace = grace
        self.clock = clock
        self.first_seen: dict[int, float] = {}
        self._task: asyncio.Task | None = None
        self._rejoined = asyncio.Event()
        """Set when a new ZooKeeper session replaced an expired one: the next pass runs at once."""
        self._session_expired = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start the loop over the started storage: the grace of what it holds counts from now."""
        now = self.clock()
        self.first_seen = dict.fromkeys(self.storage.ledger_ids(), now)
        self._loop = asyncio.get_running_loop()
        self.zk.add_listener(self._on_session_state)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self.zk.remove_listener(self._on_session_state)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def collect_once(self) -> None:
        now = self.clock()
        held = self.storage.ledger_ids()
        for ledger_id in held:
            self.first_seen.setdefault(ledger_id, now)
        for ledger_id in set(self.first_seen) - held:
            del self.first_seen[ledger_id]
        live = set(await asyncio.to_thread(self._live_ledgers))
        too_young = {ledger_id for ledger_id, seen in self.first_seen.items() if now - seen < self.grace}
        over_replicated = await asyncio.to_thread(self._lock_over_replicated, (held & live) - too_young)
        try:
            if not held - live - too_young and not over_replicated:
                return
            keep = (live - over_replicated) | too_young | (self.storage.ledger_ids() - held)
            report = await self.storage.collect_garbage(keep)
        finally:
            for ledger_id in over_replicated:
                await asyncio.to_thread(self.under_replication.release, ledger_id)
        log.info("garbage collection: %s (%d over-replicated)", report, len(over_replicated))

    def _lock_over_replicated(self, candidates: set[int]) -> set[int]:
        """The candidates whose copy here may go, each with its repair lock now held by this bookie."""
        suspects = candidates - set(self.metadata.ledgers_on_bookie(self.bookie_id))
        if not suspects:
            return set()
        locked = self.under_replication.acquire_all(sorted(suspects), f"gc:{self.bookie_id}")
        unsafe = {ledger_id for ledger_id, marker in self.under_replication.read_markers(locked).items() if marker}
        losses = pipelined(sorted(locked), lambda ledger: self.zk.exists_async(zkpaths.dataloss(ledger)))
        unsafe |= {ledger_id for ledger_id, loss in losses if loss.get()}
        reads = pipelined(sorted(locked - unsafe), lambda ledger: self.zk.get_async(zkpaths.ledger(ledger)))
        over = {ledger_id for ledger_id, read in reads if self._names_no_more(read)}
        for ledger_id in locked - over:
            self.under_replication.release(ledger_id)
        return over

    def _names_no_more(self, read) -> bool:
        """Whether the ledger (read now, under its lock) is closed and names this bookie in no segment; anything
        unreadable keeps the copy."""
        try:
            metadata = LedgerMetadata.decode(read.get()[0])
        except Exception:  # deleted meanwhile (the other collection takes it next pass), or unreadable
            return False
        return metadata.is_closed and self.bookie_id not in metadata.bookies()

    def _live_ledgers(self) -> list[int]:
        # Our own cookie proves this is the namespace the bookie belongs to: an empty or foreign one (a wrong
        # chroot, a reset ZooKeeper) must never read as "every ledger was deleted".
        if self.zk.exists(zkpaths.cookie(self.bookie_id)) is None:
            raise RuntimeError(f"ZooKeeper has no cookie for bookie {self.bookie_id}; not trusting its ledger list")
        return self.metadata.ledger_ids()

    def _on_session_state(self, state: str) -> None:
        """kazoo's thread: LOST (the session expired, the bookie's registration went with it), then CONNECTED on a
        new session is a rejoin after a cut: wake the loop for a pass now."""
        if state == KazooState.LOST:
            self._session_expired = True
        elif state == KazooState.CONNECTED and self._session_expired and self._loop is not None:
            self._session_expired = False
            self._loop.call_soon_threadsafe(self._rejoined.set)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._rejoined.wait()
            if self._rejoined.is_set():
                log.info("garbage collection: rejoined ZooKeeper on a new session, collecting now")
                self._rejoined.clear()
            try:
                await self.collect_once()
            except Exception as exc:
                log.warning("garbage collection pass skipped: %s", exc)
