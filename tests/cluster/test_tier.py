"""The `cluster` tier: the chart, the operator, bookies and Spark repairs on a real Kubernetes control plane.

A local cluster (tests/cluster: kube-apiserver, controller-manager, scheduler and etcd built from Kubernetes' Go
modules; kubelets on containerd running our images, or a process kubelet where containerd cannot run) is started once
per session. The chart is installed with the real helm binary into a namespace that enforces the restricted Pod
Security Standard; the operator runs with its ServiceAccount's token, so a missing RBAC rule, a rejected pod or a
defect only the shipped images have fails here.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from bookfleet.kube import resources
from bookfleet.kube.reconcilers import repairs
from bookfleet.kube.reconcilers.clusters import ANNOTATION_RELEASED
from bookfleet.kube.resources import quantity_bytes
from bookfleet.meta import zk, zkpaths
from bookfleet.polling import wait_for
from tests.cluster import __main__ as cluster_main
from tests.cluster import bigbookie, realnode, walkthrough, zoneloss
from tests.cluster.controlplane import SERVICE_IP
from tests.cluster.walkthrough import NAMESPACE, LocalCluster
from tests.fixtures.promql import metric_names

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]
ENTRIES = 50
MISSING_IMAGE = "registry.invalid/bookfleet/missing:0"
LONG = "BOOKFLEET_CLUSTER_LONG"
"""Set by `make test-cluster`: the tier's long forms run too (each costs minutes; `make test` keeps the short ones)."""


def test_helm_install_runs_three_bookies_one_per_zone(installed: LocalCluster):
    cluster = installed
    zones = {node["metadata"]["name"]: node["metadata"]["labels"]["topology.kubernetes.io/zone"]
             for node in cluster.get("nodes")["items"]}
    pods = walkthrough.bookie_pods(cluster)
    assert sorted(zones[pod["spec"]["nodeName"]] for pod in pods) == ["zone-a", "zone-b", "zone-c"]
    assert len({pod["status"]["podIP"] for pod in pods}) == 3
    operator = operator_pods(cluster)
    assert operator and {pod["spec"]["serviceAccountName"] for pod in operator} == {"bookfleet"}
    assert any(map(walkthrough.ready, operator))
    if cluster.real_node():  # as users run them: images built from Dockerfiles, in containers on kubelets
        zookeeper = cluster.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=zookeeper")["items"]
        system = [walkthrough.where_it_ran(pod) for pod in operator + zookeeper]
        assert all(r["node"] == realnode.NAME and r["container_id"].startswith("containerd://") for r in system)
        assert {r["image"].rsplit(":", 1)[0] for r in system} == {"bookfleet/operator",
                                                                 "localhost/bookfleet/zookeeper"}, system
        bookies = [walkthrough.where_it_ran(pod) for pod in pods]  # the chart's and CRD's default image names
        assert all(r["container_id"].startswith("containerd://") and r["node"] != realnode.NAME
                   and r["image"] == realnode.published_reference("bookie") for r in bookies), bookies
    # Its ServiceAccount is refused nothing it asks for (kopf scans no namespaces when it serves named ones); on the
    # real node its log comes through `kubectl logs` (the API server to the kubelet's serving certificate).
    for pod in operator:
        log = cluster.container_log(NAMESPACE, pod["metadata"]["name"], "operator")
        assert "Activity 'start_caches' succeeded" in log and "Forbidden" not in log, log[-3000:]
    bookies = cluster.get("bookies", "-n", NAMESPACE)["items"]
    assert sorted(b.get("status", {}).get("phase") for b in bookies) == ["Running"] * 3
    # Defaults come from the CRD's schema on the server, not from the example file.
    assert cluster.get("bookiecluster", "-n", NAMESPACE, "demo")["spec"]["antiAffinity"] == "preferred"
    # A drain may take one bookie (and one ZooKeeper server) at a time; every bookie asks for what it needs.
    budgets = {pdb["metadata"]["name"]: pdb["spec"] for pdb in cluster.get("pdb", "-n", NAMESPACE)["items"]}
    assert budgets["demo-bookies"]["minAvailable"] == 2 and budgets["bookfleet-zookeeper"]["maxUnavailable"] == 1
    assert all(pod["spec"]["containers"][0]["resources"]["requests"] for pod in pods)
    # The columns that answer the first questions on call.
    for kind, columns in (("bookieclusters", ["READY", "DESIRED", "UPDATED", "PHASE"]),
                          ("bookies", ["PHASE", "REGISTERED", "ZONE", "LEDGERS", "LOST SINCE"]),
                          ("ledgers", ["STATE", "UNDER-REPLICATED", "REPAIR", "DATA LOSS"])):
        header = cluster.kubectl("get", kind, "-n", NAMESPACE).splitlines()[0]
        assert all(column in header for column in columns), header


OTHER = "other"
"""A second BookieCluster beside the example's: one bookie on the same ZooKeeper (its own chroot), its own
credential."""


