"""An Apache BookKeeper fleet serving a Pulsar broker moves to bookfleet with the producer running (docs/pulsar.md,
"Migrating from Apache BookKeeper"), as `python -m tests.pulsar --migrate` and test_bookkeeper_migration.py run it:
bookfleet bookies join the cluster's ZooKeeper (its `/ledgers`, its INSTANCEID in their cookies) beside bookfleet's
auditor and repair runner; then each Java bookie in turn is stopped, its ledgers re-replicated onto bookfleet bookies
by the auditor's marks and the repair runner, and its cookie removed (what BookKeeper's `decommissionbookie` does
last); the topic is unloaded (the broker reopens its ledgers from the metadata repair rewrote) and consumed back.
And the way back (test_bookkeeper_migration.py after the migration): Java bookies on fresh disks join with
BookKeeper's own AutoRecovery in them, bookfleet's auditor and repair stop, and each bookfleet bookie in turn is
decommissioned the same way, BookKeeper's auditor and replication workers moving its ledgers."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pulsar

from bookfleet.bench.bookkeeper import RECOVERY_SETTINGS
from bookfleet.bench.repair import LedgerShape, fill_ledgers, verify_replicas
from bookfleet.fleet import BookieFleet
from bookfleet.meta import cookies, layout, zkpaths
from bookfleet.meta import zk as zkclient
from bookfleet.meta.fleetstatus import fleet_status
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.registry import BookieRegistry
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from bookfleet.replication.runner import AutoRecoveryRunner
from tests.interop.javaside import JavaBookie, shell, started_side_by_side, write_conf
from tests.pulsar.broker import PulsarBroker
from tests.pulsar.fleet import BookKeeperFleet, bookkeeper_fleet, broker_on
from tests.pulsar.scenario import (
    NAMESPACE,
    QUIET,
    Produced,
    consume,
    entries_missing_payloads,
    not_where_acked,
    order_figures,
    produce,
)

BOOKFLEET_BOOKIES = 3
"""As many as the Java bookies they replace: an E3 ensemble fits on them alone."""
OPEN_GRACE_S = 5.0
"""Before repair fences an open ledger whose current ensemble lost a Java bookie (`--open-grace-s`, 30 s by
default): the ledgers the broker no longer writes (its health check's topic and schema) are closed sooner; a written
one has been replaced in by Pulsar's client long before."""
RATE = 200
"""Messages a second while the fleet moves: enough to keep every partition's ledger written (so the broker replaces
a stopped bookie in its ensemble at once), few enough for a short test."""
BOOKKEEPER_AUTORECOVERY = {**RECOVERY_SETTINGS, "openLedgerRereplicationGracePeriod": int(OPEN_GRACE_S * 1000)}
"""The Java bookies of the way back run BookKeeper's AutoRecovery as it is deployed by default (an auditor elected
among the bookies, a replication worker in each, no delay after a loss), with the repair's open grace above."""
PRELOAD_ENTRY_SIZE = 64 << 10
PRELOAD_ENTRIES_PER_LEDGER = 256
"""`--size`'s ledgers: 16 MiB each (bench repair's bulk case), written before bookfleet's bookies join."""



@dataclass
class Migration:
    """What a migration runs on: the Java fleet, the broker on it, bookfleet's bookies (not started yet) and
    bookfleet's auto-recovery (until the way back stops it); `produced` keeps each moved topic's acknowledgements."""

    fleet: BookKeeperFleet
    broker: PulsarBroker
    ours: BookieFleet
    recovery: AutoRecoveryRunner
    directory: Path
    produced: dict[str, Produced] = field(default_factory=dict)


@contextmanager
def migration_setup(directory: Path) -> Iterator[Migration]:
    """Three Java bookies, bookfleet's auto-recovery on their ZooKeeper (its Spark session warms up while the broker
    starts; it has nothing to do until a bookie leaves) and the broker, which stops first."""
    with (bookkeeper_fleet(directory / "bookkeeper", bookies=3) as fleet,
          BookieFleet(fleet.zk, directory / "bookfleet") as ours,
          AutoRecoveryRunner(fleet.zk, poll_interval=0.2, open_grace_s=OPEN_GRACE_S) as recovery,
          broker_on(directory, fleet.zk) as broker):
        yield Migration(fleet, broker, ours, recovery, directory)


def paced(rate: float, stop: threading.Event) -> Iterator[int]:
    """0, 1, 2, ... at `rate` a second until `stop` is set."""
    began = time.monotonic()
    for seq in itertools.count():
        if stop.is_set():
            return
        time.sleep(max(0.0, began + seq / rate - time.monotonic()))
        yield seq


def preload(zk: str, stored_bytes: int) -> dict[int, list[bytes]]:
    """Closed E3/Qw2 ledgers that the bookies hold `stored_bytes` of, replicas counted (what `--size` adds to the
    broker's topic before the migration); ledger id -> each entry's sha256, as bench repair's `fill_ledgers`."""
    shape = LedgerShape()
    ledger_bytes = PRELOAD_ENTRY_SIZE * PRELOAD_ENTRIES_PER_LEDGER * shape.write_quorum
    return asyncio.run(fill_ledgers(zk, -(-stored_bytes // ledger_bytes), PRELOAD_ENTRIES_PER_LEDGER,
                                    PRELOAD_ENTRY_SIZE, shape))


def timed(step: str, action: Callable[[], dict | None]) -> dict:
    """`action`'s figures with its name and when it began and ended (monotonic: the producer's gaps within)."""
    began = time.monotonic()
    figures = action() or {}
    return {"step": step, **figures, "began": began, "ended": time.monotonic()}


def join(fleet: BookKeeperFleet, ours: BookieFleet) -> None:
    """bookfleet's bookies started on the Java fleet's ZooKeeper; checked to have joined its cluster, not made one."""
    with zkclient.session(fleet.zk) as zk:
        layout_before, instance_id = zk.get(zkpaths.LAYOUT)[0], layout.instance_id(zk)
        ours.start(BOOKFLEET_BOOKIES)
        assert zk.get(zkpaths.LAYOUT)[0] == layout_before
        assert all(cookies.read(zk, bookie.bookie_id).instanceId == instance_id for bookie in ours.bookies)
        assert BookieRegistry(zk).ids() == {bookie.bookie_id for bookie in (*fleet.bookies, *ours.bookies)}


def decommission(zk: str, bookie, timeout: float) -> dict:
    """Stop one bookie, wait until no ledger names it and nothing is marked, remove its cookie (what BookKeeper's
    `decommissionbookie` does last); the ledgers it held."""
    with zkclient.session(zk) as session:
        store, under_replication = MetadataStore(session), UnderReplication(session)
        held = store.ledgers_on_bookie(bookie.bookie_id)
        bookie.stop()
        wait_for(lambda: not store.ledgers_on_bookie(bookie.bookie_id) and not under_replication.ledger_ids(),
                 timeout=timeout, interval=0.5, what=f"the ledgers of bookie {bookie.bookie_id} to move")
        cookies.forget(session, bookie.bookie_id)
    return {"bookie": bookie.bookie_id, "ledgers": held}


def to_bookfleet(migration: Migration, step_timeout: float) -> tuple[list[dict], list]:
    """Steps 2-4 of the runbook: bookfleet's bookies join, each Java bookie is decommissioned in turn."""
    fleet = migration.fleet
    steps = [timed("join", lambda: join(fleet, migration.ours))]
    steps += [timed("decommission", lambda bookie=bookie: decommission(fleet.zk, bookie, step_timeout))
              for bookie in list(fleet.bookies)]
    return steps, migration.ours.bookies


def ensembles(store: MetadataStore) -> dict[int, list[list[str]]]:
    """Each ledger's ensembles, segment by segment."""
    return {ledger_id: [list(segment.bookies) for segment in metadata.segments]
            for ledger_id, metadata in store.scan().items()}


def back_to_bookkeeper(migration: Migration, step_timeout: float) -> tuple[list[dict], list]:
    """The way back: Java bookies on fresh disks join with BookKeeper's AutoRecovery, bookfleet's auditor and repair
    stop (BookKeeper's auditor takes the election), and each bookfleet bookie is decommissioned in turn."""
    zk = migration.fleet.zk
    returning = [JavaBookie(migration.directory / "returning" / f"bookie-{n}", zk, **BOOKKEEPER_AUTORECOVERY)
                 for n in range(BOOKFLEET_BOOKIES)]
    migration.fleet.bookies += returning  # stopped with the fleet

    def join_java() -> dict:
        """The Java bookies started, BookKeeper's full check forced (`shell forceauditchecks -calc`: bookfleet's
        auditor recorded its own check where BookKeeper's auditor reads the last one, which would otherwise wait out
        the interval from it) and bookfleet's auto-recovery stopped; then BookKeeper's auditor, elected, runs its
        full check of every ledger at once (checkAllLedgers), waited out so that what it marks (or its replication
        workers then move) with every bookie up is counted apart from the steps: a replica its readers could not
        find on a bookfleet bookie (docs/pulsar.md says why one was)."""
        with zkclient.session(zk) as session:
            store, under_replication = MetadataStore(session), UnderReplication(session)
            before = ensembles(store)
            started_side_by_side(returning, session)
            shell(write_conf(migration.directory / "admin.conf", zk), "forceauditchecks", "-calc")
            forced = under_replication.check_all_ledgers_ctime()
            migration.recovery.stop()
            wait_for(lambda: under_replication.check_all_ledgers_ctime() != forced, timeout=step_timeout,
                     interval=0.5, what="BookKeeper's auditor to check every ledger")
            after = ensembles(store)
            return {"marked_by_bookkeepers_check": len(under_replication.ledger_ids()),
                    "moved_by_bookkeepers_check": sum(before[ledger_id] != after[ledger_id]
                                                      for ledger_id in before.keys() & after.keys())}

    steps = [timed("join", join_java)]
    steps += [timed("decommission", lambda bookie=bookie: decommission(zk, bookie, step_timeout))
              for bookie in migration.ours.bookies]
    return steps, returning


def longest_gap(acks: list[float], began: float = float("-inf"), ended: float = float("inf")) -> float:
    """The longest wait between two consecutive acknowledgements that overlaps [began, ended]."""
    return max((later - earlier for earlier, later in itertools.pairwise(acks) if later > began and earlier < ended),
               default=0.0)


def run(migration: Migration, topic: str, move: Callable[[Migration, float], tuple[list[dict], list]],
        partitions: int = 4, step_timeout: float = 180.0) -> dict:
    """`move` (to_bookfleet or back_to_bookkeeper) under a running producer, then the topic unloaded (its ledgers
    reopened from today's metadata) and consumed back; the figures (JSON-ready)."""
    fleet, broker = migration.fleet, migration.broker
    broker.admin("POST", f"/admin/v2/namespaces/{NAMESPACE}/retention",
                 {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})  # nothing trimmed before it is consumed
    broker.admin("PUT", f"/admin/v2/persistent/{NAMESPACE}/{topic}/partitions", partitions)
    client = pulsar.Client(broker.service_url, logger=QUIET, operation_timeout_seconds=120)
    produced, stop = migration.produced.setdefault(topic, Produced()), threading.Event()
    producer = threading.Thread(target=produce, args=(client, topic, paced(RATE, stop), {}, produced),
                                name="producer")
    try:
        producer.start()
        produced.last_acked()
        began = time.monotonic()
        steps, destination = move(migration, step_timeout)

        def unload() -> None:  # step 5: the broker reopens the topic's ledgers from today's metadata
            broker.admin("PUT", f"/admin/v2/persistent/{NAMESPACE}/{topic}/unload")

        steps.append(timed("unload", unload))
        migration_seconds = time.monotonic() - began
        produced.last_acked()
        time.sleep(1.0)  # acknowledgements after the unload: its pause is measured
        stop.set()
        producer.join()
        unload()  # the ledger written since is closed too: read below at each acknowledged MessageId
        expected: dict[int, int] = defaultdict(int)
        for acked in produced.acked.values():
            expected[acked.partition] += 1
        received = consume(client, topic, partitions, expected)
    finally:
        stop.set()
        client.close()
    with zkclient.session(fleet.zk) as zk:
        by_bookie = MetadataStore(zk).ledgers_by_bookie()
        status = fleet_status(zk)
    delivered = {seq for messages in received.values() for seq, _, _ in messages}
    duplicates, reordered = order_figures(received)
    acks = sorted(acked.acked_at for acked in produced.acked.values())
    return {
        "messages": len(produced.acked) + produced.failed,
        "acked": len(produced.acked),
        "send_failures": produced.failed,
        "lost": len(produced.acked.keys() - delivered),
        "reordered": reordered,
        "duplicates": duplicates,
        "not_in_bookfleet_entry": asyncio.run(entries_missing_payloads(fleet.zk, topic, received)),
        # every topic this fleet has moved, each message read at its acknowledged MessageId
        "not_where_acked": sum(not_where_acked(fleet.zk, moved, acks_of)
                               for moved, acks_of in migration.produced.items()),
        "steps": [{**{name: value for name, value in step.items() if name not in ("began", "ended")},
                   **({"ledgers": len(step["ledgers"])} if "ledgers" in step else {}),
                   "seconds": round(step["ended"] - step["began"], 1),
                   "longest_ack_gap_s": round(longest_gap(acks, step["began"], step["ended"]), 1)}
                  for step in steps],
        "ledgers_moved": len({ledger_id for step in steps for ledger_id in step.get("ledgers", ())}),
        "migration_seconds": round(migration_seconds, 1),
        "produce_seconds": round(produced.ended - produced.began, 1),
        "longest_ack_gap_s": round(longest_gap(acks), 1),
        "bookies_holding_ledgers": sorted(by_bookie),
        "destination_bookies": sorted(bookie.bookie_id for bookie in destination),
        "healthy": status.healthy,
    }


def replica_problems(zk: str, preloaded: dict[int, list[bytes]]) -> list[str]:
    """bench repair's check of every replica, one ledger at a time: a Java bookie (the tests' 256 MiB of direct
    memory) asked for every 64 KiB entry of all ledgers at once runs out of memory answering and exits."""
    return [problem for ledger_id, digests in preloaded.items()
            for problem in asyncio.run(verify_replicas(zk, {ledger_id: digests}))]


def sized_run(migration: Migration, stored_gib: float, partitions: int = 4, back: bool = False,
              step_timeout: float = 900.0) -> Iterator[dict]:
    """`python -m tests.pulsar --migrate --size-gib G [--back]`: the Java bookies hold G GiB (pre-loaded closed
    ledgers beside the broker's topic) before the migration; after it (and after the way back) each pre-loaded entry
    is checked byte for byte on every replica its ledger's metadata names. One figures dict per direction."""
    began = time.monotonic()
    preloaded = preload(migration.fleet.zk, int(stored_gib * (1 << 30)))
    preloaded_figures = {
        "preloaded_ledgers": len(preloaded),
        "preloaded_gib_stored": round(sum(map(len, preloaded.values())) * PRELOAD_ENTRY_SIZE
                                      * LedgerShape().write_quorum / (1 << 30), 2),
        "preload_seconds": round(time.monotonic() - began, 1),
    }
    for topic, move in [("migrating", to_bookfleet), *([("returning", back_to_bookkeeper)] if back else [])]:
        yield {
            "direction": move.__name__,
            **preloaded_figures,
            **run(migration, topic, move, partitions, step_timeout),
            "preloaded_replica_problems": replica_problems(migration.fleet.zk, preloaded)[:10],
            "load_average": [round(load, 1) for load in os.getloadavg()],
        }
