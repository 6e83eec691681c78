"""The README's install steps as functions for the `cluster` test tier: start the local cluster, helm install the
chart into a restricted namespace, apply the examples, wait for the bookies."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bookfleet.kube import resources
from bookfleet.kube.models import BookieCluster
from bookfleet.polling import wait_for
from tests.cluster import realnode
from tests.cluster.apiget import ApiGet

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "bookfleet"
REPAIR_SELECTOR = "app.kubernetes.io/component=repair"
CHART_VALUES = ("--values", str(ROOT / "tests" / "cluster" / "chart-values.yaml"))
"""What the tier installs the chart with: its own ZooKeeper and the example cluster as the chart's BookieCluster."""
RELEASE = "bookfleet"
# The first run builds Kubernetes, etcd and helm from the Go module proxy (tens of minutes on 2 cores).
START_TIMEOUT = float(os.environ.get("BOOKFLEET_CLUSTER_START_TIMEOUT", 2700))


@dataclass(frozen=True)
class LocalCluster:
    """A running local cluster: admin kubeconfig, the built binaries (helm) and the kubelet's state directory."""

    kubeconfig: Path
    binaries: Path
    state: Path

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        result = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result.stdout

    def helm(self, *args: str, timeout: float = 900) -> str:
        return self._helm(*args, timeout=timeout).stdout

    def helm_test(self, release: str, namespace: str) -> str:
        """`helm test`: its report, then the test pods' logs (helm prints them on stderr, as the chart's
        helm.sh/hook-output-log-policy asks); AssertionError with both if a test failed."""
        result = self._helm("test", release, "--namespace", namespace, "--timeout", "5m", timeout=330)
        return result.stdout + result.stderr

    def _helm(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binaries / "helm"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True, text=True, timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {result.stdout}\n{result.stderr}")
        return result

    def get(self, *args: str) -> Any:
        """`kubectl get ARGS -o json`, read in this process (tests/cluster/apiget.py)."""
        return self._reads(*args)

    @functools.cached_property
    def _reads(self) -> ApiGet:
        return ApiGet(self.kubeconfig)

    def fail_node(self, name: str) -> float:
        """Stop a node's kubelet (heartbeats stop, its pods' processes die at once); the wall-clock time it happened."""
        self._control(f"fail-node-{name}")
        return time.time()

    def cut_zone(self, zone: str) -> float:
        """A zone outage: its nodes stop heartbeating and their pods' links go down, their processes running on,
        unreachable; the wall-clock time it happened."""
        self._control(f"cut-zone-{zone}")
        return time.time()

    def partition_zone(self, zone: str) -> float:
        """A zone partitioned off: its nodes stop heartbeating (the API server is outside it), its pods run on with
        their links up, reaching each other but nothing outside the zone; the wall-clock time it happened."""
        self._control(f"partition-zone-{zone}")
        return time.time()

    def heal_zone(self, zone: str) -> float:
        """The cut or partitioned zone returns as it was; the wall-clock time it did."""
        self._control(f"heal-zone-{zone}")
        return time.time()

    def evict(self, namespace: str, pod: str) -> None:
        """Have the pod's kubelet evict it: on a real node, its scratch volume filled past its sizeLimit, which the
        kubelet's eviction manager evicts it for (a bookie that exits 0 on the SIGTERM ends Succeeded, the pod's
        Evicted Event says why); the process kubelet ends it Failed, reason Evicted, as under node pressure."""
        body = self.get("pod", "-n", namespace, pod)
        if node := self.real_node_state(body):
            size = resources.quantity_bytes(resources.SCRATCH_LIMIT) + 64 * 2**20
            realnode.fill_empty_dir(node, body["metadata"]["uid"], resources.SCRATCH["name"], size)
        else:
            self._control(f"evict-pod-{namespace}.{pod}")

    def kill_container(self, namespace: str, pod: str) -> None:
        """SIGKILL to the pod's (first) container; its kubelet restarts it as its restart policy says."""
        body = self.get("pod", "-n", namespace, pod)
        container_id = body["status"]["containerStatuses"][0]["containerID"]
        if node := self.real_node_state(body):
            realnode.kill_container(node, container_id)
        else:
            os.kill(int(container_id.removeprefix("process://")), signal.SIGKILL)

    def _control(self, request_name: str) -> None:
        """A request to `python -m tests.cluster` through its control directory, once it is done."""
        request = self.state / "control" / request_name
        request.touch()
        wait_for(lambda: not request.exists(), timeout=30, what=f"{request_name} done", interval=0.1)

    def real_node_state(self, pod: dict[str, Any]) -> Path | None:
        """The state folder of the real node the pod runs on, or None on the process kubelet's."""
        folder = realnode.node_state(self.state, pod["spec"].get("nodeName") or "")
        return folder if (folder / "kubelet.yaml").exists() else None

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """A container's output ("" before it started): `kubectl logs` where a real node's kubelet runs the pod, else
        the process kubelet's log file (it serves no logs API)."""
        body = self.get("pod", "-n", namespace, pod)
        if self.real_node_state(body):
            states = [status.get("state") or {} for status in (body.get("status") or {}).get("containerStatuses") or []
                      if status["name"] == container]
            if not any("running" in state or "terminated" in state for state in states):
                return ""
            return self.kubectl("logs", "-n", namespace, pod, "-c", container)
        return (self.state / "pods" / body["metadata"]["uid"] / f"{container}.log").read_text(errors="replace")

    def stops_escalated(self) -> list[str]:
        """containerd's lines, on every real node, for a container it killed after the grace period of its stop: one
        that outlived its SIGTERM (none on the process kubelet's nodes)."""
        logs = sorted((self.state / "nodes").glob("*/logs/containerd.log"))
        return [line for log in logs for line in log.read_text(errors="replace").splitlines()
                if 'msg="Kill container ' in line]

    def real_node(self) -> bool:
        """Whether the cluster runs real nodes (kubelets on containerd): the system node at least."""
        return any(node["metadata"]["name"] == realnode.NAME for node in self.get("nodes")["items"])

    def node_image(self, name: str) -> str:
        """The local reference of image `name` once the cluster's real nodes that run it hold it (the cluster imports
        them at its start, building any not built yet: minutes the first time)."""
        marker = self.state / "images" / name
        wait_for(marker.exists, timeout=START_TIMEOUT, what=f"image {name} on the real nodes", interval=1.0)
        reference = marker.read_text()
        if reference.startswith("failed"):
            raise AssertionError(f"image {name}: {reference}")
        return reference


BULK = ("etcd", "volumes", "pods/*/volumes", "nodes/*/containerd", "nodes/*/kubelet")
"""What a kept cluster state drops (GBs a run: a full disk after a few failed runs): etcd's data, the volumes (the
bookies' data), pods' volumes, the real nodes' images, containers and pod volumes. Its logs (the control plane's, each
node's, every pod's), configs and certificates stay: what a failure is read from."""


def drop_bulk(state: Path) -> None:
    """Remove `BULK` from a stopped cluster's state directory."""
    for folder in [found for pattern in BULK for found in state.glob(pattern)]:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def running_cluster(keep_logs: Callable[[], bool] = lambda: False, process_zones: bool = False
                    ) -> Iterator[LocalCluster]:
    """`python -m tests.cluster` as a child process (so it stops and cleans up through its SIGTERM path); its logs
    (the cluster's, every pod's) are kept, without its `BULK`, if `keep_logs()` says so when it stops.
    `process_zones`: the zones' nodes on the process kubelet even where real nodes could run them."""
    work = Path(tempfile.mkdtemp(prefix="bookfleet-cluster-"))
    ready, state = work / "ready", work / "state"
    with (work / "cluster.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster", "--state", str(state), "--ready-file", str(ready), "--keep",
             *(["--process-zones"] * process_zones)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )

        def started() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"local cluster exited with {process.returncode}: see {work / 'cluster.log'}")
            return ready.exists()

        try:
            wait_for(started, timeout=START_TIMEOUT, what="the local cluster", interval=1.0)
            kubeconfig, binaries = ready.read_text().split()
            yield LocalCluster(Path(kubeconfig), Path(binaries), state)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            if keep_logs():
                drop_bulk(state)
                print(f"local cluster logs kept in {work} (without its volumes and images)", flush=True)
            else:
                shutil.rmtree(work, ignore_errors=True)