def test_two_clusters_with_their_own_zookeeper_credentials_work_side_by_side_in_one_operator(
        installed: LocalCluster):
    """The operator opens a ZooKeeper session per (connect string, credential): the second cluster's znodes carry its
    identity, not the example cluster's, its bookie registers, and a ledger is written and read back through it."""
    cluster = installed
    auth = f"{OTHER}:{secrets.token_hex(16)}"
    demo_auth = base64.b64decode(cluster.get("secret", "-n", NAMESPACE, "bookfleet-zk-auth")["data"]["auth"]).decode()
    hosts = zookeeper_with_chroot(cluster, OTHER)
    demo = walkthrough.bookie_cluster(cluster).spec
    manifests = one_bookie_cluster(OTHER, auth, {"image": demo.image, "zookeeper": f"{demo.zookeeper}/{OTHER}"})
    ledger = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
              "metadata": {"name": OTHER, "namespace": NAMESPACE},
              "spec": {"cluster": OTHER, "ensembleSize": 1, "writeQuorum": 1, "ackQuorum": 1}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
    try:
        wait_for(lambda: [(b.get("status") or {}).get("phase") for b in cluster.get("bookies", "-n", NAMESPACE)["items"]
                          if b["metadata"]["name"] == f"{OTHER}-0"] == ["Running"],
                 timeout=300, what=f"Bookie {OTHER}-0 Running", interval=1.0)
        # Once its bookie is writable: a Ledger refused for want of bookies waits for the feed's resync (10 min).
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(ledger))
        walkthrough.issue_client_certificate(cluster, OTHER)
        ledger_id = walkthrough.write_entries(cluster, 10, OTHER, on=OTHER)
        assert [e["entry_id"] for e in walkthrough.read_entries(cluster, ledger_id, on=OTHER)] == list(range(10))
        # Each cluster's znodes carry its own identity: the ledger the operator created for the second cluster,
        # the first cluster's auto-recovery delay the operator wrote, both clusters' registrations.
        for credential, chroot, paths in ((auth, f"/{OTHER}", (zkpaths.AVAILABLE, zkpaths.ledger(ledger_id))),
                                          (demo_auth, "", (zkpaths.AVAILABLE, zkpaths.UR_RECOVERY_DELAY))):
            with zk.session(hosts + chroot, auth=credential) as session:
                assert session.get_children(zkpaths.AVAILABLE)  # its bookies registered
                for path in paths:
                    acl, _ = session.get_acls(path)
                    assert acl == zk.fleet_acl(credential), (chroot, path, acl)
        assert walkthrough.bookie_pods(cluster) and all(map(walkthrough.ready, walkthrough.bookie_pods(cluster)))
    finally:
        delete_bookie_cluster(cluster, OTHER)


def zookeeper_with_chroot(cluster: LocalCluster, name: str) -> str:
    """The chart's ZooKeeper server by its pod IP, with a chroot `/<name>` made (the administrator's step: the chroot
    a cluster's connect string names); "<ip>:2181"."""
    [server] = cluster.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=zookeeper")["items"]
    hosts = f"{server['status']['podIP']}:2181"
    with zk.session(hosts, auth=zk.NO_AUTH) as admin:
        admin.ensure_path(f"/{name}")
    return hosts


def one_bookie_cluster(name: str, auth: str, spec: dict) -> list[dict]:
    """A BookieCluster `name` of one small bookie in zone-a, without auto-recovery, with its own ZooKeeper credential
    `auth` in a Secret; `spec` adds to or replaces its spec's fields."""
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-zk-auth", "namespace": NAMESPACE},
         "type": "Opaque", "data": {"auth": base64.b64encode(auth.encode()).decode()}},
        {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
         "metadata": {"name": name, "namespace": NAMESPACE},
         "spec": {"replicas": 1, "zones": ["zone-a"],
                  "security": {"zookeeperAuthSecret": f"{name}-zk-auth"},
                  "storage": {"journal": {"size": "1Gi"}, "ledgers": {"size": "1Gi"}},
                  "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                  "autoRecovery": {"enabled": False}, **spec}},
    ]


def delete_bookie_cluster(cluster: LocalCluster, name: str) -> None:
    cluster.kubectl("delete", "ledger,bookiecluster", "-n", NAMESPACE, name, "--ignore-not-found",
                    "--timeout=300s", timeout=330)
    wait_for(lambda: not [b for b in cluster.get("bookies", "-n", NAMESPACE)["items"]
                          if b["metadata"]["name"].startswith(f"{name}-")],
             timeout=300, what=f"the Bookies of {name} gone", interval=1.0)


REAL = "real"
"""A BookieCluster whose one bookie runs on the real node, from the bookie image built from bookie-image/Dockerfile."""


def real_node_or_skip(cluster: LocalCluster) -> dict:
    """The real node's Node object; the test is skipped where this machine cannot run one, and fails where it can
    but the local cluster started none (a real node that broke would otherwise only be skipped)."""
    nodes = [node for node in cluster.get("nodes")["items"] if node["metadata"]["name"] == realnode.NAME]
    if not nodes:
        why = realnode.unavailable(cluster_main.build())
        if why is not None:
            pytest.skip(f"no real node on this machine: {why}")
        pytest.fail("this machine can run a real node, but the local cluster started none (its log's `nodes:` line)")
    return nodes[0]


def test_the_real_node_registers_with_node_credentials_and_runs_a_pod_as_a_container(local_cluster: LocalCluster):
    """The cheap check of the real node that `make test` runs: the kubelet on containerd registered itself (tainted,
    Ready), and a pod that tolerates it runs as a container of the pause image the node already holds, then stops on
    its deletion."""
    cluster = local_cluster
    node = real_node_or_skip(cluster)
    assert walkthrough.ready(node) and node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert {"key": realnode.TAINT, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    # Its credentials are a node's: the Node authorizer gives it its own Node, and no Secret of a pod it does not run.
    as_node = ["kubectl", "--kubeconfig", str(realnode.node_state(cluster.state) / "kubeconfig")]
    assert subprocess.run([*as_node, "get", "node", realnode.NAME], capture_output=True).returncode == 0
    refused = subprocess.run([*as_node, "get", "secret", "-n", "kube-system", "--no-headers"], capture_output=True,
                             text=True)
    assert refused.returncode != 0 and "Forbidden" in refused.stderr, refused.stderr
    pause = realnode.built_image("pause")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "real-node-check", "namespace": "default"},
           "spec": {**realnode.PLACEMENT,
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "pause", "image": pause.reference, "imagePullPolicy": "Never"}]}}
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    wait_for(lambda: walkthrough.ready(cluster.get("pod", "-n", "default", "real-node-check")), timeout=120,
             what="the check pod Ready on the real node", interval=0.5)
    ready_s = time.monotonic() - started
    [status] = cluster.get("pod", "-n", "default", "real-node-check")["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://") and status["image"] == pause.reference
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "-n", "default", "real-node-check", "--timeout=120s", timeout=150)
    print(f"real node: pause pod Ready in {ready_s:.1f} s, deleted and gone in {time.monotonic() - started:.1f} s "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)


