"""Which ledgers each bookie holds, from one scan of the metadata shared by every pass that may use it.

BookKeeper keeps no index by bookie (a Java client's ledgers name their bookies only in their metadata), so the
answer is a scan of every ledger's metadata: about 400 ZooKeeper requests at 100,000 ledgers. A pass of a lost or
draining bookie asks on every pass, and a zone's repairs finish together: one scan per pass per bookie was hundreds of
scans at once. A pass now takes the newest scan of its cluster's session that began after whatever could have made
its answer too small: the drain's start (a ledger created on the bookie before it turned read-only) and the end of
the repair that moved its ledgers (the metadata the repair swapped). An older scan only ever shows more ledgers left,
never fewer, than the truth it missed; a pass that needs a newer one makes it, after a ZooKeeper sync (the session's
server may lag behind the one the repair wrote through), and the passes queued behind it take it.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import cachetools
from kazoo.client import KazooClient

from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore

CLOCK_MARGIN = dt.timedelta(seconds=5)
"""How much later than an API server's timestamp a scan must have begun, by this process's clock, to be sure it began
after that moment: the two clocks may differ by this much."""
KEPT_S = 600.0
"""How long a session's newest scan is kept (a closed session's is then dropped)."""


@dataclass(frozen=True)
class Scan:
    began: dt.datetime
    by_bookie: Mapping[str, list[int]]


class LedgerScans:
    """The newest scan per ZooKeeper session (one per cluster credential), and one scan at a time per session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scans: cachetools.TTLCache = cachetools.TTLCache(maxsize=256, ttl=KEPT_S)
        self._scanning: cachetools.TTLCache = cachetools.TTLCache(maxsize=256, ttl=KEPT_S)

    def by_bookie(self, zk: KazooClient, began_after: dt.datetime) -> Mapping[str, list[int]]:
        """bookie id -> the ledgers whose metadata names it, from a scan begun at least CLOCK_MARGIN after
        `began_after` (an aware datetime)."""
        with self._lock:
            scanning = self._scanning.setdefault(zk.client_id, threading.Lock())
        with scanning:  # a pass that waits here takes the scan the one before it made
            with self._lock:
                scan: Scan | None = self._scans.get(zk.client_id)
            if scan is None or scan.began < began_after + CLOCK_MARGIN:
                began = dt.datetime.now(dt.UTC)
                zk.sync(zkpaths.ROOT)
                scan = Scan(began, MetadataStore(zk).ledgers_by_bookie())
                with self._lock:
                    self._scans[zk.client_id] = scan
            return scan.by_bookie


SCANS = LedgerScans()


def ledgers_on(zk: KazooClient, bookie_id: str, began_after: dt.datetime) -> list[int]:
    """The ledgers whose metadata names `bookie_id`, as a scan begun after `began_after` saw them."""
    return SCANS.by_bookie(zk, began_after).get(bookie_id, [])
