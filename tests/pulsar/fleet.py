"""A bookfleet standalone fleet run as `bookfleet standalone` runs it (4 bookies, auditor and in-process repair
runner), with one Pulsar broker on it; shared by `make pulsar-demo` and the test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bookfleet.fleet import StandaloneCluster
from bookfleet.replication.runner import AutoRecoveryRunner
from tests.pulsar.broker import PulsarBroker

BOOKIES = 4
"""Three for each ensemble and one to take a killed bookie's place."""


@contextmanager
def fleet_with_broker(directory: Path) -> Iterator[tuple[StandaloneCluster, PulsarBroker]]:
    with StandaloneCluster(directory / "fleet", BOOKIES) as cluster, AutoRecoveryRunner(cluster.zk, poll_interval=0.2):
        broker = PulsarBroker(directory / "broker", cluster.zk)
        broker.initialize_cluster()
        with broker:
            yield cluster, broker
