"""What wakes a Ledger's reconciliation: changes, not timers.

A Ledger resource mirrors ZooKeeper, so its pass is needed only when something it mirrors changed:
- its own spec (the Ledger's watch event, by generation) or its first sighting (start-up);
- its metadata (a ZooKeeper watch set by every pass's read of it: `metadata_watch`);
- its under-replication marker or DATA_LOSS record (one `TreeCache` per ZooKeeper on each of those two trees);
- a repair Job or SparkApplication covering it (the repair informers' events);
- a ZooKeeper session lost (its one-shot watches went with it: every Ledger on that ZooKeeper).
Passes run only for the clusters this replica acts for (`acting`: while the cluster's loop runs here; kopf stops it
on a paused peer), so a standby never writes a Ledger; its woken Ledgers wait, parked, until it acts. A Ledger whose
cluster is not known at all is passed anyway (its status says so).
One resync per BookieCluster (every `resync` seconds, jittered ±20 %) catches anything missed at the price of a few
reads: it wakes the Ledgers whose status disagrees with the marker and DATA_LOSS trees, and those not created or not
valid yet (which wait on something no watch covers: bookies to register, a Secret, their cluster).

`LedgerFeed` holds a compact directory of the Ledgers (name, cluster, id, generation and two health bits: no bodies,
so 100,000 Ledgers cost a few tens of MB), a debounced queue (a key woken many times before its pass runs once) and
a few worker threads that run the passes, at most `rate` per second, never two of one Ledger at once; a worker
takes several due Ledgers at once and sends their metadata reads ahead together (`read_ahead`). No finalizer:
deleting a Ledger resource leaves its ledger in ZooKeeper (it is a view), so there is nothing to do before it goes;
its DELETED event drops it here.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.protocol.states import WatchedEvent
from kazoo.recipe.cache import TreeCache, TreeEvent

from bookfleet.kube.models import RepairState
from bookfleet.kube.runtime.context import ZooKeeperUnavailable
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore, PendingRead

log = logging.getLogger(__name__)
LedgerKey = tuple[str, str]
"""(namespace, name) of a Ledger resource."""
RESYNC_JITTER = 0.2


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """What the feed keeps of one Ledger (from its watch events): slotted, one of 100,000 costs no dict."""

    cluster: str
    ledger_id: int | None
    generation: int | None
    settled: bool
    """it has a state and is valid: only a change (or a resync mismatch) needs a pass"""
    under_replicated: bool
    data_loss: bool
    repair_bookie: str | None = None
    """the lost bookie of the repair its status follows, while that repair has not ended"""


def entry_of(body: dict[str, Any]) -> LedgerEntry:
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    ledger_id = status.get("ledgerId", spec.get("ledgerId"))
    repair = status.get("repair") or {}
    ongoing = repair.get("state") not in (RepairState.SUCCEEDED, RepairState.FAILED)
    return LedgerEntry(
        cluster=sys.intern(spec.get("cluster", "")), ledger_id=ledger_id, generation=body["metadata"].get("generation"),
        settled=status.get("state") not in (None, "DELETED") and conditions.get("Valid") == "True",
        under_replicated=bool(status.get("underReplicated")), data_loss=conditions.get("DataLoss") == "True",
        repair_bookie=repair.get("bookieId") if ongoing else None,
    )


class DebouncedQueue:
    """Keys to process, each at most once however often it was woken; a key is handed out `debounce` seconds after
    its first wake-up (a burst of changes to one object costs one pass), at most `rate` keys per second, and never
    to two workers at once (woken while in a pass, it is handed out again once `done`)."""

    def __init__(self, debounce: float, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.debounce, self.rate, self.clock = debounce, rate, clock
        self._due: dict[Hashable, float] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._order = itertools.count()
        self._payload: dict[Hashable, Any] = {}
        self._active: set[Hashable] = set()
        self._cond = threading.Condition()
        self._next_slot = 0.0

    def __len__(self) -> int:
        with self._cond:
            return len(self._due)

    def wake(self, key: Hashable, payload: Any = None, delay: float = 0.0) -> None:
        """Thread-safe. `payload` (a fresh body) is kept until the pass, the newest one winning; `delay`: not
        before that many seconds (a retry)."""
        with self._cond:
            if payload is not None:
                self._payload[key] = payload
            if key in self._due:
                return
            self._due[key] = self.clock() + max(self.debounce, delay)
            if key not in self._active:
                self._push(key)

    def _push(self, key: Hashable) -> None:
        heapq.heappush(self._heap, (self._due[key], next(self._order), key))
        self._cond.notify()

    def forget(self, key: Hashable) -> None:
        with self._cond:
            self._due.pop(key, None)
            self._payload.pop(key, None)

    def done(self, key: Hashable) -> None:
        """The pass of `key` ended: if it was woken meanwhile, it is due again."""
        with self._cond:
            self._active.discard(key)
            if key in self._due:
                self._push(key)

    def take(self, timeout: float) -> tuple[Hashable, Any] | None:
        """The next due key and its payload (call `done(key)` after its pass), or None after `timeout` seconds."""
        taken = self.take_many(1, timeout)
        return taken[0] if taken else None

    def take_many(self, limit: int, timeout: float) -> list[tuple[Hashable, Any]]:
        """Up to `limit` keys due now, with their payloads (call `done(key)` after each pass): one worker passes
        them together (their ZooKeeper reads in flight at once); [] after `timeout` seconds with none due."""
        deadline = self.clock() + timeout
        taken: list[tuple[Hashable, Any]] = []
        with self._cond:
            while True:
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # forgotten since it was pushed
                now = self.clock()
                if self._heap and len(taken) < limit:
                    due, _, key = self._heap[0]
                    ready = max(due, self._next_slot)
                    if ready <= now:
                        heapq.heappop(self._heap)
                        del self._due[key]
                        self._active.add(key)
                        gap = 1.0 / self.rate
                        self._next_slot = max(self._next_slot, now - 1.0 + gap) + gap  # one second of burst
                        taken.append((key, self._payload.pop(key, None)))
                        continue
                    wait = ready - now
                else:
                    wait = deadline - now
                if taken or now >= deadline:
                    return taken
                self._cond.wait(min(wait, deadline - now))


class LedgerFeed:
    """The directory, the queue, the ZooKeeper watches and the workers that run `reconcile(key, body or None)`; a
    pass is run again after the seconds it returns (it waits for something no watch reports), or after `retry`
    seconds when it fails."""

    def __init__(self, reconcile: Callable[[LedgerKey, dict | None], float | None],
                 zookeeper_of: Callable[[str, str], Hashable | None], zk: Callable[[Hashable], KazooClient],
                 resync: float, retry: float, debounce: float = 0.05, rate: float = 2000.0, workers: int = 8,
                 batch: int = 64, rng: random.Random | None = None) -> None:
        self.reconcile, self.zookeeper_of, self.zk = reconcile, zookeeper_of, zk
        self.batch = batch
        self.resync, self.retry, self.rng = resync, retry, rng or random.Random()
        self.queue = DebouncedQueue(debounce, rate)
        self._entries: dict[LedgerKey, LedgerEntry] = {}
        self._by_id: dict[int, tuple[LedgerKey, ...]] = {}
        """The Ledgers showing each ledger id: nearly always one, so a tuple (a set costs four times as much)."""
        self._per_cluster: collections.Counter[tuple[str, str]] = collections.Counter()
        """Ledgers per (namespace, cluster), kept with the directory: the resync check runs before every pass, and a
        scan of 100,000 entries there took a fifth of the operator's CPU while they were first reconciled."""
        self._lock = threading.Lock()
        self._caches: dict[Hashable, tuple[TreeCache, TreeCache]] = {}
        self._initialized: dict[Hashable, tuple[threading.Event, threading.Event]] = {}
        self._resync_due: dict[tuple[str, str], float] = {}
        self._acting: collections.Counter[tuple[str, str]] = collections.Counter()
        self._parked: dict[tuple[str, str], set[LedgerKey]] = {}
        self._stop = threading.Event()
        self._local = threading.local()
        self._threads = [threading.Thread(target=self._run, args=(index == 0,), name=f"ledger-feed-{index}",
                                          daemon=True) for index in range(workers)]

    # --- the directory, from the Ledgers' watch events ----------------------------------------------------------

    def ledger_changed(self, body: dict[str, Any], deleted: bool = False) -> None:
        """A Ledger's watch event: woken (with this body, so its pass needs no GET) when it is new or its spec
        changed; its own status patches only refresh the directory."""
        key = (sys.intern(body["metadata"]["namespace"]), body["metadata"]["name"])
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._per_cluster[key[0], old.cluster] -= 1
                if old.ledger_id is not None:
                    if others := tuple(k for k in self._by_id.get(old.ledger_id, ()) if k != key):
                        self._by_id[old.ledger_id] = others
                    else:
                        self._by_id.pop(old.ledger_id, None)
            if deleted:
                self.queue.forget(key)
                return
            new = self._entries[key] = entry_of(body)
            self._per_cluster[key[0], new.cluster] += 1
            if new.ledger_id is not None:
                self._by_id[new.ledger_id] = (*self._by_id.get(new.ledger_id, ()), key)
        if old is None or (old.generation, old.ledger_id) != (new.generation, new.ledger_id):
            self.queue.wake(key, packed(body))  # new, a new spec, or an id just reserved (its first watch then)

    def wake_ledger_id(self, ledger_id: int) -> None:
        """Every Ledger showing this ledger id (on any cluster: a spare pass is harmless)."""
        with self._lock:
            keys = list(self._by_id.get(ledger_id, ()))
        for key in keys:
            self.queue.wake(key)

    def wake_repair(self, namespace: str, cluster: str, bookie: str) -> None:
        """A repair Job of a lost bookie changed: it covers ledgers the markers name (under-replicated ones) and those
        whose status follows it. Jobs change seldom (one per lost bookie), so the whole cluster's share is woken."""
        for key, entry in self.ledgers_of(namespace, cluster).items():
            if entry.under_replicated or entry.repair_bookie == bookie:
                self.queue.wake(key)

    def ledgers_of(self, namespace: str, cluster: str) -> dict[LedgerKey, LedgerEntry]:
        with self._lock:
            return {key: e for key, e in self._entries.items() if key[0] == namespace and e.cluster == cluster}

    # --- ZooKeeper ------------------------------------------------------------------------------------------------

    def metadata_watch(self, ledger_id: int) -> MetadataWatch:
        """The one-shot watch each pass sets on the ledger's metadata: a close, an ensemble change, a repair's
        replacement or a deletion wakes the Ledgers showing it."""
        return MetadataWatch(self, ledger_id)

    def watch_zookeeper(self, connect: Hashable) -> None:
        """The marker and DATA_LOSS trees of a cluster's ZooKeeper, watched once per ZooKeeper as the operator
        reaches it (`zookeeper_of`'s answer: connect string and credential). The session is taken outside the lock
        (`zk` raises at once while that ZooKeeper has none, and the next pass asks again), so one cluster's ZooKeeper
        never holds up another's Ledgers."""
        with self._lock:
            if connect in self._caches:
                return
        zk = self.zk(connect)
        with self._lock:
            if connect in self._caches:
                return
            caches = self._caches[connect] = (TreeCache(zk, zkpaths.UR_LEDGERS), TreeCache(zk, zkpaths.UR_DATALOSS))
            initialized = self._initialized[connect] = (threading.Event(), threading.Event())
        for cache, id_of, ready in zip(caches, (zkpaths.ledger_id_from_marker, zkpaths.ledger_id_from_dataloss),
                                       initialized, strict=True):
            cache.listen(self._tree_listener(id_of, ready))
            cache.start()
        zk.add_listener(lambda state: self._session_changed(connect, state))

    def _tree_listener(self, id_of: Callable[[str], int], ready: threading.Event) -> Callable[[TreeEvent], None]:
        def changed(event: TreeEvent) -> None:
            if event.event_type == TreeEvent.INITIALIZED:
                ready.set()
            elif event.event_type in (TreeEvent.NODE_ADDED, TreeEvent.NODE_UPDATED, TreeEvent.NODE_REMOVED) \
                    and event.event_data is not None:
                try:
                    ledger_id = id_of(event.event_data.path)
                except ValueError:
                    return  # a level of the tree, not a record
                self.wake_ledger_id(ledger_id)
        return changed

    def _session_changed(self, connect: Hashable, state: str) -> None:
        """A lost session took the one-shot metadata watches with it: every Ledger on that ZooKeeper is re-read."""
        if state == KazooState.LOST:
            with self._lock:
                keys = [key for key, e in self._entries.items() if self.zookeeper_of(key[0], e.cluster) == connect]
            for key in keys:
                self.queue.wake(key)

    def records(self, connect: Hashable, ledger_id: int) -> tuple[bool, bool] | None:
        """Whether the ledger has a marker and a DATA_LOSS record, from the trees' caches once they were first filled
        (None before: read them). A pass reads only the records that exist, so a healthy ledger's pass makes one
        ZooKeeper request (its metadata); a record the cache has not seen yet wakes the Ledger again when it arrives."""
        self.watch_zookeeper(connect)
        if not all(ready.is_set() for ready in self._initialized[connect]):
            return None
        markers, losses = self._caches[connect]
        return (markers.get_data(zkpaths.underreplicated(ledger_id)) is not None,
                losses.get_data(zkpaths.dataloss(ledger_id)) is not None)

    def marked(self, connect: Hashable) -> tuple[set[int], set[int]]:
        """Ids with a marker and with a DATA_LOSS record, from the trees' caches (no ZooKeeper read)."""
        self.watch_zookeeper(connect)
        markers, losses = self._caches[connect]
        return _ids(markers, zkpaths.UR_LEDGERS, zkpaths.ledger_id_from_marker), _ids(losses, zkpaths.UR_DATALOSS,
                                                                                   zkpaths.ledger_id_from_dataloss)

    # --- resync ---------------------------------------------------------------------------------------------------

    def resync_cluster(self, namespace: str, cluster: str) -> int:
        """Wake the cluster's Ledgers that the cheap facts say need a pass; returns how many."""
        connect = self.zookeeper_of(namespace, cluster)
        ledgers = self.ledgers_of(namespace, cluster)
        if connect is None:
            stale = list(ledgers)
        else:
            markers, losses = self.marked(connect)
            stale = [key for key, e in ledgers.items()
                     if not e.settled or e.under_replicated != (e.ledger_id in markers)
                     or e.data_loss != (e.ledger_id in losses)]
        for key in stale:
            self.queue.wake(key)
        return len(stale)

    def _resync_due_clusters(self, now: float) -> None:
        with self._lock:
            clusters = {cluster for cluster, count in self._per_cluster.items() if count > 0}
        for cluster in clusters - self._resync_due.keys():
            self._resync_due[cluster] = now + self._jittered()
        for cluster in list(self._resync_due):
            if cluster not in clusters:
                del self._resync_due[cluster]
            elif self._resync_due[cluster] <= now:
                self._resync_due[cluster] = now + self._jittered()
                try:
                    self.resync_cluster(*cluster)
                except Exception:
                    log.exception("resync of the Ledgers of %s/%s failed", *cluster)

    def _jittered(self) -> float:
        return self.resync * self.rng.uniform(1 - RESYNC_JITTER, 1 + RESYNC_JITTER)

    # --- acting ---------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def acting(self, namespace: str, cluster: str) -> Iterator[None]:
        """While this replica reconciles the cluster: its Ledgers are passed, those parked meanwhile first."""
        with self._lock:
            self._acting[namespace, cluster] += 1
            parked = self._parked.pop((namespace, cluster), set())
        for key in parked:
            self.queue.wake(key)
        try:
            yield
        finally:
            with self._lock:
                self._acting[namespace, cluster] -= 1
                if not self._acting[namespace, cluster]:
                    del self._acting[namespace, cluster]

    def _parks(self, key: LedgerKey) -> bool:
        """Park `key` if its cluster is known but not acted for here; returns whether it did."""
        with self._lock:
            entry = self._entries.get(key)
            cluster = (key[0], entry.cluster) if entry else None
            if cluster is None or cluster in self._acting:
                return False
        if self.zookeeper_of(*cluster) is None:
            return False  # no such cluster: its pass reports that
        with self._lock:
            if cluster in self._acting:
                return False
            self._parked.setdefault(cluster, set()).add(key)
            return True

    # --- the worker -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        for caches in self._caches.values():
            for cache in caches:
                cache.close()

    def _run(self, resyncs: bool) -> None:
        """A worker (passes are I/O: a few run at once); the first one also starts the resyncs. It takes up to
        `batch` due Ledgers at once and sends their metadata reads ahead together, then passes them one by one: at a
        restart over 100,000 current Ledgers a pass is little more than that read, and one round trip each, waited
        for by eight threads that also wait for the GIL, held passes to ~600/s."""
        while not self._stop.is_set():
            if resyncs:
                self._resync_due_clusters(time.monotonic())
            share = len(self.queue) // len(self._threads)  # a few due: one each, their writes side by side
            taken = self.queue.take_many(max(1, min(self.batch, share)), timeout=1.0)
            self._local.ahead = self._read_ahead([key for key, _ in taken])
            try:
                for key, payload in taken:
                    self._pass(key, payload)
            finally:
                self._local.ahead = {}

    def _pass(self, key: LedgerKey, payload: bytes | None) -> None:
        try:
            if self._parks(key):
                return
            due = self.reconcile(key, None if payload is None else json.loads(payload))
            if due is not None:
                self.queue.wake(key, delay=due)
        except ZooKeeperUnavailable as unavailable:  # its cluster's ZooKeeper is down: no trace per Ledger
            log.debug("Ledger %s/%s: %s; retried in %s s", *key, unavailable, self.retry)
            self.queue.wake(key, delay=self.retry)
        except Exception:
            log.exception("reconciling Ledger %s/%s failed; retried in %s s", *key, self.retry)
            self.queue.wake(key, delay=self.retry)
        finally:
            self.queue.done(key)

    def _read_ahead(self, keys: list[LedgerKey]) -> dict[tuple[KazooClient, int], PendingRead]:
        """The metadata reads of the Ledgers about to be passed here (those with an id, of a cluster acted for), sent
        at once, each with the watch its pass would set."""
        with self._lock:
            wanted = [(key, entry) for key in keys if (entry := self._entries.get(key)) is not None
                      and entry.ledger_id is not None and (key[0], entry.cluster) in self._acting]
        ahead = {}
        for key, entry in wanted:
            try:
                if (target := self.zookeeper_of(key[0], entry.cluster)) is not None:
                    zk = self.zk(target)
                    ahead[zk, entry.ledger_id] = MetadataStore(zk).read_ahead(entry.ledger_id,
                                                                              self.metadata_watch(entry.ledger_id))
            except Exception:  # no session yet, a credential missing: the pass meets it, fails and is retried
                log.debug("no read ahead for Ledger %s/%s", *key, exc_info=True)
        return ahead

    def read_ahead(self, zk: KazooClient, ledger_id: int) -> PendingRead | None:
        """The read this worker sent ahead for the ledger on that ZooKeeper, if it did (taken by the first pass
        that asks; a pass without one reads for itself)."""
        return getattr(self._local, "ahead", {}).pop((zk, ledger_id), None)


