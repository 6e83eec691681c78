"""The README's install steps as functions for the `cluster` test tier: start the local cluster, helm install the
chart into a restricted namespace, apply the examples, wait for the bookies."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bookfleet.kube import resources
from bookfleet.kube.certificates import CA_PRIVATE_KEY
from bookfleet.kube.models import BookieCluster
from bookfleet.polling import wait_for
from bookfleet.security.certs import CertificateAuthority
from bookfleet.security.roles import Role

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "bookfleet"
REPAIR_SELECTOR = "app.kubernetes.io/component=repair"
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
        result = subprocess.run(
            [str(self.binaries / "helm"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True, text=True, timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {result.stdout}\n{result.stderr}")
        return result.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """A container's output, from the process kubelet's log file: it serves no logs API for `kubectl logs`."""
        uid = self.get("pod", "-n", namespace, pod)["metadata"]["uid"]
        return (self.state / "pods" / uid / f"{container}.log").read_text(errors="replace")


@contextlib.contextmanager
def running_cluster(keep_logs: bool = False) -> Iterator[LocalCluster]:
    """`python -m tests.cluster` as a child process (so it stops and cleans up through its SIGTERM path)."""
    work = Path(tempfile.mkdtemp(prefix="bookfleet-cluster-"))
    ready, state = work / "ready", work / "state"
    with (work / "cluster.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster", "--state", str(state), "--ready-file", str(ready), "--keep"],
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
            if keep_logs:
                print(f"local cluster logs kept in {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def bookie_pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/component=bookie,app.kubernetes.io/instance=demo"
    return cluster.get("pods", "-n", NAMESPACE, "-l", selector)["items"]


def install(cluster: LocalCluster) -> None:
    """A namespace enforcing restricted Pod Security, the chart with its ZooKeeper, the examples, 3 Ready bookies."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")
    cluster.helm("install", "bookfleet", str(ROOT / "charts" / "bookfleet"), "--namespace", NAMESPACE,
                 "--set", "zookeeper.enabled=true", "--wait", "--timeout", "10m")
    cluster.kubectl("apply", "--server-side", "--validate=strict", "-n", NAMESPACE, "-f", str(ROOT / "examples"))
    wait_for(lambda: len(pods := bookie_pods(cluster)) == 3 and all(map(ready, pods)),
             timeout=600, what="three Ready bookie pods", interval=2.0)
    wait_for(lambda: [b.get("status", {}).get("phase") for b in cluster.get("bookies", "-n", NAMESPACE)["items"]]
             == ["Running"] * 3, timeout=300, what="three Running Bookies", interval=2.0)


# --- the closed loop: client entries, a lost bookie, a Spark-on-Kubernetes repair -------------------------------

CLUSTER = "demo"
LEDGER = "demo-ledger"
CLIENT_SECRET = f"{CLUSTER}-client-tls"
EXECUTOR_SELECTOR = "spark-role=executor"


def say(step: str) -> None:
    print(f"==> {step}", flush=True)


def bookie_cluster(cluster: LocalCluster) -> BookieCluster:
    return BookieCluster.model_validate(cluster.get("bookiecluster", "-n", NAMESPACE, CLUSTER))


def ledger_status(cluster: LocalCluster) -> dict[str, Any]:
    return cluster.get("ledger", "-n", NAMESPACE, LEDGER).get("status") or {}


def scale(cluster: LocalCluster, replicas: int) -> None:
    """Through the BookieCluster's scale subresource, then wait until every Bookie is Running."""
    cluster.kubectl("scale", "bookiecluster", "-n", NAMESPACE, CLUSTER, f"--replicas={replicas}")
    wait_for(lambda: [b.get("status", {}).get("phase") for b in cluster.get("bookies", "-n", NAMESPACE)["items"]]
             == ["Running"] * replicas, timeout=600, what=f"{replicas} Running Bookies", interval=2.0)


def issue_client_certificate(cluster: LocalCluster) -> None:
    """A client-role certificate signed by the cluster's CA (read from its Secret), stored as a TLS Secret."""
    ca_data = cluster.get("secret", "-n", NAMESPACE, resources.ca_secret_name(CLUSTER))["data"]
    ca = CertificateAuthority.from_pem(base64.b64decode(ca_data[resources.CA_KEY]),
                                       base64.b64decode(ca_data[CA_PRIVATE_KEY]))
    issued = ca.issue(f"{CLUSTER}-client", [Role.CLIENT])
    files = {resources.CA_KEY: issued.ca_pem, resources.CERT_KEY: issued.cert_pem, resources.KEY_KEY: issued.key_pem}
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": CLIENT_SECRET, "namespace": NAMESPACE},
              "data": {key: base64.b64encode(value).decode() for key, value in files.items()}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(secret))


def run_client(cluster: LocalCluster, name: str, script: str) -> str:
    """`sh -c script` in a client pod of the bookie image (client label, client certificate, ZooKeeper credential,
    restricted Pod Security) until it exits; its log, or AssertionError with the log if it failed."""
    spec = bookie_cluster(cluster)
    container = {
        "name": "client", "image": spec.spec.image, "args": ["sh", "-c", script],
        "env": resources.security_env(spec, with_tls_dir=True),
        "volumeMounts": [resources.tls_mount(), resources.SCRATCH],
        "securityContext": resources.container_security_context(),
    }
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {resources.CLIENT_LABEL: "true"}},
        "spec": {"restartPolicy": "Never", "containers": [container],
                 "volumes": [resources.tls_volume(CLIENT_SECRET), {"name": resources.SCRATCH["name"], "emptyDir": {}}],
                 "securityContext": resources.pod_security_context()},
    }
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--ignore-not-found", "--wait=true")
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    phase = wait_for(lambda: (p := cluster.get("pod", "-n", NAMESPACE, name).get("status", {}).get("phase"))
                     in ("Succeeded", "Failed") and p, timeout=300, what=f"client pod {name} to finish", interval=1.0)
    log = cluster.container_log(NAMESPACE, name, container["name"])
    if phase != "Succeeded":
        raise AssertionError(f"client pod {name} failed:\n{log}")
    return log


