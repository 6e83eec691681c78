"""The auditor: notices lost bookies and damaged replicas and marks their ledgers under-replicated.

One auditor is active at a time, elected through ephemeral sequential znodes under zkpaths.AUDITOR_ELECTION (the
lowest sequence leads; each standby watches its predecessor only, so a death wakes one standby, not a herd). The
active auditor:

- watches bookie registrations and asks the one lost-bookie rule (lostbookie.decide_lost_bookie, which the
  operator asks too) what to do about each vanished bookie, with lostBookieRecoveryDelay and the disable switch as
  ZooKeeper holds them at run time. A bookie that registers again passed its cookie check at start, so its data is
  the same one: nothing is marked.
- marks a lost bookie's ledgers with `mark_lost_bookie`, the one rule the Kubernetes operator also calls on pod
  death;
- on taking office, treats bookies some ledger's metadata names but that are not registered as just lost (they vanished
  while no auditor ran), and clears stale markers whose missing bookies are back and hold their replicas
  (apache/pulsar#1886 kept such lists forever), then those naming each bookie that registers again;
- every `check_interval` reads the first and last entry of every closed fragment on every replica and marks the
  ledgers whose replicas answer definitely that they lack an entry or hold a corrupt copy. A connection error, a
  bookie shutting down or a read that times out is retried and, if it persists, marks nothing: a silent bookie is
  the lost-bookie rule's to judge, after the delay, never the check's. When the check finishes its time goes into
  ZooKeeper where BookKeeper's auditor keeps its own (UnderReplication.set_check_all_ledgers_ctime), and an
  auditor taking office counts the interval from there (first_check_delay): at once if no check was recorded or
  the last is overdue, so restarts and changes of leader never push the check back, whichever kind ran it last.

The check and the stale-marker clean-up read replicas, each on a thread and event loop of its own (`_OffLoop`),
never on the auditor's: a bookie lost while a silent or frozen bookie holds their reads is marked once its delay is
over, not once they end. One clean-up runs at a time (returns meanwhile wait for the next); the auditor's loop makes
its clears, by compare-and-set, and keeps every marker naming a bookie gone since the clean-up began. Leaving office
cancels both, and the disable switch a running check, before they mark, clear or record anything.

While the disable switch (UnderReplication.disable) is set it keeps lost bookies pending, marks nothing and
clears nothing (a clean-up that ends meanwhile has its clears made once enabled, under the same guards).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Iterable
from typing import Generic, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError

from bookfleet import wire
from bookfleet.client.connection import BookieError
from bookfleet.client.pool import BookiePool
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import LedgerMetadata, MetadataStore
from bookfleet.meta.registry import BookieRegistry
from bookfleet.meta.underreplication import DEFAULT_RECOVERY_DELAY, Marker, UnderReplication, auditor_vote
from bookfleet.replication.lostbookie import LostBookieAction, decide_lost_bookie
from bookfleet.replication.repair import DEFINITIVE, Reply
from bookfleet.replication.replicacheck import ENDS, ReplicaRange, entries_to_check, verdict

log = logging.getLogger(__name__)

WEEK = 7 * 24 * 3600.0
READONLY_CHILD = zkpaths.READONLY.rsplit("/", 1)[1]
CHECK_CONCURRENCY = 32
"""Ledgers whose replicas are read at the same time by a check."""
ERROR_BACKOFF = 1.0
READ_TIMEOUT = 5.0
"""One replica read of the check; the check never waits on a hung bookie longer than this per attempt."""
READ_ATTEMPTS = 3
"""Tries of a read that got no definite answer (refused, timed out, shutting down) before it counts as unknown."""
RETRY_DELAY = 0.5
"""Before the second try; doubled before each further one."""
READ_BATCH = 2000
"""Ledgers whose metadata one pipeline of the replica check reads (bounds the requests in flight)."""
DEFINITE = frozenset({Reply.LACKS, Reply.CORRUPT})
"""Replies on which the check marks a ledger."""
T = TypeVar("T")


def first_check_delay(last_check_ms: int | None, now_ms: int, interval: float) -> float:
    """Seconds from taking office to the first replica check, as BookKeeper's auditor schedules checkAllLedgers:
    at once when no check was recorded or the last one is `interval` old, else the rest of the interval. A recorded
    time ahead of this host's clock (the writer's clock runs ahead) counts as just now."""
    if last_check_ms is None:
        return 0.0
    since = max(0.0, (now_ms - last_check_ms) / 1000)
    return max(0.0, interval - since)


def mark_lost_bookie(zk: KazooClient, bookie_id: str) -> list[int]:
    """Mark every ledger with a segment on `bookie_id` as missing that bookie, declared lost (the one caller that
    says so: the auditor and the operator call it once the lost-bookie rule answers MARK); returns their ids
    (idempotent).

    Scans every ledger's metadata (as BookKeeper's auditor does): a Java client keeps no index of ledgers by bookie.
    """
    ledger_ids = MetadataStore(zk).ledgers_on_bookie(bookie_id)
    UnderReplication(zk).mark_all(ledger_ids, [bookie_id], lost=True)
    if ledger_ids:
        log.info("bookie %s is lost: marked %d ledger(s) under-replicated", bookie_id, len(ledger_ids))
    return ledger_ids


def check_ledgers(zk: KazooClient, ledger_ids: Iterable[int] | None = None) -> list[int]:
    """Verify the replicas of `ledger_ids` (default: every ledger) and mark those that fail; returns their ids."""
    return asyncio.run(_check_and_mark(zk, ledger_ids))


async def _check_all_ledgers(zk: KazooClient) -> list[int]:
    """The full check: every ledger checked, then the time it finished recorded where BookKeeper's auditor keeps it."""
    marked = await _check_and_mark(zk)
    UnderReplication(zk).set_check_all_ledgers_ctime(_now_ms())
    return marked


