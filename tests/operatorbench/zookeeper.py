"""The ZooKeeper side of fleet scale: what `bookfleet status`, the auditor and repair planning cost over M ledgers.

Measured over a ZooKeeper holding the fleet's registrations and ledgers (the one of `bench operator --scale`, or
with `--zookeeper-only` an embedded one filled here, no Kubernetes), after one bookie is lost and its ledgers marked:
seconds and ZooKeeper requests (its own `mntr` zk_packets_received; by kind when made in this process) of each read
the tools make, beside raw kazoo reads of the same tree (raw_reads: the same run's baseline):
- `bookfleet status` as users run it (its own process: text, `--json`, `--by-state`) and its read alone (fleet_status),
  beside `bookfleet --help`, the command line's own start-up;
- the auditor's pass on taking office over every marker (clear_stale_markers) and the metadata read of its replica
  check pass (the replica reads themselves go to bookies, which do not run here);
- a repair's planning of the lost bookie's ledgers (RepairJob.prepare: markers, locks, metadata, plans);
- what a lost or draining bookie's pass asks for: the ledgers that still need it
(kube.reconcilers.repairs.remaining_ledgers). Then a whole zone is lost (zone_lost): marking its bookies' ledgers, and
`bookfleet status` over every marker.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kazoo.exceptions import NoNodeError

from bookfleet.meta import zk as zkclient
from bookfleet.meta import zkpaths
from bookfleet.meta.fleetstatus import fleet_status
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.registry import BookieInfo
from bookfleet.meta.zk import pipelined
from bookfleet.replication import auditor
from bookfleet.replication.auditor import mark_lost_bookie
from bookfleet.replication.spark_repair import RepairJob
from bookfleet.zkserver import ZooKeeperServer, four_letter_word

ZONES = ("zone-a", "zone-b", "zone-c")
ENTRIES = 100
RAW_SAMPLE = 10_000
"""Ledgers whose metadata the raw baseline gets in pipelines (a tenth of them one at a time)."""
ZOOKEEPER_HEAP_MB = 1024
"""Sized for 100,000 ledgers' metadata with the bookie index an earlier bookfleet kept beside it (~400,000
znodes, past the test server's 256 MiB); kept as it was."""
"""Entries of each closed bench ledger (only its metadata exists: planning needs nothing more)."""


def register_bookies(zk: Any, bookie_ids: list[str]) -> None:
    for index, bookie_id in enumerate(bookie_ids):
        info = BookieInfo(bookie_id=bookie_id, address=f"10.0.{index // 250}.{index % 250}:3181",
                          zone=ZONES[index % 3])
        zk.create(zkpaths.available(bookie_id), info.encode(), makepath=True, ephemeral=True)


def create_ledgers(zk: Any, bookie_ids: list[str], count: int) -> list[int]:
    """`count` closed ledgers of ENTRIES entries, ensembles of 3 rotating over the bookies, ids 1..count (no id
    generator round trips): their parents made first, then each ledger's transaction committed asynchronously,
    PIPELINE_WINDOW in flight, so ZooKeeper commits them in groups (100,000 in about a minute, not half an hour)."""
    ids = range(1, count + 1)
    for parent in sorted({zkpaths.ledger(ledger_id).rsplit("/", 1)[0] for ledger_id in ids}):
        zk.ensure_path(parent)

    def create(ledger_id: int) -> Any:
        ensemble = [bookie_ids[(ledger_id + k) % len(bookie_ids)] for k in range(3)]
        txn = zk.transaction()
        MetadataStore.create_in(txn, ledger_id, new_metadata(ensemble, 3, 2).with_closed(ENTRIES - 1, ENTRIES * 1024))
        return txn.commit_async()
    for ledger_id, commit in pipelined(ids, create):
        if failed := [result for result in commit.get() if isinstance(result, Exception)]:
            raise RuntimeError(f"ledger {ledger_id} not created: {failed[0]!r}")
    return list(ids)


def measure(zk: Any, port: int, victim: str) -> dict[str, Any]:
    """Each read's seconds and ZooKeeper requests (by kind when made here), `victim` (unregistered here) lost and its
    ledgers marked; `bookfleet status` also as users run it, a process of its own end to end."""
    from bookfleet.kube.reconcilers.repairs import remaining_ledgers  # the [operator] extra

    with contextlib.suppress(NoNodeError):
        zk.delete(zkpaths.available(victim))
    job, store = RepairJob(zk, open_grace_s=0), MetadataStore(zk)
    connect = f"127.0.0.1:{port}"
    figures = {
        **_timed(zk, port, "mark_lost_bookie", lambda: mark_lost_bookie(zk, victim)),
        **_timed(zk, port, "cli_help", _command("--help")),
        **_timed(zk, port, "status_cli", _command("status", "--zk", connect)),
        **_timed(zk, port, "status_cli_json", _command("status", "--zk", connect, "--json")),
        **_timed(zk, port, "status_cli_by_state", _command("status", "--zk", connect, "--json", "--by-state")),
        **_timed(zk, port, "status", lambda: fleet_status(zk).bookies),
        **_timed(zk, port, "auditor_taking_office", lambda: auditor.clear_stale_markers(zk)),
        **_timed(zk, port, "auditor_check_metadata", lambda: auditor.read_checks(store, store.ledger_ids())),
        **_timed(zk, port, "repair_planning", lambda: job.prepare(None)),
        **_timed(zk, port, "remaining_ledgers", lambda: remaining_ledgers(zk, victim, dt.datetime.now(dt.UTC))),
    }
    for ledger_id in list(job.under_replication.held):  # planned, never copied: the locks go back
        job.under_replication.release(ledger_id)
    return {key: value for key, value in figures.items() if value is not None}


