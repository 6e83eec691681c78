"""A bookfleet standalone fleet run as `bookfleet standalone` runs it (4 bookies, auditor and in-process repair
runner), with one Pulsar broker on it; shared by `make pulsar-demo` and the test. And, for the throughput side by
side, the same broker on 4 of Apache BookKeeper's own bookies from the reference jars."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from bookfleet.fleet import StandaloneCluster
from bookfleet.meta import zk as zkclient
from bookfleet.replication.runner import AutoRecoveryRunner
from bookfleet.zkserver import ZooKeeperServer
from tests.interop.javaside import JavaBookie, shell, started_side_by_side, write_conf
from tests.pulsar.broker import PulsarBroker

BOOKIES = 4
"""Three for each ensemble and one to take a killed bookie's place."""


@contextmanager
def fleet_with_broker(directory: Path, auto_recovery: bool = True) -> Iterator[tuple[StandaloneCluster, PulsarBroker]]:
    """Without `auto_recovery` for the throughput side by side: the Java bookies there run no AutoRecovery either."""
    with (StandaloneCluster(directory / "fleet", BOOKIES) as cluster,
          AutoRecoveryRunner(cluster.zk, poll_interval=0.2) if auto_recovery else nullcontext(),
          broker_on(directory, cluster.zk) as broker):
        yield cluster, broker


@contextmanager
def broker_on(directory: Path, zk: str) -> Iterator[PulsarBroker]:
    broker = PulsarBroker(directory / "broker", zk)
    broker.initialize_cluster()
    with broker:
        yield broker


@dataclass
class BookKeeperFleet:
    """A ZooKeeper formatted by BookKeeper's shell and Java bookies registered under its `/ledgers`."""

    zk: str
    bookies: list[JavaBookie]


@contextmanager
def bookkeeper_fleet(directory: Path, bookies: int = BOOKIES) -> Iterator[BookKeeperFleet]:
    """A ZooKeeper of its own, BookKeeper's metadata formatted by its shell and `bookies` Java bookies
    (DbLedgerStorage, the journal synced as bookfleet's is: `bench/bookkeeper.py`'s settings)."""
    zookeeper = ZooKeeperServer(directory / "zookeeper").start()
    java_bookies = [JavaBookie(directory / f"bookie-{n}", zookeeper.connect) for n in range(bookies)]
    try:
        shell(write_conf(directory / "admin.conf", zookeeper.connect), "initnewcluster")
        with zkclient.session(zookeeper.connect) as session:
            started_side_by_side(java_bookies, session)
        yield BookKeeperFleet(zookeeper.connect, java_bookies)
    finally:
        for bookie in java_bookies:
            bookie.stop()
        zookeeper.stop()


@contextmanager
def bookkeeper_fleet_with_broker(directory: Path) -> Iterator[PulsarBroker]:
    """4 Java bookies and the broker."""
    with bookkeeper_fleet(directory) as fleet, broker_on(directory, fleet.zk) as broker:
        yield broker