async def _check_and_mark(zk: KazooClient, ledger_ids: Iterable[int] | None = None) -> list[int]:
    """check_ledgers on the running loop. It marks only once every read is in, with no await between the marks: a
    check cancelled while it reads marks nothing."""
    ids = MetadataStore(zk).ledger_ids() if ledger_ids is None else list(ledger_ids)
    failing = await _ReplicaChecker(zk).damaged(ids)
    under_replication = UnderReplication(zk)
    damaged = {}
    for ledger_id, replies in failing.items():
        if missing := {bookie for bookie, reply in replies.items() if reply in DEFINITE}:
            damaged[ledger_id] = under_replication.mark(ledger_id, missing)
        if unknown := sorted(bookie for bookie, reply in replies.items() if reply is Reply.UNREACHABLE):
            log.warning("replica check of ledger %d: no answer from %s; not marked", ledger_id, ", ".join(unknown))
    if damaged:
        log.info("replica check marked %d of %d ledger(s) under-replicated", len(damaged), len(ids))
    return sorted(damaged)


def clear_stale_markers(zk: KazooClient, bookies: Collection[str] | None = None) -> list[int]:
    """Clear markers whose missing bookies are all writable again (or gone from the ledger) and hold their replicas,
    unless a writer marked them for entries they missed (the ends of a fragment cannot show a gap in its middle).

    Only markers naming one of `bookies` are looked at (default: all). A replica that does not answer keeps its
    marker. Clearing is a compare-and-set, so a loss marked meanwhile survives. Returns the ids of the cleared
    markers.
    """
    return _clear_stale(zk, asyncio.run(_stale_markers(zk, bookies)), _writable(zk))