def ready(pod_or_node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod_or_node.get("status", {}).get("conditions", []))


def scrape(pod: dict[str, Any], port_name: str) -> str:
    """The pod's Prometheus /metrics, on its pod IP and its container port named `port_name` (as a scraper would)."""
    [port] = [port["containerPort"] for container in pod["spec"]["containers"] for port in container.get("ports", [])
              if port.get("name") == port_name]
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:{port}/metrics", timeout=10) as response:
        return response.read().decode()


BOOKIE_SELECTOR = "app.kubernetes.io/component=bookie,app.kubernetes.io/instance=demo"


def bookie_pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    return cluster.get("pods", "-n", NAMESPACE, "-l", BOOKIE_SELECTOR)["items"]


def bookie_claims(cluster: LocalCluster) -> list[dict[str, Any]]:
    return cluster.get("pvc", "-n", NAMESPACE, "-l", BOOKIE_SELECTOR)["items"]


def chart_placement(cluster: LocalCluster) -> tuple[str, ...]:
    """Chart values that run the operator and ZooKeeper as users get them where the cluster has real nodes: on the
    system node, the operator from the image built from operator/Dockerfile by its published name (the chart's
    default) and ZooKeeper from tests/cluster/images/zookeeper.Dockerfile (the stand-in for the official image); else
    none (the process kubelet runs the dev venv and the host's ZooKeeper). One line says which."""
    if not cluster.real_node():
        say("the operator, ZooKeeper, bookies and repairs on the process kubelet (no real nodes)")
        return ()
    cluster.node_image("operator")
    zookeeper = cluster.node_image("zookeeper")
    say(f"the operator and ZooKeeper on {realnode.NAME} (containerd), images "
        f"{realnode.published_reference('operator')} and {zookeeper}")
    placement = [(f"{component}.{key}", json.dumps(value)) for component in ("operator", "zookeeper")
                 for key, value in realnode.PLACEMENT.items()]
    return ("--set", f"zookeeper.image={zookeeper}",
            *(argument for key, value in placement for argument in ("--set-json", f"{key}={value}")))


def repair_placement(cluster: LocalCluster) -> dict[str, Any]:
    """BookieCluster repair settings that run repair drivers and their Spark executors on the system node where the
    cluster has real nodes (the image built from repair-image/Dockerfile, by the published name the CRD defaults
    to); else none (the process kubelet runs them from the dev venv)."""
    if not cluster.real_node():
        return {}
    cluster.node_image("repair")
    say(f"repair drivers and executors on {realnode.NAME} (containerd), image {realnode.published_reference('repair')}")
    # One executor: the node has the machine's CPUs (2 here), and the operator's replicas (0.2), the driver (0.5) and
    # one executor (1) fit; a second one would stay Pending while Spark waits up to 30 s for it to register.
    return {"executors": 1, "driverPodTemplate": realnode.PLACEMENT, "executorPodTemplate": realnode.PLACEMENT}