SERVICE_PROBE = """
import json, os, socket

def reach(host, port):
    address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    socket.create_connection((address, port), timeout=10).close()
    return address

reached = {"zookeeper": reach("bookfleet-zookeeper.bookfleet.svc", 2181),
           "bookie": reach("demo-0.demo-bookies.bookfleet.svc", 3181),
           "kubernetes": reach("kubernetes.default.svc", 443),
           "service_host": reach(os.environ["KUBERNETES_SERVICE_HOST"], int(os.environ["KUBERNETES_SERVICE_PORT"]))}
with open("/dev/termination-log", "w") as out:
    json.dump(reached, out)
"""
"""What a pod on the real node connects to, by the names the chart and the example give them; its findings (name ->
address) in its termination message."""


def test_a_pod_on_a_real_node_reaches_the_charts_services_by_their_names(installed: LocalCluster):
    """Services on the real nodes as on any cluster: a pod on a zone's node (our bookie image, restricted) resolves
    names through CoreDNS and connects through kube-proxy's rules: ZooKeeper's ClusterIP Service as the example names
    it (on the system node), a bookie by its headless Service, and the API server by `kubernetes.default.svc` and by
    KUBERNETES_SERVICE_HOST, which every in-cluster client (the operator's among them) uses."""
    cluster = installed
    real_node_or_skip(cluster)
    name = "real-node-services"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NAMESPACE, "labels": {resources.CLIENT_LABEL: "true"}},
           "spec": {"restartPolicy": "Never", "securityContext": resources.pod_security_context(),
                    "containers": [{"name": "probe", "image": realnode.published_reference("bookie"),
                                    "imagePullPolicy": "Never",
                                    "command": ["python", "-c", SERVICE_PROBE],
                                    "securityContext": resources.container_security_context()}]}}
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        ended = wait_for(lambda: (p := cluster.get("pod", "-n", NAMESPACE, name))["status"].get("phase") in (
            "Succeeded", "Failed") and p, timeout=120, what="the probe pod on the real node to end", interval=0.5)
        [status] = ended["status"]["containerStatuses"]
        message = status["state"]["terminated"].get("message", "")
        assert ended["status"]["phase"] == "Succeeded", status
        reached = json.loads(message)
        demo_0 = cluster.get("pod", "-n", NAMESPACE, "demo-0")["status"]["podIP"]
        print(f"real node {ended['spec']['nodeName']}: {reached}, {time.monotonic() - started:.1f} s after the apply",
              flush=True)
        assert reached["zookeeper"].startswith("10.96.")  # a ClusterIP: kube-proxy's rules took the connection
        assert reached["bookie"] == demo_0
        assert reached["kubernetes"] == reached["service_host"] == SERVICE_IP
    finally:
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--ignore-not-found", "--wait=false")


@pytest.mark.skipif(not os.environ.get(LONG),
                    reason="about 2 min (image import, two bookie starts): make test-cluster runs it")
def test_a_bookie_from_our_image_runs_in_a_container_on_the_real_node_and_returns_after_its_pod_is_deleted(
        installed: LocalCluster):
    """The kubelet on containerd runs the bookie image in the pod the operator builds (restricted, read-only root,
    uid 10001): it registers with ZooKeeper and gets Ready; its pod deleted, it stops and comes back Ready in a new
    pod on its volumes. Figures (image import, pod Ready, stop after SIGTERM) are printed, not asserted."""
    cluster = installed
    real_node_or_skip(cluster)
    image = realnode.built_image("bookie")
    imported_s = realnode.import_image(realnode.socket_of(realnode.node_state(cluster.state)), image)
    hosts = zookeeper_with_chroot(cluster, REAL)
    auth = f"{REAL}:{secrets.token_hex(16)}"
    manifests = one_bookie_cluster(REAL, auth, {
        "image": image.reference, "imagePullPolicy": "Never", "zookeeper": f"{hosts}/{REAL}",
        "podTemplate": realnode.PLACEMENT})

    def running(old_uid: str = "") -> dict | None:
        pods = [pod for pod in cluster.get("pods", "-n", NAMESPACE, "-l", f"bookfleet.io/cluster={REAL}")["items"]
                if pod["metadata"]["uid"] != old_uid and not pod["metadata"].get("deletionTimestamp")]
        phases = [(b.get("status") or {}).get("phase") for b in cluster.get("bookies", "-n", NAMESPACE)["items"]
                  if b["metadata"]["name"] == f"{REAL}-0"]
        return pods[0] if len(pods) == 1 and walkthrough.ready(pods[0]) and phases == ["Running"] else None

    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
    try:
        pod = wait_for(running, timeout=300, what=f"Bookie {REAL}-0 Running in a Ready pod", interval=1.0)
        ready_s = time.monotonic() - started
        [status] = pod["status"]["containerStatuses"]
        assert pod["spec"]["nodeName"] == realnode.NAME and status["containerID"].startswith("containerd://")
        assert status["image"] == image.reference and pod["spec"]["containers"][0]["imagePullPolicy"] == "Never"
        with zk.session(f"{hosts}/{REAL}", auth=auth) as session:
            assert session.get_children(zkpaths.AVAILABLE)  # registered from inside the container
        started = time.monotonic()
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, pod["metadata"]["name"], "--timeout=120s", timeout=150)
        stopped_s = time.monotonic() - started
        again = wait_for(lambda: running(pod["metadata"]["uid"]), timeout=300,
                         what=f"Bookie {REAL}-0 Running again in a new Ready pod", interval=1.0)
        back_s = time.monotonic() - started
        assert again["spec"]["nodeName"] == realnode.NAME
        print(f"real node: {image.reference} imported in {imported_s:.1f} s; apply to Ready and Running "
              f"{ready_s:.1f} s; pod deleted and gone in {stopped_s:.1f} s; back Ready in {back_s:.1f} s "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        delete_bookie_cluster(cluster, REAL)


REPAIR_ACCOUNT = "system:serviceaccount:bookfleet:bookfleet-repair"


def test_the_repair_account_may_delete_a_repair_pod_but_never_a_bookie(installed: LocalCluster):
    """RBAC lets the repair account delete any pod of the namespace; the chart's ValidatingAdmissionPolicy confines it
    to repair pods (its Spark executors). The bookie's deletion is a server-side dry run: admission judges it, and
    nothing is deleted if the policy is missing."""
    cluster = installed
    bookie = walkthrough.bookie_pods(cluster)[0]["metadata"]["name"]
    with pytest.raises(AssertionError, match="may change or delete only repair pods"):
        cluster.kubectl("--as", REPAIR_ACCOUNT, "delete", "pod", "-n", NAMESPACE, bookie, "--dry-run=server")
    executor = walkthrough.parked_repair_pod(cluster, "parked-executor")
    cluster.kubectl("--as", REPAIR_ACCOUNT, "delete", "pod", "-n", NAMESPACE, executor, "--wait=false")
    assert not cluster.get("pods", "-n", NAMESPACE, "--field-selector", f"metadata.name={executor}")["items"] or \
        cluster.get("pod", "-n", NAMESPACE, executor)["metadata"].get("deletionTimestamp")


PULSAR_BROKERS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pulsar"}},
                  "podSelector": {"matchLabels": {"component": "broker"}}}