async def _stale_markers(zk: KazooClient, bookies: Collection[str] | None) -> list[tuple[Marker, frozenset[str]]]:
    """clear_stale_markers' reads on the running loop: the markers it may clear, each with the bookies it still
    names (all of them writable and holding their replicas when read)."""
    under_replication = UnderReplication(zk)
    store = MetadataStore(zk)
    writable = _writable(zk)
    candidates = {}
    markers = [m for m in under_replication.markers() if bookies is None or m.missing_bookies & set(bookies)]
    stored = store.read_all(m.ledger_id for m in markers)
    for marker in markers:
        if stored[marker.ledger_id] is None:
            candidates[marker.ledger_id] = (marker, None, frozenset())
            continue
        metadata, _ = stored[marker.ledger_id]
        still_named = marker.missing_bookies & metadata.bookies()
        if still_named & marker.missed_entries:
            continue  # a writer went on without these bookies: only a repair brings their replicas back
        if still_named <= writable:
            candidates[marker.ledger_id] = (marker, metadata, still_named)
    checks = {ledger_id: (metadata, named) for ledger_id, (_, metadata, named) in candidates.items() if named}
    damaged = await _ReplicaChecker(zk).damaged_with(checks) if checks else {}
    return [(marker, named) for ledger_id, (marker, _, named) in sorted(candidates.items()) if ledger_id not in damaged]


def _clear_stale(zk: KazooClient, stale: list[tuple[Marker, frozenset[str]]], writable: set[str]) -> list[int]:
    """Clear, each by compare-and-set, the markers _stale_markers found whose bookies are all still `writable`: one
    that went since its replicas were read may be lost again, with a loss marked that changed nothing to bump."""
    under_replication = UnderReplication(zk)
    cleared = [marker.ledger_id for marker, named in stale if named <= writable and under_replication.clear(marker)]
    if cleared:
        log.info("cleared %d stale under-replication marker(s): %s", len(cleared), cleared)
    return cleared


def read_checks(store: MetadataStore, ledger_ids: Iterable[int]) -> dict[int, tuple[LedgerMetadata, None]]:
    """What a replica check of `ledger_ids` looks at: each ledger's metadata (deleted since listed: left out), read
    in pipelines of READ_BATCH asynchronous gets rather than one round trip per ledger."""
    ids, checks = list(ledger_ids), {}
    for start in range(0, len(ids), READ_BATCH):
        checks.update((ledger_id, (stored[0], None))
                      for ledger_id, stored in store.read_all(ids[start:start + READ_BATCH]).items()
                      if stored is not None)
    return checks


def _now_ms() -> int:
    return int(time.time() * 1000)


def _writable(zk: KazooClient) -> set[str]:
    """Bookies registered as writable and not (also, mid-switch) read-only."""
    registry = BookieRegistry(zk)
    return {info.bookie_id for info in registry.writable()} - {info.bookie_id for info in registry.read_only()}


