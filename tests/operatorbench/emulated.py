"""`bookfleet bench operator`: the operator's reaction times and memory, on the Kubernetes API emulator.

A real `bookfleet operator` process watches the emulator (tests/emulator.py) and a real embedded ZooKeeper. Pods are
not run: the figures are the operator's own work. Reported next to the same-run cost of one emulator round trip and
one ZooKeeper write (what every reconciliation step is made of) and the raw fsync baseline.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bookfleet.bench.baseline import cpu_loop, raw_fsync_bandwidth
from bookfleet.kube import crdgen, resources
from bookfleet.kube.models import Bookie, BookieCluster, Ledger
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from bookfleet.zkserver import ZooKeeperServer
from tests.emulator import EmulatorThread
from tests.fixtures.models import bookie_cluster_manifest
from tests.operatorbench import scale

NS = "default"


def _wait(what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
    return wait_for(check, timeout, what, interval=0.01)


def _create_ledgers(connect: str, bookie_ids: list[str], count: int) -> None:
    """`count` ledgers' metadata, ensembles of 3 rotating over the bookies; concurrent, as clients would."""
    with zkclient.session(connect) as zk:
        store = MetadataStore(zk)
        ensembles = [[bookie_ids[(i + k) % len(bookie_ids)] for k in range(3)] for i in range(count)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda ensemble: store.create(new_metadata(ensemble, 2, 2)), ensembles))


def _pods(kube, cluster: str) -> list[dict]:
    return kube.list("pods", NS, f"{resources.LABEL_CLUSTER}={cluster}")


def _all_pods_seconds(kube, name: str, replicas: int, zookeeper: str, delay: int) -> float:
    started = time.perf_counter()
    kube.create("bookieclusters", bookie_cluster_manifest(zookeeper, replicas, delay, name=name, namespace=None,
                                                          gc_interval_seconds=None), NS)
    _wait(f"{replicas} pods of {name}", lambda: len(_pods(kube, name)) == replicas)
    return time.perf_counter() - started


def _api_roundtrip_ms(kube) -> float:
    started = time.perf_counter()
    for i in range(50):
        kube.create("configmaps", {"metadata": {"name": f"baseline-{i}"}}, NS)
    return (time.perf_counter() - started) / 50 * 1000


def _zk_write_ms(connect: str) -> float:
    with zkclient.session(connect) as zk:
        started = time.perf_counter()
        for i in range(50):
            zk.create(f"/bench-baseline-{i}", b"x")
        return (time.perf_counter() - started) / 50 * 1000


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp, ZooKeeperServer(Path(tmp) / "zk") as zk_server:
        baseline = {**raw_fsync_bandwidth(Path(tmp), 1024, seconds=1.0), **cpu_loop()}
        connect = zk_server.connect
        with EmulatorThread() as kube:
            kubeconfig = kube.write_kubeconfig(Path(tmp) / "kubeconfig")
            for model in (BookieCluster, Bookie, Ledger):
                kube.create("customresourcedefinitions", crdgen.crd(model))
            baseline["api_roundtrip_ms"] = _api_roundtrip_ms(kube)
            baseline["zk_write_ms"] = _zk_write_ms(connect)
            log = (Path(tmp) / "operator.log").open("wb")
            operator = subprocess.Popen(
                [sys.executable, "-m", "bookfleet", "--log-level", "WARNING", "operator", "--standalone", "--namespace",
                 NS, "--kubeconfig", str(kubeconfig), "--interval", str(args.interval)],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ},
            )
            try:
                result = _measure(args, kube, connect, operator.pid)
            finally:
                operator.kill()
                operator.wait(timeout=10)
                log.close()
    report = {"bench": "operator", **result, "baseline": baseline,
              "targets": {"apply_to_pods_s": 2.0, "loss_to_repair_job_s": 2.0, "rss_mb": 250.0}}
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


def _measure(args: argparse.Namespace, kube, connect: str, pid: int) -> dict:
    apply_to_pods = _all_pods_seconds(kube, "small", args.replicas, connect, args.delay)
    # The timed bookie holds ledgers; its pod "ran" (status.pod recorded) before it is lost with its volumes.
    victim = resources.bookie_name("small", args.replicas - 1)
    victim_id = kube.get("bookies", NS, victim)["spec"]["bookieId"]
    others = [b["spec"]["bookieId"] for b in kube.list("bookies", NS) if b["metadata"]["name"] != victim]
    _create_ledgers(connect, [victim_id, *others], 20)
    _wait("the victim's status", lambda: (kube.get("bookies", NS, victim).get("status") or {}).get("pod"))
    deleted = time.perf_counter()
    kube.delete("pods", NS, victim)
    for claim in resources.claim_names(victim):
        kube.delete("persistentvolumeclaims", NS, claim)
    _wait("the repair Job", lambda: kube.list("jobs", NS))
    loss_to_job = time.perf_counter() - deleted - args.delay
    with zkclient.session(connect) as zk:
        marked = len(UnderReplication(zk).ledger_ids())
        on_victim = len(MetadataStore(zk).ledgers_on_bookie(victim_id))

    large_pods = _all_pods_seconds(kube, "large", args.large_bookies, connect, 3600)
    large_ids = [b["spec"]["bookieId"] for b in kube.list("bookies", NS, f"{resources.LABEL_CLUSTER}=large")]
    started = time.perf_counter()
    _create_ledgers(connect, large_ids, args.large_ledgers)
    ledgers_seconds = time.perf_counter() - started
    _wait("ledger counts on every bookie", lambda: all(
        (b.get("status") or {}).get("ledgers") for b in kube.list("bookies", NS, f"{resources.LABEL_CLUSTER}=large")
    ), timeout=300)
    time.sleep(3 * args.interval)  # a few more full reconciliation rounds at that size
    rss, peak = scale.rss_mb(pid)
    return {
        "apply_to_pods_s": round(apply_to_pods, 3),
        "loss_to_repair_job_s": round(loss_to_job, 3),
        "ledgers_marked": marked,
        "ledgers_on_lost_bookie": on_victim,
        "large_bookies": args.large_bookies,
        "large_ledgers": args.large_ledgers,
        "large_apply_to_pods_s": round(large_pods, 3),
        "large_ledger_creation_s": round(ledgers_seconds, 3),
        "operator_rss_mb": round(rss, 1),
        "operator_peak_rss_mb": round(peak, 1),
    }
