"""How late the bookie's event loop runs a timer: the wait a request has, beyond its own work, before the loop reads
it. Other callbacks, the GIL held by the journal's or the flush's thread and the process waiting for a core all show
here and in no other figure: the add latency histogram starts when the loop has read the add."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

INTERVAL = 0.01
"""A timer every 10 ms: 100 wakeups a second cost the loop about 0.1% of a core, and a stall of a few ms is seen."""


class LoopLagProbe:
    """Sleeps INTERVAL over and over and hands how late each wake was (seconds) to `observe`."""

    def __init__(self, observe: Callable[[float], None]):
        self.observe = observe
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag-probe")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        clock = time.perf_counter
        while True:
            due = clock() + INTERVAL
            await asyncio.sleep(INTERVAL)
            self.observe(clock() - due)