NOBODY = {"podSelector": {"matchLabels": {"bookfleet.io/nobody": "true"}}}


def test_an_operator_upgrade_and_a_spec_change_reach_the_owned_service_and_policy_and_undo_drift(
        installed: LocalCluster):
    """The bookies' Service and NetworkPolicy as an older operator (or a hand) left them: not publishing not-ready
    bookies, the bookie port open to nobody. A spec change adds Pulsar brokers as clients and `helm upgrade` rolls the
    operator; its server-side apply on every pass (the old replicas' or the new ones') brings both objects to what
    this version and the spec say."""
    cluster = installed
    service, policy = f"{walkthrough.CLUSTER}-bookies", f"{walkthrough.CLUSTER}-bookie"
    cluster.kubectl("patch", "service", "-n", NAMESPACE, service, "--type", "merge",
                    "-p", json.dumps({"spec": {"publishNotReadyAddresses": False}}))
    cluster.kubectl("patch", "networkpolicy", "-n", NAMESPACE, policy, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/ingress/0/from", "value": [NOBODY]}]))
    walkthrough.patch_cluster(cluster, {"networkPolicy": {"clients": [PULSAR_BROKERS]}})
    deployment = cluster.get("deployment", "-n", NAMESPACE, "bookfleet")["metadata"]["generation"]
    cluster.helm("upgrade", "bookfleet", str(walkthrough.ROOT / "charts" / "bookfleet"), "--namespace", NAMESPACE,
                 "--reuse-values", "--set", "operator.extraArgs={--interval,3}", "--wait", "--timeout", "10m")
    assert cluster.get("deployment", "-n", NAMESPACE, "bookfleet")["metadata"]["generation"] > deployment

    def applied() -> bool:
        live_service = cluster.get("service", "-n", NAMESPACE, service)["spec"]
        peers = cluster.get("networkpolicy", "-n", NAMESPACE, policy)["spec"]["ingress"][0]["from"]
        return live_service.get("publishNotReadyAddresses") is True and PULSAR_BROKERS in peers and \
            NOBODY not in peers and len(peers) == 3  # own pods, labelled clients, the spec's client: not the operator

    wait_for(applied, timeout=180, what="the Service and NetworkPolicy as the upgraded operator applies them",
             interval=1.0)
    managers = {entry["manager"] for entry in cluster.get("service", "-n", NAMESPACE, service,
                                                          "--show-managed-fields")["metadata"]["managedFields"]
                if entry["operation"] == "Apply"}
    assert managers == {"bookfleet-operator"}
    walkthrough.apply_settings(cluster, {"networkPolicy": {"clients": []}})


def test_bookie_pods_deleted_or_evicted_returning_within_the_delay_are_not_repaired(installed: LocalCluster):
    """One bookie's pod is deleted; another's is evicted by its kubelet (phase Failed, reason Evicted: such a pod
    stays as it is until someone deletes it). Both count lost, come back in new pods on their own volumes within the
    delay, and nothing is repaired."""
    cluster = installed
    walkthrough.apply_settings(cluster, {"autoRecovery": {"lostBookieRecoveryDelaySeconds": 600}})
    deleted, evicted = walkthrough.bookie_pods(cluster)[:2]
    old_uids = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in (deleted, evicted)}
    claims = {claim["metadata"]["name"]: claim["metadata"]["uid"] for claim in walkthrough.bookie_claims(cluster)}
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, deleted["metadata"]["name"], "--wait=false")
    cluster.evict(NAMESPACE, evicted["metadata"]["name"])

    def back(name: str) -> bool:
        pods = [p for p in walkthrough.bookie_pods(cluster) if p["metadata"]["name"] == name]
        bookie = cluster.get("bookie", "-n", NAMESPACE, name).get("status", {})
        return bool(pods) and pods[0]["metadata"]["uid"] != old_uids[name] and walkthrough.ready(pods[0]) \
            and bookie.get("phase") == "Running" and not bookie.get("lostSince")

    wait_for(lambda: all(map(back, old_uids)), timeout=600, what="both bookies back on their volumes", interval=1.0)
    assert walkthrough.repair_jobs(cluster) == []
    # A real kubelet says "Evicted" in an Event of the pod, which ends Succeeded (the bookie exits 0 on the SIGTERM);
    # the process kubelet leaves it Failed with reason Evicted.
    for name, kinds in ((deleted["metadata"]["name"], ("is gone",)),
                        (evicted["metadata"]["name"], ("failed (Evicted)", "ended (Succeeded)"))):
        said = {event["reason"]: event["message"] for event in walkthrough.events(cluster, name)}
        assert any(kind in said["BookieLost"] for kind in kinds) and "BookieReturned" in said, said
        assert "failed (Evicted)" in said["BookieLost"] or "Evicted" in said or name != evicted["metadata"]["name"]
    assert {claim["metadata"]["name"]: claim["metadata"]["uid"] for claim in walkthrough.bookie_claims(cluster)} \
        == claims  # the same volumes: their data


