"""Fault isolation: one cluster's ZooKeeper stopped delays only that cluster. The real operator against the emulator,
two real ZooKeepers and real bookie processes."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookfleet.meta.underreplication import UnderReplication
from bookfleet.zkserver import ZooKeeperServer
from tests.emulator import EmulatorThread
from tests.fixtures.kube import NS, adopt_ledger, status, wait_for
from tests.fixtures.models import bookie_cluster_manifest
from tests.fixtures.podrunner import PodRunner

SICK_BOOKIES = min(32, (os.cpu_count() or 1) + 4) + 2
"""More Bookies than the threads of Python's default pool, where every pass of every cluster used to run: each of the
sick cluster's loops held one of them for as long as its ZooKeeper stayed away."""


@contextlib.contextmanager
def down(server: ZooKeeperServer, fault: str) -> Iterator[None]:
    """`stopped`: the server process ends (connections refused); `frozen`: SIGSTOP, connections accepted by the kernel
    and never answered (a hung JVM, a partition that drops packets), resumed only to be stopped at the end."""
    if fault == "stopped":
        server.stop()
        yield
        return
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)


def pod_uid(kube: EmulatorThread, name: str) -> str | None:
    return (kube.get("pods", NS, name) or {}).get("metadata", {}).get("uid")


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
def test_one_clusters_zookeeper_down_delays_no_other_cluster(fault, kube, podrunner: PodRunner, operator_process,
                                                             zk_connect, zk, tmp_path: Path):
    """Cluster `other` on a ZooKeeper of its own, its pods held Pending (never registered: its Bookies are passed at
    every interval). With that ZooKeeper stopped or frozen, a bookie pod of cluster `bk` is deleted: the pod is made
    again and its ledgers marked while `other`'s ZooKeeper is still down; and `other`'s own pod deaths are noticed
    and its pods made again, which needs no ZooKeeper."""
    podrunner.held.add("other")
    with ZooKeeperServer(tmp_path / "zk-other") as other_zk:
        kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, delay=0))
        kube.create("bookieclusters", bookie_cluster_manifest(other_zk.connect, replicas=SICK_BOOKIES, name="other"))
        wait_for("3 bookies running", lambda: all(status(kube, "bookies", f"bk-{i}").get("phase") == "Running"
                                                  for i in range(3)))
        sick = [f"other-{i}" for i in range(SICK_BOOKIES)]
        wait_for("the other cluster's Bookies passed with their ZooKeeper", lambda: all(
            status(kube, "bookies", name).get("phase") == "Pending" and pod_uid(kube, name) for name in sick))
        ledger = adopt_ledger(kube, zk_connect)
        victim = ledger["segments"][0]["bookies"][0].split(".")[0]
        podrunner.held.add(victim)  # its new pod never registers: the lost-bookie rule marks its ledgers

        with down(other_zk, fault):  # all that follows happens while it is down
            sick_uids = {name: pod_uid(kube, name) for name in sick}
            for name in sick:
                kube.delete("pods", NS, name)
            victim_uid = pod_uid(kube, victim)
            kube.delete("pods", NS, victim)

            wait_for("the healthy cluster's loss recorded", lambda: status(kube, "bookies", victim).get("lostSince"))
            wait_for("its pod made again", lambda: pod_uid(kube, victim) not in (None, victim_uid))
            wait_for("its ledgers marked", lambda: ledger["ledgerId"] in UnderReplication(zk).ledger_ids())

            wait_for("the sick cluster's losses recorded without its ZooKeeper", lambda: all(
                status(kube, "bookies", name).get("lostSince") for name in sick))
            wait_for("its pods made again on their volumes", lambda: all(
                pod_uid(kube, name) not in (None, sick_uids[name]) for name in sick))
