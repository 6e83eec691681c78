"""The `cluster` tier: the chart, the operator, bookies and Spark repairs on a real Kubernetes control plane.

A local cluster (tests/cluster: kube-apiserver, controller-manager, scheduler and etcd built from Kubernetes' Go
modules, a process kubelet with one network namespace per pod) is started once per session. The chart is installed
with the real helm binary into a namespace that enforces the restricted Pod Security Standard; the operator runs
with its ServiceAccount's token, so a missing RBAC rule or a rejected pod fails here.
"""

from __future__ import annotations

import json

import pytest

from bookfleet.kube.repairs import ANNOTATION_LEDGERS
from bookfleet.polling import wait_for
from tests.cluster import walkthrough
from tests.cluster.walkthrough import NAMESPACE, LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]
ENTRIES = 50


@pytest.fixture(scope="module")
def installed(local_cluster: LocalCluster) -> LocalCluster:
    walkthrough.install(local_cluster)
    return local_cluster


def test_helm_install_runs_three_bookies_one_per_zone(installed: LocalCluster):
    cluster = installed
    zones = {node["metadata"]["name"]: node["metadata"]["labels"]["topology.kubernetes.io/zone"]
             for node in cluster.get("nodes")["items"]}
    pods = walkthrough.bookie_pods(cluster)
    assert sorted(zones[pod["spec"]["nodeName"]] for pod in pods) == ["zone-a", "zone-b", "zone-c"]
    assert len({pod["status"]["podIP"] for pod in pods}) == 3
    operator = cluster.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=operator")["items"]
    assert operator and {pod["spec"]["serviceAccountName"] for pod in operator} == {"bookfleet"}
    assert any(map(walkthrough.ready, operator))
    # Its ServiceAccount is refused nothing it asks for (kopf scans no namespaces when it serves named ones).
    for pod in operator:
        assert "Forbidden" not in cluster.container_log(NAMESPACE, pod["metadata"]["name"], "operator")
    bookies = cluster.get("bookies", "-n", NAMESPACE)["items"]
    assert sorted(b.get("status", {}).get("phase") for b in bookies) == ["Running"] * 3
    # Defaults come from the CRD's schema on the server, not from the example file.
    assert cluster.get("bookiecluster", "-n", NAMESPACE, "demo")["spec"]["antiAffinity"] == "preferred"


def test_bookie_pod_returning_within_the_delay_is_not_repaired(installed: LocalCluster):
    cluster = installed
    cluster.kubectl("patch", "bookiecluster", "-n", NAMESPACE, "demo", "--type", "merge",
                    "-p", '{"spec": {"autoRecovery": {"lostBookieRecoveryDelaySeconds": 600}}}')
    victim = walkthrough.bookie_pods(cluster)[0]
    name, old_uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=false")

    def back() -> bool:
        pods = [p for p in walkthrough.bookie_pods(cluster) if p["metadata"]["name"] == name]
        bookie = cluster.get("bookie", "-n", NAMESPACE, name).get("status", {})
        return bool(pods) and pods[0]["metadata"]["uid"] != old_uid and walkthrough.ready(pods[0]) \
            and bookie.get("phase") == "Running" and not bookie.get("lostSince")

    wait_for(back, timeout=600, what=f"bookie {name} back on its volumes", interval=2.0)
    assert cluster.get("jobs", "-n", NAMESPACE, "-l", walkthrough.REPAIR_SELECTOR)["items"] == []


def test_lost_bookie_is_repaired_by_spark_on_kubernetes(installed: LocalCluster):
    """Pod and PVCs deleted -> marked -> repair Job -> spark-submit --master k8s:// -> executor pods on their own
    IPs connecting back to the driver pod's IP -> Ledger healthy -> every entry reads back."""
    cluster = installed
    outcome = walkthrough.closed_loop(cluster, ENTRIES)
    print(f"pod deletion to healthy Ledger: {outcome.seconds_to_healthy:.0f} s")

    repair = outcome.repair
    assert repair.job and repair.driver_ip and repair.executors
    assert all(f"@{repair.driver_ip}:" in e["driver_url"] for e in repair.executors.values())
    assert len({e["ip"] for e in repair.executors.values()} | {repair.driver_ip}) == len(repair.executors) + 1
    [container] = cluster.get("job", "-n", NAMESPACE, repair.job)["spec"]["template"]["spec"]["containers"]
    command = container.get("command", []) + container.get("args", [])
    assert command[command.index("--master") + 1].startswith("k8s://")
    assert [e["entry_id"] for e in outcome.read_back] == list(range(ENTRIES))
    assert [e["payload"] for e in outcome.read_back] == [f"{i:032d}" for i in range(ENTRIES)]


def test_bookie_on_a_failed_node_is_repaired_then_replaced_on_a_live_node(installed: LocalCluster):
    """A node stops (no heartbeats, its processes killed): the node lifecycle controller marks its pods not Ready, the
    operator counts the bookie lost (NodeLost), repairs its ledgers, then force-deletes the pod its dead kubelet would
    never confirm and starts a fresh bookie. Last in the module: the node stays failed."""
    cluster = installed
    outcome = walkthrough.node_failure(cluster, ENTRIES)
    print(f"node failure: {json.dumps(outcome.figures())}")

    lost = outcome.lost_condition
    assert lost["reason"] == "NodeLost" and outcome.node in lost["message"]
    ledgers = outcome.job["metadata"]["annotations"][ANNOTATION_LEDGERS].split(",")
    assert str(outcome.ledger_id) in ledgers  # marked before the Job was created
    assert outcome.job["status"].get("succeeded")
    assert outcome.seconds["repair_job_created"] <= outcome.seconds["ledger_healthy"]
    fresh = outcome.fresh_pod
    assert fresh["spec"]["nodeName"] != outcome.node and walkthrough.ready(fresh)
    expected = {"BookieLost", "RepairLaunched", "RepairSucceeded", "PodForceDeleted", "BookieReplaced"}
    assert expected <= set(outcome.events)
    assert [e["entry_id"] for e in outcome.read_back] == list(range(ENTRIES))