def test_a_drained_bookie_whose_replacement_starts_later_than_the_loss_delay_is_not_repaired(
        installed: LocalCluster):
    """`kubectl drain` evicts a bookie through the eviction API; its replacement stays Pending on the cordoned node
    (its volumes are there) for several times the 5 s loss delay, as a slow node-pool upgrade would keep it. A planned
    loss waits plannedRestartDelaySeconds instead: no repair; uncordoned, the bookie is back with its data."""
    cluster = installed
    walkthrough.apply_settings(cluster, {"autoRecovery": {"lostBookieRecoveryDelaySeconds": 5,
                                                          "plannedRestartDelaySeconds": 600}})
    pod = walkthrough.bookie_pods(cluster)[0]
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    cluster.kubectl("drain", node, "--pod-selector", walkthrough.BOOKIE_SELECTOR, "--delete-emptydir-data",
                    "--timeout", "120s", timeout=150)
    try:
        lost = wait_for(lambda: (c := walkthrough.condition(cluster.get("bookie", "-n", NAMESPACE, name), "Lost"))
                        .get("status") == "True" and c, timeout=120, what=f"bookie {name} drained", interval=1.0)
        assert lost["reason"] == "Evicted", lost
        since = cluster.get("bookie", "-n", NAMESPACE, name)["status"]["lostSince"]
        # Four loss delays and several operator passes go by with the replacement still not started.
        wait_for(lambda: walkthrough.server_seconds(since, time.time()) < -20, timeout=120,
                 what="20 s past the loss", interval=1.0)
        replacement = walkthrough.bookie_pods(cluster)
        assert not any(p["metadata"]["name"] == name and walkthrough.ready(p) for p in replacement)
        assert walkthrough.repair_jobs(cluster) == []
    finally:
        cluster.kubectl("uncordon", node)

    def back() -> bool:
        bookie = cluster.get("bookie", "-n", NAMESPACE, name).get("status") or {}
        return bookie.get("phase") == "Running" and not bookie.get("lostSince")

    wait_for(back, timeout=300, what=f"bookie {name} back on {node}", interval=1.0)
    assert walkthrough.repair_jobs(cluster) == []
    assert "BookieReturned" in walkthrough.event_reasons(cluster, name)
    walkthrough.apply_settings(cluster, {"autoRecovery": {"lostBookieRecoveryDelaySeconds": 600}})


def test_spec_changes_roll_one_bookie_at_a_time_and_a_pod_that_never_gets_ready_halts_the_rollout(
        installed: LocalCluster):
    """A spec change reaches the pods through their config hash, one bookie at a time; an image that never runs
    halts the rollout at its first bookie (RolloutStuck), counts nobody lost and repairs nothing."""
    cluster = installed
    image = resources.bookie_image(walkthrough.bookie_cluster(cluster))
    walkthrough.patch_cluster(cluster, {"image": MISSING_IMAGE, "rolloutTimeoutSeconds": 30})

    def stuck() -> bool:
        body = cluster.get("bookiecluster", "-n", NAMESPACE, "demo")
        return walkthrough.condition(body, "RolloutStuck").get("status") == "True"

    wait_for(stuck, timeout=300, what="RolloutStuck on the BookieCluster", interval=1.0)
    pods = walkthrough.bookie_pods(cluster)
    assert sorted(pod["spec"]["containers"][0]["image"] for pod in pods if not walkthrough.ready(pod)) == \
        [MISSING_IMAGE]  # only the first restarted bookie; the other two serve on
    assert sum(map(walkthrough.ready, pods)) == 2
    assert lost_bookies(cluster) == [] and walkthrough.repair_jobs(cluster) == []
    assert "RolloutStuck" in walkthrough.event_reasons(cluster, "demo")

    grown = "6Gi"
    walkthrough.patch_cluster(cluster, {"image": image, "bookie": {"gcIntervalSeconds": 61},
                                        "storage": {"ledgers": {"size": grown}}})
    most_down = 0

    def rolled() -> bool:
        nonlocal most_down
        pods = walkthrough.bookie_pods(cluster)
        most_down = max(most_down, 3 - sum(map(walkthrough.ready, pods)))
        status = cluster.get("bookiecluster", "-n", NAMESPACE, "demo").get("status") or {}
        return status.get("updatedBookies") == 3 and all(map(walkthrough.ready, pods)) and all(
            {"61", str(quantity_bytes(grown))} <= set(pod["spec"]["containers"][0]["command"]) for pod in pods)

    wait_for(rolled, timeout=600, what="every bookie ready with the new spec", interval=1.0)
    assert most_down == 1  # one bookie at a time
    body = cluster.get("bookiecluster", "-n", NAMESPACE, "demo")
    assert walkthrough.condition(body, "RolloutStuck")["status"] == "False"
    assert lost_bookies(cluster) == [] and walkthrough.repair_jobs(cluster) == []
    # The ledger volumes grew in place (the storage class allows it): same claims, the new size granted.
    ledger_claims = [c for c in walkthrough.bookie_claims(cluster) if c["metadata"]["name"].endswith("-ledgers")]
    assert len(ledger_claims) == 3
    assert all(claim["status"]["capacity"]["storage"] == grown for claim in ledger_claims)
    assert walkthrough.condition(body, "VolumesExpanded")["status"] == "True"


