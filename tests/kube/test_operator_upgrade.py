"""An operator upgrade on a running fleet, with the real operator (`bookfleet operator`, kopf) against the emulator,
real ZooKeeper and real bookie processes: a restart that changes nothing a bookie runs restarts no bookie, and a new
bookie image rolls the clusters that take the operator's image one cluster at a time."""

from __future__ import annotations

from bookfleet.kube import resources
from tests.fixtures.kube import NS, condition, status, wait_for
from tests.fixtures.models import bookie_cluster_manifest

CLUSTERS = ("first", "second")
NEW_REPOSITORY = "registry.example/bookfleet/bookie"


def pods_of(kube, cluster: str) -> list[dict]:
    return kube.list("pods", NS, f"{resources.LABEL_CLUSTER}={cluster}")


def ready(pod: dict) -> bool:
    return condition(pod.get("status") or {}, "Ready").get("status") == "True" and not pod["metadata"].get(
        "deletionTimestamp")


def test_an_operator_upgrade_rolls_one_cluster_at_a_time_and_a_plain_restart_rolls_nothing(
        kube, podrunner, operator_process, zk_connect):
    for name in CLUSTERS:
        kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, replicas=2, name=name))
    wait_for("both clusters ready", lambda: all(status(kube, "bookieclusters", name).get("updatedBookies") == 2
                                                for name in CLUSTERS), timeout=120)
    uids = {p["metadata"]["uid"] for name in CLUSTERS for p in pods_of(kube, name)}

    operator_process.kill()  # the same operator again: nothing a bookie runs changed
    operator_process.start()
    wait_for("a pass of each cluster by the restarted operator",
             lambda: all(operator_process.metric("bookfleet_operator_reconciles_total", resource="bookieclusters",
                                                 bookiecluster=name) >= 3 for name in CLUSTERS))
    assert {p["metadata"]["uid"] for name in CLUSTERS for p in pods_of(kube, name)} == uids

    operator_process.kill()  # an operator whose own bookie image is new: clusters naming none roll to it
    operator_process.start("--bookie-image", NEW_REPOSITORY)
    moving: set[tuple[str, ...]] = set()

    def upgraded() -> bool:
        pods = {name: pods_of(kube, name) for name in CLUSTERS}
        done = {name: len(found) == 2 and all(ready(p) and p["spec"]["containers"][0]["image"].startswith(
            NEW_REPOSITORY) for p in found) for name, found in pods.items()}
        untouched = {name: {p["metadata"]["uid"] for p in found} <= uids and len(found) == 2 and all(map(ready, found))
                     for name, found in pods.items()}
        moving.add(tuple(name for name in CLUSTERS if not done[name] and not untouched[name]))
        return all(done.values())

    wait_for("both clusters on the new operator's image", upgraded, interval=0.05, timeout=180)
    assert max(map(len, moving)) == 1, f"clusters rolled together: {sorted(moving)}"