def install(cluster: LocalCluster, zookeeper_credential: bool = True, repairs: bool = True) -> None:
    """A namespace enforcing restricted Pod Security, the chart with its ZooKeeper and the example BookieCluster
    (CHART_VALUES), the example Ledger, 3 Ready bookies, repairs placed on the system node where the cluster has real
    nodes (`place_repairs`; not with `repairs` False). Without `zookeeper_credential` the chart makes no ZooKeeper
    credential and its cluster names none: its nodes are open to any ZooKeeper client, as a Java BookKeeper client
    (Pulsar's broker) needs, since it cannot present a digest credential (docs/bookkeeper.md)."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")
    if cluster.real_node():  # before the chart creates the bookies: nothing is pulled, a missing image backs off
        say(f"bookies on the zones' nodes (containerd), image {realnode.published_reference('bookie')}")
        cluster.node_image("bookie")
    credential = () if zookeeper_credential else ("--set", "security.zookeeperAuth.enabled=false")
    cluster.helm("install", RELEASE, str(ROOT / "charts" / "bookfleet"), "--namespace", NAMESPACE, *CHART_VALUES,
                 *credential, *chart_placement(cluster), "--wait", "--timeout", "10m")
    cluster.kubectl("apply", "--server-side", "--validate=strict", "-n", NAMESPACE, "-f",
                    str(ROOT / "examples" / "ledger.yaml"))
    wait_for(lambda: len(pods := bookie_pods(cluster)) == 3 and all(map(ready, pods)),
             timeout=600, what="three Ready bookie pods", interval=1.0)
    wait_for(lambda: [b.get("status", {}).get("phase") for b in cluster.get("bookies", "-n", NAMESPACE)["items"]]
             == ["Running"] * 3, timeout=300, what="three Running Bookies", interval=1.0)
    wait_for(lambda: zones_served(cluster), timeout=300, what="every bookie serving with its node's zone",
             interval=1.0)
    if repairs:
        place_repairs(cluster)


def place_repairs(cluster: LocalCluster) -> None:
    """The example BookieCluster's repairs on the system node where the cluster has real nodes, once it holds the
    repair image."""
    if placement := repair_placement(cluster):
        apply_settings(cluster, {"autoRecovery": {"repair": placement}})


def example_bookies(cluster: LocalCluster) -> list[dict[str, Any]]:
    """The example BookieCluster's Bookies (not those of a cluster a test runs beside it)."""
    return cluster.get("bookies", "-n", NAMESPACE, "-l", f"{resources.LABEL_CLUSTER}={CLUSTER}")["items"]


def zones_served(cluster: LocalCluster) -> dict[str, str] | None:
    """Bookie id -> zone once every bookie of the example serves with its node's zone (the example names none): its
    Bookie's spec.zone is its node's topology.kubernetes.io/zone, its pod Ready with that --zone, the Bookie Running;
    else None (a bookie restarted with its zone is not serving yet)."""
    zones = {node["metadata"]["name"]: node["metadata"]["labels"].get(ZONE_LABEL)
             for node in cluster.get("nodes")["items"]}
    bookies = {b["metadata"]["name"]: b for b in example_bookies(cluster)}
    served = {}
    for pod in bookie_pods(cluster):
        bookie, zone = bookies.get(pod["metadata"]["name"]), zones.get(pod["spec"].get("nodeName", ""))
        command = pod["spec"]["containers"][0]["command"]
        if not (bookie and zone and ready(pod) and bookie["spec"].get("zone") == zone and "--zone" in command
                and command[command.index("--zone") + 1] == zone
                and (bookie.get("status") or {}).get("phase") == "Running"):
            return None
        served[bookie["spec"]["bookieId"]] = zone
    return served if len(served) == len(bookies) else None


# --- the closed loop: client entries, a lost bookie, a Spark-on-Kubernetes repair -------------------------------

CLUSTER = "demo"
LEDGER = "demo-ledger"
EXECUTOR_SELECTOR = "spark-role=executor"


def say(step: str) -> None:
    print(f"==> {step}", flush=True)


def bookie_cluster(cluster: LocalCluster, name: str = CLUSTER) -> BookieCluster:
    return BookieCluster.model_validate(cluster.get("bookiecluster", "-n", NAMESPACE, name))


def ledger_status(cluster: LocalCluster, ledger: str = LEDGER) -> dict[str, Any]:
    return cluster.get("ledger", "-n", NAMESPACE, ledger).get("status") or {}


def patch_cluster(cluster: LocalCluster, spec: dict[str, Any]) -> None:
    """A merge patch of the BookieCluster's spec."""
    cluster.kubectl("patch", "bookiecluster", "-n", NAMESPACE, CLUSTER, "--type", "merge", "-p",
                    json.dumps({"spec": spec}))


def apply_settings(cluster: LocalCluster, spec: dict[str, Any]) -> None:
    """Patch the BookieCluster's spec and wait until the operator has acted on it (status.observedGeneration: its
    auto-recovery settings are in ZooKeeper then)."""
    patch_cluster(cluster, spec)
    generation = cluster.get("bookiecluster", "-n", NAMESPACE, CLUSTER)["metadata"]["generation"]
    wait_for(lambda: (cluster.get("bookiecluster", "-n", NAMESPACE, CLUSTER).get("status") or {}).get(
        "observedGeneration", 0) >= generation, timeout=120, what=f"generation {generation} observed", interval=0.5)


