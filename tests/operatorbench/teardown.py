"""`bookfleet bench operator --teardown`: the chart's uninstall hook (`bookfleet delete-cluster`) at scale, against a
real API server (tests/cluster's control plane: etcd, kube-apiserver, the controller manager; no nodes, no kwok:
deleting Ledgers runs no pod).

--ledgers Ledger resources of the BookieCluster, each with kopf's finalizer as an operator before this one left them
(the costlier case: a patch that releases it before each delete), and a few of another cluster, which must stay. The
hook's command runs as the hook's Job runs it, in a process of its own: its wall seconds, its CPU seconds and its peak
RSS (its own VmHWM, PeakRss), set against the Job's limits as the chart renders them (1 CPU, 256 MiB) and the part of
its deadline `bookieCluster.deleteLedgersSeconds` (600) gives the Ledgers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from bookfleet.bench.baseline import cpu_loop
from bookfleet.kube import resources
from bookfleet.kube.reconcilers import teardown
from bookfleet.kube.runtime.api import CUSTOM, KubeApi
from tests.cluster import __main__ as cluster_main
from tests.cluster import controlplane
from tests.fixtures.apiserver import install_crds
from tests.fixtures.manifests import CHART, render_chart

NS = "default"
CLUSTER = "fleet"
OTHERS = 10
"""Ledgers of another cluster beside it: the hook deletes only its own cluster's."""
LOADERS = 16
"""Ledger creates in flight while loading."""
REPO = Path(__file__).resolve().parents[2]


def run(args: argparse.Namespace) -> int:
    if shutil.which("go") is None:
        print("bench operator --teardown: skipped: no Go toolchain on PATH (the control plane is built from Go"
              " modules)")
        return 0
    binaries = cluster_main.build()
    baseline = {"cpu_loop_before": cpu_loop(), "load_average_1m_before": round(os.getloadavg()[0], 1)}
    with controlplane.on_loopback(binaries, "bench-teardown-") as plane:
        result = measure(plane, args.ledgers)
    baseline.update(cpu_loop_after=cpu_loop(), load_average_1m_after=round(os.getloadavg()[0], 1))
    print(json.dumps({"bench": "operator", "scenario": "teardown", **result, "baseline": baseline},
                     indent=None if args.json else 2))
    return 0


def measure(plane: controlplane.ControlPlane, ledgers: int) -> dict[str, Any]:
    """Load `ledgers` Ledgers of the cluster (and OTHERS of another) into the API server, run the hook's command, and
    report what it cost and what it left."""
    install_crds(plane)
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(str(plane.kubeconfig), client_configuration=config)
    config.connection_pool_maxsize = LOADERS
    api = KubeApi(kubernetes.client.ApiClient(config))
    api.create({"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
                "metadata": {"name": CLUSTER, "namespace": NS, "finalizers": [teardown.FINALIZER]},
                "spec": {"zookeeper": "zk:2181"}})
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(LOADERS, thread_name_prefix="load-ledgers") as pool:
        list(pool.map(lambda number: create_ledger(api, number, CLUSTER), range(ledgers)))
        list(pool.map(lambda number: create_ledger(api, number, "other"), range(ledgers, ledgers + OTHERS)))
    loaded = time.monotonic() - started
    hook = run_hook(plane)
    left = Counter(ledger["spec"]["cluster"] for page in api.pages(CUSTOM, "ledgers", NS) for ledger in page)
    limits = hook_limits()
    return {
        "ledgers": ledgers, "load_s": round(loaded, 1), **hook,
        "hook_cpu_ms_per_ledger": round(1000 * hook["cpu_s"] / ledgers, 2),
        "ledgers_left": left[CLUSTER], "other_clusters_ledgers_kept": left["other"] == OTHERS,
        "hook_limits": limits,
        "within_hook_limits": hook["peak_rss_mib"] <= limits["memory_mib"]
        and max(hook["wall_s"], hook["cpu_s"] / limits["cpu"]) <= limits["delete_ledgers_s"],
    }


def hook_limits() -> dict[str, float]:
    """The uninstall hook Job's limits as the chart renders them by default, and the part of its deadline that
    bookieCluster.deleteLedgersSeconds gives the Ledgers."""
    (job,) = [obj for obj in render_chart({"bookieCluster": {"enabled": True, "zookeeper": "zk:2181"}})
              if obj["kind"] == "Job"]
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return {"cpu": float(limits["cpu"]), "memory_mib": resources.quantity_bytes(limits["memory"]) / 2**20,
            "deadline_s": job["spec"]["activeDeadlineSeconds"],
            "delete_ledgers_s": values["bookieCluster"]["deleteLedgersSeconds"]}


def create_ledger(api: KubeApi, number: int, cluster: str) -> None:
    api.create({"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
                "metadata": {"name": f"{cluster}-{number:06}", "namespace": NS, "finalizers": [teardown.FINALIZER]},
                "spec": {"cluster": cluster}})


def run_hook(plane: controlplane.ControlPlane) -> dict[str, Any]:
    """`bookfleet delete-cluster` as the hook Job runs it: its wall and CPU seconds and its peak RSS."""
    command = [sys.executable, "-m", "bookfleet", "delete-cluster", CLUSTER, "--namespace", NS, "--timeout", "120",
               "--kubeconfig", str(plane.kubeconfig)]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    with PeakRss(process.pid) as peak:
        output = process.stdout.read().decode() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"delete-cluster failed ({process.returncode}): {output}")
    return {"wall_s": round(time.monotonic() - started, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mib": round(peak.kib / 1024, 1), "hook_said": output.strip()}


class PeakRss:
    """A process's own peak RSS (VmHWM of its memory map), read every SAMPLE_S until the `with` block ends (the
    process exited). Not wait4's ru_maxrss: Linux carries the memory the child was forked with into it across exec,
    so that was the bench's own peak (145-181 MiB, growing with the Ledgers it had loaded), not the hook's."""

    SAMPLE_S = 0.05

    def __init__(self, pid: int):
        self.status, self.kib = Path(f"/proc/{pid}/status"), 0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="peak-rss", daemon=True)

    def __enter__(self) -> PeakRss:
        self._sampler.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._sampler.join()

    def _sample(self) -> None:
        while not self._done.wait(self.SAMPLE_S):
            with contextlib.suppress(OSError):  # exited: a zombie has no memory map left to read
                for line in self.status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.kib = max(self.kib, int(line.split()[1]))