class _ReplicaChecker:
    """Reads fragment ends from replicas, over one pooled connection per bookie for the whole check; a bookie that
    stayed silent through every attempt of one read is not asked again by this check."""

    def __init__(self, zk: KazooClient):
        self.store = MetadataStore(zk)
        self.pool = BookiePool(BookieRegistry(zk), connect_timeout=READ_TIMEOUT)
        self.silent: set[str] = set()

    async def damaged(self, ledger_ids: list[int]) -> dict[int, dict[str, Reply]]:
        """Ledger id -> {bookie: its worst reply} for the bookies whose replica reads did not all succeed."""
        return await self.damaged_with(read_checks(self.store, ledger_ids))

    async def damaged_with(self, checks: dict[int, tuple[LedgerMetadata, Collection[str] | None]]) -> dict:
        """Like damaged(), for known metadata, looking only at the given bookies of each ledger (None: all)."""
        limit = asyncio.Semaphore(CHECK_CONCURRENCY)

        async def one(ledger_id: int, metadata: LedgerMetadata, only: Collection[str] | None) -> dict[str, Reply]:
            async with limit:
                return await self._failing(ledger_id, metadata, only)

        try:
            results = await asyncio.gather(*(one(ledger_id, *check) for ledger_id, check in checks.items()))
        finally:
            await self.pool.close()
        return {ledger_id: failing for ledger_id, failing in zip(checks, results, strict=True) if failing}

    async def _failing(
        self, ledger_id: int, metadata: LedgerMetadata, only: Collection[str] | None
    ) -> dict[str, Reply]:
        reads = []
        for fragment in metadata.fragments():
            if fragment.last_entry_id is None:
                continue  # the open tail is still being written: recovery closes it before anyone judges it
            for position, bookie in enumerate(fragment.bookies):
                if only is None or bookie in only:
                    replica = ReplicaRange.of_fragment(ledger_id, fragment, position, metadata.write_quorum)
                    reads += [(bookie, entry_id) for entry_id in entries_to_check(replica, ENDS)]
        replies = await asyncio.gather(*(self._ask(bookie, ledger_id, e, metadata) for bookie, e in reads))
        failing: dict[str, Reply] = {}
        for (bookie, _), reply in zip(reads, replies, strict=True):
            if reply in DEFINITE or (reply is Reply.UNREACHABLE and failing.get(bookie) not in DEFINITE):
                failing[bookie] = reply
        return failing

    async def _ask(self, bookie: str, ledger_id: int, entry_id: int, metadata: LedgerMetadata) -> Reply:
        """One replica read, retried with backoff until it gets a definite answer or runs out of attempts."""
        delay = RETRY_DELAY
        for attempt in range(READ_ATTEMPTS):
            if bookie in self.silent:
                break
            if attempt:
                await asyncio.sleep(delay)
                delay *= 2
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    data = await (await self.pool.get(bookie)).read_entry(ledger_id, entry_id)
            except DEFINITIVE:
                return Reply.LACKS
            except (BookieError, OSError, wire.ProtocolError) as exc:  # timeouts and connection errors included
                log.debug("replica of ledger %d entry %d on %s: no answer (%r)", ledger_id, entry_id, bookie, exc)
                continue
            return verdict(data, ledger_id, entry_id, wire.Digester(metadata.digest_type, metadata.password))
        self.silent.add(bookie)
        return Reply.UNREACHABLE


class _OffLoop(Generic[T]):
    """One job of the auditor's that reads replicas (the full check, a stale-marker clean-up) on a thread and event
    loop of its own, started at once: the auditor's loop goes on marking lost bookies while it reads (minutes on a
    large fleet, longer while silent or frozen bookies make its reads wait out their deadlines). `on_done` is called
    once it ends; its owner then takes its `result()` or `cancel()`s it."""

    def __init__(self, name: str, job: Coroutine[object, object, T], on_done: Callable[[], None]):
        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(job, name=name)
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(on_done,), name=f"auditor-{name}", daemon=True)
        self._thread.start()

    def _run(self, on_done: Callable[[], None]) -> None:
        self._loop.run_until_complete(asyncio.wait([self._task]))  # its outcome is the owner's to take
        self._finished.set()
        on_done()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def result(self) -> T:
        """What the job returned; raises what it raised."""
        self._close()
        return self._task.result()

    def cancel(self) -> None:
        """Stop it where it is: cancelled while it reads, it has marked and cleared nothing. One that failed before
        the cancel reached it has its error logged here (left unread, asyncio would log it as never retrieved)."""
        self._loop.call_soon_threadsafe(self._task.cancel)  # a loop that already returned never runs it
        self._close()
        if not self._task.cancelled() and (error := self._task.exception()) is not None:
            log.warning("auditor's %s failed as it was cancelled", self._task.get_name(), exc_info=error)

    def _close(self) -> None:
        self._thread.join()
        self._loop.close()


