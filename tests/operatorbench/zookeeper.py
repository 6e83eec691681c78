"""The ZooKeeper side of fleet scale: what `bookfleet status`, the auditor and repair planning cost over M ledgers.

Measured over a ZooKeeper holding the fleet's registrations and ledgers (the one of `bench operator --scale`, or
with `--zookeeper-only` an embedded one filled here, no Kubernetes), after one bookie is lost and its ledgers marked:
seconds and ZooKeeper requests (its own `mntr` zk_packets_received) of each read the tools make:
- `bookfleet status` (fleet_status);
- the auditor's pass on taking office over every marker (clear_stale_markers) and the metadata read of its replica
  check pass (the replica reads themselves go to bookies, which do not run here);
- a repair's planning of the lost bookie's ledgers (RepairJob.prepare: markers, locks, metadata, plans);
- what a lost or draining bookie's pass asks for: the ledgers that still need it (kube.repairs.remaining_ledgers).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.exceptions import NoNodeError

from bookfleet.meta import zk as zkclient
from bookfleet.meta import zkpaths
from bookfleet.meta.fleetstatus import fleet_status
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.registry import BookieInfo
from bookfleet.replication import auditor
from bookfleet.replication.auditor import mark_lost_bookie
from bookfleet.replication.spark_repair import RepairJob
from bookfleet.zkserver import ZooKeeperServer, four_letter_word

ZONES = ("zone-a", "zone-b", "zone-c")
ENTRIES = 100
"""Entries of each closed bench ledger (only its metadata exists: planning needs nothing more)."""


def register_bookies(zk: Any, bookie_ids: list[str]) -> None:
    for index, bookie_id in enumerate(bookie_ids):
        info = BookieInfo(bookie_id=bookie_id, address=f"10.0.{index // 250}.{index % 250}:3181",
                          zone=ZONES[index % 3])
        zk.create(zkpaths.available(bookie_id), info.to_json(), makepath=True, ephemeral=True)


def create_ledgers(zk: Any, bookie_ids: list[str], count: int) -> list[int]:
    """`count` closed ledgers of ENTRIES entries, ensembles of 3 rotating over the bookies, ids 1..count (no id
    generator round trips; many writers at once so that ZooKeeper commits them in groups)."""
    store = MetadataStore(zk)

    def create(ledger_id: int) -> int:
        ensemble = [bookie_ids[(ledger_id + k) % len(bookie_ids)] for k in range(3)]
        return store.create(new_metadata(ensemble, 3, 2).with_closed(ENTRIES - 1, ENTRIES * 1024), ledger_id)
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        return list(pool.map(create, range(1, count + 1)))


def measure(zk: Any, port: int, victim: str) -> dict[str, Any]:
    """Each read's seconds and ZooKeeper requests, `victim` (unregistered here) lost and its ledgers marked."""
    from bookfleet.kube.repairs import remaining_ledgers  # the [operator] extra

    def timed(name: str, call: Callable[[], Any]) -> dict[str, Any]:
        packets, started = _packets(port), time.monotonic()
        result = call()
        seconds, requests = time.monotonic() - started, _packets(port) - packets - 1  # our own mntr
        return {f"{name}_s": round(seconds, 2), f"{name}_zk_requests": int(requests),
                f"{name}_items": len(result) if hasattr(result, "__len__") else None}

    with contextlib.suppress(NoNodeError):
        zk.delete(zkpaths.available(victim))
    job, store = RepairJob(zk, open_grace_s=0), MetadataStore(zk)
    figures = {
        **timed("mark_lost_bookie", lambda: mark_lost_bookie(zk, victim)),
        **timed("status", lambda: fleet_status(zk).bookies),
        **timed("auditor_taking_office", lambda: auditor.clear_stale_markers(zk)),
        **timed("auditor_check_metadata", lambda: auditor.read_checks(store, store.ledger_ids())),
        **timed("repair_planning", lambda: job.prepare(None)),
        **timed("remaining_ledgers", lambda: remaining_ledgers(zk, victim)),
    }
    for ledger_id in list(job.under_replication.held):  # planned, never copied: the locks go back
        job.under_replication.release(ledger_id)
    return {key: value for key, value in figures.items() if value is not None}


def _packets(port: int) -> float:
    for line in four_letter_word(port, "mntr", timeout=10).splitlines():
        key, _, value = line.partition("\t")
        if key == "zk_packets_received":
            return float(value)
    raise RuntimeError("ZooKeeper's mntr has no zk_packets_received")


def standalone(directory: Path, bookies: int, ledgers: int) -> dict[str, Any]:
    """An embedded ZooKeeper filled with `bookies` registrations and `ledgers` closed ledgers, then measure()."""
    bookie_ids = [f"bookie-{index}.bench:3181" for index in range(bookies)]
    with ZooKeeperServer(directory / "zk") as server, zkclient.session(server.connect) as zk:
        register_bookies(zk, bookie_ids)
        started = time.monotonic()
        create_ledgers(zk, bookie_ids, ledgers)
        return {"ledger_creation_s": round(time.monotonic() - started, 1),
                **measure(zk, server.port, bookie_ids[-1])}