def test_a_bookie_restarting_for_longer_than_the_delay_is_lost_crash_looping_then_returns_with_its_data(
        installed: LocalCluster):
    """Its container killed, and again once restarted: the kubelet backs off the second restart (10 s), not Ready for
    longer than a 5 s delay, so the bookie counts lost (CrashLooping) with its volumes kept; auto-recovery disabled,
    nothing is launched and the Bookie says so; back and registered with its data, the loss is over."""
    cluster = installed
    settings = {"autoRecovery": {"enabled": False, "lostBookieRecoveryDelaySeconds": 5}}
    walkthrough.apply_settings(cluster, settings)
    pod = walkthrough.bookie_pods(cluster)[0]
    name = pod["metadata"]["name"]
    cluster.kill_container(NAMESPACE, name)

    def restarted() -> bool:
        [status] = cluster.get("pod", "-n", NAMESPACE, name)["status"]["containerStatuses"]
        return status["restartCount"] >= 1 and "running" in status["state"]

    wait_for(restarted, timeout=60, what=f"bookie {name} restarted once", interval=0.5)
    cluster.kill_container(NAMESPACE, name)

    def lost() -> dict:
        return walkthrough.condition(cluster.get("bookie", "-n", NAMESPACE, name), "Lost")

    wait_for(lambda: lost().get("status") == "True", timeout=120, what=f"bookie {name} lost", interval=1.0)
    bookie = cluster.get("bookie", "-n", NAMESPACE, name)
    assert lost()["reason"] == "CrashLooping" and "restart" in lost()["message"]
    assert walkthrough.condition(bookie, "Repaired")["reason"] == "AutoRecoveryDisabled"
    assert walkthrough.repair_jobs(cluster) == []

    wait_for(lambda: lost().get("reason") == "BookieReturned" and walkthrough.ready(
        cluster.get("pod", "-n", NAMESPACE, name)), timeout=180, what=f"bookie {name} back", interval=1.0)
    assert cluster.get("pod", "-n", NAMESPACE, name)["metadata"]["uid"] == pod["metadata"]["uid"]  # same pod, data
    assert {"BookieLost", "AutoRecoveryDisabled", "BookieReturned"} <= set(walkthrough.event_reasons(cluster, name))
    assert walkthrough.repair_jobs(cluster) == []
    walkthrough.apply_settings(cluster, {"autoRecovery": {"enabled": True}})


FOURTH = "demo-3"
"""The bookie a scale-up to four adds: pinned to zone-a, on the zone's spare node once that is uncordoned."""
SPARE_A = "node-a2"


def fourth_claims(cluster: LocalCluster) -> dict[str, str]:
    """The fourth bookie's PVCs: name -> uid."""
    return {claim["metadata"]["name"]: claim["metadata"]["uid"] for claim in walkthrough.bookie_claims(cluster)
            if claim["metadata"]["name"].startswith(f"{FOURTH}-")}


def fourth_pods(cluster: LocalCluster) -> list[dict]:
    return [pod for pod in walkthrough.bookie_pods(cluster) if pod["metadata"]["name"] == FOURTH]


def test_scaling_down_then_up_drains_the_bookie_then_brings_back_a_fresh_writable_one(installed: LocalCluster):
    """Four bookies, then three: the fourth is drained (read-only, no ledger needs it), removed, its volumes kept
    (whenScaled Retain). Four again: the kept volumes (a cookie ZooKeeper no longer has) are deleted and the fourth
    starts afresh, registered writable."""
    cluster = installed
    cluster.kubectl("uncordon", SPARE_A)
    walkthrough.scale(cluster, 4)
    first = fourth_claims(cluster)
    assert len(first) == 2

    cluster.kubectl("scale", "bookiecluster", "-n", NAMESPACE, "demo", "--replicas=3")
    wait_for(lambda: FOURTH not in {b["metadata"]["name"] for b in cluster.get("bookies", "-n", NAMESPACE)["items"]},
             timeout=300, what=f"Bookie {FOURTH} drained and removed", interval=1.0)
    kept = {claim["metadata"]["name"]: claim for claim in walkthrough.bookie_claims(cluster)}
    assert first.keys() <= kept.keys() and all(
        ANNOTATION_RELEASED in kept[name]["metadata"]["annotations"] for name in first)
    assert {"Decommissioning", "Decommissioned"} <= set(walkthrough.event_reasons(cluster, FOURTH)) | set(
        walkthrough.event_reasons(cluster, "demo"))

    walkthrough.scale(cluster, 4)  # waits for four Running (registered writable, not ReadOnly) Bookies
    again = fourth_claims(cluster)
    assert again.keys() == first.keys() and not set(again.values()) & set(first.values())  # fresh volumes
    assert "StaleVolumesDeleted" in walkthrough.event_reasons(cluster, "demo")
    assert walkthrough.repair_jobs(cluster) == []  # it held no ledger: nothing to copy


def test_a_bookie_whose_node_is_drained_then_deleted_is_repaired_and_replaced_on_fresh_volumes(
        installed: LocalCluster):
    """A node pool shrinks: the fourth bookie's node is drained (the disruption budget lets one bookie go) and
    deleted. Its pod comes back Pending, its volume pinned to the vanished node: lost for good, so once its (no)
    ledgers are safe it is replaced on fresh volumes on a live node of its zone."""
    cluster = installed
    walkthrough.apply_settings(cluster, {"autoRecovery": {"lostBookieRecoveryDelaySeconds": 5}})

    [pod] = fourth_pods(cluster)
    node = pod["spec"]["nodeName"]
    assert node == SPARE_A, f"{FOURTH} runs on {node}"
    others = [p["metadata"]["name"] for p in cluster.get("pods", "-n", NAMESPACE)["items"]
              if p["spec"].get("nodeName") == node and p["metadata"]["name"] != FOURTH]
    assert not others, f"{node} also runs {others}"
    claims = set(fourth_claims(cluster).values())
    cluster.kubectl("drain", node, "--pod-selector", walkthrough.BOOKIE_SELECTOR, "--delete-emptydir-data", "--timeout",
                    "60s", timeout=90)
    cluster.fail_node(node)
    cluster.kubectl("delete", "node", node)

    def replaced() -> bool:
        bookie = cluster.get("bookie", "-n", NAMESPACE, FOURTH)
        pods = fourth_pods(cluster)
        return bookie.get("status", {}).get("phase") == "Running" and bool(pods) and walkthrough.ready(pods[0]) \
            and "BookieReplaced" in walkthrough.event_reasons(cluster, FOURTH)

    wait_for(replaced, timeout=600, what=f"{FOURTH} replaced on a live node", interval=1.0)
    [pod] = fourth_pods(cluster)
    assert pod["spec"]["nodeName"] == "node-a"
    fresh = set(fourth_claims(cluster).values())
    assert len(fresh) == 2 and not fresh & claims
    reasons = walkthrough.event_reasons(cluster, FOURTH)
    assert {"BookieLost", "RepairLaunched", "RepairSucceeded", "BookieReplaced"} <= set(reasons)
    assert "PodForceDeleted" not in reasons  # nothing was stuck on a dead kubelet: the pod was Pending