class Auditor:
    """An auditor candidate: `start()` joins the election and runs in a thread; `stop()` resigns.

    `zk` is a started KazooClient the caller owns; when its session is lost the auditor steps down and, once
    a new session exists, joins the election again.
    """

    def __init__(
        self,
        zk: KazooClient,
        auditor_id: str | None = None,
        check_interval: float = WEEK,
        default_delay: float = DEFAULT_RECOVERY_DELAY,
    ):
        if check_interval <= 0:
            raise ValueError(f"check interval must be positive, got {check_interval} seconds")
        self.zk = zk
        self.auditor_id = auditor_id or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.check_interval = check_interval
        self.default_delay = default_delay
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._connected = threading.Event()
        self._active = threading.Event()
        self._thread: threading.Thread | None = None
        self._node: str | None = None

    # --- public surface -------------------------------------------------------------------------------------

    def start(self) -> Auditor:
        if self._thread is not None:
            raise RuntimeError(f"auditor {self.auditor_id} is already started")
        self.zk.add_listener(self._on_session_state)
        if self.zk.connected:
            self._connected.set()
        self._thread = threading.Thread(target=self._run, name=f"auditor-{self.auditor_id}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Resign and stop the thread; a standby takes over."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.zk.remove_listener(self._on_session_state)

    @property
    def is_active(self) -> bool:
        return self._active.is_set()

    def wait_active(self, timeout: float) -> bool:
        return self._active.wait(timeout)

    def check_now(self) -> list[int]:
        """Run the replica check at once, in the caller's thread, and record when it finished; returns the ledgers
        it marked."""
        return asyncio.run(_check_all_ledgers(self.zk))

    def __enter__(self) -> Auditor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- election -------------------------------------------------------------------------------------------

    def _on_session_state(self, state: KazooState) -> None:
        """Runs in kazoo's thread: never block here, only flag and wake."""
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        self._wake.set()

    def _poke(self, *_event: object) -> None:
        self._wake.set()

    def _serving(self) -> bool:
        return self._connected.is_set() and not self._stopping.is_set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            if not self._connected.wait(0.2):
                continue
            try:
                if self._elect():
                    self._lead()
            except KazooException as exc:
                log.warning("auditor %s lost ZooKeeper (%s); rejoining", self.auditor_id, exc)
            except Exception:
                log.exception("auditor %s failed; resigning so that a standby takes over", self.auditor_id)
                self._active.clear()
                self._resign()
                self._stopping.wait(ERROR_BACKOFF)
            finally:
                self._active.clear()
        self._resign()

    def _elect(self) -> bool:
        """Block until this candidate leads (True), or it is stopped or loses its session (False).

        The candidate node outlives a suspended connection: if the session survives, we keep our place.
        """
        if self._node is None or self.zk.exists(self._node) is None:
            self._node = self.zk.create(
                zkpaths.AUDITOR_VOTE_PREFIX,
                auditor_vote(self.auditor_id),
                ephemeral=True,
                sequence=True,
                makepath=True,
            )
        name = self._node.rsplit("/", 1)[1]
        while self._serving():
            self._wake.clear()
            candidates = sorted(self.zk.get_children(zkpaths.AUDITOR_ELECTION))
            if name not in candidates:
                return False  # our session's node is gone
            position = candidates.index(name)
            if position == 0:
                return True
            predecessor = f"{zkpaths.AUDITOR_ELECTION}/{candidates[position - 1]}"
            if self.zk.exists(predecessor, watch=self._poke) is not None:
                self._wake.wait()
        return False

    def _resign(self) -> None:
        node, self._node = self._node, None
        if node is not None and self.zk.connected:
            with contextlib.suppress(KazooException):
                self.zk.delete(node)

    # --- leading --------------------------------------------------------------------------------------------

    def _lead(self) -> None:
        log.info("auditor %s is active", self.auditor_id)
        under_replication = UnderReplication(self.zk)
        registered = self._registered()
        now = time.monotonic()
        absent_since = {b: now for b in MetadataStore(self.zk).bookies_with_ledgers() if b not in registered}
        unchecked: set[str] | None = None  # bookies whose stale markers are due a clean-up; None: every marker's
        cleanup: _OffLoop[list[tuple[Marker, frozenset[str]]]] | None = None
        gone_since_cleanup: set[str] = set()  # the running clean-up read their replicas maybe before they went
        check: _OffLoop[list[int]] | None = None
        last_check = self._last_check(under_replication)
        next_check = now + first_check_delay(last_check, _now_ms(), self.check_interval)
        log.info("auditor %s: last full replica check %s; next in %.0f s", self.auditor_id,
                 "never recorded" if last_check is None else f"at {last_check} ms", next_check - now)
        self._active.set()
        try:
            while self._serving():
                self._wake.clear()
                current = self._registered()
                now = time.monotonic()
                for bookie in registered - current:
                    log.info("bookie %s vanished; lost unless it returns within the recovery delay", bookie)
                    absent_since.setdefault(bookie, now)
                    gone_since_cleanup.add(bookie)
                if unchecked is not None:
                    unchecked |= current - registered
                registered = current
                disabled = self.zk.exists(zkpaths.UR_DISABLE, watch=self._poke) is not None
                self.zk.exists(zkpaths.UR_RECOVERY_DELAY, watch=self._poke)
                delay = under_replication.recovery_delay(self.default_delay)
                rechecks = []
                for bookie, since in list(absent_since.items()):
                    # A registered bookie passed its cookie check at start: its data is the one it had.
                    verdict = decide_lost_bookie(since, now, delay, disabled, registered=bookie in current,
                                                 data_present=True)
                    if verdict.action == LostBookieAction.WAIT:
                        if verdict.recheck_at is not None:
                            rechecks.append(verdict.recheck_at)
                        continue
                    log.info("bookie %s: %s", bookie, verdict.reason)
                    if verdict.action == LostBookieAction.MARK:
                        mark_lost_bookie(self.zk, bookie)
                    del absent_since[bookie]
                if disabled:
                    if check is not None:
                        check.cancel()  # it marks nothing while disabled, and is due again once enabled
                        check = None
                    self._wake.wait()
                    continue
                if cleanup is not None and cleanup.finished:
                    cleaned, cleanup = cleanup, None  # taken before result() raises what the clean-up raised
                    _clear_stale(self.zk, cleaned.result(), _writable(self.zk) - gone_since_cleanup)
                if cleanup is None and (unchecked is None or unchecked):
                    cleanup = _OffLoop("stale-markers", _stale_markers(self.zk, unchecked), on_done=self._poke)
                    unchecked, gone_since_cleanup = set(), set()
                if check is not None and check.finished:
                    finished, check = check, None  # taken before result() raises what the check raised
                    finished.result()
                    next_check = time.monotonic() + self.check_interval
                if check is None and now >= next_check:
                    check = _OffLoop("check", _check_all_ledgers(self.zk), on_done=self._poke)
                deadlines = rechecks if check is not None else [*rechecks, next_check]
                self._wake.wait(max(0.0, min(deadlines) - time.monotonic()) if deadlines else None)
        finally:
            for job in (check, cleanup):
                if job is not None:
                    job.cancel()  # one auditor at a time: a former one's jobs mark and clear nothing more

    @staticmethod
    def _last_check(under_replication: UnderReplication) -> int | None:
        """The recorded time of the last full check; an unreadable record counts as none, as in BookKeeper."""
        try:
            return under_replication.check_all_ledgers_ctime()
        except ValueError as exc:
            log.warning("%s; checking every ledger at once", exc)
            return None

    def _registered(self) -> set[str]:
        """Ids of writable and read-only bookies, watching both lists for the next change."""
        writable = set(self._watched_children(zkpaths.AVAILABLE)) - {READONLY_CHILD}
        return writable | set(self._watched_children(zkpaths.READONLY))

    def _watched_children(self, path: str) -> list[str]:
        while True:
            try:
                return self.zk.get_children(path, watch=self._poke)
            except NoNodeError:
                if self.zk.exists(path, watch=self._poke) is None:
                    return []