def condition(body: dict[str, Any], type_: str) -> dict[str, Any]:
    """A condition of a resource's status ({} while it has none of that type)."""
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def events(cluster: LocalCluster, involved: str) -> list[dict[str, Any]]:
    """The namespace's Events about the object named `involved`."""
    return cluster.get("events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={involved}")["items"]


def event_reasons(cluster: LocalCluster, involved: str, since: float | None = None) -> list[str]:
    """The reasons of the Events about `involved`; with `since` (wall-clock), of those seen last at or after it (the
    API keeps whole seconds)."""
    return [event["reason"] for event in events(cluster, involved) if since is None or server_seconds(
        event.get("lastTimestamp") or event.get("eventTime") or event["metadata"]["creationTimestamp"], since) >= -1]


def repair_jobs(cluster: LocalCluster, bookie: str | None = None) -> list[dict[str, Any]]:
    """The repair Jobs in the namespace, or those of one Bookie."""
    selector = REPAIR_SELECTOR + (f",{resources.LABEL_BOOKIE}={bookie}" if bookie else "")
    return cluster.get("jobs", "-n", NAMESPACE, "-l", selector)["items"]


def new_repair_jobs(cluster: LocalCluster, bookie: str, earlier: Collection[str]) -> list[str]:
    """The names of a Bookie's repair Jobs that are not among `earlier` (those of its earlier losses)."""
    return [name for job in repair_jobs(cluster, bookie) if (name := job["metadata"]["name"]) not in earlier]


def scale(cluster: LocalCluster, replicas: int) -> None:
    """Through the BookieCluster's scale subresource, then wait until every Bookie is Running."""
    cluster.kubectl("scale", "bookiecluster", "-n", NAMESPACE, CLUSTER, f"--replicas={replicas}")
    wait_for(lambda: [b.get("status", {}).get("phase") for b in example_bookies(cluster)]
             == ["Running"] * replicas, timeout=600, what=f"{replicas} Running Bookies", interval=1.0)


CLIENT_TEAM = "tier"
"""The client team whose certificate the tier's client pods use (spec.security.clientCertificates)."""


def client_secret(on: str) -> str:
    return resources.client_secret_name(on, CLIENT_TEAM)


def issue_client_certificate(cluster: LocalCluster, on: str = CLUSTER) -> dict[str, bytes]:
    """A client certificate as a client team gets one (docs/operating.md): its name in the BookieCluster's
    spec.security.clientCertificates, then the operator issues it into a Secret of its own; that Secret's files once
    it holds them. The tier never reads the cluster's CA key."""
    cluster.kubectl("patch", "bookiecluster", "-n", NAMESPACE, on, "--type", "merge", "-p",
                    json.dumps({"spec": {"security": {"clientCertificates": [CLIENT_TEAM]}}}))

    def issued() -> dict[str, bytes] | None:
        found = cluster.get("secrets", "-n", NAMESPACE, "--field-selector", f"metadata.name={client_secret(on)}")
        data = {key: base64.b64decode(value) for item in found["items"] for key, value in
                (item.get("data") or {}).items()}
        return data if all(data.get(key) for key in (resources.CA_KEY, resources.CERT_KEY, resources.KEY_KEY)) \
            else None

    return wait_for(issued, timeout=120, what=f"the operator's Secret {client_secret(on)}", interval=1.0)


def start_client(cluster: LocalCluster, name: str, script: str, node: str | None = None, on: str = CLUSTER) -> None:
    """`sh -c script` in a client pod of the bookie image (client label, client certificate and ZooKeeper credential
    of the BookieCluster `on`, restricted Pod Security), on `node` if given; a pod of that name left from before is
    deleted first."""
    spec = bookie_cluster(cluster, on)
    container = {
        "name": "client", "image": resources.bookie_image(spec), "args": ["sh", "-c", script],
        "env": resources.security_env(spec, with_tls_dir=True),
        "volumeMounts": [resources.tls_mount(), resources.SCRATCH],
        "securityContext": resources.container_security_context(),
    }
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {resources.CLIENT_LABEL: "true"}},
        "spec": {"restartPolicy": "Never", "containers": [container],
                 "volumes": [resources.tls_volume(client_secret(on)),
                             {"name": resources.SCRATCH["name"], "emptyDir": {}}],
                 "securityContext": resources.pod_security_context(), **({"nodeName": node} if node else {})},
    }
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--ignore-not-found", "--wait=true")
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod))


def run_client(cluster: LocalCluster, name: str, script: str, on: str = CLUSTER) -> str:
    """`start_client` until the pod exits; its log, or AssertionError with the log if it failed."""
    start_client(cluster, name, script, on=on)
    return client_log(cluster, name)


def client_log(cluster: LocalCluster, name: str, timeout: float = 300) -> str:
    """The log of client pod `name` once it exited, or AssertionError with the log if it failed."""
    phase = wait_for(lambda: (p := cluster.get("pod", "-n", NAMESPACE, name).get("status", {}).get("phase"))
                     in ("Succeeded", "Failed") and p, timeout=timeout, what=f"client pod {name} to finish",
                     interval=1.0)
    log = cluster.container_log(NAMESPACE, name, "client")
    if phase != "Succeeded":
        tails = {pod["metadata"]["name"]: cluster.container_log(NAMESPACE, pod["metadata"]["name"], "bookie")
                 for pod in bookie_pods(cluster)}
        bookies = "".join(f"\n--- {pod}, its last lines:\n" + "\n".join(tail.splitlines()[-15:])
                          for pod, tail in tails.items())
        raise AssertionError(f"client pod {name} failed:\n{log}{bookies}")
    return log


