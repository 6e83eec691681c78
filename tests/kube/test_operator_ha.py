"""Two operator replicas as the chart runs them (`--peering`, random priorities): exactly one acts, and when it is
killed -9 the other takes over once the leader's peering heartbeat expires."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bookfleet import polling
from bookfleet.kube import crdgen
from tests.emulator import EmulatorThread
from tests.fixtures.kube import NS, REPO
from tests.fixtures.models import bookie_cluster_manifest

PEERING = "bookfleet"
ACTING = "Resuming operations after the pause"
PAUSED = "Pausing operations in favour of"
"""kopf starts a peered replica paused, logs ACTING when it finds itself the highest priority alive, and PAUSED when
a higher one appears later."""
PEERING_LIFETIME = 15
"""The replicas' `--peering-lifetime` (kopf's default is 60): a replica killed -9 counts as gone this long after its
last heartbeat."""


class Replica:
    """One operator replica (`bookfleet operator --peering`), its output in a log file."""

    def __init__(self, kube: EmulatorThread, name: str, log: Path, priority: int | None = None):
        self.name, self.log = name, log
        env = {**os.environ, "PYTHONPATH": str(REPO), "POD_ID": name}  # kopf's peering identity, as the chart sets
        chosen = ["--priority", str(priority)] if priority is not None else []
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bookfleet", "operator", "--namespace", NS, "--peering", PEERING, *chosen,
                 "--kubeconfig", str(kube.kubeconfig), "--interval", "0.5",
                 "--peering-lifetime", str(PEERING_LIFETIME)],
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env,
            )

    def acting(self) -> bool:
        """Whether kopf's last peering decision in this replica was to act."""
        lines = self.log.read_text(errors="replace").splitlines()
        decisions = [line for line in lines if ACTING in line or PAUSED in line]
        return bool(decisions) and ACTING in decisions[-1]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture
def peering(kube: EmulatorThread, tmp_path: Path) -> Iterator[list[Replica]]:
    """The peering CRD and object as the chart installs them; the replicas a test starts go in the list."""
    kube.create("customresourcedefinitions", yaml.safe_load(crdgen.crd_files()["kopf.dev_kopfpeerings.yaml"]))
    kube.create("kopfpeerings", {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                 "metadata": {"name": PEERING, "namespace": NS}})
    started: list[Replica] = []
    try:
        yield started
    finally:
        for replica in started:
            replica.stop(signal.SIGKILL)


@pytest.fixture
def replicas(peering: list[Replica], kube: EmulatorThread, tmp_path: Path) -> list[Replica]:
    """Two replicas with random priorities, as the chart runs them."""
    peering += [Replica(kube, f"operator-{i}", tmp_path / f"operator-{i}.log") for i in range(2)]
    return peering


def test_exactly_one_replica_acts_and_the_other_takes_over_from_a_killed_leader(replicas, kube, zk_connect) -> None:
    peers = lambda: (kube.get("kopfpeerings", NS, PEERING) or {}).get("status") or {}  # noqa: E731
    polling.wait_for(lambda: len(peers()) == 2, 120, "both replicas in the KopfPeering")
    priorities = {name: peer["priority"] for name, peer in peers().items()}
    assert priorities.keys() == {"operator-0", "operator-1"}
    assert len(set(priorities.values())) == 2, "random priorities never tie"
    leader, follower = sorted(replicas, key=lambda replica: priorities[replica.name], reverse=True)
    polling.wait_for(lambda: leader.acting() and not follower.acting(), 120, "only the top priority acting")

    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, replicas=1))
    polling.wait_for(lambda: kube.get("bookies", NS, "bk-0"), 120, "the leader creates the Bookie")
    assert not follower.acting(), "the other replica stays paused"

    leader.stop(signal.SIGKILL)
    second = {**bookie_cluster_manifest(zk_connect, replicas=1), "metadata": {"name": "bk2", "namespace": NS}}
    kube.create("bookieclusters", second)
    polling.wait_for(lambda: kube.get("bookies", NS, "bk2-0"), PEERING_LIFETIME + 180,
                     "the follower takes over after the leader's heartbeat expires")
    assert follower.acting()


def test_a_replica_that_acts_again_after_a_pause_sees_pods_deleted_while_it_was_paused_as_gone(
        peering, kube, zk_connect, tmp_path) -> None:
    """A acts, then pauses for B (a higher priority, as in a rolling upgrade); meanwhile the bookie's pod is deleted
    and B makes a new one. B stops, A acts again, and the new pod is deleted too: A must make a third. A cache fed
    only by watch events (kopf's indexes: kopf stops its watches while a replica is paused) still holds the first
    pod, which A then waits on for ever."""
    first = Replica(kube, "operator-a", tmp_path / "operator-a.log", priority=1)
    peering.append(first)
    polling.wait_for(first.acting, 120, "A acting alone")
    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, replicas=1))
    pod_uid = lambda: ((kube.get("pods", NS, "bk-0") or {}).get("metadata") or {}).get("uid")  # noqa: E731
    seen = [polling.wait_for(pod_uid, 120, "A makes the bookie's pod")]

    second = Replica(kube, "operator-b", tmp_path / "operator-b.log", priority=2)
    peering.append(second)
    polling.wait_for(lambda: second.acting() and not first.acting(), 120, "A paused in favour of B")
    for acting in (second, first):
        assert acting.acting()
        kube.delete("pods", NS, "bk-0")
        seen.append(polling.wait_for(lambda: (uid := pod_uid()) not in seen and uid, 120,
                                     f"{acting.name} makes a new pod for the deleted one"))
        if acting is second:
            second.stop()  # SIGTERM: it leaves the peering, and A acts again at once
            polling.wait_for(first.acting, 120, "A acting again")
    assert len(set(seen)) == 3
