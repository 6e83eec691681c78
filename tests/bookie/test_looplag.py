"""The bookie's event-loop lag probe (`bookfleet.bookie.looplag`): a loop held up is seen in its histogram."""

from __future__ import annotations

import asyncio
import re
import time

from bookfleet.bookie.http import BookieMetrics
from bookfleet.bookie.looplag import INTERVAL, LoopLagProbe


async def test_a_callback_holding_the_loop_for_50_ms_shows_as_a_wake_over_20_ms_late():
    """The lag a request waits before the loop reads it, which the add latency histogram does not count."""
    metrics = BookieMetrics()
    probe = LoopLagProbe(metrics.observe_loop_lag)
    probe.start()
    await asyncio.sleep(0)  # the probe's first timer is set, due in INTERVAL
    time.sleep(0.05)  # a callback that holds the loop (or a thread that holds the GIL)
    await asyncio.sleep(3 * INTERVAL)
    await probe.stop()
    text = metrics.exposition().decode()

    def observed(pattern: str) -> float:
        return float(re.search(rf"^bookie_event_loop_lag_seconds_{pattern} (\S+)$", text, re.M)[1])

    assert observed('bucket{le="0.02"}') < observed("count")
    assert observed("count") >= 2  # the probe went on after the late wake