def parked_repair_pod(cluster: LocalCluster, name: str) -> str:
    """A pod labelled as a repair pod (what a Spark executor carries) that no node takes: it stays Pending, costing
    nothing; its name."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {resources.LABEL_COMPONENT: resources.REPAIR}},
        "spec": {"nodeSelector": {"bookfleet.io/no-such-node": "true"},
                 "containers": [{"name": "executor", "image": resources.bookie_image(bookie_cluster(cluster)),
                                 "securityContext": resources.container_security_context()}],
                 "securityContext": resources.pod_security_context()},
    }
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    return name


def write_entries(cluster: LocalCluster, count: int, ledger: str = LEDGER, on: str = CLUSTER) -> int:
    """`count` entries into a Ledger (the example one by default) of the BookieCluster `on`, which is then closed;
    its ledger id."""
    ledger_id = wait_for(lambda: (status := ledger_status(cluster, ledger)).get("state") and status,
                         timeout=300, what=f"Ledger {ledger} created in ZooKeeper", interval=1.0)["ledgerId"]
    zk = bookie_cluster(cluster, on).spec.zookeeper
    run_client(cluster, f"{on}-writer", f"bookfleet ledger write {ledger_id} --zk {zk} --count {count} --size 32 && "
                                        f"bookfleet ledger close {ledger_id} --zk {zk}", on)
    return ledger_id


def read_entries(cluster: LocalCluster, ledger_id: int, on: str = CLUSTER) -> list[dict[str, Any]]:
    zk = bookie_cluster(cluster, on).spec.zookeeper
    log = run_client(cluster, f"{on}-reader", f"bookfleet ledger read {ledger_id} --zk {zk} --json", on)
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def lose_bookie(cluster: LocalCluster, bookie_id: str) -> str:
    """Delete a bookie's pod and its PVCs (its data is gone); the pod's name."""
    pod = bookie_id.split(".")[0]
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, pod, "--wait=false")
    cluster.kubectl("delete", "pvc", "-n", NAMESPACE, *(resources.pvc_name(pod, v) for v in resources.VOLUMES),
                    "--wait=false")
    return pod


@dataclass
class Repair:
    """What the closed loop was seen doing: the repair Job, its driver pod's IP, the executor pods that ran."""

    job: str = ""
    driver_ip: str = ""
    driver_container: dict[str, str] = field(default_factory=dict)
    """Where the driver ran: {"node", "image", "container_id"} (a containerd:// ID on a real node)."""
    executors: dict[str, dict[str, str]] = field(default_factory=dict)
    """executor pod name -> {"ip": its pod IP, "driver_url": the SPARK_DRIVER_URL it was given, and where it ran as
    `driver_container` says}"""
    driver_metrics: str = ""
    """The driver's /metrics as last scraped (`scrape_driver`)."""


def where_it_ran(pod: dict[str, Any]) -> dict[str, str]:
    """A running pod's node, and its first container's image and container ID."""
    [status, *_] = pod["status"].get("containerStatuses") or [{}]
    return {"node": pod["spec"].get("nodeName", ""), "image": pod["spec"]["containers"][0]["image"],
            "container_id": status.get("containerID", "")}


def watch_repair(cluster: LocalCluster, lost_bookie_id: str, earlier: Collection[str] = (),
                 timeout: float = 900) -> Repair:
    """Wait until the Ledger is healthy again (repaired by a Job, no marker, no data loss, off the lost bookie),
    noting the repair Job, its driver pod and Spark's executor pods on the way (they go when the Job ends). Jobs
    named in `earlier` repaired an earlier loss of the same Bookie (kept until their TTL): not this one's."""
    seen = Repair()

    def healthy() -> bool:
        if not seen.job and (jobs := new_repair_jobs(cluster, lost_bookie_id.split(".")[0], earlier)):
            seen.job = jobs[0]
            say(f"repair Job {seen.job} created")
        if seen.job:
            scrape_driver(cluster, seen)
        for pod in cluster.get("pods", "-n", NAMESPACE, "-l", EXECUTOR_SELECTOR)["items"]:
            name = pod["metadata"]["name"]
            if name not in seen.executors and pod["status"].get("podIP") and ready(pod):
                env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}
                seen.executors[name] = {"ip": pod["status"]["podIP"], "driver_url": env.get("SPARK_DRIVER_URL", ""),
                                        **where_it_ran(pod)}
                say(f"Spark executor pod {name} on {pod['status']['podIP']}")
        return repaired_off(ledger_status(cluster), lost_bookie_id)

    wait_for(healthy, timeout=timeout, what=f"Ledger {LEDGER} repaired off {lost_bookie_id}", interval=1.0)
    return seen


def scrape_driver(cluster: LocalCluster, repair: Repair) -> str:
    """The repair driver's /metrics as a PodMonitor scrapes it while its pod is Ready (noting the pod's IP and where it
    ran the first time): one scraped during its run lingers after it for one more scrape, so the last one holds its
    final counts; once it is gone, the last one taken."""
    drivers = cluster.get("pods", "-n", NAMESPACE, "-l", f"job-name={repair.job}")["items"]
    if driver := next((p for p in drivers if p["status"].get("podIP") and ready(p)), None):
        if not repair.driver_ip:
            repair.driver_ip, repair.driver_container = driver["status"]["podIP"], where_it_ran(driver)
        with contextlib.suppress(OSError):  # it ended between the listing and the scrape
            repair.driver_metrics = scrape(driver, "metrics")
    return repair.driver_metrics