def lost_bookies(cluster: LocalCluster) -> list[str]:
    return [bookie["metadata"]["name"] for bookie in cluster.get("bookies", "-n", NAMESPACE)["items"]
            if (bookie.get("status") or {}).get("lostSince")]


def test_lost_bookie_is_repaired_by_spark_on_kubernetes_after_the_acting_operator_is_killed(
        installed: LocalCluster):
    """The acting operator replica's pod deleted (kopf peering: the other takes over) -> pod and PVCs deleted ->
    marked -> one repair Job -> spark-submit --master k8s:// -> executor pods on their own IPs connecting back to the
    driver pod's IP -> Ledger healthy -> every entry reads back."""
    cluster = installed
    killed = walkthrough.acting_operator(cluster)
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, killed, "--wait=false")
    outcome = walkthrough.closed_loop(cluster, ENTRIES)
    print(f"pod deletion to healthy Ledger: {outcome.seconds_to_healthy:.0f} s")
    # Its executor pods shown, the later repairs (node failure, zone cut) run as their size says: in their driver.
    walkthrough.apply_settings(cluster, {"autoRecovery": {"repair": {"localModeMaxMb": None}}})

    repair = outcome.repair
    assert repair.job and repair.driver_ip and repair.executors
    assert all(f"@{repair.driver_ip}:" in e["driver_url"] for e in repair.executors.values())
    assert len({e["ip"] for e in repair.executors.values()} | {repair.driver_ip}) == len(repair.executors) + 1
    [container] = cluster.get("job", "-n", NAMESPACE, repair.job)["spec"]["template"]["spec"]["containers"]
    command = container.get("command", []) + container.get("args", [])
    assert command[command.index("--master") + 1].startswith("k8s://")
    if cluster.real_node():  # the repair image from repair-image/Dockerfile, driver and executors as containers
        ran = [repair.driver_container, *repair.executors.values()]
        assert all(r["node"] == realnode.NAME and r["container_id"].startswith("containerd://")
                   and r["image"] == realnode.published_reference("repair") for r in ran), ran
    assert [e["entry_id"] for e in outcome.read_back] == list(range(ENTRIES))
    assert [e["payload"] for e in outcome.read_back] == [f"{i:032d}" for i in range(ENTRIES)]
    assert walkthrough.acting_operator(cluster) not in ("", killed)
    lost_bookie = outcome.lost_bookie_id.split(".")[0]
    assert walkthrough.new_repair_jobs(cluster, lost_bookie, outcome.earlier_jobs) == [repair.job]  # once
    # What a Prometheus scrapes (the chart's monitors): the operators counted the repair, a bookie its journal syncs.
    # The success is counted when the operator sees the Job complete, which can come after the Ledger turns healthy.
    def repair_outcomes() -> dict[str, float]:
        repairs = [sample for pod in operator_pods(cluster) if walkthrough.ready(pod)
                   for sample in samples(walkthrough.scrape(pod, "metrics"), "bookfleet_operator_repairs_total")]
        return {outcome: sum(s.value for s in repairs if s.labels["outcome"] == outcome)
                for outcome in ("launched", "succeeded")}

    try:
        wait_for(lambda: min(repair_outcomes().values()) >= 1, timeout=180, what="the repair counted", interval=1.0)
    except TimeoutError:
        pytest.fail(f"repairs counted by the operators: {repair_outcomes()}")
    syncs = [sample.value for pod in walkthrough.bookie_pods(cluster) if walkthrough.ready(pod)
             for sample in samples(walkthrough.scrape(pod, "http"), "bookie_journal_sync_latency_seconds_count")]
    assert syncs and max(syncs) > 0  # the ledger's bookies synced its entries
    # The dashboard during this repair: the driver, scraped while it ran, lingered for one more scrape after it.
    driver = wait_for(lambda: (text := walkthrough.scrape_driver(cluster, repair)) and sum(
        s.value for s in samples(text, "bookfleet_repair_ledgers_total")) >= 1 and text,
        timeout=150, what="the repair driver's counts scraped", interval=1.0)
    assert sum(s.value for s in samples(driver, "bookfleet_repair_entries_total")) >= ENTRIES
    assert unfilled_panels(cluster, repair, driver) == {}


def test_the_repair_job_of_a_bookie_with_more_ledgers_than_an_annotation_holds_is_admitted(installed: LocalCluster):
    """The short form of the big-bookie scenario below: for as many ledgers as overflow the old Job shape with the
    smallest ids this cluster can hand out next, the real API server refuses that shape (every id in an annotation)
    and admits the Job the operator builds (ids read from the markers by the repair). Server-side dry runs."""
    cluster = installed
    bookie = walkthrough.bookie_pods(cluster)[0]["metadata"]["name"]
    as_built = bigbookie.repair_job_as_built(cluster, bookie)
    with bigbookie.zookeeper(cluster) as session:
        first = bigbookie.next_ledger_id(session)
    count = bigbookie.ledgers_past_the_limit(first, as_built["metadata"]["annotations"])
    old = bigbookie.with_ledger_ids(as_built, range(first, first + count))
    print(f"old repair Job shape: {count} ledger ids from {first} take "
          f"{bigbookie.annotation_bytes(old['metadata']['annotations'])} B of annotations")
    assert "metadata.annotations: Too long" in bigbookie.refusal(cluster, old)
    assert bigbookie.refusal(cluster, as_built) == ""


def samples(text: str, name: str) -> list[Sample]:
    """The samples called `name` in a Prometheus text exposition."""
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name]


DASHBOARD = walkthrough.ROOT / "charts" / "bookfleet" / "dashboards" / "bookfleet.json"


