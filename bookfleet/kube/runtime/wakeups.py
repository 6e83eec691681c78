"""Reconcile loops that wake up: a watch event on something an object depends on (a Bookie's pod) cuts its loop's
wait short, so the next pass runs at once instead of at the next interval; a pass may also ask for the next one
sooner (when a delay it waits out ends)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Protocol


class ClusterPools:
    """A bounded thread pool per BookieCluster, where its loops' passes run: a pass blocked on its cluster's
    ZooKeeper or API calls takes a thread of that cluster's pool only (on asyncio's one default pool, six threads on
    two cores, six passes blocked on one cluster's ZooKeeper stopped every other cluster's passes)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pools: dict[tuple[str, str], ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def of(self, namespace: str, cluster: str) -> ThreadPoolExecutor:
        with self._lock:
            if (namespace, cluster) not in self._pools:
                self._pools[namespace, cluster] = ThreadPoolExecutor(
                    self.threads, thread_name_prefix=f"passes-{namespace}/{cluster}")
            return self._pools[namespace, cluster]

    def release(self, namespace: str, cluster: str) -> None:
        """The cluster's loop ended (its cluster deleted, or this replica no longer acting): its pool's threads go
        once their passes finish, so deleted clusters leave no idle threads; a loop still running gets a new pool at
        its next pass."""
        with self._lock:
            pool = self._pools.pop((namespace, cluster), None)
        if pool is not None:
            pool.shutdown(wait=False)

    def shutdown(self) -> None:
        """Let every pool's threads go (passes in flight finish on their own)."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False)


class Wakeups:
    """One asyncio.Event per key, made by the loop that waits on it and dropped when that loop ends; and each key's
    pass in flight, which may outlive a loop stopped during it."""

    def __init__(self) -> None:
        self._events: dict[Hashable, asyncio.Event] = {}
        self._owners: dict[Hashable, str | None] = {}
        """The uid of the object each registered loop runs for."""
        self._gone: set[Hashable] = set()
        self._generations: dict[Hashable, int | None] = {}
        self._passes: dict[Hashable, asyncio.Future] = {}

    @contextlib.contextmanager
    def registered(self, key: Hashable, uid: str | None = None) -> Iterator[asyncio.Event]:
        event = self._events[key] = asyncio.Event()
        self._owners[key] = uid
        self._gone.discard(key)
        try:
            yield event
        finally:
            if self._events.get(key) is event:
                del self._events[key], self._owners[key]
                self._gone.discard(key)

    def gone(self, key: Hashable, uid: str | None) -> None:
        """The object `key` with this uid was deleted: its loop ends (kopf stops it only through a finalizer, and
        the loops hold none: kube.handlers); a newer object's loop under the same name goes on."""
        if key in self._events and self._owners[key] == uid:
            self._gone.add(key)
            self._events[key].set()

    def ended(self, key: Hashable) -> bool:
        return key in self._gone

    def wake_on_new_generation(self, key: Hashable, generation: int | None, deleted: bool = False) -> None:
        """Wake `key` when its object's metadata.generation (its spec) moved on since the last call; the first call
        only notes it (its loop is starting a pass anyway), and the object's own status patches never wake it."""
        if deleted:
            self._generations.pop(key, None)
        elif self._generations.setdefault(key, generation) != generation:
            self._generations[key] = generation
            self.wake(key)

    def wake(self, key: Hashable) -> None:
        """Called on the event loop (an async handler): sets the key's event, if a loop waits on it."""
        event = self._events.get(key)
        if event is not None:
            event.set()

    def start_pass(self, key: Hashable, one_pass: Callable[[], float | None], pool: Executor) -> asyncio.Future:
        """Run `one_pass` in a thread of `pool`, noted as `key`'s pass in flight until it ends."""
        running = self._passes[key] = asyncio.get_running_loop().run_in_executor(pool, one_pass)
        running.add_done_callback(lambda done: self._passes.pop(key) if self._passes.get(key) is done else None)
        return running

    async def pass_ended(self, key: Hashable) -> None:
        """Return once `key` has no pass in flight (one left by a loop stopped during it), so that one object never
        has two passes at once."""
        if (running := self._passes.get(key)) is not None:
            await asyncio.wait([running])

    async def passes_ended(self, timeout: float) -> None:
        """Wait, at most `timeout` seconds, for every pass in flight (before the operator closes what they use)."""
        if self._passes:
            await asyncio.wait(list(self._passes.values()), timeout=timeout)


async def first_of(*waits: Awaitable[object], timeout: float | None) -> None:
    """Return when any of `waits` completes or `timeout` seconds pass (None: no limit), and cancel the others."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


class Stopped(Protocol):
    """kopf's DaemonStopped, as far as a loop uses it."""

    def __bool__(self) -> bool: ...

    def wait(self) -> Awaitable[object]: ...


async def run_loop(wakeups: Wakeups, key: Hashable, one_pass: Callable[[], float | None],
                   pool: Callable[[], Executor], stopped: Stopped, interval: float, jitter: float = 0.0,
                   uid: str | None = None) -> None:
    """Run `one_pass` in a thread of `pool()` (its cluster's, asked at each pass) until `stopped` or the object
    (`uid`) is gone: again after the seconds it returns (at most the interval; None: the interval), or as soon as
    `key` is woken. `jitter`: each interval is drawn anew from interval * [1 - jitter, 1 + jitter], so loops started
    together (a fleet's, at the operator's start) spread out at once.

    A loop told to stop during a pass ends at once and leaves the pass to finish on its own: kopf releases a deleted
    object's finalizer straight away only if its daemon ends within a few event-loop cycles, else it waits out the
    daemon's whole cancellation backoff (and a pass is often in flight then, woken by the deletion itself)."""
    with wakeups.registered(key, uid) as wake:
        await wakeups.pass_ended(key)
        while not stopped and not wakeups.ended(key):
            wake.clear()  # before the pass: a wake-up during it runs another right after
            running = wakeups.start_pass(key, one_pass, pool())
            await first_of(asyncio.shield(running), stopped.wait(), timeout=None)
            if not running.done():
                return
            due = running.result()
            wait = interval * random.uniform(1 - jitter, 1 + jitter) if jitter else interval
            await first_of(wake.wait(), stopped.wait(), timeout=wait if due is None else min(due, wait))
