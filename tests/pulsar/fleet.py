"""A bookfleet standalone fleet run as `bookfleet standalone` runs it (4 bookies, auditor and in-process repair
runner), with one Pulsar broker on it; shared by `make pulsar-demo` and the test. And, for the throughput side by
side, the same broker on 4 of Apache BookKeeper's own bookies from the reference jars."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bookfleet.fleet import StandaloneCluster
from bookfleet.meta import zk as zkclient
from bookfleet.replication.runner import AutoRecoveryRunner
from bookfleet.zkserver import ZooKeeperServer
from tests.interop.javaside import JavaBookie, shell, write_conf
from tests.pulsar.broker import PulsarBroker

BOOKIES = 4
"""Three for each ensemble and one to take a killed bookie's place."""


@contextmanager
def fleet_with_broker(directory: Path) -> Iterator[tuple[StandaloneCluster, PulsarBroker]]:
    with (StandaloneCluster(directory / "fleet", BOOKIES) as cluster,
          AutoRecoveryRunner(cluster.zk, poll_interval=0.2),
          broker_on(directory, cluster.zk) as broker):
        yield cluster, broker


@contextmanager
def broker_on(directory: Path, zk: str) -> Iterator[PulsarBroker]:
    broker = PulsarBroker(directory / "broker", zk)
    broker.initialize_cluster()
    with broker:
        yield broker


@contextmanager
def bookkeeper_fleet_with_broker(directory: Path) -> Iterator[PulsarBroker]:
    """A ZooKeeper of its own, BookKeeper's metadata formatted by its shell, 4 Java bookies (DbLedgerStorage, the
    journal synced as bookfleet's is: `bench/bookkeeper.py`'s settings) and the broker."""
    zookeeper = ZooKeeperServer(directory / "zookeeper").start()
    bookies: list[JavaBookie] = []
    try:
        shell(write_conf(directory / "admin.conf", zookeeper.connect), "initnewcluster")
        with zkclient.session(zookeeper.connect) as session:
            bookies = [JavaBookie(directory / f"bookie-{n}", zookeeper.connect).start(session) for n in range(BOOKIES)]
        with broker_on(directory, zookeeper.connect) as broker:
            yield broker
    finally:
        for bookie in bookies:
            bookie.stop()
        zookeeper.stop()
