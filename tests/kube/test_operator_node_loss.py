"""Node failure is pod death too: the real operator against the emulator, real ZooKeeper and real bookie
processes. The test plays the dead node (its bookie killed, no kubelet reporting) and the node lifecycle controller
(node Ready Unknown, the pod marked not Ready)."""

from __future__ import annotations

import asyncio
import time

from bookfleet.meta import zkpaths
from tests.fixtures.kube import NS, adopt_ledger, condition, read_ledger, status, wait_for
from tests.fixtures.models import bookie_cluster_manifest

NODE = "node-a"


def now_text() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def ready(value: str) -> dict:
    return {"conditions": [{"type": "Ready", "status": value, "lastTransitionTime": now_text()}]}


def claim_uids(kube, victim: str) -> dict[str, str]:
    return {c["metadata"]["name"]: c["metadata"]["uid"] for c in kube.list("persistentvolumeclaims", NS)
            if c["metadata"]["name"].startswith(f"{victim}-")}


def test_bookie_on_a_dead_node_is_repaired_kept_until_the_node_is_deleted_then_force_replaced(
        kube, podrunner, operator_process, zk_connect, zk):
    kube.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    kube.patch("nodes", None, NODE, {"status": ready("True")}, subresource="status")
    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, delay=1))
    wait_for("3 bookies running", lambda: all(status(kube, "bookies", f"bk-{i}").get("phase") == "Running"
                                              for i in range(3)))
    ledger = adopt_ledger(kube, zk_connect)
    ledger_id = ledger["ledgerId"]
    victim_id = ledger["segments"][0]["bookies"][0]
    victim = victim_id.split(".")[0]

    # The victim runs on NODE, which dies: no kubelet confirms anything any more, so its pod stays.
    stuck_uid = kube.patch("pods", NS, victim, {"spec": {"nodeName": NODE}})["metadata"]["uid"]
    podrunner.node_lost(NS, victim)
    kube.patch("nodes", None, NODE, {"status": ready("Unknown")}, subresource="status")
    kube.patch("pods", NS, victim, {"status": {"phase": "Running", **ready("False")}}, subresource="status")

    lost = wait_for("NodeLost", lambda: (c := condition(status(kube, "bookies", victim), "Lost")).get("reason")
                    == "NodeLost" and c)
    assert NODE in lost["message"]
    job = wait_for("repair job", lambda: kube.list("jobs", NS))[0]
    assert kube.get("pods", NS, victim)["metadata"]["uid"] == stuck_uid  # not replaced before its ledgers are safe

    claims = claim_uids(kube, victim)
    wait_for("repair finished", lambda: (kube.get("jobs", NS, job["metadata"]["name"]).get("status") or {})
             .get("completionTime"), timeout=120)
    # The node may return with the bookie's data (an outage, a partition): pod and volumes are kept meanwhile.
    wait_for("volumes kept", lambda: "VolumesKept" in [e["reason"] for e in kube.list("events", NS)
                                                       if e["involvedObject"]["name"] == victim], timeout=60)
    assert condition(status(kube, "bookies", victim), "Repaired")["status"] == "True"
    assert status(kube, "bookies", victim).get("phase") == "Lost"
    assert kube.get("pods", NS, victim)["metadata"]["uid"] == stuck_uid and claim_uids(kube, victim) == claims
    kube.delete("nodes", None, NODE)  # gone for good: only now is the bookie replaced
    wait_for("fresh pod running", lambda: (pod := kube.get("pods", NS, victim)) and pod["metadata"]["uid"] != stuck_uid
             and status(kube, "bookies", victim).get("phase") == "Running", timeout=60)
    healed = wait_for("ledger healthy", lambda: (s := status(kube, "ledgers", "adopted")).get("repair", {})
                      .get("state") == "Succeeded" and not s.get("underReplicated") and s, timeout=60)
    assert all(victim_id not in segment["bookies"] for segment in healed["segments"])
    assert asyncio.run(read_ledger(zk_connect, ledger_id)) == [f"entry-{i}".encode() for i in range(20)]
    bookie = status(kube, "bookies", victim)
    assert condition(bookie, "Repaired")["status"] == "True" and not bookie.get("lostSince")
    assert zk.exists(zkpaths.cookie(victim_id))  # a fresh cookie from the empty bookie
    assert [j["metadata"]["name"] for j in kube.list("jobs", NS)] == [job["metadata"]["name"]]
    assert not set(claim_uids(kube, victim).values()) & set(claims.values())  # fresh volumes
    reasons = [e["reason"] for e in kube.list("events", NS) if e["involvedObject"]["name"] == victim]
    assert {"BookieLost", "RepairLaunched", "RepairSucceeded", "PodForceDeleted", "BookieReplaced"} <= set(reasons)
    assert reasons.count("BookieLost") == 1
