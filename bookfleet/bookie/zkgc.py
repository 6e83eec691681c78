"""The garbage-collection loop: ledgers whose metadata left ZooKeeper are collected from this bookie.

A ledger's metadata is created before any entry reaches a bookie, so a ledger the bookie holds but ZooKeeper lacks
was deleted. To stay safe against any ordering surprise, a ledger is only collected once this process has known it
for longer than a grace period; a failed ZooKeeper walk, or one in a namespace without this bookie's cookie, skips
the pass instead of collecting anything.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kazoo.client import KazooClient

from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore

log = logging.getLogger(__name__)


class LedgerCollector:
    def __init__(self, storage, zk: KazooClient, bookie_id: str, interval: float, grace: float):
        self.storage = storage
        self.zk = zk
        self.bookie_id = bookie_id
        self.metadata = MetadataStore(zk)
        self.interval = interval
        self.grace = grace
        self.first_seen: dict[int, float] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def collect_once(self) -> None:
        now = time.monotonic()
        held = self.storage.ledger_ids()
        for ledger_id in held:
            self.first_seen.setdefault(ledger_id, now)
        for ledger_id in set(self.first_seen) - held:
            del self.first_seen[ledger_id]
        live = set(await asyncio.to_thread(self._live_ledgers))
        too_young = {ledger_id for ledger_id, seen in self.first_seen.items() if now - seen < self.grace}
        if not held - live - too_young:
            return
        report = await self.storage.collect_garbage(live | too_young | (self.storage.ledger_ids() - held))
        log.info("garbage collection: %s", report)

    def _live_ledgers(self) -> list[int]:
        # Our own cookie proves this is the namespace the bookie belongs to: an empty or foreign one (a wrong
        # chroot, a reset ZooKeeper) must never read as "every ledger was deleted".
        if self.zk.exists(zkpaths.cookie(self.bookie_id)) is None:
            raise RuntimeError(f"ZooKeeper has no cookie for bookie {self.bookie_id}; not trusting its ledger list")
        return self.metadata.ledger_ids()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.collect_once()
            except Exception as exc:
                log.warning("garbage collection pass skipped: %s", exc)