def repaired_off(status: dict[str, Any], lost_bookie_id: str) -> bool:
    """A Ledger's status says it is healthy again without the lost bookie: repaired, no marker, no data loss."""
    loss = next((c for c in status.get("conditions", []) if c["type"] == "DataLoss"), {})
    return ((status.get("repair") or {}).get("state") == "Succeeded" and not status.get("underReplicated")
            and loss.get("status") == "False"
            and all(lost_bookie_id not in s["bookies"] for s in status.get("segments", [])))


@dataclass
class ClosedLoop:
    """The outcome of `closed_loop`: what was written, which bookie was lost, the repair and what read back."""

    ledger_id: int
    lost_bookie_id: str
    repair: Repair
    seconds_to_healthy: float
    read_back: list[dict[str, Any]]
    earlier_jobs: frozenset[str] = frozenset()
    """The lost Bookie's repair Jobs from before this loss (an earlier loss's, kept until their TTL)."""


def closed_loop(cluster: LocalCluster, entries: int) -> ClosedLoop:
    """Write entries, lose a bookie of the ledger with its volumes, wait for the Spark repair, read them back."""
    say("scaling the BookieCluster to 4 bookies (E = Qw = 3 needs a bookie to move the lost one's replicas to)")
    scale(cluster, 4)
    say("issuing a client certificate from the cluster's CA")
    issue_client_certificate(cluster)
    say(f"writing {entries} entries to Ledger {LEDGER} from a client pod")
    ledger_id = write_entries(cluster, entries)
    # A repair this small would run in its driver alone (localModeMaxMb): this one shows Spark's executor pods.
    apply_settings(cluster, {"autoRecovery": {"lostBookieRecoveryDelaySeconds": 10, "repair": {"localModeMaxMb": 0}}})
    lost_id = ledger_status(cluster)["segments"][0]["bookies"][0]
    earlier = frozenset(job["metadata"]["name"] for job in repair_jobs(cluster, lost_id.split(".")[0]))
    started = time.monotonic()
    say(f"deleting bookie pod {lose_bookie(cluster, lost_id)} and its PVCs (lost-bookie delay 10 s)")
    repair = watch_repair(cluster, lost_id, earlier)
    seconds = time.monotonic() - started
    say(f"Ledger {LEDGER} healthy {seconds:.0f} s after the pod was deleted; reading the entries back")
    return ClosedLoop(ledger_id, lost_id, repair, seconds, read_entries(cluster, ledger_id), earlier)


# --- node failure: a bookie's node stops; repair, then the stuck pod force-replaced -----------------------------

NODE_FAILURE_DELAY = 5
"""lostBookieRecoveryDelaySeconds for the node failure: low, so that the wait is the node's grace period."""
NODE_LOSS_LEDGERS = 4
"""Ledgers tried (the example one, then fresh ones) for one with a replica on a node that may fail."""
COMPONENT_LABEL = "app.kubernetes.io/component"
ZONE_LABEL = "topology.kubernetes.io/zone"


def acting_operator(cluster: LocalCluster) -> str:
    """The operator replica that acts: the highest priority in the chart's KopfPeering (kopf names them by pod)."""
    peers = cluster.get("kopfpeering", "-n", NAMESPACE, "bookfleet").get("status") or {}
    return max(peers, key=lambda peer: peers[peer]["priority"], default="")


def node_to_fail(cluster: LocalCluster, ledger_bookie_ids: set[str]) -> tuple[str, str, str] | str:
    """A node whose failure costs exactly one bookie of the ledger (E = Qw = 3 on 4 bookies leaves 3 to repair onto)
    and not the fleet's ZooKeeper (the chart runs one server), in a zone with a cordoned spare node (a bookie is held in
    its zone, its node's: the fresh one needs a live node there), preferring one without the acting operator
    replica (its successor would wait out kopf's peering lifetime): (node, bookie pod, spare node), or why none."""
    nodes = cluster.get("nodes")["items"]
    spares = {node["metadata"]["labels"][ZONE_LABEL]: node["metadata"]["name"]
              for node in nodes if node["spec"].get("unschedulable")}
    zones = {node["metadata"]["name"]: node["metadata"]["labels"][ZONE_LABEL] for node in nodes}
    on_node: dict[str, list[dict[str, Any]]] = {}
    for pod in cluster.get("pods", "-n", NAMESPACE)["items"]:
        if pod["status"].get("phase") in ("Pending", "Running"):
            on_node.setdefault(pod["spec"].get("nodeName", ""), []).append(pod)
    acting = acting_operator(cluster)
    ensemble = {bookie_id.split(".")[0] for bookie_id in ledger_bookie_ids}
    choices = []
    for node, pods in on_node.items():
        kinds = [pod["metadata"].get("labels", {}).get(COMPONENT_LABEL) for pod in pods]
        bookies = [pod["metadata"]["name"] for pod, kind in zip(pods, kinds, strict=True) if kind == "bookie"]
        spare = spares.get(zones.get(node, ""))
        if spare and len(bookies) == 1 and bookies[0] in ensemble and "zookeeper" not in kinds:
            choices.append((any(pod["metadata"]["name"] == acting for pod in pods), node, bookies[0], spare))
    if not choices:
        return f"ensemble {sorted(ensemble)}, pods by node " + json.dumps(
            {node: sorted(pod["metadata"]["name"] for pod in pods) for node, pods in on_node.items()})
    return min(choices)[1:]


