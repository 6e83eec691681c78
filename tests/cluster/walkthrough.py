"""The README's install steps as functions for the `cluster` test tier: start the local cluster, helm install the
chart into a restricted namespace, apply the examples, wait for the bookies."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bookfleet.polling import wait_for

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
