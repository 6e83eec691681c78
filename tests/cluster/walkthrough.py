"""The README walkthrough as functions, shared by the `cluster` test tier and `make cluster-demo`: start the local
cluster, helm install the chart, apply the examples, write a ledger, lose a bookie with its volumes, watch the
Spark repair on Kubernetes, read the data back."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bookfleet.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "bookfleet"
ZOOKEEPER = f"bookfleet-zookeeper.{NAMESPACE}.svc:2181"
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

    def pod_log(self, namespace: str, name: str, container: str) -> str:
        """What the process kubelet captured of a container's output (there is no kubelet log API here)."""
        uid = self.get("pod", "-n", namespace, name)["metadata"]["uid"]
        path = self.state / "pods" / uid / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def fail_node(self, node: str) -> None:
        """Stop the node's heartbeats and kill its pods' processes."""
        (self.state / "control" / f"fail-node-{node}").touch()


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


def ledger_status(cluster: LocalCluster, name: str = "demo-ledger") -> dict[str, Any]:
    return cluster.get("ledger", "-n", NAMESPACE, name).get("status", {})


def client_run(cluster: LocalCluster, name: str, script: str) -> str:
    """Run a shell script with the bookfleet CLI in a pod of the bookie image (restricted-compliant); its output."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        # The label the chart's NetworkPolicies admit to bookies and ZooKeeper.
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bookfleet.io/client": "true"}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "client", "image": "bookfleet/bookie:0.1.0", "command": ["sh", "-c", script],
                "env": [{"name": "BOOKFLEET_ZK", "value": ZOOKEEPER}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))

    def phase() -> str | None:
        current = cluster.get("pod", "-n", NAMESPACE, name).get("status", {}).get("phase")
        return current if current in ("Succeeded", "Failed") else None

    outcome = wait_for(phase, timeout=300, what=f"client pod {name} to finish", interval=1.0)
    output = cluster.pod_log(NAMESPACE, name, "client")
    if outcome != "Succeeded":
        raise AssertionError(f"client pod {name} {outcome}:\n{output}")
    return output


def write_entries(cluster: LocalCluster, count: int) -> dict[str, Any]:
    """`count` entries into the example Ledger, then closed; the Ledger's status once it shows CLOSED."""
    # Ledger ids start at 0: wait for the field, not for a truthy value.
    status = wait_for(lambda: (s := ledger_status(cluster)).get("ledgerId") is not None and s, timeout=120,
                      what="the Ledger's id", interval=1.0)
    ledger_id = status["ledgerId"]
    client_run(cluster, "writer", f"bookfleet ledger write {ledger_id} --count {count} --size 8 "
                                  f"&& bookfleet ledger close {ledger_id}")
    return wait_for(lambda: (s := ledger_status(cluster)).get("state") == "CLOSED" and s, timeout=120,
                    what="the Ledger CLOSED in its status", interval=1.0)


def read_entries(cluster: LocalCluster, ledger_id: int) -> list[str]:
    output = client_run(cluster, "reader", f"bookfleet ledger read {ledger_id} --json")
    return [json.loads(line)["payload"] for line in output.splitlines() if line.startswith("{")]


def scale(cluster: LocalCluster, replicas: int) -> None:
    """`replicas` Ready bookies. A lost bookie's ledgers need a bookie outside their ensemble to be copied to: with
    E=3 on three bookies, a fourth one."""
    cluster.kubectl("patch", "bookiecluster", "-n", NAMESPACE, "demo", "--type", "merge",
                    "-p", json.dumps({"spec": {"replicas": replicas}}))
    wait_for(lambda: len(pods := bookie_pods(cluster)) == replicas and all(map(ready, pods)),
             timeout=600, what=f"{replicas} Ready bookie pods", interval=2.0)


def lose_bookie(cluster: LocalCluster, victim: str, delay_seconds: int) -> None:
    """The bookie's pod and both its PVCs go, for longer than the (shortened) recovery delay."""
    cluster.kubectl("patch", "bookiecluster", "-n", NAMESPACE, "demo", "--type", "merge",
                    "-p", json.dumps({"spec": {"autoRecovery": {"lostBookieRecoveryDelaySeconds": delay_seconds}}}))
    cluster.kubectl("delete", "pvc", "-n", NAMESPACE, f"{victim}-journal", f"{victim}-ledgers", "--wait=false")
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, victim, "--wait=false")


def job_outcome(cluster: LocalCluster, name: str) -> str | None:
    conditions = cluster.get("job", "-n", NAMESPACE, name).get("status", {}).get("conditions", [])
    return next((c["type"] for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"), None)


@dataclass(frozen=True)
class Repair:
    job: str
    drivers: list[str]
    executors: list[str]
    outcome: str


def watch_repair(cluster: LocalCluster, say: Callable[[str], None] = lambda _: None) -> Repair:
    """The repair Job, its driver pods (one per attempt), the executor pods Spark creates, and how the Job ended."""
    job = wait_for(lambda: cluster.get("jobs", "-n", NAMESPACE, "-l", REPAIR_SELECTOR)["items"],
                   timeout=300, what="the repair Job", interval=2.0)[0]["metadata"]["name"]
    say(f"repair Job: {job}")
    drivers: set[str] = set()
    executors: set[str] = set()

    def ended() -> str | None:
        for pod in cluster.get("pods", "-n", NAMESPACE, "-l", f"job-name={job}")["items"]:
            if pod["metadata"]["name"] not in drivers:
                drivers.add(pod["metadata"]["name"])
                say(f"Spark driver pod: {pod['metadata']['name']}")
        for pod in cluster.get("pods", "-n", NAMESPACE, "-l", "spark-role=executor")["items"]:
            if pod["metadata"]["name"] not in executors and _owner(pod) in drivers:
                executors.add(pod["metadata"]["name"])
                say(f"Spark executor pod: {pod['metadata']['name']} on {pod['spec'].get('nodeName')}")
        return job_outcome(cluster, job)

    outcome = wait_for(ended, timeout=900, what="the repair Job to end", interval=2.0)
    return Repair(job, sorted(drivers), sorted(executors), outcome)


def _owner(pod: dict[str, Any]) -> str | None:
    owners = pod["metadata"].get("ownerReferences", [])
    return owners[0]["name"] if owners else None


def healthy_ledger(cluster: LocalCluster) -> dict[str, Any]:
    return wait_for(lambda: (s := ledger_status(cluster)).get("repair", {}).get("state") == "Succeeded"
                    and not s.get("underReplicated") and s, timeout=300, what="the Ledger healthy", interval=2.0)