@dataclass(frozen=True, slots=True)
class MetadataWatch:
    """Equal for one ledger, so kazoo, which keeps a path's watchers in a set, holds one per ledger however many
    passes set it before it fires (a new lambda each pass piled up until the next change)."""

    feed: LedgerFeed
    ledger_id: int

    def __call__(self, _event: WatchedEvent) -> None:
        self.feed.wake_ledger_id(self.ledger_id)


def packed(body: dict[str, Any]) -> bytes:
    """A woken Ledger's body as its pass will need it, kept as JSON until then: at start-up all 100,000 wait in the
    queue at once, and as dicts they took several hundred MB (managedFields, which no pass reads, left out)."""
    metadata = {key: value for key, value in body["metadata"].items() if key != "managedFields"}
    return json.dumps({**body, "metadata": metadata}, separators=(",", ":")).encode()


def _ids(cache: TreeCache, root: str, id_of: Callable[[str], int]) -> set[int]:
    """Every record id a TreeCache holds under `root` (walks its in-memory tree)."""
    found, paths = set(), [root]
    while paths:
        path = paths.pop()
        children = cache.get_children(path) or ()
        for child in children:
            full = f"{path}/{child}"
            try:
                found.add(id_of(full))
            except ValueError:
                paths.append(full)
    return found
