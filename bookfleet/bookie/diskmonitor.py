"""Read-only switching: above the usage threshold the bookie stops taking adds, below the low-water mark it resumes.

Usage is the filesystem usage of the ledger dir, or, with a quota, the storage's own bytes over the quota: that is
what a PVC size means on Kubernetes, and it lets tests fill a "disk" in a few kilobytes. The filesystem's free space
still caps the quota: the room is the quota or what the bookie holds plus the disk's free space, whichever is less,
so a quota above what the disk holds (a volume expansion the storage class refused, other data on the disk) turns
the bookie read-only before ENOSPC, and it turns writable again once its own bytes shrink.

Between the threshold and `recovery_limit` lies the reserve for recovery adds (BookKeeper's high-priority writes on a
read-only bookie): each check measures how many bytes of it are left, and every recovery add taken since is charged
against that at once, so a burst of them between two checks cannot pass the limit together.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

RESERVED_COPIES = 2
"""A recovery add is charged twice its size until the next check measures it: its journal record and, once the
memtable is flushed, its entry-log copy."""


class DiskMonitor:
    """Polls usage every `interval` seconds and calls `on_change(read_only, free, total)` when anything moved."""

    def __init__(
        self,
        ledger_dir: Path,
        used_bytes: Callable[[], int],
        on_change: Callable[[bool, int, int], None],
        threshold: float,
        low_water_mark: float,
        recovery_limit: float,
        quota: int | None = None,
        interval: float = 2.0,
    ):
        self.ledger_dir = ledger_dir
        self.used_bytes = used_bytes
        self.on_change = on_change
        self.threshold = threshold
        self.low_water_mark = low_water_mark
        self.recovery_limit = recovery_limit
        self.quota = quota
        self.interval = interval
        self.read_only = False
        self.free_bytes = 0
        self.total_bytes = 0
        self.reserve_left = 0
        """Bytes recovery adds may still take before usage reaches `recovery_limit` (as of the last check, less
        what they took since)."""
        self._task: asyncio.Task | None = None

    def space(self) -> tuple[int, int]:
        """(free, total) bytes as of the last check."""
        return self.free_bytes, self.total_bytes

    def check(self) -> None:
        """Measure once and switch state when a threshold is crossed; cheap enough for the event loop."""
        stat = os.statvfs(self.ledger_dir)
        free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
        if self.quota is not None:  # the room the bookie can have: its quota, or what it holds plus the disk's free
            used = self.used_bytes()
            total = min(self.quota, used + free)
            free = max(0, total - used)
        usage = 1 - free / total if total else 1.0
        self.reserve_left = max(0, int(total * self.recovery_limit) - (total - free))
        read_only = self.read_only
        if not read_only and usage > self.threshold:
            log.warning("disk usage %.1f%% above %.1f%%: turning read-only", usage * 100, self.threshold * 100)
            read_only = True
        elif read_only and usage < self.low_water_mark:
            log.info("disk usage %.1f%% below %.1f%%: writable again", usage * 100, self.low_water_mark * 100)
            read_only = False
        moved = abs(free - self.free_bytes) > total / 100
        if read_only != self.read_only or moved or total != self.total_bytes:
            self.read_only, self.free_bytes, self.total_bytes = read_only, free, total
            self.on_change(read_only, free, total)

    def take_reserve(self, entry_bytes: int) -> bool:
        """Whether a recovery add of `entry_bytes` still fits under `recovery_limit`; if so its room is taken."""
        charge = entry_bytes * RESERVED_COPIES
        if charge > self.reserve_left:
            return False
        self.reserve_left -= charge
        return True

    def start(self) -> None:
        self.check()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.check()
            except OSError as exc:
                log.error("cannot measure disk usage of %s: %s", self.ledger_dir, exc)