def closed_ledger(cluster: LocalCluster, ledger: str, entries: int) -> dict[str, Any]:
    """The Ledger's status once it is closed, writing `entries` to it first if it is not yet."""
    if ledger_status(cluster, ledger).get("state") != "CLOSED":
        write_entries(cluster, entries, ledger)
    return wait_for(lambda: (status := ledger_status(cluster, ledger)).get("state") == "CLOSED" and status,
                    timeout=120, what=f"Ledger {ledger} closed", interval=1.0)


def ledger_to_lose(cluster: LocalCluster, entries: int) -> tuple[str, str, str, str]:
    """(ledger, node, bookie pod, spare node): a closed Ledger with a replica on a node that may fail (`node_to_fail`);
    the example Ledger when it has one, else fresh Ledgers until one has (ensembles are placed at random)."""
    why = ""
    for attempt in range(NODE_LOSS_LEDGERS):
        ledger = LEDGER if attempt == 0 else f"node-loss-{attempt}"
        if attempt:
            manifest = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
                        "metadata": {"name": ledger, "namespace": NAMESPACE}, "spec": {"cluster": CLUSTER}}
            cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        status = closed_ledger(cluster, ledger, entries)
        choice = node_to_fail(cluster, {bookie for s in status["segments"] for bookie in s["bookies"]})
        if not isinstance(choice, str):
            return ledger, *choice
        why = choice
    raise AssertionError(f"none of {NODE_LOSS_LEDGERS} ledgers has a replica on a node that may fail ({why})")


@dataclass
class NodeFailure:
    """The outcome of `node_failure`: what failed, what the operator did, when (seconds after the node failed)."""

    node: str
    bookie: str
    ledger_id: int
    lost_condition: dict[str, Any]
    job: dict[str, Any]
    fresh_pod: dict[str, Any]
    stuck_uid: str
    events: list[str]
    read_back: list[dict[str, Any]]
    seconds: dict[str, float] = field(default_factory=dict)
    drain_refusal: str = ""
    """What `kubectl drain` of another bookie's node said while the failed node's bookie was down."""
    node_ready: dict[str, Any] = field(default_factory=dict)
    """The failed node's Ready condition, as it was when the node was deleted."""
    kept_claims: dict[str, str] = field(default_factory=dict)
    """The bookie's PVCs (name -> uid) as they were, kept after the repair, when the failed node was deleted."""

    def figures(self) -> dict[str, Any]:
        """The measured times as JSON-able figures, with the delay they include."""
        seconds = self.seconds
        return {"lost_bookie_recovery_delay_seconds": NODE_FAILURE_DELAY, "node": self.node, "bookie": self.bookie,
                "seconds_after_node_failed": {name: round(value, 1) for name, value in seconds.items()},
                # the target (<= delay + 5 s) counts from the node being declared NotReady
                "repair_job_after_node_not_ready": round(seconds["repair_job_created"] - seconds["node_not_ready"], 1)}


def drain(cluster: LocalCluster, node: str) -> str:
    """`kubectl drain` of a node's bookie pods for at most 15 s, then uncordon it; kubectl's error ("" if it
    drained)."""
    try:
        cluster.kubectl("drain", node, "--pod-selector", BOOKIE_SELECTOR, "--delete-emptydir-data", "--timeout", "15s",
                        timeout=60)
    except AssertionError as refused:
        return str(refused) or "refused"
    finally:
        cluster.kubectl("uncordon", node)
    return ""


def server_seconds(stamp: str, since: float) -> float:
    """An API timestamp (whole seconds) as seconds after the wall-clock time `since`."""
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - since