def zone_lost(zk: Any, port: int, zone: list[str]) -> dict[str, Any]:
    """`bookfleet status` once every bookie of `zone` is lost and its ledgers marked: with ensembles across the
    zones, every ledger carries a marker, so its count is a walk of as many markers as ledgers."""
    for bookie_id in zone:
        with contextlib.suppress(NoNodeError):
            zk.delete(zkpaths.available(bookie_id))
    figures = {
        **_timed(zk, port, "zone_lost_marking", lambda: [mark_lost_bookie(zk, bookie_id) for bookie_id in zone]),
        **_timed(zk, port, "zone_lost_status_cli", _command("status", "--zk", f"127.0.0.1:{port}")),
        "zone_lost_under_replicated": fleet_status(zk).ledgers.under_replicated,
    }
    return {key: value for key, value in figures.items() if value is not None}


def _timed(zk: Any, port: int, name: str, call: Callable[[], Any]) -> dict[str, Any]:
    packets, started = _packets(port), time.monotonic()
    with _requests_by_kind(zk) as kinds:
        result = call()
    seconds, requests = time.monotonic() - started, _packets(port) - packets - 1  # our own mntr
    return {f"{name}_s": round(seconds, 2), f"{name}_zk_requests": int(requests),
            f"{name}_zk_requests_by_kind": dict(kinds) or None,
            f"{name}_items": len(result) if hasattr(result, "__len__") else None}


def _command(*args: str) -> Callable[[], list[str]]:
    """A bookfleet command as users run it, in a process of its own: the lines it printed."""
    def run() -> list[str]:
        return subprocess.run([sys.executable, "-m", "bookfleet", *args], check=True, capture_output=True,
                              text=True, timeout=600).stdout.splitlines()
    return run


def raw_reads(zk: Any, ledgers: int) -> dict[str, Any]:
    """The same run's floor under those reads: bare kazoo calls, nothing parsed. Gets of ledger metadata one round
    trip after another and PIPELINE_WINDOW in flight, and listing every ledger id (the hierarchy's levels, each
    depth in one pipeline), which any count of the ledgers needs."""
    sample = [zkpaths.ledger(ledger_id) for ledger_id in range(1, min(ledgers, RAW_SAMPLE) + 1)]
    started = time.monotonic()
    for path in sample[:RAW_SAMPLE // 10]:
        zk.get(path)
    sequential = time.monotonic() - started
    started = time.monotonic()
    for _, read in pipelined(sample, zk.get_async):
        read.get()
    in_flight = time.monotonic() - started
    started = time.monotonic()
    levels = [zkpaths.ROOT]
    for depth in range(3):  # the short ids' layout, the only one the load creates: two levels, then the ledgers
        levels = [f"{parent}/{child}" for parent, listing in pipelined(levels, zk.get_children_async)
                  for child in listing.get() if depth == 2 or zkpaths.is_ledger_level(child, depth)]
    return {"raw_sequential_get_per_s": round(len(sample[:RAW_SAMPLE // 10]) / sequential),
            "raw_pipelined_get_per_s": round(len(sample) / in_flight),
            "raw_list_ledger_ids_s": round(time.monotonic() - started, 2), "raw_ledger_ids_listed": len(levels)}


@contextlib.contextmanager
def _requests_by_kind(zk: Any) -> Iterator[Counter[str]]:
    """Counts the requests `zk` sends meanwhile by kind (GetData, GetChildren, Exists, Transaction, ...): every
    request, synchronous or not, goes through its _call."""
    kinds: Counter[str] = Counter()
    send = zk._call

    def counted(request: Any, async_object: Any) -> Any:
        kinds[type(request).__name__] += 1
        return send(request, async_object)
    zk._call = counted
    try:
        yield kinds
    finally:
        del zk._call


def _packets(port: int) -> float:
    for line in four_letter_word(port, "mntr", timeout=10).splitlines():
        key, _, value = line.partition("\t")
        if key == "zk_packets_received":
            return float(value)
    raise RuntimeError("ZooKeeper's mntr has no zk_packets_received")


def standalone(directory: Path, bookies: int, ledgers: int) -> dict[str, Any]:
    """An embedded ZooKeeper filled with `bookies` registrations and `ledgers` closed ledgers, then the raw reads,
    measure() and zone_lost() of the first zone."""
    bookie_ids = [f"bookie-{index}.bench:3181" for index in range(bookies)]
    with ZooKeeperServer(directory / "zk", heap_mb=ZOOKEEPER_HEAP_MB) as server, \
            zkclient.session(server.connect) as zk:
        register_bookies(zk, bookie_ids)
        started = time.monotonic()
        create_ledgers(zk, bookie_ids, ledgers)
        return {"ledger_creation_s": round(time.monotonic() - started, 1), **raw_reads(zk, ledgers),
                **measure(zk, server.port, bookie_ids[-1]),
                **zone_lost(zk, server.port, bookie_ids[::len(ZONES)])}  # register_bookies: bookie i in zone i % 3
