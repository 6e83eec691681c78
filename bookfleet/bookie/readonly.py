"""Whether the bookie takes adds: read-only while its disk is too full, while ZooKeeper forces it, and for good once
its storage failed (a journal write or sync error) or its journal lost synced records (it cannot vouch for anything
it lacks, a new ledger's entries included, so no writer should place a ledger on it).

The forced switch is the bookie's state node (meta.bookiestate), followed with a kazoo DataWatch: kazoo re-reads
it after a reconnect or a new session, so the bookie always ends up doing what the node says now.

Read-only is not the same for every reason. A full disk, a forced switch (an operator, a drain) or a journal that
lost old records leaves the storage sound, so the bookie still takes recovery adds of its own ledgers within the
disk's reserve (bookie/server.py), as BookKeeper's read-only bookies take high-priority adds: else a ledger whose
ensemble has no writable spare could never be closed. Storage that failed takes none: nothing it acknowledged could
be trusted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.recipe.watchers import DataWatch

from bookfleet.meta import bookiestate, zkpaths

log = logging.getLogger(__name__)

DISK_FULL = "its disk usage is above the threshold"


class ReadOnlyState:
    """Combines the disk monitor's verdict and the forced switch; calls `on_change(reason)` when the combined
    reason changes (None: writable). Everything but the watch callback runs on the event loop."""

    def __init__(self, zk: KazooClient, bookie_id: str, on_change: Callable[[str | None], None]):
        self.zk = zk
        self.bookie_id = bookie_id
        self.on_change = on_change
        self.disk_full = False
        self.storage_failure: str | None = None
        self.journal_damage: str | None = None
        self.forced: str | None = None
        """The switch's reason while ZooKeeper forces the bookie read-only."""
        self._loop = asyncio.get_running_loop()
        self._stopped = False

    def reason(self) -> str | None:
        reasons = [DISK_FULL] if self.disk_full else []
        if self.storage_failure is not None:
            reasons.append(f"its storage failed ({self.storage_failure})")
        if self.journal_damage is not None:
            reasons.append(f"its journal lost synced records ({self.journal_damage})")
        if self.forced is not None:
            reasons.append(f"forced read-only in ZooKeeper ({self.forced or 'no reason given'})")
        return "; ".join(reasons) or None

    def takes_recovery_adds(self) -> bool:
        """Whether recovery adds may go into the disk's reserve while the bookie is read-only (see the module)."""
        return self.storage_failure is None

    async def start(self) -> None:
        """Read the switch and watch it. Its first value is applied before this returns: the watch's first callback
        is queued on the loop before the worker thread's completion is."""
        await asyncio.to_thread(DataWatch, self.zk, zkpaths.bookie_state(self.bookie_id), self._watched)

    def stop(self) -> None:
        self._stopped = True

    def set_storage_failure(self, reason: str | None) -> None:
        if reason is not None and self.storage_failure is None:
            before, self.storage_failure = self.reason(), reason
            self._changed(before)

    def set_journal_damage(self, damage: str | None) -> None:
        before, self.journal_damage = self.reason(), damage
        self._changed(before)

    def set_disk_full(self, full: bool) -> None:
        before, self.disk_full = self.reason(), full
        self._changed(before)

    def _watched(self, data: bytes | None, _stat) -> bool:
        """kazoo's thread: hand the node's data to the loop; returning False ends the watch."""
        if self._stopped:
            return False
        self._loop.call_soon_threadsafe(self._set_forced, data)
        return True

    def _set_forced(self, data: bytes | None) -> None:
        try:
            state = bookiestate.parse(self.bookie_id, data)
        except ValueError as exc:
            log.error("%s; keeping the current state", exc)
            return
        forced = state.reason if state is not None and state.read_only else None
        if forced != self.forced:
            if forced is None:
                log.info("ZooKeeper no longer forces bookie %s read-only", self.bookie_id)
            else:
                log.warning("ZooKeeper forces bookie %s read-only: %s", self.bookie_id, forced or "no reason given")
            before, self.forced = self.reason(), forced
            self._changed(before)

    def _changed(self, before: str | None) -> None:
        if (now := self.reason()) != before:
            self.on_change(now)
