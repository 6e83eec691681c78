"""Waiting for a condition by polling: the one loop the demo, the benchmarks and the tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call `condition` every `interval` seconds until it returns something truthy, and return that; after
    `timeout` seconds raise TimeoutError naming `what` was awaited."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
    return result
