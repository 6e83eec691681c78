"""The event loop a bookie or a benchmark's load runs on (uvloop when installed, else asyncio's own), and what keeps
it responsive.

The bookie's add path and the ledger writer pay the event loop per socket read, per write and per scheduled
callback; uvloop's (libuv, Cython) costs a fraction of the pure-Python selector loop's for each. `auto` picks uvloop
when it can be imported, so a platform without its wheels still runs, on asyncio.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("auto", "uvloop", "asyncio")


class EventLoopUnavailable(RuntimeError):
    """`uvloop` was asked for and cannot be imported here."""


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the chosen loop (None: asyncio's default)."""
    if choice not in CHOICES:
        raise ValueError(f"event loop {choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise EventLoopUnavailable("--event-loop uvloop: uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def name(choice: str = "auto") -> str:
    """What `choice` runs on here: uvloop or asyncio."""
    return "asyncio" if loop_factory(choice) is None else "uvloop"


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """`asyncio.run(main)` on the chosen loop."""
    try:
        factory = loop_factory(choice)
    except (ValueError, EventLoopUnavailable):
        main.close()  # never started: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def freeze_start_up_heap() -> None:
    """Keep what start-up built (modules, tables, caches: it lives as long as the process) out of the garbage
    collector's full passes. Every add allocates, so under load a full pass comes about once a second, and over the
    whole start-up heap it held the loop 20-90 ms each time (measured: the half-load p99 of `bench client`). Only the
    passes skip the frozen objects; reference counting still frees them. For a process's start-up, once."""
    gc.collect()
    gc.freeze()