def node_failure(cluster: LocalCluster, entries: int) -> NodeFailure:
    """Fail the node of a bookie holding a closed ledger's replica, wait until the ledger is repaired off it (the
    bookie's pod and volumes kept: the node may return), delete the node, then wait until a fresh bookie runs on a
    live node, noting when each step was seen."""
    say("4 bookies (a replacement for the lost one's replicas), a client certificate, a written ledger")
    scale(cluster, 4)
    issue_client_certificate(cluster)
    apply_settings(cluster, {"autoRecovery": {"lostBookieRecoveryDelaySeconds": NODE_FAILURE_DELAY}})
    ledger, node, victim, spare = ledger_to_lose(cluster, entries)
    cluster.kubectl("uncordon", spare)
    status = ledger_status(cluster, ledger)
    bookie_id = cluster.get("bookie", "-n", NAMESPACE, victim)["spec"]["bookieId"]
    stuck_uid = cluster.get("pod", "-n", NAMESPACE, victim)["metadata"]["uid"]
    earlier_jobs = {job["metadata"]["name"] for job in repair_jobs(cluster)}
    say(f"failing node {node}: bookie {victim} of Ledger {ledger}, spare {spare} uncordoned (lost-bookie delay"
        f" {NODE_FAILURE_DELAY} s)")
    failed_at = cluster.fail_node(node)
    outcome = NodeFailure(node, victim, status["ledgerId"], {}, {}, {}, stuck_uid, [], [])

    def note(milestone: str, reached: bool) -> None:
        if reached and milestone not in outcome.seconds:
            outcome.seconds[milestone] = time.time() - failed_at
            say(f"{milestone} {outcome.seconds[milestone]:.0f} s after node {node} failed")

    def replaced() -> bool:
        bookie = cluster.get("bookie", "-n", NAMESPACE, victim).get("status") or {}
        if bookie.get("phase") == "Lost" and not outcome.lost_condition:
            outcome.lost_condition = next(c for c in bookie["conditions"] if c["type"] == "Lost")
        note("bookie_lost", bool(outcome.lost_condition))
        if not outcome.job:
            outcome.job = next((job for job in repair_jobs(cluster) if job["metadata"]["name"] not in earlier_jobs),
                               {})
        note("repair_job_seen", bool(outcome.job))
        if outcome.job and outcome.lost_condition and not outcome.drain_refusal:
            outcome.drain_refusal = drain(cluster, next(pod["spec"]["nodeName"] for pod in bookie_pods(cluster)
                                                        if ready(pod)))
        note("ledger_healthy", repaired_off(ledger_status(cluster, ledger), bookie_id))
        # The node might return with the bookie's data: the operator keeps its pod and volumes until it is deleted,
        # as an administrator (or a node-pool autoscaler) deletes a node that is gone for good.
        note("volumes_kept", "ledger_healthy" in outcome.seconds and "VolumesKept" in event_reasons(cluster, victim))
        if "volumes_kept" in outcome.seconds and "node_deleted" not in outcome.seconds:
            outcome.kept_claims = {c["metadata"]["name"]: c["metadata"]["uid"] for c in bookie_claims(cluster)
                                   if c["metadata"]["name"].startswith(f"{victim}-")}
            outcome.node_ready = next(c for c in cluster.get("node", node)["status"]["conditions"]
                                      if c["type"] == "Ready")
            cluster.kubectl("delete", "node", node)
            note("node_deleted", True)
        pods = cluster.get("pods", "-n", NAMESPACE, "--field-selector", f"metadata.name={victim}")["items"]
        outcome.fresh_pod = pods[0] if pods and pods[0]["metadata"]["uid"] != stuck_uid else {}
        note("fresh_bookie_running", ready(outcome.fresh_pod) and bookie.get("phase") == "Running")
        return {"ledger_healthy", "node_deleted", "fresh_bookie_running"} <= outcome.seconds.keys()

    wait_for(replaced, timeout=900, what=f"Ledger {ledger} repaired off {victim} and a fresh {victim}", interval=1.0)
    outcome.seconds["node_not_ready"] = server_seconds(outcome.node_ready["lastTransitionTime"], failed_at)
    outcome.job = cluster.get("job", "-n", NAMESPACE, outcome.job["metadata"]["name"])
    outcome.seconds["repair_job_created"] = server_seconds(outcome.job["metadata"]["creationTimestamp"], failed_at)
    outcome.events = event_reasons(cluster, victim)
    outcome.read_back = read_entries(cluster, outcome.ledger_id)
    return outcome


# --- uninstall: helm uninstall with the chart's pre-delete hook, the namespace ------------------------------------

@dataclass(frozen=True)
class Uninstall:
    bookies_left: list[str]
    ledgers_left: list[str]
    """Ledgers present after helm uninstall: the hook deletes the chart cluster's (helm would leave them, not being
    the release's)."""
    claims_kept: set[str]
    """Bookie PVCs present after the hook deleted the cluster and helm uninstall finished."""
    namespace_gone: bool


def uninstall(cluster: LocalCluster) -> Uninstall:
    """helm uninstall (its pre-delete hook Job deletes the chart's BookieCluster, its Bookies and Ledgers; helm fails
    if the hook does), force-delete what a failed node's dead kubelet never will (an administrator's step), then
    delete the namespace; every step must finish."""
    say(f"helm uninstall: its hook deletes BookieCluster {CLUSTER}")
    cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m")
    bookies = [b["metadata"]["name"] for b in cluster.get("bookies", "-n", NAMESPACE)["items"]]
    ledgers = [ledger["metadata"]["name"] for ledger in cluster.get("ledgers", "-n", NAMESPACE)["items"]]
    claims = {claim["metadata"]["name"] for claim in bookie_claims(cluster)}
    dead = {node["metadata"]["name"] for node in cluster.get("nodes")["items"] if not ready(node)}
    stuck = [pod["metadata"]["name"] for pod in cluster.get("pods", "-n", NAMESPACE)["items"]
             if pod["spec"].get("nodeName") in dead]
    if stuck:
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, *stuck, "--force", "--grace-period=0")
    say(f"deleting namespace {NAMESPACE}")
    cluster.kubectl("delete", "namespace", NAMESPACE, "--timeout=300s", timeout=330)
    gone = NAMESPACE not in {ns["metadata"]["name"] for ns in cluster.get("namespaces")["items"]}
    return Uninstall(bookies, ledgers, claims, gone)


def main() -> int:
    """`make cluster-demo`: the lost-bookie walkthrough (docs/operating.md) against a local cluster, ending with a
    `healthy:` line."""
    entries = 100
    say("starting the local cluster (the first run builds Kubernetes from its Go modules)")
    with running_cluster() as cluster:
        say(f"helm install into namespace {NAMESPACE} (restricted Pod Security) with the example BookieCluster")
        install(cluster)
        say("three bookies Running, one per zone")
        outcome = closed_loop(cluster, entries)
        repair = outcome.repair
        if len(outcome.read_back) != entries:
            print(f"read back {len(outcome.read_back)} of {entries} entries", file=sys.stderr)
            return 1
        print(f"healthy: ledger {outcome.ledger_id}, {entries} entries read back after losing "
              f"{outcome.lost_bookie_id}; repaired by Job {repair.job} (driver {repair.driver_ip}, executors "
              f"{', '.join(sorted(repair.executors))}) in {outcome.seconds_to_healthy:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
