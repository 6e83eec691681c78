"""Waiting by polling: for a condition (the one loop the demo, the benchmarks and the tests share), and for Ctrl-C
(or a SIGTERM or SIGHUP taken as one)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import NoReturn, TypeVar

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


def until_interrupted(tick: float = 0.5) -> NoReturn:
    """Block the main thread until a signal's handler raises (Ctrl-C: KeyboardInterrupt). The kernel hands a signal
    to any thread of the process; one that lands in a library's thread (kazoo's) does not wake a main thread
    blocked on a lock (`Event().wait()` hung for good after Ctrl-C), so the main thread wakes every `tick` seconds,
    when Python runs the handler."""
    while True:
        time.sleep(tick)


def interrupt_on_stop_signals() -> None:
    """SIGTERM (a service manager's stop) and SIGHUP (a closed terminal) raise KeyboardInterrupt in the main thread,
    as Ctrl-C does, so a command serving until interrupted takes the same clean stop for all three (left at their
    default, they end the process at once and its children are stopped only by their parent-death signal)."""
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, signal.default_int_handler)
