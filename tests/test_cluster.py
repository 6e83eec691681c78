"""The `cluster` tier: the chart, the operator, bookies and Spark repairs on a real Kubernetes control plane.

A local cluster (tests/cluster: kube-apiserver, controller-manager, scheduler and etcd built from Kubernetes' Go
modules, a process kubelet with one network namespace per pod) is started once per session. The chart is installed
with the real helm binary into a namespace that enforces the restricted Pod Security Standard; the operator runs
with its ServiceAccount's token, so a missing RBAC rule or a rejected pod fails here.
"""

from __future__ import annotations

import pytest

from bookfleet.polling import wait_for
from tests.cluster import walkthrough
from tests.cluster.walkthrough import NAMESPACE, LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]


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