def unfilled_panels(cluster: LocalCluster, repair: walkthrough.Repair, driver_metrics: str) -> dict[str, list[str]]:
    """The chart's dashboard panels that a Prometheus scraping what the chart's monitors select would leave empty for
    the example's BookieCluster: panel title -> its queries, none of which has every metric it reads served with the
    cluster's name. Bookies and the repair driver name it by their pods' bookfleet.io/cluster label (the monitors
    relabel it to `bookiecluster`), the operator replicas in their samples' own `bookiecluster` (honorLabels)."""
    ours = walkthrough.CLUSTER

    def served(text: str, named: bool = False) -> set[str]:
        return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples
                if not named or sample.labels.get("bookiecluster") == ours}

    names = set().union(*(served(walkthrough.scrape(pod, "http")) for pod in walkthrough.bookie_pods(cluster)
                          if walkthrough.ready(pod) and pod["metadata"]["labels"].get(resources.LABEL_CLUSTER) == ours),
                        *(served(walkthrough.scrape(pod, "metrics"), named=True) for pod in operator_pods(cluster)
                          if walkthrough.ready(pod)))
    driver_labels = cluster.get("job", "-n", NAMESPACE, repair.job)["spec"]["template"]["metadata"]["labels"]
    if driver_labels.get(resources.LABEL_CLUSTER) == ours:
        names |= served(driver_metrics)
    queries = {panel["title"]: [target["expr"] for target in panel["targets"]]
               for panel in json.loads(DASHBOARD.read_text())["panels"]}
    return {title: exprs for title, exprs in queries.items() if not any(metric_names(e) <= names for e in exprs)}


def operator_pods(cluster: LocalCluster) -> list[dict]:
    return cluster.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=operator")["items"]


def test_bookie_on_a_failed_node_is_repaired_kept_until_the_node_is_deleted_then_replaced_on_a_live_node(
        installed: LocalCluster):
    """A node stops (no heartbeats, its processes killed): the node lifecycle controller marks its pods not Ready, the
    operator counts the bookie lost (NodeLost) and repairs its ledgers, keeping its pod and volumes (the node may come
    back with them). Once the node is deleted, the bookie starts afresh on a live node."""
    cluster = installed
    outcome = walkthrough.node_failure(cluster, ENTRIES)
    print(f"node failure: {json.dumps(outcome.figures())}")

    lost = outcome.lost_condition
    assert lost["reason"] == "NodeLost" and outcome.node in lost["message"]
    assert repairs.bookie_key(outcome.job)[2].startswith(f"{outcome.bookie}.")  # its ledgers: in the markers
    assert outcome.job["status"].get("succeeded")
    assert outcome.seconds["repair_job_created"] <= outcome.seconds["ledger_healthy"]
    fresh = outcome.fresh_pod
    assert fresh["spec"]["nodeName"] != outcome.node and walkthrough.ready(fresh)
    expected = {"BookieLost", "RepairLaunched", "RepairSucceeded", "VolumesKept", "BookieReplaced"}
    assert expected <= set(outcome.events)
    assert len(outcome.kept_claims) == 2  # still there once repaired, until the node went
    assert outcome.seconds["ledger_healthy"] <= outcome.seconds["node_deleted"] <= outcome.seconds[
        "fresh_bookie_running"]
    assert [e["entry_id"] for e in outcome.read_back] == list(range(ENTRIES))
    assert "disruption budget" in outcome.drain_refusal  # while its bookie was down, a drain evicted no other


def test_a_zone_cut_off_longer_than_the_delay_is_repaired_around_then_rejoins_without_a_repair(
        installed: LocalCluster):
    """The short form of the zone loss (`make chaos` runs the long one on a cluster of its own): on the four bookies
    the node failure left, zone-aware ledgers over the three zones; a zone holding one of them is cut off (its
    kubelet silent, its pods' links down, its bookie running on unreachable) while a writer goes on; its ledgers are
    repaired onto the two zones left, its bookie's volumes kept; it returns and rejoins without a repair. Each check
    of the long form holds but the collection of the returning bookie's stale copies, which these ledgers, younger
    than the bookies' 60 s grace, would wait one more collection interval for."""
    cluster = installed
    outcome = zoneloss.zone_loss(cluster, zoneloss.SHORT_FORM)
    figures = outcome.figures()
    print(f"zone loss (short form): {json.dumps(figures)}")
    for check in zoneloss.checks(zoneloss.SHORT_FORM):
        check(outcome, figures)


@pytest.mark.skipif(not os.environ.get(LONG), reason=f"long form: {LONG}=1 (make test-cluster)")
def test_a_lost_bookie_with_more_ledgers_than_an_annotation_holds_is_repaired(installed: LocalCluster):
    """Tens of thousands of ledgers on one bookie (as many as overflow the old Job shape with their real ids), the
    bookie lost with its volumes: the operator creates the repair Job (checked on the way: the old shape refused for
    these ids, the Job carrying none), which moves every ledger off it, and the bookie is replaced. Last before the
    uninstall (it leaves the cluster at four bookies)."""
    cluster = installed
    bookie, other = sorted(pod["metadata"]["name"] for pod in walkthrough.bookie_pods(cluster)
                           if walkthrough.ready(pod))[:2]
    outcome = bigbookie.lose_a_big_bookie(cluster, bookie, other)
    print(f"big bookie: {json.dumps(outcome.figures())}")
    assert outcome.left_on_bookie == 0 and outcome.still_naming_bookie == 0 and outcome.markers_left == 0


def test_the_uninstall_hook_deletes_the_cluster_keeping_its_volumes_and_helm_uninstall_finishes(
        installed: LocalCluster):
    """helm uninstall runs the chart's pre-delete hook Job (its ServiceAccount, restricted Pod Security), which
    deletes the chart's BookieCluster while the operator runs: its Bookies and Ledgers go, their volumes stay
    (whenDeleted Retain). Then deleting the namespace finishes, with nothing left Terminating. Last: it takes the
    fleet down."""
    cluster = installed
    claims = {claim["metadata"]["name"] for claim in walkthrough.bookie_claims(cluster)}
    assert cluster.get("ledgers", "-n", NAMESPACE)["items"]  # kubectl's, not the release's: only the hook deletes them
    outcome = walkthrough.uninstall(cluster)
    assert outcome.bookies_left == [] and outcome.ledgers_left == []
    assert claims and claims <= outcome.claims_kept
    assert outcome.namespace_gone
