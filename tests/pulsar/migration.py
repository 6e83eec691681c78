"""An Apache BookKeeper fleet serving a Pulsar broker moves to bookfleet with the producer running (docs/pulsar.md,
"Migrating from Apache BookKeeper"), as `python -m tests.pulsar --migrate` and test_bookkeeper_migration.py run it:
bookfleet bookies join the cluster's ZooKeeper (its `/ledgers`, its INSTANCEID in their cookies) beside bookfleet's
auditor and repair runner; then each Java bookie in turn is stopped, its ledgers re-replicated onto bookfleet bookies
by the auditor's marks and the repair runner, and its cookie removed (what BookKeeper's `decommissionbookie` does
last); the topic is unloaded (the broker reopens its ledgers from the metadata repair rewrote) and consumed back."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pulsar

from bookfleet.fleet import BookieFleet
from bookfleet.meta import cookies, layout, zkpaths
from bookfleet.meta import zk as zkclient
from bookfleet.meta.fleetstatus import fleet_status
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.registry import BookieRegistry
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from bookfleet.replication.runner import AutoRecoveryRunner
from tests.pulsar.broker import PulsarBroker
from tests.pulsar.fleet import BookKeeperFleet, bookkeeper_fleet, broker_on
from tests.pulsar.scenario import NAMESPACE, QUIET, Produced, consume, entries_missing_payloads, order_figures, produce

BOOKFLEET_BOOKIES = 3
"""As many as the Java bookies they replace: an E3 ensemble fits on them alone."""
OPEN_GRACE_S = 5.0
"""Before repair fences an open ledger whose current ensemble lost a Java bookie (`--open-grace-s`, 30 s by
default): the ledgers the broker no longer writes (its health check's topic and schema) are closed sooner; a written
one has been replaced in by Pulsar's client long before."""
RATE = 200
"""Messages a second while the fleet moves: enough to keep every partition's ledger written (so the broker replaces
a stopped bookie in its ensemble at once), few enough for a short test."""


@dataclass
class Migration:
    """What a migration runs on: the Java fleet, the broker on it, and bookfleet's bookies, not started yet."""

    fleet: BookKeeperFleet
    broker: PulsarBroker
    ours: BookieFleet


@contextmanager
def migration_setup(directory: Path) -> Iterator[Migration]:
    """Three Java bookies, bookfleet's auto-recovery on their ZooKeeper (its Spark session warms up while the broker
    starts; it has nothing to do until a bookie leaves) and the broker, which stops first."""
    with (bookkeeper_fleet(directory / "bookkeeper", bookies=3) as fleet,
          BookieFleet(fleet.zk, directory / "bookfleet") as ours,
          AutoRecoveryRunner(fleet.zk, poll_interval=0.2, open_grace_s=OPEN_GRACE_S),
          broker_on(directory, fleet.zk) as broker):
        yield Migration(fleet, broker, ours)


def paced(rate: float, stop: threading.Event) -> Iterator[int]:
    """0, 1, 2, ... at `rate` a second until `stop` is set."""
    began = time.monotonic()
    for seq in itertools.count():
        if stop.is_set():
            return
        time.sleep(max(0.0, began + seq / rate - time.monotonic()))
        yield seq


def join(fleet: BookKeeperFleet, ours: BookieFleet) -> None:
    """bookfleet's bookies started on the Java fleet's ZooKeeper; checked to have joined its cluster, not made one."""
    with zkclient.session(fleet.zk) as zk:
        layout_before, instance_id = zk.get(zkpaths.LAYOUT)[0], layout.instance_id(zk)
        ours.start(BOOKFLEET_BOOKIES)
        assert zk.get(zkpaths.LAYOUT)[0] == layout_before
        assert all(cookies.read(zk, bookie.bookie_id).instanceId == instance_id for bookie in ours.bookies)
        assert BookieRegistry(zk).ids() == {bookie.bookie_id for bookie in (*fleet.bookies, *ours.bookies)}


def decommission(zk: str, bookie, timeout: float) -> dict:
    """Stop one Java bookie, wait until no ledger names it and nothing is marked, remove its cookie; the ledgers it
    held and how long that took."""
    with zkclient.session(zk) as session:
        store, under_replication = MetadataStore(session), UnderReplication(session)
        held = store.ledgers_on_bookie(bookie.bookie_id)
        began = time.monotonic()
        bookie.stop()
        wait_for(lambda: not store.ledgers_on_bookie(bookie.bookie_id) and not under_replication.ledger_ids(),
                 timeout=timeout, interval=0.5, what=f"the ledgers of Java bookie {bookie.bookie_id} to move")
        cookies.forget(session, bookie.bookie_id)
    return {"bookie": bookie.bookie_id, "ledgers": held, "seconds": round(time.monotonic() - began, 1)}


def run(migration: Migration, topic: str, partitions: int = 4, step_timeout: float = 180.0) -> dict:
    """The whole migration under a running producer; its figures (JSON-ready)."""
    fleet, broker = migration.fleet, migration.broker
    broker.admin("POST", f"/admin/v2/namespaces/{NAMESPACE}/retention",
                 {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})  # nothing trimmed before it is consumed
    broker.admin("PUT", f"/admin/v2/persistent/{NAMESPACE}/{topic}/partitions", partitions)
    client = pulsar.Client(broker.service_url, logger=QUIET, operation_timeout_seconds=120)
    produced, stop = Produced(), threading.Event()
    producer = threading.Thread(target=produce, args=(client, topic, paced(RATE, stop), {}, produced),
                                name="producer")
    try:
        producer.start()
        produced.last_acked()
        join(fleet, migration.ours)
        began = time.monotonic()
        steps = [decommission(fleet.zk, bookie, step_timeout) for bookie in fleet.bookies]
        migration_seconds = time.monotonic() - began
        stop.set()
        producer.join()
        broker.admin("PUT", f"/admin/v2/persistent/{NAMESPACE}/{topic}/unload")  # reopened from today's metadata
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
        "steps": [{**step, "ledgers": len(step["ledgers"])} for step in steps],
        "ledgers_moved": len({ledger_id for step in steps for ledger_id in step["ledgers"]}),
        "migration_seconds": round(migration_seconds, 1),
        "produce_seconds": round(produced.ended - produced.began, 1),
        "longest_ack_gap_s": round(max(later - earlier for earlier, later in itertools.pairwise(acks)), 1),
        "bookies_holding_ledgers": sorted(by_bookie),
        "bookfleet_bookies": sorted(bookie.bookie_id for bookie in migration.ours.bookies),
        "healthy": status.healthy,
    }