def write_entries(cluster: LocalCluster, count: int) -> int:
    """`count` entries into the example Ledger, which is then closed; its ledger id."""
    ledger_id = wait_for(lambda: (status := ledger_status(cluster)).get("state") and status,
                         timeout=300, what=f"Ledger {LEDGER} created in ZooKeeper", interval=2.0)["ledgerId"]
    zk = bookie_cluster(cluster).spec.zookeeper
    run_client(cluster, "demo-writer", f"bookfleet ledger write {ledger_id} --zk {zk} --count {count} --size 32 && "
                                       f"bookfleet ledger close {ledger_id} --zk {zk}")
    return ledger_id


def read_entries(cluster: LocalCluster, ledger_id: int) -> list[dict[str, Any]]:
    zk = bookie_cluster(cluster).spec.zookeeper
    log = run_client(cluster, "demo-reader", f"bookfleet ledger read {ledger_id} --zk {zk} --json")
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
    executors: dict[str, dict[str, str]] = field(default_factory=dict)
    """executor pod name -> {"ip": its pod IP, "driver_url": the SPARK_DRIVER_URL it was given}"""


def watch_repair(cluster: LocalCluster, lost_bookie_id: str, timeout: float = 900) -> Repair:
    """Wait until the Ledger is healthy again (repaired by a Job, no marker, no data loss, off the lost bookie),
    noting the repair Job, its driver pod and Spark's executor pods on the way (they go when the Job ends)."""
    seen = Repair()

    def healthy() -> bool:
        if not seen.job and (jobs := cluster.get("jobs", "-n", NAMESPACE, "-l", REPAIR_SELECTOR)["items"]):
            seen.job = jobs[0]["metadata"]["name"]
            say(f"repair Job {seen.job} created")
        if seen.job and not seen.driver_ip:
            drivers = cluster.get("pods", "-n", NAMESPACE, "-l", f"job-name={seen.job}")["items"]
            seen.driver_ip = next((p["status"].get("podIP", "") for p in drivers if p["status"].get("podIP")), "")
        for pod in cluster.get("pods", "-n", NAMESPACE, "-l", EXECUTOR_SELECTOR)["items"]:
            name = pod["metadata"]["name"]
            if name not in seen.executors and pod["status"].get("podIP"):
                env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}
                seen.executors[name] = {"ip": pod["status"]["podIP"], "driver_url": env.get("SPARK_DRIVER_URL", "")}
                say(f"Spark executor pod {name} on {pod['status']['podIP']}")
        status = ledger_status(cluster)
        loss = next((c for c in status.get("conditions", []) if c["type"] == "DataLoss"), {})
        return ((status.get("repair") or {}).get("state") == "Succeeded" and not status.get("underReplicated")
                and loss.get("status") == "False"
                and all(lost_bookie_id not in s["bookies"] for s in status.get("segments", [])))

    wait_for(healthy, timeout=timeout, what=f"Ledger {LEDGER} repaired off {lost_bookie_id}", interval=2.0)
    return seen


@dataclass
class ClosedLoop:
    """The outcome of `closed_loop`: what was written, which bookie was lost, the repair and what read back."""

    ledger_id: int
    lost_bookie_id: str
    repair: Repair
    seconds_to_healthy: float
    read_back: list[dict[str, Any]]


def closed_loop(cluster: LocalCluster, entries: int) -> ClosedLoop:
    """Write entries, lose a bookie of the ledger with its volumes, wait for the Spark repair, read them back."""
    say("scaling the BookieCluster to 4 bookies (E = Qw = 3 needs a bookie to move the lost one's replicas to)")
    scale(cluster, 4)
    say("issuing a client certificate from the cluster's CA")
    issue_client_certificate(cluster)
    say(f"writing {entries} entries to Ledger {LEDGER} from a client pod")
    ledger_id = write_entries(cluster, entries)
    cluster.kubectl("patch", "bookiecluster", "-n", NAMESPACE, CLUSTER, "--type", "merge",
                    "-p", '{"spec": {"autoRecovery": {"lostBookieRecoveryDelaySeconds": 10}}}')
    lost_id = ledger_status(cluster)["segments"][0]["bookies"][0]
    started = time.monotonic()
    say(f"deleting bookie pod {lose_bookie(cluster, lost_id)} and its PVCs (lost-bookie delay 10 s)")
    repair = watch_repair(cluster, lost_id)
    seconds = time.monotonic() - started
    say(f"Ledger {LEDGER} healthy {seconds:.0f} s after the pod was deleted; reading the entries back")
    return ClosedLoop(ledger_id, lost_id, repair, seconds, read_entries(cluster, ledger_id))


def main() -> int:
    """`make cluster-demo`: the README walkthrough against a local cluster, ending with a `healthy:` line."""
    entries = 100
    say("starting the local cluster (the first run builds Kubernetes from its Go modules)")
    with running_cluster() as cluster:
        say(f"helm install into namespace {NAMESPACE} (restricted Pod Security), kubectl apply -f examples/")
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
